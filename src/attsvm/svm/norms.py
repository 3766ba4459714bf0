"""The norms of the attention SVMs as small objects: everything norm-specific lives here.

A norm knows its value ``‖W‖``, its dual norm ``‖Y‖°`` (which bounds the multipliers:
``‖𝒜*(λ)‖° ≤ 1``), the objective the solvers minimise and its Lagrange dual, its proximal map and a
subgradient. The certificate (:mod:`.certificate`) and the reduction (:mod:`.reduction`) use only
these pieces, so adding a norm (an ℓp or Schatten-p norm) means writing one more :class:`Norm`.

Conventions (docs/spec.md §3): the primal is ``min φ(W) s.t. 𝒜(W) (≥ | =) b`` where ``φ`` is the
solver objective (``½‖W‖_F²`` for Frobenius, ``‖W‖_*`` for nuclear), of homogeneity ``degree``;
for multipliers λ (λ_I ≥ 0) the dual value is ``dual_objective(bᵀλ, 𝒜*(λ))`` ≤ the primal optimum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["Norm", "FROBENIUS", "NUCLEAR", "NORMS", "get_norm"]


@dataclass(frozen=True)
class Norm:
    """Base class: subclasses implement the five pieces below."""

    name: str
    degree: int  # homogeneity of the solver objective φ

    def value(self, W: NDArray[np.float64], svals: NDArray[np.floating] | None = None) -> float:
        """``‖W‖`` (``svals``: the singular values of W, when already at hand)."""
        raise NotImplementedError

    def dual_norm(self, Y: NDArray[np.float64]) -> float:
        """``‖Y‖° = max{⟨Y, W⟩ : ‖W‖ ≤ 1}``."""
        raise NotImplementedError

    def objective(self, W: NDArray[np.float64], svals: NDArray[np.floating] | None = None) -> float:
        """The solver objective ``φ(W)``."""
        raise NotImplementedError

    def dual_objective(self, bl: float, Y: NDArray[np.float64]) -> float:
        """Lagrange dual of ``min φ`` at multipliers with ``bᵀλ = bl`` and ``𝒜*(λ) = Y``."""
        raise NotImplementedError

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

    def value(self, W, svals=None) -> float:
        return float(np.sqrt(np.sum(W * W)))

    def dual_norm(self, Y) -> float:
        return float(np.sqrt(np.sum(Y * Y)))

    def objective(self, W, svals=None) -> float:
        return 0.5 * float(np.sum(W * W))

    def dual_objective(self, bl, Y) -> float:
        # max_W bᵀλ + ⟨Y, W⟩ − ... : min ½‖W‖² − ⟨Y, W⟩ at W = Y gives bᵀλ − ½‖Y‖²
        return float(bl) - 0.5 * float(np.sum(Y * Y))

    def prox(self, Y, t) -> NDArray[np.float64]:
        nrm = self.value(Y)
        return Y * max(0.0, 1.0 - t / nrm) if nrm > 0 else Y.copy()

    def subgradient(self, W) -> NDArray[np.float64]:
        nrm = self.value(W)
        return W / nrm if nrm > 0 else np.zeros_like(W)


@dataclass(frozen=True)
class _Nuclear(Norm):
    name: str = "nuc"
    degree: int = 1

    def value(self, W, svals=None) -> float:
        if W.size == 0:
            return 0.0
        s = np.linalg.svd(W, compute_uv=False) if svals is None else svals
        return float(s.sum())

    def dual_norm(self, Y) -> float:
        return float(np.linalg.norm(Y, 2)) if Y.size else 0.0

    def objective(self, W, svals=None) -> float:
        return self.value(W, svals)

    def dual_objective(self, bl, Y) -> float:
        # λ / max(1, ‖Y‖₂) is dual feasible (‖𝒜*(·)‖₂ ≤ 1): weak duality gives this bound
        return float(bl) / max(1.0, self.dual_norm(Y))

    def prox(self, Y, t) -> NDArray[np.float64]:
        U, s, Vt = np.linalg.svd(Y, full_matrices=False)
        return (U * np.maximum(s - t, 0.0)) @ Vt

    def subgradient(self, W) -> NDArray[np.float64]:
        U, s, Vt = np.linalg.svd(W, full_matrices=False)
        r = int((s > 1e-12 * s[0]).sum()) if s.size and s[0] > 0 else 0
        return U[:, :r] @ Vt[:r]


FROBENIUS: Norm = _Frobenius()
NUCLEAR: Norm = _Nuclear()
NORMS: dict[str, Norm] = {"fro": FROBENIUS, "nuc": NUCLEAR}


def get_norm(norm: str | Norm) -> Norm:
    """The :class:`Norm` named ``norm`` ("fro" or "nuc"), or ``norm`` itself."""
    if isinstance(norm, Norm):
        return norm
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {', '.join(repr(k) for k in NORMS)}; got {norm!r}")
    return NORMS[norm]
