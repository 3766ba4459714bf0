"""The norms of the attention SVMs as small objects: everything norm-specific lives here.

A norm knows its value ``‖W‖``, its dual norm ``‖Y‖°`` (which bounds the multipliers:
``‖𝒜*(λ)‖° ≤ 1``), the objective the solvers minimise and its Lagrange dual, its proximal map and a
subgradient. The certificate (:mod:`.certificate`) and the reduction (:mod:`.reduction`) use only
these pieces, so adding a norm (an ℓp or Schatten-p norm) means writing one more :class:`Norm`.

Plugging in a norm (docs/spec.md §3): a subclass of :class:`Norm` that implements :meth:`Norm.value`,
:meth:`Norm.dual_norm` and :meth:`Norm.prox` is enough; ``AttentionSVM(norm=MyNorm())`` then solves
``min ‖W‖`` with the generic solver of :mod:`.generic` and certifies it here. :func:`register_norm` gives
it a name (``AttentionSVM(norm="myname")``); the built-in names keep their own solvers. A norm that is
unitarily invariant (``‖U W Vᵀ‖ = ‖W‖`` for orthonormal U, V, at any shape) may say so
(:attr:`Norm.unitarily_invariant`): only then is the subspace reduction ``W = U M Vᵀ`` applied to it.

Conventions (docs/spec.md §3): the primal is ``min φ(W) s.t. 𝒜(W) (≥ | =) b`` where ``φ`` is the
solver objective (``½‖W‖_F²`` for Frobenius, ``‖W‖_*`` for nuclear, ``‖W‖₂`` for spectral), of homogeneity ``degree``;
for multipliers λ (λ_I ≥ 0) the dual value is ``dual_objective(bᵀλ, 𝒜*(λ))`` ≤ the primal optimum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "Norm",
    "LpNorm",
    "FROBENIUS",
    "NUCLEAR",
    "L1",
    "LINF",
    "SPECTRAL",
    "NORMS",
    "BUILTIN_NAMES",
    "get_norm",
    "lp_norm",
    "register_norm",
    "unregister_norm",
    "registered_norms",
]


@dataclass(frozen=True)
class Norm:
    """Base class of the norms. A norm written by a user implements at least :meth:`value`,
    :meth:`dual_norm` and :meth:`prox`; :meth:`objective` and :meth:`dual_objective` default to the
    forms of ``degree`` (1: ``φ = ‖W‖`` with dual bound ``bᵀλ / max(1, ‖𝒜*(λ)‖°)``; 2: ``φ = ½‖W‖²`` with
    dual ``bᵀλ − ½‖𝒜*(λ)‖°²``), and :meth:`subgradient` is optional (the generic solver does not use it).

    ``unitarily_invariant`` (a class attribute, default False): set it True only for a norm with
    ``‖U M Vᵀ‖ = ‖M‖`` for every M and orthonormal-column U, V (its methods must then accept matrices of any
    shape); the solvers then work in the reduced coordinates ``W = U M Vᵀ`` (:mod:`.reduction`).
    """

    name: str = "custom"
    degree: int = 1  # homogeneity of the solver objective φ (1: ‖W‖, 2: ½‖W‖²)
    unitarily_invariant: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if isinstance(self.degree, bool) or self.degree not in (1, 2):
            raise ValueError(f"degree must be 1 (objective ‖W‖) or 2 (objective ½‖W‖²), got {self.degree!r}")

    def value(self, W: NDArray[np.float64], svals: NDArray[np.floating] | None = None) -> float:
        """``‖W‖`` (``svals``: the singular values of W, when already at hand)."""
        raise NotImplementedError

    def dual_norm(self, Y: NDArray[np.float64]) -> float:
        """``‖Y‖° = max{⟨Y, W⟩ : ‖W‖ ≤ 1}``."""
        raise NotImplementedError

    def objective(self, W: NDArray[np.float64], svals: NDArray[np.floating] | None = None) -> float:
        """The solver objective ``φ(W)``: ``‖W‖`` (degree 1) or ``½‖W‖²`` (degree 2) by default."""
        v = self.value(W, svals)
        return v if self.degree == 1 else 0.5 * v * v

    def dual_objective(self, bl: float, Y: NDArray[np.float64]) -> float:
        """Lagrange dual of ``min φ`` at multipliers with ``bᵀλ = bl`` and ``𝒜*(λ) = Y``. By default, degree 1:
        ``bl / max(1, ‖Y‖°)`` (``λ / max(1, ‖Y‖°)`` is dual feasible, ``‖𝒜*(·)‖° ≤ 1``, so weak duality gives this
        bound); degree 2: ``bl − ½‖Y‖°²`` (``min_W ½‖W‖² − ⟨Y, W⟩ = −½‖Y‖°²``)."""
        dn = self.dual_norm(Y)
        return float(bl) / max(1.0, dn) if self.degree == 1 else float(bl) - 0.5 * dn * dn

    def prox(self, Y: NDArray[np.float64], t: float) -> NDArray[np.float64]:
        """``argmin_W t‖W‖ + ½‖W − Y‖_F²``."""
        raise NotImplementedError

    def subgradient(self, W: NDArray[np.float64]) -> NDArray[np.float64]:
        """An element of ``∂‖W‖`` (0 at W = 0)."""
        raise NotImplementedError


@dataclass(frozen=True)
class _Frobenius(Norm):
    name: str = "fro"
    degree: int = 2
    unitarily_invariant: ClassVar[bool] = True

    # (np.vdot: one BLAS call, no temporary; the certificate of a tiny fit calls these four)
    def value(self, W, svals=None) -> float:
        return float(np.sqrt(np.vdot(W, W)))

    def dual_norm(self, Y) -> float:
        return float(np.sqrt(np.vdot(Y, Y)))

    def objective(self, W, svals=None) -> float:
        return 0.5 * float(np.vdot(W, W))

    def dual_objective(self, bl, Y) -> float:
        # max_W bᵀλ + ⟨Y, W⟩ − ... : min ½‖W‖² − ⟨Y, W⟩ at W = Y gives bᵀλ − ½‖Y‖²
        return float(bl) - 0.5 * float(np.vdot(Y, Y))

    def prox(self, Y, t) -> NDArray[np.float64]:
        nrm = self.value(Y)
        return Y * max(0.0, 1.0 - t / nrm) if nrm > 0 else Y.copy()

    def subgradient(self, W) -> NDArray[np.float64]:
        nrm = self.value(W)
        return W / nrm if nrm > 0 else np.zeros_like(W)


def _singular_values(W: NDArray[np.float64], svals: NDArray[np.floating] | None) -> NDArray[np.floating]:
    """The singular values of W, or ``svals`` when the caller has them already."""
    return np.linalg.svd(W, compute_uv=False) if svals is None else svals


@dataclass(frozen=True)
class _Nuclear(Norm):
    name: str = "nuc"
    degree: int = 1
    unitarily_invariant: ClassVar[bool] = True

    def value(self, W, svals=None) -> float:
        if W.size == 0:
            return 0.0
        s = _singular_values(W, svals)
        return float(s.sum())

    def dual_norm(self, Y) -> float:
        return float(np.linalg.norm(Y, 2)) if Y.size else 0.0

    def prox(self, Y, t) -> NDArray[np.float64]:
        U, s, Vt = np.linalg.svd(Y, full_matrices=False)
        return (U * np.maximum(s - t, 0.0)) @ Vt

    def subgradient(self, W) -> NDArray[np.float64]:
        U, s, Vt = np.linalg.svd(W, full_matrices=False)
        r = int((s > 1e-12 * s[0]).sum()) if s.size and s[0] > 0 else 0
        return U[:, :r] @ Vt[:r]


def _entry_norm(W: NDArray[np.float64], p: float) -> float:
    """Entrywise ``‖W‖_p`` computed relative to ``max|W|`` (no overflow or underflow of ``|W|^p``)."""
    a = np.abs(W)
    s = float(a.max(initial=0.0))
    if s == 0.0 or not np.isfinite(s):
        return s
    if math.isinf(p):
        return s
    return s * float(np.sum((a / s) ** p)) ** (1.0 / p)


@dataclass(frozen=True)
class LpNorm(Norm):
    """Entrywise ℓp norm, 1 < p < ∞ (docs/spec.md §8); the solver objective is ``½‖W‖_p²``.

    Its dual norm is ℓq, ``q = p/(p−1)``; the Lagrange dual of ``min ½‖W‖_p²`` at multipliers with
    ``bᵀλ = bl`` and ``𝒜*(λ) = Y`` is ``bl − ½‖Y‖_q²`` (as for Frobenius, which is p = 2).
    """

    name: str = "lp"
    degree: int = 2
    p: float = 2.0

    @property
    def q(self) -> float:
        """The dual exponent ``p/(p−1)``."""
        return self.p / (self.p - 1.0)

    def value(self, W, svals=None) -> float:
        return _entry_norm(W, self.p)

    def dual_norm(self, Y) -> float:
        return _entry_norm(Y, self.q)

    def subgradient(self, W) -> NDArray[np.float64]:
        nrm = self.value(W)
        if nrm == 0:
            return np.zeros_like(W)
        return np.sign(W) * (np.abs(W) / nrm) ** (self.p - 1.0)


@dataclass(frozen=True)
class _L1(Norm):
    """Entrywise ℓ1 norm (the p → 1 limit, docs/spec.md §8); dual norm max|Y|."""

    name: str = "l1"
    degree: int = 1

    def value(self, W, svals=None) -> float:
        return float(np.abs(W).sum())

    def dual_norm(self, Y) -> float:
        return float(np.abs(Y).max(initial=0.0))

    def prox(self, Y, t) -> NDArray[np.float64]:
        return np.sign(Y) * np.maximum(np.abs(Y) - t, 0.0)

    def subgradient(self, W) -> NDArray[np.float64]:
        return np.sign(W)


@dataclass(frozen=True)
class _Linf(Norm):
    """Entrywise ℓ∞ norm (the p → ∞ limit, docs/spec.md §8); dual norm Σ|Y|."""

    name: str = "linf"
    degree: int = 1

    def value(self, W, svals=None) -> float:
        return float(np.abs(W).max(initial=0.0))

    def dual_norm(self, Y) -> float:
        return float(np.abs(Y).sum())

    def prox(self, Y, t) -> NDArray[np.float64]:
        # Moreau: prox_{t‖·‖∞}(Y) = Y − Proj_{‖·‖₁ ≤ t}(Y) = clip(Y, −θ, θ) with Σ max(|Y| − θ, 0) = t (0 when Σ|Y| ≤ t)
        a = np.abs(Y)
        if float(a.sum()) <= t:
            return np.zeros_like(Y)
        theta = _simplex_threshold(a.ravel(), t)
        return np.clip(Y, -theta, theta)

    def subgradient(self, W) -> NDArray[np.float64]:
        a = np.abs(W)
        top = a >= a.max(initial=0.0) * (1 - 1e-12)
        k = int(top.sum())
        return np.where(top, np.sign(W) / max(k, 1), 0.0) if a.max(initial=0.0) > 0 else np.zeros_like(W)


def _simplex_threshold(s: NDArray[np.floating], radius: float) -> float:
    """θ ≥ 0 with ``Σ max(s_i − θ, 0) = radius`` for ``s ≥ 0`` with ``Σ s > radius`` (the projection of s onto
    the ℓ1 ball of that radius is ``max(s − θ, 0)``)."""
    u = np.sort(np.asarray(s, dtype=np.float64))[::-1]
    css = np.cumsum(u)
    k = np.arange(1, u.size + 1)
    rho = int(np.flatnonzero(u - (css - radius) / k > 0)[-1])
    return float(max((css[rho] - radius) / (rho + 1), 0.0))


@dataclass(frozen=True)
class _Spectral(Norm):
    """Spectral norm ‖W‖₂ (the largest singular value, docs/spec.md §3); dual norm the nuclear norm."""

    name: str = "spectral"
    degree: int = 1
    unitarily_invariant: ClassVar[bool] = True

    def value(self, W, svals=None) -> float:
        if W.size == 0:
            return 0.0
        s = _singular_values(W, svals)
        return float(s.max(initial=0.0))

    def dual_norm(self, Y) -> float:
        return NUCLEAR.value(Y)

    def prox(self, Y, t) -> NDArray[np.float64]:
        # Moreau: prox_{t‖·‖₂}(Y) = Y − Proj_{‖·‖_* ≤ t}(Y); on the singular values s that is s − Proj_{ℓ1 ≤ t}(s),
        # i.e. min(s, θ) with Σ max(s − θ, 0) = t (0 when Σ s ≤ t)
        U, s, Vt = np.linalg.svd(Y, full_matrices=False)
        if float(s.sum()) <= t:
            return np.zeros_like(Y)
        return (U * np.minimum(s, _simplex_threshold(s, t))) @ Vt

    def subgradient(self, W) -> NDArray[np.float64]:
        if W.size == 0:
            return np.zeros_like(W)
        U, s, Vt = np.linalg.svd(W, full_matrices=False)
        if not s[0] > 0:
            return np.zeros_like(W)
        return np.outer(U[:, 0], Vt[0])


FROBENIUS: Norm = _Frobenius()
NUCLEAR: Norm = _Nuclear()
L1: Norm = _L1()
LINF: Norm = _Linf()
SPECTRAL: Norm = _Spectral()
NORMS: dict[str, Norm] = {"fro": FROBENIUS, "nuc": NUCLEAR, "l1": L1, "linf": LINF, "spectral": SPECTRAL}
# the names of the built-in norms (each with a solver of its own; "lp" needs its exponent p)
BUILTIN_NAMES: tuple[str, ...] = ("fro", "nuc", "lp", "l1", "linf", "spectral")
# the types of the built-in norms: an instance of one of them keeps its own solver
BUILTIN_TYPES: tuple[type[Norm], ...] = (_Frobenius, _Nuclear, LpNorm, _L1, _Linf, _Spectral)
# the norms given names by register_norm
_REGISTRY: dict[str, Norm] = {}
# what a norm must implement itself (the base class's methods raise NotImplementedError)
REQUIRED_METHODS: tuple[str, ...] = ("value", "dual_norm", "prox")


def missing_methods(norm: Norm) -> list[str]:
    """The methods of :data:`REQUIRED_METHODS` that ``norm``'s class does not implement (left to :class:`Norm`)."""
    return [m for m in REQUIRED_METHODS if getattr(type(norm), m) is getattr(Norm, m)]


def check_methods(norm: Norm) -> Norm:
    """``norm``, or the one-line ValueError naming the methods of :data:`REQUIRED_METHODS` it lacks."""
    missing = missing_methods(norm)
    if missing:
        raise ValueError(
            f"norm must implement {', '.join(REQUIRED_METHODS)}; {type(norm).__name__} lacks {', '.join(missing)}"
        )
    return norm


def register_norm(name: str, norm: Norm, *, replace: bool = False) -> Norm:
    """Give ``norm`` (a :class:`Norm` implementing at least ``value``, ``dual_norm`` and ``prox``) the name
    ``name``, so that ``AttentionSVM(norm=name)`` solves with it (the generic solver, :mod:`.generic`). A built-in
    name is refused, and so is a registered name unless ``replace``. Returns ``norm``."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    if name in BUILTIN_NAMES:
        raise ValueError(
            f"name {name!r} is a built-in norm (one of {', '.join(map(repr, BUILTIN_NAMES))}); choose another"
        )
    if not isinstance(norm, Norm):
        raise ValueError(f"norm must be an instance of attsvm.svm.norms.Norm, got {type(norm).__name__}")
    check_methods(norm)
    if name in _REGISTRY and not replace and _REGISTRY[name] is not norm:
        raise ValueError(f"name {name!r} is already registered (pass replace=True to replace it)")
    _REGISTRY[name] = norm
    return norm


def unregister_norm(name: str) -> None:
    """Remove the name ``name`` given by :func:`register_norm` (a ValueError naming it if there is none)."""
    if name not in _REGISTRY:
        raise ValueError(f"name {name!r} is not a registered norm")
    del _REGISTRY[name]


def registered_norms() -> dict[str, Norm]:
    """A copy of the names given by :func:`register_norm` and their norms."""
    return dict(_REGISTRY)


def lp_norm(p: float) -> LpNorm:
    """The entrywise ℓp norm for ``1 < p < ∞`` (a ValueError naming p otherwise)."""
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise ValueError(f"p must be a number with 1 < p < inf, got {p!r}")
    pf = float(p)
    if not (pf > 1.0) or math.isinf(pf) or math.isnan(pf):
        raise ValueError(f"p must satisfy 1 < p < inf (use norm='l1' or norm='linf' for the limits), got p={p!r}")
    return LpNorm(p=pf)


def get_norm(norm: str | Norm) -> Norm:
    """The :class:`Norm` named ``norm`` ("fro", "nuc", "l1", "linf", "spectral" or a name given to
    :func:`register_norm`), or ``norm`` itself (e.g. :func:`lp_norm`)."""
    if isinstance(norm, Norm):
        return norm
    if isinstance(norm, str):
        if norm in NORMS:
            return NORMS[norm]
        if norm in _REGISTRY:
            return _REGISTRY[norm]
    extra = "".join(f", {k!r}" for k in _REGISTRY)
    raise ValueError(f"norm must be one of {', '.join(repr(k) for k in NORMS)}{extra}; got {norm!r}")
