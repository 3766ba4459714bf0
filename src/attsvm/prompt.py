"""Prompt attention: ``f(X) = vᵀ Xᵀ softmax(X W p)`` with a trainable prompt p (docs/spec.md §8,
"Prompt attention"; Tarzanagh, Li, Zhang, Oymak, "Max-Margin Token Selection in Attention Mechanism",
NeurIPS 2023).

A :class:`PromptProblem` holds n sequences ``X_i`` (T, d) with labels ``y_i ∈ {−1, +1}``, a fixed
key-query matrix ``W`` (d, m) (the identity by default) and, optionally, a fixed head ``v`` (d,).
The keys are ``k_it = Wᵀ x_it`` (m,), the attention logits ``γ_it(p) = k_itᵀ p = x_itᵀ W p``, and
the output ``f(X_i) = Σ_t softmax(X_i W p)_t · vᵀ x_it``. With v fixed the token scores are
``γ_it = y_i vᵀ x_it`` (docs/spec.md §2) and the p-SVM of a selection α is

    p_mm = argmin ‖p‖  s.t.  pᵀ (k_{iα_i} − k_it) ≥ 1   for all t ≠ α_i, all i

(:class:`attsvm.svm.PromptSVM`). When v trains too, v goes to the max-margin classifier of the selected
tokens (:class:`attsvm.svm.HeadSVM`) and p to a p-SVM whose rows are relaxed to ``≥ 0`` on the
sequences that are not support vectors of v (:func:`attsvm.svm.joint_svm`). Training is
:func:`attsvm.training.prompt.train_prompt`.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._validation import (
    as_float_array,
    check_bool,
    check_choice,
    check_finite_scalar,
    check_labels,
    check_positive_int,
    check_seed,
    check_selection,
    check_tokens,
)
from .problem import _exponent, _softmax_last, _tied_for_max, _TokenShape

__all__ = ["PromptProblem", "paper_joint_problem", "paper_loss_problem", "random_prompt_problem"]


class PromptProblem(_TokenShape):
    """One prompt-attention instance (module doc; docs/spec.md §8).

    Parameters
    ----------
    X : (n, T, d) tokens, T ≥ 2.
    y : (n,) labels in {−1, +1}.
    W : (d, m) key-query matrix, optional (default the (d, d) identity): keys ``k_it = Wᵀ x_it``.
    v : (d,) head, optional: the fixed head when only p trains, and the token scores ``y_i vᵀ x_it``.

    Attributes
    ----------
    X, y, W, v : the validated data (read-only float64 copies; ``v`` may be None).
    n, T, d, m : sizes (m is the prompt dimension).
    """

    def __init__(self, X: ArrayLike, y: ArrayLike, *, W: ArrayLike | None = None, v: ArrayLike | None = None):
        X = check_tokens(X)
        n, T, d = X.shape
        y_arr = check_labels(y, n)
        if W is None:
            W_arr = np.eye(d)
        else:
            W_arr = as_float_array(W, "W", ndim=2)
            if W_arr.shape[0] != d or W_arr.shape[1] < 1:
                raise ValueError(f"W must have shape ({d}, m) with m >= 1 (keys k = Wᵀx), got {W_arr.shape}")
        v_arr = None if v is None else as_float_array(v, "v", shape=(d,))
        self.X: NDArray[np.float64] = X
        self.y: NDArray[np.float64] = y_arr
        self.W: NDArray[np.float64] = W_arr
        self.v: NDArray[np.float64] | None = v_arr
        self.keys: NDArray[np.float64] = X @ W_arr  # (n, T, m)
        for arr in (self.X, self.y, self.W, self.keys) + ((v_arr,) if v_arr is not None else ()):
            arr.setflags(write=False)

    # ------------------------------------------------------------------ sizes (n, T, d: _TokenShape)
    @property
    def m(self) -> int:
        """The prompt dimension (columns of W)."""
        return int(self.W.shape[1])

    def __repr__(self) -> str:
        head = "trainable v" if self.v is None else "fixed v"
        return f"PromptProblem(n={self.n}, T={self.T}, d={self.d}, m={self.m}, {head})"

    # ------------------------------------------------------------------ checks
    def check_prompt(self, p: ArrayLike, name: str = "p") -> NDArray[np.float64]:
        """Validate a prompt of shape (m,) or a batch (..., m)."""
        arr = as_float_array(p, name)
        if arr.ndim < 1 or arr.shape[-1] != self.m:
            raise ValueError(
                f"{name} must have shape ({self.m},) or (..., {self.m}) (the prompt dimension m = W.shape[1]), "
                f"got {arr.shape}"
            )
        return arr

    def check_head(self, v: ArrayLike | None, name: str = "v") -> NDArray[np.float64]:
        """Validate a head of shape (d,) or (..., d); None means the problem's fixed head."""
        if v is None:
            if self.v is None:
                raise ValueError(f"{name} is needed: this PromptProblem has no fixed head v")
            return self.v
        arr = as_float_array(v, name)
        if arr.ndim < 1 or arr.shape[-1] != self.d:
            raise ValueError(f"{name} must have shape ({self.d},) or (..., {self.d}), got {arr.shape}")
        return arr

    def check_tokens(self, tokens: ArrayLike | None, name: str = "tokens") -> NDArray[np.int64]:
        """Validate a selection α (one token index per sequence); None means the optimal tokens of v."""
        if tokens is None:
            return self.optimal_tokens()
        return check_selection(tokens, self.n, self.T, name)

    # ------------------------------------------------------------------ scores and attention
    def scores(self, v: ArrayLike | None = None) -> NDArray[np.float64]:
        """Token scores ``γ_it = y_i vᵀ x_it`` of shape (n, T) (or (..., n, T) for a batch of heads)."""
        vv = self.check_head(v)
        return self.y[:, None] * np.einsum("ntd,...d->...nt", self.X, vv)

    def optimal_tokens(
        self, v: ArrayLike | None = None, ties: Literal["raise", "first"] = "raise"
    ) -> NDArray[np.int64]:
        """``argmax_t γ_it`` (n,); a tie (scores within ``TIE_RTOL`` of the maximum, relative to the
        sequence's largest |score|, docs/spec.md §2) raises ValueError unless ``ties="first"``."""
        check_choice(ties, "ties", ("raise", "first"))
        g = self.scores(v)
        if g.ndim != 2:
            raise ValueError("optimal_tokens takes one head v of shape (d,)")
        if ties == "raise":
            tied = _tied_for_max(g).sum(axis=1) > 1
            if tied.any():
                raise ValueError(
                    f"v: the optimal token is not unique in sequences {np.flatnonzero(tied)[:10].tolist()}; "
                    "pass ties='first' or give the selection explicitly"
                )
        return np.argmax(g, axis=1).astype(np.int64)

    def logits(self, p: ArrayLike) -> NDArray[np.float64]:
        """Attention logits ``k_itᵀ p`` of shape (n, T), or (..., n, T) for a batch of prompts."""
        pp = self.check_prompt(p)
        return np.einsum("ntm,...m->...nt", self.keys, pp)

    def softmax(self, p: ArrayLike) -> NDArray[np.float64]:
        """Attention probabilities ``softmax(X_i W p)`` of shape (n, T) (or (..., n, T)), stably: when the
        logits overflow, from those of the keys and prompt scaled by powers of two to max |·| < 1 (exact),
        as :meth:`attsvm.problem.AttentionProblem.softmax` does, whose limit puts the mass on the maximisers."""
        with np.errstate(over="ignore", invalid="ignore"):
            g = self.logits(p)
        if np.isfinite(g).all():
            return _softmax_last(g)
        pp = self.check_prompt(p)
        eK = _exponent(self.keys, axis=(1, 2))[:, :, 0]  # (n, 1)
        eP = _exponent(pp, axis=-1)[..., None]  # (..., 1, 1)
        gh = np.einsum("ntm,...m->...nt", np.ldexp(self.keys, -eK[:, :, None]), np.ldexp(pp, -eP[..., 0]))
        return _softmax_last(gh, eK + eP)

    def output(self, p: ArrayLike, v: ArrayLike | None = None) -> NDArray[np.float64]:
        """``f(X_i) = vᵀ X_iᵀ softmax(X_i W p)`` of shape (n,) (broadcasting over leading batch axes)."""
        vv = self.check_head(v)
        s = self.softmax(p)
        return np.einsum("...nt,ntd,...d->...n", s, self.X, vv)


# ---------------------------------------------------------------------- instances
def paper_joint_problem(tight: bool = True) -> PromptProblem:
    """The joint-training instance of Tarzanagh et al. (2023), n = 3, T = 2, d = 2, W = I.

    Every sequence is ``[(0, 0), x_i]`` with x = (1, 1), (1, −1) and (0.5, 1) (``tight=True``: every
    selected token is a support vector of v's max-margin classifier) or (0.5, 1.5) (``tight=False``:
    the third is not), labels (+1, −1, +1).
    """
    tight = check_bool(tight, "tight")
    third = [0.5, 1.0] if tight else [0.5, 1.5]
    X = np.array([[[0.0, 0.0], [1.0, 1.0]], [[0.0, 0.0], [1.0, -1.0]], [[0.0, 0.0], third]])
    return PromptProblem(X, [1.0, -1.0, 1.0])


def paper_loss_problem(C: float) -> PromptProblem:
    """The loss-comparison instance of Tarzanagh et al. (2023): n = 2, T = 2, d = 3, fixed v = (0, 0, 1),
    W = diag(1, 1, 0), sequences ``[0, (1, 1, C)]`` and ``[0, (1, −1, 1)]``, both labelled +1.

    The second tokens are optimal with scores C and 1; the p-SVM direction is (1, 0, 0) whatever C.
    ``C`` must be a finite real number.
    """
    C = check_finite_scalar(C, "C")
    X = np.array([[[0.0, 0.0, 0.0], [1.0, 1.0, float(C)]], [[0.0, 0.0, 0.0], [1.0, -1.0, 1.0]]])
    return PromptProblem(X, [1.0, 1.0], W=np.diag([1.0, 1.0, 0.0]), v=[0.0, 0.0, 1.0])


def random_prompt_problem(
    n: int, T: int, d: int, *, seed: int = 0, fixed_head: bool = False, margin: float = 0.0
) -> PromptProblem:
    """A random instance: Gaussian tokens of scale 1/√d, labels ±1 at random, W = I.

    ``fixed_head=True`` draws a head v on the unit sphere too (for training p alone). ``margin > 0``
    plants one relevant token per sequence, ``x_{i0} = y_i·margin·u + noise`` for a random unit u, the
    data model of the joint-training theorem (the head can separate the relevant tokens); ``margin = 0``
    (the default) plants none, and a negative or non-finite margin is refused. ``seed`` is an integer in
    [0, 2**63).
    """
    n = check_positive_int(n, "n")
    T = check_positive_int(T, "T", minimum=2)
    d = check_positive_int(d, "d")
    seed = check_seed(seed)
    fixed_head = check_bool(fixed_head, "fixed_head")
    margin = check_finite_scalar(margin, "margin")
    if margin < 0:
        raise ValueError(f"margin must be >= 0 (0 plants no relevant token), got {margin}")
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, T, d)) / np.sqrt(d)
    y = rng.choice([-1.0, 1.0], size=n)
    if margin > 0:
        u = rng.standard_normal(d)
        u /= np.linalg.norm(u)
        X[:, 0] += y[:, None] * margin * u
    v = None
    if fixed_head:
        v = rng.standard_normal(d)
        v /= np.linalg.norm(v)
    return PromptProblem(X, y, v=v)
