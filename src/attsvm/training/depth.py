"""Several attention layers: a residual query stream through L layers, trained by batched normalised GD
(docs/spec.md §8, "Depth") on the update-rule chain (:func:`attsvm.training.optim.normalized_gd`).

The model extends the paper's ``f(X) = h(Xᵀ softmax(X W z))`` (docs/spec.md §1) to L layers that read
the same tokens X_i with a query that each layer updates::

    z⁰_i = z_i,   s^ℓ_i = softmax(X_i W_ℓ z^{ℓ−1}_i),   o^ℓ_i = X_iᵀ s^ℓ_i,   z^ℓ_i = z^{ℓ−1}_i + o^ℓ_i,
    f(X_i) = h(o^L_i).

Layer ℓ's input is the output of layer ℓ−1 (its query ``z^{ℓ−1}``, a residual stream at the query
position, like the last position of a decoder); the keys and values are the tokens. With L = 1 this is
exactly the one-layer model, which the tests check. Each layer is W_ℓ or ``K_ℓ Q_ℓᵀ``; the head is any
fixed head of :class:`attsvm.problem.Head`.

The softmax is :class:`StableSoftmax`: its backward pass writes the top token's logit-gradient as minus
the sum of the others, each carrying its own probability, so the gradient keeps its direction after
the attention saturates (autograd's ``s(g − sᵀg)`` cancels there). Every run trains from its own seed
(per-layer ``nn.Linear`` draws) as one batched program; layers can be frozen at given weights. The
trained groups of all layers form one parameter tuple for the rule, each group normalised on its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray

from .._validation import as_float_array, check_choice, check_finite_scalar, check_positive_int, warn_nonfinite
from ..model import Batch, as_problem_list, head_outputs, parameterization, sequence_losses
from ..problem import AttentionProblem
from .init import run_seeds
from .optim import normalized_gd
from .recording import Trajectory

__all__ = ["StableSoftmax", "DeepResult", "deep_forward", "train_deep"]


class StableSoftmax(torch.autograd.Function):
    """softmax over the last axis with a round-off-stable backward pass (module doc)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor) -> torch.Tensor:
        s = torch.softmax(logits, dim=-1)
        ctx.save_for_backward(s, logits.argmax(dim=-1, keepdim=True))
        return s

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        s, ref = ctx.saved_tensors
        c = g - torch.gather(g, -1, ref)  # relative to the top token: exactly 0 there
        delta = s * (c - (s * c).sum(-1, keepdim=True))
        delta = delta.scatter(-1, ref, 0.0)
        return delta.scatter(-1, ref, -delta.sum(-1, keepdim=True))


def deep_forward(
    X: torch.Tensor, Z: torch.Tensor, Ws: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """The model of the module doc for tokens X (B, n, T, d), queries Z (B, n, d) and layer weights
    Ws, each (R, d, d): the last layer's output o^L (R, n, d), the attention of every layer (R, n, T)
    and the query every layer read (R, n, d)."""
    z = Z
    probs, queries = [], []
    o = z
    for W in Ws:
        queries.append(z.expand(W.shape[0], -1, -1) if z.shape[0] != W.shape[0] else z)
        logits = (X * (z @ W.transpose(-1, -2)).unsqueeze(-2)).sum(-1)  # x_itᵀ W z_i
        s = StableSoftmax.apply(logits)
        probs.append(s)
        o = (s.unsqueeze(-1) * X).sum(-2)
        z = z + o
    return o, probs, queries


@dataclass
class DeepResult:
    """The outcome of :func:`train_deep` for R runs of an L-layer model.

    W (R, L, d, d): final layer weights (``K_ℓQ_ℓᵀ`` for (K, Q)); probs (R, L, n, T) and queries
    (R, L, n, d): each layer's final attention and the query it read; history: ``step`` (S,), ``loss``
    (R, S), ``W`` (R, S, L, d, d), ``selected`` (R, S, L, n); problems, layers, param, steps, lr, seeds,
    frozen.
    """

    W: NDArray[np.float64]
    probs: NDArray[np.float64]
    queries: NDArray[np.float64]
    history: dict[str, NDArray]
    problems: list[AttentionProblem]
    layers: int
    param: str
    steps: int
    lr: float
    seeds: NDArray[np.int64]
    frozen: tuple[int, ...]

    @property
    def selected(self) -> NDArray[np.int64]:
        """(R, L, n) argmax of each layer's final attention."""
        return np.argmax(self.probs, axis=-1).astype(np.int64)


def _layer_map(value: Mapping[int, ArrayLike] | None, name: str, L: int) -> dict[int, ArrayLike]:
    """``value`` as {layer index in [0, L): weights}, or raise naming ``name``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict {{layer index: W (d, d) or (R, d, d)}}, got {type(value).__name__}")
    for key in value:
        if isinstance(key, bool) or not (isinstance(key, (int, np.integer)) and 0 <= int(key) < L):
            raise ValueError(f"{name} must map layer indices in [0, {L}) to weights, got key {key!r}")
    return {int(k): v for k, v in value.items()}


def train_deep(
    problems: AttentionProblem | Sequence[AttentionProblem],
    *,
    layers: int = 2,
    param: str = "W",
    steps: int,
    lr: float = 0.1,
    seed: int | Sequence[int] = 0,
    record_every: int = 10,
    frozen: Mapping[int, ArrayLike] | None = None,
    loss: str | None = None,
    init_scale: float = 1.0,
    init: Mapping[int, ArrayLike] | None = None,
) -> DeepResult:
    """Train an L-layer model (module doc) on R problems by normalised GD, each layer's group(s)
    normalised per run (``g/‖g‖_F``, ε = 0).

    Parameters
    ----------
    problems : AttentionProblem or R of them (shared n, T, d and head); their queries are z⁰.
    layers : L ≥ 1. param : "W" or "KQ" (every trained layer).
    steps, lr, seed, record_every : as :func:`attsvm.train.train` (seed: per-run seeds; layer ℓ of run
        r draws from a generator seeded with ``(seed_r, ℓ)``).
    frozen : {layer index (0-based): W (d, d) or (R, d, d)} layers held fixed at the given weights.
    loss : the training loss (default: the problems').
    init_scale : scale of the initial draw.
    init : {layer index: initial W (d, d) or (R, d, d)} for param "W" (other layers are drawn).
    """
    plist = as_problem_list(problems)
    L = check_positive_int(layers, "layers")
    param = check_choice(param, "param", ("W", "KQ"))
    steps = check_positive_int(steps, "steps", minimum=0)
    lr = check_finite_scalar(lr, "lr", positive=True)
    record_every = check_positive_int(record_every, "record_every")
    init_scale = check_finite_scalar(init_scale, "init_scale", positive=True)
    R = len(plist)
    seeds = run_seeds(seed, R)
    batch: Batch = Batch.from_problems(plist, loss=loss)
    d = batch.d
    par = parameterization(param, d)  # type: ignore[arg-type]
    frozen = _layer_map(frozen, "frozen", L)
    init = _layer_map(init, "init", L)
    if set(frozen) & set(init):
        raise ValueError(f"layers {sorted(set(frozen) & set(init))} are both frozen and given an init: give one")
    groups: list[list[torch.Tensor]] = []
    fixed: dict[int, torch.Tensor] = {}
    for ell in range(L):
        if ell in frozen:
            Wf = as_float_array(frozen[ell], f"frozen[{ell}]")
            if Wf.shape not in ((d, d), (R, d, d)):
                raise ValueError(f"frozen[{ell}] must have shape ({d}, {d}) or ({R}, {d}, {d}), got {Wf.shape}")
            fixed[ell] = torch.as_tensor(np.broadcast_to(Wf, (R, d, d)).copy())
            groups.append([])
            continue
        if ell in init:
            if param != "W":
                raise ValueError("init gives W per layer and needs param='W'")
            W0 = as_float_array(init[ell], f"init[{ell}]")
            if W0.shape not in ((d, d), (R, d, d)):
                raise ValueError(f"init[{ell}] must have shape ({d}, {d}) or ({R}, {d}, {d}), got {W0.shape}")
            groups.append([torch.as_tensor(np.broadcast_to(W0, (R, d, d)).copy())])
            continue
        draws = []
        for s in seeds:
            g = torch.Generator().manual_seed(int(s) * 1009 + ell)
            draws.append(par.draw("pytorch", g, init_scale))
        groups.append([torch.as_tensor(np.stack([x[j] for x in draws])) for j in range(len(par.groups))])
    rule = normalized_gd(lr, eps=0.0)
    params = tuple(t for grp in groups for t in grp)
    sizes = [len(grp) for grp in groups]
    state = rule.init(params) if params else None
    recorder = Trajectory(steps, record_every, R)
    probs: list[torch.Tensor] = []
    queries: list[torch.Tensor] = []
    Ws: list[torch.Tensor] = []
    for k in range(steps + 1):
        leaves = [t.detach().requires_grad_(True) for t in params]
        with torch.enable_grad():
            Ws, pos = [], 0
            for ell in range(L):
                Ws.append(fixed[ell] if ell in fixed else par.weights(leaves[pos : pos + sizes[ell]]))
                pos += sizes[ell]
            o, probs, queries = deep_forward(batch.X, batch.Z, Ws)
            risk = sequence_losses(batch, head_outputs(batch, o)).mean(-1)  # (R,)
            grads = torch.autograd.grad(risk.sum(), leaves) if leaves and k < steps else None
        if k == recorder.next_step:
            recorder.record(
                loss=risk.detach().numpy(),
                W=np.stack([W.detach().numpy() for W in Ws], axis=1),
                selected=np.stack([p.detach().argmax(-1).numpy() for p in probs], axis=1),
            )
        if grads is None:
            continue
        # (a gradient may come transposed in memory; contiguous, the norms sum in row-major order)
        grads = tuple(g.contiguous() for g in grads)
        updates, state = rule.update(grads, state, params, loss=risk.detach(), step=k)
        params = tuple(t + u for t, u in zip(params, updates))
    W_final = np.stack([W.detach().numpy() for W in Ws], axis=1)
    history = recorder.history()
    warn_nonfinite("train_deep", W_final, history["loss"])
    return DeepResult(
        W=W_final,
        probs=np.stack([p.detach().numpy() for p in probs], axis=1),
        queries=np.stack([q.detach().numpy() for q in queries], axis=1),
        history=history,
        problems=plist,
        layers=L,
        param=param,
        steps=steps,
        lr=lr,
        seeds=np.asarray(seeds, dtype=np.int64),
        frozen=tuple(sorted(int(x) for x in frozen)),
    )
