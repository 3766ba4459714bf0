"""attsvm — Transformers as Support Vector Machines (Tarzanagh, Li, Thrampoulidis, Oymak, 2023).

Solve the attention SVMs with certificates, train one-layer attention and watch it converge to
them, reproduce the paper's figures, and carry the ideas to real pretrained transformers.

The public API is listed in ``__all__``; names load lazily so that ``import attsvm`` does not pull
torch until a torch-backed name is used.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it (private modules, curated re-exports)
_EXPORTS: dict[str, str] = {
    # problem and data (docs/spec.md §1–2)
    "AttentionProblem": "attsvm.problem",
    "Head": "attsvm.problem",
    "TieError": "attsvm.problem",
    "datasets": "attsvm.datasets",
    # tokens (docs/spec.md §2)
    "pair_differences": "attsvm.tokens",
    "margins": "attsvm.tokens",
    "support_tokens": "attsvm.tokens",
    "selected_tokens": "attsvm.tokens",
    "LocalOptimalityReport": "attsvm.tokens",
    # solvers (docs/spec.md §3, §5)
    "AttentionSVM": "attsvm.svm",
    "InfeasibleSVMError": "attsvm.svm",
    "MissingExtraError": "attsvm._extras",
    "feasible": "attsvm.svm",
    "FeasibilityReport": "attsvm.svm",
    "locally_optimal": "attsvm.svm",
    "ConstraintSet": "attsvm.svm",
    "att_svm_constraints": "attsvm.svm",
    "feasible_constraints": "attsvm.svm",
    "selected_sets": "attsvm.svm",
    "svm_eq": "attsvm.svm",
    "w_fin": "attsvm.svm",
    "decomposition": "attsvm.svm",
    "optimal_mixture": "attsvm.svm",
    "balanced_factors": "attsvm.svm",
    # metrics (docs/spec.md §4, §7)
    "correlation": "attsvm.metrics",
    "singular_values": "attsvm.metrics",
    "matrix_rank": "attsvm.metrics",
    "effective_rank": "attsvm.metrics",
    "nuc_fro_ratio": "attsvm.metrics",
    # training (docs/spec.md §4)
    "AttentionModel": "attsvm.model",
    "train": "attsvm.training",
    "TrainResult": "attsvm.training",
    "Recording": "attsvm.training",
    "regularization_path": "attsvm.training",
    "regularization_paths": "attsvm.training",
    "RegularizationPath": "attsvm.training",
    "cone_init": "attsvm.training",
    "smoothness_bound": "attsvm.training",
    "Batch": "attsvm.model",
    "training": "attsvm.training",
    # diagnostics (docs/spec.md §4–5)
    "convergence_type": "attsvm.diagnostics",
    "convergence_types": "attsvm.diagnostics",
    "correlation_trajectories": "attsvm.diagnostics",
    "svm_equivalence": "attsvm.diagnostics",
    "mixture_prediction": "attsvm.diagnostics",
    "ConvergenceReport": "attsvm.diagnostics",
    "EquivalenceReport": "attsvm.diagnostics",
    "MixturePrediction": "attsvm.diagnostics",
    # reproductions (docs/spec.md §6)
    "experiments": "attsvm.experiments",
    "reproduce": "attsvm.experiments",
    "reproduce_all": "attsvm.experiments",
    "plot_run": "attsvm.experiments",
    # real transformers (docs/spec.md §7)
    "analysis": "attsvm.analysis",
    "EvictionCache": "attsvm.analysis.kv_cache",
    "make_policy": "attsvm.analysis.kv_cache",
}

__all__ = [*sorted(_EXPORTS), "__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'attsvm' has no attribute {name!r}")
    mod = importlib.import_module(module)
    value = mod if module.endswith("." + name) else getattr(mod, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


# `attsvm.train` is the function, and `attsvm/train.py` keeps the import path `from attsvm.train import …`.
# Importing a submodule binds it to the package attribute of its name, but only on its first import;
# importing it here, first, and releasing the name leaves `attsvm.train` to `__getattr__` (the function)
# whatever is imported later. The submodule is lazy: this loads no torch.
importlib.import_module("attsvm.train")
globals().pop("train", None)
