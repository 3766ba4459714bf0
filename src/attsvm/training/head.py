"""Training the attention and its head together: W or (K, Q) jointly with a linear or MLP head
(docs/spec.md §4–5).

:func:`attsvm.train.train` keeps the head fixed, as the paper does. Here every head weight — the first
layer V (for SwiGLU ``[up | gate]``), the later hidden layers and the output weights — is a trained
group too. Each step is normalised GD per run and per group (``g/‖g‖_F``, ε = 0), the attention groups
with step ``lr`` and the head groups with ``lr_head``. The attention gradient is the trainer's
round-off-stable one (:func:`attsvm.model.risk_and_scaled_grad`, the head's current weights in the
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
    _as_problem_list,
    head_outputs,
    parameterization,
    risk_and_scaled_grad,
    sequence_losses,
)
from ..problem import AttentionProblem, Head
from .init import run_seeds
from .optim import normalize_per_run

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
    plist = _as_problem_list(problems)
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
    if batch.mlp_out is not None:
        head.append(batch.mlp_out.clone())
    n_hidden = len(batch.mlp_hidden)
    rec = sorted(set(range(0, steps + 1, record_every)) | {steps})
    hist_W = np.zeros((R, len(rec), d, d))
    hist_loss = np.zeros((R, len(rec)))
    j = 0
    s = None
    for k in range(steps + 1):
        cur = dataclasses.replace(
            batch,
            V=head[0],
            mlp_hidden=tuple(head[1 : 1 + n_hidden]),
            mlp_out=head[-1] if batch.mlp_out is not None else None,
        )
        W = par.weights(att)
        L, G, s, _ = risk_and_scaled_grad(cur, W)
        if j < len(rec) and rec[j] == k:
            hist_W[:, j] = W.numpy()
            hist_loss[:, j] = L.numpy()
            j += 1
        if k == steps:
            break
        g_att = par.grads(G, att)
        with torch.enable_grad():
            hv = [h.detach().requires_grad_(True) for h in head]
            hb = dataclasses.replace(
                cur,
                V=hv[0],
                mlp_hidden=tuple(hv[1 : 1 + n_hidden]),
                mlp_out=hv[-1] if batch.mlp_out is not None else None,
            )
            o = (s.detach().unsqueeze(-1) * batch.X).sum(-2)  # (R, n, d) attention outputs
            risk = sequence_losses(hb, head_outputs(hb, o)).mean(-1).sum()
            g_head = torch.autograd.grad(risk, hv)
        att = [a - lr * u for a, u in zip(att, normalize_per_run(*g_att))]
        head = [h.detach() - lr_head * u for h, u in zip(head, normalize_per_run(*g_head))]
    assert s is not None
    Vf = head[0].numpy()
    hid = [h.numpy() for h in head[1 : 1 + n_hidden]]
    outf = head[-1].numpy() if batch.mlp_out is not None else None
    heads = [
        _rebuild(plist[min(r, len(plist) - 1)].head, Vf[r], [h[r] for h in hid], None if outf is None else outf[r])
        for r in range(R)
    ]
    Wf = par.weights(att).numpy()
    warn_nonfinite("train_with_head", Wf, Vf, hist_loss)
    return HeadTrainResult(
        W=Wf,
        heads=heads,
        probs=s.numpy(),
        history={"step": np.asarray(rec, dtype=np.int64), "loss": hist_loss, "W": hist_W},
        param=par.name,
        steps=steps,
        lr=lr,
        lr_head=lr_head,
        seeds=np.asarray(seeds, dtype=np.int64),
    )
