"""Nuclear-norm attention SVM (Att-SVM*, docs/spec.md §3) and its rank-constrained variant.

Method (and why)
----------------
``min ‖W‖_*  s.t.  a_itᵀ W z_i ≥ b_it (inequalities),  = b_it (equalities)`` is solved by our own
**augmented Lagrangian on the Burer–Monteiro factorisation** of the *reduced* variable:

1. Reduction (:mod:`.reduction`, docs/spec.md §3 "Structure"): rows normalised, ``W = U M Vᵀ``
   with ``U`` spanning the features {a_k} and ``V`` the queries {z_i}; ``M`` is ``r_a × r_z`` with
   ``r_z ≤ n``; right-hand sides O(1) by a global power-of-two scale. Undone by the lift.
2. Variational identity ``‖M‖_* = min_{M = KQᵀ} ½(‖K‖_F² + ‖Q‖_F²)``, with ``K`` (r_a, p),
   ``Q`` (r_z, p), ``p ≤ min(r_a, r_z)`` — the nuclear norm becomes a smooth quadratic.
3. Constraints enter through the augmented Lagrangian ``(‖μ‖² − ‖λ‖²)/(2ρ)``,
   ``μ = λ − ρ(𝒜(M) − b)`` (clipped at 0 on inequality rows); each subproblem is smooth and is
   minimised by L-BFGS warm-started from the previous one; ``λ ← μ`` between them
   (:mod:`._alm`). With at most ``NuclearOptions.small_k`` constraint rows the L-BFGS is our own
   compact-form one (:mod:`._lbfgs`), whose per-iteration overhead is lower than scipy's
   wrapper; above, scipy's L-BFGS-B. The
   lean path is a fast path only: after two polishes (step 4) that did not certify, the solve restarts
   with scipy's L-BFGS-B, whose Wolfe line search gives steadier points on badly scaled data (real
   attention heads); ``info["path"]`` says which ran.
   Every evaluation is a handful of dense products, O(K·(r_a + r_z)·p + n·r_z·p).
   The number of columns p starts small and doubles while all are in use; a dead column is
   re-seeded along the top singular pair of ``𝒜*(λ)`` when that exceeds 1 (saddle escape).
4. Polish (:mod:`._kkt`): first-order methods stall near 1e-7 relative accuracy, so as early as possible — after
   the first, loosely solved (gtol 1e-3; 1e-2 with at most 400 rows) subproblem once the gap is
   below 0.1 — the rank r and the tight rows S are read off and the smooth KKT system of
   ``min ½(‖K‖² + ‖Q‖²) s.t. 𝒜_S(KQᵀ) = b_S`` (K, Q with r columns) is solved by Newton's method,
   with the (K, Q) block eliminated in the singular basis of ``𝒜*(λ)`` (systems of at most
   160 unknowns: one LU of the whole Jacobian, cheaper there); wrong guesses are
   corrected (rows with λ < 0 released, violated rows added, then a rank added while
   ‖𝒜*(λ)‖₂ > 1). A round whose multipliers already show a wrong sign once its residual is below
   1e-3 is cut short (its set is corrected without converging it to round-off). Newton stops
   as soon as it stagnates (a wrong guess has no KKT point), and
   after two failed rounds the polish hands back to the augmented Lagrangian, which tightens its
   subproblems and polishes again at each tenfold drop of the gap: the slow, safe path stays the
   fallback. This gives primal and dual to round-off (relative gaps ≈ 1e-15 in practice).
5. Certification: the primal is made *exactly* feasible (a least-norm correction on equality rows,
   then a rescaling ``M / min_k(m_k / b_k)``), and the multipliers give the dual bound
   ``bᵀλ / max(1, ‖𝒜*(λ)‖₂)`` (the dual of docs/spec.md §3 is ``max bᵀλ s.t. ‖𝒜*(λ)‖₂ ≤ 1``, λ ≥ 0 on
   inequalities); the loop stops when the relative gap between the two is below ``tol``.
6. Subgradient dual (only when 5 did not certify, on degenerate instances where even interior-point
   solvers stop "inaccurate"): at the optimum ``𝒜*(λ)`` is a subgradient of ‖·‖_* at W,
   ``U_r V_rᵀ + U_⊥ C V_⊥ᵀ`` with ‖C‖₂ ≤ 1. Given the exactly feasible primal, the rank r is read off
   and ``λ`` (≥ 0 on the nearly tight inequality rows, 0 elsewhere) and C (entries in [−1, 1]) are fit
   to that identity by bounded least squares (:func:`_subgradient_dual`). The candidate is only a
   candidate: its bound ``bᵀλ / max(1, ‖𝒜*(λ)‖₂)`` is valid whatever C, and the certificate module
   decides.

Why not cvxpy: the nuclear norm is an SDP cone there. Interior-point solvers (Clarabel) are
accurate but slow at moderate sizes, and SCS is first order (violations around 1e-5 unless pushed
hard); ``benchmarks/bench_nuclear.py`` compares them with this method in one run (timings live in
``benchmarks/`` and the README). This method returns exactly feasible primals and a certified
relative duality gap at round-off level. The non-convexity of the factorisation is never trusted
blindly: the duality gap, rechecked by :mod:`.certificate`, certifies the answer independently of
how it was found.

Infeasible constraint sets (docs/spec.md §3, theorem of alternatives) are detected by a zero-feature
test and, when the augmented Lagrangian stalls, by the one route of
:func:`~attsvm.svm.certificate.find_farkas` (a linear program in normalised units, or the Frobenius
solver's dual ray), whose certificate is verified before "infeasible" is reported.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._validation import check_positive_int
from ._alm import _alm, _ALMResult, _ALMRun, _better, _initial_factors
from ._base import ConstraintSet, RawSolution
from ._factored import (
    NuclearOptions,
    _make_feasible,
    _nuclear,
    _options,
    _reduce,
    _Reduced,
    _rescale_only,
    balanced_factors,
    without_repeats,
)
from .certificate import find_farkas, optimality_certificate, relative_violation
from .reduction import VANISHED_ROW_MESSAGE, Reduction, reduce
from .status import ERROR, INFEASIBLE, MAX_ITER, OPTIMAL, OPTIMAL_INACCURATE

__all__ = [
    "solve_nuclear",
    "solve_nuclear_rank",
    "NuclearOptions",
    "infeasibility_certificate",
    "balanced_factors",
    "NUCLEAR_GAP_TOL",
    "CONVEX_OPT_RTOL",
]

logger = logging.getLogger(__name__)

# Default relative duality gap at which the nuclear solver stops.
NUCLEAR_GAP_TOL = 1e-9
# A rank-constrained solution "reaches the convex optimum" when its objective is within this
# relative tolerance of the convex nuclear optimum.
CONVEX_OPT_RTOL = 1e-6
# Default relative tolerance of the rank-constrained solver.
RANK_GAP_TOL = 1e-8


def infeasibility_certificate(cs: ConstraintSet) -> NDArray[np.float64] | None:
    """A verified Farkas certificate λ (n, T) of ``cs`` (docs/spec.md §3), or None when feasible.

    The one route of :func:`~attsvm.svm.certificate.find_farkas` (zero rows, then the LP in
    normalised units), normalised to ``Σ|λ_k| = 1``.
    """
    cert = find_farkas(cs)
    return None if cert is None else cert.lam


def _lift_dual(red: _Reduced, lam_scaled: NDArray[np.float64]) -> NDArray[np.float64]:
    """Multipliers of the scaled rows → multipliers of the original rows, shape (n, T)."""
    lam = lam_scaled / red.scale * red.mask
    return np.where(red.ineq, np.maximum(lam, 0.0), lam)


def _trivial(cs: ConstraintSet, reduction: Reduction, red: _Reduced, t0: float, solver: str) -> RawSolution | None:
    """Handle the infeasible-by-inspection and constraint-free cases; None otherwise."""
    if reduction.unattainable.any():
        cert = find_farkas(cs, red=reduction, lp=False)
        if cert is None:  # (a vanished row whose λ does not verify: its norm over- or underflowed in float64)
            return RawSolution(
                None,
                np.zeros(cs.mask.shape),
                ERROR,
                0,
                {
                    "solver": solver,
                    "message": VANISHED_ROW_MESSAGE,
                },
            )
        return RawSolution(
            None,
            cert.lam,
            INFEASIBLE,
            0,
            {
                "solver": solver,
                "reason": "zero constraint feature with positive right-hand side",
                "time": time.perf_counter() - t0,
            },
        )
    # W = 0 satisfies every row when b ≤ 0 on the inequalities and b = 0 on the equalities, and has the
    # smallest possible norm: exact, with λ = 0 (the augmented Lagrangian would only crawl towards it)
    homogeneous = bool(np.all(cs.rhs[cs.inequality] <= 0) and np.all(cs.rhs[cs.equality] == 0))
    if homogeneous or not red.mask.any() or red.A.shape[2] == 0 or red.Z.shape[1] == 0:
        d = cs.d
        return RawSolution(
            np.zeros((d, d)),
            np.zeros(cs.mask.shape),
            OPTIMAL,
            0,
            {
                "solver": solver,
                "objective": 0.0,
                "dual_objective": 0.0,
                "relative_gap": 0.0,
                "time": time.perf_counter() - t0,
            },
        )
    return None


def _check_cs(cs: ConstraintSet) -> None:
    if not isinstance(cs, ConstraintSet):
        raise TypeError(f"cs must be a ConstraintSet (see attsvm.svm.att_svm_constraints), got {type(cs).__name__}")


# ----------------------------------------------------------------------------- public solvers
def solve_nuclear(cs: ConstraintSet, options: NuclearOptions | None = None, **overrides: Any) -> RawSolution:
    """Att-SVM* (docs/spec.md §3): ``min ‖W‖_*`` subject to the constraint set ``cs``.

    Parameters
    ----------
    cs : ConstraintSet
        Inequality rows ``a_itᵀ W z_i ≥ b_it`` and equality rows ``= b_it`` (``svm/_base.py``).
    tol : float
        Relative duality gap ``(‖W‖_* − D)/‖W‖_*`` at which to stop, where ``D`` is the dual bound
        ``bᵀλ / max(1, ‖𝒜*(λ)‖₂)``.
    max_iter : int
        Outer augmented-Lagrangian iterations (each a warm-started L-BFGS solve).
    seed : int
        Seed of the small perturbation that breaks the symmetry of the factorisation.

    Returns
    -------
    RawSolution
        ``W`` (d, d) exactly feasible up to round-off, ``dual`` (n, T) the multipliers λ, status
        ``"optimal"`` (gap ≤ tol), ``"optimal_inaccurate"`` (iteration limit, gap reported), or
        ``"infeasible"`` with the certificate of docs/spec.md §3 in ``dual``. ``info`` holds ``objective``,
        ``dual_objective``, ``relative_gap``, ``violation``, ``rank_reduced`` (r_a, r_z) and timings.

    See the module docstring for the method (augmented Lagrangian + Burer–Monteiro + L-BFGS on the
    reduced problem) and why it is used instead of cvxpy.
    """
    _check_cs(cs)
    opt = _options(options, overrides, "solve_nuclear")
    tol, max_iter, seed = opt.tol, opt.max_iter, opt.seed
    t0 = time.perf_counter()
    reduction = reduce(cs)
    red = _reduce(reduction)
    triv = _trivial(cs, reduction, red, t0, "alm-burer-monteiro")
    if triv is not None:
        return triv
    # a repeated row (a token pair seen again under the same query) adds nothing but a singular direction to
    # the polish's Newton systems: solved once, its copies get multiplier 0
    red = without_repeats(red)
    r_a, r_z = red.A.shape[2], red.Z.shape[1]
    # start near the rank that typical optima have (~√K/2 here), never below _P0; grown as needed
    p = min(r_a, r_z, max(opt.p0, round(0.5 * np.sqrt(red.mask.sum()))))
    rng = np.random.default_rng(seed)
    K, Q = _initial_factors(red, p, rng)
    # small problems: a looser first subproblem before the first polish (fewer L-BFGS iterations;
    # the active-set corrections of the polish absorb the rougher guess at that size)
    small = bool(red.mask.sum() <= opt.small_k) if opt.path == "auto" else opt.path == "lean"
    if small:  # the fast path; it hands over after lean_max_failed_polish polishes that did not certify
        run = _ALMRun(
            tol=tol,
            max_iter=max_iter,
            grow_rank=True,
            lean=True,
            gtol0=opt.gtol0_small,
            max_failed_polish=opt.lean_max_failed_polish if opt.path == "auto" else None,
        )
        res = _alm(red, K, Q, opt, run, rng=rng)
    path = "lean"
    bmax = max(1.0, float(np.abs(red.b).max(initial=0.0)))
    cert = None
    if small and not res.converged and res.violation > 1e-6 * bmax:  # infeasible? then no second path
        cert = find_farkas(cs, red=reduction)
    if not small or (not res.converged and cert is None and opt.path == "auto"):
        # the reference path: scipy's L-BFGS-B (its Wolfe line search gives the polish steadier points on
        # badly scaled data, e.g. real attention heads), from the same start
        if small:
            logger.debug(
                "lean path did not certify after %d outer iterations: rerunning with scipy's L-BFGS-B", res.n_outer
            )
            rng = np.random.default_rng(seed)
            K, Q = _initial_factors(red, p, rng)
        lean_res = res if small else None
        res = _alm(
            red, K, Q, opt, _ALMRun(tol=tol, max_iter=max_iter, grow_rank=True, lean=False, gtol0=opt.gtol0), rng=rng
        )
        path = "scipy" if not small else "lean, then scipy"
        if (
            lean_res is not None
            and not res.converged
            and _better(lean_res, res, 1e-9 * float(max(1.0, np.abs(red.b).max(initial=0.0))))
        ):
            res = lean_res
    info = {
        "solver": "alm-burer-monteiro",
        "rank_reduced": (r_a, r_z),
        "outer_iterations": res.n_outer,
        "inner_iterations": res.n_inner,
        "path": path,
        "time": None,
    }
    if res.violation > 1e-6 * bmax:
        if cert is None:
            cert = find_farkas(cs, red=reduction)
        if cert is None:
            # feasibility does not depend on the norm: the Frobenius solver's dual ray is a candidate
            # too (docs/spec.md §3); like every certificate it is verified before it is used
            from .frobenius import solve_frobenius

            fro = solve_frobenius(cs)
            if fro.status == INFEASIBLE:
                cert = find_farkas(cs, candidates=(("frobenius dual ray", fro.dual),), red=reduction, lp=False)
        if cert is not None:
            info.update(
                reason=f"augmented Lagrangian stalled; Farkas certificate from the {cert.source}",
                certificate_source=cert.source,
                time=time.perf_counter() - t0,
            )
            return RawSolution(None, cert.lam, INFEASIBLE, res.n_outer, info)
    M = _make_feasible(red, res.K @ res.Q.T) if res.M is None else res.M  # (already made feasible)
    W = reduction.lift_W(M)
    # (a gap ≤ tol counts only for a feasible primal: an infeasible one can have a negative gap)
    feasible = res.violation <= 1e-9 * max(1.0, float(np.abs(red.b).max(initial=0.0)))
    status = OPTIMAL if (res.converged or (res.gap <= tol and feasible)) else OPTIMAL_INACCURATE
    lam_out = reduction.lift_dual(_lift_dual(red, res.lam))
    if status != OPTIMAL and feasible:
        polished = _subgradient_dual(cs, W, tol)
        if polished is not None:
            lam_out, res = polished[0], replace(res, gap=polished[1], dual=polished[2] / reduction.global_scale)
            status = OPTIMAL
            info["dual_polish"] = "subgradient"
    if status != "optimal":
        warnings.warn(
            f"solve_nuclear stopped after {res.n_outer} outer iterations with relative gap "
            f"{res.gap:.2e} > tol={tol:.1e} (violation {res.violation:.1e})",
            RuntimeWarning,
            stacklevel=2,
        )
    # (the ALM works in the reduced units: ‖W‖_* = g · ‖M‖_*, and the dual bound scales alike)
    g = reduction.global_scale
    objective = g * (res.primal if res.M is not None else _nuclear(M))
    info.update(
        objective=objective,
        dual_objective=g * res.dual,
        relative_gap=res.gap,
        violation=cs.violation(W),
        time=time.perf_counter() - t0,
    )
    return RawSolution(W, lam_out, status, res.n_outer, info)


# the subgradient dual (module doc, step 6) on problems up to this many (row × entry of W) products,
# and with the complement block C up to this many entries
SUBGRADIENT_MAX_WORK = 4_000_000
SUBGRADIENT_MAX_COMPLEMENT = 64


def _subgradient_dual(
    cs: ConstraintSet, W: NDArray[np.float64], tol: float
) -> tuple[NDArray[np.float64], float, float] | None:
    """A dual λ from the subgradient identity at an exactly feasible W (module doc, step 6), returned
    with its relative gap and dual bound when the certificate passes at ``tol``; else None."""
    from scipy.optimize import lsq_linear

    idx = np.argwhere(cs.mask)
    K = len(idx)
    d1, d2 = W.shape
    if K == 0 or K * d1 * d2 > SUBGRADIENT_MAX_WORK:
        return None
    A = cs.A[idx[:, 0], idx[:, 1]]
    Zr = cs.Z[idx[:, 0]]
    Mx = np.einsum("ka,kb->kab", A, Zr).reshape(K, -1)  # row k of 𝒜 as a vector
    m = cs.apply(W)[idx[:, 0], idx[:, 1]]
    b = cs.rhs[idx[:, 0], idx[:, 1]]
    eq = cs.equality[idx[:, 0], idx[:, 1]]
    U, S, Vt = np.linalg.svd(W)
    if not S.size or S[0] == 0:
        return None
    best: tuple[NDArray[np.float64], float, float] | None = None
    for rtol in (1e-8, 1e-6):
        r = int((S > rtol * S[0]).sum())
        G0 = (U[:, :r] @ Vt[:r]).ravel()
        nc = (d1 - r) * (d2 - r)
        comp = (
            np.einsum("ia,jb->abij", U[:, r:], Vt[r:].T).reshape(nc, -1)
            if 0 < nc <= SUBGRADIENT_MAX_COMPLEMENT
            else np.zeros((0, d1 * d2))
        )
        for thr in (1e-7, 1e-5, 1e-3):
            act = np.flatnonzero(eq | (m - b <= thr * np.maximum(1.0, np.abs(b))))
            if act.size == 0:
                continue
            B = np.concatenate([Mx[act].T, -comp.T], axis=1)
            lb = np.r_[np.where(eq[act], -np.inf, 0.0), -np.ones(len(comp))]
            ub = np.r_[np.full(act.size, np.inf), np.ones(len(comp))]
            try:
                sol = lsq_linear(B, G0, bounds=(lb, ub), method="bvls" if B.shape[1] <= 400 else "trf", tol=1e-15)
            except (ValueError, np.linalg.LinAlgError):
                continue
            lam = np.zeros(cs.mask.shape)
            lam[idx[act, 0], idx[act, 1]] = sol.x[: act.size]
            cert = optimality_certificate(cs, W, lam, "nuc")
            if cert.passes(tol) and (best is None or cert.relative_gap < best[1]):
                best = (cert.lam, float(cert.relative_gap), float(cert.dual))
    return best


def solve_nuclear_rank(
    cs: ConstraintSet,
    *,
    rank: int,
    options: NuclearOptions | None = None,
    restarts: int = 3,
    convex: RawSolution | None = None,
    **overrides: Any,
) -> RawSolution:
    """Rank-constrained Att-SVM* (docs/spec.md §3): ``min ½(‖K‖_F² + ‖Q‖_F²)`` s.t. the constraints on ``W = KQᵀ``.

    ``K, Q`` have ``rank`` columns (so ``rank(W) ≤ rank``). The problem is non-convex: we run the
    augmented Lagrangian of :func:`solve_nuclear` from ``restarts`` seeded random starts (the first
    one the truncated SVD of the convex solution) and keep the best feasible result. When ``rank``
    is at least the rank of the convex nuclear solution, that solution is feasible for this problem
    and the result equals the convex optimum; for smaller ranks the returned point is the best
    found, with **no guarantee of global optimality**.

    Returns a :class:`RawSolution` whose ``info`` reports ``objective`` (½(‖K‖²+‖Q‖²) at the returned
    balanced factors, = ‖W‖_*), ``convex_objective``, ``reached_convex_optimum`` (relative difference
    ≤ :data:`CONVEX_OPT_RTOL`), ``violation``, ``rank`` and ``K``, ``Q`` (d, rank). ``dual`` holds the
    augmented-Lagrangian multipliers (KKT multipliers of the factored problem, not a convex
    certificate unless the convex optimum was reached).
    """
    _check_cs(cs)
    rank = check_positive_int(rank, "rank")
    if options is None and "tol" not in overrides:
        overrides = dict(overrides, tol=RANK_GAP_TOL)
    opt = _options(options, overrides, "solve_nuclear_rank")
    tol, max_iter, seed = opt.tol, opt.max_iter, opt.seed
    restarts = check_positive_int(restarts, "restarts")
    t0 = time.perf_counter()
    if convex is None:
        convex = solve_nuclear(cs, replace(opt, tol=min(tol, NUCLEAR_GAP_TOL)))
    if convex.status == INFEASIBLE:
        info = dict(
            convex.info,
            rank=rank,
            reached_convex_optimum=False,
            convex_objective=None,
            objective=None,
            solver="alm-burer-monteiro-rank",
        )
        return RawSolution(None, convex.dual, INFEASIBLE, 0, info)
    assert convex.W is not None
    f_convex = float(convex.info["objective"])
    reduction = reduce(cs)
    red = _reduce(reduction)
    r_a, r_z = red.A.shape[2], red.Z.shape[1]
    d = cs.d
    p = min(rank, r_a, r_z)
    rng = np.random.default_rng(seed)
    M_cvx = reduction.reduce_W(convex.W)
    starts: list[tuple[NDArray[np.float64], NDArray[np.float64]]] = []
    Kc, Qc = balanced_factors(M_cvx, rank=p)
    starts.append((Kc, Qc))
    for _ in range(restarts - 1):
        K0, Q0 = _initial_factors(red, p, rng, noise=0.3)
        starts.append((K0, Q0))
    best: tuple[float, float, _ALMResult] | None = None
    total_outer = 0
    start_objectives: list[float] = []
    # multipliers of the scaled rows: a good first guess
    lam_cvx = reduction.reduce_dual(convex.dual) * red.scale * red.mask
    scale_b = max(1.0, float(np.abs(red.b).max(initial=0.0)))
    for K0, Q0 in starts:
        res = _alm(
            red,
            K0,
            Q0,
            opt,
            _ALMRun(tol=tol, max_iter=max_iter, certify=False, lean=bool(red.mask.sum() <= opt.small_k)),
            lam=lam_cvx,
        )
        total_outer += res.n_outer
        M = res.K @ res.Q.T
        Mf = _rescale_only(red, M)
        obj = reduction.global_scale * _nuclear(Mf)  # ‖W‖_* in the user's units
        viol = red.violation(red.apply(Mf))
        start_objectives.append(obj)
        key = (viol > 1e-8 * scale_b, obj)
        if best is None or key < (best[1] > 1e-8 * scale_b, best[0]):
            best = (obj, viol, res)
    assert best is not None
    obj, viol, res = best
    M = _rescale_only(red, res.K @ res.Q.T)
    W = reduction.lift_W(M)
    K, Q = balanced_factors(W, rank=rank)
    if K.shape[1] < rank:  # d < rank: pad with zero columns
        K = np.hstack([K, np.zeros((d, rank - K.shape[1]))])
        Q = np.hstack([Q, np.zeros((d, rank - Q.shape[1]))])
    rel = (obj - f_convex) / max(f_convex, 1e-300)
    reached = bool(abs(rel) <= CONVEX_OPT_RTOL)
    violation = cs.violation(W)
    feasible = relative_violation(cs, W) <= 1e-8
    status = OPTIMAL if reached else (OPTIMAL_INACCURATE if feasible else MAX_ITER)
    info = {
        "solver": "alm-burer-monteiro-rank",
        "rank": rank,
        "objective": obj,
        "convex_objective": f_convex,
        "relative_excess": rel,
        "reached_convex_optimum": reached,
        "violation": violation,
        "convex_rank_reduced": (r_a, r_z),
        "restarts": restarts,
        "K": K,
        "Q": Q,
        "start_objectives": start_objectives,
        "global_guarantee": reached,
        "time": time.perf_counter() - t0,
    }
    return RawSolution(W, reduction.lift_dual(_lift_dual(red, res.lam)), status, total_outer, info)
