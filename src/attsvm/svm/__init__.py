"""Attention SVMs (docs/spec.md §3, §5): constraint sets, certified solvers, feasibility, local optimality.

One path from problem to answer: a :class:`ConstraintSet` goes through the one reduction
(:mod:`.reduction`: row normalisation, subspaces, global scale), a solver (:mod:`.frobenius`:
exact projected Newton; :mod:`.nuclear`: augmented Lagrangian on factors; :mod:`.spectral`: interior
point on the SDP form; :mod:`.cvxpy_backend`: the vectorised cvxpy reference), the lift back, and the
one certificate check (:mod:`.certificate`). Any other norm (a :class:`Norm` with a value, a dual norm and a
prox, by instance or by a name given to :func:`register_norm`) goes to :mod:`.generic` (PDHG).
Norm-specific pieces live in :mod:`.norms`, statuses in :mod:`.status`.

Public entry points: :class:`AttentionSVM` (the estimator over every backend),
:func:`feasible` / :class:`FeasibilityReport`, :func:`locally_optimal`, and the constraint data
:class:`ConstraintSet` / :func:`att_svm_constraints`.
"""

from __future__ import annotations

from ._base import ConstraintSet, RawSolution, Subspaces, att_svm_constraints
from .certificate import (
    FarkasCertificate,
    OptimalityCertificate,
    farkas_certificate,
    find_farkas,
    optimality_certificate,
)
from .cvxpy_backend import solve_cvxpy
from .equivalence import (
    SELECT_EPS,
    Decomposition,
    MixtureResult,
    decomposition,
    equivalence_constraints,
    optimal_mixture,
    selected_sets,
    svm_eq,
    w_fin,
)
from .estimator import AttentionSVM, InfeasibleSVMError, NotFittedError
from .feasibility import FeasibilityReport, feasible, feasible_constraints
from .frobenius import FrobeniusOptions, solve_frobenius
from .generic import GenericOptions, solve_generic
from .local import locally_optimal
from .norms import FROBENIUS, NUCLEAR, Norm, get_norm, register_norm, registered_norms, unregister_norm
from .nuclear import NuclearOptions, balanced_factors, solve_nuclear, solve_nuclear_rank
from .prompt import HeadSVM, JointSVM, PromptSVM, head_svm_constraints, joint_svm, p_svm_constraints
from .reduction import Reduction, reduce
from .spectral import SpectralOptions, solve_spectral
from .stack import SVMStack
from .status import (
    ALL_STATUSES,
    CERTIFIED,
    ERROR,
    FAILED,
    INFEASIBLE,
    MAX_ITER,
    OPTIMAL,
    OPTIMAL_INACCURATE,
    SOLUTION_PRESENT,
    Status,
)

__all__ = [
    "AttentionSVM",
    "SVMStack",
    "InfeasibleSVMError",
    "NotFittedError",
    "feasible",
    "feasible_constraints",
    "FeasibilityReport",
    "locally_optimal",
    "ConstraintSet",
    "att_svm_constraints",
    "Subspaces",
    "RawSolution",
    "solve_frobenius",
    "FrobeniusOptions",
    "solve_cvxpy",
    "solve_nuclear",
    "solve_nuclear_rank",
    "solve_spectral",
    "SpectralOptions",
    "NuclearOptions",
    "balanced_factors",
    "selected_sets",
    "svm_eq",
    "w_fin",
    "decomposition",
    "optimal_mixture",
    "equivalence_constraints",
    "Decomposition",
    "MixtureResult",
    "SELECT_EPS",
    "Reduction",
    "reduce",
    "OptimalityCertificate",
    "FarkasCertificate",
    "optimality_certificate",
    "farkas_certificate",
    "find_farkas",
    "Norm",
    "FROBENIUS",
    "NUCLEAR",
    "get_norm",
    "register_norm",
    "unregister_norm",
    "registered_norms",
    "solve_generic",
    "GenericOptions",
    "Status",
    "OPTIMAL",
    "OPTIMAL_INACCURATE",
    "INFEASIBLE",
    "MAX_ITER",
    "ERROR",
    "SOLUTION_PRESENT",
    "CERTIFIED",
    "FAILED",
    "ALL_STATUSES",
    "PromptSVM",
    "HeadSVM",
    "JointSVM",
    "joint_svm",
    "p_svm_constraints",
    "head_svm_constraints",
]


def _start_preload() -> None:
    """Begin loading the compiled kernels in the background (:func:`attsvm.svm.batch.start_preload`): last,
    once the package is whole."""
    from .batch import start_preload

    # (a fit_many of no instance: the modules it imports on first use, and the inspection of the loaded BLAS
    # libraries behind attsvm._threads.blas_threads, about 50 ms)
    start_preload(lambda: AttentionSVM().fit_many([]))


_start_preload()
