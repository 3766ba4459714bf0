"""Gradient descent on W in the span of the data (docs/spec.md §4, "The span form").

Every gradient of the W-parameterised risk is ``∇_W L = Σ_it (∂L/∂g_it) x_it z_iᵀ``, a combination of
the N = nT rank-one matrices ``x_it z_iᵀ``. (Normalized) GD therefore keeps

    W(k) = W₀ + Σ_it β_it(k) x_it z_iᵀ,

and runs on the N coefficients β instead of the d² entries of W: the logits are ``g = g(W₀) + Kβ`` with
the data kernel ``K_{(it),(jτ)} = (x_itᵀ x_jτ)(z_iᵀ z_j)``, the step is ``β ← β − η δ / ‖δ‖_K`` with
``δ = ∂L/∂g`` (rescaled by ``e^{c}`` as in :func:`attsvm.model.risk_and_scaled_logit_grad`) and
``‖∇_W L‖_F = ‖δ‖_K = (δᵀKδ)^{1/2}``. W itself is formed only when it is recorded. One step costs
O(N²) per run instead of O(n d²). For the linear and ReLU heads the runs are laid out along the *last*
axis (tensors (n, T, R), (N, N, R), …): every operation then is an elementwise product or a reduction
over a small leading axis with R contiguous numbers in the inner loop, instead of R tiny batched
matrix products (3–4× faster per operation on CPU at these sizes). Together, the svm-eq workload
(n = 3, T = 4, d = 10, ReLU head) trains 3.3× faster than the dense loop
(``benchmarks/bench_train.py --span``, 1,000 runs).

:func:`span_plan` decides when the trainer takes this path (``space="auto"``): the W parameterisation in
float64, an update rule that is plain or normalized GD with a step size (no penalty, mirror map or
Polyak step), a kernel that is cheaper than the dense step, and a well-conditioned kernel on every instance
(β is not unique when K is singular, and a normalized step along a direction K nearly annihilates
would be long in β while short in W, so the logits ``Kβ`` would lose digits). The two paths agree to
round-off (tests/test_train_span.py). This path does not run the rule's transforms, as it steps the
coefficients β rather than W: :func:`span_plan` takes from the rule only its ε and its step size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .._validation import check_positive_int
from ..model import EXP_CLIP, Batch, FullW, Parameterization, risk_and_scaled_logit_grad
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
    "SPAN_MAX_N",
    "SPAN_COST_RATIO",
    "SPAN_MIN_RECORD_EVERY",
]

# The span path is taken only where every instance's kernel (restricted to its range) has condition
# number below this: the logits Kβ then keep at least ~6 more digits than the loss needs.
SPAN_MAX_COND = 1e8
# ``space="auto"`` takes the span path when N ≤ SPAN_SMALL_N, or N ≤ SPAN_MAX_N and N² ≤ SPAN_COST_RATIO·n·d²
# (per-run work of one step: two N×N products against the dense path's two n×d×d ones; the (N, N, R)
# kernel of the runs-last layout stops fitting in cache beyond SPAN_MAX_N), and when W is recorded at
# most every SPAN_MIN_RECORD_EVERY steps (forming W costs N·d² per record). Crossovers measured on CPU,
# 1,000 runs, one thread (benchmarks/bench_train.py --span).
SPAN_SMALL_N = 12
SPAN_MAX_N = 24
SPAN_COST_RATIO = 1.0
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
    if not isinstance(par, Parameterization):
        raise TypeError(f"par must be a Parameterization (FullW, FactoredKQ), got {type(par).__name__}")
    if not isinstance(rule, Transform):
        raise TypeError(f"rule must be a Transform (attsvm.training.optim), got {type(rule).__name__}")
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
    if not isinstance(batch, Batch):
        raise TypeError(f"batch must be a Batch (attsvm.model.Batch.from_problems), got {type(batch).__name__}")
    B, n, T, d = batch.X.shape
    Xf = batch.X.reshape(B, n * T, d)
    Zf = batch.Z.repeat_interleave(T, dim=1)
    return Xf, Zf, (Xf @ Xf.transpose(-1, -2)) * (Zf @ Zf.transpose(-1, -2))


def span_is_cheaper(n: int, T: int, d: int, record_every: int) -> bool:
    """Whether the span form is expected to be faster (:data:`SPAN_SMALL_N`, :data:`SPAN_MAX_N`,
    :data:`SPAN_COST_RATIO`, :data:`SPAN_MIN_RECORD_EVERY`)."""
    n, T, d = check_positive_int(n, "n"), check_positive_int(T, "T"), check_positive_int(d, "d")
    record_every = check_positive_int(record_every, "record_every")
    N = n * T
    cheaper = N <= SPAN_SMALL_N or (N <= SPAN_MAX_N and N * N <= SPAN_COST_RATIO * n * d * d)
    return record_every >= SPAN_MIN_RECORD_EVERY and cheaper


def span_well_conditioned(K: Tensor) -> bool:
    """Whether every kernel in K (B, N, N) is finite and has a condition number below
    :data:`SPAN_MAX_COND` (the logit gradients sum to zero within each sequence, so the steps live in a
    subspace; K is checked whole, which is stricter). The eigenvalues are taken in float64 whatever
    the batch's dtype (float32 cannot resolve the small ones)."""
    if not isinstance(K, Tensor):
        raise TypeError(f"K must be a torch tensor (B, N, N), got {type(K).__name__}")
    if K.ndim != 3 or K.shape[1] != K.shape[2] or K.shape[0] == 0 or K.shape[1] == 0:
        raise ValueError(f"K must be a stack of square kernels (B, N, N) with B, N >= 1, got {tuple(K.shape)}")
    K64 = K.detach().to(device="cpu", dtype=torch.float64)
    if not bool(torch.isfinite(K64).all()):
        return False
    try:
        ev = torch.linalg.eigvalsh(K64)  # ascending
    except RuntimeError:  # (torch's LinAlgError): no decision, so no span form
        return False
    return bool(torch.all(ev[:, 0] > ev[:, -1] / SPAN_MAX_COND))


def _span_matrix(coef: Tensor, Xf: Tensor, Zf: Tensor) -> Tensor:
    """``Σ_j coef_j x_j z_jᵀ`` (R, d, d) for coefficients (R, N)."""
    return (coef.unsqueeze(-1) * Xf).transpose(-1, -2) @ Zf


def _logit_grad_last(XV: Tensor, y: Tensor, head: str, loss: str, g: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`attsvm.model.risk_and_scaled_logit_grad` for the linear and ReLU heads, with the runs on the
    last axis: token table XV (n, T, k, B), labels y (n, B), logits g (n, T, R). Returns the risk (R,),
    ``δ'`` (n, T, R), the probabilities (n, T, R) and c (R,); the same formulas, term by term."""
    n = g.shape[0]
    gmax, ref = g.max(1, keepdim=True)  # (n, 1, R)
    gap = gmax - g
    ez = torch.exp(-gap)
    Zs = ez.sum(1, keepdim=True)
    s = ez / Zs
    logscale = gap.scatter(1, ref, float("inf")).amin(dim=(0, 1))  # (R,)
    s_scaled = torch.exp(torch.clamp(logscale - gap, max=0.0)) / Zs  # e^{c} s_it for t ≠ r_i
    a = (s.unsqueeze(2) * XV).sum(1)  # (n, k, R) = Vᵀ o_i
    f = a[:, 0] if head == "linear" else torch.relu(a).sum(1)  # (n, R)
    uy = y * f
    if loss == "logistic":
        losses = torch.nn.functional.softplus(-uy)
        dl = -torch.sigmoid(-uy)
    elif loss == "exponential":
        losses = torch.exp(torch.clamp(-uy, max=EXP_CLIP))
        dl = -losses
    else:
        losses = -uy
        dl = -torch.ones_like(uy)
    q = (y * dl).unsqueeze(1)  # (n, 1, R): ∂ℓ/∂f
    if head == "relu":
        q = q * (a > 0).to(a.dtype)  # (n, k, R)
    Xe = (XV * q.unsqueeze(1)).sum(2)  # (n, T, R): x_itᵀ e_i
    c = Xe - torch.gather(Xe, 1, ref)
    cbar = (s * c).sum(1, keepdim=True)
    delta = (s_scaled * (c - cbar)).scatter(1, ref, 0.0) / n
    delta = delta.scatter(1, ref, -delta.sum(1, keepdim=True))
    return losses.mean(0), delta, s, logscale


def _runs_last(t: Tensor, k: int) -> Tensor:
    """Move the leading (run) axis of ``t`` behind its k other axes, contiguous."""
    return t.permute(*range(1, k + 1), 0).contiguous()


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
    neg_eta = plan.step.init((W0,))  # −η (R, 1, 1), or None for a schedule
    eps = plan.eps
    last = batch.head in ("linear", "relu") and batch.loss != "cross_entropy"
    if last:  # runs on the last axis (module doc)
        Kl, g0l = _runs_last(K, 2), g0.t().contiguous()  # (N, N, B), (N, R)
        XVl, yl = _runs_last(batch.XV, 3), _runs_last(batch.y, 1)  # (n, T, k, B), (n, B)
    beta = torch.zeros((N, R) if last else (R, N), dtype=W0.dtype, device=W0.device)
    s = torch.empty(0)

    def kernel_times(v: Tensor) -> Tensor:  # K v for coefficients v (R, N), or (N, R) with runs last
        return (Kl * v.unsqueeze(0)).sum(1) if last else (K @ v.unsqueeze(-1)).squeeze(-1)

    for k in range(steps + 1):
        g = g0l + kernel_times(beta) if last else g0 + kernel_times(beta)
        if last:
            L, delta, s, logc = _logit_grad_last(XVl, yl, batch.head, batch.loss, g.view(n, T, R))
            df = delta.view(N, R)
        else:
            losses, delta, s, logc = risk_and_scaled_logit_grad(batch, g.view(R, n, T))
            L, df = losses.mean(-1), delta.reshape(R, N)  # e^{c} ∂L/∂g
        if k == recorder.next_step:
            b, dfr = (beta.t(), df.t()) if last else (beta, df)
            W = W0 + _span_matrix(b, Xf, Zf)
            gW = _span_matrix(dfr, Xf, Zf) * torch.exp(-logc)[:, None, None]
            recorder.record(L, W, (gW,), (W,), s.permute(2, 0, 1) if last else s)
        if k == steps:
            break
        if neg_eta is None:
            (u,), _ = plan.step.update((torch.ones_like(W0[:, :1, :1]),), None, (W0,), loss=L, step=k)
            eta = -u[:, 0, 0]
        else:
            eta = -neg_eta[:, 0, 0]
        if eps is None:  # plain GD: the true gradient is e^{−c} δ
            coef = -eta * torch.exp(-logc)
        else:
            # e^{c}‖∇_W L‖_F. For ε = 0, δ is scaled by its largest entry first (as NormalizeByNorm does): a
            # tiny loss derivative would otherwise underflow in the square and stop the run. (With ε > 0
            # such a step is ~η‖∇‖/ε ≈ 0 either way.)
            axis = 0 if last else -1
            if eps > 0:
                denom = torch.sqrt((kernel_times(df) * df).sum(axis).clamp_min(0.0)) + eps * torch.exp(logc)
            else:
                big = df.abs().amax(axis).clamp_min(torch.finfo(df.dtype).tiny)
                unit = df / (big if last else big[:, None])
                denom = big * torch.sqrt((kernel_times(unit) * unit).sum(axis).clamp_min(0.0))
            coef = torch.where(denom > 0, -eta / torch.where(denom > 0, denom, 1.0), 0.0)
        beta = beta + (coef * df if last else coef[:, None] * df)
        if bar is not None:
            bar.update(1)  # type: ignore[attr-defined]
    b = beta.t() if last else beta
    return W0 + _span_matrix(b, Xf, Zf), (s.permute(2, 0, 1).contiguous() if last else s)
