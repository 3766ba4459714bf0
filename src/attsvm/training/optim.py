"""Update rules composed from small transforms, as optax's ``chain`` (docs/spec.md §4, §8).

A :class:`Transform` maps the incoming *updates* — a tuple with one tensor (R, d, ·) per parameter group
(:class:`attsvm.model.Parameterization`) — to outgoing updates; :func:`chain` composes transforms left to
right, and the trainer adds the final updates to the groups (``θ ← θ + u``). The first transform of a
rule receives the gradient of the data risk. The parts:

* :class:`AddPenalty` — the gradient of ``λ Σ_g ‖θ_g‖_F²`` (the published ``λ(‖K‖² + ‖Q‖²)``);
* :class:`NormalizeByNorm` — ``u_g / (‖u_g‖_F + ε)`` per run and per group (docs/spec.md §4: for (K, Q)
  each factor separately);
* :class:`StepSize` — ``−η u`` with η a constant, one value per run, or a schedule ``η(k)``;
* :class:`PolyakStep` — ``−η u`` with Polyak's ``η = (L − L*)/‖u‖²`` (docs/spec.md §8);
* :class:`MirrorMap` — turns a dual step into the ℓp mirror-descent displacement for
  ``ψ(θ) = ‖θ‖_p^p / p`` (docs/spec.md §8).

Ready-made rules: :func:`gd`, :func:`normalized_gd`, :func:`mirror_descent`, :func:`polyak`. A transform
declares its *degree* of positive homogeneity in the incoming updates (``T(c·u) = c^deg·T(u)`` for
c > 0 per run, None when there is none); a rule of degree 0 depends on the gradient only through its
direction, and the trainer then feeds it the rescaled gradient ``e^{c}∇L``
(:func:`attsvm.model.risk_and_scaled_grad`), which stays representable after ``∇L`` underflows.
All transforms are a few tensor operations per step: the trainer runs them once per update for every
run at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._validation import check_bool, check_finite_scalar

__all__ = [
    "normalize_per_run",
    "fro_norm",
    "Transform",
    "Chain",
    "chain",
    "AddPenalty",
    "NormalizeByNorm",
    "NormalizeByDualNorm",
    "StepSize",
    "PolyakStep",
    "MirrorMap",
    "gd",
    "normalized_gd",
    "mirror_descent",
    "polyak",
    "NORMALIZE_EPS",
    "NORMALIZED_LR",
    "Updates",
]

Updates = tuple[Tensor, ...]

# The paper's normalized-GD step (docs/spec.md §4).
NORMALIZED_LR = 0.1
# float64 machine epsilon: the published code divides by (‖∇‖ + eps) and, for (K, Q), adds the
# penalty eps·(‖K‖² + ‖Q‖²) (docs/spec.md §4).
NORMALIZE_EPS = float(torch.finfo(torch.float64).eps)


# A plain ‖A‖_F (the root of the sum of squares) is exact to round-off while it lies in this range: no
# square overflows, and every square that underflows is below 1e-16 of the largest one.
_PLAIN_NORM_RANGE = (1e-140, 1e140)


def _fro(A: Tensor) -> Tensor:
    """‖A‖_F over the last two axes, shape A.shape[:-2] (the plain sum of squares: may overflow)."""
    return torch.linalg.vector_norm(A, dim=(-2, -1))


def _scaled_fro(A: Tensor) -> Tensor:
    """‖A‖_F over the last two axes from ``A / max|A|``: neither overflows nor underflows (inf for an inf entry)."""
    a = A.abs().amax(dim=(-2, -1), keepdim=True)
    s = torch.where(torch.isfinite(a) & (a > 0), a, torch.ones_like(a))
    return torch.linalg.vector_norm(A / s, dim=(-2, -1)) * s[..., 0, 0]


def fro_norm(A: Tensor) -> Tensor:
    """‖A‖_F over the last two axes (shape A.shape[:-2]), representable whenever the true norm is.

    The plain norm is kept when it lies in :data:`_PLAIN_NORM_RANGE` (checked on CPU, where the check costs
    a microsecond); otherwise, and always on other devices (where a check would synchronise), the norm is
    taken from ``A / max|A|``. GD diverges in norm by design (docs/spec.md §4): ‖W‖_F is reported up to
    1.8e308, not inf from entries of 1e155.
    """
    if A.device.type == "cpu" and A.numel():
        n = _fro(A)
        lo, hi = torch.aminmax(n)
        if _PLAIN_NORM_RANGE[0] <= float(lo) and float(hi) <= _PLAIN_NORM_RANGE[1]:
            return n
    return _scaled_fro(A)


def _col(x: Tensor) -> Tensor:
    return x[:, None, None]


class Transform:
    """One part of an update rule (optax's ``GradientTransformation``).

    ``init(params)`` returns the transform's state for the groups ``params`` (each (R, d, ·)) and checks
    its options against them; ``update(updates, state, params, loss=, step=)`` returns the new updates and
    state. ``loss`` (R,) is the data risk at ``params`` and ``step`` the update count k. ``degree`` is the
    degree of positive homogeneity of ``update`` in ``updates`` (None: not homogeneous).
    """

    degree: float | None = None

    def init(self, params: Updates) -> Any:
        return None

    def update(self, updates: Updates, state: Any, params: Updates, *, loss: Tensor, step: int) -> tuple[Updates, Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class Chain(Transform):
    """Transforms applied left to right; see :func:`chain`."""

    transforms: tuple[Transform, ...]

    @property
    def degree(self) -> float | None:  # type: ignore[override]
        deg: float | None = 1.0
        for t in self.transforms:
            if deg == 0.0:  # already scale-free: nothing after it sees the scale
                return 0.0
            if t.degree is None:
                return None
            deg = deg * t.degree  # type: ignore[operator]
        return deg

    def init(self, params: Updates) -> tuple[Any, ...]:
        return tuple(t.init(params) for t in self.transforms)

    def update(
        self, updates: Updates, state: Any, params: Updates, *, loss: Tensor, step: int
    ) -> tuple[Updates, tuple[Any, ...]]:
        new_state = [None] * len(self.transforms)
        for j, t in enumerate(self.transforms):
            updates, new_state[j] = t.update(updates, state[j], params, loss=loss, step=step)
        return updates, tuple(new_state)

    def find(self, kind: type[Transform]) -> list[Transform]:
        """The transforms of type ``kind`` in this chain (nested chains included)."""
        out: list[Transform] = []
        for t in self.transforms:
            if isinstance(t, Chain):
                out += t.find(kind)
            elif isinstance(t, kind):
                out.append(t)
        return out


def chain(*transforms: Transform) -> Chain:
    """Compose transforms: ``chain(a, b).update(u) = b.update(a.update(u))`` (optax's ``chain``)."""
    for j, t in enumerate(transforms):
        if not isinstance(t, Transform):
            raise TypeError(f"chain() takes Transform objects; argument {j} is {type(t).__name__}")
    return Chain(tuple(transforms))


@dataclass(frozen=True)
class AddPenalty(Transform):
    """``u_g + 2λ θ_g``: adds the gradient of the penalty ``λ Σ_g ‖θ_g‖_F²`` (docs/spec.md §4)."""

    lam: float

    def __post_init__(self) -> None:
        lam = check_finite_scalar(self.lam, "penalty")
        if lam < 0:
            raise ValueError(f"penalty must be >= 0, got {lam}")
        object.__setattr__(self, "lam", lam)

    @property
    def degree(self) -> float | None:  # type: ignore[override]
        return 1.0 if self.lam == 0.0 else None

    def update(self, updates: Updates, state: Any, params: Updates, *, loss: Tensor, step: int) -> tuple[Updates, Any]:
        if self.lam == 0.0:
            return updates, state
        c = 2.0 * self.lam
        return tuple([u + c * p for u, p in zip(updates, params)]), state


@dataclass(frozen=True)
class NormalizeByNorm(Transform):
    """``u_g / (‖u_g‖_F + ε)`` per run and per group (the paper's normalized GD, docs/spec.md §4).

    With ε = 0 the norm is taken after scaling by ``max|u_g|``, so an update whose squares underflow
    (``‖u‖ ≲ 1e-154``) is still normalised exactly, and a zero update stays zero; the transform is then
    scale-free (degree 0).
    """

    eps: float = NORMALIZE_EPS

    def __post_init__(self) -> None:
        eps = check_finite_scalar(self.eps, "normalize_eps")
        if eps < 0:
            raise ValueError(f"normalize_eps must be >= 0, got {eps}")
        object.__setattr__(self, "eps", eps)

    @property
    def degree(self) -> float | None:  # type: ignore[override]
        return 0.0 if self.eps == 0.0 else None

    def update(self, updates: Updates, state: Any, params: Updates, *, loss: Tensor, step: int) -> tuple[Updates, Any]:
        out = []
        if self.eps > 0:
            for u in updates:
                n = _fro(u)
                if u.device.type == "cpu" and float(n.amax()) <= _PLAIN_NORM_RANGE[1]:
                    out.append(u / (_col(n) + self.eps))  # (a tiny norm is exact enough next to ε)
                    continue
                # ‖u‖² overflows (a huge penalty gradient): u/(‖u‖ + ε) = v/(‖v‖ + ε/a) with v = u/a, a = max|u|
                a = u.abs().amax(dim=(-2, -1), keepdim=True).clamp_min(torch.finfo(u.dtype).tiny)
                v = u / a
                out.append(v / (torch.linalg.vector_norm(v, dim=(-2, -1), keepdim=True) + self.eps / a))
            return tuple(out), state
        for u in updates:
            tiny = torch.finfo(u.dtype).tiny
            u = u / u.abs().amax(dim=(-2, -1), keepdim=True).clamp_min(tiny)
            out.append(u / _col(_fro(u)).clamp_min(tiny))
        return tuple(out), state


@dataclass(frozen=True)
class NormalizeByDualNorm(Transform):
    """``u_g / (‖u_g‖_q + ε)`` per run and per group, q = p/(p−1): normalised ℓp mirror descent
    (docs/spec.md §8). The entrywise q-norm is taken after scaling by ``max|u_g|`` (no overflow).
    For p = 2 it is :class:`NormalizeByNorm`.
    """

    p: float = 2.0
    eps: float = NORMALIZE_EPS

    def __post_init__(self) -> None:
        p = check_finite_scalar(self.p, "p")
        if p <= 1:
            raise ValueError(f"p must be > 1, got {p}")
        object.__setattr__(self, "p", p)
        eps = check_finite_scalar(self.eps, "normalize_eps")
        if eps < 0:
            raise ValueError(f"normalize_eps must be >= 0, got {eps}")
        object.__setattr__(self, "eps", eps)

    def update(self, updates: Updates, state: Any, params: Updates, *, loss: Tensor, step: int) -> tuple[Updates, Any]:
        q = self.p / (self.p - 1.0)
        out = []
        for u in updates:
            tiny = torch.finfo(u.dtype).tiny
            s = u.abs().amax(dim=(-2, -1), keepdim=True).clamp_min(tiny)
            nq = s * ((u.abs() / s) ** q).sum(dim=(-2, -1), keepdim=True) ** (1.0 / q)
            out.append(u / (nq + self.eps))
        return tuple(out), state


@dataclass(frozen=True)
class StepSize(Transform):
    """``−η u``: a step of size η along the incoming direction.

    ``lr`` is a positive float, R positive floats (one per run), or a schedule ``lr(k)`` returning a
    float or R floats for update k (evaluated once per update).
    """

    lr: float | Sequence[float] | np.ndarray | Callable[[int], Any]
    degree = 1.0

    def init(self, params: Updates) -> Tensor | None:
        eta = self.values(int(params[0].shape[0]))
        if isinstance(eta, str):
            return None
        return _col(torch.as_tensor(-eta, dtype=params[0].dtype, device=params[0].device))  # −η (R, 1, 1)

    def values(self, runs: int) -> np.ndarray | str:
        """The step of every run (R,), or ``"schedule"``; checks ``lr`` against R runs."""
        if callable(self.lr):
            return "schedule"
        arr = np.asarray(self.lr, dtype=np.float64) if not isinstance(self.lr, (bool, str)) else None
        if arr is None or arr.shape not in ((), (runs,)) or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
            raise ValueError(
                f"lr must be a positive float, {runs} positive floats (one per run) or a callable "
                f"step -> float; got {self.lr!r}"
            )
        return np.broadcast_to(arr, (runs,)).copy()

    def update(self, updates: Updates, state: Any, params: Updates, *, loss: Tensor, step: int) -> tuple[Updates, Any]:
        neg_eta = state
        if neg_eta is None:  # schedule
            R = int(params[0].shape[0])
            out = self.lr(step)  # type: ignore[operator]
            try:
                v = np.asarray(out, dtype=np.float64)
            except (TypeError, ValueError):
                v = None
            if v is None or v.shape not in ((), (R,)) or not np.all(np.isfinite(v)) or np.any(v <= 0):
                raise ValueError(
                    f"lr schedule must return a positive finite float or {R} such floats, got {out!r} at step {step}"
                )
            neg_eta = _col(torch.as_tensor(-np.broadcast_to(v, (R,)), dtype=params[0].dtype, device=params[0].device))
        return tuple([neg_eta * u for u in updates]), state


@dataclass(frozen=True)
class PolyakStep(Transform):
    """``−η u`` with Polyak's step ``η = (L − L*) / Σ_g ‖u_g‖_F²`` per run (docs/spec.md §8).

    ``min_loss`` is L*, one value or one per run (0: the infimum of the risk on separable data; with the
    head fixed the attention risk stays above 0, and then uncapped steps overshoot: ``train(lr="polyak")``
    computes each run's infimum). With ``excess=True`` the trainer hands it the excess risk ``L − L*``
    itself, computed without cancellation (:func:`attsvm.model.excess_risk_scaled`, linear heads),
    together with the scaled gradient, so the step stays exact after the loss difference has fallen
    below round-off. ``max_lr`` caps η. A run whose
    update is zero, or whose loss is at most L*, does not move. The norms are taken after scaling by
    ``max|u|``, so the step stays finite while ``‖u‖²`` underflows.
    """

    min_loss: float | Sequence[float] | np.ndarray = 0.0
    max_lr: float = math.inf
    excess: bool = False

    def __post_init__(self) -> None:
        ml = np.asarray(self.min_loss, dtype=np.float64) if not isinstance(self.min_loss, (bool, str)) else None
        if ml is None or ml.ndim > 1 or not np.all(np.isfinite(ml)):
            raise ValueError(f"min_loss must be a finite float or one finite float per run, got {self.min_loss!r}")
        if isinstance(self.max_lr, bool) or not isinstance(self.max_lr, (int, float, np.integer, np.floating)):
            raise TypeError(f"max_lr must be a number > 0 (inf: no cap), got {type(self.max_lr).__name__}")
        if not (self.max_lr > 0):
            raise ValueError(f"max_lr must be > 0 (inf: no cap), got {self.max_lr}")
        object.__setattr__(self, "max_lr", float(self.max_lr))
        object.__setattr__(self, "excess", check_bool(self.excess, "excess"))

    @property
    def degree(self) -> float:  # type: ignore[override]
        # with excess=True the trainer passes e^{c}∇L and e^{c}(L − L*): the scale cancels
        return 0.0 if self.excess else -1.0

    def update(self, updates: Updates, state: Any, params: Updates, *, loss: Tensor, step: int) -> tuple[Updates, Any]:
        tiny = torch.finfo(updates[0].dtype).tiny
        a = torch.stack([u.abs().amax(dim=(-2, -1)) for u in updates]).amax(0)  # (R,) max|u|
        a_safe = a.clamp_min(tiny)
        sq = sum(_fro(u / _col(a_safe)) ** 2 for u in updates)  # ‖u‖² / a², in [1, size]
        if self.excess:  # ``loss`` is already the (scaled) excess risk L − L*
            gap = loss.clamp_min(0.0)
        else:
            ml = torch.as_tensor(np.asarray(self.min_loss, dtype=np.float64), dtype=loss.dtype, device=loss.device)
            if ml.ndim == 1 and ml.shape[0] != loss.shape[0]:
                raise ValueError(f"min_loss holds {ml.shape[0]} values for {loss.shape[0]} runs")
            gap = (loss - ml).clamp_min(0.0)
        # η·u = (gap / a) / (‖u‖²/a²) · (u / a)
        coef = torch.where(a > 0, gap / a_safe / sq, torch.zeros_like(gap))
        coef = coef.clamp_max(torch.finfo(coef.dtype).max)  # a positive loss at a stationary point: no inf·0
        if math.isfinite(self.max_lr):
            coef = torch.minimum(coef, self.max_lr * a)  # η ≤ max_lr
        return tuple(-(_col(coef) * (u / _col(a_safe))) for u in updates), state


@dataclass(frozen=True)
class MirrorMap(Transform):
    """Mirror-descent displacement for ``ψ(θ) = ‖θ‖_p^p / p`` per group (docs/spec.md §8, ℓp-AttGD).

    The incoming update ``u`` is a step in the dual space (e.g. ``−η∇L`` from :class:`StepSize`); the
    outgoing one is ``θ⁺ − θ`` with ``θ⁺ = ∇ψ*(∇ψ(θ) + u)``, ``∇ψ(θ) = sign(θ)|θ|^{p−1}`` and
    ``∇ψ*(U) = sign(U)|U|^{1/(p−1)}``. Both maps are evaluated relative to a per-run scale
    ``s = max(max|θ|, max|u|^{1/(p−1)})``, so neither ``|θ|^{p−1}`` nor its inverse overflows at huge
    norms. For p = 2 this is the identity: plain GD.
    """

    p: float = 2.0

    def __post_init__(self) -> None:
        p = check_finite_scalar(self.p, "p")
        if p <= 1:
            raise ValueError(f"p must be > 1 (ψ = ‖W‖_p^p/p is strictly convex for p > 1), got {p}")
        object.__setattr__(self, "p", p)

    @property
    def degree(self) -> float | None:  # type: ignore[override]
        return 1.0 if self.p == 2.0 else None

    def update(self, updates: Updates, state: Any, params: Updates, *, loss: Tensor, step: int) -> tuple[Updates, Any]:
        q1 = self.p - 1.0
        out = []
        for u, th in zip(updates, params):
            s = torch.maximum(th.abs().amax(dim=(-2, -1)), u.abs().amax(dim=(-2, -1)) ** (1.0 / q1))
            s = _col(torch.where(s > 0, s, torch.ones_like(s)))  # θ = u = 0: any scale, no 0/0
            # ∇ψ(θ) + u, divided by s^{p−1}; |u| ≤ s^{p−1}, so where that underflows u is 0 too
            U = torch.sign(th) * (th.abs() / s) ** q1 + torch.where(u == 0, torch.zeros_like(u), u / s**q1)
            new = s * torch.sign(U) * U.abs() ** (1.0 / q1)
            out.append(new - th)
        return tuple(out), state


# ---------------------------------------------------------------------------------------------
# ready-made rules


def gd(lr: float | Sequence[float] | Callable[[int], Any], *, penalty: float = 0.0) -> Chain:
    """Plain GD ``θ ← θ − η(∇L + 2λθ)``."""
    parts: list[Transform] = [AddPenalty(penalty)] if penalty else []
    return chain(*parts, StepSize(lr))


def normalized_gd(
    lr: float | Sequence[float] | Callable[[int], Any] = NORMALIZED_LR,
    *,
    eps: float = NORMALIZE_EPS,
    penalty: float = 0.0,
) -> Chain:
    """The paper's normalized GD: ``θ_g ← θ_g − η g_g/(‖g_g‖_F + ε)`` per group, with ``g = ∇L + 2λθ``."""
    parts: list[Transform] = [AddPenalty(penalty)] if penalty else []
    return chain(*parts, NormalizeByNorm(eps), StepSize(lr))


def mirror_descent(
    p: float,
    lr: float | Sequence[float] | Callable[[int], Any],
    *,
    normalized: bool = False,
    eps: float = NORMALIZE_EPS,
) -> Chain:
    """ℓp mirror descent (docs/spec.md §8): ``∇ψ(θ⁺) = ∇ψ(θ) − η∇L``, ``ψ = ‖θ‖_p^p/p``; with
    ``normalized=True`` the gradient is first divided by its dual norm ``‖∇L‖_q + ε``."""
    parts: list[Transform] = [NormalizeByDualNorm(p, eps)] if check_bool(normalized, "normalized") else []
    return chain(*parts, StepSize(lr), MirrorMap(p))


def polyak(*, min_loss: float = 0.0, max_lr: float = math.inf) -> Chain:
    """GD with Polyak's step ``η = (L − L*)/‖∇L‖²`` (docs/spec.md §8)."""
    return chain(PolyakStep(min_loss=min_loss, max_lr=max_lr))


def normalize_per_run(*groups: Tensor) -> tuple[Tensor, ...]:
    """``g/‖g‖_F`` per run (leading axis) for each group of any shape (R, ...): :class:`NormalizeByNorm` with
    ε = 0 (exact for tiny g, 0 for g = 0), for trainers that step outside a :func:`chain`."""
    flat = tuple(g.reshape(g.shape[0], 1, -1) for g in groups)
    out, _ = NormalizeByNorm(0.0).update(flat, None, flat, loss=torch.zeros(()), step=0)
    return tuple(u.reshape(g.shape) for u, g in zip(out, groups))
