"""Solver statuses as named constants with groups (as cvxpy's ``settings`` has them).

Every solver and :class:`~attsvm.svm.AttentionSVM` report one of these. They are ``str`` values
(:class:`enum.StrEnum`), so ``status == "optimal"`` and JSON output keep working.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "Status",
    "OPTIMAL",
    "OPTIMAL_INACCURATE",
    "INFEASIBLE",
    "MAX_ITER",
    "ERROR",
    "ILL_CONDITIONED",
    "SOLUTION_PRESENT",
    "CERTIFIED",
    "FAILED",
    "ALL_STATUSES",
    "LEAVE_TIED",
    "LEAVE_MAX_ITER",
    "LEAVE_INFEASIBLE",
    "LEAVE_SINGULAR",
]


class Status(StrEnum):
    """Outcome of a solve (docs/spec.md §3)."""

    OPTIMAL = "optimal"  # certificate checked at the requested tolerance
    OPTIMAL_INACCURATE = "optimal_inaccurate"  # a primal point, certificate misses the tolerance
    INFEASIBLE = "infeasible"  # a verified Farkas certificate (see certificate.py)
    MAX_ITER = "max_iter"  # the iteration limit cut the solve short
    ERROR = "error"  # the backend failed; ``info`` says why
    # a Farkas certificate passes the tolerance, yet a W meets every constraint: feasible only with a huge ‖W‖;
    # W_ is that feasible point (not certified optimal), certificate_ the near-Farkas λ
    ILL_CONDITIONED = "ill_conditioned"


OPTIMAL = Status.OPTIMAL
OPTIMAL_INACCURATE = Status.OPTIMAL_INACCURATE
INFEASIBLE = Status.INFEASIBLE
MAX_ITER = Status.MAX_ITER
ERROR = Status.ERROR
ILL_CONDITIONED = Status.ILL_CONDITIONED

# a primal W is available
SOLUTION_PRESENT: frozenset[Status] = frozenset({OPTIMAL, OPTIMAL_INACCURATE, ILL_CONDITIONED})
# the answer is backed by a verified certificate (optimality or Farkas)
CERTIFIED: frozenset[Status] = frozenset({OPTIMAL, INFEASIBLE})
# no trustworthy answer
FAILED: frozenset[Status] = frozenset({MAX_ITER, ERROR})
ALL_STATUSES: tuple[Status, ...] = tuple(Status)

# Codes of the instances of a solved stack (attsvm.svm.batch): a non-negative code is the iteration count;
# the negative ones say why the instance leaves the stack for AttentionSVM.fit (LEAVE_INFEASIBLE stays
# when its candidate Farkas certificate verifies)
LEAVE_TIED = -1  # a zero or vanishing row (tied tokens): possibly infeasible; also the NumPy route's "not ok"
LEAVE_MAX_ITER = -2  # iteration budget spent
LEAVE_INFEASIBLE = -3  # a violated row dependent on active rows whose multipliers cannot be released: the
# multipliers hold the candidate Farkas certificate, verified before the instance is reported infeasible
LEAVE_SINGULAR = -4  # the working set's Gram matrix lost positive definiteness, or outgrew W's entries
