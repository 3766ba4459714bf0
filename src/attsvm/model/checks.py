"""Input checks of the attention model: devices, dtypes, losses, problem lists and the data's scale.

The names of the parameterisations and losses the trainer accepts (:data:`PARAMS`,
:data:`TRAIN_LOSSES`), the functions that turn a user's argument into a checked value or raise an error
naming it (:func:`check_device`, :func:`check_float_dtype`, :func:`resolve_loss`,
:func:`as_problem_list`), and :func:`check_gradient_scale`, which refuses data too large for the
trainer's float64 gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch

from .._validation import check_choice
from ..problem import AttentionProblem

__all__ = [
    "Param",
    "TrainLoss",
    "PARAMS",
    "TRAIN_LOSSES",
    "SCALAR_LOSSES",
    "HEADS",
    "GRADIENT_LOG10_MAX",
    "check_float_dtype",
    "check_device",
    "resolve_loss",
    "as_problem_list",
    "check_gradient_scale",
]

Param = Literal["W", "KQ"]
TrainLoss = Literal["logistic", "exponential", "correlation", "cross_entropy"]
PARAMS: tuple[str, ...] = ("W", "KQ")
TRAIN_LOSSES: tuple[str, ...] = ("logistic", "exponential", "correlation", "cross_entropy")
SCALAR_LOSSES: tuple[str, ...] = ("logistic", "exponential", "correlation")
HEADS: tuple[str, ...] = ("linear", "relu", "multiclass", "mlp")


def check_float_dtype(dtype: Any, name: str = "dtype") -> torch.dtype:
    """A floating torch dtype (torch.float64, torch.float32, ...): TypeError naming ``name`` otherwise."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating torch dtype such as torch.float64, got {dtype!r}")
    return dtype


def check_device(device: torch.device | str | None, name: str = "device") -> torch.device:
    """``device`` (None: the CPU) as a torch device that this machine has, or a ValueError naming ``name``."""
    if device is None:
        return torch.device("cpu")
    if not isinstance(device, (str, torch.device)):
        # (a bare index is refused: torch reads it as "the current accelerator", CUDA, MPS or none)
        raise TypeError(
            f"{name} must be a torch device or its name ('cpu', 'cuda', 'cuda:N' for the CUDA device of "
            f"index N, 'mps'), got {type(device).__name__} {device!r}"
        )
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(f"{name}={device!r} is not a torch device (e.g. cpu, cuda, cuda:0, mps)") from None
    mps = getattr(torch.backends, "mps", None)
    available = {
        "cpu": True,
        "cuda": torch.cuda.is_available(),
        "mps": bool(mps is not None and mps.is_available()),
    }
    if not available.get(dev.type, False):
        why = " (torch.cuda.is_available() is False)" if dev.type == "cuda" else ""
        raise ValueError(f"{name}={device!r} is not available on this machine{why}")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"{name}={device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev


def resolve_loss(loss: str | None, head_kind: str) -> str:
    """The training loss for a head: ``None`` → the head's natural loss; checks compatibility.

    Scalar heads (linear, ReLU) take logistic / exponential / correlation; the multiclass head
    takes cross-entropy only (docs/spec.md §1).
    """
    check_choice(head_kind, "head_kind", HEADS)
    if loss is None:
        return "cross_entropy" if head_kind == "multiclass" else "logistic"
    check_choice(loss, "loss", TRAIN_LOSSES)
    if head_kind == "multiclass" and loss != "cross_entropy":
        raise ValueError(f"loss must be 'cross_entropy' for a multiclass head, got {loss!r}")
    if head_kind != "multiclass" and loss == "cross_entropy":
        raise ValueError(
            f"loss='cross_entropy' needs a multiclass head; this head is {head_kind!r} "
            f"(use one of {', '.join(repr(x) for x in SCALAR_LOSSES)})"
        )
    return loss


def as_problem_list(problems: AttentionProblem | Sequence[AttentionProblem]) -> list[AttentionProblem]:
    """``problems`` (one :class:`~attsvm.problem.AttentionProblem` or a non-empty sequence of them) as a
    list; TypeError or ValueError naming the argument otherwise."""
    if isinstance(problems, AttentionProblem):
        return [problems]
    if isinstance(problems, (str, bytes)) or not isinstance(problems, Sequence):
        raise TypeError(f"problems must be an AttentionProblem or a list of them, got {type(problems).__name__}")
    out = list(problems)
    if not out:
        raise ValueError("problems must not be empty")
    for j, p in enumerate(out):
        if not isinstance(p, AttentionProblem):
            raise TypeError(f"problems[{j}] must be an AttentionProblem, got {type(p).__name__}")
    return out


def check_gradient_scale(problems: Sequence[AttentionProblem]) -> None:
    """Refuse data so large that the trainer's (scaled) gradient ``Σ_it δ'_it x_it z_iᵀ`` overflows float64
    (:func:`risk_and_scaled_grad`): its terms are up to ``2·max|x_itᵀV|·max|x|·max|z|`` (times ``nT``),
    which past ~1e307 would give inf − inf = NaN steps. The data must be rescaled (the SVM solvers
    rescale internally; GD is not scale-invariant, so the trainer cannot)."""
    for j, p in enumerate(problems):
        x, z, v = (float(np.abs(a).max()) for a in (p.X, p.queries, p.head.weights))
        with np.errstate(divide="ignore"):  # (log10 of a zero: −inf, accepted)
            # terms up to 2nT · max|x_itᵀV| · max|x| · max|z|, with max|x_itᵀV| ≤ d · max|v| · max|x|
            log10 = float(np.log10(2.0 * p.n * p.T * p.d) + np.log10(v) + 2 * np.log10(x) + np.log10(z))
        if log10 > GRADIENT_LOG10_MAX:
            where = "" if len(problems) == 1 else f"problems[{j}]: "
            raise ValueError(
                f"{where}the data are too large to train on in float64: the gradient's terms reach ~1e{log10:.0f} "
                f"(max|x| = {x:.1e}, max|z| = {z:.1e}, max|head weight| = {v:.1e}); rescale X, Z or the head"
            )


# the largest log10 of a gradient term check_gradient_scale accepts (float64 overflows at 10^308.25)
GRADIENT_LOG10_MAX = 307.0
