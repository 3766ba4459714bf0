"""The SVMs of prompt attention (docs/spec.md §8, "Prompt attention"; Tarzanagh, Li, Zhang, Oymak 2023).

Both are vector SVMs, laid out as :class:`ConstraintSet` s whose queries are the constant ``z_i = 1``:
the (m, 1) "matrix" solved by :class:`~attsvm.svm.AttentionSVM` is the vector itself, so the one
reduction, the certified solvers and the one certificate module serve them unchanged.

* **p-SVM** (:class:`PromptSVM`): ``min ‖p‖ s.t. pᵀ(k_{iα_i} − k_it) ≥ b_i`` for t ≠ α_i, with keys
  ``k = Wᵀx``; ``b_i = 1``, or ``b_i = 0`` on the sequences listed in ``relaxed`` (their selected
  token must still win, with no margin asked).
* **head SVM** (:class:`HeadSVM`): the max-margin classifier of the selected tokens,
  ``min ‖v‖ s.t. y_i vᵀ x_{iα_i} ≥ 1`` (scikit-learn's ``LinearSVC(fit_intercept=False)`` as C → ∞).
* **joint targets** (:func:`joint_svm`): under joint training of (v, p), v goes to the head SVM of
  the selection and p to the p-SVM relaxed on the sequences that are *not* support vectors of v
  (margin ``y_i v_mmᵀ x_{iα_i} > 1``): the loss of those sequences vanishes faster, so they do not shape
  p's direction. An instance is *tight* when every sequence is a support vector.

An infeasible p-SVM (a selected token that no prompt can make win) has status "infeasible" with the
shared Farkas certificate, as every attention SVM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..prompt import PromptProblem
from ._base import ConstraintSet

__all__ = [
    "PromptSVM",
    "HeadSVM",
    "JointSVM",
    "joint_svm",
    "p_svm_constraints",
    "head_svm_constraints",
    "SUPPORT_RTOL",
]

# A sequence is a support vector of the head SVM when its margin y_i vᵀx_{iα_i} is within this
# relative distance of 1 (the solver's certificate holds margins to ~1e-9).
SUPPORT_RTOL = 1e-6


def _check_problem(problem: Any) -> PromptProblem:
    if not isinstance(problem, PromptProblem):
        raise TypeError(f"problem must be a PromptProblem, got {type(problem).__name__}")
    return problem


def _relaxed_mask(relaxed: ArrayLike | None, n: int) -> NDArray[np.bool_]:
    if relaxed is None:
        return np.zeros(n, dtype=bool)
    arr = np.asarray(relaxed)
    if arr.dtype == bool:
        if arr.shape != (n,):
            raise ValueError(f"relaxed must be a bool mask of shape ({n},) or sequence indices, got shape {arr.shape}")
        return arr.copy()
    if arr.size == 0:
        return np.zeros(n, dtype=bool)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"relaxed must be a bool mask of shape ({n},) or 1-d integer sequence indices, got {arr!r}")
    if arr.min() < 0 or arr.max() >= n:
        raise ValueError(f"relaxed must hold sequence indices in [0, {n}), got {arr[(arr < 0) | (arr >= n)][:10]}")
    out = np.zeros(n, dtype=bool)
    out[arr] = True
    return out


def p_svm_constraints(
    problem: PromptProblem, tokens: ArrayLike | None = None, *, relaxed: ArrayLike | None = None
) -> ConstraintSet:
    """The p-SVM rows ``pᵀ(k_{iα_i} − k_it) ≥ b_i`` (module doc) as a ConstraintSet with (n, T) layout,
    features (m,) and queries ``z_i = 1``. ``tokens`` defaults to the optimal tokens of the fixed head."""
    problem = _check_problem(problem)
    alpha = problem.check_tokens(tokens)
    rel = _relaxed_mask(relaxed, problem.n)
    n, T = problem.n, problem.T
    K = problem.keys
    A = K[np.arange(n), alpha][:, None, :] - K  # (n, T, m)
    mask = np.ones((n, T), dtype=bool)
    mask[np.arange(n), alpha] = False
    rhs = np.where(rel[:, None], 0.0, 1.0) * np.ones((1, T))
    return ConstraintSet(A, np.ones((n, 1)), mask, rhs)


def head_svm_constraints(problem: PromptProblem, tokens: ArrayLike | None = None) -> ConstraintSet:
    """The head SVM rows ``y_i vᵀ x_{iα_i} ≥ 1`` as a ConstraintSet with one row per sequence."""
    problem = _check_problem(problem)
    alpha = problem.check_tokens(tokens)
    n = problem.n
    A = (problem.y[:, None] * problem.X[np.arange(n), alpha])[:, None, :]  # (n, 1, d)
    return ConstraintSet(A, np.ones((n, 1)), np.ones((n, 1), dtype=bool))


class _VectorSVM:
    """A vector SVM solved as an (m, 1) attention SVM; fitted attributes of the inner
    :class:`~attsvm.svm.AttentionSVM` (``status_``, ``dual_coef_``, ``max_violation_``,
    ``relative_gap_``, ``certificate_`` …) are forwarded."""

    def __init__(self, norm: str = "fro", *, p: float | None = None, backend: str = "auto", tol: float = 1e-9):
        self.norm = norm
        self.p = p
        self.backend = backend
        self.tol = tol

    def _solve(self, cs: ConstraintSet) -> NDArray[np.float64] | None:
        from .estimator import AttentionSVM

        svm = AttentionSVM(self.norm, p=self.p, backend=self.backend, tol=self.tol)  # type: ignore[arg-type]
        svm.fit_constraints(cs)
        self.svm_ = svm
        self.constraints_ = cs
        return None if svm.W_ is None else svm.W_[:, 0].copy()

    def __getattr__(self, name: str) -> Any:
        if name.endswith("_") and not name.startswith("_") and "svm_" in self.__dict__:
            return getattr(self.__dict__["svm_"], name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r} (fit it first?)")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(norm={self.norm!r}, tol={self.tol:g})"


class PromptSVM(_VectorSVM):
    """The p-SVM of prompt attention (module doc; docs/spec.md §8).

    Parameters: ``norm`` ("fro" is the theory's ℓ2; any :class:`AttentionSVM` norm is accepted),
    ``p`` (for ``norm="lp"``), ``backend`` ("auto" or "cvxpy"), ``tol`` (certificate tolerance).

    Attributes (after fit): ``p_`` (m,) the solution (None when infeasible), ``tokens_`` (n,),
    ``relaxed_`` (n,) bool, ``svm_`` the inner fitted AttentionSVM, and its certificate attributes.
    """

    def fit(
        self, problem: PromptProblem, tokens: ArrayLike | None = None, *, relaxed: ArrayLike | None = None
    ) -> PromptSVM:
        problem = _check_problem(problem)
        alpha = problem.check_tokens(tokens)
        self.tokens_ = alpha
        self.relaxed_ = _relaxed_mask(relaxed, problem.n)
        self.p_ = self._solve(p_svm_constraints(problem, alpha, relaxed=self.relaxed_))
        return self


class HeadSVM(_VectorSVM):
    """The max-margin classifier of the selected tokens, ``min ‖v‖ s.t. y_i vᵀx_{iα_i} ≥ 1`` (module doc).

    Attributes (after fit): ``v_`` (d,) (None when infeasible), ``tokens_``, ``margins_i_`` (n,) the
    margins ``y_i v_ᵀ x_{iα_i}``, ``support_vectors_`` (n,) bool (margin within SUPPORT_RTOL of 1),
    ``svm_`` and its certificate attributes.
    """

    def fit(self, problem: PromptProblem, tokens: ArrayLike | None = None) -> HeadSVM:
        problem = _check_problem(problem)
        alpha = problem.check_tokens(tokens)
        self.tokens_ = alpha
        self.v_ = self._solve(head_svm_constraints(problem, alpha))
        if self.v_ is None:
            self.margins_i_ = None
            self.support_vectors_ = None
        else:
            sel = problem.X[np.arange(problem.n), alpha]
            self.margins_i_ = problem.y * (sel @ self.v_)
            self.support_vectors_ = self.margins_i_ <= 1.0 + SUPPORT_RTOL
        return self


@dataclass(frozen=True)
class JointSVM:
    """The directions joint (v, p) training goes to (module doc).

    v : (d,) head SVM of the selection; p : (m,) the p-SVM relaxed off the support vectors;
    p_full : (m,) the p-SVM with every row at margin 1 (equal to p when tight);
    support : (n,) bool, the support vectors of v; tight : every sequence is one;
    status : "optimal" when both SVMs are certified optimal, else the first other status;
    head, prompt, prompt_full : the fitted solvers.
    """

    v: NDArray[np.float64] | None
    p: NDArray[np.float64] | None
    p_full: NDArray[np.float64] | None
    support: NDArray[np.bool_] | None
    tight: bool
    status: str
    head: HeadSVM
    prompt: PromptSVM
    prompt_full: PromptSVM


def joint_svm(problem: PromptProblem, tokens: ArrayLike, *, tol: float = 1e-9, backend: str = "auto") -> JointSVM:
    """The joint-training targets of a selection α (module doc): v_mm, the relaxed p-SVM and the full one."""
    problem = _check_problem(problem)
    alpha = problem.check_tokens(tokens)
    head = HeadSVM(backend=backend, tol=tol).fit(problem, alpha)
    full = PromptSVM(backend=backend, tol=tol).fit(problem, alpha)
    if head.v_ is None:
        prompt = full
        support = None
        tight = False
    else:
        support = head.support_vectors_
        assert support is not None
        tight = bool(support.all())
        prompt = full if tight else PromptSVM(backend=backend, tol=tol).fit(problem, alpha, relaxed=~support)
    statuses = [head.status_, prompt.status_, full.status_]
    status = next((s for s in statuses if s != "optimal"), "optimal")
    return JointSVM(
        v=head.v_,
        p=prompt.p_,
        p_full=full.p_,
        support=support,
        tight=tight,
        status=status,
        head=head,
        prompt=prompt,
        prompt_full=full,
    )
