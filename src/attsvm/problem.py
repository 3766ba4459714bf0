"""The attention-SVM instance: tokens, labels, queries and head (docs/spec.md §1–2).

An :class:`AttentionProblem` holds the data of one ERM instance

    f(X_i) = h(X_iᵀ softmax(X_i W z_i)),     i = 1..n,

with tokens ``X`` of shape (n, T, d), labels ``y``, the query ``z_i`` of each sequence (given as ``Z``
for cross-attention, or ``z_i = X[i, query_index]`` for self-attention) and a head ``h``. It computes
the token scores γ (docs/spec.md §2) and the optimal tokens, and validates everything on construction so
that downstream solvers and trainers never see malformed input.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._validation import as_float_array, check_choice, check_labels, check_selection, check_tokens

__all__ = [
    "AttentionProblem",
    "Head",
    "MLP",
    "ACTIVATIONS",
    "activation_fn",
    "TieError",
    "HeadKind",
    "LossName",
    "LOSSES",
    "loss_fn",
    "optimal_tokens_together",
]

HeadKind = Literal["linear", "relu", "multiclass", "mlp"]
# activations of an MLP head (docs/spec.md §5): "swiglu" gates its first layer, silu(gate) ⊙ up
ACTIVATIONS: tuple[str, ...] = ("relu", "gelu", "silu", "swiglu")
LossName = Literal["logistic", "exponential", "correlation"]
LOSSES: tuple[str, ...] = ("logistic", "exponential", "correlation")
TIES: tuple[str, ...] = ("raise", "first")

# Tolerance under which two token scores count as a tie for the maximum (docs/spec.md §2), relative to
# the largest |score| of the sequence (so that scaling X or the head changes no verdict).
TIE_RTOL = 1e-12


def _tied_for_max(g: NDArray[np.float64]) -> NDArray[np.bool_]:
    """Boolean (..., T): the scores of each row within ``TIE_RTOL`` of the row's maximum, relative to the
    row's largest |score| (docs/spec.md §2). A row with more than one True has a tie for the maximum."""
    top = g.max(axis=-1, keepdims=True)
    return np.abs(g - top) <= TIE_RTOL * np.abs(g).max(axis=-1, keepdims=True)


# elements of tokens that optimal_tokens_together stacks at a time (64 MB of float64)
_STACK_ELEMENTS = 1 << 23


def optimal_tokens_together(problems: Sequence[Any]) -> list[NDArray[np.int64] | None]:
    """``p.optimal_tokens()`` of each :class:`AttentionProblem` with a linear head, computed in one stacked pass
    per shape (n, T, d): a sweep of thousands of small problems would spend more in the per-problem calls than
    in solving them. The same argmax of the same scores (a tie is judged as :func:`optimal_tokens` judges it).
    None for any other entry and for a problem with a tie for the maximum: its own ``optimal_tokens()`` names
    the tie (raises the :class:`TieError`)."""
    out: list[NDArray[np.int64] | None] = [None] * len(problems)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(problems):
        if type(p) is AttentionProblem and p.head.kind == "linear":
            groups.setdefault(p.X.shape, []).append(i)
    for shape, group in groups.items():
        step = max(1, _STACK_ELEMENTS // math.prod(shape))  # (the stacked copy of X stays below 64 MB)
        for start in range(0, len(group), step):
            members = group[start : start + step]
            X = np.stack([problems[i].X for i in members])  # (R, n, T, d)
            v = np.stack([problems[i].head.weights for i in members])  # (R, d)
            y = np.stack([problems[i].y for i in members])  # (R, n)
            g = y[:, :, None] * np.einsum("rntd,rd->rnt", X, v)  # (R, n, T) scores
            opt = np.argmax(g, axis=-1).astype(np.int64)
            clean = ~(_tied_for_max(g).sum(axis=-1) > 1).any(axis=-1)
            for j, i in enumerate(members):
                if clean[j]:
                    out[i] = opt[j]
    return out


class TieError(ValueError):
    """Raised when some sequence has several tokens sharing the maximal score (docs/spec.md §2).

    ``sequences`` lists the offending sequence indices and ``tied`` the tied token indices of each.
    """

    def __init__(self, sequences: list[int], tied: list[list[int]]):
        self.sequences = sequences
        self.tied = tied
        shown = ", ".join(f"sequence {i}: tokens {t}" for i, t in list(zip(sequences, tied))[:10])
        more = "" if len(sequences) <= 10 else f" (and {len(sequences) - 10} more)"
        super().__init__(
            f"the optimal token is not unique in {len(sequences)} sequence(s) ({shown}{more}); "
            "the theory assumes a strict maximum. Pass ties='first' to take the first maximiser, "
            "or give the token selection explicitly."
        )


def loss_fn(name: str, u: NDArray[np.float64]) -> NDArray[np.float64]:
    """Evaluate a loss ℓ(u) of docs/spec.md §1 in a form that stays finite for huge |u|.

    logistic: log(1 + e^{−u}) as a stable softplus; exponential: e^{−u} (clipped exponent, so
    it overflows to a large finite number rather than inf); correlation: −u.
    """
    check_choice(name, "loss", LOSSES)
    u = np.asarray(u, dtype=np.float64)
    if name == "logistic":
        return np.logaddexp(0.0, -u)
    if name == "exponential":
        return np.exp(np.minimum(-u, 700.0))
    return -u


def activation_fn(name: str, a: NDArray[np.float64]) -> NDArray[np.float64]:
    """The elementwise activation ``name`` (relu, gelu (exact, erf form), silu) in numpy."""
    if name == "relu":
        return np.maximum(a, 0.0)
    if name == "gelu":
        from scipy.special import erf

        return 0.5 * a * (1.0 + erf(a / np.sqrt(2.0)))
    if name == "silu":
        return a * (0.5 * (1.0 + np.tanh(0.5 * a)))  # a·σ(a), overflow-free
    raise ValueError(f"activation must be one of relu, gelu, silu, got {name!r}")


@dataclass(frozen=True)
class MLP:
    """The layers after the first of an MLP head (docs/spec.md §5; see :meth:`Head.mlp`).

    activation : one of :data:`ACTIVATIONS`; hidden : matrices (k_l, k_{l+1}) of the later hidden layers;
    out : (k_L,) output weights; width : k_1, the first hidden width (for SwiGLU the first-layer matrix
    holds ``[up | gate]``, 2·k_1 columns).
    """

    activation: str
    hidden: tuple[NDArray[np.float64], ...]
    out: NDArray[np.float64]
    width: int

    @property
    def depth(self) -> int:
        """Number of hidden layers."""
        return 1 + len(self.hidden)

    def rest(self, a: NDArray[np.float64]) -> NDArray[np.float64]:
        """The head from its first-layer pre-activations a (..., k) to its output (...)."""
        act = "silu" if self.activation == "swiglu" else self.activation
        if self.activation == "swiglu":
            z = activation_fn("silu", a[..., self.width :]) * a[..., : self.width]
        else:
            z = activation_fn(act, a)
        for H in self.hidden:
            z = activation_fn(act, z @ H)
        return z @ self.out


@dataclass(frozen=True)
class Head:
    """A prediction head h (docs/spec.md §1, §5).

    * ``linear``: h(x) = vᵀx with ``weights`` of shape (d,).
    * ``relu``: h(x) = 1ᵀ ReLU(Vᵀx) with ``weights`` V of shape (d, k).
    * ``multiclass``: logits Vᵀx with ``weights`` V of shape (d, C), trained with cross-entropy.
    * ``mlp``: h(x) = wᵀ σ(H_Lᵀ … σ(V₁ᵀx)) with one or more hidden layers and GeLU, SiLU, ReLU or
      SwiGLU (:meth:`mlp`); ``weights`` is the first layer, the rest is ``mlp`` (:class:`MLP`).
    """

    kind: HeadKind
    weights: NDArray[np.float64]
    mlp_spec: MLP | None = None

    @classmethod
    def mlp(
        cls,
        V: ArrayLike,
        *,
        activation: str = "gelu",
        hidden: Sequence[ArrayLike] = (),
        out: ArrayLike | None = None,
        gate: ArrayLike | None = None,
    ) -> Head:
        """An MLP head ``h(x) = outᵀ σ(hidden[-1]ᵀ … σ(Vᵀx))`` (docs/spec.md §5).

        Parameters
        ----------
        V : (d, k) first layer (the "up" projection for SwiGLU).
        activation : "gelu" (exact), "silu", "relu" or "swiglu" (first layer ``silu(gateᵀx) ⊙ Vᵀx``,
            later layers SiLU).
        hidden : matrices (k_l, k_{l+1}) of further hidden layers (depth = 1 + len(hidden)).
        out : (k_L,) output weights (default all ones, as the ReLU head's ``1ᵀ``).
        gate : (d, k) the SwiGLU gate (required for, and only for, "swiglu").
        """
        check_choice(activation, "activation", ACTIVATIONS)
        V = as_float_array(V, "V", ndim=2)
        d, k = V.shape
        if k < 1:
            raise ValueError(f"V must have a hidden width of at least 1 column, got shape {V.shape}")
        if activation == "swiglu":
            if gate is None:
                raise ValueError("gate is required for activation='swiglu' (shape (d, k), like V)")
            G = as_float_array(gate, "gate", shape=(d, k))
            first = np.concatenate([V, G], axis=1)
        else:
            if gate is not None:
                raise ValueError(f"gate is only for activation='swiglu', got activation={activation!r}")
            first = V
        layers = []
        width = k
        for j, H in enumerate(hidden):
            Hj = as_float_array(H, f"hidden[{j}]", ndim=2)
            if Hj.shape[0] != width or Hj.shape[1] < 1:
                raise ValueError(
                    f"hidden[{j}] must have shape ({width}, k) with k >= 1 (it follows a layer of width {width}), "
                    f"got {Hj.shape}"
                )
            layers.append(Hj)
            width = Hj.shape[1]
        o = np.ones(width) if out is None else as_float_array(out, "out", shape=(width,))
        return cls("mlp", first, MLP(activation, tuple(layers), o, k))

    @classmethod
    def linear(cls, v: ArrayLike) -> Head:
        return cls("linear", as_float_array(v, "v", ndim=1))

    @classmethod
    def relu(cls, V: ArrayLike) -> Head:
        return cls("relu", as_float_array(V, "V", ndim=2))

    @classmethod
    def multiclass(cls, V: ArrayLike) -> Head:
        V = as_float_array(V, "V", ndim=2)
        if V.shape[1] < 2:
            raise ValueError(f"V of a multiclass head must have at least 2 columns (classes), got {V.shape}")
        return cls("multiclass", V)

    @property
    def d(self) -> int:
        return int(self.weights.shape[0])

    @property
    def n_classes(self) -> int | None:
        return int(self.weights.shape[1]) if self.kind == "multiclass" else None

    def __call__(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """Apply the head to vectors ``x`` of shape (..., d): (...) or (..., C) for multiclass."""
        if self.kind == "linear":
            return x @ self.weights
        if self.kind == "relu":
            return np.maximum(x @ self.weights, 0.0).sum(axis=-1)
        if self.kind == "mlp":
            assert self.mlp_spec is not None
            return self.mlp_spec.rest(x @ self.weights)
        return x @ self.weights


class _TokenShape:
    """``n``, ``T``, ``d`` of a problem whose tokens ``X`` have shape (n, T, d) (docs/spec.md §1)."""

    X: NDArray[np.float64]

    @property
    def n(self) -> int:
        return int(self.X.shape[0])

    @property
    def T(self) -> int:
        return int(self.X.shape[1])

    @property
    def d(self) -> int:
        return int(self.X.shape[2])


class AttentionProblem(_TokenShape):
    """One attention-ERM instance (docs/spec.md §1).

    Parameters
    ----------
    X : array of shape (n, T, d)
        Tokens; ``T >= 2``.
    y : array of shape (n,)
        Labels in {−1, +1} (linear and ReLU heads) or class indices 0..C−1 (multiclass head).
    v : array of shape (d,) or Head
        The linear head vector, or a :class:`Head` for the nonlinear / multiclass heads.
    Z : array of shape (n, d), optional
        Cross-attention queries ``z_i``. Exactly one of ``Z`` and ``query_index`` must be given.
    query_index : int, optional
        Self-attention: ``z_i = X[i, query_index]`` (the paper's ``x_1`` / ``x_CLS``).
    loss : {"logistic", "exponential", "correlation"}
        ℓ used for nonlinear-head token scores (docs/spec.md §2) and as the trainer's default.

    Attributes
    ----------
    X, y, Z, query_index, head, loss
        The validated data (float64 copies; ``Z`` is None for self-attention).
    n, T, d : int
    """

    def __init__(
        self,
        X: ArrayLike,
        y: ArrayLike,
        v: ArrayLike | Head,
        *,
        Z: ArrayLike | None = None,
        query_index: int | None = None,
        loss: LossName = "logistic",
    ) -> None:
        X = check_tokens(X)
        n, T, d = X.shape
        self.loss: str = check_choice(loss, "loss", LOSSES)

        if isinstance(v, Head):
            head = v
        else:
            head = Head.linear(as_float_array(v, "v", ndim=1))
        if head.d != d:
            raise ValueError(f"the head expects d={head.d} features but X has d={d} (X shape {X.shape})")
        self.head: Head = head

        y_arr = check_labels(y, n, binary=head.kind != "multiclass")
        if head.kind == "multiclass":
            C = head.n_classes
            assert C is not None
            if not np.all((y_arr == np.round(y_arr)) & (y_arr >= 0) & (y_arr < C)):
                raise ValueError(
                    f"y must hold class indices in 0..{C - 1} for a multiclass head, got values {np.unique(y_arr)[:10]}"
                )

        if (Z is None) == (query_index is None):
            raise ValueError(
                "give exactly one of Z (cross-attention queries, shape (n, d)) and "
                f"query_index (self-attention); got Z={'None' if Z is None else 'array'}, "
                f"query_index={query_index!r}"
            )
        if Z is not None:
            Z_arr: NDArray[np.float64] | None = as_float_array(Z, "Z", shape=(n, d))
            qi: int | None = None
        else:
            if isinstance(query_index, bool) or not isinstance(query_index, (int, np.integer)):
                raise TypeError(f"query_index must be an integer token index, got {query_index!r}")
            if not -T <= int(query_index) < T:
                raise ValueError(f"query_index must be in [0, {T}) (a token index), got {query_index}")
            Z_arr, qi = None, int(query_index) % T
        self.X: NDArray[np.float64] = X
        self.y: NDArray[np.float64] = y_arr
        self.Z: NDArray[np.float64] | None = Z_arr
        self.query_index: int | None = qi
        for arr in (self.X, self.y) + ((self.Z,) if self.Z is not None else ()):
            arr.setflags(write=False)

    # ------------------------------------------------------------------ shapes and views
    @property
    def self_attention(self) -> bool:
        return self.Z is None

    @property
    def v(self) -> NDArray[np.float64] | None:
        """The linear head vector (None for other heads)."""
        return self.head.weights if self.head.kind == "linear" else None

    @property
    def queries(self) -> NDArray[np.float64]:
        """The query ``z_i`` of every sequence, shape (n, d)."""
        if self.Z is not None:
            return self.Z
        assert self.query_index is not None
        return self.X[:, self.query_index, :]

    def __repr__(self) -> str:
        mode = "cross" if self.Z is not None else f"self(query_index={self.query_index})"
        return f"AttentionProblem(n={self.n}, T={self.T}, d={self.d}, {mode}, head={self.head.kind})"

    # ------------------------------------------------------------------ scores (docs/spec.md §2)
    @property
    def scores(self) -> NDArray[np.float64]:
        """Token scores γ of shape (n, T) (docs/spec.md §2).

        Linear head: ``γ_it = y_i vᵀx_it``. Other heads: ``γ_it = −ℓ(y_i h(x_it))`` (the loss the
        sequence would have with all attention on token t); multiclass: minus the cross-entropy.
        """
        out = self.head(self.X)  # (n, T) or (n, T, C)
        if self.head.kind == "linear":
            return self.y[:, None] * out
        if self.head.kind in ("relu", "mlp"):
            return -loss_fn(self.loss, self.y[:, None] * out)
        # multiclass: log-softmax of the true class, stable
        logits = out
        m = logits.max(axis=-1, keepdims=True)
        lse = m[..., 0] + np.log(np.exp(logits - m).sum(axis=-1))
        true = np.take_along_axis(logits, self.y.astype(int)[:, None, None].repeat(self.T, 1), axis=-1)[..., 0]
        return true - lse

    def optimal_tokens(self, ties: Literal["raise", "first"] = "raise") -> NDArray[np.int64]:
        """``opt_i = argmax_t γ_it`` of shape (n,) (docs/spec.md §2).

        A tie for the maximum (scores within ``TIE_RTOL`` of the largest, relative to the sequence's
        largest |score|) breaks the theory's assumption: by default a :class:`TieError` names the
        sequences concerned; ``ties="first"`` takes the first maximiser instead.
        """
        check_choice(ties, "ties", TIES)
        g = self.scores
        opt = np.argmax(g, axis=1).astype(np.int64)
        if ties == "raise":
            close = _tied_for_max(g)  # (n, T)
            counts = close.sum(axis=1)
            if np.any(counts > 1):
                seqs = [int(i) for i in np.flatnonzero(counts > 1)]
                raise TieError(seqs, [[int(t) for t in np.flatnonzero(close[i])] for i in seqs])
        return opt

    def check_tokens(self, tokens: ArrayLike | None, name: str = "tokens") -> NDArray[np.int64]:
        """Validate a token selection α (one index per sequence); None means the optimal tokens."""
        if tokens is None:
            return self.optimal_tokens()
        return check_selection(tokens, self.n, self.T, name)

    # ------------------------------------------------------------------ attention
    def logits(self, W: ArrayLike) -> NDArray[np.float64]:
        """Attention logits ``x_itᵀ W z_i`` of shape (n, T) for one W (d, d) or a batch (R, d, d)."""
        W = as_float_array(W, "W")
        if W.shape[-2:] != (self.d, self.d) or W.ndim not in (2, 3):
            raise ValueError(f"W must have shape ({self.d}, {self.d}) or (R, {self.d}, {self.d}), got {W.shape}")
        u = np.einsum("...de,ne->...nd", W, self.queries)  # (..., n, d): W z_i
        return np.einsum("ntd,...nd->...nt", self.X, u)

    def softmax(self, W: ArrayLike) -> NDArray[np.float64]:
        """Attention probabilities ``s_it`` of shape (n, T) (or (R, n, T)), computed stably: when the
        logits overflow (W, X or the queries so large that ``x_itᵀ W z_i`` is not a float), from the
        logits ``ĝ`` of the parts scaled by powers of two to max |·| ≤ 1 (W/2^a, X_i/2^b_i, z_i/2^c_i,
        exact) as ``exp(2^(a+b_i+c_i)·(ĝ − max ĝ))``, whose limit puts the mass on the maximisers."""
        g, e = self.scaled_logits(W)
        return _softmax_last(g, e)

    def scaled_logits(self, W: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.intc] | None]:
        """The logits as ``(g, e)`` with ``logits = 2^e · g``: ``(logits, None)`` when they are finite; else,
        when they overflow (W, X or the queries so large that ``x_itᵀ W z_i`` is not a float), the logits
        ``ĝ`` of the parts scaled by powers of two to max |·| ≤ 1 (W/2^a, X_i/2^b_i, z_i/2^c_i, exact) and
        ``e = a + b_i + c_i`` (..., n, 1), one exponent per sequence, so that comparisons within a
        sequence (argmax, margins) are those of the true logits."""
        with np.errstate(over="ignore", invalid="ignore"):
            g = self.logits(W)
        if np.isfinite(g).all():
            return g, None
        Wa = np.asarray(W, dtype=np.float64)  # (finite: logits' as_float_array refused inf)
        eW = _exponent(Wa, axis=(-2, -1))  # (..., 1, 1)
        eX = _exponent(self.X, axis=(1, 2))[:, :, 0]  # (n, 1)
        Q = self.queries
        eQ = _exponent(Q, axis=1)  # (n, 1)
        u = np.einsum("...de,ne->...nd", np.ldexp(Wa, -eW), np.ldexp(Q, -eQ))  # (..., n, d)
        gh = np.einsum("ntd,...nd->...nt", np.ldexp(self.X, -eX[:, :, None]), u)  # |ĝ| ≤ d²
        return gh, eW + eX + eQ

    # ------------------------------------------------------------------ persistence
    def to_npz(self, path: str | Path) -> None:
        """Save to a ``.npz`` file readable by :meth:`from_npz` and ``attsvm solve --input``."""
        arrays: dict[str, NDArray] = {
            "X": self.X,
            "y": self.y,
            "head_kind": np.array(self.head.kind),
            "head_weights": self.head.weights,
            "loss": np.array(self.loss),
        }
        spec = self.head.mlp_spec
        if spec is not None:
            arrays["mlp_activation"] = np.array(spec.activation)
            arrays["mlp_out"] = spec.out
            arrays["mlp_width"] = np.array(spec.width)
            for j, H in enumerate(spec.hidden):
                arrays[f"mlp_hidden_{j}"] = H
        if self.Z is not None:
            arrays["Z"] = self.Z
        else:
            arrays["query_index"] = np.array(self.query_index)
        np.savez(path, **arrays)  # type: ignore[arg-type]

    @classmethod
    def from_npz(cls, path: str | Path) -> AttentionProblem:
        """Load an instance from ``.npz`` with arrays ``X``, ``y``, ``v`` (or ``head_kind`` +
        ``head_weights``) and ``Z`` or ``query_index``."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"input file {str(path)!r} does not exist")
        try:
            with np.load(path, allow_pickle=False) as f:
                keys = set(f.files)
                missing = {"X", "y"} - keys
                if missing:
                    raise ValueError(
                        f"{path} must contain arrays X and y; missing {sorted(missing)} (has {sorted(keys)})"
                    )

                def need(*names: str) -> None:
                    absent = [x for x in names if x not in keys]
                    if absent:
                        raise ValueError(
                            f"{path} must contain arrays {list(names)}; missing {absent} (has {sorted(keys)})"
                        )

                if "head_kind" in keys:
                    kind = str(f["head_kind"])
                    kinds = ("linear", "relu", "multiclass", "mlp")
                    if kind not in kinds:
                        raise ValueError(f"{path}: head_kind must be one of {kinds}, got {kind!r}")
                    need("head_weights")
                    w = f["head_weights"]
                    if kind == "mlp":
                        need("mlp_activation", "mlp_width", "mlp_out")
                        act, k = str(f["mlp_activation"]), _npz_int(f["mlp_width"], path, "mlp_width")
                        cols = k * (2 if act == "swiglu" else 1)  # (a SwiGLU head stores its gate after W)
                        if w.ndim != 2 or w.shape[1] != cols:
                            raise ValueError(
                                f"{path}: mlp_width {k} contradicts head_weights of shape {w.shape} (a {act} head "
                                f"of width {k} has {cols} columns)"
                            )
                        n_hidden = len([x for x in keys if x.startswith("mlp_hidden_")])
                        hidden = [f[f"mlp_hidden_{j}"] for j in range(n_hidden)]
                        head: Head = Head.mlp(
                            w[:, :k],
                            activation=act,
                            hidden=hidden,
                            out=f["mlp_out"],
                            gate=w[:, k:] if act == "swiglu" else None,
                        )
                    else:
                        head = {"linear": Head.linear, "relu": Head.relu, "multiclass": Head.multiclass}[kind](w)
                elif "v" in keys:
                    head = Head.linear(f["v"])
                else:
                    raise ValueError(f"{path} must contain the head: array v (linear) or head_kind + head_weights")
                Z = f["Z"] if "Z" in keys else None
                qi = _npz_int(f["query_index"], path, "query_index") if "query_index" in keys else None
                loss = str(f["loss"]) if "loss" in keys else "logistic"
                return cls(f["X"], f["y"], head, Z=Z, query_index=qi, loss=loss)  # type: ignore[arg-type]
        except ValueError as exc:  # (numpy's refusal of an object array: "... when allow_pickle=False")
            if "allow_pickle" not in str(exc):
                raise
            with np.load(path, allow_pickle=False) as f:
                pickled = [k for k in f.files if _npz_is_pickled(f, k)]
            raise ValueError(
                f"{path} holds pickled Python objects (arrays {pickled}), which attsvm never loads "
                "(unpickling can run arbitrary code); save plain numeric arrays, as AttentionProblem.to_npz does"
            ) from None


def _softmax_last(g: NDArray[np.float64], exps: NDArray[np.intc] | None = None) -> NDArray[np.float64]:
    """Softmax over the last axis of the finite logits ``g``, or of ``2^exps · g`` (the logits of parts
    scaled by powers of two): ``exp(2^exps·(g − max g))``, where ``g − max g ≤ 0`` so that an overflow is
    −inf, e^−inf = 0, and the maximisers keep their mass (the limit distribution)."""
    d = g - g.max(axis=-1, keepdims=True)
    with np.errstate(over="ignore"):
        e = np.exp(d if exps is None else np.ldexp(d, exps))
    return e / e.sum(axis=-1, keepdims=True)


def _exponent(a: NDArray[np.float64], axis: int | tuple[int, ...]) -> NDArray[np.intc]:
    """The exponent e with ``max |a| < 2^e`` over ``axis`` (kept), 0 for zeros: ``a / 2^e`` is exact
    (bar entries that fall below the normal range, negligible beside the largest)."""
    return np.frexp(np.abs(a).max(axis=axis, keepdims=True))[1]


def _npz_is_pickled(f: np.lib.npyio.NpzFile, key: str) -> bool:
    """Whether array ``key`` of the opened ``.npz`` archive ``f`` is an object (pickled) array."""
    try:
        f[key]
    except ValueError as exc:
        return "allow_pickle" in str(exc)
    return False


def _npz_int(value: NDArray, path: Path, name: str) -> int:
    """A scalar integer array of an ``.npz`` file as an int, or a ValueError naming the file and array.

    A 1-element array of shape (1,) counts as a scalar (``np.savez`` of ``[k]`` stores one)."""
    if value.shape not in ((), (1,)) or not (
        np.issubdtype(value.dtype, np.integer) and not np.issubdtype(value.dtype, np.bool_)
    ):
        raise ValueError(
            f"{path}: {name} must be a scalar integer, got {value.dtype} of shape {value.shape} "
            "(a scalar: shape () or (1,))"
        )
    return int(value.reshape(()))


def check_problem(value: object, name: str = "problem") -> AttentionProblem:
    """``value`` if it is an :class:`AttentionProblem`, else a TypeError naming ``name``."""
    if not isinstance(value, AttentionProblem):
        raise TypeError(f"{name} must be an AttentionProblem, got {type(value).__name__}")
    return value
