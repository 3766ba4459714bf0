"""Training prompt attention: the prompt p alone, or p and the head v jointly (docs/spec.md §8,
"Prompt attention"; Tarzanagh, Li, Zhang, Oymak 2023).

The risk of R problems (:class:`attsvm.prompt.PromptProblem`, equal n, T, d, m) is

    L_r(p, v) = (1/n) Σ_i ℓ(y_i · vᵀ X_iᵀ softmax(X_i W p)),

with ℓ one of the losses of docs/spec.md §1: "logistic" ``log(1 + e^{−u})`` (as ``softplus``),
"exponential" ``e^{−u}`` (exponent clipped), "correlation" ``−u`` (the paper's "ℓ(x) = −x"). The
logits go through ``log_softmax``, so huge ‖p‖ (GD diverges in norm by design) gives no NaN or inf.
Each step is gradient descent, by default normalised per run and per group
(``g/‖g‖``, ε = 0, as in the published code up to its ε), with its own step size per group. The
gradients are analytic and round-off-stable (:func:`prompt_risk_and_scaled_grads`); autograd through
``softmax`` loses the p-gradient to cancellation once ``1 − s_ir`` is below round-off.

All runs train as one batched tensor program; a run's trajectory does not depend on its batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray

from .._validation import (
    as_float_array,
    check_bool,
    check_choice,
    check_finite_scalar,
    check_positive_int,
    warn_nonfinite,
)
from ..problem import LOSSES
from ..prompt import PromptProblem
from .init import run_seeds
from .optim import NormalizeByNorm, StepSize, chain
from .recording import Trajectory

__all__ = ["PromptResult", "train_prompt", "prompt_risk", "prompt_risk_and_scaled_grads"]


@dataclass
class PromptResult:
    """The outcome of :func:`train_prompt` for R runs.

    p (R, m), v (R, d): final parameters; selected (R, n): argmax of the final attention;
    history: ``step`` (S,), ``loss`` (R, S), ``p`` (R, S, m), ``v`` (R, S, d);
    problems, seeds, loss_name, lr, train_v, normalized, steps: the settings.
    """

    p: NDArray[np.float64]
    v: NDArray[np.float64]
    selected: NDArray[np.int64]
    history: dict[str, NDArray]
    problems: list[PromptProblem]
    seeds: NDArray[np.int64]
    loss_name: str
    lr: float
    train_v: bool
    normalized: bool
    steps: int


def _as_list(problems: PromptProblem | Sequence[PromptProblem]) -> list[PromptProblem]:
    plist = [problems] if isinstance(problems, PromptProblem) else list(problems)
    if not plist:
        raise ValueError("problems must hold at least one PromptProblem")
    for j, q in enumerate(plist):
        if not isinstance(q, PromptProblem):
            raise TypeError(f"problems[{j}] must be a PromptProblem, got {type(q).__name__}")
    shape = (plist[0].n, plist[0].T, plist[0].d, plist[0].m)
    for j, q in enumerate(plist):
        if (q.n, q.T, q.d, q.m) != shape:
            raise ValueError(
                f"problems must share (n, T, d, m) to train as one batch: problems[0] has {shape}, "
                f"problems[{j}] has {(q.n, q.T, q.d, q.m)}"
            )
    return plist


def _loss(name: str, u: torch.Tensor) -> torch.Tensor:
    if name == "logistic":
        return torch.nn.functional.softplus(-u)
    if name == "exponential":
        return torch.exp(torch.clamp(-u, max=700.0))
    return -u


def prompt_risk(
    X: torch.Tensor, K: torch.Tensor, y: torch.Tensor, p: torch.Tensor, v: torch.Tensor, loss: str
) -> torch.Tensor:
    """The risks (R,) of batched tokens X (R, n, T, d), keys K (R, n, T, m), labels y (R, n),
    prompts p (R, m) and heads v (R, d) (module doc)."""
    s = torch.softmax(torch.einsum("rntm,rm->rnt", K, p), dim=-1)
    out = torch.einsum("rnt,rntd,rd->rn", s, X, v)
    return _loss(loss, y * out).mean(dim=-1)


def prompt_risk_and_scaled_grads(
    X: torch.Tensor, K: torch.Tensor, y: torch.Tensor, p: torch.Tensor, v: torch.Tensor, loss: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Risks (R,), scaled gradients ``e^{c_p} ∇_p L`` (R, m) and ``e^{c_v} ∇_v L`` (R, d), and c_p, c_v (R,).

    The analytic gradient, written relative to the top-logit token r_i of each sequence (as the W
    trainer's :func:`attsvm.model.risk_and_scaled_grad`): with ``c_it = vᵀ(x_it − x_{ir})``,

        ∇_p L = (1/n) Σ_i ℓ'(u_i) y_i Σ_{t≠r} s_it (c_it − Σ_τ s_iτ c_iτ) (k_it − k_{ir}),
        ∇_v L = (1/n) Σ_i ℓ'(u_i) y_i X_iᵀ s_i,

    every term carrying its own ``s_it``: once attention saturates (``1 − s_ir`` below round-off) the
    p-gradient keeps full relative precision, where autograd's softmax backward returns exactly 0.
    The factors ``|ℓ'(u_i)| s_it`` are formed in log space and scaled by ``e^{c}`` so that the largest is
    1: the directions stay exact long after the gradients themselves underflow (normalised GD uses them).
    """
    n = X.shape[1]
    # broadcast products and last-axis sums rather than einsum: a run's numbers then do not depend on
    # how many runs share the batch (a batched matmul may block its sums by batch size)
    g = (K * p[:, None, None, :]).sum(-1)
    gmax, ref = g.max(-1, keepdim=True)
    gap = gmax - g
    ez = torch.exp(-gap)
    Zs = ez.sum(-1, keepdim=True)
    s = ez / Zs
    xv = (X * v[:, None, None, :]).sum(-1)  # vᵀ x_it
    u = y * (s * xv).sum(-1)  # (R, n)
    if loss == "logistic":
        losses = torch.nn.functional.softplus(-u)
        log_dl = -torch.nn.functional.softplus(u)  # log |ℓ'(u)| = log σ(−u)
    elif loss == "exponential":
        losses = torch.exp(torch.clamp(-u, max=700.0))
        log_dl = -u
    else:
        losses = -u
        log_dl = torch.zeros_like(u)
    # p: ∂L/∂g_it = −(1/n) |ℓ'_i| y_i s_it (c_it − c̄_i), for t ≠ r_i; the r_i term closes the sum
    c = xv - torch.gather(xv, -1, ref)
    cbar = (s * c).sum(-1, keepdim=True)
    logw = (log_dl.unsqueeze(-1) - gap - torch.log(Zs)).scatter(-1, ref, float("-inf"))
    cp = -logw.amax(dim=(-2, -1))  # (R,)
    w = torch.exp(logw + cp[:, None, None])
    delta = -(y.unsqueeze(-1) * w * (c - cbar)) / n
    delta = delta.scatter(-1, ref, -delta.sum(-1, keepdim=True))
    grad_p = (delta.unsqueeze(-1) * K).sum(-2).sum(-2)
    # v: ∂L/∂v = −(1/n) Σ_i |ℓ'_i| y_i X_iᵀ s_i
    cv = -log_dl.amax(-1)
    wv = torch.exp(log_dl + cv[:, None])
    o = (s.unsqueeze(-1) * X).sum(-2)  # (R, n, d)
    grad_v = -((y * wv).unsqueeze(-1) * o).sum(-2) / n
    return losses.mean(-1), grad_p, cp, grad_v, cv


def _init(
    value: ArrayLike | None,
    name: str,
    R: int,
    width: int,
    seeds: Sequence[int] | NDArray[np.int64],
    scale: float,
    offset: int,
) -> torch.Tensor:
    if value is not None:
        arr = as_float_array(value, name)
        if arr.shape not in ((width,), (R, width)):
            raise ValueError(f"{name} must have shape ({width},) or ({R}, {width}) (one per run), got {arr.shape}")
        return torch.as_tensor(np.broadcast_to(arr, (R, width)).copy())
    out = []
    for s in seeds:
        g = torch.Generator().manual_seed(int(s) * 2 + offset)
        out.append(torch.randn(width, generator=g, dtype=torch.float64) * scale)
    return torch.stack(out)


def train_prompt(
    problems: PromptProblem | Sequence[PromptProblem],
    *,
    steps: int,
    lr: float = 0.1,
    lr_v: float | None = None,
    loss: str = "logistic",
    train_v: bool = True,
    normalized: bool = True,
    p0: ArrayLike | None = None,
    v0: ArrayLike | None = None,
    seed: int | Sequence[int] = 0,
    init_scale: float = 0.01,
    record_every: int = 10,
) -> PromptResult:
    """Train p (and v) on R prompt-attention problems as one batched program (module doc).

    Parameters
    ----------
    problems : PromptProblem or R of them with equal (n, T, d, m).
    steps, lr : number of steps and the step size of p (and of v unless ``lr_v`` is given).
    loss : "logistic", "exponential" or "correlation" (ℓ(u) = −u).
    train_v : train the head too (joint training); False keeps each problem's fixed head ``v``.
    normalized : divide each group's gradient by its norm (per run) before the step.
    p0, v0 : initial values, (m,) / (d,) shared or (R, m) / (R, d) per run; default
        ``init_scale``·N(0, I) from each run's seed (``v0`` defaults to the fixed head when not trained).
    seed : per-run seeds (an int s gives s, s+1, …).
    record_every : stride of the recorded trajectory (the final step is always recorded).
    """
    plist = _as_list(problems)
    steps = check_positive_int(steps, "steps", minimum=0)
    lr = check_finite_scalar(lr, "lr", positive=True)
    lr_v = lr if lr_v is None else check_finite_scalar(lr_v, "lr_v", positive=True)
    loss = check_choice(loss, "loss", LOSSES)
    record_every = check_positive_int(record_every, "record_every")
    init_scale = check_finite_scalar(init_scale, "init_scale", positive=True)
    train_v = check_bool(train_v, "train_v")
    normalized = check_bool(normalized, "normalized")
    R = len(plist)
    q0 = plist[0]
    seeds = run_seeds(seed, R)
    if not train_v:
        missing = [j for j, q in enumerate(plist) if q.v is None]
        if missing:
            raise ValueError(f"train_v=False needs a fixed head v in every problem; problems {missing[:10]} have none")
        if v0 is not None:
            raise ValueError("v0 is only for train_v=True (a fixed head comes from each problem's v)")
    dt = torch.float64
    X = torch.as_tensor(np.stack([q.X for q in plist]), dtype=dt)
    K = torch.as_tensor(np.stack([q.keys for q in plist]), dtype=dt)
    y = torch.as_tensor(np.stack([q.y for q in plist]), dtype=dt)
    p = _init(p0, "p0", R, q0.m, seeds, init_scale, 0)
    if train_v:
        v = _init(v0, "v0", R, q0.d, seeds, init_scale, 1)
    else:
        v = torch.as_tensor(np.stack([q.v for q in plist]), dtype=dt)  # type: ignore[misc]
    parts = [NormalizeByNorm(0.0)] if normalized else []
    rule_p = chain(*parts, StepSize(lr))
    rule_v = chain(*parts, StepSize(lr_v))
    st_p = rule_p.init((p[..., None],))
    st_v = rule_v.init((v[..., None],))
    recorder = Trajectory(steps, record_every, R)
    for k in range(steps + 1):
        risk, gp, cp, gv, cv = prompt_risk_and_scaled_grads(X, K, y, p, v, loss)
        if k == recorder.next_step:
            recorder.record(loss=risk.numpy(), p=p.numpy(), v=v.numpy())
        if k == steps:
            break
        if not normalized:  # the gradients themselves (they underflow to 0 once the risk does)
            gp = gp * torch.exp(-cp)[:, None]
            gv = gv * torch.exp(-cv)[:, None]
        (up,), st_p = rule_p.update((gp[..., None],), st_p, (p[..., None],), loss=risk, step=k)
        p = p + up[..., 0]
        if train_v:
            (uv,), st_v = rule_v.update((gv[..., None],), st_v, (v[..., None],), loss=risk, step=k)
            v = v + uv[..., 0]
    logits = torch.einsum("rntm,rm->rnt", K, p)
    history = recorder.history()
    warn_nonfinite("train_prompt", p.numpy(), v.numpy(), history["loss"])
    return PromptResult(
        p=p.numpy().copy(),
        v=v.numpy().copy(),
        selected=logits.argmax(dim=-1).numpy().astype(np.int64),
        history=history,
        problems=plist,
        seeds=np.asarray(seeds, dtype=np.int64),
        loss_name=loss,
        lr=lr,
        train_v=bool(train_v),
        normalized=bool(normalized),
        steps=steps,
    )
