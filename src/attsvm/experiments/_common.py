"""Pieces shared by several experiments: the published instances and the SVMs of selected tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from .._linalg import correlation
from ..datasets import paper_instance
from ..problem import AttentionProblem, TieError
from ..svm import AttentionSVM, ConstraintSet

if TYPE_CHECKING:  # (torch loads with the trainer, in the trials that train: not in svm-rank's workers)
    from ..train import TrainResult

__all__ = [
    "paper_problems",
    "optimal_or_none",
    "fit_svm",
    "fit_svms",
    "fit_constraint_svms",
    "num",
    "train_batch",
    "corr_or_nan",
    "train_W_reduced",
]


def fit_svm(
    problem: AttentionProblem | ConstraintSet, tokens: NDArray[np.int64] | None = None, norm: str = "fro"
) -> AttentionSVM:
    """A fitted :class:`attsvm.svm.AttentionSVM` of ``problem`` at ``tokens`` (docs/spec.md §3), or of a
    :class:`~attsvm.svm.ConstraintSet` (the SVM-eq / W_fin programs of docs/spec.md §5).

    An infeasible program is a status (``status_ == "infeasible"``, ``W_ is None``), never an exception.
    """
    est = AttentionSVM(norm)  # type: ignore[arg-type]
    return est.fit_constraints(problem) if isinstance(problem, ConstraintSet) else est.fit(problem, tokens)


def fit_svms(
    problems: list[AttentionProblem], tokens: list[NDArray[np.int64]], norm: str = "fro"
) -> list[AttentionSVM]:
    """:func:`fit_svm` of many problems at once, by :meth:`attsvm.svm.AttentionSVM.fit_many`
    (Frobenius instances of one shape are solved as one vectorised program, nuclear ones by a batched
    interior point)."""
    return AttentionSVM(norm).fit_many(problems, tokens)  # type: ignore[arg-type]


def fit_constraint_svms(constraint_sets: list[ConstraintSet], norm: str = "fro") -> list[AttentionSVM]:
    """:func:`fit_svm` of many constraint sets at once (the SVM-eq / W_fin programs of docs/spec.md §5), by
    :meth:`attsvm.svm.AttentionSVM.fit_many_constraints` (nuclear ones by a batched interior point)."""
    return AttentionSVM(norm).fit_many_constraints(constraint_sets)  # type: ignore[arg-type]


def num(value: float | None, missing: float = np.nan) -> float:
    """A certificate number as a float for the trial data; ``missing`` where the solver has none
    (e.g. ``max_violation_`` of an infeasible SVM is recorded as ``inf``)."""
    return missing if value is None else float(value)


def train_batch(
    problems: list[AttentionProblem], *, seeds: list[int], record_every: int, **options: Any
) -> TrainResult:
    """The paper's normalized GD (docs/spec.md §4) on R problems as one batched program, by
    :func:`attsvm.train.train`, with W recorded, one thread and no progress bar. Run r starts from its
    own generator seeded with ``seeds[r]``, so a run never depends on the batch it is in."""
    from ..train import train

    return train(
        problems,
        normalized=True,
        seed=[int(x) for x in seeds],
        record_every=record_every,
        record_W=True,
        progress=False,
        threads=1,
        **options,
    )


def paper_problems(
    n: int, T: int, d: int, seeds: range | list[int], self_attention: bool = False
) -> list[AttentionProblem]:
    """The published data recipe (docs/spec.md §6) for each seed."""
    return [paper_instance(n, T, d, seed=int(s), self_attention=self_attention) for s in seeds]


def optimal_or_none(problem: AttentionProblem) -> NDArray[np.int64] | None:
    """The optimal tokens, or None when some sequence has a tied maximum (docs/spec.md §2)."""
    try:
        return problem.optimal_tokens()
    except TieError:
        return None


def corr_or_nan(W: NDArray[np.float64], ref: AttentionSVM) -> Any:
    """``corr(W, ref.W_)`` batched over leading axes of W; NaN when the SVM has no solution."""
    if ref.W_ is None:
        return np.full(W.shape[:-2], np.nan) if W.ndim > 2 else np.nan
    return correlation(W, ref.W_)


def train_W_reduced(
    problems: list[AttentionProblem], seeds: list[int], *, steps: int, lr: float
) -> NDArray[np.float64]:
    """Final W (R, d, d) of normalized GD on W, trained exactly in the span of the data (linear head).

    The logits x_itᵀ W z_i and the gradient Σ c_it x_it z_iᵀ only involve W through Uᵀ W V, with U an
    orthonormal basis of the tokens and V of the queries (docs/spec.md §3 "Structure"); the component of W
    outside U ⊗ V stays at its initial value and the gradient norm is the same in reduced coordinates.
    So training the r × r problem (r = min(d, n·T)) and lifting back is the same GD path in d × d,
    at a cost independent of d. W₀ ~ U(−1/√d, 1/√d) entrywise (PyTorch's nn.Linear law), drawn from
    ``numpy.random.default_rng(seed)``.
    """
    n, T, d = problems[0].n, problems[0].T, problems[0].d
    r = min(d, n * T)
    reduced, lifts = [], []
    for p, seed in zip(problems, seeds):
        if p.v is None:
            raise ValueError("train_W_reduced needs a linear head")
        U, _ = np.linalg.qr(p.X.reshape(-1, d).T)  # (d, r): spans every token
        V, _ = np.linalg.qr(p.queries.T)  # (d, min(d, n)): spans every query
        V = V[:, : min(r, V.shape[1])]
        Vp = np.zeros((d, r))
        Vp[:, : V.shape[1]] = V  # zero-padded so that the reduced problem is square (r × r)
        W0 = np.random.default_rng(seed).uniform(-1.0, 1.0, (d, d)) / np.sqrt(d)
        M0 = U.T @ W0 @ Vp
        reduced.append((AttentionProblem(p.X @ U, p.y, U.T @ p.v, Z=p.queries @ Vp), M0))
        lifts.append((U, V, W0 - U @ (U.T @ W0 @ V) @ V.T))
    out = train_batch(
        [q for q, _ in reduced],
        param="W",
        steps=steps,
        lr=lr,
        seeds=list(seeds),
        init=np.stack([M0 for _, M0 in reduced]),
        record_every=steps,
    )
    return np.stack([U @ out.W[k][:, : V.shape[1]] @ V.T + perp for k, (U, V, perp) in enumerate(lifts)])
