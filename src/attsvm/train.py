"""The import path ``attsvm.train``: the names of :mod:`attsvm.training`, for ``from attsvm.train import …``.

The package attribute ``attsvm.train`` is the function :func:`attsvm.training.train` (``attsvm.train(...)``);
this module only keeps the import path, so ``from attsvm.train import train, TrainResult`` works too.
Its names load on first use: ``import attsvm`` imports this module (to keep the attribute a function, see
``attsvm/__init__.py``) without loading torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .training import (
        INITS,
        NORMALIZE_EPS,
        NORMALIZED_LR,
        PROGRESS_MIN_WORK,
        QUANTITIES,
        REG_PATH_MAX_ITER,
        REG_PATH_TOL,
        SADDLE_KICK,
        SMALL_PROBLEM_ELEMENTS,
        FactoredKQ,
        FullW,
        Parameterization,
        Recording,
        RegularizationPath,
        TrainResult,
        cone_init,
        gradient_bound,
        optim,
        parameterization,
        regularization_path,
        regularization_paths,
        smoothness_bound,
        train,
    )

__all__ = [
    "train",
    "TrainResult",
    "Recording",
    "QUANTITIES",
    "optim",
    "Parameterization",
    "FullW",
    "FactoredKQ",
    "parameterization",
    "smoothness_bound",
    "gradient_bound",
    "cone_init",
    "INITS",
    "regularization_path",
    "regularization_paths",
    "RegularizationPath",
    "NORMALIZED_LR",
    "NORMALIZE_EPS",
    "REG_PATH_TOL",
    "REG_PATH_MAX_ITER",
    "SADDLE_KICK",
    "SMALL_PROBLEM_ELEMENTS",
    "PROGRESS_MIN_WORK",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'attsvm.train' has no attribute {name!r}")
    value = getattr(importlib.import_module("attsvm.training"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)
