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
