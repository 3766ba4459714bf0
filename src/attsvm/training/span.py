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
matrix products (3–4× faster per operation on CPU at these sizes), written into buffers allocated
once per training (:class:`_RunsLast`). Together, the svm-eq workload
(n = 3, T = 4, d = 10, ReLU head) trains 3.3× faster than the dense loop
(``benchmarks/bench_train.py --span``, 1,000 runs).

With numba installed, the linear- and ReLU-head runs in float64 on the CPU with a constant step size go
to a compiled loop instead (:mod:`attsvm.training._span_compiled`, :func:`compiled_loop_applies`): the
same arithmetic one run at a time, its kernel and coefficients in cache for all its steps and no call
per step. The logits follow the step ``β += a_k δ'`` as ``g += a_k K δ'`` (K δ' is the product the
step's norm needs anyway) instead of being recomputed. It agrees with the torch loop to round-off, and
pays off at larger N than the torch loop does (:data:`SPAN_COMPILED_MAX_N`).

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
from types import ModuleType

import numpy as np
import torch
from torch import Tensor

from .._threads import compiled_wanted
from .._validation import check_positive_int
from ..model import EXP_CLIP, Batch, FullW, Parameterization, risk_and_scaled_logit_grad
from .optim import Chain, NormalizeByNorm, StepSize, Transform
from .recording import Recorder

__all__ = [
    "SpanPlan",
    "span_plan",
    "span_kernel",
    "span_is_cheaper",
    "compiled_loop_applies",
    "compiled",
    "span_well_conditioned",
    "train_span",
    "SPAN_MAX_COND",
    "SPAN_SMALL_N",
    "SPAN_MAX_N",
    "SPAN_COST_RATIO",
    "SPAN_MIN_RECORD_EVERY",
    "SPAN_COMPILED_MAX_N",
    "SPAN_COMPILED_COST_RATIO",
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
# The compiled loop (numba) keeps a run's kernel in cache and pays no call per step: measured faster than
# the dense loop at every shape tried, up to N = 160 and N² = 21·n·d² (1.5–5×; 300–1,000 runs, one thread,
# benchmarks/bench_train.py --span); beyond those the choice is left to the dense loop.
SPAN_COMPILED_MAX_N = 160
SPAN_COMPILED_COST_RATIO = 24.0


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


def span_is_cheaper(n: int, T: int, d: int, record_every: int, *, compiled: bool = False) -> bool:
    """Whether the span form is expected to be faster (:data:`SPAN_SMALL_N`, :data:`SPAN_MAX_N`,
    :data:`SPAN_COST_RATIO`, :data:`SPAN_MIN_RECORD_EVERY`; with ``compiled``, the compiled loop's
    :data:`SPAN_COMPILED_MAX_N` and :data:`SPAN_COMPILED_COST_RATIO`)."""
    n, T, d = check_positive_int(n, "n"), check_positive_int(T, "T"), check_positive_int(d, "d")
    record_every = check_positive_int(record_every, "record_every")
    N = n * T
    if compiled:
        cheaper = N <= SPAN_COMPILED_MAX_N and N * N <= SPAN_COMPILED_COST_RATIO * n * d * d
    else:
        cheaper = N <= SPAN_SMALL_N or (N <= SPAN_MAX_N and N * N <= SPAN_COST_RATIO * n * d * d)
    return record_every >= SPAN_MIN_RECORD_EVERY and cheaper


def compiled_loop_applies(batch: Batch, plan: SpanPlan, W0: Tensor) -> bool:
    """Whether :func:`train_span` runs the compiled loop for this batch, plan and start (R, d, d): numba
    installed and not switched off, a linear or ReLU head, float64 on the CPU, a constant step size."""
    return (
        compiled() is not None
        and batch.head in ("linear", "relu")
        and batch.loss != "cross_entropy"
        and W0.dtype == torch.float64
        and W0.device.type == "cpu"
        and plan.step.init((W0,)) is not None
    )


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


def _record(
    recorder: Recorder,
    W0: Tensor,
    beta: Tensor,
    df: Tensor,
    L: Tensor,
    logc: Tensor,
    s: Tensor,
    kernel: tuple[Tensor, Tensor, Tensor],
) -> None:
    """Record the state at coefficients β (R, N) with scaled logit gradient ``δ'`` (R, N), risk L (R,), scale
    c (R,) and probabilities s (R, n, T): W and its true gradient ``e^{−c} Σ δ'_j x_j z_jᵀ`` formed here."""
    Xf, Zf, _ = kernel
    W = W0 + _span_matrix(beta, Xf, Zf)
    gW = _span_matrix(df, Xf, Zf) * torch.exp(-logc)[:, None, None]
    recorder.record(L, W, (gW,), (W,), s)


class _RunsLast:
    """The arithmetic of one step with the runs on the last axis, in buffers allocated once.

    :meth:`logit_grad` is :func:`attsvm.model.risk_and_scaled_logit_grad` for the linear and ReLU heads
    with token table XV (n, T, k, B) and labels y (n, B): the same formulas, term by term and in the same
    order (so the same numbers to the last bit), written into the buffers instead of new tensors. Its
    outputs are views of those buffers, valid until the next call."""

    def __init__(self, K: Tensor, XV: Tensor, y: Tensor, head: str, loss: str, runs: int) -> None:
        n, T, k, _ = XV.shape
        N, R = n * T, runs
        dt, dev = XV.dtype, XV.device

        def new(*shape: int, dtype: torch.dtype = dt) -> Tensor:
            return torch.empty(shape, dtype=dtype, device=dev)

        self.K, self.XV, self.head, self.loss, self.n, self.T = K, XV, head, loss, n, T
        self.prod = new(N, N, R)  # the products K_ij v_j of K v
        self.Kv = new(N, R)
        self.g = new(N, R)
        self.gmax, self.ref = new(n, 1, R), new(n, 1, R, dtype=torch.int64)
        self.gap, self.ez, self.s, self.s_scaled, self.nt = (new(n, T, R) for _ in range(5))
        self.Zs, self.gat, self.cbar, self.dsum = (new(n, 1, R) for _ in range(4))
        self.logscale = new(R)
        self.xprod = new(n, T, k, R)  # the products of s (then of q) with the token table
        self.a = new(n, k, R)
        self.ra = new(n, k, R) if head == "relu" else self.a
        self.pos = new(n, k, R)  # 1.0 where a > 0, else 0.0 (a float mask: a bool one costs a cast per product)
        self.qk = new(n, k, R)
        self.f, self.nuy, self.dl, self.q = (new(n, R) for _ in range(4))
        self.ny = -y  # −y_i: (−y)·u is −(y·u) to the last bit, so −y f and −y ℓ' take one product each
        self.delta = new(n, T, R)
        if loss not in ("logistic", "exponential"):  # correlation: ∂ℓ/∂f = −1
            torch.mul(y, -torch.ones_like(self.q), out=self.q)
        # views of the buffers, taken once
        self.g3, self.df = self.g.view(n, T, R), self.delta.view(N, R)
        self.df_row = self.df.unsqueeze(0)
        self.s_col = self.s.unsqueeze(2)  # (n, T, 1, R)
        self.q_col = (self.qk if head == "relu" else self.q.unsqueeze(1)).unsqueeze(1)  # (n, 1, k, R)
        self.q1 = self.q.unsqueeze(1)
        self.f_lin = self.a[:, 0]

    def kernel_times(self, v: Tensor) -> Tensor:
        """K v (N, R) for coefficients v (N, R), into a buffer."""
        return self.kernel_times_row(v.unsqueeze(0))

    def kernel_times_row(self, v_row: Tensor) -> Tensor:
        """K v (N, R) for coefficients ``v_row = v.unsqueeze(0)`` (1, N, R), into a buffer."""
        torch.mul(self.K, v_row, out=self.prod)
        return torch.sum(self.prod, 1, out=self.Kv)

    def logit_grad(self, g: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Risk (R,), ``δ'`` (n, T, R), probabilities (n, T, R) and c (R,) at logits g (n, T, R)."""
        n, XV = self.n, self.XV
        gmax, ref, gap, ez, Zs, s = self.gmax, self.ref, self.gap, self.ez, self.Zs, self.s
        torch.max(g, 1, keepdim=True, out=(gmax, ref))
        torch.sub(gmax, g, out=gap)
        torch.neg(gap, out=ez).exp_()
        torch.sum(ez, 1, keepdim=True, out=Zs)
        torch.div(ez, Zs, out=s)
        # gap at r_i is not needed below (δ' is set there at the end): it becomes the +∞ of the minimum
        gap.scatter_(1, ref, float("inf"))
        logscale = torch.amin(gap, dim=(0, 1), out=self.logscale)  # (R,)
        s_scaled = torch.sub(logscale, gap, out=self.s_scaled).clamp_(max=0.0).exp_().div_(Zs)  # e^{c} s_it, t ≠ r_i
        a = torch.sum(torch.mul(self.s_col, XV, out=self.xprod), 1, out=self.a)  # (n, k, R) = Vᵀ o_i
        if self.head == "linear":
            f = self.f_lin
        else:  # 1ᵀReLU(a): clamp_min gives torch.relu's numbers
            f = torch.sum(torch.clamp_min(a, 0.0, out=self.ra), 1, out=self.f)
        nuy = torch.mul(self.ny, f, out=self.nuy)  # −y_i f_i
        if self.loss == "logistic":
            losses = torch.nn.functional.softplus(nuy)
            torch.mul(self.ny, torch.sigmoid(nuy, out=self.dl), out=self.q)  # y_i ℓ'(y_i f_i)
        elif self.loss == "exponential":
            losses = torch.exp(torch.clamp(nuy, max=EXP_CLIP))
            torch.mul(self.ny, losses, out=self.q)
        else:
            losses = nuy
        if self.head == "relu":  # ∂ℓ/∂f (n, 1, R) on the active units: (n, k, R)
            torch.mul(self.q1, torch.gt(a, 0, out=self.pos), out=self.qk)
        Xe = torch.sum(torch.mul(XV, self.q_col, out=self.xprod), 2, out=self.nt)  # (n, T, R): x_itᵀ e_i
        c = Xe.sub_(torch.gather(Xe, 1, ref, out=self.gat))
        cbar = torch.sum(torch.mul(s, c, out=self.delta), 1, keepdim=True, out=self.cbar)
        delta = torch.mul(s_scaled, c.sub_(cbar), out=self.delta).scatter_(1, ref, 0.0).div_(n)
        delta.scatter_(1, ref, torch.sum(delta, 1, keepdim=True, out=self.dsum).neg_())
        return losses.mean(0), delta, s, logscale


def _runs_last(t: Tensor, k: int) -> Tensor:
    """Move the leading (run) axis of ``t`` behind its k other axes, contiguous."""
    return t.permute(*range(1, k + 1), 0).contiguous()


def _train_runs_last(
    batch: Batch,
    W0: Tensor,
    plan: SpanPlan,
    steps: int,
    recorder: Recorder,
    kernel: tuple[Tensor, Tensor, Tensor],
    g0: Tensor,
    bar: object | None,
) -> tuple[Tensor, Tensor]:
    """:func:`train_span` for the linear and ReLU heads, with the runs on the last axis (module doc)."""
    R = W0.shape[0]
    n, T = batch.n, batch.T
    N = n * T
    Xf, Zf, K = kernel
    ws = _RunsLast(_runs_last(K, 2), _runs_last(batch.XV, 3), _runs_last(batch.y, 1), batch.head, batch.loss, R)
    g0l = g0.t().contiguous()  # (N, R)
    neg_eta = plan.step.init((W0,))  # −η (R, 1, 1), or None for a schedule
    minus_eta = None if neg_eta is None else neg_eta[:, 0, 0]  # −η (R,)
    one, zero = (torch.tensor(v, dtype=W0.dtype, device=W0.device) for v in (1.0, 0.0))
    eps = plan.eps
    beta = torch.zeros((N, R), dtype=W0.dtype, device=W0.device)
    step = torch.empty((N, R), dtype=W0.dtype, device=W0.device)
    s = torch.empty(0)
    beta_row, df = beta.unsqueeze(0), ws.df
    for k in range(steps + 1):
        torch.add(g0l, ws.kernel_times_row(beta_row), out=ws.g)
        L, _, s, logc = ws.logit_grad(ws.g3)  # δ' is ws.df
        if k == recorder.next_step:
            _record(recorder, W0, beta.t(), df.t(), L, logc, s.permute(2, 0, 1), kernel)
        if k == steps:
            break
        if minus_eta is None:
            (u,), _ = plan.step.update((torch.ones_like(W0[:, :1, :1]),), None, (W0,), loss=L, step=k)
            minus_eta_k = u[:, 0, 0]
        else:
            minus_eta_k = minus_eta
        if eps is None:  # plain GD: the true gradient is e^{−c} δ
            coef = minus_eta_k * torch.exp(-logc)
        else:
            # e^{c}‖∇_W L‖_F, as in train_span's generic loop
            if eps > 0:
                quad = torch.sum(ws.kernel_times_row(ws.df_row).mul_(df), 0).clamp_min_(0.0).sqrt_()
                denom = quad.add_(eps * torch.exp(logc))
            else:
                big = df.abs().amax(0).clamp_min(torch.finfo(df.dtype).tiny)
                unit = df / big
                denom = big * torch.sqrt((ws.kernel_times(unit) * unit).sum(0).clamp_min(0.0))
            pos = denom > 0
            coef = torch.where(pos, minus_eta_k / torch.where(pos, denom, one), zero)
        beta.add_(torch.mul(coef, df, out=step))
        if bar is not None:
            bar.update(1)  # type: ignore[attr-defined]
    return W0 + _span_matrix(beta.t(), Xf, Zf), s.permute(2, 0, 1).contiguous()


def compiled() -> ModuleType | None:
    """The compiled span loop :mod:`attsvm.training._span_compiled`, or None where numba is not installed
    (the ``fast`` extra) or ``ATTSVM_COMPILED=0`` turns it off."""
    global _compiled_module
    if _compiled_module is None:
        chosen: ModuleType | bool = False
        if compiled_wanted():
            try:
                from . import _span_compiled

                chosen = _span_compiled
            except ImportError:  # numba not installed: the torch loop
                pass
        _compiled_module = chosen
    return _compiled_module if isinstance(_compiled_module, ModuleType) else None


_compiled_module: ModuleType | bool | None = None  # None: not chosen yet; False: the torch loop
# at most this many updates per call of the compiled loop: the progress bar moves and Ctrl-C is seen
# between calls (each call evaluates its end state once more, a 1/COMPILED_CHUNK share of the work)
COMPILED_CHUNK = 250


def _train_compiled(
    mod: ModuleType,
    batch: Batch,
    W0: Tensor,
    plan: SpanPlan,
    steps: int,
    recorder: Recorder,
    kernel: tuple[Tensor, Tensor, Tensor],
    g0: Tensor,
    bar: object | None,
) -> tuple[Tensor, Tensor]:
    """:func:`train_span` for the linear and ReLU heads by the compiled loop (module doc): float64 on the
    CPU, a constant step size per run."""
    R = W0.shape[0]
    n, T = batch.n, batch.T
    Xf, Zf, K = kernel

    def arr(t: Tensor) -> np.ndarray:
        return np.require(t.detach().numpy(), np.float64, ["C", "W"])

    neg_eta = plan.step.init((W0,))
    assert neg_eta is not None  # (train_span sends schedules to the torch loop)
    eta = arr(-neg_eta[:, 0, 0])
    Kn, XVn, yn = arr(K), arr(batch.XV), arr(batch.y)
    g = arr(g0).copy()  # the logits g₀ + Kβ, stepped with β
    beta = np.zeros((R, n * T))
    eps = mod.EPS_PLAIN if plan.eps is None else float(plan.eps)
    options = {
        "eps": eps,
        "relu": batch.head == "relu",
        "loss": mod.LOSS_CODES.get(batch.loss, -1),
        "exp_clip": EXP_CLIP,
        "threads": torch.get_num_threads(),
    }
    k = 0
    while True:
        target = recorder.next_step if 0 <= recorder.next_step <= steps else steps
        todo = min(target - k, COMPILED_CHUNK)
        s, df, L, logc = mod.advance(Kn, XVn, yn, g, beta, eta, updates=todo, **options)
        if bar is not None and todo:
            bar.update(todo)  # type: ignore[attr-defined]
        k += todo
        if k == recorder.next_step:
            Lt, dft, ct, st = (torch.from_numpy(a) for a in (L, df, logc, s))
            _record(recorder, W0, torch.from_numpy(beta), dft, Lt, ct, st.view(R, n, T), kernel)
        if k == steps:
            break
    return W0 + _span_matrix(torch.from_numpy(beta), Xf, Zf), torch.from_numpy(s).view(R, n, T)


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
    kernel = span_kernel(batch) if kernel is None else kernel
    Xf, Zf, K = kernel
    g0 = (batch.X * (batch.Z @ W0.transpose(-1, -2)).unsqueeze(-2)).sum(-1).reshape(R, N)
    if compiled_loop_applies(batch, plan, W0):
        return _train_compiled(compiled(), batch, W0, plan, steps, recorder, kernel, g0, bar)  # type: ignore[arg-type]
    if batch.head in ("linear", "relu") and batch.loss != "cross_entropy":  # runs on the last axis (module doc)
        return _train_runs_last(batch, W0, plan, steps, recorder, kernel, g0, bar)
    neg_eta = plan.step.init((W0,))  # −η (R, 1, 1), or None for a schedule
    eps = plan.eps
    beta = torch.zeros((R, N), dtype=W0.dtype, device=W0.device)
    s = torch.empty(0)

    def kernel_times(v: Tensor) -> Tensor:  # K v for coefficients v (R, N)
        return (K @ v.unsqueeze(-1)).squeeze(-1)

    for k in range(steps + 1):
        g = g0 + kernel_times(beta)
        losses, delta, s, logc = risk_and_scaled_logit_grad(batch, g.view(R, n, T))
        L, df = losses.mean(-1), delta.reshape(R, N)  # e^{c} ∂L/∂g
        if k == recorder.next_step:
            _record(recorder, W0, beta, df, L, logc, s, kernel)
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
            if eps > 0:
                denom = torch.sqrt((kernel_times(df) * df).sum(-1).clamp_min(0.0)) + eps * torch.exp(logc)
            else:
                big = df.abs().amax(-1).clamp_min(torch.finfo(df.dtype).tiny)
                unit = df / big[:, None]
                denom = big * torch.sqrt((kernel_times(unit) * unit).sum(-1).clamp_min(0.0))
            coef = torch.where(denom > 0, -eta / torch.where(denom > 0, denom, 1.0), 0.0)
        beta = beta + coef[:, None] * df
        if bar is not None:
            bar.update(1)  # type: ignore[attr-defined]
    return W0 + _span_matrix(beta, Xf, Zf), s
