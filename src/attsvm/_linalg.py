"""Small dense linear-algebra helpers shared by every layer (no attsvm imports).

``metrics`` re-exports the public ones; solvers use them directly so that the import flow
problem → tokens → svm / train → metrics stays one-way.

Every spectral quantity is computed from the singular values of ``W / max|W_ij|`` (per matrix), so
that huge norms (GD diverges in norm by design) and tiny ones neither overflow nor underflow: the
scale-free quantities (rank, effective rank, ‖W‖_*/‖W‖_F) never see the scale, and
:func:`singular_values` multiplies it back (inf only where the true singular value exceeds the
float64 range).
"""

from __future__ import annotations

import numbers

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["correlation", "singular_values", "matrix_rank", "effective_rank", "nuc_fro_ratio", "RANK_TOL"]

# Relative tolerance on singular values for the numerical rank (docs/spec.md §6 svm-rank uses 1e-7).
RANK_TOL = 1e-7


def _as_matrices(W: ArrayLike, name: str, *, finite: bool = True) -> NDArray[np.float64]:
    """``W`` as float64 of shape (..., m, k) with m, k ≥ 1 (and finite entries when ``finite``)."""
    try:
        raw = np.asarray(W)
        a = None if np.iscomplexobj(raw) else np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{name} must be a real matrix (m, k) or a stack of matrices (..., m, k), "
            f"got {type(W).__name__} that is not convertible to float64 ({exc})"
        ) from None
    if a is None:  # (a cast to float64 would drop the imaginary parts with only a ComplexWarning)
        raise TypeError(f"{name} must be a real matrix, got complex dtype {raw.dtype}")
    if a.ndim < 2 or 0 in a.shape[-2:]:
        raise ValueError(
            f"{name} must be a matrix (m, k) or a stack of matrices (..., m, k) with m, k >= 1, got shape {a.shape}"
        )
    if finite and not np.isfinite(a).all():
        bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
        raise ValueError(f"{name} must have finite entries, got {bad} NaN/inf entries (shape {a.shape})")
    return a


def _max_abs(a: NDArray[np.float64]) -> NDArray[np.float64]:
    """Per-matrix ``max |a_ij|`` of shape ``a.shape[:-2]``."""
    return np.abs(a).max(axis=(-2, -1))


def _scaled_singular_values(W: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``(σ(W / c), c)`` with ``c = max |W_ij|`` per matrix (1 for a zero matrix): σ(W) = c·σ(W / c)."""
    a = _as_matrices(W, "W")
    c = _max_abs(a)
    c = np.where(c > 0, c, 1.0)
    s = np.asarray(np.linalg.svd(a / c[..., None, None], compute_uv=False), dtype=np.float64)  # (..., min(m, k))
    return s, c


def correlation(A: ArrayLike, B: ArrayLike) -> NDArray[np.float64] | float:
    """``corr(A, B) = ⟨A, B⟩ / (‖A‖_F ‖B‖_F)`` (docs/spec.md §4), batched over leading axes.

    ``A`` and ``B`` broadcast against each other over all but their last two axes, e.g. a
    trajectory (K, d, d) against one W_mm (d, d). A zero matrix has correlation 0 with anything.
    A pair where either matrix has a NaN or inf entry (e.g. a diverged training run) has
    correlation NaN, so that it never passes a threshold such as ``corr ≥ τ``; every other pair is
    finite, whatever the norms (each matrix is scaled by its largest entry first).
    """
    a = _as_matrices(A, "A", finite=False)
    b = _as_matrices(B, "B", finite=False)
    if a.shape[-2:] != b.shape[-2:]:
        raise ValueError(f"A and B must be matrices (or stacks) of the same shape, got {a.shape} and {b.shape}")
    try:
        np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(
            f"A and B must have leading (batch) axes that broadcast, got A of shape {a.shape} and B of shape {b.shape}"
        ) from None
    fa = np.asarray(np.isfinite(a).all(axis=(-2, -1)))  # (...,) per matrix
    fb = np.asarray(np.isfinite(b).all(axis=(-2, -1)))
    a = np.where(fa[..., None, None], a, 0.0)
    b = np.where(fb[..., None, None], b, 0.0)
    # scale first so that huge norms (GD diverges in norm) never overflow
    sa = _max_abs(a)[..., None, None]
    sb = _max_abs(b)[..., None, None]
    a = np.divide(a, sa, out=np.zeros_like(a), where=sa > 0)
    b = np.divide(b, sb, out=np.zeros_like(b), where=sb > 0)
    num = (a * b).sum(axis=(-2, -1))
    den = np.sqrt((a * a).sum(axis=(-2, -1)) * (b * b).sum(axis=(-2, -1)))
    out = np.divide(num, den, out=np.zeros_like(num), where=den > 0)
    out = np.where(fa & fb, out, np.nan)
    return float(out) if out.ndim == 0 else out


def singular_values(W: ArrayLike) -> NDArray[np.float64]:
    """Singular values (descending) of a matrix (m, k) or a stack of matrices (..., m, k).

    ``W`` must have finite entries. Computed as ``c·σ(W / c)`` with ``c = max |W_ij|``, so no
    intermediate overflows or underflows; a value is inf only when the true singular value exceeds
    the float64 range (e.g. ``np.full((3, 3), 1e308)``, σ₁ = 3e308).
    """
    s, c = _scaled_singular_values(W)
    with np.errstate(over="ignore"):
        return s * c[..., None]


def matrix_rank(W: ArrayLike, tol: float = RANK_TOL) -> NDArray[np.int64] | int:
    """Number of singular values above ``tol · σ_max`` (relative tolerance; 0 for a zero matrix).

    ``tol`` is a finite real in [0, 1) (a Python or NumPy scalar, or a 0-d array). Scale-free: computed
    from the singular values of ``W / max|W_ij|``.
    """
    if isinstance(tol, np.ndarray) and tol.ndim == 0 and tol.dtype.kind in "iuf":
        tol = tol[()]  # a 0-d array (np.array(1e-9)): its NumPy scalar
    if isinstance(tol, (bool, np.bool_)) or not isinstance(tol, numbers.Real):
        shape = f" of shape {tol.shape}" if isinstance(tol, np.ndarray) else ""
        raise TypeError(
            f"tol must be a real number in [0, 1) (a scalar relative tolerance), got {type(tol).__name__}{shape}"
        )
    if not (np.isfinite(tol) and 0 <= tol < 1):
        raise ValueError(f"tol must be a finite real in [0, 1) (a relative tolerance), got {tol!r}")
    s, _ = _scaled_singular_values(W)
    top = s[..., :1]
    r = (s > tol * top).sum(axis=-1) * (top[..., 0] > 0)
    return int(r) if np.ndim(r) == 0 else r.astype(np.int64)


def effective_rank(W: ArrayLike) -> NDArray[np.float64] | float:
    """Effective rank exp(H(p)), p = σ/Σσ (Roy & Vetterli, 2007); 0 for a zero matrix. Scale-free."""
    s, _ = _scaled_singular_values(W)
    tot = s.sum(axis=-1, keepdims=True)
    p = np.divide(s, tot, out=np.zeros_like(s), where=tot > 0)
    h = -(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)).sum(axis=-1)
    out = np.where(tot[..., 0] > 0, np.exp(h), 0.0)
    return float(out) if out.ndim == 0 else out


def nuc_fro_ratio(W: ArrayLike) -> NDArray[np.float64] | float:
    """‖W‖_* / ‖W‖_F ∈ [1, √rank]: 1 for rank one, √r for r equal singular values; 0 for a zero matrix.

    Scale-free: computed from the singular values of ``W / max|W_ij|``.
    """
    s, _ = _scaled_singular_values(W)
    fro = np.sqrt((s**2).sum(axis=-1))
    out = np.divide(s.sum(axis=-1), fro, out=np.zeros_like(fro), where=fro > 0)
    return float(out) if out.ndim == 0 else out
