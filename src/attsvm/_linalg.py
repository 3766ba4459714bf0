"""Small dense linear-algebra helpers shared by every layer (no attsvm imports).

``metrics`` re-exports the public ones; solvers use them directly so that the import flow
problem → tokens → svm / train → metrics stays one-way.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["correlation", "singular_values", "matrix_rank", "effective_rank", "nuc_fro_ratio", "RANK_TOL"]

# Relative tolerance on singular values for the numerical rank (docs/spec.md §6 svm-rank uses 1e-7).
RANK_TOL = 1e-7


def correlation(A: ArrayLike, B: ArrayLike) -> NDArray[np.float64] | float:
    """``corr(A, B) = ⟨A, B⟩ / (‖A‖_F ‖B‖_F)`` (docs/spec.md §4), batched over leading axes.

    ``A`` and ``B`` broadcast against each other over all but their last two axes, e.g. a
    trajectory (K, d, d) against one W_mm (d, d). A zero matrix has correlation 0 with anything.
    """
    a = np.asarray(A, dtype=np.float64)
    b = np.asarray(B, dtype=np.float64)
    if a.ndim < 2 or b.ndim < 2 or a.shape[-2:] != b.shape[-2:]:
        raise ValueError(f"A and B must be matrices (or stacks) of the same shape, got {a.shape} and {b.shape}")
    # scale first so that huge norms (GD diverges in norm) never overflow
    sa = np.abs(a).max(axis=(-2, -1), keepdims=True)
    sb = np.abs(b).max(axis=(-2, -1), keepdims=True)
    a = np.divide(a, sa, out=np.zeros_like(a), where=sa > 0)
    b = np.divide(b, sb, out=np.zeros_like(b), where=sb > 0)
    num = (a * b).sum(axis=(-2, -1))
    den = np.sqrt((a * a).sum(axis=(-2, -1)) * (b * b).sum(axis=(-2, -1)))
    out = np.divide(num, den, out=np.zeros_like(num), where=den > 0)
    return float(out) if out.ndim == 0 else out


def singular_values(W: ArrayLike) -> NDArray[np.float64]:
    """Singular values (descending) of a matrix or a stack of matrices."""
    return np.linalg.svd(np.asarray(W, dtype=np.float64), compute_uv=False)


def matrix_rank(W: ArrayLike, tol: float = RANK_TOL) -> NDArray[np.int64] | int:
    """Number of singular values above ``tol · σ_max`` (relative tolerance; 0 for a zero matrix)."""
    s = singular_values(W)
    top = s[..., :1]
    r = (s > tol * top).sum(axis=-1) * (top[..., 0] > 0)
    return int(r) if np.ndim(r) == 0 else r.astype(np.int64)


def effective_rank(W: ArrayLike) -> NDArray[np.float64] | float:
    """Effective rank exp(H(p)), p = σ/Σσ (Roy & Vetterli, 2007); 0 for a zero matrix."""
    s = singular_values(W)
    tot = s.sum(axis=-1, keepdims=True)
    p = np.divide(s, tot, out=np.zeros_like(s), where=tot > 0)
    h = -(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)).sum(axis=-1)
    out = np.where(tot[..., 0] > 0, np.exp(h), 0.0)
    return float(out) if out.ndim == 0 else out


def nuc_fro_ratio(W: ArrayLike) -> NDArray[np.float64] | float:
    """‖W‖_* / ‖W‖_F ∈ [1, √rank]: 1 for rank one, √r for r equal singular values."""
    s = singular_values(W)
    fro = np.sqrt((s**2).sum(axis=-1))
    out = np.divide(s.sum(axis=-1), fro, out=np.zeros_like(fro), where=fro > 0)
    return float(out) if out.ndim == 0 else out
