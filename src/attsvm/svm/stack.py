"""A stack of attention SVMs in, stacked arrays out: :meth:`AttentionSVM.fit_stack` (docs/spec.md §3).

A sweep that solves thousands of SVMs of one shape wants their answers as arrays — every W, status and
certificate of the sweep in a few arrays it can reduce, save or plot — not as thousands of estimator
objects, whose construction costs more than a small solve. :meth:`AttentionSVM.fit_stack` takes the stacked
data ``X`` (B, n, T, d), queries ``Z`` (B, n, d_z) and selections (B, n) (checked by :func:`check_stack`) and
returns an :class:`SVMStack`:

- **Frobenius** (``backend="auto"``): the stack goes to the batch of :mod:`.batch` (the compiled dual
  active set with numba, else the NumPy route) as one program, with no per-instance Python; instances it
  does not certify go through :meth:`AttentionSVM.fit`'s own route one at a time, and instances it
  proves infeasible come back with their verified Farkas certificate, exactly as :meth:`fit_many`.
- **every other norm or backend**: the instances go through :meth:`AttentionSVM.fit_many`'s batches
  (the nuclear interior point) or one at a time, and the stack is read off the fitted estimators.

Either way entry ``b`` holds what ``fit`` on instance ``b`` returns — the same status; W, margins,
support and objective to round-off; a certificate that passes ``tol``, or a verified Farkas certificate —
with the latitude of :meth:`AttentionSVM.fit_many`: on a degenerate face the multipliers may be split
differently from ``fit``'s, a Farkas certificate from the batch may differ from ``fit``'s (both verify),
and ``n_iter`` counts the iterations of the method that solved the instance. ``stack[b]`` is the fitted
estimator of instance b, built on first access with the parameters the stack was fitted with.

This module holds the arrays; the estimator (:mod:`attsvm.svm._fitted`) solves the stack, fills the rows of
the instances that ``fit`` returned and hands the stack the function that builds ``stack[b]``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._rows import constraint_mask as _constraint_mask
from .._rows import differences as _differences
from .._validation import as_float_array
from ._base import ConstraintSet
from .status import OPTIMAL

if TYPE_CHECKING:
    from .batch import Stacked

__all__ = ["SVMStack", "check_stack", "constraints"]

# the per-instance scalars of the certificate, as arrays of SVMStack and attributes of AttentionSVM
SCALARS = (
    ("max_violation", "max_violation_"),
    ("relative_violation", "relative_violation_"),
    ("duality_gap", "duality_gap_"),
    ("relative_gap", "relative_gap_"),
    ("complementary_slackness", "complementary_slackness_"),
)


class SVMStack:
    """The fitted SVMs of a stack (:func:`fit_stack`), as arrays over the instances b = 0 … B − 1.

    Attributes
    ----------
    status : (B,) str array — "optimal", "infeasible", or fit's status of an instance it did not certify.
    W : (B, d, d_z) — NaN where an instance has no solution (infeasible, failed).
    objective : (B,) — the norm of W (NaN without a W).
    dual_coef : (B, n, T) — the multipliers λ (0 at α_i; NaN without a W).
    margins : (B, n, T) — ``(x_{iα_i} − x_it)ᵀ W z_i``, inf at α_i (NaN without a W).
    support : (B, n, T) bool — the support tokens (tight constraints).
    max_violation, relative_violation, duality_gap, relative_gap, complementary_slackness : (B,) — the
        certificate of docs/spec.md §3 (NaN without a W).
    certificate : (B, n, T) — the verified Farkas certificate of an infeasible instance (NaN elsewhere).
    tokens : (B, n) — the selections.
    n_iter : (B,) — iterations of the solver that returned the instance.
    solve_time : float — seconds for the whole stack.

    ``len(stack)``, ``stack[b]`` (the fitted :class:`AttentionSVM` of instance b, as ``fit_many`` returns
    it; built on first access, with the parameters the stack was fitted with) and ``iter(stack)`` make it
    a sequence of estimators too. The estimators of instances the batch solved view the stack's arrays
    (as ``fit_many``'s view theirs): writing into ``stack.W`` changes their ``W_``. The stack keeps the
    constraint rows (the size of X) for them.
    """

    status: NDArray[np.str_]
    W: NDArray[np.float64]
    objective: NDArray[np.float64]
    dual_coef: NDArray[np.float64]
    margins: NDArray[np.float64]
    support: NDArray[np.bool_]
    max_violation: NDArray[np.float64]
    relative_violation: NDArray[np.float64]
    duality_gap: NDArray[np.float64]
    relative_gap: NDArray[np.float64]
    complementary_slackness: NDArray[np.float64]
    certificate: NDArray[np.float64]
    tokens: NDArray[np.int64]
    n_iter: NDArray[np.int64]
    solve_time: float

    def __init__(
        self,
        shape: tuple[int, int, int, int, int],
        tokens: NDArray[np.int64],
        stacked: Stacked | None,
        tol: float,
        solve_time: float,
        build: Callable[[int], Any],
    ) -> None:
        """The arrays of a stack of ``shape`` (B, n, T, d, d_z) fitted at ``tokens``: those of the instances
        that the batch's arrays ``stacked`` certified at ``tol`` (viewed, not copied), NaN (status "") for
        every other instance until its row is written; ``build(b)`` returns the fitted estimator of
        instance b (``stack[b]``)."""
        B, n, T, d, dz = shape
        self._build = build
        self.tokens = tokens
        self.solve_time = solve_time
        if stacked is not None:  # the batch's arrays (its estimators' views), NaN where it did not certify
            st = stacked
            ok = st.certified(tol)  # (the others' rows are written by whoever fits them)
            self.W, self.dual_coef, self.margins, self.support = st.W, st.lam, st.margins, st.support
            self.objective = np.sqrt(np.einsum("bde,bde->b", st.W, st.W))
            for j, (name, _) in enumerate(SCALARS):
                setattr(self, name, st.stats[:, j])
            self.n_iter = st.code.copy()
            self.status = np.full(B, OPTIMAL, dtype="<U20")
            if not ok.all():  # (no estimator views these instances' rows: they come from fit)
                off = ~ok
                for arr in (self.W, self.dual_coef, self.margins, self.objective, *st.stats[:, :5].T):
                    arr[off] = np.nan
                self.support[off] = False
                self.n_iter[off] = 0
        else:
            self.W = np.full((B, d, dz), np.nan)
            self.objective = np.full(B, np.nan)
            self.dual_coef = np.full((B, n, T), np.nan)
            self.margins = np.full((B, n, T), np.nan)
            self.support = np.zeros((B, n, T), dtype=bool)
            for name, _ in SCALARS:
                setattr(self, name, np.full(B, np.nan))
            self.n_iter = np.zeros(B, dtype=np.int64)
            self.status = np.full(B, "", dtype="<U20")
        self.certificate = np.full((B, n, T), np.nan)

    @property
    def optimal(self) -> NDArray[np.bool_]:
        """(B,) whether each instance is certified optimal."""
        return self.status == OPTIMAL

    def __len__(self) -> int:
        return int(self.status.shape[0])

    def __getitem__(self, b: int) -> Any:
        """The fitted :class:`~attsvm.svm.AttentionSVM` of instance ``b`` (built on first access)."""
        if isinstance(b, (bool, np.bool_)) or not isinstance(b, (int, np.integer)):
            raise TypeError(f"an SVMStack is indexed by an instance number, got {type(b).__name__}")
        B = len(self)
        if not -B <= b < B:
            raise IndexError(f"instance {b} out of range for a stack of {B}")
        return self._build(int(b) % B)

    def __iter__(self) -> Iterator[Any]:
        return (self[b] for b in range(len(self)))

    def __repr__(self) -> str:
        kinds, counts = np.unique(self.status, return_counts=True)
        tally = "".join(
            f"{', ' if j else ': '}{c} {k}" for j, (k, c) in enumerate(zip(kinds.tolist(), counts.tolist()))
        )
        return f"SVMStack({len(self)} instance{'' if len(self) == 1 else 's'}{tally}; {self.solve_time:.3g} s)"


def check_stack(
    X: ArrayLike, Z: ArrayLike, tokens: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.int64]]:
    """The arrays of :meth:`AttentionSVM.fit_stack`, validated: errors name the argument and, for a selection, the
    instance."""
    X = as_float_array(X, "X", ndim=4, copy=False)  # (read during the call only, never kept)
    B, n, T, d = X.shape
    if n < 1 or d < 1 or T < 2:
        raise ValueError(f"X must have shape (B, n, T, d) with n >= 1, T >= 2 and d >= 1, got {X.shape}")
    Z = as_float_array(Z, "Z", ndim=3)
    if Z.shape[:2] != (B, n) or Z.shape[2] < 1:
        raise ValueError(f"Z must have shape ({B}, {n}, d_z) (one query per sequence of X), got {Z.shape}")
    tok = np.asarray(tokens)
    if tok.shape != (B, n):
        raise ValueError(f"tokens must hold one token index per sequence: shape ({B}, {n}), got {tok.shape}")
    if tok.dtype.kind not in "iuf":
        raise TypeError(f"tokens must be integer token indices, got dtype {tok.dtype}")
    if tok.dtype.kind == "f" and not (np.isfinite(tok) & (tok == np.round(tok))).all():
        b, i = (int(v) for v in np.argwhere(~(np.isfinite(tok) & (tok == np.round(tok))))[0])
        raise TypeError(f"tokens must be integer token indices, got tokens[{b}, {i}] = {tok[b, i].item()!r}")
    bad = (tok < 0) | (tok >= T)  # (before any cast: a float far out of range stays itself)
    if bad.any():
        b, i = (int(v) for v in np.argwhere(bad)[0])
        raise ValueError(f"tokens[{b}, {i}] = {tok[b, i].item()!r} is not a token index in [0, {T})")
    return X, Z, tok.astype(np.int64)  # (a copy: the caller's array is neither aliased nor read again)


def constraints(X: NDArray[np.float64], Z: NDArray[np.float64], alpha: NDArray[np.int64]) -> ConstraintSet:
    """The constraint set ``fit`` builds for one instance (attsvm.svm._base.att_svm_constraints)."""
    n, T, _ = X.shape
    A = _differences(X[np.arange(n), alpha], X)
    mask = _constraint_mask(n, T, alpha)
    return ConstraintSet._trusted(A, Z.copy(), mask, mask.astype(np.float64), np.zeros_like(mask))
