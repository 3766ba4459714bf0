"""The generic solver: ``min ‖W‖ s.t. a_kᵀ W z_k (≥ | =) b_k`` for any :class:`~attsvm.svm.norms.Norm` that has a
value, a dual norm and a proximal map (docs/spec.md §3, "Plugging in a norm").

It uses nothing else of the norm. The instance goes through :func:`~attsvm.svm.reduction.reduce` (row
normalisation and global scale; the subspaces ``W = U M Vᵀ`` only when the norm declares itself unitarily
invariant, :attr:`Norm.unitarily_invariant`, since projecting onto them can raise any other norm). Then:

1. **Feasibility** does not depend on the norm: the exact Frobenius solver (:mod:`.frobenius`) decides it on the
   same rows. An infeasible instance is returned as "infeasible" with its Farkas ray, which the estimator verifies
   through :func:`~attsvm.svm.certificate.find_farkas` (as for every other norm). (Its W is used only where the
   iteration below finds no feasible point: the iteration starts from 0.)
2. **Primal–dual hybrid gradient** (Chambolle–Pock) on the saddle point
   ``min_M max_{λ_I ≥ 0} ‖M‖ − ⟨λ, 𝒜M − b⟩``::

       M⁺ = prox_{τ‖·‖}(M + τ 𝒜*λ),   λ⁺ = Π(λ + σ (b − 𝒜(2M⁺ − M)))

   (Π clips the inequality multipliers at 0), with ``τσ‖𝒜‖² < 1`` (‖𝒜‖ by power iteration), in its restarted
   Halpern form (the iterates are anchored to the last restart point; a restart when the fixed-point residual
   ``‖z − T(z)‖`` has fallen enough, or stopped falling) and a primal weight ``ω = √(τ/σ)⁻¹`` rebalanced at each
   restart.
3. **Certificate** every few iterations, from the iterate itself: the primal M is made exactly feasible by
   homogeneity (scaled by ``max_k b_k / m_k`` when every row is an inequality, else corrected by the least-norm
   step onto the violated and equality rows), which gives the upper bound ``‖M_f‖``; the dual iterate λ is
   scaled so that ``‖𝒜*λ‖° = 1``, which gives the lower bound ``bᵀλ``. It stops when the relative gap of the
   best bounds so far is below a quarter of ``tol`` (the estimator recomputes the one certificate,
   :mod:`.certificate`, in the user's units, and says "optimal" only when that passes ``tol``), or at
   ``max_iter`` ("optimal_inaccurate": the best feasible point and the best dual bound found).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._validation import check_positive_int
from ._base import ConstraintSet, RawSolution
from .norms import Norm, check_methods
from .reduction import reduce
from .status import INFEASIBLE, OPTIMAL, OPTIMAL_INACCURATE

__all__ = ["GenericOptions", "solve_generic"]

Vec = NDArray[np.float64]

# the largest dense K × (r_a·r_z) row matrix the solver builds (else it applies the operator matrix-free)
DENSE_MAX_ENTRIES = 4_000_000


@dataclass(frozen=True)
class GenericOptions:
    """Options of :func:`solve_generic`.

    tol : relative duality gap (of the best feasible point and the best dual bound) to stop at; the solver aims
        at a quarter of it so that the estimator's certificate, recomputed in the user's units, passes ``tol``.
    max_iter : PDHG iterations at most.
    check_every : iterations between two evaluations of the bounds (each costs a ``value`` and a ``dual_norm``).
    power_iter : power iterations for ``‖𝒜‖``.
    seed : the start of the power iteration.
    """

    tol: float = 1e-9
    max_iter: int = 100_000
    check_every: int = 20
    power_iter: int = 100
    seed: int = 0


class _Rows:
    """The flat rows of the reduced problem: ``𝒜M`` (K,) and ``𝒜*λ`` (r_a, r_z), dense when small."""

    def __init__(self, cs: ConstraintSet) -> None:
        self.cs = cs
        self.idx = np.flatnonzero(cs.mask.ravel())
        T = cs.mask.shape[1]
        self.shape = (cs.A.shape[2], cs.Z.shape[1])
        self.b = cs.rhs.ravel()[self.idx].astype(np.float64)
        self.eq = cs.equality.ravel()[self.idx]
        self.ineq = ~self.eq
        K = self.idx.size
        size = K * self.shape[0] * self.shape[1]
        if size <= DENSE_MAX_ENTRIES:
            Af = cs.A.reshape(-1, self.shape[0])[self.idx]
            Zf = cs.Z[self.idx // T]
            self.F: Vec | None = (Af[:, :, None] * Zf[:, None, :]).reshape(K, -1)
        else:
            self.F = None

    def fwd(self, M: Vec) -> Vec:
        if self.F is not None:
            return self.F @ M.ravel()
        return self.cs.operator.apply_flat(M)

    def adj(self, lam: Vec) -> Vec:
        if self.F is not None:
            return (lam @ self.F).reshape(self.shape)
        return self.cs.operator.adjoint_flat(lam)

    def opnorm(self, iters: int, seed: int) -> float:
        """``‖𝒜‖`` by power iteration on ``𝒜*𝒜`` (a little above the estimate, which approaches it from below)."""
        if self.F is not None and min(self.F.shape) <= 400:
            return float(np.linalg.norm(self.F, 2))
        v = np.random.default_rng(seed).standard_normal(self.shape)
        v /= np.linalg.norm(v)
        est = 0.0
        for _ in range(iters):
            w = self.adj(self.fwd(v))
            nw = float(np.linalg.norm(w))
            if nw == 0:
                return 0.0
            est = nw
            v = w / nw
        return 1.01 * math.sqrt(est)


def _make_feasible(rows: _Rows, M: Vec, m: Vec) -> Vec | None:
    """M made feasible (module doc, step 3): scaled by homogeneity when every row is an inequality, else the
    least-norm correction onto the violated and equality rows (a few rounds); None when neither works."""
    b = rows.b
    if not rows.eq.any():
        pos = b > 0
        if (m[pos] > 0).all():
            lo = float((b[pos] / m[pos]).max(initial=0.0))
            neg = (~pos) & (m < b)  # rows b ≤ 0 that M violates: a smaller scale may fix them
            hi = float((b[neg] / m[neg]).min(initial=np.inf)) if (m[neg] < 0).all() else -np.inf
            if 0.0 < lo <= hi:
                out: Vec = lo * M
                return out
    if rows.F is None:
        return None
    W = M.ravel().copy()
    active = rows.eq | (m < b)
    for _ in range(5):
        r = b - rows.F @ W
        active |= rows.eq | (r > 0)
        if not active.any():
            return W.reshape(rows.shape)
        viol = np.where(rows.eq, np.abs(r), np.maximum(r, 0.0))
        if viol.max(initial=0.0) <= 1e-15 * max(1.0, float(np.abs(b).max(initial=0.0))):
            return W.reshape(rows.shape)
        W = W + np.linalg.lstsq(rows.F[active], r[active], rcond=None)[0]
    r = b - rows.F @ W
    viol = np.where(rows.eq, np.abs(r), np.maximum(r, 0.0))
    return W.reshape(rows.shape) if viol.max(initial=0.0) <= 1e-12 * max(1.0, float(np.abs(b).max())) else None


def _pdhg(rows: _Rows, norm: Norm, opt: GenericOptions, M_start: Vec | None = None) -> dict[str, Any]:
    """Restarted Halpern PDHG (module doc, step 2) with the bounds of step 3; returns the best feasible point,
    the best dual point (scaled to ``‖𝒜*λ‖° = 1``), both bounds and the iteration count."""
    b, ineq = rows.b, rows.ineq
    L = rows.opnorm(opt.power_iter, opt.seed)
    best: dict[str, Any] = {"M": None, "primal": np.inf, "lam": np.zeros_like(b), "dual": 0.0, "iterations": 0}
    if not L > 0:
        return best

    def consider(M: Vec, m: Vec, lam: Vec) -> float:
        Mf = _make_feasible(rows, M, m)
        if Mf is not None:
            p = float(norm.value(Mf))
            if p < best["primal"]:
                best["M"], best["primal"] = Mf, p
        lam = np.where(ineq, np.maximum(lam, 0.0), lam)
        bl = float(b @ lam)
        if bl > 0:
            dn = float(norm.dual_norm(rows.adj(lam)))
            if dn > 0 and bl / dn > best["dual"]:
                best["lam"], best["dual"] = lam / dn, bl / dn
        P, D = best["primal"], best["dual"]
        return (P - D) / (P + D) if math.isfinite(P) and P + D > 0 else np.inf

    M = np.zeros(rows.shape) if M_start is None else np.array(M_start, dtype=np.float64)
    lam = np.zeros_like(b)
    if M_start is not None:
        consider(M, rows.fwd(M), lam)
    omega = 1.0  # primal weight: τ = η/(ωL), σ = ηω/L
    eta = 0.99
    m = rows.fwd(M)
    M0, lam0, m0 = M, lam, m  # the Halpern anchor (the last restart point)
    k = 0  # iterations since the last restart
    r0 = np.inf  # fixed-point residual at the restart point
    r_prev = np.inf
    target = 0.25 * opt.tol
    gap = np.inf
    it = 0
    while it < opt.max_iter:
        it += 1
        tau, sigma = eta / (omega * L), eta * omega / L
        Mn = norm.prox(M + tau * rows.adj(lam), tau)
        mn = rows.fwd(Mn)
        ln = lam + sigma * (b - 2.0 * mn + m)
        ln = np.where(ineq, np.maximum(ln, 0.0), ln)
        dM, dl, dm = Mn - M, ln - lam, mn - m
        res2 = float(np.vdot(dM, dM)) / tau + float(dl @ dl) / sigma - 2.0 * float(dl @ dm)
        res = math.sqrt(max(res2, 0.0))
        if it % opt.check_every == 0 or it == opt.max_iter:
            gap = consider(Mn, mn, ln)
            if gap <= target:
                break
        if k == 0:
            r0 = res
        restart = k > 0 and (res <= 0.2 * r0 or (res <= 0.8 * r0 and res > r_prev) or k >= 0.36 * it)
        if restart or res == 0.0:
            # restart at the PDHG output; rebalance the primal weight by how far each side moved
            dMr = float(np.linalg.norm(Mn - M0))
            dlr = float(np.linalg.norm(ln - lam0))
            if dMr > 1e-10 and dlr > 1e-10:
                omega = math.exp(0.5 * math.log(dlr / dMr) + 0.5 * math.log(omega))
            M, lam, m = Mn, ln, mn
            M0, lam0, m0 = M, lam, m
            k = 0
            r_prev = np.inf
            continue
        # Halpern step with reflection: z ← c (2 T(z) − z) + (1 − c) z₀, c = (k+1)/(k+2)
        c = (k + 1.0) / (k + 2.0)
        M = c * (2.0 * Mn - M) + (1.0 - c) * M0
        lam = c * (2.0 * ln - lam) + (1.0 - c) * lam0
        m = c * (2.0 * mn - m) + (1.0 - c) * m0
        k += 1
        r_prev = res
    best["iterations"] = it
    best["gap"] = gap
    best["omega"] = omega
    best["opnorm"] = L
    return best


def solve_generic(
    cs: ConstraintSet, norm: Norm, options: GenericOptions | None = None, **overrides: Any
) -> RawSolution:
    """``min ‖W‖ s.t. cs`` for a :class:`~attsvm.svm.norms.Norm` with ``value``, ``dual_norm`` and ``prox``
    (module doc).

    Parameters
    ----------
    cs : ConstraintSet
        Inequality rows ``a_itᵀ W z_i ≥ b_it`` and equality rows ``= b_it``.
    norm : Norm
        The norm (its ``degree`` sets the multipliers returned: those of ``‖W‖`` or of ``½‖W‖²``).
    options : GenericOptions, optional
        Solver options; ``**overrides`` replaces fields of it (e.g. ``tol=1e-8, max_iter=5000``).

    Returns
    -------
    RawSolution
        ``W`` exactly feasible up to round-off and the multipliers λ (n, T), status "optimal" (the solver's
        relative gap is below a quarter of ``tol``) or "optimal_inaccurate"; or "infeasible" with a candidate
        Farkas ray in ``dual`` (verified by the estimator). ``info`` holds both bounds, the relative gap, the
        iterations, the primal weight, ``‖𝒜‖`` and the time.
    """
    from .frobenius import solve_frobenius

    if not isinstance(cs, ConstraintSet):
        raise TypeError(f"cs must be a ConstraintSet, got {type(cs).__name__}")
    if not isinstance(norm, Norm):
        raise TypeError(f"norm must be an attsvm.svm.norms.Norm, got {type(norm).__name__}")
    check_methods(norm)
    if options is not None and not isinstance(options, GenericOptions):
        raise TypeError(f"options must be a GenericOptions, got {type(options).__name__}")
    opt = replace(options or GenericOptions(), **overrides)
    check_positive_int(opt.max_iter, "max_iter")
    check_positive_int(opt.check_every, "check_every")
    t0 = time.perf_counter()
    red = reduce(cs, subspace=bool(norm.unitarily_invariant))
    work = red.problem
    info: dict[str, Any] = {"solver": "generic-pdhg", "norm": norm.name}
    if red.unattainable.any():  # 0 ≥ b > 0 on a zero row
        return RawSolution(None, red.zero_row_farkas(), INFEASIBLE, 0, info | {"reason": "zero feature row"})
    ra, rz = work.A.shape[2], work.Z.shape[1]
    if not work.mask.any() or ra == 0 or rz == 0:
        return RawSolution(np.zeros((cs.d, cs.Z.shape[1])), np.zeros(cs.mask.shape), OPTIMAL, 0, info)
    # feasibility does not depend on the norm: decide it with the exact Frobenius solver (its W: a first point)
    fro = solve_frobenius(work)
    if fro.status == INFEASIBLE:
        info.update(reason="no feasible point (Frobenius solver)", time=time.perf_counter() - t0)
        return RawSolution(None, red.lift_farkas(np.asarray(fro.dual)), INFEASIBLE, int(fro.n_iter), info)
    rows = _Rows(work)
    if not rows.eq.any() and not (rows.b > 0).any():  # every row reads m ≥ b with b ≤ 0: W = 0 is optimal
        return RawSolution(np.zeros((cs.d, cs.Z.shape[1])), np.zeros(cs.mask.shape), OPTIMAL, 0, info)
    res = _pdhg(rows, norm, opt)
    if res["M"] is None and fro.W is not None:  # (no feasible iterate: the Frobenius point, made feasible, instead)
        M_fro = np.asarray(fro.W, dtype=np.float64)
        res["M"] = _make_feasible(rows, M_fro, rows.fwd(M_fro))
        res["primal"] = np.inf if res["M"] is None else float(norm.value(res["M"]))
    info.update(
        objective=res["primal"] * red.global_scale,
        dual_objective=res["dual"] * red.global_scale,
        relative_gap=res.get("gap", np.inf),
        omega=res.get("omega"),
        opnorm=res.get("opnorm"),
        reduced_shape=rows.shape,
        time=time.perf_counter() - t0,
    )
    if res["M"] is None:
        info["message"] = "no feasible point found"
        return RawSolution(None, np.zeros(cs.mask.shape), OPTIMAL_INACCURATE, res["iterations"], info)
    status = OPTIMAL if res.get("gap", np.inf) <= 0.25 * opt.tol else OPTIMAL_INACCURATE
    lam_flat = res["lam"] * (res["primal"] if norm.degree == 2 else 1.0)  # (multipliers of ½‖M‖²: ‖M‖ λ)
    lam = np.zeros(work.mask.size)
    lam[rows.idx] = lam_flat
    lam_nt = lam.reshape(work.mask.shape)
    return RawSolution(red.lift_W(res["M"]), red.lift_dual(lam_nt, degree=norm.degree), status, res["iterations"], info)
