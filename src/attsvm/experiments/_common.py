"""Pieces shared by several experiments: the published instances and the SVMs of selected tokens."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._linalg import correlation
from ..datasets import paper_instance
from ..problem import AttentionProblem, TieError
from ._backends import SVMResult, svm_solve

__all__ = ["paper_problems", "selected_svms", "optimal_or_none"]


def paper_problems(n: int, T: int, d: int, seeds: range | list[int], self_attention: bool = False
                   ) -> list[AttentionProblem]:
    """The published data recipe (SPEC §6) for each seed."""
    return [paper_instance(n, T, d, seed=int(s), self_attention=self_attention) for s in seeds]


def optimal_or_none(problem: AttentionProblem) -> NDArray[np.int64] | None:
    """The optimal tokens, or None when some sequence has a tied maximum (SPEC §2)."""
    try:
        return problem.optimal_tokens()
    except TieError:
        return None


def selected_svms(problem: AttentionProblem, tokens: NDArray[np.int64], norms: tuple[str, ...] = ("fro", "nuc")
                  ) -> dict[str, SVMResult]:
    """Att-SVM(α) for each requested norm at the selection ``tokens``."""
    return {nm: svm_solve(problem, tokens, nm) for nm in norms}  # type: ignore[arg-type]


def corr_or_nan(W: NDArray[np.float64], ref: SVMResult) -> Any:
    """``corr(W, ref.W)`` batched over leading axes of W; NaN when the SVM has no solution."""
    if ref.W is None:
        return np.full(W.shape[:-2], np.nan) if W.ndim > 2 else np.nan
    return correlation(W, ref.W)


def train_W_reduced(problems: list[AttentionProblem], seeds: list[int], *, steps: int, lr: float
                    ) -> NDArray[np.float64]:
    """Final W (R, d, d) of normalized GD on W, trained exactly in the span of the data (linear head).

    The logits x_itᵀ W z_i and the gradient Σ c_it x_it z_iᵀ only involve W through Uᵀ W V, with U an
    orthonormal basis of the tokens and V of the queries (SPEC §3 "Structure"); the component of W
    outside U ⊗ V stays at its initial value and the gradient norm is the same in reduced coordinates.
    So training the r × r problem (r = min(d, n·T)) and lifting back is the same GD path in d × d,
    at a cost independent of d. W₀ ~ U(−1/√d, 1/√d) entrywise (PyTorch's nn.Linear law), drawn from
    ``numpy.random.default_rng(seed)``.
    """
    from ._backends import train_runs

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
    out = train_runs([q for q, _ in reduced], param="W", steps=steps, lr=lr, seeds=list(seeds),
                     init=np.stack([M0 for _, M0 in reduced]), record_every=steps)
    return np.stack([U @ out.W[k][:, : V.shape[1]] @ V.T + perp for k, (U, V, perp) in enumerate(lifts)])
