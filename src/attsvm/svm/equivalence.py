"""SVM-equivalence for nonlinear and multiclass heads (docs/spec.md §5).

After training, attention may keep several tokens per sequence. With the selected sets
``O_i = {t : s_it ≥ ε}`` the trained ``W(k)`` is predicted to decompose as ``R·W^eq + W_fin``:

* ``W^eq = argmin ‖W‖ s.t. (x_it − x_iτ)ᵀ W z_i = 0 (t, τ ∈ O_i), ≥ 1 (t ∈ O_i, τ ∉ O_i)``,
  the directional component (its norm grows with k);
* ``W_fin = argmin ‖W‖ s.t. (x_it − x_iτ)ᵀ W z_i = log(s_it / s_iτ) (t, τ ∈ O_i)``,
  the finite component fixing the probability ratios inside ``O_i``.

Both are written with one reference token ``r_i ∈ O_i`` per sequence: all pairs inside ``O_i`` are
implied by the pairs ``(r_i, t)``, and all pairs (t ∈ O_i, τ ∉ O_i) by ``(r_i, τ)`` once the logits
inside ``O_i`` are equal. They are solved (and certified) by :class:`~attsvm.svm.AttentionSVM`
through ``fit_constraints`` — Frobenius by default, nuclear with ``norm="nuc"``.

For a convex head (linear multiclass head + cross-entropy) the best attention mixture of each
sequence solves ``min_{s ∈ Δ_T} CE(Vᵀ X_iᵀ s, y_i)`` (:func:`optimal_mixture`); its support predicts
``O_i`` before any training.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._linalg import correlation
from .._rows import differences as _differences
from .._validation import (
    as_float_array,
    check_choice,
    check_finite_scalar,
    check_positive_int,
)
from ..problem import AttentionProblem
from ._base import ConstraintSet

__all__ = [
    "SELECT_EPS",
    "selected_sets",
    "equivalence_constraints",
    "svm_eq",
    "w_fin",
    "Decomposition",
    "decomposition",
    "MixtureResult",
    "optimal_mixture",
]

logger = logging.getLogger(__name__)

# Default probability threshold defining the selected sets O_i (docs/spec.md §5).
SELECT_EPS = 1e-3
# Attention probability rows must sum to 1 within this (float64 softmax rows are off by ~1e-16·T).
PROBS_SUM_TOL = 1e-6
# Mixture weights at or above this count as the support of the optimal mixture.
MIXTURE_SUPPORT_TOL = 1e-6
NORMS: tuple[str, ...] = ("fro", "nuc")


# ----------------------------------------------------------------------------- selected sets
def _check_probs(probs: ArrayLike, problem: AttentionProblem | None = None) -> NDArray[np.float64]:
    s = as_float_array(probs, "probs", ndim=2)
    if problem is not None and s.shape != (problem.n, problem.T):
        raise ValueError(f"probs must have shape (n, T) = ({problem.n}, {problem.T}), got {s.shape}")
    if np.any(s < 0) or np.any(s > 1):
        raise ValueError(f"probs must be probabilities in [0, 1], got values in [{s.min():.3g}, {s.max():.3g}]")
    _check_row_sums(s)
    return s


def _check_row_sums(s: NDArray[np.float64]) -> None:
    """Every row of ``s`` (over the last axis) sums to 1 within ``PROBS_SUM_TOL``, or a ValueError naming probs."""
    sums = s.sum(axis=-1)
    off = np.abs(sums - 1.0) > PROBS_SUM_TOL
    if np.any(off):
        bad = np.argwhere(off)[:5]
        rows = [tuple(int(i) for i in r) if len(r) > 1 else int(r[0]) for r in bad]
        raise ValueError(
            f"probs rows must sum to 1 within {PROBS_SUM_TOL:g} (attention probabilities); "
            f"rows {rows} sum to {[float(sums[tuple(r)]) for r in bad]}"
        )


def selected_sets(probs: ArrayLike, eps: float = SELECT_EPS) -> NDArray[np.bool_]:
    """``O_i = {t : s_it ≥ ε}`` (docs/spec.md §5), a boolean array of shape (n, T) (or (R, n, T)).

    ``probs`` are attention probabilities: entries in [0, 1], each row (over T) summing to 1 within
    ``PROBS_SUM_TOL`` (unnormalised scores are refused). The most probable token of each sequence is
    always included, so every ``O_i`` is non-empty whatever ``ε``.
    """
    eps = check_finite_scalar(eps, "eps", positive=True)
    if not eps < 1:
        raise ValueError(f"eps must be in (0, 1), got {eps}")
    s = as_float_array(probs, "probs")
    if s.ndim not in (2, 3) or s.size == 0:
        raise ValueError(f"probs must have shape (n, T) or (R, n, T) with n, T >= 1, got {s.shape}")
    if np.any(s < 0) or np.any(s > 1):
        raise ValueError(f"probs must be probabilities in [0, 1], got values in [{s.min():.3g}, {s.max():.3g}]")
    _check_row_sums(s)
    O = s >= eps
    top = np.argmax(s, axis=-1)
    np.put_along_axis(O, top[..., None], True, axis=-1)
    return O


def _check_sets(sets: ArrayLike, problem: AttentionProblem) -> NDArray[np.bool_]:
    O = np.asarray(sets)
    if O.shape != (problem.n, problem.T):
        raise ValueError(f"sets must be a boolean array of shape (n, T) = ({problem.n}, {problem.T}), got {O.shape}")
    if O.dtype != bool:
        if np.issubdtype(O.dtype, np.number) and np.all(np.isin(O, (0, 1))):
            O = O.astype(bool)
        else:
            raise TypeError(f"sets must be boolean (True for t ∈ O_i), got dtype {O.dtype}")
    empty = np.flatnonzero(~O.any(axis=1))
    if empty.size:
        raise ValueError(f"every selected set O_i must be non-empty; sequences {empty[:10].tolist()} have none")
    return O


def _reference(
    O: NDArray[np.bool_], probs: NDArray[np.float64] | None, reference: ArrayLike | None
) -> NDArray[np.int64]:
    n = O.shape[0]
    if reference is not None:
        ref = np.asarray(reference)
        if ref.shape != (n,) or not np.issubdtype(ref.dtype, np.integer):
            raise ValueError(
                f"reference must hold one integer token index per sequence, shape ({n},), got {ref.shape} {ref.dtype}"
            )
        if np.any(ref < 0) or np.any(ref >= O.shape[1]) or not np.all(O[np.arange(n), ref]):
            raise ValueError("reference must pick a token inside each selected set O_i")
        return ref.astype(np.int64)
    score = np.where(O, probs if probs is not None else 0.0, -np.inf)
    return np.argmax(score, axis=1).astype(np.int64)  # most probable member (first one without probs)


def equivalence_constraints(
    problem: AttentionProblem, sets: ArrayLike, probs: ArrayLike | None = None, *, reference: ArrayLike | None = None
) -> tuple[ConstraintSet, ConstraintSet | None]:
    """The constraint sets of ``W^eq`` and ``W_fin`` (docs/spec.md §5) with reference tokens ``r_i ∈ O_i``.

    Returns ``(cs_eq, cs_fin)``: ``cs_eq`` has equalities ``(x_ir − x_it)ᵀ W z_i = 0`` for
    ``t ∈ O_i \\ {r_i}`` and inequalities ``(x_ir − x_iτ)ᵀ W z_i ≥ 1`` for ``τ ∉ O_i``; ``cs_fin``
    (None when ``probs`` is None) has equalities ``(x_ir − x_it)ᵀ W z_i = log(s_ir / s_it)`` for
    ``t ∈ O_i \\ {r_i}``. ``reference`` defaults to the most probable token of each ``O_i``.
    """
    if not isinstance(problem, AttentionProblem):
        raise TypeError(f"problem must be an AttentionProblem, got {type(problem).__name__}")
    O = _check_sets(sets, problem)
    s = None if probs is None else _check_probs(probs, problem)
    if s is not None and np.any(O & (s <= 0)):
        raise ValueError("probs must be > 0 on the selected sets (log-probability ratios define W_fin)")
    ref = _reference(O, s, reference)
    n, T = O.shape
    X = problem.X
    A = _differences(X[np.arange(n), ref], X)  # (n, T, d): x_ir − x_it (0 on tokens tied with x_ir)
    mask = np.ones((n, T), dtype=bool)
    mask[np.arange(n), ref] = False
    eq = O & mask
    Z = problem.queries.copy()
    cs_eq = ConstraintSet(A, Z, mask, np.where(eq, 0.0, 1.0), eq)
    if s is None:
        return cs_eq, None
    logratio = np.log(s[np.arange(n), ref])[:, None] - np.log(np.where(eq, s, 1.0))
    cs_fin = ConstraintSet(A, Z.copy(), eq, np.where(eq, logratio, 0.0), eq)
    return cs_eq, cs_fin


def _fit(cs: ConstraintSet, norm: str, tol: float):  # -> AttentionSVM
    from .estimator import AttentionSVM

    return AttentionSVM(norm, tol=tol).fit_constraints(cs)  # type: ignore[arg-type]


def svm_eq(
    problem: AttentionProblem,
    sets: ArrayLike,
    *,
    norm: Literal["fro", "nuc"] = "fro",
    probs: ArrayLike | None = None,
    reference: ArrayLike | None = None,
    tol: float = 1e-9,
):
    """Solve the SVM-equivalence problem ``W^eq`` of docs/spec.md §5 for the selected sets ``sets`` (n, T).

    Returns the fitted, certified :class:`~attsvm.svm.AttentionSVM` (``W_``, ``status_``,
    ``max_violation_``, ``duality_gap_``, ...). ``probs`` only chooses the reference tokens
    (the most probable member of each set); the solution does not depend on that choice.
    """
    check_choice(norm, "norm", NORMS)
    cs_eq, _ = equivalence_constraints(problem, sets, probs, reference=reference)
    return _fit(cs_eq, norm, tol)


def w_fin(
    problem: AttentionProblem,
    sets: ArrayLike,
    probs: ArrayLike,
    *,
    norm: Literal["fro", "nuc"] = "fro",
    reference: ArrayLike | None = None,
    tol: float = 1e-9,
):
    """Solve the finite component ``W_fin`` of docs/spec.md §5: logit gaps inside ``O_i`` equal ``log(s_it/s_iτ)``.

    Returns the fitted :class:`~attsvm.svm.AttentionSVM`. When every ``O_i`` is a single token
    there is no constraint and ``W_fin = 0``.
    """
    check_choice(norm, "norm", NORMS)
    if probs is None:
        raise TypeError("probs must be the (n, T) attention probabilities that define W_fin, got None")
    _, cs_fin = equivalence_constraints(problem, sets, probs, reference=reference)
    assert cs_fin is not None
    return _fit(cs_fin, norm, tol)


# ----------------------------------------------------------------------------- decomposition
@dataclass(frozen=True)
class Decomposition:
    """Fit of a trained ``W`` by ``R·W^eq + W_fin`` (docs/spec.md §5).

    Attributes
    ----------
    scale : the R minimising ``‖W − (R·W^eq + W_fin)‖_F``.
    residual : ``‖W − (R·W^eq + W_fin)‖_F / ‖W‖_F``.
    corr_eq : ``corr(W, W^eq)``.
    corr_eq_fin : ``corr(W − W_fin, W^eq)``.
    """

    scale: float
    residual: float
    corr_eq: float
    corr_eq_fin: float

    def to_dict(self) -> dict[str, float]:
        return {
            "scale": self.scale,
            "residual": self.residual,
            "corr_eq": self.corr_eq,
            "corr_eq_fin": self.corr_eq_fin,
        }


def _times_ratio(x: float, a: float, b: float) -> float:
    """``x·a/b`` for ``a, b > 0`` by exponent arithmetic: inf only when the true value overflows."""
    ma, ea = math.frexp(a)
    mb, eb = math.frexp(b)
    try:
        return math.ldexp(x * ma / mb, ea - eb)
    except OverflowError:
        return math.copysign(math.inf, x)


def decomposition(W: ArrayLike, W_eq: ArrayLike, W_fin: ArrayLike | None = None) -> Decomposition:
    """Least-squares scale R of ``W ≈ R·W^eq + W_fin`` and the correlations of docs/spec.md §5.

    ``W_fin=None`` means no finite component (all sets are single tokens). The inputs must be finite
    and ``W_eq`` non-zero (the zero ``W^eq`` of sets that leave no token outside any ``O_i`` has no
    scale). Computed from scaled copies — ``W`` and ``W_fin`` by one common scale (so ``D = W − W_fin``
    never overflows), ``W_eq`` by its own —, so finite inputs of any magnitude (GD diverges in norm)
    give a finite residual and correlations; ``scale`` is inf only when the true R exceeds the float64
    range. ``W`` must be non-zero too (the residual is relative to ``‖W‖_F``).
    """
    W = as_float_array(W, "W", ndim=2)
    We = as_float_array(W_eq, "W_eq", shape=W.shape)
    Wf = np.zeros_like(W) if W_fin is None else as_float_array(W_fin, "W_fin", shape=W.shape)
    ce = float(np.abs(We).max(initial=0.0))
    if ce == 0:
        raise ValueError("W_eq must be non-zero to fit a scale (got the zero matrix)")
    cw = float(np.abs(W).max(initial=0.0))
    if cw == 0:
        raise ValueError("W must be non-zero: the residual ‖W − R·W^eq − W_fin‖_F / ‖W‖_F is undefined for W = 0")
    c0 = max(cw, float(np.abs(Wf).max(initial=0.0)))
    w, e = W / c0, We / ce  # (d, d) each, entries in [-1, 1]
    dd = w - Wf / c0  # D / c0, entries in [-2, 2]
    rho = float(np.sum(dd * e)) / float(np.sum(e * e))  # R·ce/c0: the fit of D/c0 on W_eq/ce
    nw = float(np.linalg.norm(w))
    # (R is invariant to c0; nw is 0 only when W underflows next to W_fin, a residual of +inf)
    res = float(np.linalg.norm(dd - rho * e)) / nw if nw > 0 else float("inf")
    return Decomposition(
        scale=_times_ratio(rho, c0, ce),
        residual=res,
        corr_eq=float(correlation(W, We)),
        corr_eq_fin=float(correlation(dd, e)),
    )


# ----------------------------------------------------------------------------- optimal mixture
@dataclass(frozen=True)
class MixtureResult:
    """The optimal attention mixture of every sequence (docs/spec.md §5, convex heads).

    Attributes
    ----------
    weights : (n, T) ``s*_i ∈ Δ_T`` minimising ``CE(Vᵀ X_iᵀ s, y_i)``.
    support : (n, T) bool, ``s*_it ≥ support_tol``: the predicted ``O_i``.
    loss : (n,) the optimal cross-entropies.
    kkt_residual : (n,) ``max_{t ∈ supp} ∇_t − min_t ∇_t`` (0 at an exact optimum).
    n_iter : iterations used.
    """

    weights: NDArray[np.float64]
    support: NDArray[np.bool_]
    loss: NDArray[np.float64]
    kkt_residual: NDArray[np.float64]
    n_iter: int


def _simplex_project(V: NDArray[np.float64]) -> NDArray[np.float64]:
    """Euclidean projection of each row onto the probability simplex (Held–Wolfe–Crowder / Duchi)."""
    T = V.shape[-1]
    U = np.sort(V, axis=-1)[..., ::-1]
    cum = np.cumsum(U, axis=-1) - 1.0
    k = np.arange(1, T + 1)
    ok = U * k > cum
    rho = T - 1 - np.argmax(ok[..., ::-1], axis=-1)  # last index where ok holds
    theta = np.take_along_axis(cum, rho[..., None], axis=-1) / (rho[..., None] + 1.0)
    return np.maximum(V - theta, 0.0)


def _ce_and_grad(
    S: NDArray[np.float64], B: NDArray[np.float64], y: NDArray[np.int64]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Cross-entropy of logits ``Σ_t s_t B_t`` per sequence (stable log-sum-exp) and its gradient."""
    logits = np.einsum("nt,ntc->nc", S, B)  # (n, C)
    mx = logits.max(axis=1, keepdims=True)
    e = np.exp(logits - mx)
    Zs = e.sum(axis=1, keepdims=True)
    loss = (mx[:, 0] + np.log(Zs[:, 0])) - logits[np.arange(len(y)), y]
    P = e / Zs
    P[np.arange(len(y)), y] -= 1.0
    return loss, np.einsum("ntc,nc->nt", B, P)


def optimal_mixture(
    problem: AttentionProblem, *, tol: float = 1e-10, max_iter: int = 50_000, support_tol: float = MIXTURE_SUPPORT_TOL
) -> MixtureResult:
    """The best attention mixture per sequence: ``s*_i = argmin_{s ∈ Δ_T} CE(Vᵀ X_iᵀ s, y_i)`` (docs/spec.md §5).

    For the linear multiclass head the per-sequence cross-entropy is convex in the attention
    weights, so this is a convex program over the simplex. Solved for all sequences at once by
    accelerated projected gradient (FISTA, per-sequence step ``1/L_i`` with
    ``L_i = ½‖B_i‖₂²``, ``B_i = X_i V`` of shape (T, C), and adaptive restart), stopped when every
    sequence's simplex KKT residual is below ``tol``.
    """
    if not isinstance(problem, AttentionProblem):
        raise TypeError(f"problem must be an AttentionProblem, got {type(problem).__name__}")
    if problem.head.kind != "multiclass":
        raise ValueError(
            "optimal_mixture needs a convex head: a linear multiclass head with cross-entropy "
            f"(Head.multiclass); got head {problem.head.kind!r}"
        )
    tol = check_finite_scalar(tol, "tol", positive=True)
    max_iter = check_positive_int(max_iter, "max_iter")
    support_tol = check_finite_scalar(support_tol, "support_tol", positive=True)
    B = problem.X @ problem.head.weights  # (n, T, C): logits of each single token
    y = problem.y.astype(np.int64)
    n, T, _ = B.shape
    L = 0.5 * np.linalg.norm(B, ord=2, axis=(1, 2)) ** 2 + 1e-15  # (n,) bounds each Hessian
    step = (1.0 / L)[:, None]
    S = np.full((n, T), 1.0 / T)
    Yk = S.copy()
    t = np.ones(n)
    kkt = np.full(n, np.inf)
    it = 0
    for it in range(1, max_iter + 1):
        _, G = _ce_and_grad(Yk, B, y)
        S_new = _simplex_project(Yk - step * G)
        restart = np.sum((Yk - S_new) * (S_new - S), axis=1) > 0  # momentum going uphill
        t_new = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * t * t))
        mom = np.where(restart, 0.0, (t - 1.0) / t_new)[:, None]
        Yk = S_new + mom * (S_new - S)
        t = np.where(restart, 1.0, t_new)
        S = S_new
        if it % 10 == 0 or it == max_iter:
            _, Gs = _ce_and_grad(S, B, y)
            kkt = np.where(S > 0, Gs, -np.inf).max(axis=1) - Gs.min(axis=1)
            if kkt.max() <= tol:
                break
    else:
        logger.warning("optimal_mixture: max_iter=%d reached with KKT residual %.1e", max_iter, kkt.max())
    loss, Gs = _ce_and_grad(S, B, y)
    kkt = np.where(S > 0, Gs, -np.inf).max(axis=1) - Gs.min(axis=1)
    return MixtureResult(weights=S, support=S >= support_tol, loss=loss, kkt_residual=kkt, n_iter=it)
