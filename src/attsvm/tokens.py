"""Token structure of a selection α: pair differences, margins, support tokens (docs/spec.md §2–3).

For a selection ``α`` (one token per sequence) the Att-SVM constraints are indexed by pairs
``k = (i, t ≠ α_i)`` with features ``a_it = x_{iα_i} − x_it`` and query ``z_i``; the margin of W on
pair k is ``a_itᵀ W z_i``. Everything here is vectorised over (n, T); arrays keep the (n, T) layout
with a boolean ``mask`` that is False at ``t = α_i``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import _rows
from ._rows import TIE_ULPS
from ._validation import as_float_array, check_bool, check_finite_scalar, check_positive_int, check_selection
from .problem import AttentionProblem, check_problem

__all__ = [
    "pair_differences",
    "differences",
    "TIE_ULPS",
    "constraint_mask",
    "margins",
    "support_tokens",
    "selected_tokens",
    "LocalOptimalityReport",
    "local_optimality_report",
    "SUPPORT_TOL",
]

# A constraint counts as tight (its token is a support token) when its margin is within this
# relative tolerance of 1 (docs/spec.md §2 "up to a tolerance").
SUPPORT_TOL = 1e-6


def constraint_mask(n: int, T: int, tokens: ArrayLike) -> NDArray[np.bool_]:
    """Boolean (n, T): True for the constraint pairs (i, t ≠ α_i)."""
    n = check_positive_int(n, "n")
    T = check_positive_int(T, "T")
    return _rows.constraint_mask(n, T, check_selection(tokens, n, T))


def pair_differences(
    problem: AttentionProblem, tokens: ArrayLike | None = None
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """``a_it = x_{iα_i} − x_it`` of shape (n, T, d) and the constraint mask (n, T) (docs/spec.md §3).

    ``tokens=None`` uses the optimal tokens. Rows at ``t = α_i`` are zero and masked out; so are the rows of
    tokens tied with ``x_{iα_i}`` up to round-off (:func:`differences`).
    """
    return _rows.pair_differences(problem, check_problem(problem).check_tokens(tokens))


def differences(sel: ArrayLike, X: ArrayLike) -> NDArray[np.float64]:
    """``a_it = sel_i − x_it`` over (..., n, T, d) for the selected tokens ``sel`` (..., n, d), with every
    row whose coordinates all satisfy ``|a_j| ≤ TIE_ULPS·ε·max(|sel_j|, |x_j|)`` set to exactly 0 (tied
    tokens, docs/spec.md §3). Every constraint builder goes through it, so that all solve the same rows."""
    Xa = as_float_array(X, "X")
    sa = as_float_array(sel, "sel")
    if Xa.ndim < 3 or sa.ndim < 2 or sa.shape[-2:] != (Xa.shape[-3], Xa.shape[-1]):
        raise ValueError(
            f"X must be (..., n, T, d) and sel (..., n, d) with the same n and d, got {Xa.shape} and {sa.shape}"
        )
    with np.errstate(over="ignore", invalid="ignore"):
        return _rows.differences(sa, Xa)


def margins(problem: AttentionProblem, tokens: ArrayLike | None, W: ArrayLike) -> NDArray[np.float64]:
    """Margins ``(x_{iα_i} − x_it)ᵀ W z_i`` of shape (n, T); ``+inf`` at ``t = α_i``.

    Equivalently ``logit_{iα_i} − logit_it``. ``W`` may be a stack (R, d, d) → (R, n, T).
    """
    alpha = check_problem(problem).check_tokens(tokens)
    W = as_float_array(W, "W")
    logits, e = problem.scaled_logits(W)  # (..., n, T), logits·2^e (e per sequence: where they overflow)
    top = np.take_along_axis(logits, np.broadcast_to(alpha[:, None], (*logits.shape[:-1], 1)), axis=-1)
    m = top - logits
    if e is not None:  # (a margin beyond the float range is ±inf, never inf − inf)
        with np.errstate(over="ignore"):
            m = np.ldexp(m, e)
    mask = _rows.constraint_mask(problem.n, problem.T, alpha)
    return np.where(mask, m, np.inf)


def support_tokens(margin: NDArray[np.float64], tol: float = SUPPORT_TOL) -> NDArray[np.bool_]:
    """Support tokens ``T_i(α)``: pairs whose margin is 1 up to ``tol`` (docs/spec.md §2), shape (n, T),
    or (..., n, T) for stacked margins (one solution per leading index, as :func:`margins` of a stack W).

    ``margin`` must be the margins of the (normalised) SVM solution, with ``+inf`` at α_i.
    """
    if margin is None or np.iscomplexobj(margin):
        raise TypeError(f"margin must be an array of real margins, got {type(margin).__name__}")
    try:
        m = np.asarray(margin, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"margin must be an array of real margins, got {type(margin).__name__}") from None
    tol = check_finite_scalar(tol, "tol")
    if tol < 0:
        raise ValueError(f"tol must be >= 0, got {tol}")
    if m.ndim < 2 or np.isnan(m).any():
        raise ValueError(
            f"margin must be an (n, T) array of margins, or a stack (..., n, T) (+inf at α_i, no NaN), "
            f"got shape {m.shape}"
        )
    return np.isfinite(m) & (np.abs(m - 1.0) <= tol * np.maximum(1.0, np.abs(m)))


def selected_tokens(problem: AttentionProblem, W: ArrayLike) -> NDArray[np.int64]:
    """Tokens selected by attention ``α̂_i = argmax_t s_it`` (docs/spec.md §4), shape (n,) or (R, n);
    logits that overflow are compared through :meth:`AttentionProblem.scaled_logits` (exact scaling)."""
    g, _ = check_problem(problem).scaled_logits(W)  # (logits() checks W)
    return np.argmax(g, axis=-1).astype(np.int64)


@dataclass(frozen=True)
class LocalOptimalityReport:
    """Outcome of the local-optimality test of docs/spec.md §2 for a selection α.

    Attributes
    ----------
    tokens : (n,) the selection α.
    feasible : whether Att-SVM(α) is feasible.
    support : (n, T) bool, the support tokens T_i(α) (all False when infeasible).
    passed : (n,) bool, per sequence: γ_{iα_i} > γ_it for every support token t.
    offending : list, per sequence, of the support tokens with γ_it ≥ γ_{iα_i} (empty when passed).
    locally_optimal : bool, feasible and every sequence passed.
    """

    tokens: NDArray[np.int64]
    feasible: bool
    support: NDArray[np.bool_]
    passed: NDArray[np.bool_]
    offending: list[list[int]]

    @property
    def locally_optimal(self) -> bool:
        return bool(self.feasible and np.all(self.passed))

    @property
    def failed_sequences(self) -> list[int]:
        return [int(i) for i in np.flatnonzero(~self.passed)]

    def to_dict(self) -> dict:
        return {
            "tokens": self.tokens.tolist(),
            "feasible": self.feasible,
            "locally_optimal": self.locally_optimal,
            "support": [np.flatnonzero(r).tolist() for r in self.support],
            "passed": self.passed.tolist(),
            "offending": self.offending,
        }


def local_optimality_report(
    problem: AttentionProblem, tokens: ArrayLike, support: NDArray[np.bool_] | None, feasible: bool
) -> LocalOptimalityReport:
    """Apply the test of docs/spec.md §2 given the support set of Att-SVM(α) (pure; the solve is the caller's).

    α is locally optimal iff Att-SVM(α) is feasible and ``γ_{iα_i} > γ_it`` for every support token.
    """
    alpha = check_problem(problem).check_tokens(tokens)
    feasible = check_bool(feasible, "feasible")
    n, T = problem.n, problem.T
    if not feasible:
        sup = np.zeros((n, T), dtype=bool)
        return LocalOptimalityReport(alpha, False, sup, np.zeros(n, dtype=bool), [[] for _ in range(n)])
    if support is None:
        raise ValueError("support is required when feasible is True (the support tokens of Att-SVM(α))")
    sup_arr = np.array(support)  # (a copy: the report owns it)
    if sup_arr.dtype != bool or sup_arr.shape != (n, T):
        raise ValueError(f"support must be a boolean array of shape ({n}, {T}), got {sup_arr.dtype} {sup_arr.shape}")
    g = problem.scores
    bad = sup_arr & (g >= g[np.arange(n), alpha][:, None])  # (n, T)
    offending = [np.flatnonzero(bad[i]).tolist() for i in range(n)]
    passed = np.asarray(~bad.any(axis=1), dtype=bool)
    return LocalOptimalityReport(alpha, True, sup_arr, passed, offending)
