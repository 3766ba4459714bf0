"""Initialisations of the trained groups (docs/spec.md §4, §6): the published ``nn.Linear`` draw, Gaussian,
zeros, the cone around an SVM direction, or given arrays."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray

from .._validation import SEED_MAX, as_float_array, check_choice, check_finite_scalar, check_positive_int, check_seed
from ..model import Parameterization

__all__ = ["cone_init", "initial_params", "run_seeds", "INITS"]

INITS: tuple[str, ...] = ("pytorch", "zeros", "gaussian", "cone")


def cone_init(
    center: ArrayLike, *, runs: int = 1, mu: float = 0.1, scale: float = 1.0, seed: int = 0
) -> NDArray[np.float64]:
    """Random W (runs, d, d) inside the cone ``{W : corr(W, W̄) ≥ 1 − μ}`` around ``center`` with ‖W‖_F = scale.

    The cone of a locally optimal direction (docs/spec.md §4, the paper's ``C_{μ,R}(W^α_mm)``): each draw has
    correlation with ``center`` uniform in [1 − μ, 1] and a uniformly random orthogonal component. The
    center's scale does not matter (it is normalised from ``center / max|center|``: any finite nonzero
    matrix works). For d = 1 no direction is orthogonal to the center: every draw is ``scale·center/|center|``.
    """
    C = as_float_array(center, "center", ndim=2)
    if C.shape[0] != C.shape[1]:
        raise ValueError(f"center must be a square (d, d) matrix, got shape {C.shape}")
    cmax = float(np.abs(C).max())
    if cmax == 0:
        raise ValueError("center must be nonzero (it is the SVM direction the cone surrounds)")
    runs = check_positive_int(runs, "runs")
    mu = check_finite_scalar(mu, "mu")
    if not 0 <= mu <= 2:
        raise ValueError(f"mu must be in [0, 2] (correlations lie in [-1, 1]), got {mu}")
    scale = check_finite_scalar(scale, "scale", positive=True)
    rng = np.random.default_rng(check_seed(seed))
    Chat = C / cmax
    Chat /= np.linalg.norm(Chat)
    if C.size == 1:
        return np.full((runs, 1, 1), scale * float(Chat[0, 0]))
    G = rng.standard_normal((runs, *C.shape))
    for _ in range(2):  # Gram–Schmidt twice: orthogonal to round-off even for a draw close to ±center
        G -= np.einsum("rij,ij->r", G, Chat)[:, None, None] * Chat
        G /= np.linalg.norm(G, axis=(1, 2), keepdims=True)
    c = 1.0 - mu * rng.uniform(size=runs)
    return scale * (c[:, None, None] * Chat + np.sqrt(np.maximum(1.0 - c**2, 0.0))[:, None, None] * G)


def run_seeds(seed: int | Sequence[int], R: int) -> NDArray[np.int64]:
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        check_seed(seed)
        if seed > SEED_MAX - R + 1:
            raise ValueError(f"seed must be <= {SEED_MAX - R + 1} for {R} runs (seeds seed..seed+{R - 1}), got {seed}")
        return np.arange(R, dtype=np.int64) + int(seed)
    if isinstance(seed, (str, bytes, bool)) or not isinstance(seed, (Sequence, np.ndarray)):
        raise TypeError(f"seed must be an integer or a sequence of {R} integers, got {type(seed).__name__}")
    try:
        arr = np.asarray(seed)
    except OverflowError:  # (Python integers beyond 64 bits)
        arr = np.asarray(seed, dtype=object)
    if arr.shape != (R,) or not np.issubdtype(arr.dtype, np.integer) or np.any(arr < 0) or np.any(arr > SEED_MAX):
        raise ValueError(f"seed must be an integer or {R} integers in [0, {SEED_MAX}] (one per run), got {arr!r}")
    return arr.astype(np.int64)


def initial_params(
    param: Parameterization,
    init: Any,
    *,
    runs: int,
    seeds: NDArray[np.int64],
    init_scale: float | None = None,
    cone_center: ArrayLike | None = None,
    cone_mu: float = 0.1,
) -> tuple[NDArray[np.float64], ...]:
    """The initial groups of ``param`` (numpy float64, leading axis R = ``runs``); see :func:`attsvm.train`.

    Random draws use one ``torch.Generator`` per run seeded with ``seeds[r]``, so a run does not depend
    on the batch it is in.
    """
    R, d = runs, param.d
    if isinstance(init, str):
        check_choice(init, "init", INITS)
        scale = 1.0 if init_scale is None else check_finite_scalar(init_scale, "init_scale", positive=True)
        if init == "zeros":
            return param.zeros(R)
        if init == "cone":
            if cone_center is None:
                raise ValueError(
                    "init='cone' needs cone_center: the SVM direction W^α_mm (d, d), or one per "
                    "run (R, d, d) (Frobenius for param='W', nuclear W*_mm for param='KQ')"
                )
            Cc = as_float_array(cone_center, "cone_center")
            if Cc.shape not in ((d, d), (R, d, d)):
                raise ValueError(f"cone_center must have shape ({d}, {d}) or ({R}, {d}, {d}), got {Cc.shape}")
            Cs = np.broadcast_to(Cc, (R, d, d))
            mu = check_finite_scalar(cone_mu, "cone_mu")
            W = np.stack([cone_init(Cs[r], mu=mu, scale=scale, seed=int(seeds[r]))[0] for r in range(R)])
            return param.from_W(W)
        draws = [
            param.draw(init, torch.Generator().manual_seed(int(seeds[r])), scale)  # type: ignore[arg-type]
            for r in range(R)
        ]
        return tuple(np.stack(group) for group in zip(*draws))
    if isinstance(init, (tuple, np.ndarray, torch.Tensor, list)):
        return param.from_given(init, R)
    raise TypeError(
        f"init must be one of {', '.join(repr(i) for i in INITS)}, an array W or a tuple (K, Q); "
        f"got {type(init).__name__}"
    )
