"""Local optimality of a token selection (docs/spec.md §2).

``α`` is locally optimal iff ``Att-SVM(α)`` is feasible and every support token ``t ∈ T_i(α)``
scores strictly below the selected one, ``γ_{iα_i} > γ_it``. The solve is done here (the exact
Frobenius solver); the test itself is :func:`attsvm.tokens.local_optimality_report`.
"""

from __future__ import annotations

from numpy.typing import ArrayLike

from ..problem import AttentionProblem
from ..tokens import LocalOptimalityReport, local_optimality_report
from .estimator import AttentionSVM
from .status import INFEASIBLE, SOLUTION_PRESENT

__all__ = ["locally_optimal"]


def locally_optimal(
    problem: AttentionProblem, tokens: ArrayLike | None = None, *, tol: float = 1e-9
) -> LocalOptimalityReport:
    """Is the selection ``tokens`` (default: the optimal tokens) locally optimal? (docs/spec.md §2).

    Returns a :class:`~attsvm.tokens.LocalOptimalityReport`: feasibility, the support tokens of
    ``W^α_mm``, per-sequence pass/fail and the offending support tokens.
    """
    if not isinstance(problem, AttentionProblem):
        raise TypeError(f"problem must be an AttentionProblem, got {type(problem).__name__}")
    alpha = problem.check_tokens(tokens)
    svm = AttentionSVM("fro", tol=tol).fit(problem, alpha)
    if svm.status_ == INFEASIBLE:
        return local_optimality_report(problem, alpha, None, feasible=False)
    if svm.status_ not in SOLUTION_PRESENT:
        raise RuntimeError(f"the Frobenius SVM of the selection did not solve (status {svm.status_!r})")
    return local_optimality_report(problem, alpha, svm.support_, feasible=True)
