"""Attention SVMs (SPEC §3, §5): constraint sets, certified solvers, feasibility, local optimality.

Public entry points: :class:`AttentionSVM` (the estimator over every backend),
:func:`feasible` / :class:`FeasibilityReport`, :func:`locally_optimal`, and the constraint data
:class:`ConstraintSet` / :func:`att_svm_constraints`. The backends live in private-ish modules:
:mod:`.frobenius` (exact projected Newton), :mod:`.nuclear` (augmented Lagrangian on factors),
:mod:`.cvxpy_backend` (the vectorised cvxpy reference).
"""

from __future__ import annotations

from ._base import ConstraintSet, RawSolution, Subspaces, att_svm_constraints
from .cvxpy_backend import solve_cvxpy
from .estimator import AttentionSVM, InfeasibleSVMError
from .feasibility import FeasibilityReport, feasible, feasible_constraints
from .frobenius import solve_frobenius
from .local import locally_optimal
from .nuclear import balanced_factors, solve_nuclear, solve_nuclear_rank

__all__ = ["AttentionSVM", "InfeasibleSVMError", "feasible", "feasible_constraints", "FeasibilityReport",
           "locally_optimal", "ConstraintSet", "att_svm_constraints", "Subspaces", "RawSolution",
           "solve_frobenius", "solve_cvxpy", "solve_nuclear", "solve_nuclear_rank", "balanced_factors"]

import importlib as _importlib

try:  # SPEC §5 (SVM-NUCLEAR's module); optional until it lands
    _equivalence = _importlib.import_module(f"{__name__}.equivalence")
except ModuleNotFoundError as _exc:  # pragma: no cover - only while equivalence.py is missing
    if _exc.name != f"{__name__}.equivalence":
        raise
else:
    for _name in getattr(_equivalence, "__all__", []):
        globals()[_name] = getattr(_equivalence, _name)
        __all__.append(_name)
