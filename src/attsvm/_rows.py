"""The constraint rows of a selection on validated arrays: the kernels under the public functions of
:mod:`attsvm.tokens` (which check their arguments first) and of every constraint builder in :mod:`attsvm.svm`,
defined once so that all of them solve the same rows (docs/spec.md §3)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from .problem import AttentionProblem

__all__ = ["TIE_ULPS", "constraint_mask", "differences", "pair_differences"]

# Tokens equal to the selected one up to this many units of round-off in every coordinate are tied
# (docs/spec.md §3): their row is exactly 0, not the round-off that a solver would scale up to a unit row
# (x and 10·x differ by one ulp in one representation and by another in the other, so a "solution" of
# size 1/ulp would depend on the units).
TIE_ULPS = 8.0
_FEW = 1 << 16  # differences of at most this many elements are tested for ties in one pass


def constraint_mask(n: int, T: int, alpha: NDArray[np.int64]) -> NDArray[np.bool_]:
    """Boolean (n, T), True for the constraint pairs (i, t ≠ α_i), of a validated selection ``alpha``."""
    mask = np.ones((n, T), dtype=bool)
    mask[np.arange(n), alpha] = False
    return mask


def differences(sel: NDArray[np.float64], X: NDArray[np.float64]) -> NDArray[np.float64]:
    """``a_it = sel_i − x_it`` over (..., n, T, d) of validated float64 arrays, tied rows exactly 0
    (:func:`attsvm.tokens.differences` checks its arguments and calls this)."""
    A = sel[..., None, :] - X
    tol = TIE_ULPS * np.finfo(np.float64).eps
    if A.size <= _FEW or A.shape[-1] == 0:
        scale = tol * np.maximum(np.abs(sel)[..., None, :], np.abs(X))
        tied_all: NDArray[np.bool_] = np.all(np.abs(A) <= scale, axis=-1)
        return np.where(tied_all[..., None], 0.0, A) if tied_all.any() else A
    # a tie needs every coordinate within tol: the first coordinate rules out almost every row, and only the
    # rows it leaves are tested in full (the same test, without temporaries the size of X)
    near = np.abs(A[..., 0]) <= tol * np.maximum(np.abs(sel[..., None, 0]), np.abs(X[..., 0]))
    if not near.any():
        return A
    at = np.nonzero(near)
    rows = A[at]
    scale = tol * np.maximum(np.abs(sel[at[:-1]]), np.abs(X[at]))
    tied_rows = np.all(np.abs(rows) <= scale, axis=-1)
    if not tied_rows.any():
        return A
    tied = np.zeros(near.shape, dtype=bool)
    tied[tuple(i[tied_rows] for i in at)] = True
    return np.where(tied[..., None], 0.0, A)


def pair_differences(
    problem: AttentionProblem, alpha: NDArray[np.int64]
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """``(a_it, mask)`` of :func:`attsvm.tokens.pair_differences` at a validated selection ``alpha``."""
    X = problem.X
    A = differences(X[np.arange(problem.n), alpha], X)  # (n, T, d); 0 at t = α_i and on tied tokens
    return A, constraint_mask(problem.n, problem.T, alpha)
