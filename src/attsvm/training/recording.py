"""What :func:`attsvm.train` records along the way: one options object and the buffers it fills."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from .._validation import check_positive_int
from ..model import Parameterization

__all__ = ["Recording", "QUANTITIES", "record_steps"]

# Per-record summaries, each (R, S) or (R, S, n); see TrainResult.history.
QUANTITIES: tuple[str, ...] = ("loss", "W_norm", "grad_norm", "max_prob", "selected", "group_norms")


@dataclass(frozen=True)
class Recording:
    """Recording options of :func:`attsvm.train`.

    Parameters
    ----------
    every : int
        Record the states ``W(k)`` for ``k = 0, e, 2e, …`` and the final step (e = ``every``).
    quantities : tuple of str
        Summaries recorded at each of them (default all): ``"loss"``, ``"W_norm"``, ``"grad_norm"``,
        ``"max_prob"``, ``"selected"`` and ``"group_norms"`` (``K_norm``, ``Q_norm`` for (K, Q)).
    W : bool
        Record the trajectory ``W(k)`` (R·S·d² floats).
    params : bool
        Record the trajectory of every trained group under its name (``K``, ``Q`` for (K, Q); ``W``
        for W).
    probs : bool
        Record the attention probabilities ``s(k)`` (R, S, n, T).
    """

    every: int = 1
    quantities: tuple[str, ...] = QUANTITIES
    W: bool = False
    params: bool = False
    probs: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "every", check_positive_int(self.every, "record.every"))
        q = self.quantities
        if isinstance(q, str) or not all(isinstance(x, str) for x in q):
            raise TypeError(f"record.quantities must be a tuple of names from {QUANTITIES}, got {q!r}")
        bad = [x for x in q if x not in QUANTITIES]
        if bad:
            raise ValueError(f"record.quantities must be among {', '.join(map(repr, QUANTITIES))}; got {bad}")
        object.__setattr__(self, "quantities", tuple(q))
        for name in ("W", "params", "probs"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise TypeError(f"record.{name} must be a bool, got {type(getattr(self, name)).__name__}")


def record_steps(steps: int, every: int) -> NDArray[np.int64]:
    """``0, e, 2e, …`` and ``steps``."""
    ks = np.arange(0, steps + 1, every, dtype=np.int64)
    if ks[-1] != steps:
        ks = np.append(ks, steps)
    return ks


def _fro(A: Tensor) -> Tensor:
    return torch.linalg.vector_norm(A, dim=(-2, -1))


class Recorder:
    """The history buffers of one training (on the training device; copied to numpy once at the end)."""

    def __init__(self, options: Recording, param: Parameterization, *, steps: int, runs: int, n: int, T: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.steps = record_steps(steps, options.every)
        S = len(self.steps)
        R, d = runs, param.d
        q = set(options.quantities)

        def buf(*shape: int, dt: torch.dtype = dtype) -> Tensor:
            return torch.empty((R, S) + shape, dtype=dt, device=device)

        H: dict[str, Tensor] = {}
        for key in ("loss", "W_norm", "grad_norm"):
            if key in q:
                H[key] = buf()
        if "max_prob" in q:
            H["max_prob"] = buf(n)
        if "selected" in q:
            H["selected"] = buf(n, dt=torch.int64)
        # per-group norms, unless the only group is W itself (then it is W_norm)
        self._group_norms = ("group_norms" in q and param.groups != ("W",))
        if self._group_norms:
            for g in param.groups:
                H[f"{g}_norm"] = buf()
        if options.W:
            H["W"] = buf(d, d)
        self._params = options.params
        if options.params:
            for g, shape in zip(param.groups, param.shapes):
                H[g] = buf(*shape)
        if options.probs:
            H["probs"] = buf(n, T)
        self.groups = param.groups
        self.H = H
        self.j = 0
        self.next_step = int(self.steps[0])

    def record(self, loss: Tensor, W: Tensor, grads: tuple[Tensor, ...], params: tuple[Tensor, ...],
               s: Tensor) -> None:
        """Store the state after ``self.next_step`` updates."""
        H, j = self.H, self.j
        if "loss" in H:
            H["loss"][:, j] = loss
        if "W_norm" in H:
            H["W_norm"][:, j] = _fro(W)
        if "grad_norm" in H:
            gn = _fro(grads[0])
            for g in grads[1:]:
                gn = torch.hypot(gn, _fro(g))
            H["grad_norm"][:, j] = gn
        if "max_prob" in H or "selected" in H:
            pm, sel = s.max(-1)
            if "max_prob" in H:
                H["max_prob"][:, j] = pm
            if "selected" in H:
                H["selected"][:, j] = sel
        if self._group_norms:
            for g, p in zip(self.groups, params):
                H[f"{g}_norm"][:, j] = _fro(p)
        if "W" in H and not (self._params and self.groups == ("W",)):
            H["W"][:, j] = W
        if self._params:
            for g, p in zip(self.groups, params):
                H[g][:, j] = p
        if "probs" in H:
            H["probs"][:, j] = s
        self.j = j + 1
        self.next_step = int(self.steps[self.j]) if self.j < len(self.steps) else -1

    def history(self) -> dict[str, NDArray]:
        out: dict[str, NDArray] = {"step": self.steps}
        out.update({k: v.cpu().numpy() for k, v in self.H.items()})
        return out
