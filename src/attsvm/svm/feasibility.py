"""Feasibility of an attention SVM and its certificates (docs/spec.md §3, theorem of alternatives).

``Att-SVM(α)`` is infeasible iff some ``λ ≥ 0`` with ``1ᵀλ = 1`` has ``𝒜*(λ) = Σ_k λ_k a_k z_kᵀ = 0``.
For a general :class:`ConstraintSet` (equality rows, any right-hand sides) the alternative reads
``λ_I ≥ 0, λ_E free, 𝒜*(λ) = 0, bᵀλ > 0``. Every answer carries a certificate:

* feasible: a ``W`` with every constraint satisfied (for Att-SVM: all margins ≥ 1) — the exact
  Frobenius solution, whose minimal margin and violation are reported;
* infeasible: ``λ`` (n, T) normalised to ``1ᵀ|λ| = 1`` with its residual ``‖𝒜*(λ)‖_F``, verified
  by :func:`~attsvm.svm.certificate.farkas_certificate` before it is reported.

Two methods: ``"solver"`` (default) runs :func:`~attsvm.svm.frobenius.solve_frobenius`, whose
iterates run off along the certificate when the dual is unbounded; ``"lp"`` solves the alternative
system as a linear program with HiGHS (scipy ``linprog``) on the reduced, normalised problem
(:func:`~attsvm.svm.certificate.find_farkas`) — independent of the solver, used to cross-check it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._validation import check_choice
from ..problem import AttentionProblem
from ._base import ConstraintSet, att_svm_constraints
from .certificate import farkas_certificate, find_farkas
from .frobenius import solve_frobenius
from .status import INFEASIBLE, OPTIMAL

__all__ = ["FeasibilityReport", "feasible", "feasible_constraints", "farkas_lp", "FEASIBILITY_METHODS"]

FEASIBILITY_METHODS: tuple[str, ...] = ("solver", "lp")


@dataclass(frozen=True)
class FeasibilityReport:
    """Whether an attention SVM is feasible, with its certificate (docs/spec.md §3).

    Attributes
    ----------
    feasible : bool
    certificate : (n, T) λ when infeasible (λ_I ≥ 0, ``1ᵀ|λ| = 1``, ``𝒜*(λ) ≈ 0``), else None.
    certificate_residual : ``‖𝒜*(λ)‖_F`` of the certificate (None when feasible).
    W : (d, d) a matrix satisfying every constraint when feasible (the Frobenius SVM solution), else None.
    min_margin : min over inequality constraints of ``a_kᵀ W z_k`` (None when infeasible).
    max_violation : of ``W`` on the constraints (None when infeasible).
    method : "solver" or "lp".
    tokens : (n,) the selection α, when built from a problem.
    """

    feasible: bool
    certificate: NDArray[np.float64] | None
    certificate_residual: float | None
    W: NDArray[np.float64] | None
    min_margin: float | None
    max_violation: float | None
    method: str
    tokens: NDArray[np.int64] | None = None

    def __bool__(self) -> bool:
        return self.feasible

    def to_dict(self) -> dict:
        return {
            "feasible": self.feasible,
            "method": self.method,
            "certificate": None if self.certificate is None else self.certificate.tolist(),
            "certificate_residual": self.certificate_residual,
            "min_margin": self.min_margin,
            "max_violation": self.max_violation,
            "tokens": None if self.tokens is None else self.tokens.tolist(),
        }


def farkas_lp(cs: ConstraintSet) -> NDArray[np.float64] | None:
    """A Farkas certificate from the linear program of :func:`~attsvm.svm.certificate.find_farkas`
    (HiGHS, in the normalised units of :mod:`.reduction`), verified, normalised to ``Σ|λ_k| = 1``;
    None when the alternative system has no (verifiable) solution, i.e. the SVM is feasible."""
    cert = find_farkas(cs)
    return None if cert is None else cert.lam


def _report_feasible(
    cs: ConstraintSet, W: NDArray[np.float64] | None, method: str, tokens: NDArray[np.int64] | None
) -> FeasibilityReport:
    mm = viol = None
    if W is not None:
        m = cs.apply(W)
        mm = float(m[cs.inequality].min()) if cs.inequality.any() else None
        viol = cs.violation(W)
    return FeasibilityReport(True, None, None, W, mm, viol, method, tokens)


def feasible_constraints(
    cs: ConstraintSet, *, method: str = "solver", tokens: NDArray[np.int64] | None = None
) -> FeasibilityReport:
    """Feasibility of a general :class:`ConstraintSet` with its certificate (see module doc).

    "infeasible" is reported only with a Farkas certificate verified by
    :func:`~attsvm.svm.certificate.farkas_certificate` (scale-free: see :mod:`.certificate`).
    """
    check_choice(method, "method", FEASIBILITY_METHODS)
    if not isinstance(cs, ConstraintSet):
        raise TypeError(f"cs must be a ConstraintSet, got {type(cs).__name__}")
    raw = None
    if method == "solver":
        raw = solve_frobenius(cs)
        if raw.status == INFEASIBLE:  # (solve_frobenius verified the certificate)
            cert = farkas_certificate(cs, raw.dual, "frobenius")
            return FeasibilityReport(False, cert.lam, cert.residual, None, None, None, "solver", tokens)
        if raw.status == OPTIMAL and raw.W is not None:
            return _report_feasible(cs, raw.W, "solver", tokens)
        # the solver did not settle it: fall through to the LP
    lp_cert = find_farkas(cs)
    if lp_cert is not None:
        return FeasibilityReport(False, lp_cert.lam, lp_cert.residual, None, None, None, "lp", tokens)
    raw = solve_frobenius(cs) if raw is None else raw
    return _report_feasible(cs, raw.W, "lp", tokens)


def feasible(
    problem: AttentionProblem, tokens: ArrayLike | None = None, *, method: str = "solver"
) -> FeasibilityReport:
    """Is ``Att-SVM(α)`` feasible? (docs/spec.md §3). ``tokens=None`` uses the optimal tokens.

    Returns a :class:`FeasibilityReport` carrying a margin certificate W (all margins ≥ 1) when
    feasible, or λ ≥ 0 with ``1ᵀλ = 1`` and ``Σ λ_k a_k z_kᵀ ≈ 0`` when infeasible.
    """
    if not isinstance(problem, AttentionProblem):
        raise TypeError(f"problem must be an AttentionProblem, got {type(problem).__name__}")
    alpha = problem.check_tokens(tokens)
    return feasible_constraints(att_svm_constraints(problem, alpha), method=method, tokens=alpha)
