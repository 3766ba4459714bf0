"""The constraint data every attention-SVM solver consumes (docs/spec.md §3, §5).

All attention SVMs here share one shape: constraints indexed by pairs ``k = (i, t)`` laid out as
(n, T) arrays, each with a feature ``a_it ∈ R^d``, the sequence's query ``z_i ∈ R^d``, a right-hand
side ``b_it`` and a kind (inequality ``a_itᵀ W z_i ≥ b_it`` or equality ``= b_it``); ``mask`` marks
which (i, t) are constraints at all. This covers

* Att-SVM(α): ``a_it = x_{iα_i} − x_it``, ``b = 1``, inequalities, mask ``t ≠ α_i``;
* SVM-eq (docs/spec.md §5): with a reference ``r_i ∈ O_i``, equalities ``b = 0`` for ``t ∈ O_i \\ {r_i}``
  and inequalities ``b = 1`` for ``t ∉ O_i``;
* W_fin (docs/spec.md §5): equalities ``b = log(s_{ir}/s_it)`` for ``t ∈ O_i \\ {r_i}``.

The constraint operator ``𝒜(W)_it = a_itᵀ W z_i`` and its adjoint ``𝒜*(λ) = Σ λ_it a_it z_iᵀ`` are
vectorised (cost O(n·T·d + n·d²)), so matrix-free solvers never form the K × K Gram matrix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from .._rows import pair_differences as _pair_differences
from .._validation import as_float_array
from ..problem import AttentionProblem, check_problem

__all__ = [
    "ConstraintSet",
    "Operator",
    "att_svm_constraints",
    "Subspaces",
    "RawSolution",
    "SolverStatus",
    "FitSettings",
]


# ---------------------------------------------------------------- the one operator implementation
def margins(A: NDArray[np.float64], U: NDArray[np.float64]) -> NDArray[np.float64]:
    """``a_itᵀ u_i`` (n, T) from features A (n, T, r) and per-sequence vectors U (n, r) (``u_i = M z_i``)."""
    return np.matmul(A, U[:, :, None])[:, :, 0]  # batched BLAS: ~1.5× faster than einsum here


def weighted_features(A: NDArray[np.float64], L: NDArray[np.float64]) -> NDArray[np.float64]:
    """``Σ_t λ_it a_it`` (n, r) from features A (n, T, r) and weights L (n, T)."""
    return np.matmul(L[:, None, :], A)[:, 0, :]


class Operator:
    """``𝒜(M)_it = a_itᵀ M z_i`` and ``𝒜*(λ) = Σ λ_it a_it z_iᵀ`` — written once, used by every solver.

    On the (n, T) layout (:meth:`apply`, :meth:`adjoint`, :meth:`apply_factored` for ``M = KQᵀ``)
    and on flat K-vectors over the masked pairs in row-major order (:meth:`apply_flat`,
    :meth:`adjoint_flat`). Cost O(n·T·r_a + n·r_a·r_z) per call; the K × K Gram matrix is formed
    only on request (:meth:`gram`). Rows where ``mask`` is False must have zero features.
    """

    def __init__(self, A: NDArray[np.float64], Z: NDArray[np.float64], mask: NDArray[np.bool_]) -> None:
        self.A = A  # (n, T, r_a)
        self.Z = Z  # (n, r_z)
        self.mask = mask
        self.n, self.T = mask.shape

    @property
    def idx(self) -> NDArray[np.intp]:
        """Flat (row-major) indices of the masked pairs (computed once, on first use)."""
        idx = self.__dict__.get("_idx")
        if idx is None:
            idx = self.__dict__["_idx"] = np.flatnonzero(self.mask.ravel())
        return idx

    @property
    def K(self) -> int:
        return int(self.idx.size)

    def apply(self, M: NDArray[np.float64]) -> NDArray[np.float64]:
        """(n, T) margins of M (r_a, r_z)."""
        return margins(self.A, self.Z @ M.T)

    def apply_factored(self, K: NDArray[np.float64], Q: NDArray[np.float64]) -> NDArray[np.float64]:
        """(n, T) margins of ``M = K Qᵀ`` without forming M."""
        return margins(self.A, (self.Z @ Q) @ K.T)

    def adjoint(self, L: NDArray[np.float64]) -> NDArray[np.float64]:
        """(r_a, r_z) ``Σ λ_it a_it z_iᵀ`` from λ (n, T)."""
        return weighted_features(self.A, L).T @ self.Z

    def to_nt(self, lam: NDArray[np.float64]) -> NDArray[np.float64]:
        out = np.zeros(self.n * self.T)
        out[self.idx] = lam
        return out.reshape(self.n, self.T)

    def apply_flat(self, M: NDArray[np.float64]) -> NDArray[np.float64]:
        return self.apply(M).ravel()[self.idx]

    def adjoint_flat(self, lam: NDArray[np.float64]) -> NDArray[np.float64]:
        return self.adjoint(self.to_nt(lam))

    def _flat_rows(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        return self.A.reshape(-1, self.A.shape[-1])[self.idx], self.Z[self.idx // self.T]

    def gram(self) -> NDArray[np.float64]:
        """``G_kl = (a_kᵀa_l)(z_kᵀz_l)`` (K, K) over the masked pairs."""
        Af, Zf = self._flat_rows()
        G = Af @ Af.T
        G *= Zf @ Zf.T
        return G

    def gram_diag_flat(self) -> NDArray[np.float64]:
        Af, Zf = self._flat_rows()
        return np.einsum("kd,kd->k", Af, Af) * np.einsum("kd,kd->k", Zf, Zf)


@dataclass(frozen=True)
class Subspaces:
    """Orthonormal bases reducing a d × d problem to a small one (docs/spec.md §3, "Structure").

    ``W = U M Vᵀ`` with ``U`` (d, r_a) spanning the constraint features {a_k} and ``V`` (d, r_z)
    spanning the queries {z_i}; ``A`` (n, T, r_a) and ``Z`` (n, r_z) are the reduced data.
    """

    U: NDArray[np.float64]
    V: NDArray[np.float64]
    A: NDArray[np.float64]
    Z: NDArray[np.float64]

    def lift(self, M: NDArray[np.float64]) -> NDArray[np.float64]:
        """``W = U M Vᵀ`` (d, d) from a reduced ``M`` (r_a, r_z)."""
        return self.U @ M @ self.V.T


def _orth(rows: NDArray[np.float64], rtol: float = 1e-12) -> NDArray[np.float64]:
    """Orthonormal basis (d, r) of the row span of ``rows`` (m, d), by SVD at relative ``rtol``."""
    if rows.size == 0:
        return np.zeros((rows.shape[-1], 0))
    _, s, vt = np.linalg.svd(rows, full_matrices=False)
    if s.size == 0 or s[0] == 0:
        return np.zeros((rows.shape[-1], 0))
    r = int((s > rtol * s[0]).sum())
    return vt[:r].T.copy()


def _as_bool(value: Any, name: str, shape: tuple[int, int]) -> NDArray[np.bool_]:
    """``value`` as a boolean array of ``shape`` (bool, or integers 0/1), or an error naming ``name``."""
    arr = np.asarray(value)
    if arr.dtype != bool and not (np.issubdtype(arr.dtype, np.integer) and np.isin(arr, (0, 1)).all()):
        raise TypeError(f"{name} must be a boolean array (or of 0/1 integers), got dtype {arr.dtype}")
    if arr.shape != shape:
        raise ValueError(f"{name} must have shape {shape} (n, T of A), got {arr.shape}")
    return arr.astype(bool, copy=False)


@dataclass(frozen=True)
class ConstraintSet:
    """Linear constraints ``a_itᵀ W z_i (≥ or =) b_it`` in the (n, T) layout (see module doc).

    Attributes
    ----------
    A : (n, T, d) features; rows where ``mask`` is False are ignored (and kept zero).
    Z : (n, d) queries.
    mask : (n, T) bool, True where (i, t) is a constraint.
    rhs : (n, T) right-hand sides ``b_it`` (0 where masked).
    equality : (n, T) bool, True for equality constraints (False where masked).
    """

    A: NDArray[np.float64]
    Z: NDArray[np.float64]
    mask: NDArray[np.bool_]
    # None means "all ones" / "all inequalities"; __post_init__ replaces it with an array
    rhs: NDArray[np.float64] = field(default=None)  # type: ignore[arg-type]  # filled in __post_init__
    equality: NDArray[np.bool_] = field(default=None)  # type: ignore[arg-type]  # filled in __post_init__

    def __post_init__(self) -> None:
        try:
            A = np.asarray(self.A, dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError(f"A must be a real array (n, T, d), got {type(self.A).__name__}") from None
        if A.ndim != 3:
            raise ValueError(f"A must have 3 dimensions, got shape {A.shape}")
        n, T, _ = A.shape
        # Z may have its own width: a restricted set (see :meth:`restrict`) has W of shape (r_a, r_z)
        Z = as_float_array(self.Z, "Z", shape=(n, None))
        mask = _as_bool(self.mask, "mask", (n, T))
        object.__setattr__(self, "Z", Z)
        object.__setattr__(self, "mask", mask)
        # (masked rows are ignored: zeroed before the finiteness check, as rhs there)
        object.__setattr__(self, "A", as_float_array(np.where(mask[..., None], A, 0.0), "A", copy=False))
        rhs = np.ones((n, T)) if self.rhs is None else np.asarray(self.rhs, dtype=np.float64)
        try:
            rhs = np.broadcast_to(rhs, (n, T))
        except ValueError:
            raise ValueError(f"rhs must have shape ({n}, {T}) or broadcast to it, got {rhs.shape}") from None
        object.__setattr__(self, "rhs", as_float_array(np.where(mask, rhs, 0.0), "rhs", copy=False))
        eq = np.zeros((n, T), dtype=bool) if self.equality is None else _as_bool(self.equality, "equality", (n, T))
        object.__setattr__(self, "equality", eq & mask)

    @classmethod
    def _trusted(
        cls,
        A: NDArray[np.float64],
        Z: NDArray[np.float64],
        mask: NDArray[np.bool_],
        rhs: NDArray[np.float64],
        equality: NDArray[np.bool_],
    ) -> ConstraintSet:
        """A set from arrays that already satisfy :meth:`__post_init__`'s invariants (float64 A, Z and
        rhs; bool mask and equality; A, rhs and equality zero/False where masked) — for the reduction,
        whose arrays are built that way, so that tiny solves skip re-masking them."""
        self = object.__new__(cls)
        self.__dict__.update(A=A, Z=Z, mask=mask, rhs=rhs, equality=equality)  # (frozen: no setattr)
        return self

    # ---------------------------------------------------------------- sizes
    @property
    def n(self) -> int:
        return int(self.A.shape[0])

    @property
    def T(self) -> int:
        return int(self.A.shape[1])

    @property
    def d(self) -> int:
        return int(self.A.shape[2])

    @property
    def n_constraints(self) -> int:
        return int(self.mask.sum())

    @property
    def inequality(self) -> NDArray[np.bool_]:
        """(n, T) bool, True for inequality constraints (computed once)."""
        ineq = self.__dict__.get("_inequality")
        if ineq is None:
            ineq = self.mask & ~self.equality
            ineq.flags.writeable = False  # shared by every caller
            object.__setattr__(self, "_inequality", ineq)
        return ineq

    @property
    def has_equality(self) -> bool:
        """Whether any row is an equality (computed once)."""
        he = self.__dict__.get("_has_equality")
        if he is None:
            he = bool(self.equality.any())
            object.__setattr__(self, "_has_equality", he)
        return he

    # ---------------------------------------------------------------- operator and adjoint
    @property
    def operator(self) -> Operator:
        """The :class:`Operator` of these constraints (built once)."""
        op = self.__dict__.get("_operator")
        if op is None:
            op = Operator(self.A, self.Z, self.mask)
            object.__setattr__(self, "_operator", op)
        return op

    def apply(self, W: NDArray[np.float64]) -> NDArray[np.float64]:
        """``𝒜(W)_it = a_itᵀ W z_i`` of shape (n, T) (0 where masked). ``W`` may be (R, d, d)."""
        W = np.asarray(W)
        if W.ndim == 2:
            return self.operator.apply(W)  # (features are zero where masked)
        U = np.einsum("...de,ne->...nd", W, self.Z)  # W z_i, (..., n, d)
        return np.einsum("ntd,...nd->...nt", self.A, U)

    def adjoint(self, lam: NDArray[np.float64]) -> NDArray[np.float64]:
        """``𝒜*(λ) = Σ_it λ_it a_it z_iᵀ`` of shape (d, d). ``lam`` may be (R, n, T) → (R, d, d)."""
        lam = np.asarray(lam)
        if lam.ndim == 2:
            return self.operator.adjoint(lam)  # (features are zero where masked)
        B = np.einsum("...nt,ntd->...nd", lam, self.A)  # Σ_t λ_it a_it, (..., n, d)
        return np.einsum("...nd,ne->...de", B, self.Z)

    def gram_diag(self) -> NDArray[np.float64]:
        """``‖a_it z_iᵀ‖_F² = ‖a_it‖² ‖z_i‖²`` of shape (n, T) (0 where masked)."""
        # (einsum: no (n, T, d) temporary of squares, which costs a large instance more than the sums)
        return np.einsum("ntd,ntd->nt", self.A, self.A) * np.einsum("nd,nd->n", self.Z, self.Z)[:, None] * self.mask

    def hardest_rows(self, k: int) -> NDArray[np.bool_]:
        """(n, T), True on the ``k`` inequality rows per sequence with the largest right-hand side per unit of
        feature, ``b_k/(‖a_k‖‖z_k‖)`` (the first working set of the active-set routes; where a sequence has
        fewer than ``k`` inequality rows, other positions of it are marked too: intersect with the rows wanted)."""
        scale = np.sqrt(self.gram_diag())  # ‖a_k‖‖z_k‖: violations are compared as distances
        hard = np.where(self.inequality, -self.rhs / np.maximum(scale, 1e-300), np.inf)
        first = np.zeros(self.mask.shape, bool)
        order = np.argsort(hard, axis=1, kind="stable")[:, : min(self.mask.shape[1], k)]
        np.put_along_axis(first, order, True, axis=1)
        return first

    @property
    def feature_norms(self) -> NDArray[np.float64]:
        """``‖a_it z_iᵀ‖_F = ‖a_it‖ ‖z_i‖`` of shape (n, T) (0 where masked; computed once, read-only)."""
        fn = self.__dict__.get("_feature_norms")
        if fn is None:
            nz = np.sqrt(np.einsum("nd,nd->n", self.Z, self.Z))
            fn = np.sqrt(np.einsum("ntd,ntd->nt", self.A, self.A)) * nz[:, None]
            fn.flags.writeable = False
            object.__setattr__(self, "_feature_norms", fn)
        return fn

    def gram(self) -> NDArray[np.float64]:
        """Dense Gram matrix ``G_kl = (a_kᵀa_l)(z_kᵀz_l)`` over the K masked pairs (K, K), row-major order.

        Only for small K (it is K² memory); matrix-free solvers use :meth:`apply`/:meth:`adjoint`.
        """
        return self.operator.gram()

    def violation(self, W: NDArray[np.float64]) -> float:
        """Max constraint violation: ``max(b − m)_+`` over inequalities and ``|m − b|`` over equalities."""
        m = self.apply(W)
        ineq = np.where(self.inequality, np.maximum(self.rhs - m, 0.0), 0.0)
        eq = np.where(self.equality, np.abs(m - self.rhs), 0.0)
        return float(max(ineq.max(initial=0.0), eq.max(initial=0.0)))

    # ---------------------------------------------------------------- structure (docs/spec.md §3)
    def subspaces(self, rtol: float = 1e-12) -> Subspaces:
        """Bases of span{a_k} and span{z_i} and the reduced data (see :class:`Subspaces`).

        Projecting W onto them keeps every constraint and cannot raise the Frobenius or nuclear norm,
        so some optimal W has the form ``U M Vᵀ``.
        """
        rows = self.A[self.mask]
        U = _orth(rows, rtol)
        used = self.mask.any(axis=1)
        V = _orth(self.Z[used], rtol)
        return Subspaces(U=U, V=V, A=self.A @ U, Z=self.Z @ V)

    def restrict(self, sub: Subspaces) -> ConstraintSet:
        """The same constraints written for the reduced variable M (r_a, r_z)."""
        # (sub.A = A U is zero on the masked rows, as A is; rhs and equality are already masked)
        return ConstraintSet._trusted(sub.A, sub.Z, self.mask, self.rhs, self.equality)


SolverStatus = str  # one of attsvm.svm.status.Status (a str enum)


@dataclass
class RawSolution:
    """What a solver backend returns; the estimator turns it into a certified result.

    ``W`` (d, d) is the primal solution (None when infeasible); ``dual`` (n, T) the multipliers λ
    (0 where masked; ≥ 0 on inequalities, free on equalities) — for an infeasible instance, the
    certificate of docs/spec.md §3 (λ ≥ 0, 1ᵀλ = 1, 𝒜*(λ) = 0 up to round-off). ``info`` carries
    backend-specific details (solver name, timings, iterations of inner loops).
    """

    W: NDArray[np.float64] | None
    dual: NDArray[np.float64]
    status: SolverStatus
    n_iter: int = 0
    info: dict = field(default_factory=dict)


class FitSettings(NamedTuple):
    """The parameters of a fit that the batched routes (:mod:`.batch`, :mod:`.batch_nuclear`) read, as plain
    values: the norm's name (or object), the rank constraint, the backend, the certificate tolerance, the
    explicit iteration limit (None: the solver's own) and what an infeasible instance does. An object
    with these attributes (an :class:`~attsvm.svm.AttentionSVM`) is read the same way."""

    norm: Any = "fro"
    rank: int | None = None
    backend: str = "auto"
    tol: float = 1e-9
    max_iter: int | None = None
    on_infeasible: str = "status"


def att_svm_constraints(problem: AttentionProblem, tokens: NDArray[np.int64] | None = None) -> ConstraintSet:
    """The constraints of Att-SVM(α) (docs/spec.md §3): ``(x_{iα_i} − x_it)ᵀ W z_i ≥ 1`` for ``t ≠ α_i``."""
    return _att_svm_constraints(problem, check_problem(problem).check_tokens(tokens))


def _att_svm_constraints(problem: AttentionProblem, alpha: NDArray[np.int64]) -> ConstraintSet:
    """:func:`att_svm_constraints` at an already validated selection ``alpha``."""
    A, mask = _pair_differences(problem, alpha)
    # (A is exactly zero at t = α_i, x − x = 0, and on tied tokens: the invariants of ConstraintSet hold)
    return ConstraintSet._trusted(A, problem.queries.copy(), mask, mask.astype(np.float64), np.zeros_like(mask))
