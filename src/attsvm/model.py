"""One-layer attention ``f(X_i) = h(X_iᵀ softmax(X_i W z_i))`` in PyTorch, batched over runs (docs/spec.md §1).

Two layers of the same model live here:

* :class:`Batch` — the data of R runs as tensors (tokens, queries, labels, head), built from one or
  several :class:`~attsvm.problem.AttentionProblem` (shared data broadcast over runs, so a batch of
  R initialisations of one instance stores its tokens once).
* Pure functions of ``(batch, W)``: :func:`attention_logits`, :func:`attention_probs`,
  :func:`head_outputs`, :func:`sequence_losses`, and :func:`risk_and_grad`, the trainer's analytic
  gradient in a round-off-stable form (see its docstring).
* :class:`Parameterization` — :class:`FullW` or :class:`FactoredKQ` (``W = K Qᵀ``): the trained
  tensors as groups, their weights, gradient map and initialisations (the trainer's and the model's).
* :class:`AttentionModel` — a thin ``nn.Module`` holding the groups of a parameterisation; its forward
  returns outputs and attention probabilities and stores nothing.

Conventions. Logits are ``x_itᵀ W z_i``. The published code computes ``z_iᵀ W_lin x_it`` with an
``nn.Linear`` weight ``W_lin``, i.e. ``W = W_linᵀ``; for (K, Q) it computes ``(W_q z_i)ᵀ (W_k x_it)``,
i.e. ``K = W_kᵀ``, ``Q = W_qᵀ`` (both d × m) and ``W = K Qᵀ = W_kᵀ W_q``. The head is fixed (not
trained), as in the paper. Everything is float64 unless asked otherwise.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor, nn

from ._validation import as_float_array, check_choice, check_finite_scalar, check_positive_int
from .problem import AttentionProblem

__all__ = [
    "Batch",
    "AttentionModel",
    "Param",
    "TrainLoss",
    "PARAMS",
    "TRAIN_LOSSES",
    "attention_logits",
    "attention_probs",
    "head_outputs",
    "sequence_losses",
    "risk",
    "risk_and_grad",
    "risk_and_scaled_grad",
    "factor_grads",
    "resolve_loss",
    "EXP_CLIP",
    "Parameterization",
    "FullW",
    "FactoredKQ",
    "parameterization",
]

logger = logging.getLogger(__name__)

Param = Literal["W", "KQ"]
TrainLoss = Literal["logistic", "exponential", "correlation", "cross_entropy"]
PARAMS: tuple[str, ...] = ("W", "KQ")
TRAIN_LOSSES: tuple[str, ...] = ("logistic", "exponential", "correlation", "cross_entropy")
SCALAR_LOSSES: tuple[str, ...] = ("logistic", "exponential", "correlation")
HEADS: tuple[str, ...] = ("linear", "relu", "multiclass", "mlp")


def check_float_dtype(dtype: Any, name: str = "dtype") -> torch.dtype:
    """A floating torch dtype (torch.float64, torch.float32, ...): TypeError naming ``name`` otherwise."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating torch dtype such as torch.float64, got {dtype!r}")
    return dtype


def check_device(device: torch.device | str | None, name: str = "device") -> torch.device:
    """``device`` (None: the CPU) as a torch device that this machine has, or a ValueError naming ``name``."""
    if device is None:
        return torch.device("cpu")
    if not isinstance(device, (str, torch.device)):
        # (a bare index is refused: torch reads it as "the current accelerator", CUDA, MPS or none)
        raise TypeError(
            f"{name} must be a torch device or its name ('cpu', 'cuda', 'cuda:N' for the CUDA device of "
            f"index N, 'mps'), got {type(device).__name__} {device!r}"
        )
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(f"{name}={device!r} is not a torch device (e.g. cpu, cuda, cuda:0, mps)") from None
    mps = getattr(torch.backends, "mps", None)
    available = {
        "cpu": True,
        "cuda": torch.cuda.is_available(),
        "mps": bool(mps is not None and mps.is_available()),
    }
    if not available.get(dev.type, False):
        why = " (torch.cuda.is_available() is False)" if dev.type == "cuda" else ""
        raise ValueError(f"{name}={device!r} is not available on this machine{why}")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"{name}={device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev


# The exponential loss e^{−u} is evaluated as e^{min(−u, EXP_CLIP)}: a huge finite number rather than
# inf when the margin is hopelessly negative (the same clip as problem.loss_fn).
EXP_CLIP = 700.0


def resolve_loss(loss: str | None, head_kind: str) -> str:
    """The training loss for a head: ``None`` → the head's natural loss; checks compatibility.

    Scalar heads (linear, ReLU) take logistic / exponential / correlation; the multiclass head
    takes cross-entropy only (docs/spec.md §1).
    """
    check_choice(head_kind, "head_kind", HEADS)
    if loss is None:
        return "cross_entropy" if head_kind == "multiclass" else "logistic"
    check_choice(loss, "loss", TRAIN_LOSSES)
    if head_kind == "multiclass" and loss != "cross_entropy":
        raise ValueError(f"loss must be 'cross_entropy' for a multiclass head, got {loss!r}")
    if head_kind != "multiclass" and loss == "cross_entropy":
        raise ValueError(
            f"loss='cross_entropy' needs a multiclass head; this head is {head_kind!r} "
            f"(use one of {', '.join(repr(x) for x in SCALAR_LOSSES)})"
        )
    return loss


@dataclass(frozen=True)
class Batch:
    """The data of R runs as tensors; the leading axis B is 1 (shared by every run) or R.

    Attributes
    ----------
    X : Tensor (B, n, T, d)
        Tokens.
    Z : Tensor (B, n, d)
        Queries ``z_i`` (for self-attention, ``X[:, :, query_index]``).
    y : Tensor (B, n)
        Labels ±1 (linear, ReLU) or class indices as floats (multiclass).
    V : Tensor (B, d, k)
        Head weights: ``v`` as one column (linear), V (ReLU), V (d, C) (multiclass).
    head : {"linear", "relu", "multiclass", "mlp"}
    loss : {"logistic", "exponential", "correlation", "cross_entropy"}
    mlp_act, mlp_hidden, mlp_out, mlp_width : an MLP head's activation, later hidden layers (each
        (B, k_l, k_{l+1})), output weights (B, k_L) and first hidden width (``V`` is its first layer;
        for SwiGLU ``V = [up | gate]``). None / () for other heads.
    """

    X: Tensor
    Z: Tensor
    y: Tensor
    V: Tensor
    head: str
    loss: str
    XV: Tensor = field(init=False, repr=False)
    mlp_act: str | None = None
    mlp_hidden: tuple[Tensor, ...] = ()
    mlp_out: Tensor | None = None
    mlp_width: int = 0

    def __post_init__(self) -> None:
        for name in ("X", "Z", "y", "V"):
            value = getattr(self, name)
            if not isinstance(value, Tensor):
                raise TypeError(
                    f"Batch.{name} must be a torch tensor (Batch.from_problems), got {type(value).__name__}"
                )
        if self.X.ndim != 4 or not self.X.dtype.is_floating_point:
            raise ValueError(
                f"Batch.X must be a floating tensor (B, n, T, d), got {self.X.dtype} of shape {tuple(self.X.shape)}"
            )
        check_choice(self.head, "head", HEADS)
        check_choice(self.loss, "loss", TRAIN_LOSSES)
        # (B, n, T, k) head pre-activations of single tokens, x_itᵀ V: the whole head computation of
        # the trainer runs on this table, never on the (R, n, d) attention outputs
        object.__setattr__(self, "XV", self.X @ self.V.unsqueeze(1))

    @property
    def n(self) -> int:
        return int(self.X.shape[1])

    @property
    def T(self) -> int:
        return int(self.X.shape[2])

    @property
    def d(self) -> int:
        return int(self.X.shape[3])

    @property
    def size(self) -> int:
        """B: 1 when the data is shared by every run."""
        return int(self.X.shape[0])

    @classmethod
    def from_problems(
        cls,
        problems: AttentionProblem | Sequence[AttentionProblem],
        *,
        loss: str | None = None,
        repeat: int = 1,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float64,
    ) -> Batch:
        """Stack P problems (same n, T, d, head kind and head shape) into a batch.

        Each problem is repeated ``repeat`` times consecutively (run ``r`` uses problem ``r // repeat``),
        so B = P·repeat — except that a single problem is kept once (B = 1) and broadcast.
        ``loss=None`` uses each problem's loss for scalar heads (they must agree) and cross-entropy
        for the multiclass head.
        """
        probs = _as_problem_list(problems)
        repeat = check_positive_int(repeat, "repeat")
        dtype = check_float_dtype(dtype)
        device = check_device(device)
        p0 = probs[0]
        for j, p in enumerate(probs[1:], start=1):
            if (p.n, p.T, p.d) != (p0.n, p0.T, p0.d):
                raise ValueError(
                    f"problems must share (n, T, d): problems[0] has {(p0.n, p0.T, p0.d)}, "
                    f"problems[{j}] has {(p.n, p.T, p.d)}"
                )
            if p.head.kind != p0.head.kind or p.head.weights.shape != p0.head.weights.shape:
                raise ValueError(
                    f"problems must share the head kind and shape: problems[0] has "
                    f"{p0.head.kind} {p0.head.weights.shape}, problems[{j}] has "
                    f"{p.head.kind} {p.head.weights.shape}"
                )
            if _mlp_signature(p) != _mlp_signature(p0):
                raise ValueError(
                    f"problems must share the MLP head's activation and layer shapes: problems[0] has "
                    f"{_mlp_signature(p0)}, problems[{j}] has {_mlp_signature(p)}"
                )
        if loss is None and p0.head.kind != "multiclass":
            losses = {p.loss for p in probs}
            if len(losses) > 1:
                raise ValueError(f"problems disagree on the loss ({sorted(losses)}); pass loss= explicitly")
            loss = p0.loss
        loss = resolve_loss(loss, p0.head.kind)

        def stack(arrs: list[np.ndarray]) -> Tensor:
            a = np.stack(arrs)
            if len(probs) > 1 and repeat > 1:
                a = np.repeat(a, repeat, axis=0)
            return torch.as_tensor(a, dtype=dtype, device=device)

        V = [p.head.weights.reshape(p.d, -1) for p in probs]
        mlp: dict[str, Any] = {}
        spec0 = p0.head.mlp_spec
        if spec0 is not None:
            specs = [p.head.mlp_spec for p in probs]
            mlp = {
                "mlp_act": spec0.activation,
                "mlp_hidden": tuple(stack([sp.hidden[j] for sp in specs]) for j in range(len(spec0.hidden))),  # type: ignore[union-attr]
                "mlp_out": stack([sp.out for sp in specs]),  # type: ignore[union-attr]
                "mlp_width": spec0.width,
            }
        return cls(
            X=stack([p.X for p in probs]),
            Z=stack([p.queries for p in probs]),
            y=stack([p.y for p in probs]),
            V=stack(V),
            head=p0.head.kind,
            loss=loss,
            **mlp,
        )


def check_gradient_scale(problems: Sequence[AttentionProblem]) -> None:
    """Refuse data so large that the trainer's (scaled) gradient ``Σ_it δ'_it x_it z_iᵀ`` overflows float64
    (:func:`risk_and_scaled_grad`): its terms are up to ``2·max|x_itᵀV|·max|x|·max|z|`` (times ``nT``),
    which past ~1e307 would give inf − inf = NaN steps. The data must be rescaled (the SVM solvers
    rescale internally; GD is not scale-invariant, so the trainer cannot)."""
    for j, p in enumerate(problems):
        x, z, v = (float(np.abs(a).max()) for a in (p.X, p.queries, p.head.weights))
        with np.errstate(divide="ignore"):  # (log10 of a zero: −inf, accepted)
            # terms up to 2nT · max|x_itᵀV| · max|x| · max|z|, with max|x_itᵀV| ≤ d · max|v| · max|x|
            log10 = float(np.log10(2.0 * p.n * p.T * p.d) + np.log10(v) + 2 * np.log10(x) + np.log10(z))
        if log10 > GRADIENT_LOG10_MAX:
            where = "" if len(problems) == 1 else f"problems[{j}]: "
            raise ValueError(
                f"{where}the data are too large to train on in float64: the gradient's terms reach ~1e{log10:.0f} "
                f"(max|x| = {x:.1e}, max|z| = {z:.1e}, max|head weight| = {v:.1e}); rescale X, Z or the head"
            )


# the largest log10 of a gradient term check_gradient_scale accepts (float64 overflows at 10^308.25)
GRADIENT_LOG10_MAX = 307.0


def _mlp_signature(p: AttentionProblem) -> tuple[Any, ...] | None:
    spec = p.head.mlp_spec
    if spec is None:
        return None
    return (spec.activation, spec.width, tuple(H.shape for H in spec.hidden), spec.out.shape)


def _activation(name: str, a: Tensor) -> Tensor:
    if name == "relu":
        return torch.relu(a)
    if name == "gelu":
        return torch.nn.functional.gelu(a)  # exact (erf) form, as problem.activation_fn
    return torch.nn.functional.silu(a)


def mlp_rest(batch: Batch, a: Tensor) -> Tensor:
    """An MLP head from its first-layer pre-activations ``a = Vᵀo`` (R, n, k) to its output (R, n)."""
    act = "silu" if batch.mlp_act == "swiglu" else str(batch.mlp_act)
    if batch.mlp_act == "swiglu":
        w = batch.mlp_width
        z = torch.nn.functional.silu(a[..., w:]) * a[..., :w]
    else:
        z = _activation(act, a)
    for H in batch.mlp_hidden:
        z = _activation(act, z @ H)
    assert batch.mlp_out is not None
    return (z * batch.mlp_out.unsqueeze(-2)).sum(-1)


def _as_problem_list(problems: AttentionProblem | Sequence[AttentionProblem]) -> list[AttentionProblem]:
    if isinstance(problems, AttentionProblem):
        return [problems]
    if isinstance(problems, (str, bytes)) or not isinstance(problems, Sequence):
        raise TypeError(f"problems must be an AttentionProblem or a list of them, got {type(problems).__name__}")
    out = list(problems)
    if not out:
        raise ValueError("problems must not be empty")
    for j, p in enumerate(out):
        if not isinstance(p, AttentionProblem):
            raise TypeError(f"problems[{j}] must be an AttentionProblem, got {type(p).__name__}")
    return out


# ---------------------------------------------------------------------------------------------
# pure forward functions (autograd-friendly, stable forms)


def _check_W(batch: Any, W: Any, name: str = "W") -> None:
    """The public forward functions' arguments: a :class:`Batch` and W (R, d, d) of its dtype and device."""
    if not isinstance(batch, Batch):
        raise TypeError(f"batch must be a Batch (see Batch.from_problems), got {type(batch).__name__}")
    d = batch.d
    if not isinstance(W, Tensor):
        raise TypeError(f"{name} must be a torch tensor of shape (R, {d}, {d}), got {type(W).__name__}")
    if W.ndim != 3 or tuple(W.shape[1:]) != (d, d):
        raise ValueError(f"{name} must have shape (R, {d}, {d}), got {tuple(W.shape)}")
    if W.dtype != batch.X.dtype or W.device != batch.X.device:
        raise ValueError(
            f"{name} must have the batch's dtype and device ({batch.X.dtype}, {batch.X.device}), "
            f"got {W.dtype}, {W.device}"
        )
    if batch.size not in (1, W.shape[0]):
        raise ValueError(f"{name} holds {W.shape[0]} runs but the batch holds {batch.size} (it must hold 1 or R)")
    if not bool(torch.isfinite(W).all()):
        raise ValueError(f"{name} must be finite (no NaN or inf entries)")


def attention_logits(batch: Batch, W: Tensor) -> Tensor:
    """Logits ``g_it = x_itᵀ W z_i`` of shape (R, n, T) for W of shape (R, d, d)."""
    _check_W(batch, W)
    u = batch.Z @ W.transpose(-1, -2)  # (R, n, d): (W z_i)ᵀ
    return (batch.X @ u.unsqueeze(-1)).squeeze(-1)  # (R, n, T)


def attention_probs(batch: Batch, W: Tensor) -> Tensor:
    """Attention probabilities ``s_i = softmax(X_i W z_i)`` of shape (R, n, T).

    A sequence whose logits overflow (W or its tokens so large that ``x_itᵀ W z_i`` is not a float) gets
    the limit of the softmax, the mass shared by the maximisers (never NaN); the others their softmax."""
    g = attention_logits(batch, W)
    finite = torch.isfinite(g).all(-1, keepdim=True)  # (R, n, 1)
    if bool(finite.all()):
        return torch.softmax(g, dim=-1)
    return torch.where(finite, torch.softmax(torch.where(finite, g, 0.0), dim=-1), _limit_probs(batch, W))


def _limit_probs(batch: Batch, W: Tensor) -> Tensor:
    """The limit of the softmax as the logits' scale grows: uniform over each sequence's maximisers of the
    logits of W, x_it and z_i each divided by its own largest entry (per run, per sequence), which are the
    true logits times a positive factor per (run, sequence), so the maximisers are the same."""
    tiny = torch.finfo(W.dtype).tiny
    Ws = W / W.abs().amax(dim=(-2, -1), keepdim=True).clamp_min(tiny)
    Xs = batch.X / batch.X.abs().amax(dim=(-2, -1), keepdim=True).clamp_min(tiny)  # (B, n, 1, 1) per sequence
    Zs = batch.Z / batch.Z.abs().amax(dim=-1, keepdim=True).clamp_min(tiny)  # (B, n, 1) per sequence
    g = (Xs @ (Zs @ Ws.transpose(-1, -2)).unsqueeze(-1)).squeeze(-1)
    top = g == g.amax(-1, keepdim=True)
    return top.to(g.dtype) / top.sum(-1, keepdim=True)


def _mixture(batch: Batch, s: Tensor) -> Tensor:
    """Attention outputs ``o_i = X_iᵀ s_i`` of shape (R, n, d)."""
    return (s.unsqueeze(-2) @ batch.X).squeeze(-2)


def head_outputs(batch: Batch, o: Tensor) -> Tensor:
    """Head applied to attention outputs o (R, n, d): (R, n) for scalar heads, (R, n, C) logits."""
    a = o @ batch.V  # (R, n, k)
    if batch.head == "linear":
        return a[..., 0]
    if batch.head == "relu":
        return torch.relu(a).sum(-1)
    if batch.head == "mlp":
        return mlp_rest(batch, a)
    return a


def sequence_losses(batch: Batch, out: Tensor) -> Tensor:
    """Per-sequence losses ``ℓ(y_i f(X_i))`` (or cross-entropy) of shape (R, n), finite at huge outputs."""
    if batch.loss == "cross_entropy":
        logp = torch.log_softmax(out, dim=-1)  # (R, n, C)
        idx = batch.y.long().expand(out.shape[:-1]).unsqueeze(-1)
        return -torch.gather(logp, -1, idx).squeeze(-1)
    u = batch.y * out
    if batch.loss == "logistic":
        return torch.nn.functional.softplus(-u)
    if batch.loss == "exponential":
        return torch.exp(torch.clamp(-u, max=EXP_CLIP))
    return -u


def risk(batch: Batch, W: Tensor) -> Tensor:
    """Empirical risk ``L(W) = (1/n) Σ_i ℓ_i`` of shape (R,) (docs/spec.md §1), differentiable by autograd."""
    s = attention_probs(batch, W)  # (checks batch and W)
    return sequence_losses(batch, head_outputs(batch, _mixture(batch, s))).mean(-1)


# ---------------------------------------------------------------------------------------------
# analytic, round-off-stable gradient (the trainer's hot path)


def risk_and_grad(batch: Batch, W: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Risk (R,), its gradient ∇_W L (R, d, d) and the attention probabilities (R, n, T).

    See :func:`risk_and_scaled_grad` for the computation; this returns ``∇_W L`` itself (which
    underflows to 0 once every non-selected logit trails by more than ~745).
    """
    _check_W(batch, W)
    L, G, s, logscale = risk_and_scaled_grad(batch, W)
    return L, G * torch.exp(-logscale)[:, None, None], s


def risk_and_scaled_grad(batch: Batch, W: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Risk (R,), the scaled gradient ``e^{c} ∇_W L`` (R, d, d), the probabilities (R, n, T) and c (R,).

    ``c_r ≥ 0`` is the smallest gap ``g_{ir_i} − g_it`` (t ≠ r_i) of run r, so the scaled gradient is
    O(1)-representable however saturated the attention: its direction stays computable long after
    ``∇_W L`` itself underflows (exact normalized GD uses it).

    The gradient is written relative to the top-logit token ``r_i`` of each sequence:
    with ``D_it = x_it − x_{ir}``, ``e_i = ∂ℓ_i/∂o_i`` and ``c_it = D_itᵀ e_i``,

        ∇_W L = (1/n) Σ_i Σ_t s_it (c_it − Σ_τ s_iτ c_iτ) D_it z_iᵀ,

    which equals the textbook ``Σ_t ∂ℓ/∂g_it x_it z_iᵀ`` because softmax derivatives sum to zero over
    t. Every term carries its own factor ``s_it`` (t ≠ r_i), so once attention saturates the gradient
    is computed to full relative precision instead of as a difference of O(1) numbers — which
    normalized GD would otherwise amplify into a random step direction. Likewise the loss
    derivatives use ``σ(−u)`` (logistic) and, for cross-entropy, ``p_y − 1 = −Σ_{c≠y} p_c``. The sum
    ``Σ_t δ_it D_it`` is evaluated as ``Σ_t δ'_it x_it`` with ``δ'_{ir} = −Σ_{t≠r} δ_it``, and the head
    only ever sees the token table ``x_itᵀ V`` (:attr:`Batch.XV`).
    """
    X = batch.X  # (B, n, T, d)
    u = batch.Z @ W.transpose(-1, -2)  # (R, n, d): W z_i
    g = (X * u.unsqueeze(-2)).sum(-1)  # (R, n, T) logits (broadcast products beat tiny bmm's on CPU)
    losses, delta, s, logscale = risk_and_scaled_logit_grad(batch, g)
    Bv = (delta.unsqueeze(-1) * X).sum(-2)  # (R, n, d)
    grad = Bv.transpose(-1, -2) @ batch.Z  # (R, d, d), scaled by e^{c}
    return losses.mean(-1), grad, s, logscale


def risk_and_scaled_logit_grad(batch: Batch, g: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """From the logits g (R, n, T): the per-sequence losses (R, n), the scaled logit gradient ``δ'``
    (R, n, T), the probabilities (R, n, T) and the scale c (R,) of :func:`risk_and_scaled_grad`.

    ``δ'`` is ``e^{c} ∂L/∂g_it`` for t ≠ r_i and ``δ'_{ir} = −Σ_{t≠r} δ'_it`` at the top token, so
    ``e^{c}∇_W L = Σ_it δ'_it x_it z_iᵀ`` (each term carrying its own ``s_it``). The trainer's span
    path (:mod:`attsvm.training.span`) steps on it directly.
    """
    gmax, ref = g.max(-1, keepdim=True)  # (R, n, 1): top logit and its token r_i
    gap = gmax - g  # (R, n, T) ≥ 0, exactly 0 at r_i
    ez = torch.exp(-gap)
    Zs = ez.sum(-1, keepdim=True)
    s = ez / Zs  # (R, n, T) softmax
    logscale = gap.scatter(-1, ref, float("inf")).amin(dim=(-2, -1))  # (R,) smallest gap c_r
    s_scaled = torch.exp(torch.clamp(logscale[:, None, None] - gap, max=0.0)) / Zs  # e^{c} s_it for t ≠ r_i
    XV = batch.XV
    if XV.shape[-1] == 1:  # linear head: products and sums beat (R·n) tiny matmuls
        a = (s * XV[..., 0]).sum(-1, keepdim=True)  # (R, n, 1) = vᵀ o_i, with o_i = X_iᵀ s_i
    else:
        a = (s.unsqueeze(-2) @ XV).squeeze(-2)  # (R, n, k) = Vᵀ o_i
    y = batch.y
    if batch.head == "multiclass":
        lp = torch.log_softmax(a, dim=-1)  # (R, n, C)
        idx = y.long().expand(a.shape[:-1]).unsqueeze(-1)
        losses = -torch.gather(lp, -1, idx).squeeze(-1)
        q = lp.exp().scatter(-1, idx, 0.0)
        q = q.scatter(-1, idx, -q.sum(-1, keepdim=True))  # ∂ℓ/∂a = p − e_y, with p_y − 1 = −Σ_{c≠y} p_c
    else:
        J = None
        if batch.head == "mlp":  # ∂f/∂a of the small head by autograd (the softmax part stays analytic)
            with torch.enable_grad():
                a_ = a.detach().requires_grad_(True)
                f_ = mlp_rest(batch, a_)
                (J,) = torch.autograd.grad(f_.sum(), a_)
            f = f_.detach()
        else:
            f = a[..., 0] if batch.head == "linear" else torch.relu(a).sum(-1)
        uy = y * f
        if batch.loss == "logistic":
            losses = torch.nn.functional.softplus(-uy)
            dl = -torch.sigmoid(-uy)
        elif batch.loss == "exponential":
            losses = torch.exp(torch.clamp(-uy, max=EXP_CLIP))
            dl = -losses
        else:
            losses = -uy
            dl = -torch.ones_like(uy)
        q = (y * dl).unsqueeze(-1)  # (R, n, 1): ∂ℓ/∂f, times ∂f/∂a below
        if batch.head == "relu":
            q = q * (a > 0).to(a.dtype)  # (R, n, k)
        elif J is not None:
            q = q * J  # (R, n, k)
    # e_i = ∂ℓ_i/∂o_i = V q_i, so x_itᵀ e_i = (x_itᵀ V) q_i: one small matvec on the token table
    Xe = XV[..., 0] * q if XV.shape[-1] == 1 else (XV @ q.unsqueeze(-1)).squeeze(-1)  # (R, n, T)
    c = Xe - torch.gather(Xe, -1, ref)  # c_it = D_itᵀ e_i, exactly 0 at r_i
    cbar = (s * c).sum(-1, keepdim=True)
    delta = (s_scaled * (c - cbar)).scatter(-1, ref, 0.0) / batch.n  # (R, n, T): e^{c} ∂L/∂g_it, t ≠ r_i
    delta = delta.scatter(-1, ref, -delta.sum(-1, keepdim=True))  # Σ_t δ'_it x_it = Σ_{t≠r} δ_it D_it
    return losses, delta, s, logscale


def excess_risk_scaled(batch: Batch, W: Tensor) -> Tensor:
    """``e^{c}·(L(W) − L*)`` (R,) for a linear head: the risk above its infimum ``L* = mean_i ℓ(γ*_i)``,
    ``γ*_i = max_t γ_it``, scaled by the same ``e^{c}`` as :func:`risk_and_scaled_grad`'s gradient
    (docs/spec.md §8, Polyak's step).

    Computed without the difference of two O(1) numbers: where the top-logit token r_i is a best
    token, ``u_i = γ*_i − δ_i`` with ``δ_i = Σ_{t≠r} s_it (γ_ir − γ_it) ≥ 0`` (each term carries its own
    ``s_it``), and ``ℓ(γ* − δ) − ℓ(γ*)`` is ``log1p(expm1(δ)·σ(−γ*))`` (logistic), ``e^{−γ*} expm1(δ)``
    (exponential) or ``δ`` (correlation) — each written as ``δ·(a factor → finite as δ → 0)``, so that
    ``e^{c}δ`` carries it past the underflow of ``δ``. Elsewhere the O(1) difference is used as it is.
    """
    if batch.head != "linear":
        raise ValueError(f"the excess risk is defined here for the linear head, got {batch.head!r}")
    X = batch.X
    u = batch.Z @ W.transpose(-1, -2)
    g = (X * u.unsqueeze(-2)).sum(-1)  # (R, n, T) logits
    gmax, ref = g.max(-1, keepdim=True)
    gap = gmax - g
    Zs = torch.exp(-gap).sum(-1, keepdim=True)
    s = torch.exp(-gap) / Zs
    c = gap.scatter(-1, ref, float("inf")).amin(dim=(-2, -1))  # (R,)
    s_sc = (torch.exp(torch.clamp(c[:, None, None] - gap, max=0.0)) / Zs).scatter(-1, ref, 0.0)  # e^{c} s_it, t ≠ r
    gam = (batch.y.unsqueeze(-1) * batch.XV[..., 0]).expand(g.shape)  # (R, n, T) γ_it = y_i vᵀx_it
    g_star = gam.amax(-1)  # (R, n)
    g_ref = torch.gather(gam, -1, ref)[..., 0]
    d_sc = (s_sc * (g_ref.unsqueeze(-1) - gam)).sum(-1)  # e^{c} δ_i
    delta = d_sc * torch.exp(-c)[:, None]
    phi = torch.where(delta.abs() > 1e-8, torch.expm1(delta) / torch.where(delta == 0, 1.0, delta), 1.0 + delta / 2)
    if batch.loss == "logistic":
        sig = torch.sigmoid(-g_star)
        x = torch.expm1(delta) * sig
        psi = torch.where(x.abs() > 1e-8, torch.log1p(x) / torch.where(x == 0, 1.0, x), 1.0 - x / 2)
        small = d_sc * phi * sig * psi
        full = torch.nn.functional.softplus(-(s * gam).sum(-1)) - torch.nn.functional.softplus(-g_star)
    elif batch.loss == "exponential":
        small = d_sc * phi * torch.exp(-g_star)
        full = torch.exp(-(s * gam).sum(-1)) - torch.exp(-g_star)
    else:
        small = d_sc
        full = g_star - (s * gam).sum(-1)
    best = g_ref >= g_star  # the top-logit token is a best token
    full_sc = torch.exp(torch.log(full.clamp_min(0.0)) + c[:, None])  # (may overflow: a wrong token on top)
    return torch.where(best, small, full_sc).mean(-1)


def factor_grads(grad_W: Tensor, K: Tensor, Q: Tensor) -> tuple[Tensor, Tensor]:
    """Chain rule for ``W = K Qᵀ``: ``∇_K = ∇_W Q`` and ``∇_Q = ∇_Wᵀ K``, each (R, d, m)."""
    return grad_W @ Q, grad_W.transpose(-1, -2) @ K


# ---------------------------------------------------------------------------------------------
# parameterisations (docs/spec.md §1, §4)

InitDraw = Literal["pytorch", "gaussian"]
INIT_DRAWS: tuple[str, ...] = ("pytorch", "gaussian")


def _linear_weight(rows: int, d: int, generator: torch.Generator) -> Tensor:
    """``nn.Linear(d, rows)``'s default weight (rows, d): kaiming_uniform(a=√5) = U(−1/√d, 1/√d), drawn in
    float32 and then cast, as ``SelfAttn(d).double()`` does in the published code."""
    w = torch.empty(rows, d, dtype=torch.float32)
    return torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=generator).double()


class Parameterization(ABC):
    """How the trained tensors of R runs make the attention matrix W (R, d, d) (docs/spec.md §1, §4).

    The trained tensors are a tuple of *groups*, each of shape (R, d, ·): ``(W,)`` for :class:`FullW`,
    ``(K, Q)`` for :class:`FactoredKQ`. A group is the unit of normalisation — for (K, Q) each factor's
    gradient is normalised separately (docs/spec.md §4) — and of every per-parameter transform of
    :mod:`attsvm.training.optim`. A parameterisation knows its weights (:meth:`weights`), its gradient map
    (:meth:`grads`, the chain rule from ``∇_W L``) and its initialisations (:meth:`draw`,
    :meth:`from_W`, :meth:`from_given`, :meth:`zeros`) and plain-GD step (:meth:`auto_step`).
    """

    name: ClassVar[str]
    groups: ClassVar[tuple[str, ...]]
    # λ of the penalty λ Σ_g ‖θ_g‖_F² in the published recipe (docs/spec.md §4)
    published_penalty: ClassVar[float]
    d: int

    @property
    @abstractmethod
    def shapes(self) -> tuple[tuple[int, int], ...]:
        """The shape (d, ·) of every group, without the run axis."""

    @abstractmethod
    def weights(self, params: Sequence[Tensor]) -> Tensor:
        """W (R, d, d) from the groups."""

    @abstractmethod
    def grads(self, grad_W: Tensor, params: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """The gradient of every group from ``∇_W L`` (R, d, d) (the chain rule through :meth:`weights`)."""

    @abstractmethod
    def from_W(self, W: NDArray[np.float64]) -> tuple[NDArray[np.float64], ...]:
        """Groups (numpy, leading axis R) whose :meth:`weights` is W (R, d, d), or its best approximation."""

    @abstractmethod
    def draw(self, kind: InitDraw, generator: torch.Generator, scale: float) -> tuple[NDArray[np.float64], ...]:
        """One run's random groups: ``"pytorch"`` (the published ``nn.Linear`` init) or ``"gaussian"``."""

    @abstractmethod
    def auto_step(
        self, LW: NDArray[np.float64], GW: NDArray[np.float64], params0: Sequence[NDArray[np.float64]]
    ) -> NDArray[np.float64]:
        """Plain-GD step per run (R,) from the smoothness and gradient bounds ``L_W``, ``G_W`` (R,) of
        ``L(W)`` and the initial groups."""

    def __post_init__(self) -> None:
        for name in ("d", "m"):
            if hasattr(self, name):
                object.__setattr__(self, name, check_positive_int(getattr(self, name), name))

    def _check_W(self, W: Any) -> NDArray[np.float64]:
        """:meth:`from_W`'s argument: a finite W (d, d) or (R, d, d)."""
        W = as_float_array(W, "W")
        if W.ndim not in (2, 3) or W.shape[-2:] != (self.d, self.d):
            raise ValueError(f"W must have shape ({self.d}, {self.d}) or (R, {self.d}, {self.d}), got {W.shape}")
        return W

    @staticmethod
    def _check_draw(kind: Any, scale: Any) -> float:
        check_choice(kind, "kind", INIT_DRAWS)
        return check_finite_scalar(scale, "scale")

    def zeros(self, runs: int) -> tuple[NDArray[np.float64], ...]:
        """All-zero groups for ``runs`` runs."""
        runs = check_positive_int(runs, "runs")
        return tuple(np.zeros((runs, *s)) for s in self.shapes)

    def from_given(self, init: Any, runs: int) -> tuple[NDArray[np.float64], ...]:
        """Groups from a user's init: an array W (d, d) or (R, d, d), or a tuple of the groups, each
        (d, ·) or (R, d, ·)."""
        d = self.d
        if isinstance(init, tuple):
            if len(self.groups) == 1 or len(init) != len(self.groups):
                raise ValueError(
                    f"init as a tuple must be ({', '.join(self.groups)}) and needs a factored "
                    f"param such as 'KQ'; got a tuple of {len(init)} for param={self.name!r}"
                )
            out = []
            for name, A, shape in zip(self.groups, init, self.shapes):
                arr = as_float_array(A, f"init {name}")
                if arr.shape not in (shape, (runs, *shape)):
                    raise ValueError(f"init {name} must have shape {shape} or {(runs, *shape)}, got {arr.shape}")
                out.append(np.broadcast_to(arr, (runs, *shape)).copy())
            return tuple(out)
        W = as_float_array(init, "init")
        if W.shape not in ((d, d), (runs, d, d)):
            raise ValueError(f"init W must have shape ({d}, {d}) or ({runs}, {d}, {d}), got {W.shape}")
        return self.from_W(np.broadcast_to(W, (runs, d, d)).copy())


@dataclass(frozen=True)
class FullW(Parameterization):
    """W (R, d, d) trained directly (W-ERM)."""

    d: int
    name: ClassVar[str] = "W"
    groups: ClassVar[tuple[str, ...]] = ("W",)
    published_penalty: ClassVar[float] = 0.0

    @property
    def shapes(self) -> tuple[tuple[int, int], ...]:
        return ((self.d, self.d),)

    def weights(self, params: Sequence[Tensor]) -> Tensor:
        return params[0]

    def grads(self, grad_W: Tensor, params: Sequence[Tensor]) -> tuple[Tensor, ...]:
        return (grad_W,)

    def from_W(self, W: NDArray[np.float64]) -> tuple[NDArray[np.float64], ...]:
        return (self._check_W(W),)

    def draw(self, kind: InitDraw, generator: torch.Generator, scale: float) -> tuple[NDArray[np.float64], ...]:
        scale = self._check_draw(kind, scale)
        if kind == "pytorch":  # logits zᵀ W_lin x with W = W_linᵀ
            return (scale * _linear_weight(self.d, self.d, generator).T.numpy(),)
        return (scale * torch.randn(self.d, self.d, generator=generator, dtype=torch.float64).numpy(),)

    def auto_step(
        self, LW: NDArray[np.float64], GW: NDArray[np.float64], params0: Sequence[NDArray[np.float64]]
    ) -> NDArray[np.float64]:
        return 1.0 / LW


@dataclass(frozen=True)
class FactoredKQ(Parameterization):
    """K, Q (R, d, m) with W = K Qᵀ (KQ-ERM); the published code's ``K = W_kᵀ``, ``Q = W_qᵀ``."""

    d: int
    m: int
    name: ClassVar[str] = "KQ"
    groups: ClassVar[tuple[str, ...]] = ("K", "Q")
    # float64 machine epsilon, as the published code: ε(‖K‖² + ‖Q‖²)
    published_penalty: ClassVar[float] = float(torch.finfo(torch.float64).eps)

    @property
    def shapes(self) -> tuple[tuple[int, int], ...]:
        return ((self.d, self.m), (self.d, self.m))

    def weights(self, params: Sequence[Tensor]) -> Tensor:
        return params[0] @ params[1].transpose(-1, -2)

    def grads(self, grad_W: Tensor, params: Sequence[Tensor]) -> tuple[Tensor, ...]:
        return factor_grads(grad_W, params[0], params[1])

    def from_W(self, W: NDArray[np.float64]) -> tuple[NDArray[np.float64], ...]:
        """K, Q with K Qᵀ the best rank-m approximation of W and ‖K‖_F = ‖Q‖_F (balanced)."""
        m = self.m
        W = self._check_W(W)
        U, S, Vt = np.linalg.svd(W)
        r = min(m, S.shape[-1])
        lost = (S[..., r:] ** 2).sum(-1)
        if np.any(lost > 1e-20 * np.maximum((S**2).sum(-1), 1e-300)):
            logger.warning("init W has rank above m=%d: its balanced (K, Q) factorisation truncates it", m)
        K = np.zeros((*W.shape[:-1], m))
        Q = np.zeros((*W.shape[:-1], m))
        sq = np.sqrt(S[..., :r])
        K[..., :r] = U[..., :, :r] * sq[..., None, :]
        Q[..., :r] = np.swapaxes(Vt, -1, -2)[..., :, :r] * sq[..., None, :]
        return K, Q

    def draw(self, kind: InitDraw, generator: torch.Generator, scale: float) -> tuple[NDArray[np.float64], ...]:
        scale = self._check_draw(kind, scale)
        if kind == "pytorch":  # the published module builds `query` before `key`
            Wq = _linear_weight(self.m, self.d, generator)
            Wk = _linear_weight(self.m, self.d, generator)
            return scale * Wk.T.numpy(), scale * Wq.T.numpy()
        K = torch.randn(self.d, self.m, generator=generator, dtype=torch.float64).numpy()
        Q = torch.randn(self.d, self.m, generator=generator, dtype=torch.float64).numpy()
        return scale * K, scale * Q

    def zeros(self, runs: int) -> tuple[NDArray[np.float64], ...]:
        raise ValueError(
            "init='zeros' with param='KQ' starts at a stationary point (∇K = ∇Q = 0) and "
            "never moves; give (K, Q) explicitly, e.g. K small Gaussian and Q = 0"
        )

    def auto_step(
        self, LW: NDArray[np.float64], GW: NDArray[np.float64], params0: Sequence[NDArray[np.float64]]
    ) -> NDArray[np.float64]:
        """``1/(L_W·B + G_W)`` with ``B = max(1, ‖K₀‖_F² + ‖Q₀‖_F²)``: a smoothness bound of the (K, Q)
        objective valid while ``‖K‖_F² + ‖Q‖_F² ≤ B`` (it is not globally smooth)."""
        K0, Q0 = params0
        B = np.maximum(1.0, (K0**2).sum((1, 2)) + (Q0**2).sum((1, 2)))
        return 1.0 / (LW * B + GW)


def parameterization(param: Param | Parameterization, d: int, m: int | None = None) -> Parameterization:
    """The :class:`Parameterization` for ``param="W"`` (:class:`FullW`) or ``"KQ"`` (:class:`FactoredKQ`
    with inner dimension ``m``, default d); an instance is checked against d and returned."""
    d = check_positive_int(d, "d")
    if isinstance(param, Parameterization):
        if param.d != d:
            raise ValueError(f"param has d={param.d} but the data has d={d}")
        if m is not None and m != getattr(param, "m", d):
            raise ValueError(f"m={m} disagrees with the given parameterization {param!r}")
        return param
    param = check_choice(param, "param", PARAMS)
    if param == "W":
        if m is not None and m != d:
            raise ValueError(f"m applies to param='KQ' only (W is d × d); got m={m} with param='W'")
        return FullW(d)
    return FactoredKQ(d, d if m is None else check_positive_int(m, "m"))


# ---------------------------------------------------------------------------------------------


class AttentionModel(nn.Module):
    """R one-layer attention models in one module: W (R, d, d) or K, Q (R, d, m) with W = K Qᵀ.

    Parameters
    ----------
    d : int
        Token dimension.
    param : {"W", "KQ"} or Parameterization
        Parameterisation (docs/spec.md §1).
    m : int, optional
        Inner dimension of K and Q (default d); ignored for ``param="W"``.
    runs : int
        R, the number of independent models on the leading axis.

    The parameters (``weight`` for W; ``K``, ``Q``) start at zero; assign them (``model.W.data = ...``,
    :meth:`load`) or use :func:`attsvm.train`. ``forward(batch)`` returns ``(outputs, probs)`` — outputs
    (R, n) (or (R, n, C) logits for the multiclass head) and attention probabilities (R, n, T) — and keeps
    no state.
    """

    def __init__(
        self,
        d: int,
        *,
        param: Param | Parameterization = "W",
        m: int | None = None,
        runs: int = 1,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        d = check_positive_int(d, "d")
        runs = check_positive_int(runs, "runs")
        dtype = check_float_dtype(dtype)
        device = check_device(device)
        if m is not None:
            m = check_positive_int(m, "m")
        if isinstance(param, str):
            param = check_choice(param, "param", PARAMS)
            m = None if param == "W" else m  # (documented: ignored for W)
        self.parameterization = parameterization(param, d, m)
        self.param: str = self.parameterization.name
        self.d = d
        self.m = getattr(self.parameterization, "m", d)
        self.runs = runs
        # the W group is stored as `weight`: `W` is the property below, whatever the parameterisation
        self._attrs = tuple("weight" if g == "W" else g for g in self.parameterization.groups)
        for attr, shape in zip(self._attrs, self.parameterization.shapes):
            setattr(self, attr, nn.Parameter(torch.zeros((runs, *shape), dtype=dtype, device=device)))

    @property
    def group_tensors(self) -> tuple[Tensor, ...]:
        """The trained groups in :attr:`Parameterization.groups` order: ``(weight,)`` or ``(K, Q)``."""
        return tuple(getattr(self, a) for a in self._attrs)

    @property
    def W(self) -> Tensor:
        """The attention matrix (R, d, d): the W parameter, or K Qᵀ."""
        return self.parameterization.weights(self.group_tensors)

    def load(self, params: Sequence[Tensor | NDArray[np.float64]]) -> AttentionModel:
        """Set the groups (each (R, d, ·), real and finite) from tensors or arrays; returns self."""
        if isinstance(params, (str, bytes, Tensor, np.ndarray)) or not isinstance(params, Sequence):
            raise TypeError(
                f"params must be a list of the {len(self._attrs)} groups {self.parameterization.groups}, "
                f"got {type(params).__name__}"
            )
        if len(params) != len(self._attrs):
            raise ValueError(
                f"params must hold {len(self._attrs)} groups {self.parameterization.groups}, got {len(params)}"
            )
        for attr, A in zip(self._attrs, params):
            p = getattr(self, attr)
            if isinstance(A, Tensor):  # (bfloat16 has no numpy type: through float64)
                A = A.detach().to("cpu", torch.float64 if A.dtype.is_floating_point else A.dtype).numpy()
            if np.asarray(A).dtype == bool:
                raise TypeError(f"params[{attr!r}] must hold real numbers, got booleans")
            t = torch.as_tensor(as_float_array(A, f"params[{attr!r}]"), dtype=p.dtype, device=p.device)
            if t.shape != p.shape:
                raise ValueError(f"params[{attr!r}] must have shape {tuple(p.shape)}, got {tuple(t.shape)}")
            p.data = t.clone()
        return self

    def forward(self, batch: Batch) -> tuple[Tensor, Tensor]:
        if not isinstance(batch, Batch):
            raise TypeError(f"batch must be a Batch (see Batch.from_problems), got {type(batch).__name__}")
        if batch.d != self.d:
            raise ValueError(f"batch has d={batch.d} features but the model was built with d={self.d}")
        if batch.size not in (1, self.runs):
            raise ValueError(
                f"batch holds {batch.size} runs but the model has runs={self.runs} "
                "(the batch must hold 1 shared instance or one per run)"
            )
        s = attention_probs(batch, self.W)
        return head_outputs(batch, _mixture(batch, s)), s

    def risk(self, batch: Batch) -> Tensor:
        """Empirical risk per run, shape (R,)."""
        out, _ = self(batch)
        return sequence_losses(batch, out).mean(-1)

    def extra_repr(self) -> str:
        return f"d={self.d}, param={self.param!r}, m={self.m}, runs={self.runs}"
