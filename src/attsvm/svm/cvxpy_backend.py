"""cvxpy reference backend for the attention SVMs (docs/spec.md §3, §5).

Two formulations of the same problem ``min ‖W‖ s.t. a_kᵀ W z_k (≥ | =) b_k``:

* ``"aux"`` (default, vectorised): an auxiliary variable ``U`` of shape (n, d) with ``U = Z Wᵀ``
  (row i is ``u_i = W z_i``) and every margin ``a_kᵀ u_{i(k)}`` as one sparse linear map applied
  to ``vec(U)`` — two vectorised constraints (inequalities, equalities) whatever K is.
* ``"loop"``: one cvxpy constraint per pair ``k``, as the published code writes it. Kept only so
  that ``benchmarks/bench_svm.py`` can time it; never use it for real work.

Frobenius: ``min ½‖W‖_F²`` (a QP; Clarabel by default), whose multipliers are exactly the λ of
docs/spec.md §3 (``W = Σ λ_k a_k z_kᵀ``). Nuclear: ``min ‖W‖_*`` (an SDP; Clarabel by default, SCS on
request), whose multipliers satisfy ``‖Σ λ_k a_k z_kᵀ‖₂ ≤ 1``. Spectral: ``min ‖W‖₂`` (cvxpy's ``sigma_max``, an
SDP), whose multipliers satisfy ``‖Σ λ_k a_k z_kᵀ‖_* ≤ 1``. Duals come back in the (n, T) layout,
``λ ≥ 0`` on inequalities and free on equalities, with the sign fixed so that stationarity reads
``∂‖W‖ ∋ 𝒜*(λ)``. The solver status is mapped, never swallowed (see :data:`STATUS_MAP`).
"""

from __future__ import annotations

import logging
import time
from typing import Literal

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from .._validation import check_choice, check_finite_scalar
from ._base import ConstraintSet, RawSolution
from .reduction import reduce as reduce_constraints
from .status import ERROR, INFEASIBLE, MAX_ITER, OPTIMAL, OPTIMAL_INACCURATE, Status

__all__ = ["solve_cvxpy", "NORMS", "FORMULATIONS", "STATUS_MAP"]

log = logging.getLogger(__name__)

NORMS: tuple[str, ...] = ("fro", "nuc", "spectral")
FORMULATIONS: tuple[str, ...] = ("aux", "loop")
SOLVERS: tuple[str, ...] = ("CLARABEL", "SCS")
DEFAULT_SOLVER: dict[str, str] = {"fro": "CLARABEL", "nuc": "CLARABEL", "spectral": "CLARABEL"}

# cvxpy status -> ours ("optimal" | "optimal_inaccurate" | "infeasible" | "max_iter" | "error")
STATUS_MAP: dict[str, Status] = {
    "optimal": OPTIMAL,
    "optimal_inaccurate": OPTIMAL_INACCURATE,
    "infeasible": INFEASIBLE,
    "infeasible_inaccurate": INFEASIBLE,
    "unbounded": ERROR,
    "unbounded_inaccurate": ERROR,
    "infeasible_or_unbounded": ERROR,
    "user_limit": MAX_ITER,
}


def _margin_operator(cs: ConstraintSet, rows: NDArray[np.bool_]) -> sp.csr_matrix:
    """Sparse (k, n·d) map from ``vec_F(U)`` (column-major, as ``cp.vec``) to the margins ``a_kᵀ u_i``
    of the pairs selected by ``rows`` (n, T) in row-major (i, t) order."""
    n, T, d = cs.A.shape
    ii, _ = np.nonzero(rows)
    k = ii.size
    vals = cs.A[rows]  # (k, d)
    row_idx = np.repeat(np.arange(k), d)
    col_idx = (ii[:, None] + n * np.arange(d)[None, :]).ravel()  # column-major index of U[i, j]
    return sp.csr_matrix((vals.ravel(), (row_idx, col_idx)), shape=(k, n * d))


def _constraint_duals(cs: ConstraintSet, cons: list, rows: NDArray[np.bool_], formulation: str) -> NDArray[np.float64]:
    """The (n, T) duals of the cvxpy constraints ``cons`` on the pairs ``rows`` (NaN where cvxpy has none)."""
    out = np.zeros((cs.n, cs.T))
    if not cons:
        return out
    if formulation == "aux":
        vals = cons[0].dual_value
    else:
        vals = np.array([c.dual_value if c.dual_value is not None else np.nan for c in cons], dtype=float)
    if vals is None:
        return out * np.nan
    out[rows] = np.asarray(vals, dtype=float).ravel()
    return out


def _solver_options(solver: str, time_limit: float | None, verbose: bool) -> dict:
    opts: dict = {"verbose": verbose}
    if time_limit is not None:
        if solver == "CLARABEL":
            opts["time_limit"] = float(time_limit)
        elif solver == "SCS":
            opts["time_limit_secs"] = float(time_limit)
    if solver == "SCS":
        opts.update(eps_abs=1e-9, eps_rel=1e-9, max_iters=100_000)
    return opts


def solve_cvxpy(
    cs: ConstraintSet,
    norm: Literal["fro", "nuc", "spectral"] = "fro",
    *,
    solver: str | None = None,
    formulation: Literal["aux", "loop"] = "aux",
    time_limit: float | None = None,
    reduce: bool = False,
    verbose: bool = False,
) -> RawSolution:
    """Solve ``min ‖W‖ s.t. 𝒜(W) (≥ | =) b`` with cvxpy (docs/spec.md §3; the reference backend).

    Parameters
    ----------
    cs : ConstraintSet
        The constraints (inequalities and equality rows, any right-hand sides).
    norm : {"fro", "nuc", "spectral"}
        Frobenius (as the QP ``min ½‖W‖_F²``), nuclear norm or spectral norm (largest singular value).
    solver : {"CLARABEL", "SCS"}, optional
        Default Clarabel (interior point, accurate). SCS is first order (fast, ~1e-5 accurate).
    formulation : {"aux", "loop"}
        Vectorised auxiliary-variable formulation, or the published one-constraint-per-pair loop.
    time_limit : float, optional
        Seconds given to the solver; a run cut short gets status ``"max_iter"`` (or ``"error"``).
    reduce : bool
        Also apply the subspace step of :func:`~attsvm.svm.reduction.reduce` (solve for ``M`` in
        ``W = U M Vᵀ``) instead of the full d × d W. Row normalisation and the global scale are
        always applied (and undone).

    Returns
    -------
    RawSolution
        ``W`` (d, d) or None, ``dual`` (n, T), mapped status; ``info`` holds the cvxpy status,
        solver name, setup/solve times and the formulation.
    """
    import cvxpy as cp

    check_choice(norm, "norm", NORMS)
    check_choice(formulation, "formulation", FORMULATIONS)
    solver = DEFAULT_SOLVER[norm] if solver is None else str(solver).upper()
    check_choice(solver, "solver", SOLVERS)
    if time_limit is not None:
        time_limit = check_finite_scalar(time_limit, "time_limit", positive=True)
    if not isinstance(cs, ConstraintSet):
        raise TypeError(f"cs must be a ConstraintSet, got {type(cs).__name__}")

    t0 = time.perf_counter()
    # the one reduction (row normalisation, global scale, optionally the subspaces W = U M Vᵀ):
    # the solver sees well-scaled data whatever the units of X and Z
    red = reduce_constraints(cs, subspace=reduce)
    work = red.problem
    n, T, d = work.A.shape
    rd = work.Z.shape[1]
    W = cp.Variable((d, rd), name="W")
    ineq, eq = work.inequality, work.equality
    cons_ineq: list = []
    cons_eq: list = []
    if formulation == "aux":
        U = cp.Variable((n, d), name="U")  # row i is u_i = W z_i
        link = [U == work.Z @ W.T]
        u = cp.vec(U, order="F")
        if ineq.any():
            cons_ineq = [_margin_operator(work, ineq) @ u >= work.rhs[ineq]]
        if eq.any():
            cons_eq = [_margin_operator(work, eq) @ u == work.rhs[eq]]
        constraints = link + cons_ineq + cons_eq
    else:
        for i, t in zip(*np.nonzero(work.mask)):
            expr = work.A[i, t] @ W @ work.Z[i]
            if work.equality[i, t]:
                cons_eq.append(expr == work.rhs[i, t])
            else:
                cons_ineq.append(expr >= work.rhs[i, t])
        constraints = cons_ineq + cons_eq
    if norm == "fro":
        objective = 0.5 * cp.sum_squares(W)
    else:
        objective = cp.normNuc(W) if norm == "nuc" else cp.sigma_max(W)
    prob = cp.Problem(cp.Minimize(objective), constraints)
    info: dict = {"backend": "cvxpy", "solver": solver, "formulation": formulation, "reduce": reduce}
    if red.unattainable.any():  # 0 ≥ b > 0 on a zero row: nothing for the solver to do
        info.update(cvxpy_status="infeasible", time=time.perf_counter() - t0, reason="zero feature row")
        return RawSolution(None, red.zero_row_farkas(), INFEASIBLE, 0, info)
    try:
        prob.solve(solver=solver, **_solver_options(solver, time_limit, verbose))
    except Exception as exc:  # SolverError and anything else: a status with info, never an escaping exception
        info.update(cvxpy_status="solver_error", message=str(exc), time=time.perf_counter() - t0)
        log.warning("cvxpy %s failed: %s", solver, exc)
        return RawSolution(None, np.zeros((cs.n, cs.T)), ERROR, 0, info)
    elapsed = time.perf_counter() - t0
    stats = prob.solver_stats
    info.update(
        cvxpy_status=prob.status,
        time=elapsed,
        solve_time=getattr(stats, "solve_time", None),
        setup_time=getattr(stats, "setup_time", None),
    )
    status = STATUS_MAP.get(prob.status, ERROR)
    n_iter = int(getattr(stats, "num_iters", 0) or 0)

    dual = _constraint_duals(cs, cons_ineq, ineq, formulation) + _constraint_duals(cs, cons_eq, eq, formulation)
    # cvxpy's Lagrangian is f + νᵀ(h(x) − b) for equalities: flip to our 𝒜*(λ) ∈ ∂‖W‖ convention
    dual = np.where(eq, -dual, dual)
    if not np.all(np.isfinite(dual)):
        dual = np.nan_to_num(dual)
        info["dual_missing"] = True
    info["global_scale"] = red.global_scale
    if status in (OPTIMAL, OPTIMAL_INACCURATE, MAX_ITER) and W.value is not None:
        Wv = np.asarray(W.value, dtype=float)
        return RawSolution(red.lift_W(Wv), red.lift_dual(dual, degree=2 if norm == "fro" else 1), status, n_iter, info)
    if status == INFEASIBLE:
        # cvxpy stores a Farkas ray in the duals when the solver gives one; normalise to 1ᵀ|λ| = 1
        # (the estimator accepts it only after .certificate has verified it)
        lam = red.lift_farkas(np.where(ineq, np.abs(dual), 0.0))
        s = lam.sum()
        return RawSolution(None, lam / s if s > 0 else lam, status, n_iter, info)
    if status == MAX_ITER:
        info["message"] = f"{solver} stopped at the time limit ({time_limit} s) without a solution"
    return RawSolution(None, dual, ERROR if status != MAX_ITER else status, n_iter, info)


def solve_cvxpy_lp(
    cs: ConstraintSet,
    p: float,
    *,
    solver: str | None = None,
    formulation: Literal["aux", "loop"] = "loop",
    time_limit: float | None = None,
    verbose: bool = False,
) -> RawSolution:
    """The ℓp attention SVM ``min ½‖W‖_p² s.t. cs`` with cvxpy's ``pnorm`` (docs/spec.md §8; the reference).

    ``formulation="loop"`` (default) is the published one: one cvxpy constraint per pair, as
    AttentionMD's code writes it; ``"aux"`` is the vectorised form of :func:`solve_cvxpy`. The data go
    through the one reduction without its subspace step (an entrywise norm is not rotation invariant).
    """
    import cvxpy as cp

    from .norms import lp_norm

    p = lp_norm(p).p
    check_choice(formulation, "formulation", FORMULATIONS)
    solver = "CLARABEL" if solver is None else str(solver).upper()
    check_choice(solver, "solver", SOLVERS)
    if not isinstance(cs, ConstraintSet):
        raise TypeError(f"cs must be a ConstraintSet, got {type(cs).__name__}")
    t0 = time.perf_counter()
    red = reduce_constraints(cs, subspace=False)
    work = red.problem
    n, T, d = work.A.shape
    W = cp.Variable((d, work.Z.shape[1]), name="W")
    ineq, eq = work.inequality, work.equality
    info: dict = {"backend": "cvxpy", "solver": solver, "formulation": formulation, "p": p}
    if red.unattainable.any():
        info.update(cvxpy_status="infeasible", reason="zero feature row")
        return RawSolution(None, red.zero_row_farkas(), INFEASIBLE, 0, info)
    cons_ineq: list = []
    cons_eq: list = []
    if formulation == "aux":
        U = cp.Variable((n, d), name="U")
        link = [U == work.Z @ W.T]
        u = cp.vec(U, order="F")
        if ineq.any():
            cons_ineq = [_margin_operator(work, ineq) @ u >= work.rhs[ineq]]
        if eq.any():
            cons_eq = [_margin_operator(work, eq) @ u == work.rhs[eq]]
        constraints = link + cons_ineq + cons_eq
    else:
        for i, t in zip(*np.nonzero(work.mask)):
            expr = work.A[i, t] @ W @ work.Z[i]
            (cons_eq if work.equality[i, t] else cons_ineq).append(
                (expr == work.rhs[i, t]) if work.equality[i, t] else (expr >= work.rhs[i, t])
            )
        constraints = cons_ineq + cons_eq
    norm_p = cp.pnorm(cp.vec(W, order="F"), p)  # (cvxpy accepts any p ≥ 1)
    prob = cp.Problem(cp.Minimize(0.5 * cp.square(norm_p)), constraints)
    try:
        prob.solve(solver=solver, **_solver_options(solver, time_limit, verbose))
    except Exception as exc:  # a solver failure is a status with info
        info.update(cvxpy_status="solver_error", message=str(exc), time=time.perf_counter() - t0)
        return RawSolution(None, np.zeros((cs.n, cs.T)), ERROR, 0, info)
    info.update(cvxpy_status=prob.status, time=time.perf_counter() - t0)
    status = STATUS_MAP.get(prob.status, ERROR)

    dual = _constraint_duals(cs, cons_ineq, ineq, formulation) - _constraint_duals(cs, cons_eq, eq, formulation)
    dual = np.nan_to_num(dual)
    if status in (OPTIMAL, OPTIMAL_INACCURATE, MAX_ITER) and W.value is not None:
        return RawSolution(red.lift_W(np.asarray(W.value, dtype=float)), red.lift_dual(dual, degree=2), status, 0, info)
    return RawSolution(None, dual, status, 0, info)
