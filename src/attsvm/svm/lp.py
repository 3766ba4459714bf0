"""The ℓp attention SVM (docs/spec.md §8): ``min ‖W‖_p s.t. a_kᵀ W z_k (≥ | =) b_k``, 1 < p < ∞, and its
LP limits p = 1 and p = ∞.

**ℓp, 1 < p < ∞** (:func:`solve_lp`). The solver works on the Lagrange dual of ``min ½‖W‖_p²``,

    min_{λ_I ≥ 0}  f(λ) = ½‖M(λ)‖_q² − bᵀλ,     M(λ) = 𝒜*(λ) = Σ_k λ_k a_k z_kᵀ,   q = p/(p−1),

whose gradient is ``∇f(λ) = 𝒜(W(λ)) − b`` with the primal map ``W(λ) = ∇(½‖·‖_q²)(M) =
‖M‖_q^{2−q} sign(M)|M|^{q−1}`` (so ``‖W(λ)‖_p = ‖M(λ)‖_q``). Two phases:

1. L-BFGS-B (bounds λ_I ≥ 0) from the uniform λ, to a moderate tolerance;
2. Newton polish on the support ``S`` (λ_k > 0 or a violated row): the Hessian of ``½‖M‖_q²`` is
   ``(q−1)‖M‖_q^{2−q} diag(|M|^{q−2}) + (2−q)‖M‖_q^{2−2q} u uᵀ`` with ``u = sign(M)|M|^{q−1}``, so
   the reduced Hessian is ``F_S D F_Sᵀ + c (F_S u)(F_S u)ᵀ`` with the rank-one features
   ``F_k = vec(a_k z_kᵀ)``; steps keep λ_I ≥ 0 by projection and an Armijo backtracking on f.

Every iterate gives a primal point by rescaling: when all rows are inequalities, ``W = c·W(λ)`` with
``c = max_k b_k / m_k`` is feasible to round-off, and the gap to the dual value ``f`` certifies it
(docs/spec.md §8: weak duality ``1ᵀλ ≤ ‖W‖_p ‖M‖_q``). The data go through the one reduction
(:mod:`.reduction`, without its subspace step: projecting onto span{a_k} ⊗ span{z_i} does not
preserve an entrywise norm) and the answer through the one certificate (:mod:`.certificate`).
Infeasibility does not depend on the norm: an unbounded dual (λ growing without bound, or no
positive rescaling) is handed to the estimator as a candidate ray for the shared Farkas check.

**p = 1, p = ∞** (:func:`solve_lp_limit`): linear programs solved by HiGHS (dual simplex), with
``W = U⁺ − U⁻`` (ℓ1) or ``−t ≤ W_ij ≤ t`` (ℓ∞); their row duals are the multipliers λ.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.optimize as so
import scipy.sparse as sp
from numpy.typing import NDArray

from .._validation import check_choice
from ._base import ConstraintSet, RawSolution
from .norms import lp_norm
from .reduction import reduce
from .status import ERROR, INFEASIBLE, MAX_ITER, OPTIMAL, OPTIMAL_INACCURATE

__all__ = ["LpOptions", "solve_lp", "solve_lp_limit", "dual_map"]

# a dual iterate whose ‖λ‖_1 exceeds this (in normalised units, where λ = O(1)) is an unbounded ray
UNBOUNDED_LAMBDA = 1e12


@dataclass(frozen=True)
class LpOptions:
    """Options of :func:`solve_lp` (module doc).

    lbfgs_gtol : projected-gradient tolerance of the L-BFGS-B phase (normalised units).
    lbfgs_maxiter : iteration cap of that phase (``max_iter`` of the estimator overrides it).
    newton_iter : cap on Newton polish steps.
    support_rtol : λ_k > support_rtol · max λ puts row k in the Newton support.
    target_gap : the polish stops once the certified relative gap is below this.
    """

    lbfgs_gtol: float = 1e-8
    lbfgs_maxiter: int = 20_000
    newton_iter: int = 40
    support_rtol: float = 1e-12
    target_gap: float = 1e-13


def _entry_qnorm(M: NDArray[np.float64], q: float) -> tuple[float, NDArray[np.float64]]:
    """``‖M‖_q`` and ``u = sign(M)|M/s|^{q−1}`` with ``s = max|M|`` (scaled to avoid overflow)."""
    a = np.abs(M)
    s = float(a.max(initial=0.0))
    if s == 0.0:
        return 0.0, np.zeros_like(M)
    r = a / s
    N = s * float(np.sum(r**q)) ** (1.0 / q)
    return N, np.sign(M) * r ** (q - 1.0)


def dual_map(M: NDArray[np.float64], p: float) -> NDArray[np.float64]:
    """The primal point of a dual matrix: ``∇(½‖·‖_q²)(M) = ‖M‖_q^{2−q} sign(M)|M|^{q−1}`` (module doc)."""
    q = p / (p - 1.0)
    N, u = _entry_qnorm(M, q)
    if N == 0.0:
        return np.zeros_like(M)
    s = float(np.abs(M).max())
    # ‖M‖^{2−q} s^{q−1} u, written as N·(s/N)^{q−1}·u so that neither factor overflows
    return N * (s / N) ** (q - 1.0) * u


class _Dual:
    """The ℓp dual on the rows of a normalised :class:`ConstraintSet` (vectorised over rows)."""

    def __init__(self, cs: ConstraintSet, p: float) -> None:
        rows = cs.mask
        ii, _ = np.nonzero(rows)
        self.A = cs.A[rows]  # (K, d)
        self.Z = cs.Z[ii]  # (K, d)
        self.b = cs.rhs[rows]
        self.eq = cs.equality[rows]
        self.p = p
        self.q = p / (p - 1.0)
        self.n_eval = 0

    def M(self, lam: NDArray[np.float64]) -> NDArray[np.float64]:
        return (self.A * lam[:, None]).T @ self.Z

    def margins(self, W: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.einsum("kd,kd->k", self.A @ W, self.Z)

    def fg(self, lam: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        self.n_eval += 1
        M = self.M(lam)
        W = dual_map(M, self.p)
        N = float(np.sqrt(max(float(np.vdot(W, M)), 0.0)))  # ⟨W(M), M⟩ = ‖M‖_q²
        return 0.5 * N * N - float(self.b @ lam), self.margins(W) - self.b

    def primal(self, lam: NDArray[np.float64]) -> tuple[NDArray[np.float64], float]:
        """A primal point from λ and its relative gap to the dual value (inf when not certifiable)."""
        M = self.M(lam)
        W = dual_map(M, self.p)
        m = self.margins(W)
        ineq = ~self.eq & (self.b > 0)
        if not self.eq.any() and ineq.any():
            if np.any(m[ineq] <= 0):
                return W, np.inf
            W = W * float((self.b[ineq] / m[ineq]).max())
        N = float(np.sqrt(max(float(np.vdot(dual_map(M, self.p), M)), 0.0)))
        dual = float(self.b @ lam) - 0.5 * N * N
        primal = 0.5 * lp_norm(self.p).value(W) ** 2
        den = abs(primal) + abs(dual)
        return W, (abs(primal - dual) / den if den > 0 else 0.0)

    def newton(self, lam: NDArray[np.float64], opts: LpOptions) -> tuple[NDArray[np.float64], int]:
        """Newton polish on the support (module doc); returns λ and the number of steps taken."""
        F = np.einsum("kd,ke->kde", self.A, self.Z).reshape(self.A.shape[0], -1)
        q = self.q
        lo = np.where(self.eq, -np.inf, 0.0)
        steps = 0
        for steps in range(1, opts.newton_iter + 1):
            val, g = self.fg(lam)
            if self.primal(lam)[1] <= opts.target_gap:
                return lam, steps - 1
            top = float(np.abs(lam).max(initial=0.0))
            S = self.eq | (lam > opts.support_rtol * top) | (g < 0)
            M = self.M(lam)
            N, u = _entry_qnorm(M, q)
            if N == 0.0:
                break
            s = float(np.abs(M).max())
            r = np.abs(M) / s
            # Hessian of ½‖M‖_q² in units of s: (q−1)(N/s)^{2−q} diag(r^{q−2}) + (2−q)(N/s)^{2−2q} u uᵀ
            with np.errstate(divide="ignore"):
                D = (q - 1.0) * (N / s) ** (2.0 - q) * np.where(r > 0, r, np.inf if q < 2 else 0.0) ** (q - 2.0)
            D = np.where(np.isfinite(D), D, 0.0).ravel()
            Fs = F[S]
            Fu = Fs @ u.ravel()
            J = (Fs * D) @ Fs.T + (2.0 - q) * (N / s) ** (2.0 - 2.0 * q) * np.outer(Fu, Fu)
            J[np.diag_indices_from(J)] += 1e-13 * max(float(np.trace(J)) / len(J), 1e-300)
            gs = g[S]
            try:
                step = -np.linalg.solve(J, gs)
            except np.linalg.LinAlgError:
                break
            # Armijo on f, or (near the optimum, where f's decrease is below its round-off) a decrease
            # of the reduced gradient: the step is a Newton step for ∇_S f = 0
            gnorm = float(np.linalg.norm(gs))
            a = 1.0
            while True:
                new = lam.copy()
                new[S] = np.maximum(lam[S] + a * step, lo[S])
                fn, gn = self.fg(new)
                if fn <= val + 1e-4 * a * float(gs @ step) or (
                    fn <= val + 1e-12 * abs(val) and float(np.linalg.norm(gn[S])) < gnorm
                ):
                    break
                if a < 1e-10:
                    break
                a *= 0.5
            if a < 1e-10:
                break
            lam = new
        return lam, steps


def solve_lp(
    cs: ConstraintSet,
    p: float,
    *,
    tol: float = 1e-9,
    max_iter: int | None = None,
    options: LpOptions | None = None,
) -> RawSolution:
    """Solve the ℓp attention SVM ``min ‖W‖_p s.t. cs`` for 1 < p < ∞ (module doc; docs/spec.md §8).

    Returns a :class:`RawSolution` (W, λ, status) that the estimator certifies; ``info`` holds the
    phase iteration counts and the relative gap reached.
    """
    p = lp_norm(p).p
    opts = options or LpOptions()
    t0 = time.perf_counter()
    red = reduce(cs, subspace=False)
    work = red.problem
    info: dict = {"backend": "lp", "p": p}
    if red.unattainable.any():
        lam = np.where(red.unattainable, np.sign(cs.rhs), 0.0)
        return RawSolution(None, lam / np.abs(lam).sum(), INFEASIBLE, 0, info | {"reason": "zero feature row"})
    if not work.mask.any():  # no constraint: W = 0
        d = cs.A.shape[2]
        return RawSolution(np.zeros((d, cs.Z.shape[1])), np.zeros(cs.mask.shape), OPTIMAL, 0, info)
    dual = _Dual(work, p)
    K = dual.A.shape[0]
    bounds = [(None, None) if e else (0.0, None) for e in dual.eq]
    maxiter = opts.lbfgs_maxiter if max_iter is None else int(max_iter)
    res = so.minimize(
        dual.fg,
        np.full(K, 1.0 / K),
        jac=True,
        method="L-BFGS-B",
        bounds=bounds,
        options={"maxiter": maxiter, "maxcor": 30, "ftol": 1e-15, "gtol": opts.lbfgs_gtol},
    )
    lam = np.asarray(res.x, dtype=np.float64)
    info["lbfgs_iter"] = int(res.nit)

    def out_dual(lam_: NDArray[np.float64]) -> NDArray[np.float64]:
        full = np.zeros(work.mask.shape)
        full[work.mask] = lam_
        return red.lift_dual(full, degree=2)

    if not np.all(np.isfinite(lam)) or float(np.abs(lam).sum()) > UNBOUNDED_LAMBDA or res.fun < -UNBOUNDED_LAMBDA:
        info["reason"] = "unbounded dual"
        ray = np.nan_to_num(lam, nan=0.0, posinf=0.0, neginf=0.0)
        full = np.zeros(work.mask.shape)
        full[work.mask] = ray
        return RawSolution(None, red.lift_farkas(full), INFEASIBLE, int(res.nit), info)
    lam, n_newton = dual.newton(lam, opts)
    W, gap = dual.primal(lam)
    info.update(newton_iter=n_newton, relative_gap=gap, n_eval=dual.n_eval, time=time.perf_counter() - t0)
    if not np.isfinite(gap):
        # no positive rescaling of W(λ) is feasible: either the instance is infeasible or the dual
        # did not converge; the estimator's shared Farkas check decides which
        full = np.zeros(work.mask.shape)
        full[work.mask] = lam
        return RawSolution(None, red.lift_farkas(full), INFEASIBLE, int(res.nit) + n_newton, info)
    status = OPTIMAL if gap <= tol else (MAX_ITER if res.status == 1 else OPTIMAL_INACCURATE)
    return RawSolution(red.lift_W(W), out_dual(lam), status, int(res.nit) + n_newton, info)


def solve_lp_limit(cs: ConstraintSet, norm: Literal["l1", "linf"]) -> RawSolution:
    """Solve ``min ‖W‖_1`` or ``min max_ij |W_ij|`` s.t. cs as a linear program (HiGHS; module doc)."""
    check_choice(norm, "norm", ("l1", "linf"))
    t0 = time.perf_counter()
    red = reduce(cs, subspace=False)
    work = red.problem
    info: dict = {"backend": "highs", "norm": norm}
    if red.unattainable.any():
        lam = np.where(red.unattainable, np.sign(cs.rhs), 0.0)
        return RawSolution(None, lam / np.abs(lam).sum(), INFEASIBLE, 0, info | {"reason": "zero feature row"})
    d, rz = work.A.shape[2], work.Z.shape[1]
    if not work.mask.any():
        return RawSolution(np.zeros((d, rz)), np.zeros(cs.mask.shape), OPTIMAL, 0, info)
    rows = work.mask
    ii, _ = np.nonzero(rows)
    F = np.einsum("kd,ke->kde", work.A[rows], work.Z[ii]).reshape(-1, d * rz)  # ⟨W, A_k⟩ = F_k · vec W
    b = work.rhs[rows]
    eq = work.equality[rows]
    nw = d * rz
    bounds: list[tuple[float | None, float | None]]
    if norm == "l1":  # x = [U⁺, U⁻] ≥ 0, W = U⁺ − U⁻
        c = np.ones(2 * nw)
        G = np.hstack([F, -F])
        extra_ub = None
        bounds = [(0.0, None)] * (2 * nw)
    else:  # x = [W, t], −t ≤ W_ij ≤ t
        c = np.zeros(nw + 1)
        c[-1] = 1.0
        G = np.hstack([F, np.zeros((F.shape[0], 1))])
        eye = sp.identity(nw, format="csr")
        one = sp.csr_matrix(np.ones((nw, 1)))
        extra_ub = sp.vstack([sp.hstack([eye, -one]), sp.hstack([-eye, -one])]).tocsr()
        bounds = [(None, None)] * nw + [(0.0, None)]
    ub_rows = [sp.csr_matrix(-G[~eq])]
    ub_rhs = [-b[~eq]]
    if extra_ub is not None:
        ub_rows.append(extra_ub)
        ub_rhs.append(np.zeros(2 * nw))
    A_ub = sp.vstack(ub_rows).tocsr()
    b_ub = np.concatenate(ub_rhs)
    A_eq = sp.csr_matrix(G[eq]) if eq.any() else None
    b_eq = b[eq] if eq.any() else None
    try:
        res = so.linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=bounds, method="highs-ds")
    except Exception as exc:  # a solver failure is a status with info
        info["message"] = f"{type(exc).__name__}: {exc}"
        return RawSolution(None, np.zeros(cs.mask.shape), ERROR, 0, info)
    info.update(highs_status=int(res.status), message=str(res.message), time=time.perf_counter() - t0)
    n_iter = int(getattr(res, "nit", 0) or 0)
    if res.status == 2:  # infeasible: the shared Farkas check finds and verifies the certificate
        return RawSolution(None, np.zeros(cs.mask.shape), INFEASIBLE, n_iter, info)
    if res.status != 0 or res.x is None:
        return RawSolution(None, np.zeros(cs.mask.shape), MAX_ITER if res.status == 1 else ERROR, n_iter, info)
    x = np.asarray(res.x)
    W = (x[:nw] - x[nw:]) if norm == "l1" else x[:nw]
    lam = np.zeros(F.shape[0])
    lam[~eq] = -np.asarray(res.ineqlin.marginals)[: int((~eq).sum())]
    if eq.any():
        lam[eq] = np.asarray(res.eqlin.marginals)
    full = np.zeros(work.mask.shape)
    full[work.mask] = lam
    return RawSolution(red.lift_W(W.reshape(d, rz)), red.lift_dual(full, degree=1), OPTIMAL, n_iter, info)
