"""The one reduction every solver goes through: ``ConstraintSet → reduced problem + lift``.

A solver never sees the user's units. :func:`reduce` rewrites ``min ‖W‖ s.t. a_kᵀ W z_k (≥ | =) b_k``
(docs/spec.md §3) as an equivalent, well-scaled problem in three exact steps, and
:meth:`Reduction.lift_W` / :meth:`Reduction.lift_dual` undo them:

1. **Row normalisation.** Row k is divided by ``s_k = ‖a_k‖‖z_k‖``: ``â_k = a_k/‖a_k‖``,
   ``ẑ_i = z_i/‖z_i‖``, ``b̂_k = b_k/s_k``. The feasible set is unchanged, so results do not
   depend on the units of X or Z, globally or per sequence. Rows whose feature vanishes (a
   duplicate token, a zero query; tested *per sequence*, relative to that sequence's own
   features) are set aside in :attr:`Reduction.zero`: they read ``0 (≥ | =) b_k``.
2. **Subspaces** (docs/spec.md §3 "Structure"): ``W = U M Vᵀ`` with U spanning {â_k} and V
   spanning {ẑ_i}; computed on the normalised rows when the row norms spread over more than
   ``SPREAD_MAX``, so a sequence with tiny tokens keeps its directions.
3. **Global scale.** ``b̂`` is divided by ``g``, the power of two with the (upper) median ``|b̂_k|/g ∈ (½, 1]``
   (exact in floating point), so the right-hand sides are O(1) and the solvers' absolute
   thresholds mean the same thing on every instance.

Before any of this, :func:`prescale` brings data far from unit scale (``max|a|`` or ``max|z|`` beyond
``2^±PRESCALE_EXP``) to it by powers of two, which is exact: a squared row norm, a Gram entry or
``‖W‖²`` would otherwise overflow or underflow float64 (beyond about ``2^±511``) and the row would
"vanish" (``AttentionSVM._fit`` solves and certifies the prescaled set, then undoes it).

Lifting: ``W = g · U M Vᵀ``. For a solver of ``min φ(W)`` with φ positively homogeneous of degree
``p`` (``p = 1`` for a norm, ``p = 2`` for ``½‖W‖_F²``), stationarity ``𝒜*(λ) ∈ ∂φ(W)`` gives
``λ_k = g^{p−1} · λ̂_k / s_k``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from ._base import ConstraintSet, Subspaces, _orth

__all__ = [
    "Reduction",
    "reduce",
    "prescale",
    "PRESCALE_EXP",
    "DenseReduction",
    "reduce_dense",
    "reduce_stack",
    "StackReduction",
    "pow2_many",
    "ZERO_ROW_RTOL",
    "SPREAD_MAX",
]

# A feature a_k is zero when ‖a_k‖ ≤ ZERO_ROW_RTOL · max_t ‖a_it‖ of its own sequence (duplicate
# tokens leave round-off of this order); a query is zero when it is exactly zero.
ZERO_ROW_RTOL = 1e-13
# The message of the solvers' "error" status when a row vanished here (its norm is 0 or over/underflows in
# float64) although its entries are not zero, so that no Farkas λ on it verifies
VANISHED_ROW_MESSAGE = (
    "a constraint row vanished (its norm is 0 or overflows in float64: rescale X or Z) "
    "and no infeasibility certificate verifies"
)
# prescale leaves data alone while max|a| and max|z| lie in [2^−PRESCALE_EXP, 2^PRESCALE_EXP]: there, no
# square or product of the certificate or the solvers comes near float64's range (2^±1022)
PRESCALE_EXP = 64
# Step 2 takes its bases from the user's rows while ‖a_k‖ (and ‖z_i‖) vary by at most this factor,
# else from the normalised rows.
SPREAD_MAX = 1e6


@dataclass(frozen=True)
class Reduction:
    """An instance in solver units and the maps back (see module doc).

    Attributes
    ----------
    original : the user's :class:`ConstraintSet`.
    problem : the reduced, normalised :class:`ConstraintSet` (features (n, T, r_a), queries (n, r_z)),
        with the zero rows masked out.
    sub : the bases U (d, r_a), V (d, r_z) of step 2.
    row_scale : (n, T) ``s_k = ‖a_k‖‖z_k‖`` (1 where masked or zero).
    global_scale : ``g``.
    zero : (n, T) bool, constraint rows whose feature vanishes.
    identity_sub : True when step 2 was skipped (U = V = I), so that lifting skips the products.
    """

    original: ConstraintSet
    problem: ConstraintSet
    sub: Subspaces
    row_scale: NDArray[np.float64]
    global_scale: float
    zero: NDArray[np.bool_]
    identity_sub: bool = False

    @property
    def unattainable(self) -> NDArray[np.bool_]:
        """Zero rows that no W satisfies: ``0 ≥ b > 0`` or ``0 = b ≠ 0``."""
        cs = self.original
        return self.zero & ((cs.inequality & (cs.rhs > 0)) | (cs.equality & (cs.rhs != 0)))

    def zero_row_farkas(self) -> NDArray[np.float64]:
        """The Farkas candidate of the unattainable zero rows (call it when :attr:`unattainable` has one): λ on
        those rows with the sign of their right-hand side, summing to 1 in absolute value (the estimator
        verifies it like any certificate)."""
        lam = np.where(self.unattainable, np.sign(self.original.rhs), 0.0)
        return lam / np.abs(lam).sum()

    def lift_W(self, M: NDArray[np.float64]) -> NDArray[np.float64]:
        """``W = g · U M Vᵀ`` (d, d) from a reduced solution M (r_a, r_z)."""
        return self.global_scale * (M if self.identity_sub else self.sub.lift(M))

    def reduce_W(self, W: NDArray[np.float64]) -> NDArray[np.float64]:
        """The inverse of :meth:`lift_W` on its range: ``M = Uᵀ W V / g``."""
        return self.sub.U.T @ W @ self.sub.V / self.global_scale

    def lift_dual(self, lam: NDArray[np.float64], degree: int = 1) -> NDArray[np.float64]:
        """Multipliers of the original rows from those of the reduced rows (module doc)."""
        return np.where(self.problem.mask, lam * self.global_scale ** (degree - 1) / self.row_scale, 0.0)

    def reduce_dual(self, lam: NDArray[np.float64], degree: int = 1) -> NDArray[np.float64]:
        """The inverse of :meth:`lift_dual`."""
        return np.where(self.problem.mask, lam * self.row_scale / self.global_scale ** (degree - 1), 0.0)

    def lift_farkas(self, lam: NDArray[np.float64]) -> NDArray[np.float64]:
        """A Farkas direction of the reduced rows → one of the original rows (any positive scale)."""
        return np.where(self.problem.mask, lam / self.row_scale, 0.0)


def _pow2(x: float) -> float:
    """The power of two ``g`` with ``x/g ∈ (1/2, 1]`` (1 for the unit-norm data of most instances)."""
    if not (x > 0 and math.isfinite(x)):
        return 1.0
    m, e = math.frexp(x)  # x = m·2^e exactly, m ∈ [½, 1)
    return math.ldexp(1.0, e - 1 if m == 0.5 else e)


def prescale(cs: ConstraintSet) -> tuple[ConstraintSet, float] | None:
    """``(cs', κ)`` with cs' the rows ``a_k·c_a`` and queries ``z_i·c_z`` of ``cs`` for the powers of two
    ``c_a ≈ 1/max|a|`` and ``c_z ≈ 1/max|z|`` (exact scalings), where either maximum lies beyond
    ``2^±PRESCALE_EXP``; None where both lie within (the usual case: nothing changes).

    The right-hand sides stay, and ``a'ᵀW z' = c_a c_z · aᵀW z``: W' solves cs' exactly when
    ``W = κ W'`` solves cs, with ``κ = c_a c_z`` (the factor returned). The margins, violations, support
    and relative measures of W' on cs' are those of W on cs; the multipliers, the gap and the
    complementarity scale by ``κ^degree`` of the solver objective (stationarity ``𝒜*(λ) ∈ ∂φ(W)``,
    docs/spec.md §3); a Farkas certificate (normalised, ``Σ|λ| = 1``) does not change."""
    am = float(np.abs(cs.A).max(initial=0.0))
    zm = float(np.abs(cs.Z).max(initial=0.0))
    lo, hi = 2.0**-PRESCALE_EXP, 2.0**PRESCALE_EXP
    if not (am > 0 and zm > 0 and math.isfinite(am) and math.isfinite(zm)):
        return None  # (nothing to scale, or data the checks refuse)
    if lo <= am <= hi and lo <= zm <= hi:
        return None
    ca, cz = 1.0 / _pow2(am), 1.0 / _pow2(zm)
    scaled = ConstraintSet._trusted(cs.A * ca, cs.Z * cz, cs.mask, cs.rhs, cs.equality)
    return scaled, ca * cz


def reduce(cs: ConstraintSet, *, subspace: bool = True, rtol: float = 1e-12) -> Reduction:
    """Reduce ``cs`` to solver units (module doc). ``subspace=False`` skips step 2 (U = V = I)."""
    if not isinstance(cs, ConstraintSet):
        raise TypeError(f"cs must be a ConstraintSet, got {type(cs).__name__}")
    n, T, d = cs.A.shape
    # (einsum: one pass and no temporaries; these few vectorised steps are most of a tiny solve's overhead)
    na = np.sqrt(np.einsum("ntd,ntd->nt", cs.A, cs.A))  # (n, T), 0 where masked
    nz = np.sqrt(np.einsum("nd,nd->n", cs.Z, cs.Z))  # (n,)
    seq_scale = na.max(axis=1, initial=0.0)  # (n,) (masked rows have na = 0)
    # (na = 0 is caught by the relative test, as seq_scale ≥ 0)
    zero = cs.mask & (na <= ZERO_ROW_RTOL * seq_scale[:, None])
    if "_feature_norms" not in cs.__dict__:  # the certificate's row scale: the same numbers, computed once
        fn = na * nz[:, None]
        fn.flags.writeable = False
        object.__setattr__(cs, "_feature_norms", fn)
    zero_z = nz == 0
    if zero_z.any():
        zero |= cs.mask & zero_z[:, None]
        nz = np.where(zero_z, 1.0, nz)
    has_zero = bool(zero.any())
    if has_zero:
        mask = cs.mask & ~zero
        sa = np.where(mask, na, 1.0)
        A = cs.A / sa[..., None]
        A[zero] = 0.0  # (masked rows are already zero)
    else:  # the usual case: na is exactly 0 on the masked rows (their features are zero)
        mask = cs.mask
        sa = na + ~mask
        A = cs.A / sa[..., None]
    Z = cs.Z / nz[:, None]
    s = sa * nz[:, None]
    b = cs.rhs / s  # (rhs is 0 on the masked rows)
    if has_zero:
        b[zero] = 0.0
    nzb = np.abs(b[b != 0])
    g = _pow2(float(np.partition(nzb, nzb.size // 2)[nzb.size // 2])) if nzb.size else 1.0  # (upper) median
    if g != 1.0:
        b /= g
    # (A, rhs and equality are zero/False off the mask by construction)
    norm = ConstraintSet._trusted(A, Z, mask, b, cs.equality & mask if has_zero else cs.equality)
    if subspace:
        # bases from the user's rows when their norms are within SPREAD_MAX of each other (the same
        # bases, up to round-off, under any global change of units), else from the normalised rows,
        # so that a sequence with tiny tokens keeps its directions
        def spread(v: NDArray[np.float64]) -> float:
            return float(v.max() / v.min()) if v.size and v.min() > 0 else np.inf

        rows = cs.A[mask] if spread(na[mask]) <= SPREAD_MAX else A[mask]
        used = mask.any(axis=1)
        zs = cs.Z[used] if spread(nz[used]) <= SPREAD_MAX else Z[used]
        U, V = _orth(rows, rtol), _orth(zs, rtol)
        sub = Subspaces(U=U, V=V, A=A @ U, Z=Z @ V)
        problem = norm.restrict(sub)
    else:
        sub = Subspaces(U=np.eye(d), V=np.eye(Z.shape[1]), A=A, Z=Z)
        problem = norm
    return Reduction(
        original=cs, problem=problem, sub=sub, row_scale=s, global_scale=g, zero=zero, identity_sub=not subspace
    )


class DenseReduction:
    """Steps 1 and 3 of :func:`reduce` for solvers of the dense dual ``min ½λᵀGλ − bᵀλ`` (λ_I ≥ 0)
    of ``min ½‖W‖_F²``: the same normalised instance written as the K × K Gram matrix ``Ĝ`` of
    the unit rows ``â_k ẑ_kᵀ`` and ``b̂`` (module doc), without building a reduced constraint set.
    ``Ĝ_kl = G_kl / (s_k s_l)`` from the Gram matrix G of the user's rows, whose diagonal is
    ``s_k² = ‖a_k‖²‖z_k‖²``.

    Attributes
    ----------
    G : (K, K) ``Ĝ``.  b : (K,) ``b̂``.  ineq : (K,) bool.
    idx : (K,) flat (row-major) indices of the rows in the (n, T) layout.
    A, Z : (K, d), (K, d_z) the user's rows a_k and z_k.  row_scale : (K,) ``s_k``.
    global_scale : ``g``.  shape : (n, T).
    """

    __slots__ = ("A", "G", "Z", "b", "global_scale", "idx", "ineq", "row_scale", "shape")

    def __init__(
        self,
        G: NDArray[np.float64],
        b: NDArray[np.float64],
        ineq: NDArray[np.bool_],
        idx: NDArray[np.intp],
        A: NDArray[np.float64],
        Z: NDArray[np.float64],
        row_scale: NDArray[np.float64],
        global_scale: float,
        shape: tuple[int, int],
    ) -> None:
        self.G, self.b, self.ineq, self.idx, self.A, self.Z = G, b, ineq, idx, A, Z
        self.row_scale, self.global_scale, self.shape = row_scale, global_scale, shape

    def lift_dual(self, lam_hat: NDArray[np.float64], degree: int = 2) -> NDArray[np.float64]:
        """Flat multipliers (K,) of the original rows, ``λ_k = g^{p−1} λ̂_k / s_k`` (module doc)."""
        return lam_hat * (self.global_scale ** (degree - 1)) / self.row_scale

    def to_nt(self, lam: NDArray[np.float64]) -> NDArray[np.float64]:
        """Flat (K,) → the (n, T) layout (0 off the rows)."""
        out = np.zeros(self.shape[0] * self.shape[1])
        out[self.idx] = lam
        return out.reshape(self.shape)

    def adjoint(self, lam: NDArray[np.float64]) -> NDArray[np.float64]:
        """``𝒜*(λ) = Σ_k λ_k a_k z_kᵀ`` (d, d_z) of flat multipliers of the original rows; with
        ``λ = lift_dual(λ̂)`` this is the lifted primal point ``W = g · Σ_k λ̂_k â_k ẑ_kᵀ``."""
        return (self.A.T * lam) @ self.Z


class StackReduction(NamedTuple):
    """:func:`reduce_stack` of B instances of K rows each (arrays over the stack).

    G : (B, K, K) ``Ĝ``.  b : (B, K) ``b̂``.  row_scale : (B, K) ``s_k``.  global_scale : (B,) ``g``.
    ok : (B,) False where some row may have a vanishing feature (``s_k ≤ ZERO_ROW_RTOL · max_l s_l``): such an
    instance needs :func:`reduce` (its ``s`` are replaced by 1 here so that nothing divides by 0; its G and b̂
    are not to be used).
    """

    G: NDArray[np.float64]
    b: NDArray[np.float64]
    row_scale: NDArray[np.float64]
    global_scale: NDArray[np.float64]
    ok: NDArray[np.bool_]


def pow2_many(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """Elementwise :func:`_pow2`: the power of two g with x/g ∈ (½, 1] (1 where x is 0)."""
    m, e = np.frexp(x)
    return np.ldexp(1.0, np.where(m == 0.5, e - 1, e))


def _stack_arrays(Af: Any, Zf: Any, b: Any) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """:func:`reduce_stack`'s arrays as float64, or the one-line error naming the first that does not fit."""
    Af, Zf, b = (np.asarray(v, dtype=np.float64) for v in (Af, Zf, b))
    if Af.ndim != 3:
        raise ValueError(f"Af must be a (B, K, d) array of rows, got shape {Af.shape}")
    if Zf.ndim != 3 or Zf.shape[:2] != Af.shape[:2]:
        raise ValueError(f"Zf must be a (B, K, d_z) array with Af's B and K = {Af.shape[:2]}, got shape {Zf.shape}")
    if b.shape != Af.shape[:2]:
        raise ValueError(f"b must have shape (B, K) = {Af.shape[:2]}, got {b.shape}")
    for name, v in (("Af", Af), ("Zf", Zf), ("b", b)):
        if not np.isfinite(v).all():
            raise ValueError(f"{name} must be finite")
    return Af, Zf, b


def reduce_stack(
    Af: NDArray[np.float64], Zf: NDArray[np.float64], b: NDArray[np.float64], *, by_rows: bool | None = None
) -> StackReduction:
    """Steps 1 and 3 of :func:`reduce` for B dense duals at once (``min ½λᵀĜλ − b̂ᵀλ`` of ``min ½‖W‖_F²``): the
    Gram matrix ``Ĝ_kl = G_kl / (s_k s_l)`` of the unit rows ``â_k ẑ_kᵀ``, ``b̂ = b / (s g)`` with ``s_k =
    ‖a_k‖‖z_k‖`` and g the power of two at the (upper) median of the nonzero ``|b_k|/s_k``. Af (B, K, d) and
    Zf (B, K, d_z): the rows a_k and the query z_k of each row; b (B, K) their right-hand sides.

    ``by_rows``: normalise the K rows before the product (O(K·d) scaling) instead of scaling the K × K Gram
    matrix (O(K²)); None chooses by size (rows when K > d + d_z). The two agree to round-off.
    :func:`reduce_dense` is the case B = 1; the NumPy route of :mod:`attsvm.svm.batch` takes the Gram scaling."""
    Af, Zf, b = _stack_arrays(Af, Zf, b)
    B, K, _ = Af.shape
    if by_rows is None:
        by_rows = K > Af.shape[2] + Zf.shape[2]
    if by_rows:
        na = np.sqrt(np.einsum("bkd,bkd->bk", Af, Af))
        nz = np.sqrt(np.einsum("bkd,bkd->bk", Zf, Zf))
        s = na * nz
    else:
        G = Af @ Af.transpose(0, 2, 1)
        G *= Zf @ Zf.transpose(0, 2, 1)
        s = np.sqrt(np.einsum("bkk->bk", G))  # ‖a_k‖‖z_k‖
    ok = s.min(axis=1, initial=np.inf) > ZERO_ROW_RTOL * s.max(axis=1, initial=0.0)
    if not ok.all():
        s = np.where(ok[:, None], s, 1.0)
        if by_rows:
            na, nz = np.where(ok[:, None], na, 1.0), np.where(ok[:, None], nz, 1.0)
    if by_rows:
        An = Af / na[:, :, None]
        Zn = Zf / nz[:, :, None]
        G = An @ An.transpose(0, 2, 1)
        G *= Zn @ Zn.transpose(0, 2, 1)
    else:
        G /= s[:, None, :]
        G /= s[:, :, None]
    bh = b / s
    mag = np.abs(bh)
    nonzero = mag != 0
    if nonzero.all():
        med = np.partition(mag, K // 2, axis=1)[:, K // 2] if K else np.zeros(B)
    else:  # (the upper median of each instance's nonzero entries)
        count = nonzero.sum(axis=1)
        ordered = np.sort(np.where(nonzero, mag, np.inf), axis=1)
        med = np.take_along_axis(ordered, np.minimum(count // 2, max(K - 1, 0))[:, None], axis=1)[:, 0]
        med = np.where(count > 0, med, 0.0)
    g = pow2_many(np.where(np.isfinite(med), med, 0.0))
    bh /= g[:, None]
    return StackReduction(G, bh, s, g, ok)


def reduce_dense(cs: ConstraintSet, max_rows: int = 300) -> DenseReduction | None:
    """:class:`DenseReduction` of ``cs``, or None when some row may have a vanishing feature
    (``s_k ≤ ZERO_ROW_RTOL · max_l s_l``, which every zero row of :func:`reduce` satisfies) or there are
    no rows or more than ``max_rows`` (G is K × K): :func:`reduce` handles those. The case B = 1 of
    :func:`reduce_stack`; its ``Ĝ``, ``b̂`` and ``g`` are those of ``reduce(cs, subspace=False)`` up to
    round-off."""
    n, T, d = cs.A.shape
    idx = np.flatnonzero(cs.mask.ravel())
    if idx.size == 0 or idx.size > max_rows:
        return None
    Af = cs.A.reshape(-1, d)[idx]
    Zf = cs.Z[idx // T]
    red = reduce_stack(Af[None], Zf[None], cs.rhs.ravel()[idx][None])
    if not red.ok[0]:
        return None
    g = float(red.global_scale[0])
    return DenseReduction(red.G[0], red.b[0], ~cs.equality.ravel()[idx], idx, Af, Zf, red.row_scale[0], g, (n, T))
