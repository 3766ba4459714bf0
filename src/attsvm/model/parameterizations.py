"""Parameterisations of the attention matrix (docs/spec.md §1, §4): :class:`FullW` (W trained directly)
and :class:`FactoredKQ` (``W = K Qᵀ``), both :class:`Parameterization` objects that know their trained
groups, their weights, their gradient map and their initialisations; :func:`parameterization` builds one
from its name.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from .._validation import as_float_array, check_choice, check_finite_scalar, check_positive_int
from .attention import factor_grads
from .checks import PARAMS, Param

__all__ = ["InitDraw", "INIT_DRAWS", "Parameterization", "FullW", "FactoredKQ", "parameterization"]

logger = logging.getLogger(__name__)

InitDraw = Literal["pytorch", "gaussian"]
INIT_DRAWS: tuple[str, ...] = ("pytorch", "gaussian")


def _linear_weight(rows: int, d: int, generator: torch.Generator) -> Tensor:
    """``nn.Linear(d, rows)``'s default weight (rows, d): kaiming_uniform(a=√5) = U(−1/√d, 1/√d), drawn in
    float32 and then cast, as ``SelfAttn(d).double()`` does in the published code."""
    w = torch.empty(rows, d, dtype=torch.float32)
    return torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=generator).double()


class Parameterization(ABC):
    """How the trained tensors of R runs make the attention matrix W (R, d, d) (docs/spec.md §1, §4).

    The trained tensors are a tuple of *groups*, each of shape (R, d, ·): ``(W,)`` for :class:`FullW`,
    ``(K, Q)`` for :class:`FactoredKQ`. A group is the unit of normalisation — for (K, Q) each factor's
    gradient is normalised separately (docs/spec.md §4) — and of every per-parameter transform of
    :mod:`attsvm.training.optim`. A parameterisation knows its weights (:meth:`weights`), its gradient map
    (:meth:`grads`, the chain rule from ``∇_W L``) and its initialisations (:meth:`draw`,
    :meth:`from_W`, :meth:`from_given`, :meth:`zeros`) and plain-GD step (:meth:`auto_step`).
    """

    name: ClassVar[str]
    groups: ClassVar[tuple[str, ...]]
    # λ of the penalty λ Σ_g ‖θ_g‖_F² in the published recipe (docs/spec.md §4)
    published_penalty: ClassVar[float]
    d: int

    @property
    @abstractmethod
    def shapes(self) -> tuple[tuple[int, int], ...]:
        """The shape (d, ·) of every group, without the run axis."""

    @abstractmethod
    def weights(self, params: Sequence[Tensor]) -> Tensor:
        """W (R, d, d) from the groups."""

    @abstractmethod
    def grads(self, grad_W: Tensor, params: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """The gradient of every group from ``∇_W L`` (R, d, d) (the chain rule through :meth:`weights`)."""

    @abstractmethod
    def from_W(self, W: NDArray[np.float64]) -> tuple[NDArray[np.float64], ...]:
        """Groups (numpy, leading axis R) whose :meth:`weights` is W (R, d, d), or its best approximation."""

    @abstractmethod
    def draw(self, kind: InitDraw, generator: torch.Generator, scale: float) -> tuple[NDArray[np.float64], ...]:
        """One run's random groups: ``"pytorch"`` (the published ``nn.Linear`` init) or ``"gaussian"``."""

    @abstractmethod
    def auto_step(
        self, LW: NDArray[np.float64], GW: NDArray[np.float64], params0: Sequence[NDArray[np.float64]]
    ) -> NDArray[np.float64]:
        """Plain-GD step per run (R,) from the smoothness and gradient bounds ``L_W``, ``G_W`` (R,) of
        ``L(W)`` and the initial groups."""

    def __post_init__(self) -> None:
        for name in ("d", "m"):
            if hasattr(self, name):
                object.__setattr__(self, name, check_positive_int(getattr(self, name), name))

    def _check_W(self, W: Any) -> NDArray[np.float64]:
        """:meth:`from_W`'s argument: a finite W (d, d) or (R, d, d)."""
        W = as_float_array(W, "W")
        if W.ndim not in (2, 3) or W.shape[-2:] != (self.d, self.d):
            raise ValueError(f"W must have shape ({self.d}, {self.d}) or (R, {self.d}, {self.d}), got {W.shape}")
        return W

    @staticmethod
    def _check_draw(kind: Any, scale: Any) -> float:
        check_choice(kind, "kind", INIT_DRAWS)
        return check_finite_scalar(scale, "scale")

    def zeros(self, runs: int) -> tuple[NDArray[np.float64], ...]:
        """All-zero groups for ``runs`` runs."""
        runs = check_positive_int(runs, "runs")
        return tuple(np.zeros((runs, *s)) for s in self.shapes)

    def from_given(self, init: Any, runs: int) -> tuple[NDArray[np.float64], ...]:
        """Groups from a user's init: an array W (d, d) or (R, d, d), or a tuple of the groups, each
        (d, ·) or (R, d, ·)."""
        d = self.d
        if isinstance(init, tuple):
            if len(self.groups) == 1 or len(init) != len(self.groups):
                raise ValueError(
                    f"init as a tuple must be ({', '.join(self.groups)}) and needs a factored "
                    f"param such as 'KQ'; got a tuple of {len(init)} for param={self.name!r}"
                )
            out = []
            for name, A, shape in zip(self.groups, init, self.shapes):
                arr = as_float_array(A, f"init {name}")
                if arr.shape not in (shape, (runs, *shape)):
                    raise ValueError(f"init {name} must have shape {shape} or {(runs, *shape)}, got {arr.shape}")
                out.append(np.broadcast_to(arr, (runs, *shape)).copy())
            return tuple(out)
        W = as_float_array(init, "init")
        if W.shape not in ((d, d), (runs, d, d)):
            raise ValueError(f"init W must have shape ({d}, {d}) or ({runs}, {d}, {d}), got {W.shape}")
        return self.from_W(np.broadcast_to(W, (runs, d, d)).copy())


@dataclass(frozen=True)
class FullW(Parameterization):
    """W (R, d, d) trained directly (W-ERM)."""

    d: int
    name: ClassVar[str] = "W"
    groups: ClassVar[tuple[str, ...]] = ("W",)
    published_penalty: ClassVar[float] = 0.0

    @property
    def shapes(self) -> tuple[tuple[int, int], ...]:
        return ((self.d, self.d),)

    def weights(self, params: Sequence[Tensor]) -> Tensor:
        return params[0]

    def grads(self, grad_W: Tensor, params: Sequence[Tensor]) -> tuple[Tensor, ...]:
        return (grad_W,)

    def from_W(self, W: NDArray[np.float64]) -> tuple[NDArray[np.float64], ...]:
        return (self._check_W(W),)

    def draw(self, kind: InitDraw, generator: torch.Generator, scale: float) -> tuple[NDArray[np.float64], ...]:
        scale = self._check_draw(kind, scale)
        if kind == "pytorch":  # logits zᵀ W_lin x with W = W_linᵀ
            return (scale * _linear_weight(self.d, self.d, generator).T.numpy(),)
        return (scale * torch.randn(self.d, self.d, generator=generator, dtype=torch.float64).numpy(),)

    def auto_step(
        self, LW: NDArray[np.float64], GW: NDArray[np.float64], params0: Sequence[NDArray[np.float64]]
    ) -> NDArray[np.float64]:
        return 1.0 / LW


@dataclass(frozen=True)
class FactoredKQ(Parameterization):
    """K, Q (R, d, m) with W = K Qᵀ (KQ-ERM); the published code's ``K = W_kᵀ``, ``Q = W_qᵀ``."""

    d: int
    m: int
    name: ClassVar[str] = "KQ"
    groups: ClassVar[tuple[str, ...]] = ("K", "Q")
    # float64 machine epsilon, as the published code: ε(‖K‖² + ‖Q‖²)
    published_penalty: ClassVar[float] = float(torch.finfo(torch.float64).eps)

    @property
    def shapes(self) -> tuple[tuple[int, int], ...]:
        return ((self.d, self.m), (self.d, self.m))

    def weights(self, params: Sequence[Tensor]) -> Tensor:
        return params[0] @ params[1].transpose(-1, -2)

    def grads(self, grad_W: Tensor, params: Sequence[Tensor]) -> tuple[Tensor, ...]:
        return factor_grads(grad_W, params[0], params[1])

    def from_W(self, W: NDArray[np.float64]) -> tuple[NDArray[np.float64], ...]:
        """K, Q with K Qᵀ the best rank-m approximation of W and ‖K‖_F = ‖Q‖_F (balanced)."""
        m = self.m
        W = self._check_W(W)
        U, S, Vt = np.linalg.svd(W)
        r = min(m, S.shape[-1])
        lost = (S[..., r:] ** 2).sum(-1)
        if np.any(lost > 1e-20 * np.maximum((S**2).sum(-1), 1e-300)):
            logger.warning("init W has rank above m=%d: its balanced (K, Q) factorisation truncates it", m)
        K = np.zeros((*W.shape[:-1], m))
        Q = np.zeros((*W.shape[:-1], m))
        sq = np.sqrt(S[..., :r])
        K[..., :r] = U[..., :, :r] * sq[..., None, :]
        Q[..., :r] = np.swapaxes(Vt, -1, -2)[..., :, :r] * sq[..., None, :]
        return K, Q

    def draw(self, kind: InitDraw, generator: torch.Generator, scale: float) -> tuple[NDArray[np.float64], ...]:
        scale = self._check_draw(kind, scale)
        if kind == "pytorch":  # the published module builds `query` before `key`
            Wq = _linear_weight(self.m, self.d, generator)
            Wk = _linear_weight(self.m, self.d, generator)
            return scale * Wk.T.numpy(), scale * Wq.T.numpy()
        K = torch.randn(self.d, self.m, generator=generator, dtype=torch.float64).numpy()
        Q = torch.randn(self.d, self.m, generator=generator, dtype=torch.float64).numpy()
        return scale * K, scale * Q

    def zeros(self, runs: int) -> tuple[NDArray[np.float64], ...]:
        raise ValueError(
            "init='zeros' with param='KQ' starts at a stationary point (∇K = ∇Q = 0) and "
            "never moves; give (K, Q) explicitly, e.g. K small Gaussian and Q = 0"
        )

    def auto_step(
        self, LW: NDArray[np.float64], GW: NDArray[np.float64], params0: Sequence[NDArray[np.float64]]
    ) -> NDArray[np.float64]:
        """``1/(L_W·B + G_W)`` with ``B = max(1, ‖K₀‖_F² + ‖Q₀‖_F²)``: a smoothness bound of the (K, Q)
        objective valid while ``‖K‖_F² + ‖Q‖_F² ≤ B`` (it is not globally smooth)."""
        K0, Q0 = params0
        B = np.maximum(1.0, (K0**2).sum((1, 2)) + (Q0**2).sum((1, 2)))
        return 1.0 / (LW * B + GW)


def parameterization(param: Param | Parameterization, d: int, m: int | None = None) -> Parameterization:
    """The :class:`Parameterization` for ``param="W"`` (:class:`FullW`) or ``"KQ"`` (:class:`FactoredKQ`
    with inner dimension ``m``, default d); an instance is checked against d and returned."""
    d = check_positive_int(d, "d")
    if isinstance(param, Parameterization):
        if param.d != d:
            raise ValueError(f"param has d={param.d} but the data has d={d}")
        if m is not None and m != getattr(param, "m", d):
            raise ValueError(f"m={m} disagrees with the given parameterization {param!r}")
        return param
    param = check_choice(param, "param", PARAMS)
    if param == "W":
        if m is not None and m != d:
            raise ValueError(f"m applies to param='KQ' only (W is d × d); got m={m} with param='W'")
        return FullW(d)
    return FactoredKQ(d, d if m is None else check_positive_int(m, "m"))
