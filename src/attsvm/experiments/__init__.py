"""Reproductions of the paper's experiments (docs/spec.md §6): a registry, a resumable sweep runner on a
local pool or Dask, and per-run results, figures and reports.

>>> from attsvm.experiments import reproduce
>>> run = reproduce("local-convergence", quick=True, out="results/lc")   # doctest: +SKIP
>>> run.results["passed"], run.report                                      # doctest: +SKIP
"""

from __future__ import annotations

from .._extras import require

require("pandas", feature="attsvm.experiments")  # the trial data are DataFrames: name the extra up front

from .._folders import FolderBusyError, FolderLock, RunFolderError
from ._base import Experiment, Headline, apply_overrides, headline, parse_overrides
from ._executor import DaskExecutor, Executor, PoolExecutor, SerialExecutor, make_executor
from ._registry import EXPERIMENTS, STUDIES, experiment_names, get_experiment
from ._runner import RunOutput, execute_trial, fingerprint, plot_run, reproduce, reproduce_all, versions
from ._store import TrialStore

__all__ = [
    "Experiment",
    "Headline",
    "headline",
    "apply_overrides",
    "parse_overrides",
    "Executor",
    "SerialExecutor",
    "PoolExecutor",
    "DaskExecutor",
    "make_executor",
    "EXPERIMENTS",
    "experiment_names",
    "STUDIES",
    "get_experiment",
    "RunOutput",
    "execute_trial",
    "plot_run",
    "reproduce",
    "reproduce_all",
    "versions",
    "TrialStore",
    "fingerprint",
    "RunFolderError",
    "FolderBusyError",
    "FolderLock",
]
