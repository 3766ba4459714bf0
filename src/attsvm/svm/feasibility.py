"""Feasibility of an attention SVM and its certificates (SPEC §3, theorem of alternatives).

``Att-SVM(α)`` is infeasible iff some ``λ ≥ 0`` with ``1ᵀλ = 1`` has ``𝒜*(λ) = Σ_k λ_k a_k z_kᵀ = 0``.
For a general :class:`ConstraintSet` (equality rows, any right-hand sides) the alternative reads
``λ_I ≥ 0, λ_E free, 𝒜*(λ) = 0, bᵀλ > 0``. Every answer carries a certificate:

* feasible: a ``W`` with every constraint satisfied (for Att-SVM: all margins ≥ 1) — the exact
  Frobenius solution, whose minimal margin and violation are reported;
* infeasible: ``λ`` (n, T) normalised to ``1ᵀ|λ| = 1`` with its residual ``‖𝒜*(λ)‖_F``.

Two methods: ``"solver"`` (default) runs :func:`~attsvm.svm.frobenius.solve_frobenius`, whose
iterates run off along the certificate when the dual is unbounded; ``"lp"`` solves the alternative
system as a linear program with HiGHS (scipy ``linprog``) on the reduced problem — independent of the
solver, used to cross-check it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from numpy.typing import ArrayLike, NDArray

from .._validation import check_choice
from ..problem import AttentionProblem
from ._base import ConstraintSet, att_svm_constraints
from .frobenius import solve_frobenius

__all__ = ["FeasibilityReport", "feasible", "feasible_constraints", "farkas_lp", "FEASIBILITY_METHODS"]

FEASIBILITY_METHODS: tuple[str, ...] = ("solver", "lp")


@dataclass(frozen=True)
class FeasibilityReport:
    """Whether an attention SVM is feasible, with its certificate (SPEC §3).

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
            "feasible": self.feasible, "method": self.method,
            "certificate": None if self.certificate is None else self.certificate.tolist(),
            "certificate_residual": self.certificate_residual,
            "min_margin": self.min_margin, "max_violation": self.max_violation,
            "tokens": None if self.tokens is None else self.tokens.tolist(),
        }


def farkas_lp(cs: ConstraintSet) -> NDArray[np.float64] | None:
    """Solve the alternative system ``λ_I ≥ 0, 𝒜*(λ) = 0, bᵀλ = 1`` as an LP (HiGHS).

    Works on the reduced problem with auxiliary ``B_i = Σ_t λ_it ã_it`` (n, r_a) and ``Z̃ᵀB = 0``,
    so the LP has O(K·r_a + n·r_a·r_z) nonzeros. Returns λ (n, T) normalised to ``1ᵀ|λ| = 1``, or
    None when the system has no solution (the SVM is feasible).
    """
    from scipy.optimize import linprog

    sub = cs.subspaces()
    red = cs.restrict(sub)
    n, T, ra = red.A.shape
    rz = red.Z.shape[1]
    idx = np.flatnonzero(red.mask.ravel())
    K = idx.size
    if K == 0:
        return None
    b = red.rhs.ravel()[idx]
    ineq = ~red.equality.ravel()[idx]
    seq = idx // T
    Af = red.A.reshape(-1, ra)[idx]  # (K, r_a)
    # E1: Σ_t λ_it ã_itj − B_ij = 0, rows (i, j); columns [λ (K) | B (n·r_a, row-major)]
    rows1 = (seq[:, None] * ra + np.arange(ra)[None, :]).ravel()
    cols1 = np.repeat(np.arange(K), ra)
    E1 = sp.csr_matrix((Af.ravel(), (rows1, cols1)), shape=(n * ra, K))
    E1 = sp.hstack([E1, -sp.identity(n * ra, format="csr")])
    # E2: Σ_i Z̃_il B_ij = 0, rows (l, j)
    E2 = sp.hstack([sp.csr_matrix((rz * ra, K)), sp.kron(sp.csr_matrix(red.Z.T), sp.identity(ra))])
    E3 = sp.hstack([sp.csr_matrix(b[None, :]), sp.csr_matrix((1, n * ra))])
    A_eq = sp.vstack([E1, E2, E3]).tocsc()
    b_eq = np.zeros(A_eq.shape[0])
    b_eq[-1] = 1.0
    bounds = np.array([(0.0, None) if f else (None, None) for f in ineq] + [(None, None)] * (n * ra),
                      dtype=object)
    res = linprog(np.zeros(A_eq.shape[1]), A_eq=A_eq, b_eq=b_eq, bounds=bounds.tolist(), method="highs")
    if res.status == 2:  # infeasible alternative system: the SVM is feasible
        return None
    if res.status != 0:
        raise RuntimeError(f"HiGHS failed on the feasibility LP: status {res.status} ({res.message})")
    lam = np.where(ineq, np.maximum(res.x[:K], 0.0), res.x[:K])
    out = np.zeros(n * T)
    out[idx] = lam / np.abs(lam).sum()
    return out.reshape(n, T)


def _residual(cs: ConstraintSet, lam: NDArray[np.float64]) -> float:
    return float(np.linalg.norm(cs.adjoint(lam)))


def feasible_constraints(cs: ConstraintSet, *, method: str = "solver", tokens: NDArray[np.int64] | None = None
                         ) -> FeasibilityReport:
    """Feasibility of a general :class:`ConstraintSet` with its certificate (see module doc)."""
    check_choice(method, "method", FEASIBILITY_METHODS)
    if not isinstance(cs, ConstraintSet):
        raise TypeError(f"cs must be a ConstraintSet, got {type(cs).__name__}")
    if method == "solver":
        raw = solve_frobenius(cs)
        if raw.status == "infeasible":
            cert = raw.dual
            return FeasibilityReport(False, cert, _residual(cs, cert), None, None, None, "solver", tokens)
        if raw.status == "optimal" and raw.W is not None:
            m = cs.apply(raw.W)
            ineq = cs.inequality
            mm = float(m[ineq].min()) if ineq.any() else None
            return FeasibilityReport(True, None, None, raw.W, mm, cs.violation(raw.W), "solver", tokens)
        # the solver did not settle it: fall through to the LP
    cert = farkas_lp(cs)
    if cert is not None:
        return FeasibilityReport(False, cert, _residual(cs, cert), None, None, None, "lp", tokens)
    raw = solve_frobenius(cs)
    W = raw.W
    mm = viol = None
    if W is not None:
        m = cs.apply(W)
        mm = float(m[cs.inequality].min()) if cs.inequality.any() else None
        viol = cs.violation(W)
    return FeasibilityReport(True, None, None, W, mm, viol, "lp", tokens)


def feasible(problem: AttentionProblem, tokens: ArrayLike | None = None, *, method: str = "solver"
             ) -> FeasibilityReport:
    """Is ``Att-SVM(α)`` feasible? (SPEC §3). ``tokens=None`` uses the optimal tokens.

    Returns a :class:`FeasibilityReport` carrying a margin certificate W (all margins ≥ 1) when
    feasible, or λ ≥ 0 with ``1ᵀλ = 1`` and ``Σ λ_k a_k z_kᵀ ≈ 0`` when infeasible.
    """
    if not isinstance(problem, AttentionProblem):
        raise TypeError(f"problem must be an AttentionProblem, got {type(problem).__name__}")
    alpha = problem.check_tokens(tokens)
    return feasible_constraints(att_svm_constraints(problem, alpha), method=method, tokens=alpha)
