"""What the trainers record along the way: the record steps, the options of :func:`attsvm.train`, and
the buffers they fill.

Every trainer records the same way: the states after ``k = 0, e, 2e, …`` updates and the final one
(:func:`record_steps`), checked by ``k == recorder.next_step`` in its loop, and returns a ``history``
dict whose ``"step"`` entry (S,) lists those k and whose other entries are arrays (R, S, …), one row
per run. :func:`attsvm.train` fills a :class:`Recorder` (its buffers live on the training device and
its quantities are chosen by :class:`Recording`); the other trainers fill a :class:`Trajectory` with
the arrays they name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from .._validation import check_positive_int
from ..model import Parameterization
from .optim import fro_norm as _fro

__all__ = ["Recording", "QUANTITIES", "record_steps", "Recorder", "Trajectory"]

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
        if isinstance(q, str) or not isinstance(q, (tuple, list)) or not all(isinstance(x, str) for x in q):
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


def _group_norm(grads: tuple[Tensor, ...]) -> Tensor:
    """``(Σ_g ‖∇_g‖_F²)^{1/2}`` per run, without squaring the group norms (no underflow)."""
    gn = _fro(grads[0])
    for g in grads[1:]:
        gn = torch.hypot(gn, _fro(g))
    return gn


class _Schedule:
    """The record steps of one training and the position in them: ``next_step`` is the update count of
    the next record (−1 after the last)."""

    def _start(self, steps: NDArray[np.int64]) -> None:
        self.steps = steps
        self.j = 0
        self._steps_list = [int(k) for k in steps]
        self.next_step = self._steps_list[0]

    def _advance(self) -> None:
        self.j += 1
        self.next_step = self._steps_list[self.j] if self.j < len(self._steps_list) else -1


class Trajectory(_Schedule):
    """The history of a trainer that records named numpy arrays: ``record(name=array (R, …), …)`` stores
    each array as row ``j`` of a buffer (R, S, …) of its dtype, created at the first record.

    Parameters
    ----------
    steps : int
        The number of updates of the training.
    every : int
        The record stride e (:func:`record_steps`).
    runs : int
        R, the leading axis of every recorded array.
    """

    def __init__(self, steps: int, every: int, runs: int) -> None:
        self._start(record_steps(check_positive_int(steps, "steps", minimum=0), check_positive_int(every, "every")))
        self.runs = check_positive_int(runs, "runs")
        self.H: dict[str, NDArray] = {}

    def record(self, **values: NDArray) -> None:
        """Store the state after ``self.next_step`` updates."""
        for key, value in values.items():
            buf = self.H.get(key)
            if buf is None:
                buf = self.H[key] = np.zeros((self.runs, len(self.steps), *value.shape[1:]), dtype=value.dtype)
            buf[:, self.j] = value
        self._advance()

    def history(self) -> dict[str, NDArray]:
        """``{"step": (S,), name: (R, S, …), …}`` in the order the names were first recorded."""
        return {"step": self.steps, **self.H}


class Recorder(_Schedule):
    """The history buffers of one :func:`attsvm.train` (on the training device; copied to numpy once at
    the end)."""

    def __init__(
        self,
        options: Recording,
        param: Parameterization,
        *,
        steps: int,
        runs: int,
        n: int,
        T: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        def too_big() -> ValueError:
            return ValueError(
                f"recording {runs} run(s) at up to {steps // options.every + 2} steps (steps={steps}, "
                f"record.every={options.every}) does not fit in memory on {device}: raise record_every / "
                "Recording(every=...) or record fewer quantities"
            )

        try:
            self._start(record_steps(steps, options.every))
        except MemoryError:
            raise too_big() from None
        S = len(self.steps)
        R, d = runs, param.d
        q = set(options.quantities)

        def buf(*shape: int, dt: torch.dtype = dtype) -> Tensor:
            try:
                return torch.empty((R, S, *shape), dtype=dt, device=device)
            except RuntimeError as exc:  # (torch's allocator; other RuntimeErrors are not ours to rename)
                if "alloc" not in str(exc).lower() and "out of memory" not in str(exc).lower():
                    raise
                raise too_big() from None

        H: dict[str, Tensor] = {}
        for key in ("loss", "W_norm", "grad_norm"):
            if key in q:
                H[key] = buf()
        if "max_prob" in q:
            H["max_prob"] = buf(n)
        if "selected" in q:
            H["selected"] = buf(n, dt=torch.int64)
        # per-group norms, unless the only group is W itself (then it is W_norm)
        self._group_norms = "group_norms" in q and param.groups != ("W",)
        if self._group_norms:
            for g in param.groups:
                H[f"{g}_norm"] = buf()
        if options.W:
            H["W"] = buf(d, d)
        if options.params:
            for g, shape in zip(param.groups, param.shapes):
                H[g] = buf(*shape)
        if options.probs:
            H["probs"] = buf(n, T)
        self.groups = param.groups
        self.H = H
        self._prob_stats = "max_prob" in H or "selected" in H
        # what each buffer stores, as functions of (loss, W, grads, params, s)
        direct: list[tuple[str, Any]] = []
        if "loss" in H:
            direct.append(("loss", lambda L, W, g, p, s: L))
        if "W_norm" in H:
            direct.append(("W_norm", lambda L, W, g, p, s: _fro(W)))
        if "grad_norm" in H:
            direct.append(("grad_norm", lambda L, W, g, p, s: _group_norm(g)))
        if self._group_norms:
            for i, g in enumerate(param.groups):
                direct.append((f"{g}_norm", lambda L, W, g_, p, s, i=i: _fro(p[i])))
        if "W" in H and not (options.params and param.groups == ("W",)):
            direct.append(("W", lambda L, W, g, p, s: W))
        if options.params:
            for i, g in enumerate(param.groups):
                direct.append((g, lambda L, W, g_, p, s, i=i: p[i]))
        if options.probs:
            direct.append(("probs", lambda L, W, g, p, s: s))
        self._direct = tuple(direct)

    def record(self, loss: Tensor, W: Tensor, grads: tuple[Tensor, ...], params: tuple[Tensor, ...], s: Tensor) -> None:
        """Store the state after ``self.next_step`` updates."""
        H, j = self.H, self.j
        for key, value in self._direct:  # (name, what) pairs fixed at construction
            H[key][:, j] = value(loss, W, grads, params, s)
        if self._prob_stats:
            pm, sel = s.max(-1)
            if "max_prob" in H:
                H["max_prob"][:, j] = pm
            if "selected" in H:
                H["selected"][:, j] = sel
        self._advance()

    def history(self) -> dict[str, NDArray]:
        out: dict[str, NDArray] = {"step": self.steps}
        out.update({k: v.cpu().numpy() for k, v in self.H.items()})
        return out
