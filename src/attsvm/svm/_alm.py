"""The augmented Lagrangian on the Burer–Monteiro factors (module doc of :mod:`.nuclear`, step 3).

One engine, :func:`_alm`, configured by :class:`_ALMRun` (how this run behaves) and
:class:`~attsvm.svm._factored.NuclearOptions` (the tuning constants).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import minimize

from . import _kkt
from ._factored import (
    NuclearOptions,
    _dual_bound,
    _make_feasible,
    _nuclear,
    _Reduced,
    balanced_factors,
)
from ._lbfgs import lbfgs

__all__: list[str] = []

logger = logging.getLogger("attsvm.svm.nuclear")


@dataclass(frozen=True)
class _ALMRun:
    """How one augmented-Lagrangian run behaves (the mode :func:`_alm` is called in)."""

    tol: float
    max_iter: int
    certify: bool = True  # certify (exactly feasible primal + dual bound) and polish
    grow_rank: bool = False  # double the factor columns while all are in use
    lean: bool = True  # our L-BFGS (else scipy's L-BFGS-B)
    gtol0: float = 1e-3  # gradient tolerance of the first subproblem
    max_failed_polish: int | None = None  # return early after this many polishes that did not certify


# ----------------------------------------------------------------------------- the ALM engine
@dataclass
class _ALMResult:
    K: NDArray[np.float64]
    Q: NDArray[np.float64]
    lam: NDArray[np.float64]
    primal: float
    dual: float
    gap: float
    violation: float
    n_outer: int
    n_inner: int
    stalled: bool
    converged: bool
    M: NDArray[np.float64] | None = None  # the exactly feasible primal whose ‖·‖_* is ``primal`` (certify)


class _Penalty:
    """The augmented Lagrangian of one subproblem as a function of the flattened factors x = (K, Q),
    with its gradient (module doc of :mod:`.nuclear`, step 3):

        f(x) = ½(‖K‖² + ‖Q‖²) + (‖μ‖² − ‖λ‖²) / (2ρ),   μ = P(λ − ρ(𝒜(KQᵀ) − b)),

    P clipping the inequality rows at 0. One function, evaluated in two memory layouts:
    :meth:`flat` on the K_c constraint rows (a few dense products on (K_c, ·), O(K_c·r·p): fastest on
    small problems, used with our L-BFGS) and :meth:`per_sequence` on the (n, T) layout (z_i shared by
    the T rows of sequence i, O(n·r·p + K_c·r): 4× faster at (100, 20, 100), used with scipy's
    L-BFGS-B). The two agree to round-off; which one a path uses is fixed, because the L-BFGS path
    moves at round-off level and the early polish's success (one outer iteration or two) can hinge
    on it. :meth:`set_multipliers` sets (λ, ρ) for the next subproblem.
    """

    def __init__(self, red: _Reduced) -> None:
        self.red = red
        mask = red.mask
        self.r_a, self.r_z = red.A.shape[-1], red.Z.shape[-1]
        self.idx = np.flatnonzero(mask.ravel())
        self.seq = self.idx // mask.shape[1]
        self.Fs = red.A.reshape(-1, self.r_a)[self.idx]  # (K_c, r_a) features a_k
        self.Zs = red.Z[self.seq]  # (K_c, r_z) queries z_k
        self.bs = red.b.ravel()[self.idx]
        self.ineq_s = red.ineq.ravel()[self.idx]
        self.lam = np.zeros_like(red.b)
        self.rho = 1.0
        self.shift = self.bs.copy()
        self.lam_sq = 0.0

    def set_multipliers(self, lam: NDArray[np.float64], rho: float) -> None:
        self.lam, self.rho = lam, rho
        lam_s = lam.ravel()[self.idx]
        self.shift, self.lam_sq = lam_s + rho * self.bs, float(lam_s @ lam_s)

    def flat(self, x: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        """(f, ∇f) on the flat constraint rows."""
        r_a, r_z, rho = self.r_a, self.r_z, self.rho
        p = x.size // (r_a + r_z)
        nK = r_a * p
        Kx = x[:nK].reshape(r_a, p)
        Qx = x[nK:].reshape(r_z, p)
        FK = self.Fs @ Kx  # (K_c, p): Kᵀa_k
        ZQ = (self.red.Z @ Qx)[self.seq]  # (K_c, p): Qᵀz_k
        mu = self.shift - rho * np.einsum("kp,kp->k", FK, ZQ)  # λ − ρ(𝒜(KQᵀ) − b)
        np.maximum(mu, 0.0, out=mu, where=self.ineq_s)
        f = 0.5 * (x @ x) + (mu @ mu - self.lam_sq) / (2 * rho)
        # Y = 𝒜*(μ) = Σ μ_k a_k z_kᵀ; grad_K = K − Y Q, grad_Q = Q − Yᵀ K, without forming Y
        g = x.copy()
        g[:nK] -= (self.Fs.T @ (mu[:, None] * ZQ)).ravel()
        g[nK:] -= (self.Zs.T @ (mu[:, None] * FK)).ravel()
        return float(f), g

    def per_sequence(self, x: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        """(f, ∇f) on the (n, T) layout."""
        red, r_a, r_z, rho, lam = self.red, self.r_a, self.r_z, self.rho, self.lam
        p = x.size // (r_a + r_z)
        nK = r_a * p
        Kx = x[:nK].reshape(r_a, p)
        Qx = x[nK:].reshape(r_z, p)
        c = red.apply_factored(Kx, Qx) - red.b
        mu = lam - rho * c
        mu = np.where(red.ineq, np.maximum(mu, 0.0), mu) * red.mask
        f = 0.5 * (np.vdot(Kx, Kx) + np.vdot(Qx, Qx)) + (np.vdot(mu, mu) - np.vdot(lam * red.mask, lam)) / (2 * rho)
        B = np.einsum("nt,ntr->nr", mu, red.A)  # (n, r_a)
        gK = Kx - B.T @ (red.Z @ Qx)
        gQ = Qx - red.Z.T @ (B @ Kx)
        return float(f), np.concatenate([gK.ravel(), gQ.ravel()])


def _alm(
    red: _Reduced,
    K: NDArray[np.float64],
    Q: NDArray[np.float64],
    opt: NuclearOptions,
    run: _ALMRun,
    *,
    rho: float | None = None,
    lam: NDArray[np.float64] | None = None,
    rng: np.random.Generator | None = None,
) -> _ALMResult:
    """Augmented Lagrangian on ``M = K Qᵀ`` with the objective ``½(‖K‖² + ‖Q‖²)`` (module doc).

    ``run`` says how this run behaves (:class:`_ALMRun`): with ``grow_rank`` the number of columns p
    starts small and doubles (up to min(r_a, r_z)) whenever every column of the current factors is
    in use, so that a low-rank optimum is found with few variables; ``lean`` picks our L-BFGS over
    scipy's; ``max_failed_polish`` returns early (not converged) after that many polish attempts that
    did not certify, so that the caller can switch paths (see :func:`solve_nuclear`). ``opt`` holds
    the tuning constants (:class:`NuclearOptions`).
    """
    tol, max_iter, certify, grow_rank = run.tol, run.max_iter, run.certify, run.grow_rank
    lean, max_failed_polish, inner_max = run.lean, run.max_failed_polish, opt.inner_max
    r_a, p = K.shape
    r_z = Q.shape[0]
    p_max = min(r_a, r_z)
    rng = np.random.default_rng(0) if rng is None else rng
    mask, ineq = red.mask, red.ineq
    lam_: NDArray[np.float64] = np.zeros_like(red.b) if lam is None else lam.copy()
    rho_: float = max(1.0, float(np.sqrt(mask.sum()))) if rho is None else rho

    failed_polish = 0
    pen = _Penalty(red)
    x = np.concatenate([K.ravel(), Q.ravel()])
    n_inner = 0
    best: _ALMResult | None = None
    prev_viol = np.inf
    stall = 0
    scale_b = max(1.0, float(np.abs(red.b).max(initial=0.0)))
    gtol = run.gtol0
    next_polish = opt.polish_gap
    for outer in range(1, max_iter + 1):
        pen.set_multipliers(lam_, rho_)  # the constants of this subproblem
        for _attempt in range(2):
            if lean:
                x, nit = lbfgs(
                    pen.flat,
                    x,
                    gtol=gtol,
                    max_iter=inner_max,
                    memory=opt.lbfgs_memory,
                    max_halvings=opt.lbfgs_max_halvings,
                )
            else:  # large subproblems: the evaluation dominates, and scipy's line search is the safer one
                res = minimize(
                    pen.per_sequence,
                    x,
                    jac=True,
                    method="L-BFGS-B",
                    options={"maxiter": inner_max, "maxcor": opt.lbfgs_memory, "gtol": gtol, "ftol": 1e-16},
                )
                x, nit = res.x, int(res.nit)
            n_inner += nit
            if np.any(x):
                break
            # K = Q = 0 is stationary for every λ (a saddle): from a strictly feasible start, where the
            # penalty is inactive and f = ½‖x‖², a quasi-Newton step can land on it exactly. Restart
            # along the descent directions there, the top singular pairs of 𝒜*(μ) at M = 0.
            logger.debug("  factors collapsed onto K = Q = 0: restarting along 𝒜*(μ)")
            x = np.concatenate([v.ravel() for v in _escape_origin(red, lam_, rho_, p)])
        nK = r_a * p
        Kx = x[:nK].reshape(r_a, p)
        Qx = x[nK:].reshape(r_z, p)
        m = red.apply_factored(Kx, Qx)
        c = m - red.b
        lam_ = lam_ - rho_ * c
        lam_ = np.where(ineq, np.maximum(lam_, 0.0), lam_) * mask
        raw_viol = float(np.max(np.where(ineq, np.maximum(-c, 0.0), np.where(red.eq, np.abs(c), 0.0)), initial=0.0))
        lam_cert = lam_
        if certify:
            M = Kx @ Qx.T
            Mf = _make_feasible(red, M)
            viol = red.violation(red.apply(Mf))
            primal = _nuclear(Mf)
            dual, spec = _dual_bound(red, lam_)
            gap = (primal - dual) / max(primal, 1e-300)
            if gap > tol and viol <= 1e-9 * scale_b and gap <= next_polish:
                next_polish = gap * 0.1
                _tp = time.perf_counter()
                # first the rank read off with a loose threshold (fewer, better-conditioned Newton
                # rounds), then, if that fails, the conservative guess of every non-negligible direction
                # (the dual cap on the rank only on the large path: from the looser first subproblem of the
                # lean path the dual spectrum is too rough, and capping there cost extra rounds)
                cap = None if lean else opt.dual_rank_tol
                pol = _kkt._polish(red, M, lam_, opt, rank_rtol=opt.rank_rtol_fast, dual_rank_tol=cap)
                if pol is None:
                    pol = _kkt._polish(red, M, lam_, opt, rank_rtol=opt.rank_rtol_safe)
                logger.debug("  polish took %.2fs", time.perf_counter() - _tp)
                if pol is not None:
                    Mp = _make_feasible(red, pol.K @ pol.Q.T)
                    vp = red.violation(red.apply(Mp))
                    pp = _nuclear(Mp)
                    dp, _ = _dual_bound(red, pol.lam)
                    gp = (pp - dp) / max(pp, 1e-300)
                    logger.debug(
                        "  polish: rounds=%d res=%.1e primal=%.15g dual=%.15g gap=%.2e viol=%.1e",
                        pol.rounds,
                        pol.residual,
                        pp,
                        dp,
                        gp,
                        vp,
                    )
                    if vp <= 1e-9 * scale_b and gp < gap:
                        Kx, Qx, viol, primal, dual, gap, lam_cert = pol.K, pol.Q, vp, pp, dp, gp, pol.lam
                        Mf = Mp
                if pol is None or gap > tol:
                    failed_polish += 1
        else:
            viol, primal, dual, gap = raw_viol, 0.5 * float(np.vdot(Kx, Kx) + np.vdot(Qx, Qx)), -np.inf, np.inf
            Mf = None
        cur = _ALMResult(
            Kx.copy(), Qx.copy(), lam_cert.copy(), primal, dual, gap, viol, outer, n_inner, False, False, Mf
        )
        logger.debug(
            "ALM outer %d: rho=%.2e inner=%d viol=%.2e primal=%.12g dual=%.12g gap=%.2e",
            outer,
            rho_,
            nit,
            raw_viol,
            primal,
            dual,
            gap,
        )
        if not certify or best is None or _better(cur, best, 1e-9 * scale_b):
            best = cur
        feas_tol = 1e-9 * scale_b
        if certify and viol <= feas_tol and gap <= tol:
            best = cur
            best.converged = True
            return best
        if not certify and raw_viol <= max(tol, 1e-12) * scale_b and outer > 1:
            cur.converged = True  # without certification the latest iterate is the result (best is cur)
            return cur
        if max_failed_polish is not None and failed_polish >= max_failed_polish:
            assert best is not None
            return best
        # penalty update: raise rho when the violation does not drop fast enough
        if raw_viol > 0.25 * prev_viol and raw_viol > 1e-10 * scale_b:
            rho_ = min(rho_ * 5.0, opt.rho_max)
            stall = stall + 1 if rho_ >= opt.rho_max else stall
        prev_viol = raw_viol
        if grow_rank and certify:
            # saddle escape: a singular value of 𝒜*(λ) above 1 is a descent direction (u₁, v₁) of the
            # Lagrangian ½(‖K‖² + ‖Q‖²) − ⟨𝒜*(λ), KQᵀ⟩; put it into a dead column if there is one
            Uy, sy, Vyt = np.linalg.svd(red.adjoint(lam_), full_matrices=False)
            if sy[0] > 1.0 + 1e-6:
                Um, sm, Vmt = np.linalg.svd(Kx @ Qx.T, full_matrices=False)
                if sm[p - 1] < 1e-6 * sm[0]:  # the factorisation does not use all p directions
                    root = np.sqrt(sm[:p])
                    Kx = Um[:, :p] * root
                    Qx = Vmt[:p].T * root
                    eps = 1e-2 * float(np.sqrt(sm[0]))
                    Kx[:, p - 1] = eps * Uy[:, 0]
                    Qx[:, p - 1] = eps * Vyt[0]
                    x = np.concatenate([Kx.ravel(), Qx.ravel()])
                    logger.debug("  saddle escape: sigma_1(A*lam) = %.6f, re-seeded a dead direction", sy[0])
        if grow_rank and p < p_max:
            col = np.linalg.norm(Kx, axis=0) * np.linalg.norm(Qx, axis=0)
            if col.min() > 1e-3 * col.max():
                p_new = min(2 * p, p_max)
                eps = 1e-3 * float(np.sqrt(col.max()))
                Kx = np.hstack([Kx, eps * rng.standard_normal((r_a, p_new - p))])
                Qx = np.hstack([Qx, eps * rng.standard_normal((r_z, p_new - p))])
                p = p_new
                x = np.concatenate([Kx.ravel(), Qx.ravel()])
                logger.debug("  rank grown to p=%d", p)
        gtol = max(1e-13, min(gtol, 0.1 * raw_viol + 1e-13, 1e-2 * abs(gap) if np.isfinite(gap) else gtol))
        if stall >= 3:
            assert best is not None
            best.stalled = True
            return best
    assert best is not None
    return best


def _escape_origin(
    red: _Reduced, lam: NDArray[np.float64], rho: float, p: int, *, eps: float = 1e-2
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Factors (K, Q) with p columns near the saddle K = Q = 0 of the augmented Lagrangian, along its
    descent directions: at M = 0 the multipliers are ``μ = λ + ρb`` (clipped on inequalities) and
    ``f(εu, εv) ≈ f(0) + ε²(½‖u‖² + ½‖v‖² − uᵀ𝒜*(μ)v)``, which decreases along the top singular
    pairs of ``𝒜*(μ)`` whose singular value exceeds 1. Returns ``ε·U_p √σ_p``, ``ε·V_p √σ_p``."""
    r_a, r_z = red.A.shape[2], red.Z.shape[1]
    mu = np.where(red.ineq, np.maximum(lam + rho * red.b, 0.0), lam + rho * red.b) * red.mask
    U, sig, Vt = np.linalg.svd(red.adjoint(mu), full_matrices=False)
    q = min(p, sig.size)
    root = eps * np.sqrt(sig[:q])
    K = np.zeros((r_a, p))
    Q = np.zeros((r_z, p))
    K[:, :q] = U[:, :q] * root
    Q[:, :q] = Vt[:q].T * root
    return K, Q


def _better(a: _ALMResult, b: _ALMResult, feas_tol: float) -> bool:
    """Is ``a`` a better certified point than ``b``: feasible first, then the smaller gap."""
    fa, fb = a.violation <= feas_tol, b.violation <= feas_tol
    if fa != fb:
        return fa
    return a.gap < b.gap if fa else a.violation < b.violation


def _initial_factors(
    red: _Reduced, p: int, rng: np.random.Generator, *, noise: float = 1e-3
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Balanced factors of a rescaled ``𝒜*(b)`` (a cheap point aligned with the constraints) plus noise."""
    r_a, r_z = red.A.shape[2], red.Z.shape[1]
    M0 = red.adjoint(np.where(red.mask, np.maximum(red.b, 0.0) + (red.b == 0), 0.0))
    m0 = red.apply(M0)
    pos = red.ineq & (red.b > 0)
    if pos.any() and np.all(m0[pos] > 0):
        M0 = M0 * float(np.max(red.b[pos] / m0[pos]))
    K, Q = balanced_factors(M0, rank=p)
    pad_k = np.zeros((r_a, p))
    pad_q = np.zeros((r_z, p))
    pad_k[:, : K.shape[1]] = K
    pad_q[:, : Q.shape[1]] = Q
    s = noise * max(1.0, float(np.sqrt(np.abs(pad_k).max(initial=0.0) * np.abs(pad_q).max(initial=0.0))))
    return pad_k + s * rng.standard_normal((r_a, p)), pad_q + s * rng.standard_normal((r_z, p))
