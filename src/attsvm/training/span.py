"""Gradient descent on W in the span of the data (docs/spec.md §4, "The span form").

Every gradient of the W-parameterised risk is ``∇_W L = Σ_it (∂L/∂g_it) x_it z_iᵀ``, a combination of
the N = nT rank-one matrices ``x_it z_iᵀ``. (Normalized) GD therefore keeps

    W(k) = W₀ + Σ_it β_it(k) x_it z_iᵀ,

and runs on the N coefficients β instead of the d² entries of W: the logits are ``g = g(W₀) + Kβ`` with
the data kernel ``K_{(it),(jτ)} = (x_itᵀ x_jτ)(z_iᵀ z_j)``, the step is ``β ← β − η δ / ‖δ‖_K`` with
``δ = ∂L/∂g`` (rescaled by ``e^{c}`` as in :func:`attsvm.model.risk_and_scaled_logit_grad`) and
``‖∇_W L‖_F = ‖δ‖_K = (δᵀKδ)^{1/2}``. W itself is formed only when it is recorded. One step costs
O(N²) per run instead of O(n d²): the svm-eq workload (n = 3, T = 4, d = 10) trains 2–3× faster.

:func:`span_plan` decides when the trainer takes this path (``space="auto"``): the W parameterisation,
an update rule that is plain or normalized GD with a step size (no penalty, mirror map or Polyak
step), a kernel that is cheaper than the dense step, and a well-conditioned kernel on every instance
(β is not unique when K is singular, and a normalized step along a direction K nearly annihilates
would be long in β while short in W, so the logits ``Kβ`` would lose digits). The two paths agree to
round-off (tests/test_train_span.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..model import Batch, FullW, Parameterization, risk_and_scaled_logit_grad
from .optim import Chain, NormalizeByNorm, StepSize, Transform
from .recording import Recorder

__all__ = [
    "SpanPlan",
    "span_plan",
    "span_kernel",
    "span_is_cheaper",
    "span_well_conditioned",
    "train_span",
    "SPAN_MAX_COND",
    "SPAN_SMALL_N",
    "SPAN_COST_RATIO",
    "SPAN_MIN_RECORD_EVERY",
]

# The span path is taken only where every instance's kernel (restricted to its range) has condition
# number below this: the logits Kβ then keep at least ~6 more digits than the loss needs.
SPAN_MAX_COND = 1e8
# ``space="auto"`` takes the span path when N ≤ SPAN_SMALL_N or N² ≤ SPAN_COST_RATIO · n·d² (per-run work
# of one step: two N×N products against the dense path's two n×d×d ones; small steps are dominated by
# the number of tensor operations, which the span form lowers), and when W is recorded at most every
# SPAN_MIN_RECORD_EVERY steps (forming W costs N·d² per record). Crossovers measured on CPU, 2 cores,
# 1,000 runs (benchmarks/bench_train.py --span).
SPAN_SMALL_N = 24
SPAN_COST_RATIO = 0.5
SPAN_MIN_RECORD_EVERY = 8


@dataclass(frozen=True)
class SpanPlan:
    """How :func:`train_span` steps: ``eps`` of ``u/(‖u‖_F + eps)`` (None: plain GD) and the step size."""

    eps: float | None
    step: StepSize


def _parts(rule: Transform) -> list[Transform]:
    return list(rule.transforms) if isinstance(rule, Chain) else [rule]


def span_plan(par: Parameterization, rule: Transform) -> SpanPlan | None:
    """The span form of ``rule`` for ``par``, or None when it has none: only W, trained by
    ``chain(NormalizeByNorm(ε), StepSize(η))`` or ``chain(StepSize(η))``."""
    if not isinstance(par, FullW):
        return None
    parts = _parts(rule)
    if len(parts) == 2 and type(parts[0]) is NormalizeByNorm and type(parts[1]) is StepSize:
        return SpanPlan(eps=parts[0].eps, step=parts[1])
    if len(parts) == 1 and type(parts[0]) is StepSize:
        return SpanPlan(eps=None, step=parts[0])
    return None


def span_kernel(batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
    """The flattened tokens (B, N, d), their queries (B, N, d) and the kernel K (B, N, N), N = nT."""
    B, n, T, d = batch.X.shape
    Xf = batch.X.reshape(B, n * T, d)
    Zf = batch.Z.repeat_interleave(T, dim=1)
    return Xf, Zf, (Xf @ Xf.transpose(-1, -2)) * (Zf @ Zf.transpose(-1, -2))


def span_is_cheaper(n: int, T: int, d: int, record_every: int) -> bool:
    """Whether the span form is expected to be faster (:data:`SPAN_SMALL_N`, :data:`SPAN_COST_RATIO`,
    :data:`SPAN_MIN_RECORD_EVERY`)."""
    N = n * T
    return record_every >= SPAN_MIN_RECORD_EVERY and (N <= SPAN_SMALL_N or N * N <= SPAN_COST_RATIO * n * d * d)


def span_well_conditioned(K: Tensor) -> bool:
    """Whether every kernel in K (B, N, N) has a condition number below :data:`SPAN_MAX_COND` on the
    subspace the steps live in (the logit gradients sum to zero within each sequence; K is checked whole,
    which is stricter)."""
    ev = torch.linalg.eigvalsh(K)  # ascending
    return bool(torch.all(ev[:, 0] > ev[:, -1] / SPAN_MAX_COND))


def _span_matrix(coef: Tensor, Xf: Tensor, Zf: Tensor) -> Tensor:
    """``Σ_j coef_j x_j z_jᵀ`` (R, d, d) for coefficients (R, N)."""
    return (coef.unsqueeze(-1) * Xf).transpose(-1, -2) @ Zf


def train_span(
    batch: Batch,
    W0: Tensor,
    plan: SpanPlan,
    *,
    steps: int,
    recorder: Recorder,
    kernel: tuple[Tensor, Tensor, Tensor] | None = None,
    bar: object | None = None,
) -> tuple[Tensor, Tensor]:
    """Run ``steps`` updates of ``plan`` from W₀ (R, d, d) in the span form (module doc), recording into
    ``recorder`` as the dense loop does. Returns the final W (R, d, d) and attention probabilities."""
    R = W0.shape[0]
    n, T = batch.n, batch.T
    N = n * T
    Xf, Zf, K = span_kernel(batch) if kernel is None else kernel
    g0 = (batch.X * (batch.Z @ W0.transpose(-1, -2)).unsqueeze(-2)).sum(-1).reshape(R, N)
    beta = torch.zeros((R, N), dtype=W0.dtype, device=W0.device)
    neg_eta = plan.step.init((W0,))  # −η (R, 1, 1), or None for a schedule
    eps = plan.eps
    s = torch.empty(0)
    for k in range(steps + 1):
        g = g0 + (K @ beta.unsqueeze(-1)).squeeze(-1)
        losses, delta, s, logc = risk_and_scaled_logit_grad(batch, g.view(R, n, T))
        df = delta.reshape(R, N)  # e^{c} ∂L/∂g
        if k == recorder.next_step:
            W = W0 + _span_matrix(beta, Xf, Zf)
            gW = _span_matrix(df, Xf, Zf) * torch.exp(-logc)[:, None, None]
            recorder.record(losses.mean(-1), W, (gW,), (W,), s)
        if k == steps:
            break
        if neg_eta is None:
            (u,), _ = plan.step.update((torch.ones_like(W0[:, :1, :1]),), None, (W0,), loss=losses, step=k)
            eta = -u[:, 0, 0]
        else:
            eta = -neg_eta[:, 0, 0]
        if eps is None:  # plain GD: the true gradient is e^{−c} δ
            coef = -eta * torch.exp(-logc)
        else:
            norm = torch.sqrt(((K @ df.unsqueeze(-1)).squeeze(-1) * df).sum(-1).clamp_min(0.0))  # e^{c}‖∇_W L‖_F
            denom = norm + eps * torch.exp(logc) if eps > 0 else norm
            coef = torch.where(denom > 0, -eta / torch.where(denom > 0, denom, 1.0), 0.0)
        beta = beta + coef[:, None] * df
        if bar is not None:
            bar.update(1)  # type: ignore[attr-defined]
    return W0 + _span_matrix(beta, Xf, Zf), s
