"""The registry of reproduced experiments (docs/spec.md §6): CLI name → module defining it."""

from __future__ import annotations

import importlib

from ._base import Experiment

__all__ = ["EXPERIMENTS", "STUDIES", "get_experiment", "experiment_names"]

# CLI name -> module (each module defines EXPERIMENT, an Experiment subclass instance), in docs/spec.md §6 order
EXPERIMENTS: dict[str, str] = {
    "gd-paths": "attsvm.experiments.gd_paths",
    "local-convergence": "attsvm.experiments.local_convergence",
    "overparam": "attsvm.experiments.overparam",
    "svm-rank": "attsvm.experiments.svm_rank",
    "svm-eq": "attsvm.experiments.svm_eq",
    "svm-eq-mlp": "attsvm.experiments.svm_eq_mlp",
    "reg-path": "attsvm.experiments.reg_path",
    "multiclass": "attsvm.experiments.multiclass",
    "nuclear-identity": "attsvm.experiments.nuclear_identity",
    "low-rank": "attsvm.experiments.low_rank",
    "lp-convergence": "attsvm.experiments.lp_convergence",
    "rates": "attsvm.experiments.rates",
    "ntp-convergence": "attsvm.experiments.ntp_convergence",
    "joint-training": "attsvm.experiments.joint_training",
    "hierarchy": "attsvm.experiments.hierarchy",
    "optimizer-bias": "attsvm.experiments.optimizer_bias",
    "phase": "attsvm.experiments.phase",
}


# experiments run by name only, not by `reproduce all`: studies of their own whose full run takes many minutes
STUDIES: frozenset[str] = frozenset({"phase"})


def experiment_names(studies: bool = False) -> list[str]:
    """The experiments of `reproduce all` (with ``studies=True``: every registered experiment)."""
    return [n for n in EXPERIMENTS if studies or n not in STUDIES]


def get_experiment(name: str) -> Experiment:
    """The registered experiment ``name`` (underscores accepted for dashes)."""
    key = str(name).replace("_", "-")
    if key not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; choose one of {', '.join(EXPERIMENTS)} (or 'all')")
    mod = importlib.import_module(EXPERIMENTS[key])
    exp = mod.EXPERIMENT
    assert isinstance(exp, Experiment) and exp.name == key, f"{EXPERIMENTS[key]} must define EXPERIMENT named {key}"
    return exp
