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
Where the dual iteration stalls (entries of M near 0, where the curvature of ``½‖M‖_q²`` blows up for q < 2, or
λ growing large on a feasible instance with a large ‖W‖), a primal route takes over: SLSQP on W itself from the
Frobenius solution (in units of its norm), the multipliers fitted by NNLS on the tight rows, then Newton's method
on the KKT system of those rows (for p ≥ 2) — its point and gap are reported when the dual's are worse.
Infeasibility does not depend on the norm: an unbounded dual (λ growing without bound, or no
positive rescaling) that the primal route cannot turn into a certified point is handed to the estimator as a
candidate ray for the shared Farkas check.

**p = 1, p = ∞** (:func:`solve_lp_limit`): linear programs solved by HiGHS (dual simplex), with
``W = U⁺ − U⁻`` (ℓ1) or ``−t ≤ W_ij ≤ t`` (ℓ∞); their row duals are the multipliers λ.
"""

from __future__ import annotations

import functools
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
    primal_route : when the dual iteration ends above ``tol`` (or its dual grows without bound), solve from the
        primal side (SLSQP, then Newton on the KKT system of the tight rows) before reporting.
    """

    lbfgs_gtol: float = 1e-8
    lbfgs_maxiter: int = 20_000
    newton_iter: int = 40
    support_rtol: float = 1e-12
    target_gap: float = 1e-13
    primal_route: bool = True


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

    @functools.cached_property
    def F(self) -> NDArray[np.float64]:
        """The rows ``vec(a_k z_kᵀ)`` (K, d·d_z), built once (the Newton polish and the primal route read them)."""
        return np.einsum("kd,ke->kde", self.A, self.Z).reshape(self.A.shape[0], -1)

    def newton(self, lam: NDArray[np.float64], opts: LpOptions) -> tuple[NDArray[np.float64], int]:
        """Newton polish on the support (module doc); returns λ and the number of steps taken."""
        F = self.F
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
        return RawSolution(None, red.zero_row_farkas(), INFEASIBLE, 0, info | {"reason": "zero feature row"})
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
        # a large dual is also what a feasible instance with a large ‖W‖ gives: try the primal side first
        found = _primal_route(dual, _frobenius_point(work), opts, tol) if opts.primal_route else None
        if found is not None:
            W, lam, gap = found
            info.update(primal_route=True, relative_gap=gap, n_eval=dual.n_eval, time=time.perf_counter() - t0)
            status = OPTIMAL if gap <= tol else OPTIMAL_INACCURATE
            return RawSolution(red.lift_W(W), out_dual(lam), status, int(res.nit), info)
        info["reason"] = "unbounded dual"
        ray = np.nan_to_num(lam, nan=0.0, posinf=0.0, neginf=0.0)
        full = np.zeros(work.mask.shape)
        full[work.mask] = ray
        return RawSolution(None, red.lift_farkas(full), INFEASIBLE, int(res.nit), info)
    lam, n_newton = dual.newton(lam, opts)
    W, gap = dual.primal(lam)
    if (
        not gap <= tol and opts.primal_route
    ):  # the dual iteration stalled (|M| near 0 where q < 2): from the primal side instead
        found = _primal_route(dual, W if np.isfinite(gap) else _frobenius_point(work), opts, tol)
        if found is not None and found[2] < (gap if np.isfinite(gap) else np.inf):
            W, lam, gap = found
            info["primal_route"] = True
    info.update(newton_iter=n_newton, relative_gap=gap, n_eval=dual.n_eval, time=time.perf_counter() - t0)
    if not np.isfinite(gap):
        # no positive rescaling of W(λ) is feasible: either the instance is infeasible or the dual
        # did not converge; the estimator's shared Farkas check decides which
        full = np.zeros(work.mask.shape)
        full[work.mask] = lam
        return RawSolution(None, red.lift_farkas(full), INFEASIBLE, int(res.nit) + n_newton, info)
    status = OPTIMAL if gap <= tol else (MAX_ITER if res.status == 1 else OPTIMAL_INACCURATE)
    return RawSolution(red.lift_W(W), out_dual(lam), status, int(res.nit) + n_newton, info)


def _primal_route(
    dual: _Dual, W0: NDArray[np.float64] | None, opts: LpOptions, tol: float
) -> tuple[NDArray[np.float64], NDArray[np.float64], float] | None:
    """``min ½‖W‖_p² s.t. the rows`` by SLSQP on W itself (smooth for p > 1: its gradient is the dual map's
    inverse ``‖W‖_p^{2−p} sign(W)|W|^{p−1}``), from ``W0`` or the least-squares solution of the rows, in units of
    the start's norm; the multipliers are then the non-negative least-squares fit of that gradient on the tight
    rows (``Σ λ_k F_k = ∇½‖W‖_p²`` at the optimum), polished by the dual Newton steps. Returns (W, λ, relative
    gap) or None when no certifiable point comes out."""
    F = dual.F
    shape = (dual.A.shape[1], dual.Z.shape[1])
    p = dual.p

    def fg(w: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        a = np.abs(w)
        N = float((a**p).sum()) ** (1.0 / p)
        if N == 0.0:
            return 0.0, np.zeros_like(w)
        return 0.5 * N * N, N ** (2.0 - p) * np.sign(w) * a ** (p - 1.0)

    w0 = W0.ravel() if W0 is not None else np.linalg.lstsq(F, dual.b, rcond=None)[0]
    s = float((np.abs(w0) ** p).sum()) ** (1.0 / p) or 1.0  # (w = s·v: ‖v‖_p ≈ 1 on every instance)
    rows = np.linalg.norm(F, axis=1)
    rows[rows == 0] = 1.0
    Fn, bn = F / rows[:, None], dual.b / (rows * s)
    ineq, eq = ~dual.eq, dual.eq
    cons = [{"type": "ineq", "fun": lambda v: Fn[ineq] @ v - bn[ineq], "jac": lambda v: Fn[ineq]}]
    if eq.any():
        cons.append({"type": "eq", "fun": lambda v: Fn[eq] @ v - bn[eq], "jac": lambda v: Fn[eq]})
    res = so.minimize(fg, w0 / s, jac=True, method="SLSQP", constraints=cons, options={"maxiter": 500, "ftol": 1e-16})
    w = np.asarray(res.x, dtype=np.float64) * s
    if not np.all(np.isfinite(w)):
        return None
    m = F @ w
    tight = eq | (m <= dual.b + 1e-6 * np.maximum(np.abs(dual.b), 1.0))
    if not tight.any():
        return None
    G = fg(w)[1]
    free = eq[tight]
    nt = int(tight.sum())
    Ft = np.hstack([F[tight].T, -F[tight][free].T])  # (an equality row's λ is split as λ⁺ − λ⁻)
    u = so.nnls(Ft, G, maxiter=50 * Ft.shape[1])[0]
    lam = np.zeros(F.shape[0])
    lam_t = u[:nt].copy()
    lam_t[free] -= u[nt:]
    lam[tight] = lam_t
    w, lam = _kkt_newton(F, dual.b, tight, w, lam, p)
    if np.any(F[~eq] @ w < dual.b[~eq] * (1 - 1e-10)) or np.any(lam[~eq] < 0):  # (not a KKT point: polish λ)
        lam, _ = dual.newton(lam, opts)
        W, gap = dual.primal(lam)
        return (W.reshape(shape), lam, gap) if np.isfinite(gap) else None
    # the KKT point itself (the dual map of M(λ) would lose it to cancellation when λ is large): its gap
    N = float(np.sqrt(max(float(np.vdot(dual_map(dual.M(lam), p), dual.M(lam))), 0.0)))
    primal, dual_value = 0.5 * float((np.abs(w) ** p).sum()) ** (2.0 / p), float(dual.b @ lam) - 0.5 * N * N
    den = abs(primal) + abs(dual_value)
    return w.reshape(shape), lam, (abs(primal - dual_value) / den if den > 0 else 0.0)


def _kkt_newton(
    F: NDArray[np.float64],
    b: NDArray[np.float64],
    S: NDArray[np.bool_],
    w: NDArray[np.float64],
    lam: NDArray[np.float64],
    p: float,
    steps: int = 30,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Newton's method on the KKT system of ``min ½‖w‖_p² s.t. F_S w = b_S`` (the rows S held tight):
    ``∇½‖w‖_p² = F_Sᵀ λ_S``, ``F_S w = b_S``; the Hessian of ½‖w‖_p² is ``(p−1)N^{2−p} diag(|w|^{p−2}) +
    (2−p)N^{2−2p} u uᵀ`` (N = ‖w‖_p, u = sign(w)|w|^{p−1}). For p ≥ 2 it is finite everywhere; for p < 2 it is
    infinite at zero entries, so the entries SLSQP left at zero (below 1e-9 of the largest) stay zero and Newton
    runs on the others. Quadratic from SLSQP's point; returns the last iterate whose residual did not grow."""
    FS, bS = F[S], b[S]
    lS = lam[S].copy()
    on = np.abs(w) > (0.0 if p >= 2 else 1e-9 * float(np.abs(w).max(initial=0.0)))
    if not on.any():
        return w, lam
    Fon = FS[:, on]

    def residual(w_: NDArray[np.float64], l_: NDArray[np.float64]) -> tuple[NDArray[np.float64], float]:
        a = np.abs(w_)
        N = float((a**p).sum()) ** (1.0 / p)
        g = N ** (2.0 - p) * np.sign(w_) * a ** (p - 1.0) if N > 0 else np.zeros_like(w_)
        r = np.concatenate([(g - FS.T @ l_)[on], FS @ w_ - bS])
        return r, float(np.linalg.norm(r))

    r, norm_r = residual(w, lS)
    for _ in range(steps):
        a = np.abs(w)
        N = float((a**p).sum()) ** (1.0 / p)
        if N == 0.0 or norm_r == 0.0:
            break
        ao = a[on]
        u = np.sign(w[on]) * ao ** (p - 1.0)
        H = (p - 1.0) * N ** (2.0 - p) * np.diag(ao ** (p - 2.0)) + (2.0 - p) * N ** (2.0 - 2.0 * p) * np.outer(u, u)
        k = FS.shape[0]
        J = np.block([[H, -Fon.T], [Fon, np.zeros((k, k))]])
        try:
            step = np.linalg.lstsq(J, -r, rcond=None)[0]
        except np.linalg.LinAlgError:
            break
        w_new = w.copy()
        w_new[on] += step[: int(on.sum())]
        l_new = lS + step[int(on.sum()) :]
        r_new, n_new = residual(w_new, l_new)
        if not n_new < norm_r:
            break
        w, lS, r, norm_r = w_new, l_new, r_new, n_new
    out = lam.copy()
    out[S] = lS
    return w, out


def _frobenius_point(work: ConstraintSet) -> NDArray[np.float64] | None:
    """A feasible start for the primal route: the Frobenius solution of the same rows (None if it has none)."""
    from .frobenius import solve_frobenius

    raw = solve_frobenius(work)
    return None if raw.W is None else np.asarray(raw.W, dtype=np.float64)


def solve_lp_limit(cs: ConstraintSet, norm: Literal["l1", "linf"]) -> RawSolution:
    """Solve ``min ‖W‖_1`` or ``min max_ij |W_ij|`` s.t. cs as a linear program (HiGHS; module doc)."""
    check_choice(norm, "norm", ("l1", "linf"))
    t0 = time.perf_counter()
    red = reduce(cs, subspace=False)
    work = red.problem
    info: dict = {"backend": "highs", "norm": norm}
    if red.unattainable.any():
        return RawSolution(None, red.zero_row_farkas(), INFEASIBLE, 0, info | {"reason": "zero feature row"})
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
