"""The graph-SVM of next-token prediction and the ``W ≈ R·W_svm + W_fin`` decomposition
(docs/spec.md §8, "Next-token graph-SVM"; Li, Huang, Ildiz, Rawat, Oymak, AISTATS 2024).

For every last token k with token-priority graph ``G^(k)`` (:class:`attsvm.ntp.TokenPriorityGraph`)::

    W_svm = argmin ‖W‖  s.t.  (e_y − e_j)ᵀ W e_k = 0   for each edge y → j inside one SCC,
                              (e_y − e_j)ᵀ W e_k ≥ 1   for each edge y → j into a lower SCC.

Edges are enough: an equality between any two tokens of one SCC and an inequality between any
y and a token j it reaches in a lower SCC are sums of edge rows. The rows are laid out as a
:class:`~attsvm.svm._base.ConstraintSet` with one "sequence" per last token k (query ``z = e_k``,
features ``a = e_y − e_j``), so the one reduction, the certified Frobenius / nuclear solvers and the
one certificate module of :mod:`attsvm.svm` solve it unchanged; an infeasible graph-SVM (possible
when the embeddings are linearly dependent) comes back with status "infeasible" and its verified
Farkas certificate.

**The finite component.** ``S_fin = span{(e_y − e_j) e_kᵀ : y, j in one SCC of G^(k)}`` is the span of
the equality rows; ``W_svm ⊥ S_fin`` by its equality constraints. The paper's theorem writes the GD
iterate as ``W(t) = R(t)·W_svm + W_fin + o(1)`` with ``W_fin ∈ S_fin`` finite, the minimiser over
``S_fin`` of the loss on the *reduced* sequences (tokens outside the label's SCC removed) — computed by
:func:`attsvm.training.ntp.ntp_w_fin`. Here :func:`fin_basis` gives an orthonormal basis of ``S_fin``,
:func:`project_fin` the orthogonal projection ``Π_fin``, and :func:`ntp_decomposition` measures a
trained W against both components.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._linalg import correlation
from .._validation import as_float_array, check_choice, check_finite_scalar
from ..ntp import NextTokenProblem, TokenPriorityGraph
from ._base import ConstraintSet, _orth

__all__ = [
    "GraphSVMConstraints",
    "graph_svm_constraints",
    "graph_svm",
    "fin_basis",
    "project_fin",
    "NTPDecomposition",
    "ntp_decomposition",
]


@dataclass(frozen=True)
class GraphSVMConstraints:
    """The graph-SVM rows as a :class:`ConstraintSet` (module doc) and what each row is.

    Attributes
    ----------
    constraints : ConstraintSet with G groups (one per last token) of up to R rows each.
    last_tokens : (G,) the last token k of each group (its query is ``e_k``).
    pairs : (G, R, 2) the edge ``(y, j)`` of each row (−1 on padding).
    graphs : ``{k: G^(k)}``.
    """

    constraints: ConstraintSet
    last_tokens: NDArray[np.int64]
    pairs: NDArray[np.int64]
    graphs: dict[int, TokenPriorityGraph]

    @property
    def equality(self) -> NDArray[np.bool_]:
        return self.constraints.equality

    @property
    def n_equality(self) -> int:
        return int(self.constraints.equality.sum())

    @property
    def n_inequality(self) -> int:
        return int(self.constraints.inequality.sum())


def _graph_rows(g: TokenPriorityGraph) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    """Deduplicated rows ``(y, j)`` of one graph and their kind (equality inside an SCC)."""
    e = g.edges()
    same = g.scc[e[:, 0]] == g.scc[e[:, 1]]
    eq = np.sort(e[same], axis=1)  # y → j and j → y give one equality row
    eq = np.unique(eq, axis=0) if eq.size else eq.reshape(0, 2)
    ineq = e[~same]
    return np.concatenate([eq, ineq]), np.r_[np.ones(len(eq), bool), np.zeros(len(ineq), bool)]


def graph_svm_constraints(problem: NextTokenProblem) -> GraphSVMConstraints:
    """The graph-SVM's constraint rows (module doc). Raises ValueError naming ``problem`` when the
    token-priority graphs have no edge at all (every sequence holds its label only), since then
    there is no SCC structure and no constraint."""
    if not isinstance(problem, NextTokenProblem):
        raise TypeError(f"problem must be a NextTokenProblem, got {type(problem).__name__}")
    graphs = problem.graphs()
    ks = np.asarray(sorted(graphs), dtype=np.int64)
    per = [_graph_rows(graphs[int(k)]) for k in ks]
    R = max(len(p) for p, _ in per)
    if R == 0:
        raise ValueError(
            "problem: the token-priority graphs have no edges (every sequence consists of its label only), "
            "so there is no SCC structure and the graph-SVM has no constraint"
        )
    G, d = ks.size, problem.d
    E = problem.E
    pairs = np.full((G, R, 2), -1, dtype=np.int64)
    eq = np.zeros((G, R), dtype=bool)
    mask = np.zeros((G, R), dtype=bool)
    for g, (p, kind) in enumerate(per):
        pairs[g, : len(p)] = p
        eq[g, : len(p)] = kind
        mask[g, : len(p)] = True
    A = np.where(mask[..., None], E[np.maximum(pairs[..., 0], 0)] - E[np.maximum(pairs[..., 1], 0)], 0.0)
    cs = ConstraintSet(A, E[ks].copy(), mask, np.where(eq, 0.0, 1.0), eq)
    assert A.shape == (G, R, d)
    return GraphSVMConstraints(constraints=cs, last_tokens=ks, pairs=pairs, graphs=graphs)


def graph_svm(
    problem: NextTokenProblem | GraphSVMConstraints,
    *,
    norm: Literal["fro", "nuc"] = "fro",
    backend: Literal["auto", "cvxpy"] = "auto",
    tol: float = 1e-9,
):  # -> AttentionSVM
    """Solve the graph-SVM (module doc) with the certified solvers of :class:`~attsvm.svm.AttentionSVM`.

    Returns the fitted estimator: ``W_`` (d, d), ``status_`` ("optimal" with a checked certificate,
    or "infeasible" with ``certificate_`` a verified Farkas λ on the rows of
    :func:`graph_svm_constraints`), ``dual_coef_``, ``max_violation_``, ``relative_gap_`` …
    """
    from .estimator import AttentionSVM

    check_choice(norm, "norm", ("fro", "nuc"))
    gc = problem if isinstance(problem, GraphSVMConstraints) else graph_svm_constraints(problem)
    return AttentionSVM(norm, backend=backend, tol=tol).fit_constraints(gc.constraints)


def fin_basis(problem: NextTokenProblem | GraphSVMConstraints, rtol: float = 1e-10) -> NDArray[np.float64]:
    """An orthonormal basis (m, d, d) of ``S_fin`` (module doc), m = 0 when no SCC has two tokens."""
    rtol = check_finite_scalar(rtol, "rtol")
    if not 0.0 <= rtol < 1.0:
        raise ValueError(f"rtol must be in [0, 1) (relative to the largest singular value), got {rtol}")
    gc = problem if isinstance(problem, GraphSVMConstraints) else graph_svm_constraints(problem)
    cs = gc.constraints
    d = cs.d
    rows = cs.A[cs.equality]  # (m0, d)
    zs = cs.Z[np.nonzero(cs.equality)[0]]  # (m0, d)
    mats = np.einsum("ma,mb->mab", rows, zs).reshape(len(rows), d * d)
    Q = _orth(mats, rtol)  # (d², m)
    return np.ascontiguousarray(Q.T.reshape(-1, d, d))


def project_fin(W: ArrayLike, basis: ArrayLike) -> NDArray[np.float64]:
    """``Π_fin(W)``: the orthogonal projection of W (…, d, d) onto the span of ``basis`` (m, d, d)."""
    Wm = as_float_array(W, "W")
    B = as_float_array(basis, "basis", ndim=3)
    if Wm.shape[-2:] != B.shape[1:]:
        raise ValueError(f"W (…, d, d) and basis (m, d, d) disagree: {Wm.shape} vs {B.shape}")
    c = np.einsum("...ij,mij->...m", Wm, B)
    return np.einsum("...m,mij->...ij", c, B)


@dataclass(frozen=True)
class NTPDecomposition:
    """A trained W (or a stack) against ``R·W_svm + W_fin`` (module doc); each field has W's leading shape.

    scale : R = ⟨W − Π_fin W, W_svm⟩ / ‖W_svm‖².
    corr_svm : corr(W, W_svm).
    corr_perp : corr(W − Π_fin W, W_svm) (the directional part alone).
    fin_distance : ‖Π_fin W − W_fin‖_F.
    fin_norm : ‖Π_fin W‖_F.
    residual : ‖W − R·W_svm − W_fin‖_F / ‖W‖_F.
    """

    scale: NDArray[np.float64]
    corr_svm: NDArray[np.float64]
    corr_perp: NDArray[np.float64]
    fin_distance: NDArray[np.float64]
    fin_norm: NDArray[np.float64]
    residual: NDArray[np.float64]


def ntp_decomposition(
    W: ArrayLike, W_svm: ArrayLike, basis: ArrayLike, W_fin: ArrayLike | None = None
) -> NTPDecomposition:
    """Measure W (…, d, d) against ``R·W_svm + W_fin`` with ``W_fin ∈ S_fin`` (span of ``basis``)."""
    Wm = as_float_array(W, "W")
    S = as_float_array(W_svm, "W_svm", ndim=2)
    F = np.zeros_like(S) if W_fin is None else as_float_array(W_fin, "W_fin", shape=S.shape)
    ss = float(np.sum(S * S))
    if ss == 0:
        raise ValueError("W_svm must be non-zero to fit a scale (got the zero matrix: every edge lies inside an SCC)")
    P = project_fin(Wm, basis)
    D = Wm - P
    R = np.einsum("...ij,ij->...", D, S) / ss
    nW = np.linalg.norm(Wm, axis=(-2, -1))
    res = np.linalg.norm(Wm - R[..., None, None] * S - F, axis=(-2, -1))
    return NTPDecomposition(
        scale=np.asarray(R),
        corr_svm=np.asarray(correlation(Wm, S)),
        corr_perp=np.asarray(correlation(D, S)),
        fin_distance=np.linalg.norm(P - F, axis=(-2, -1)),
        fin_norm=np.linalg.norm(P, axis=(-2, -1)),
        residual=np.divide(res, nW, out=np.full_like(res, np.inf), where=nW > 0),
    )
