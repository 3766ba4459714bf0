"""The ``nn.Module`` of the attention model: :class:`AttentionModel` holds the groups of a
:class:`~attsvm.model.Parameterization` for R runs; its forward pass returns the outputs and the
attention probabilities of a :class:`~attsvm.model.Batch` and stores nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor, nn

from .._validation import as_float_array, check_choice, check_positive_int
from .attention import attention_outputs, attention_probs, head_outputs, sequence_losses
from .batch import Batch
from .checks import PARAMS, Param, check_device, check_float_dtype
from .parameterizations import Parameterization, parameterization

__all__ = ["AttentionModel"]


class AttentionModel(nn.Module):
    """R one-layer attention models in one module: W (R, d, d) or K, Q (R, d, m) with W = K Qᵀ.

    Parameters
    ----------
    d : int
        Token dimension.
    param : {"W", "KQ"} or Parameterization
        Parameterisation (docs/spec.md §1).
    m : int, optional
        Inner dimension of K and Q (default d); ignored for ``param="W"``.
    runs : int
        R, the number of independent models on the leading axis.

    The parameters (``weight`` for W; ``K``, ``Q``) start at zero; assign them (``model.W.data = ...``,
    :meth:`load`) or use :func:`attsvm.train`. ``forward(batch)`` returns ``(outputs, probs)`` — outputs
    (R, n) (or (R, n, C) logits for the multiclass head) and attention probabilities (R, n, T) — and keeps
    no state.
    """

    def __init__(
        self,
        d: int,
        *,
        param: Param | Parameterization = "W",
        m: int | None = None,
        runs: int = 1,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        d = check_positive_int(d, "d")
        runs = check_positive_int(runs, "runs")
        dtype = check_float_dtype(dtype)
        device = check_device(device)
        if m is not None:
            m = check_positive_int(m, "m")
        if isinstance(param, str):
            param = check_choice(param, "param", PARAMS)
            m = None if param == "W" else m  # (documented: ignored for W)
        self.parameterization = parameterization(param, d, m)
        self.param: str = self.parameterization.name
        self.d = d
        self.m = getattr(self.parameterization, "m", d)
        self.runs = runs
        # the W group is stored as `weight`: `W` is the property below, whatever the parameterisation
        self._attrs = tuple("weight" if g == "W" else g for g in self.parameterization.groups)
        for attr, shape in zip(self._attrs, self.parameterization.shapes):
            setattr(self, attr, nn.Parameter(torch.zeros((runs, *shape), dtype=dtype, device=device)))

    @property
    def group_tensors(self) -> tuple[Tensor, ...]:
        """The trained groups in :attr:`Parameterization.groups` order: ``(weight,)`` or ``(K, Q)``."""
        return tuple(getattr(self, a) for a in self._attrs)

    @property
    def W(self) -> Tensor:
        """The attention matrix (R, d, d): the W parameter, or K Qᵀ."""
        return self.parameterization.weights(self.group_tensors)

    def load(self, params: Sequence[Tensor | NDArray[np.float64]]) -> AttentionModel:
        """Set the groups (each (R, d, ·), real and finite) from tensors or arrays; returns self."""
        if isinstance(params, (str, bytes, Tensor, np.ndarray)) or not isinstance(params, Sequence):
            raise TypeError(
                f"params must be a list of the {len(self._attrs)} groups {self.parameterization.groups}, "
                f"got {type(params).__name__}"
            )
        if len(params) != len(self._attrs):
            raise ValueError(
                f"params must hold {len(self._attrs)} groups {self.parameterization.groups}, got {len(params)}"
            )
        for attr, A in zip(self._attrs, params):
            p = getattr(self, attr)
            if isinstance(A, Tensor):  # (bfloat16 has no numpy type: through float64)
                A = A.detach().to("cpu", torch.float64 if A.dtype.is_floating_point else A.dtype).numpy()
            if np.asarray(A).dtype == bool:
                raise TypeError(f"params[{attr!r}] must hold real numbers, got booleans")
            t = torch.as_tensor(as_float_array(A, f"params[{attr!r}]"), dtype=p.dtype, device=p.device)
            if t.shape != p.shape:
                raise ValueError(f"params[{attr!r}] must have shape {tuple(p.shape)}, got {tuple(t.shape)}")
            p.data = t.clone()
        return self

    def forward(self, batch: Batch) -> tuple[Tensor, Tensor]:
        if not isinstance(batch, Batch):
            raise TypeError(f"batch must be a Batch (see Batch.from_problems), got {type(batch).__name__}")
        if batch.d != self.d:
            raise ValueError(f"batch has d={batch.d} features but the model was built with d={self.d}")
        if batch.size not in (1, self.runs):
            raise ValueError(
                f"batch holds {batch.size} runs but the model has runs={self.runs} "
                "(the batch must hold 1 shared instance or one per run)"
            )
        s = attention_probs(batch, self.W)
        return head_outputs(batch, attention_outputs(batch, s)), s

    def risk(self, batch: Batch) -> Tensor:
        """Empirical risk per run, shape (R,)."""
        out, _ = self(batch)
        return sequence_losses(batch, out).mean(-1)

    def extra_repr(self) -> str:
        return f"d={self.d}, param={self.param!r}, m={self.m}, runs={self.runs}"
