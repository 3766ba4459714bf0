"""The data container of the attention model: :class:`Batch`, the tokens, queries, labels and head of R
runs as tensors, built from :class:`~attsvm.problem.AttentionProblem` objects (shared data broadcast over
runs, so a batch of R initialisations of one instance stores its tokens once).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._validation import check_choice, check_positive_int
from ..problem import AttentionProblem
from .checks import HEADS, TRAIN_LOSSES, as_problem_list, check_device, check_float_dtype, resolve_loss

__all__ = ["Batch"]


@dataclass(frozen=True)
class Batch:
    """The data of R runs as tensors; the leading axis B is 1 (shared by every run) or R.

    Attributes
    ----------
    X : Tensor (B, n, T, d)
        Tokens.
    Z : Tensor (B, n, d)
        Queries ``z_i`` (for self-attention, ``X[:, :, query_index]``).
    y : Tensor (B, n)
        Labels ±1 (linear, ReLU) or class indices as floats (multiclass).
    V : Tensor (B, d, k)
        Head weights: ``v`` as one column (linear), V (ReLU), V (d, C) (multiclass).
    head : {"linear", "relu", "multiclass", "mlp"}
    loss : {"logistic", "exponential", "correlation", "cross_entropy"}
    mlp_act, mlp_hidden, mlp_out, mlp_width : an MLP head's activation, later hidden layers (each
        (B, k_l, k_{l+1})), output weights (B, k_L) and first hidden width (``V`` is its first layer;
        for SwiGLU ``V = [up | gate]``). None / () for other heads.
    """

    X: Tensor
    Z: Tensor
    y: Tensor
    V: Tensor
    head: str
    loss: str
    XV: Tensor = field(init=False, repr=False)
    mlp_act: str | None = None
    mlp_hidden: tuple[Tensor, ...] = ()
    mlp_out: Tensor | None = None
    mlp_width: int = 0

    def __post_init__(self) -> None:
        for name in ("X", "Z", "y", "V"):
            value = getattr(self, name)
            if not isinstance(value, Tensor):
                raise TypeError(
                    f"Batch.{name} must be a torch tensor (Batch.from_problems), got {type(value).__name__}"
                )
        if self.X.ndim != 4 or not self.X.dtype.is_floating_point:
            raise ValueError(
                f"Batch.X must be a floating tensor (B, n, T, d), got {self.X.dtype} of shape {tuple(self.X.shape)}"
            )
        check_choice(self.head, "head", HEADS)
        check_choice(self.loss, "loss", TRAIN_LOSSES)
        # (B, n, T, k) head pre-activations of single tokens, x_itᵀ V: the whole head computation of
        # the trainer runs on this table, never on the (R, n, d) attention outputs
        object.__setattr__(self, "XV", self.X @ self.V.unsqueeze(1))

    @property
    def n(self) -> int:
        return int(self.X.shape[1])

    @property
    def T(self) -> int:
        return int(self.X.shape[2])

    @property
    def d(self) -> int:
        return int(self.X.shape[3])

    @property
    def size(self) -> int:
        """B: 1 when the data is shared by every run."""
        return int(self.X.shape[0])

    @classmethod
    def from_problems(
        cls,
        problems: AttentionProblem | Sequence[AttentionProblem],
        *,
        loss: str | None = None,
        repeat: int = 1,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float64,
    ) -> Batch:
        """Stack P problems (same n, T, d, head kind and head shape) into a batch.

        Each problem is repeated ``repeat`` times consecutively (run ``r`` uses problem ``r // repeat``),
        so B = P·repeat — except that a single problem is kept once (B = 1) and broadcast.
        ``loss=None`` uses each problem's loss for scalar heads (they must agree) and cross-entropy
        for the multiclass head.
        """
        probs = as_problem_list(problems)
        repeat = check_positive_int(repeat, "repeat")
        dtype = check_float_dtype(dtype)
        device = check_device(device)
        p0 = probs[0]
        for j, p in enumerate(probs[1:], start=1):
            if (p.n, p.T, p.d) != (p0.n, p0.T, p0.d):
                raise ValueError(
                    f"problems must share (n, T, d): problems[0] has {(p0.n, p0.T, p0.d)}, "
                    f"problems[{j}] has {(p.n, p.T, p.d)}"
                )
            if p.head.kind != p0.head.kind or p.head.weights.shape != p0.head.weights.shape:
                raise ValueError(
                    f"problems must share the head kind and shape: problems[0] has "
                    f"{p0.head.kind} {p0.head.weights.shape}, problems[{j}] has "
                    f"{p.head.kind} {p.head.weights.shape}"
                )
            if _mlp_signature(p) != _mlp_signature(p0):
                raise ValueError(
                    f"problems must share the MLP head's activation and layer shapes: problems[0] has "
                    f"{_mlp_signature(p0)}, problems[{j}] has {_mlp_signature(p)}"
                )
        if loss is None and p0.head.kind != "multiclass":
            losses = {p.loss for p in probs}
            if len(losses) > 1:
                raise ValueError(f"problems disagree on the loss ({sorted(losses)}); pass loss= explicitly")
            loss = p0.loss
        loss = resolve_loss(loss, p0.head.kind)

        def stack(arrs: list[np.ndarray]) -> Tensor:
            a = np.stack(arrs)
            if len(probs) > 1 and repeat > 1:
                a = np.repeat(a, repeat, axis=0)
            return torch.as_tensor(a, dtype=dtype, device=device)

        V = [p.head.weights.reshape(p.d, -1) for p in probs]
        mlp: dict[str, Any] = {}
        spec0 = p0.head.mlp_spec
        if spec0 is not None:
            specs = [p.head.mlp_spec for p in probs]
            mlp = {
                "mlp_act": spec0.activation,
                "mlp_hidden": tuple(stack([sp.hidden[j] for sp in specs]) for j in range(len(spec0.hidden))),  # type: ignore[union-attr]
                "mlp_out": stack([sp.out for sp in specs]),  # type: ignore[union-attr]
                "mlp_width": spec0.width,
            }
        return cls(
            X=stack([p.X for p in probs]),
            Z=stack([p.queries for p in probs]),
            y=stack([p.y for p in probs]),
            V=stack(V),
            head=p0.head.kind,
            loss=loss,
            **mlp,
        )


def _mlp_signature(p: AttentionProblem) -> tuple[Any, ...] | None:
    spec = p.head.mlp_spec
    if spec is None:
        return None
    return (spec.activation, spec.width, tuple(H.shape for H in spec.hidden), spec.out.shape)
