"""The maths of one-layer attention: pure functions of a :class:`~attsvm.model.Batch` and W (R, d, d).

* the forward pass: :func:`attention_logits`, :func:`attention_probs`, :func:`attention_outputs`,
  :func:`head_outputs` (with :func:`mlp_rest` and :func:`activation` for MLP heads),
  :func:`sequence_losses` and :func:`risk` (differentiable by autograd);
* the trainer's analytic gradient in a round-off-stable form: :func:`risk_and_grad`,
  :func:`risk_and_scaled_grad`, :func:`risk_and_scaled_logit_grad`, and the excess risk of Polyak's step
  :func:`excess_risk_scaled`;
* :func:`factor_grads`, the chain rule for ``W = K Qᵀ``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .batch import Batch

__all__ = [
    "EXP_CLIP",
    "activation",
    "mlp_rest",
    "attention_logits",
    "attention_probs",
    "attention_outputs",
    "head_outputs",
    "sequence_losses",
    "risk",
    "risk_and_grad",
    "risk_and_scaled_grad",
    "risk_and_scaled_logit_grad",
    "excess_risk_scaled",
    "factor_grads",
]

# The exponential loss e^{−u} is evaluated as e^{min(−u, EXP_CLIP)}: a huge finite number rather than
# inf when the margin is hopelessly negative (the same clip as problem.loss_fn).
EXP_CLIP = 700.0


def activation(name: str, a: Tensor) -> Tensor:
    """The hidden activation ``name`` of an MLP head ("relu", "gelu" or "silu") applied entrywise to ``a``."""
    if name == "relu":
        return torch.relu(a)
    if name == "gelu":
        return torch.nn.functional.gelu(a)  # exact (erf) form, as problem.activation_fn
    return torch.nn.functional.silu(a)


def _mlp_forward(batch: Batch, a: Tensor) -> tuple[Tensor, Tensor | None, list[Tensor]]:
    """An MLP head's output f (R, n) from ``a = Vᵀo`` (R, n, k), with what its derivative reuses: the SwiGLU
    gate's SiLU (None for the other activations) and each later layer's pre-activations."""
    act = "silu" if batch.mlp_act == "swiglu" else str(batch.mlp_act)
    sg = None
    if batch.mlp_act == "swiglu":
        w = batch.mlp_width
        sg = torch.nn.functional.silu(a[..., w:])
        z = sg * a[..., :w]
    else:
        z = activation(act, a)
    pre = []
    for H in batch.mlp_hidden:
        pre.append(z @ H)
        z = activation(act, pre[-1])
    assert batch.mlp_out is not None
    return (z * batch.mlp_out.unsqueeze(-2)).sum(-1), sg, pre


def mlp_rest(batch: Batch, a: Tensor) -> Tensor:
    """An MLP head from its first-layer pre-activations ``a = Vᵀo`` (R, n, k) to its output (R, n)."""
    return _mlp_forward(batch, a)[0]


def _slope(name: str, a: Tensor) -> Tensor:
    """The derivative of :func:`activation` ``name`` at ``a``, entrywise."""
    if name == "relu":
        return (a > 0).to(a.dtype)
    if name == "gelu":  # x Φ(x): Φ(x) + x φ(x)
        return 0.5 * torch.erfc(a * -_SQRT_HALF) + a * torch.exp(-0.5 * a * a) * _INV_SQRT_2PI
    sig = torch.sigmoid(a)  # x σ(x): σ(x) (1 + x (1 − σ(x)))
    return sig * (1.0 + a * (1.0 - sig))


_SQRT_HALF = 0.5**0.5
_INV_SQRT_2PI = (2.0 * math.pi) ** -0.5


def mlp_rest_and_grad(batch: Batch, a: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`mlp_rest` ``f`` (R, n) and its derivative ``∂f/∂a`` (R, n, k), by the chain rule written out
    (the head is small: one pass forward keeping the pre-activations, one back)."""
    act = "silu" if batch.mlp_act == "swiglu" else str(batch.mlp_act)
    f, sg, pre = _mlp_forward(batch, a)
    assert batch.mlp_out is not None
    b = batch.mlp_out.unsqueeze(-2)  # ∂f/∂z of the current layer
    for H, p in zip(reversed(batch.mlp_hidden), reversed(pre), strict=True):
        b = (b * _slope(act, p)) @ H.transpose(-1, -2)
    if sg is not None:  # SwiGLU: z = silu(gate) · lin
        w = batch.mlp_width
        J = torch.cat((b * sg, b * a[..., :w] * _slope("silu", a[..., w:])), -1)
    else:
        J = b * _slope(act, a)
    return f, J.expand(a.shape)


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


def attention_outputs(batch: Batch, s: Tensor) -> Tensor:
    """Attention outputs ``o_i = X_iᵀ s_i`` (R, n, d) from the attention probabilities s (R, n, T)."""
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
    return sequence_losses(batch, head_outputs(batch, attention_outputs(batch, s))).mean(-1)


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
        if batch.head == "mlp":
            f, J = mlp_rest_and_grad(batch, a)
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
