"""Training one-layer attention, batched over runs (docs/spec.md §4).

* :func:`train` and its :class:`TrainResult`; the parts it is built from: the parameterisation
  (:class:`~attsvm.model.FullW`, :class:`~attsvm.model.FactoredKQ`), the update rule (:mod:`.optim`)
  and the recording options (:class:`Recording`);
* :func:`smoothness_bound`, :func:`gradient_bound`: data-dependent step-size bounds;
* :func:`cone_init`: initialisations in the cone around an SVM direction;
* :func:`regularization_path`: ``min L(W) s.t. ‖W‖_F ≤ R`` along growing radii (:func:`regularization_paths`:
  many problems at once).

``attsvm.train`` is the function :func:`train`; the module path ``attsvm.train`` re-exports this
package's names for ``from attsvm.train import TrainResult``.
"""

from __future__ import annotations

from ..model import FactoredKQ, FullW, Parameterization, parameterization
from . import optim
from .bounds import gradient_bound, smoothness_bound
from .init import INITS, cone_init
from .loop import PROGRESS_MIN_WORK, SMALL_PROBLEM_ELEMENTS, TrainResult, train
from .optim import NORMALIZE_EPS, NORMALIZED_LR
from .path import (
    REG_PATH_MAX_ITER,
    REG_PATH_TOL,
    SADDLE_KICK,
    RegularizationPath,
    regularization_path,
    regularization_paths,
)
from .recording import QUANTITIES, Recording

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
