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
  ``ψ(θ) = ‖θ‖_p^p / p`` (docs/spec.md §8);
* steepest-descent directions of other norms, each per run and per group: :class:`SignDirection`
  (entrywise ℓ∞: ``sign(u)``), :class:`Orthogonalize` (spectral norm: the polar factor ``U Vᵀ`` of
  ``u = U Σ Vᵀ``, by SVD or Newton–Schulz), :class:`TopSingular` (nuclear norm: ``u₁v₁ᵀ`` of the top
  singular pair); with ``normalized=False`` each is multiplied by the dual norm of ``u`` (``‖u‖₁``,
  ``‖u‖_*``, ``‖u‖₂``), the un-normalised steepest descent of Gunasekar et al. (2018);
* :class:`ScaleByAdam` — Adam's ``m̂ / (√v̂ + ε)`` with bias-corrected moments (ε = 0 allowed).

Ready-made rules: :func:`gd`, :func:`normalized_gd`, :func:`mirror_descent`, :func:`polyak`,
:func:`sign_descent`, :func:`adam`, :func:`muon`, :func:`nuclear_sd`. A transform
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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .._validation import check_bool, check_choice, check_finite_scalar, check_positive_int

__all__ = [
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
    "SignDirection",
    "Orthogonalize",
    "TopSingular",
    "ScaleByAdam",
    "gd",
    "normalized_gd",
    "mirror_descent",
    "polyak",
    "sign_descent",
    "adam",
    "muon",
    "nuclear_sd",
    "polar_factor",
    "NS_CUBIC",
    "NS_QUINTIC",
    "ADAM_LR",
    "ADAM_BETAS",
    "ADAM_EPS",
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
# steepest descent in other norms, and Adam

# Newton–Schulz coefficients (a, b, c) of X ← aX + b(XXᵀ)X + c(XXᵀ)²X. The cubic iteration converges
# to the polar factor (every nonzero singular value → 1, quadratically near 1) for singular values in
# (0, √3); Muon's quintic (Jordan et al., 2024) drives them into about [0.7, 1.2] in 5 steps, fast but
# never exactly to 1.
NS_CUBIC = (1.5, -0.5, 0.0)
NS_QUINTIC = (3.4445, -4.7750, 2.0315)
POLAR_METHODS = ("svd", "newton_schulz")


def _max_abs(u: Tensor) -> Tensor:
    """``max|u|`` over the last two axes, keepdim (R, 1, 1)."""
    return u.abs().amax(dim=(-2, -1), keepdim=True)


def _scaled(u: Tensor) -> tuple[Tensor, Tensor]:
    """``(u / a, a)`` with ``a = max|u|`` per matrix (a = 1 for a zero matrix): entries of u/a lie in
    [−1, 1], so squares and products neither overflow nor underflow whatever the scale of u."""
    a = _max_abs(u)
    a = torch.where(a > 0, a, torch.ones_like(a))
    return u / a, a


def polar_factor(
    G: Tensor, method: str = "svd", steps: int = 5, coefficients: tuple[float, float, float] = NS_CUBIC
) -> Tensor:
    """The polar factor ``U Vᵀ`` of ``G = U Σ Vᵀ`` over the last two axes (batched over the leading ones).

    ``method="svd"``: exact, from the thin SVD; singular values below ``max(rows, cols)·eps·σ₁`` count
    as zero (the gradients of attention have rank ≤ n), so a rank-deficient G gives the partial isometry
    on its range, and G = 0 gives 0. ``method="newton_schulz"``: ``steps`` iterations of
    ``X ← aX + b(XXᵀ)X + c(XXᵀ)²X`` from ``X₀ = G/‖G‖_F`` with ``coefficients`` (a, b, c)
    (:data:`NS_CUBIC`, the classical iteration, converges to the SVD's answer; :data:`NS_QUINTIC` is
    Muon's). Zero singular values stay zero, but round-off ones grow by up to ``a`` per step (1.5 for the
    cubic: after 30 steps a 1e-16 one is ~1e-11), so many steps on a rank-deficient G add that much
    noise. A matrix with a non-finite entry gives NaN.
    """
    check_choice(method, "method", POLAR_METHODS)
    Gs, _ = _scaled(G)
    finite = torch.isfinite(Gs).all(dim=-1, keepdim=True).all(dim=-2, keepdim=True)
    Gs = torch.where(finite, Gs, torch.zeros_like(Gs))
    if method == "svd":
        U, S, Vh = torch.linalg.svd(Gs, full_matrices=False)
        tol = S[..., :1] * (max(G.shape[-2:]) * torch.finfo(G.dtype).eps)
        keep = (S > tol).to(G.dtype)
        out = (U * keep[..., None, :]) @ Vh
    else:
        a, b, c = (float(x) for x in coefficients)
        wide = Gs.shape[-2] <= Gs.shape[-1]
        X = Gs if wide else Gs.mT  # (the Gram matrix X Xᵀ of the smaller side)
        X = X / _col_fro(X).clamp_min(torch.finfo(G.dtype).tiny)
        for _ in range(check_positive_int(steps, "steps", minimum=0)):
            A = X @ X.mT
            B = b * A + c * (A @ A) if c else b * A
            X = a * X + B @ X
        out = X if wide else X.mT
    return torch.where(finite, out, torch.full_like(out, math.nan))


def _col_fro(X: Tensor) -> Tensor:
    return torch.linalg.vector_norm(X, dim=(-2, -1), keepdim=True)


@dataclass(frozen=True)
class _SteepestDirection(Transform):
    """A norm's steepest-descent direction of each group's update: scale-free by default (degree 0);
    ``normalized=False`` multiplies it by the update's dual norm (degree 1, un-normalised steepest descent)."""

    normalized: bool = field(default=True, kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "normalized", check_bool(self.normalized, "normalized"))

    @property
    def degree(self) -> float | None:  # type: ignore[override]
        return 0.0 if self.normalized else 1.0


@dataclass(frozen=True)
class SignDirection(_SteepestDirection):
    """``sign(u_g)`` entrywise: the steepest-descent direction of the entrywise ℓ∞ norm (sign descent).

    With ``normalized=False``: ``‖u_g‖₁ · sign(u_g)`` (the un-normalised steepest descent of
    Gunasekar et al. 2018, degree 1); the default is scale-free (degree 0). Zero entries stay zero.
    """

    def update(self, updates: Updates, state: Any, params: Updates, *, loss: Tensor, step: int) -> tuple[Updates, Any]:
        if self.normalized:
            return tuple(torch.sign(u) for u in updates), state
        return tuple(u.abs().sum(dim=(-2, -1), keepdim=True) * torch.sign(u) for u in updates), state


@dataclass(frozen=True)
class Orthogonalize(_SteepestDirection):
    """The polar factor ``U Vᵀ`` of each group's update ``u_g = U Σ Vᵀ``: the steepest-descent direction
    of the spectral norm (Muon's orthogonalised update); see :func:`polar_factor` for ``method``,
    ``steps`` and ``coefficients``.

    With ``normalized=False``: ``⟨u_g, U Vᵀ⟩ · U Vᵀ`` (= ``‖u_g‖_* U Vᵀ`` for the exact factor; degree 1);
    the default is scale-free (degree 0).
    """

    method: str = "svd"
    steps: int = 5
    coefficients: tuple[float, float, float] = NS_CUBIC

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice(self.method, "method", POLAR_METHODS)
        object.__setattr__(self, "steps", check_positive_int(self.steps, "steps", minimum=1))
        co = self.coefficients
        if not isinstance(co, (tuple, list)) or len(co) != 3:
            raise ValueError(f"coefficients must be three floats (a, b, c), got {co!r}")
        object.__setattr__(self, "coefficients", tuple(check_finite_scalar(x, "coefficients") for x in co))

    def update(self, updates: Updates, state: Any, params: Updates, *, loss: Tensor, step: int) -> tuple[Updates, Any]:
        out = []
        for u in updates:
            P = polar_factor(u, self.method, self.steps, self.coefficients)
            out.append(P if self.normalized else (u * P).sum(dim=(-2, -1), keepdim=True) * P)
        return tuple(out), state


@dataclass(frozen=True)
class TopSingular(_SteepestDirection):
    """``u₁v₁ᵀ`` of the top singular pair of each group's update: the steepest-descent direction of the
    nuclear norm (a rank-one update; 0 for a zero update; a tied top singular value gives the SVD's pair).

    With ``normalized=False``: ``σ₁ u₁v₁ᵀ`` (σ₁ = ‖u_g‖₂, the dual of the nuclear norm; degree 1); the
    default is scale-free (degree 0).
    """

    def update(self, updates: Updates, state: Any, params: Updates, *, loss: Tensor, step: int) -> tuple[Updates, Any]:
        out = []
        for u in updates:
            us, a = _scaled(u)
            finite = torch.isfinite(us).all(dim=-1, keepdim=True).all(dim=-2, keepdim=True)
            U, S, Vh = torch.linalg.svd(torch.where(finite, us, torch.zeros_like(us)), full_matrices=False)
            s1 = S[..., :1, None]
            top = torch.where(s1 > 0, U[..., :, :1] @ Vh[..., :1, :], torch.zeros_like(u))
            if not self.normalized:
                top = (s1 * a) * top
            out.append(torch.where(finite, top, torch.full_like(top, math.nan)))
        return tuple(out), state


ADAM_LR = 1e-3  # torch.optim.Adam's default step
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


@dataclass(frozen=True)
class ScaleByAdam(Transform):
    """Adam's direction ``m̂ / (√v̂ + ε)`` per entry (Kingma & Ba; torch.optim.Adam without weight decay):
    ``m ← β₁m + (1 − β₁)u``, ``v ← β₂v + (1 − β₂)u²``, ``m̂ = m/(1 − β₁ᵏ)``, ``v̂ = v/(1 − β₂ᵏ)`` at the
    k-th update; follow it with :class:`StepSize` for ``−η m̂/(√v̂ + ε)``.

    ``eps = 0`` is the variant of the implicit-bias theory (Adam → the ℓ∞ max-margin direction): an
    entry with ``v = 0`` (and so ``m = 0``) gets 0, not 0/0. The moments are stored relative to a per-run,
    per-group scale (``max|u|``, decaying at most like ``√β₂`` per update), so ``u²`` does not underflow
    while ``u`` is representable; an entry more than ~1e154 times smaller than its group's largest gets
    0. The rule mixes gradients of several steps, so it is not scale-free (degree None): the trainer
    feeds it ``∇L`` itself.
    """

    betas: tuple[float, float] = ADAM_BETAS
    eps: float = ADAM_EPS

    def __post_init__(self) -> None:
        b = self.betas
        if not isinstance(b, (tuple, list)) or len(b) != 2:
            raise ValueError(f"betas must be two floats in [0, 1), got {b!r}")
        b1, b2 = (check_finite_scalar(x, "betas") for x in b)
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"betas must be two floats in [0, 1), got {b!r}")
        object.__setattr__(self, "betas", (b1, b2))
        eps = check_finite_scalar(self.eps, "eps")
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        object.__setattr__(self, "eps", eps)

    degree = None

    def init(self, params: Updates) -> tuple[int, tuple[tuple[Tensor, Tensor, Tensor], ...]]:
        # per group: m/a, v/a², and the scale a (R, 1, 1); no update seen yet
        groups = tuple((torch.zeros_like(p), torch.zeros_like(p), torch.zeros_like(p[..., :1, :1])) for p in params)
        return 0, groups

    def update(self, updates: Updates, state: Any, params: Updates, *, loss: Tensor, step: int) -> tuple[Updates, Any]:
        t, groups = state
        t += 1
        b1, b2 = self.betas
        bc1 = 1.0 - b1**t
        bc2_sqrt = math.sqrt(1.0 - b2**t)
        out, new = [], []
        for u, (m, v, a) in zip(updates, groups):
            # true moments: a·m and a²·v; the new scale never falls faster than √v can
            a_new = torch.maximum(a * math.sqrt(b2), _max_abs(u))
            pos = a_new > 0
            a_safe = torch.where(pos, a_new, torch.ones_like(a_new))
            r = torch.where(pos, a / a_safe, torch.zeros_like(a))  # ≤ 1/√β₂
            g = u / a_safe
            m = (b1 * r) * m + (1.0 - b1) * g
            v = (b2 * r * r) * v + (1.0 - b2) * (g * g)
            denom = v.sqrt() / bc2_sqrt + self.eps / a_safe
            upd = torch.where(denom > 0, (m / bc1) / torch.where(denom > 0, denom, torch.ones_like(denom)), 0.0)
            out.append(upd)
            new.append((m, v, a_new))
        return tuple(out), (t, tuple(new))


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


def sign_descent(
    lr: float | Sequence[float] | Callable[[int], Any], *, normalized: bool = True, penalty: float = 0.0
) -> Chain:
    """Sign descent, steepest descent in the entrywise ℓ∞ norm: ``θ_g ← θ_g − η sign(g_g)`` per group
    (``normalized=False``: ``− η ‖g_g‖₁ sign(g_g)``), with ``g = ∇L + 2λθ``. Its implicit bias is the
    ℓ∞ max-margin direction (Gunasekar et al. 2018; Xie & Li 2024)."""
    parts: list[Transform] = [AddPenalty(penalty)] if penalty else []
    return chain(*parts, SignDirection(normalized=normalized), StepSize(lr))


def adam(
    lr: float | Sequence[float] | Callable[[int], Any] = ADAM_LR,
    betas: tuple[float, float] = ADAM_BETAS,
    eps: float = ADAM_EPS,
    *,
    penalty: float = 0.0,
) -> Chain:
    """Adam, as ``torch.optim.Adam``: ``θ ← θ − η m̂/(√v̂ + ε)`` (:class:`ScaleByAdam`); ``eps=0`` is the
    variant whose implicit bias is the ℓ∞ max-margin direction (Xie & Li 2024; Fan, Schmidt &
    Thrampoulidis 2025). ``penalty`` λ adds ``2λθ`` to the gradient (torch's ``weight_decay = 2λ``)."""
    parts: list[Transform] = [AddPenalty(penalty)] if penalty else []
    return chain(*parts, ScaleByAdam(betas, eps), StepSize(lr))


def muon(
    lr: float | Sequence[float] | Callable[[int], Any],
    method: str = "svd",
    steps: int = 5,
    *,
    coefficients: tuple[float, float, float] = NS_CUBIC,
    normalized: bool = True,
    penalty: float = 0.0,
) -> Chain:
    """Muon without momentum, steepest descent in the spectral norm: ``θ_g ← θ_g − η U Vᵀ`` per group,
    ``U Σ Vᵀ`` the SVD of ``g_g = ∇L + 2λθ`` (:class:`Orthogonalize`: exact SVD, or ``steps`` Newton–Schulz
    iterations with ``coefficients``; ``normalized=False`` multiplies by ``‖g_g‖_*``). Its implicit bias
    is the spectral-norm max-margin direction."""
    parts: list[Transform] = [AddPenalty(penalty)] if penalty else []
    return chain(*parts, Orthogonalize(method, steps, coefficients, normalized=normalized), StepSize(lr))


def nuclear_sd(
    lr: float | Sequence[float] | Callable[[int], Any], *, normalized: bool = True, penalty: float = 0.0
) -> Chain:
    """Steepest descent in the nuclear norm: ``θ_g ← θ_g − η u₁v₁ᵀ`` per group, the top singular pair of
    ``g_g = ∇L + 2λθ`` (:class:`TopSingular`, a rank-one step; ``normalized=False`` multiplies by σ₁).
    Its implicit bias is the nuclear-norm max-margin direction."""
    parts: list[Transform] = [AddPenalty(penalty)] if penalty else []
    return chain(*parts, TopSingular(normalized=normalized), StepSize(lr))
