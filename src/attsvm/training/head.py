"""Training the attention and its head together: W or (K, Q) jointly with a linear or MLP head
(docs/spec.md §4–5).

:func:`attsvm.train.train` keeps the head fixed, as the paper does. Here every head weight — the first
layer V (for SwiGLU ``[up | gate]``), the later hidden layers and the output weights — is a trained
group too. Each step is normalised GD per run and per group (``g/‖g‖_F``, ε = 0), the attention groups
with step ``lr`` and the head groups with ``lr_head``: two update rules of the chain
(:func:`attsvm.training.optim.normalized_gd`), one per set of groups. The attention gradient is the
trainer's round-off-stable one (:func:`attsvm.model.risk_and_scaled_grad`, the head's current weights in the
batch); the head gradient is autograd's with the attention probabilities held fixed (they enter the
head's loss only as weights, with no cancellation). All runs train as one batched program.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray

from .._validation import check_finite_scalar, check_positive_int, warn_nonfinite
from ..model import (
    Batch,
    as_problem_list,
    head_outputs,
    parameterization,
    risk_and_scaled_grad,
    sequence_losses,
)
from ..problem import AttentionProblem, Head
from .init import run_seeds
from .optim import normalized_gd
from .recording import Trajectory

__all__ = ["HeadTrainResult", "train_with_head"]


@dataclass
class HeadTrainResult:
    """The outcome of :func:`train_with_head` for R runs.

    W (R, d, d): final attention weights (``KQᵀ`` for (K, Q)); heads: the R trained heads; probs
    (R, n, T): final attention; selected (R, n): its argmax; history: ``step`` (S,), ``loss`` (R, S),
    ``W`` (R, S, d, d); param, steps, lr, lr_head, seeds: the settings.
    """

    W: NDArray[np.float64]
    heads: list[Head]
    probs: NDArray[np.float64]
    history: dict[str, NDArray]
    param: str
    steps: int
    lr: float
    lr_head: float
    seeds: NDArray[np.int64]

    @property
    def selected(self) -> NDArray[np.int64]:
        return np.argmax(self.probs, axis=-1).astype(np.int64)


def _rebuild(head: Head, V: NDArray, hidden: list[NDArray], out: NDArray | None) -> Head:
    if head.kind == "linear":
        return Head.linear(V[:, 0])
    spec = head.mlp_spec
    assert spec is not None and out is not None
    k = spec.width
    gate = V[:, k:] if spec.activation == "swiglu" else None
    return Head.mlp(V[:, :k], activation=spec.activation, hidden=hidden, out=out, gate=gate)


def train_with_head(
    problems: AttentionProblem | Sequence[AttentionProblem],
    *,
    param: str = "W",
    steps: int,
    lr: float = 0.1,
    lr_head: float | None = None,
    seed: int | Sequence[int] = 0,
    record_every: int = 10,
    loss: str | None = None,
) -> HeadTrainResult:
    """Train W (or (K, Q)) and the head of R problems jointly (module doc).

    Parameters
    ----------
    problems : AttentionProblem or R of them, sharing n, T, d and the head's kind and shapes; each
        problem's head is its run's initial head. Linear and MLP heads (:meth:`Head.mlp`; a ReLU head
        is ``Head.mlp(V, activation="relu")``).
    param : "W" or "KQ". steps, lr : steps and the attention step size; lr_head : the head's (default lr).
    seed : per-run seeds of the attention's initialisation (the published ``nn.Linear`` draw).
    record_every : stride of the recorded W and loss (the final step is always recorded).
    loss : "logistic" (default: the problems' loss), "exponential" or "correlation".
    """
    plist = as_problem_list(problems)
    kind = plist[0].head.kind
    if kind not in ("linear", "mlp"):
        raise ValueError(
            f"train_with_head trains linear and MLP heads, got a {kind!r} head "
            "(a ReLU head is Head.mlp(V, activation='relu'); multiclass heads are not supported here)"
        )
    steps = check_positive_int(steps, "steps", minimum=0)
    lr = check_finite_scalar(lr, "lr", positive=True)
    lr_head = lr if lr_head is None else check_finite_scalar(lr_head, "lr_head", positive=True)
    record_every = check_positive_int(record_every, "record_every")
    R = len(plist)
    seeds = run_seeds(seed, R)
    batch = Batch.from_problems(plist, loss=loss)
    if batch.size != R:  # one problem: give every run its own head copy
        batch = dataclasses.replace(
            batch,
            V=batch.V.expand(R, -1, -1).clone(),
            mlp_hidden=tuple(H.expand(R, -1, -1).clone() for H in batch.mlp_hidden),
            mlp_out=None if batch.mlp_out is None else batch.mlp_out.expand(R, -1).clone(),
        )
    d = batch.d
    par = parameterization(param, d)  # type: ignore[arg-type]
    init = []
    for s in seeds:
        g = torch.Generator().manual_seed(int(s))
        init.append(par.draw("pytorch", g, 1.0))
    att = [torch.as_tensor(np.stack([x[j] for x in init])) for j in range(len(par.groups))]
    head = [batch.V.clone(), *[H.clone() for H in batch.mlp_hidden]]
    n_hidden = len(batch.mlp_hidden)
    has_out = batch.mlp_out is not None
    if batch.mlp_out is not None:
        head.append(batch.mlp_out.clone()[..., None])  # (R, k, 1): every group of a rule is (R, ·, ·)
    rule_att, rule_head = normalized_gd(lr, eps=0.0), normalized_gd(lr_head, eps=0.0)
    att_params, head_params = tuple(att), tuple(head)
    state_att, state_head = rule_att.init(att_params), rule_head.init(head_params)
    recorder = Trajectory(steps, record_every, R)
    s = None

    def with_head(hs: Sequence[torch.Tensor]) -> Batch:
        return dataclasses.replace(
            batch, V=hs[0], mlp_hidden=tuple(hs[1 : 1 + n_hidden]), mlp_out=hs[-1][..., 0] if has_out else None
        )

    for k in range(steps + 1):
        cur = with_head(head_params)
        W = par.weights(att_params)
        L, G, s, _ = risk_and_scaled_grad(cur, W)
        if k == recorder.next_step:
            recorder.record(loss=L.numpy(), W=W.numpy())
        if k == steps:
            break
        g_att = par.grads(G, att_params)
        with torch.enable_grad():
            hv = [h.detach().requires_grad_(True) for h in head_params]
            hb = with_head(hv)
            o = (s.detach().unsqueeze(-1) * batch.X).sum(-2)  # (R, n, d) attention outputs
            risk = sequence_losses(hb, head_outputs(hb, o)).mean(-1).sum()
            g_head = torch.autograd.grad(risk, hv)
        # (a gradient may come transposed in memory; contiguous, the norms sum in row-major order)
        g_att, g_head = tuple(g.contiguous() for g in g_att), tuple(g.contiguous() for g in g_head)
        u_att, state_att = rule_att.update(g_att, state_att, att_params, loss=L, step=k)
        u_head, state_head = rule_head.update(g_head, state_head, head_params, loss=L, step=k)
        att_params = tuple(a + u for a, u in zip(att_params, u_att))
        head_params = tuple(h + u for h, u in zip(head_params, u_head))
    assert s is not None
    Vf = head_params[0].numpy()
    hid = [h.numpy() for h in head_params[1 : 1 + n_hidden]]
    outf = head_params[-1][..., 0].numpy() if has_out else None
    heads = [
        _rebuild(plist[min(r, len(plist) - 1)].head, Vf[r], [h[r] for h in hid], None if outf is None else outf[r])
        for r in range(R)
    ]
    Wf = par.weights(att_params).numpy()
    history = recorder.history()
    warn_nonfinite("train_with_head", Wf, Vf, history["loss"])
    return HeadTrainResult(
        W=Wf,
        heads=heads,
        probs=s.numpy(),
        history=history,
        param=par.name,
        steps=steps,
        lr=lr,
        lr_head=lr_head,
        seeds=np.asarray(seeds, dtype=np.int64),
    )
