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
