"""Run an experiment into an output folder: resumable sweep, results, figures, report.

Layout of a run folder::

    config.json    everything to rerun it: experiment, settings, fingerprint, versions, command line;
                   written atomically before any trial
    trials/*.parquet  one file per finished trial (atomic, stamped with the run's fingerprint; a rerun
                   skips those that match and ignores the others)
    results.json   headline numbers, each with its claim and pass/fail ("not evaluated" while the
                   run is incomplete)
    figures/*.png, *.pdf   drawn from the saved data only (``attsvm plot DIR``)
    report.md      the paper's claim, the measured numbers and the figures side by side
    .attsvm.lock, .attsvm-owner.json   the writer's lock and the owning command (see ``_folders``)
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import logging
import os
import platform
import sys
import threading
import time
import warnings
from collections.abc import Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._extras import require
from .._folders import FolderLock, RunFolderError, atomic_write, check_output_folder, claim_folder, folder_owner
from .._validation import check_bool
from ._base import Experiment, _jsonable
from ._executor import Executor, SerialExecutor, make_executor
from ._registry import experiment_names, get_experiment
from ._store import TrialStore, check_key

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "reproduce",
    "reproduce_all",
    "plot_run",
    "RunOutput",
    "execute_trial",
    "versions",
    "write_index",
    "fingerprint",
    "code_version",
    "read_config",
    "NOT_EVALUATED",
]

log = logging.getLogger(__name__)

CONFIG = "config.json"
RESULTS = "results.json"
REPORT = "report.md"
NOT_EVALUATED = "not evaluated"


def versions() -> dict[str, str]:
    """Versions of attsvm and of the libraries whose numerics the results depend on."""
    out: dict[str, str] = {"python": platform.python_version(), "platform": platform.platform()}
    import importlib.metadata as md

    for pkg in (
        "attsvm",
        "numpy",
        "scipy",
        "torch",
        "cvxpy",
        "clarabel",
        "scs",
        "pandas",
        "pyarrow",
        "dask",
        "distributed",
        "matplotlib",
    ):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def execute_trial(name: str, settings: dict[str, Any], trial: dict[str, Any]) -> pd.DataFrame:
    """Run one trial of experiment ``name`` (module-level so that process pools and Dask can pickle it).

    torch runs with one intra-op thread: the tensors are tiny, and a fixed thread count keeps
    results bit-identical across executors.
    """
    import torch

    exp = get_experiment(name)
    missing = sorted(set(exp.defaults) - set(settings)) if isinstance(settings, Mapping) else None
    if missing is None or missing:
        raise ValueError(
            f"execute_trial: settings must be the resolved settings of {exp.name!r} "
            f"(Experiment.settings()); missing {missing if missing else type(settings).__name__}"
        )
    if not isinstance(trial, Mapping) or "key" not in trial:
        raise ValueError(f"execute_trial: trial must be one of Experiment.trials(settings), got {trial!r}")
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    # Solver notices (iteration limits, fallbacks) are per-solve: their outcomes are recorded in the
    # trial data (status columns), so during a trial they are silenced below ERROR (warnings → DEBUG).
    svm_log = logging.getLogger("attsvm.svm")
    old_level = svm_log.level
    svm_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            frame = exp.run_trial(settings, trial)
        for w in caught:
            log.debug("%s %s: %s", name, trial.get("key"), w.message)
        return frame
    finally:
        svm_log.setLevel(old_level)
        if prev:
            torch.set_num_threads(prev)


@dataclass
class RunOutput:
    """Where a run wrote its outputs, and its headline numbers."""

    name: str
    out: Path
    results: dict[str, Any]
    figures: list[Path] = field(default_factory=list)
    report: Path | None = None
    n_trials: int = 0
    n_computed: int = 0
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(h["passed"] is not False for h in self.results.get("headlines", []))

    @property
    def complete(self) -> bool:
        """False for a run stopped part-way (its claims are "not evaluated")."""
        return bool(self.results.get("complete", True))


PACKAGE_ROOT = Path(__file__).resolve().parent.parent


@functools.lru_cache(maxsize=4)
def _tree_hash(root: Path) -> str:
    """A hash of the Python sources under ``root`` (read once per process and root)."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def code_version(exp: Experiment) -> str:
    """The version of the code that computes ``exp``'s trials: attsvm's version, a hash of the
    experiment's module source and a hash of the whole package's sources. The solvers and trainers
    the trials call count too: a trial computed before an edit to a solver (whose results may move
    within its certificate's tolerance) is never mixed with trials computed after it."""
    from .. import __version__

    try:
        source = Path(inspect.getfile(type(exp))).read_bytes()
    except (OSError, TypeError):  # pragma: no cover - a class without a source file
        source = type(exp).__qualname__.encode()
    return f"{__version__}+{hashlib.sha256(source).hexdigest()[:12]}+{_tree_hash(PACKAGE_ROOT)}"


def fingerprint(exp: Experiment, settings: dict[str, Any]) -> str:
    """The fingerprint stamped in every trial file of a run: a hash of the experiment's name, its
    resolved settings and :func:`code_version`. A resume uses only the trials that match it."""
    return _fingerprint(exp.name, settings, code_version(exp))


def _fingerprint(name: str, settings: dict[str, Any], code: str) -> str:
    blob = json.dumps({"experiment": name, "settings": _jsonable(settings), "code": code}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def read_config(out: Path) -> dict[str, Any]:
    """The run's ``config.json``: FileNotFoundError when it is missing, RunFolderError naming the file
    when it is corrupt."""
    path = out / CONFIG
    if not out.is_dir():
        raise FileNotFoundError(f"{str(out)!r} is not a run folder (no such folder)")
    if not path.is_file():
        raise FileNotFoundError(f"{str(out)!r} is not a run folder: {CONFIG} is missing")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RunFolderError(f"{str(path)!r} is not valid JSON ({exc}); the run folder is damaged") from None
    if (
        not isinstance(config, dict)
        or not isinstance(config.get("experiment"), str)
        or not isinstance(config.get("settings"), dict)
    ):
        raise RunFolderError(f"{str(path)!r} is not an attsvm run config (needs 'experiment' and 'settings')")
    return config


def _check_config(out: Path, config: dict[str, Any]) -> None:
    """Refuse to resume into a folder that holds a run of another experiment or other settings."""
    if not (out / CONFIG).exists():
        return
    old = read_config(out)
    if old.get("experiment") != config["experiment"]:
        raise RunFolderError(
            f"--out {str(out)!r} holds a run of experiment {old.get('experiment')!r}, "
            f"not {config['experiment']!r}; choose another --out"
        )
    if old.get("settings") != config["settings"]:
        diff = sorted(
            k
            for k in set(old.get("settings", {})) | set(config["settings"])
            if old.get("settings", {}).get(k) != config["settings"].get(k)
        )
        raise RunFolderError(
            f"--out {str(out)!r} holds a run of {config['experiment']} with different settings "
            f"({', '.join(diff)}); resuming would mix them. Choose another --out or delete it"
        )


def _check_layout(out: Path) -> None:
    """Refuse a run folder whose entries have the wrong kind (a file where ``trials/`` or ``figures/``
    belongs, a folder where ``config.json``, ``results.json`` or ``report.md`` belongs), naming it."""
    for entry, folder in (("trials", True), ("figures", True), (CONFIG, False), (RESULTS, False), (REPORT, False)):
        path = out / entry
        if path.exists() and path.is_dir() != folder:
            raise RunFolderError(
                f"{str(path)!r} is a {'file' if folder else 'folder'}, where a run keeps its {entry} "
                f"{'folder' if folder else 'file'}; the run folder is damaged (move {entry!r} away)"
            )


def _as_path(value: Any, name: str) -> Path:
    """A folder argument: a str or os.PathLike (TypeError naming ``name`` otherwise)."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a folder path (str or Path), got {type(value).__name__} {value!r}")
    return Path(value)


def _check_trial_keys(exp: Experiment, trials: list[dict[str, Any]]) -> None:
    """Every trial key names a file, and no two trials share one."""
    keys = [check_key(t["key"]) for t in trials]
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})
        raise ValueError(
            f"{exp.name}: the settings give duplicate trials {dup[:5]} (a repeated value in a list setting?)"
        )


def _run_pending(
    exp: Experiment,
    settings: dict[str, Any],
    trials: list[dict[str, Any]],
    store: TrialStore,
    executor: Executor,
    progress: bool,
) -> int:
    done = store.done()
    _check_trial_keys(exp, trials)
    pending = [t for t in trials if t["key"] not in done]
    if not pending:
        return 0
    from tqdm.auto import tqdm

    bar = tqdm(
        total=len(trials),
        initial=len(trials) - len(pending),
        desc=exp.name,
        unit="trial",
        disable=None if progress else True,
        leave=False,
    )
    n = 0
    try:
        jobs = ((t["key"], (exp.name, settings, t)) for t in pending)
        for key, frame in executor.map_unordered(execute_trial, jobs):
            store.save(key, frame)  # persisted as soon as it completes
            n += 1
            bar.update(1)
    finally:
        bar.close()
    return n


def reproduce(
    name: str,
    *,
    out: str | Path | None = None,
    quick: bool = False,
    runs: int | None = None,
    workers: int = 1,
    scheduler: str | None = None,
    overrides: dict[str, Any] | None = None,
    progress: bool = True,
    command: list[str] | None = None,
    executor: Executor | None = None,
) -> RunOutput:
    """Run (or resume) experiment ``name`` into ``out`` and write results, figures and report.

    ``overrides`` are typed settings (see :func:`attsvm.experiments.apply_overrides` for ``--set``
    strings); ``runs`` overrides the experiment's run count. The folder is locked for the whole run
    (a second writer gets :class:`FolderBusyError`); ``config.json`` is written atomically before any
    trial; rerunning into the same folder skips every persisted trial with the run's fingerprint
    (trials of other settings or code are ignored, with a warning, and recomputed); a folder holding
    other settings, another experiment or another command's results is refused (:class:`RunFolderError`).
    """
    exp = get_experiment(name)
    quick = check_bool(quick, "quick")
    progress = check_bool(progress, "progress")
    if overrides is not None and not isinstance(overrides, Mapping):
        raise TypeError(f"overrides must be a dict of typed settings, got {type(overrides).__name__} {overrides!r}")
    ov = dict(overrides or {})
    if runs is not None:
        if exp.runs_key is None:
            raise ValueError(f"--runs: experiment {exp.name!r} has no run count (use --set)")
        if isinstance(runs, (bool, np.bool_)) or not isinstance(runs, (int, np.integer)) or runs < 1:
            raise ValueError(f"--runs must be a positive integer, got {runs!r}")
        ov[exp.runs_key] = int(runs)
    settings = exp.settings(quick=quick, overrides=ov)
    if isinstance(workers, (bool, np.bool_)) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise ValueError(f"--workers must be a positive integer, got {workers!r}")
    workers = int(workers)
    if scheduler is not None and not isinstance(scheduler, str):
        raise TypeError(f"--scheduler must be an address string (tcp://HOST:PORT or local:N), got {scheduler!r}")
    if command is not None and (isinstance(command, str) or not all(isinstance(c, str) for c in command)):
        raise TypeError(f"command must be a list of strings (the command line), got {command!r}")
    out = check_output_folder(_as_path(out, "--out") if out is not None else Path("results") / exp.name)
    command = list(command) if command is not None else list(sys.argv)
    fp = fingerprint(exp, settings)
    config = {
        "experiment": exp.name,
        "title": exp.title,
        "quick": quick,
        "settings": settings,
        "claims": exp.claims,
        "fingerprint": fp,
        "code_version": code_version(exp),
        "versions": versions(),
        "command": command,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    first = exp.trials(settings)  # before anything is written: settings that trials() refuses leave no folder
    _check_trial_keys(exp, first)
    with FolderLock(out, " ".join(command)[:300]):
        claim_folder(out, "reproduce")
        _check_layout(out)
        _check_config(out, config)
        new_run = not (out / CONFIG).exists()
        atomic_write(out / CONFIG, json.dumps(_jsonable(config), indent=2))  # before any trial
        store = TrialStore(out / "trials", fp, experiment=exp.name)
        store.remove_stale_temp_files()  # we hold the lock: a temp file here is a killed writer's
        _drop_stale_results(out, fp)
        damaged = store.unreadable()
        if damaged:
            log.warning(
                "%s: %d trial file(s) in %s are damaged (they cannot be read): they are recomputed",
                exp.name,
                len(damaged),
                store.root,
            )
        foreign = store.foreign() - damaged
        if foreign:
            log.warning(
                "%s: %d trial file(s) in %s were computed with other settings or code (fingerprint "
                "differs); they are ignored and recomputed",
                exp.name,
                len(foreign),
                store.root,
            )
        t0 = time.perf_counter()
        own = executor is None
        try:
            ex = executor or make_executor(workers, scheduler, temp_dir=out / ".dask-tmp")
        except BaseException:
            if new_run:
                _undo_new_run(out, store)
            raise
        log.info("%s: running on %s", exp.name, ex.description)
        computed = 0
        aborted = True
        try:
            trials = first
            computed += _run_pending(exp, settings, trials, store, ex, progress)
            rounds = 0
            while True:  # follow-up trials decided from finished data (e.g. svm-eq's acceptance rule)
                extra = exp.more_trials(settings, store.load([t["key"] for t in trials]))
                if not extra:
                    break
                trials = trials + extra
                computed += _run_pending(exp, settings, extra, store, ex, progress)
                rounds += 1
                if rounds > 10_000:  # pragma: no cover - a bug in more_trials
                    raise RuntimeError(f"{exp.name}: more_trials never finished")
            aborted = False
        except BaseException:
            if new_run:
                _undo_new_run(out, store)
            raise
        finally:
            closing = None
            if own and aborted:
                ex.close(abort=True)
            elif own and ex.close_in_background:  # (the workers exit while the results are written and drawn)
                closing = _Closing(ex)
                closing.start()
            elif own:
                ex.close()
        try:
            seconds = time.perf_counter() - t0
            data = store.load([t["key"] for t in trials])
            results = _write_results(
                exp,
                settings,
                data,
                out,
                seconds=seconds,
                n_trials=len(trials),
                computed=computed,
                n_done=len(trials),
                fingerprint_of=fp,
            )
            figures = _draw(exp, settings, data, results, out)
            report = write_report(exp, settings, results, figures, out, quick=quick)
        except BaseException:
            if closing is not None:
                closing.join(reraise=False)  # (the error of writing the results is the one to see)
            raise
        if closing is not None:
            closing.join()  # (and re-raises an error of the close)
    return RunOutput(exp.name, out, results, figures, report, len(trials), computed, seconds)


def _undo_new_run(out: Path, store: TrialStore) -> None:
    """A new run that failed before persisting any trial (e.g. a setting refused inside its first trial)
    leaves no ``config.json``: otherwise the folder would hold a run of the refused settings, and the
    corrected command would be refused as "different settings". A run with finished trials is kept."""
    with contextlib.suppress(OSError, ValueError):
        if store.done():
            return
        (out / CONFIG).unlink(missing_ok=True)
        if store.root.is_dir() and not any(store.root.iterdir()):
            store.root.rmdir()


class _Closing(threading.Thread):
    """``executor.close()`` in a thread of its own; :meth:`join` re-raises its error, if any."""

    def __init__(self, executor: Executor) -> None:
        super().__init__(name="attsvm-close-executor")
        self.executor = executor
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.executor.close()
        except BaseException as exc:  # (handed to the caller by join)
            self.error = exc

    def join(self, timeout: float | None = None, *, reraise: bool = True) -> None:
        super().join(timeout)
        if reraise and self.error is not None:
            raise self.error


def _drop_stale_results(out: Path, fp: str) -> None:
    """Remove a ``results.json`` computed from other trials (other settings or code): it is derived
    data, rewritten when this run finishes, and must not be read as this run's result meanwhile."""
    path = out / RESULTS
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        old = None
    if path.exists() and not (isinstance(old, dict) and old.get("fingerprint") == fp):
        path.unlink()


def _write_results(
    exp: Experiment,
    settings: dict[str, Any],
    data: pd.DataFrame,
    out: Path,
    *,
    seconds: float,
    n_trials: int,
    computed: int,
    n_done: int,
    fingerprint_of: str | None = None,
) -> dict[str, Any]:
    """``results.json``. A partial run (``n_done < n_trials``) has its claims marked "not evaluated":
    its numbers are reported (when they can be computed at all) but never judged."""
    complete = n_done >= n_trials
    try:
        headlines, extra = exp.aggregate(settings, data)
        hl = [h.to_dict() for h in headlines]
    except Exception as exc:  # only a partial run may lack what aggregate needs
        if complete:
            raise
        log.warning(
            "%s: the %d finished trial(s) are not enough to compute the headline numbers (%s: %s)",
            exp.name,
            n_done,
            type(exc).__name__,
            exc,
        )
        hl, extra = [], {}
    for h in hl:
        h["verdict"] = {True: "PASS", False: "FAIL", None: "reported"}[h["passed"]] if complete else NOT_EVALUATED
        if not complete:
            h["passed"] = None
    results = {
        "experiment": exp.name,
        "title": exp.title,
        "claims": exp.claims,
        "fingerprint": fingerprint_of,
        "complete": complete,
        "n_trials_done": n_done,
        "headlines": hl,
        "passed": all(h["passed"] is not False for h in hl) if complete else None,
        "not_evaluated": [] if complete else sorted(exp.claims),
        "n_trials": n_trials,
        "n_trials_computed_this_run": computed,
        "seconds_this_run": round(seconds, 3),
        "summary": _jsonable(extra),
    }
    atomic_write(out / RESULTS, json.dumps(_jsonable(results), indent=2))
    return results


# experiments run at once by `reproduce all` on worker processes
OVERLAP_EXPERIMENTS = 2
# pyplot is not thread-safe: experiments that overlap in `reproduce all` draw one at a time
_DRAW_LOCK = threading.Lock()


def _draw(
    exp: Experiment, settings: dict[str, Any], data: pd.DataFrame, results: dict[str, Any], out: Path
) -> list[Path]:
    with _DRAW_LOCK:
        return _draw_locked(exp, settings, data, results, out)


def _draw_locked(
    exp: Experiment, settings: dict[str, Any], data: pd.DataFrame, results: dict[str, Any], out: Path
) -> list[Path]:
    matplotlib = require("matplotlib", feature="drawing the figures of a run")
    matplotlib.use("Agg", force=True)
    plt = require("matplotlib.pyplot", feature="drawing the figures of a run")

    figdir = out / "figures"
    figdir.mkdir(exist_ok=True)
    from .._style import style

    try:
        with style():  # (one style for every figure: attsvm._style)
            return exp.plot(settings, data, results, figdir)
    except Exception as exc:  # a partial run may not have what a figure needs
        if results.get("complete", True):
            raise
        log.warning("%s: figures skipped for this partial run (%s: %s)", exp.name, type(exc).__name__, exc)
        return []
    finally:
        plt.close("all")


def _fmt(v: Any) -> str:
    if v is None:  # (a NaN measurement: results.json stores it as null)
        return "n/a"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_fmt(x)}" for k, x in v.items())
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


SMOKE_TEST = (
    "**Smoke test (`--quick`)**: the settings are shrunk to check that the pipeline runs; the checks below are "
    "not evidence for or against the paper. Run without `--quick` for the paper's settings."
)


def write_report(
    exp: Experiment,
    settings: dict[str, Any],
    results: dict[str, Any],
    figures: list[Path],
    out: Path,
    *,
    quick: bool = False,
) -> Path:
    """``report.md``: the paper's claims, the measured numbers with pass/fail, and the figures; a ``quick`` run's
    report opens with :data:`SMOKE_TEST`."""
    hl = results["headlines"]
    complete = results.get("complete", True)
    failed = [h for h in hl if h["passed"] is False]
    lines = [f"# {exp.name}: {exp.title}", ""]
    if quick:
        lines += [SMOKE_TEST, ""]
    if not complete:
        lines += [
            f"**Incomplete run: {results['n_trials_done']} of {results['n_trials']} trials finished. "
            "The claims are not evaluated;** rerun the command in `config.json` to finish it.",
            "",
        ]
    lines += [f"Reproduces {exp.spec}. {exp.describe()}", "", "## What the paper claims", ""]
    lines += [f"- **{cid}**: {text}" for cid, text in exp.claims.items()]
    lines += [
        "",
        "## What we measured",
        "",
        "| claim | quantity | measured | criterion | verdict |",
        "|---|---|---|---|---|",
    ]
    for h in hl:
        verdict = {True: "PASS", False: "**FAIL**", None: "reported"}[h["passed"]] if complete else NOT_EVALUATED
        cells = [h["claim"], h["name"], _fmt(h["value"]), h["criterion"], verdict]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    lines.append("")
    if not complete:
        lines += [
            f"Claims {', '.join(results.get('not_evaluated', []))}: {NOT_EVALUATED} "
            f"({results['n_trials_done']} of {results['n_trials']} trials).",
            "",
        ]
    elif failed:
        lines += [
            "## Disagreements with the paper",
            "",
            "The following measured numbers do **not** support the paper's claim at these settings "
            "(the settings were not tuned to hide this):",
            "",
        ]
        lines += [
            f"- {h['name']} = {_fmt(h['value'])} (needed {h['criterion']}; claim {h['claim']}: "
            f"{exp.claims.get(h['claim'], '')})"
            for h in failed
        ]
        lines.append("")
    else:
        lines += ["Every headline number agrees with the paper's claim at these settings.", ""]
    notes = results.get("summary", {}).get("notes")
    if notes:
        lines += ["## Notes", ""] + [f"- {x}" for x in notes] + [""]
    pngs = [f for f in figures if f.suffix == ".png"]
    if pngs:
        lines += ["## Figures", ""]
        for f in pngs:
            rel = f.relative_to(out)
            lines += [f"![{f.stem}]({rel.as_posix()})", f"({rel.with_suffix('.pdf').as_posix()} for print)", ""]
    done = f"{results['n_trials_done']} of {results['n_trials']}" if not complete else f"{results['n_trials']}"
    lines += [
        "## Settings",
        "",
        "```json",
        json.dumps(settings, indent=2),
        "```",
        "",
        f"{done} trials; {results['n_trials_computed_this_run']} computed in the last "
        f"invocation ({results['seconds_this_run']:.1f} s). Rerun with the command in `config.json`; "
        "redraw with `attsvm plot DIR`.",
        "",
    ]
    path = out / REPORT
    atomic_write(path, "\n".join(lines))
    return path


def plot_run(directory: str | Path) -> RunOutput:
    """Redraw the figures and report of a run from its saved data (no trial is recomputed).

    A run that was stopped part-way is reported as partial: ``results["complete"]`` is False, the
    report says "k of N trials" and every claim is "not evaluated". Plotting takes the folder's lock
    (a folder that a sweep is writing raises :class:`FolderBusyError`) and never deletes anything.
    """
    out = _as_path(directory, "directory")
    _check_layout(out)
    config = read_config(out)
    try:
        exp = get_experiment(config["experiment"])
    except ValueError as exc:
        raise RunFolderError(f"{str(out / CONFIG)!r}: {exc}") from None
    settings = config["settings"]
    with FolderLock(out, f"attsvm plot {out}"):
        owner = folder_owner(out)
        if owner not in ("reproduce", None):
            raise RunFolderError(f"{str(out)!r} holds the results of `attsvm {owner}`, not a reproduce run")
        try:
            missing = sorted(set(exp.defaults) - set(settings))
            if missing:
                raise ValueError(f"missing setting(s) {missing}")
            exp.settings(overrides=settings)  # (known keys, typed like the defaults, valid)
            trials = exp.trials(settings)
        except (ValueError, TypeError, KeyError) as exc:
            raise RunFolderError(f"{str(out / CONFIG)!r} holds settings this version cannot run ({exc})") from None
        code = config.get("code_version")
        if isinstance(code, str) and _fingerprint(exp.name, settings, code) != config.get("fingerprint"):
            raise RunFolderError(
                f"{str(out / CONFIG)!r}: its settings are not those its trials were computed with (the fingerprint "
                "does not match: edited by hand?); restore the file or rerun `attsvm reproduce`"
            )
        store = TrialStore(out / "trials", config.get("fingerprint"), create=False, experiment=exp.name)
        damaged = sorted(store.unreadable())
        others = store.other_experiments()
        if others:
            first = ", ".join(f"{k} ({v})" for k, v in sorted(others.items())[:5])
            raise RunFolderError(
                f"{str(out / 'trials')!r} holds {len(others)} trial file(s) of another experiment than "
                f"{exp.name!r}: {first}{' ...' if len(others) > 5 else ''}; remove them or rerun `attsvm reproduce`"
            )
        if damaged:
            names = ", ".join(str(store.path(k).name) for k in damaged[:5]) + (" ..." if len(damaged) > 5 else "")
            raise RunFolderError(
                f"{str(out / 'trials')!r} holds {len(damaged)} damaged trial file(s) that cannot be read ({names}): "
                "rerun `attsvm reproduce` on this folder to recompute them"
            )
        done = store.done()
        keys = [t["key"] for t in trials]
        for _ in range(10_000):  # follow-up rounds, as far as the saved data goes
            if not all(k in done for k in keys):
                break
            extra = exp.more_trials(settings, store.load(keys))
            if not extra:
                break
            keys += [t["key"] for t in extra]
        n_done = sum(k in done for k in keys)
        data = store.load([k for k in keys if k in done])
        results = None
        if (out / RESULTS).exists() and n_done == len(keys):
            try:
                results = json.loads((out / RESULTS).read_text())
            except (OSError, ValueError):
                results = None
            if (
                not isinstance(results, dict)
                or results.get("complete") is False
                or "headlines" not in results
                or results.get("fingerprint", config.get("fingerprint")) != config.get("fingerprint")
            ):
                results = None
        if results is None:
            results = _write_results(
                exp,
                settings,
                data,
                out,
                seconds=0.0,
                n_trials=len(keys),
                computed=0,
                n_done=n_done,
                fingerprint_of=config.get("fingerprint"),
            )
        figures = _draw(exp, settings, data, results, out)
        report = write_report(exp, settings, results, figures, out, quick=bool(config.get("quick", False)))
    return RunOutput(exp.name, out, results, figures, report, results.get("n_trials", 0), 0, 0.0)


def reproduce_all(
    *,
    out: str | Path | None = None,
    names: list[str] | None = None,
    runs: int | None = None,
    workers: int = 1,
    scheduler: str | None = None,
    executor: Executor | None = None,
    on_done: Any = None,
    **kwargs: Any,
) -> list[RunOutput]:
    """Run every experiment (each into ``out/NAME``, one shared executor) and write ``out/index.md``
    and ``out/index.json``. ``runs`` applies to the experiments that have a run count; ``on_done(run)``
    is called after each experiment (the CLI prints where its outputs are)."""
    root = check_output_folder(Path(out) if out is not None else Path("results"))
    with FolderLock(root, "attsvm reproduce all"):
        claim_folder(root, "reproduce all")
        return _reproduce_all(root, names, runs, workers, scheduler, executor, on_done, kwargs)


def _reproduce_all(
    root: Path,
    names: list[str] | None,
    runs: int | None,
    workers: int,
    scheduler: str | None,
    executor: Executor | None,
    on_done: Any,
    kwargs: dict[str, Any],
) -> list[RunOutput]:
    for name in names or []:
        get_experiment(name)  # an unknown name fails before anything runs
    order = list(dict.fromkeys(names or experiment_names()))  # (a repeated name runs once)
    ex = executor or make_executor(workers, scheduler, temp_dir=root / ".dask-tmp")
    # With worker processes of our own, two experiments run at once (threads here, trials in the shared
    # pool): the next one's trials fill the workers while one waits for its last trials, its follow-up
    # rounds (svm-eq) or draws its figures. In-process, or on an executor the caller passed in (which
    # this function may not abort on an error or Ctrl-C, nor know to run trials out of process), there
    # is one at a time.
    overlap = OVERLAP_EXPERIMENTS if executor is None and not isinstance(ex, SerialExecutor) else 1
    done: dict[str, RunOutput] = {}

    def run_one(name: str) -> RunOutput:
        exp = get_experiment(name)
        return reproduce(name, out=root / name, executor=ex, runs=runs if exp.runs_key else None, **kwargs)

    def finished(r: RunOutput) -> None:
        done[r.name] = r
        write_index(root, [done[n] for n in order if n in done], quick=bool(kwargs.get("quick", False)))
        if on_done is not None:
            on_done(r)

    aborted = True
    threads = ThreadPoolExecutor(max_workers=overlap, thread_name_prefix="attsvm-experiment") if overlap > 1 else None
    try:
        if threads is None:
            for name in order:
                finished(run_one(name))
        else:
            todo = sorted(order, key=lambda n: -get_experiment(n).cost_hint)  # longest first (stable)
            running: dict[Future[RunOutput], str] = {}
            while todo or running:
                while todo and len(running) < overlap:
                    name = todo.pop(0)
                    running[threads.submit(run_one, name)] = name
                finished_now, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished_now:
                    running.pop(fut)
                    finished(fut.result())  # an error stops everything (finally below)
        aborted = False
    finally:
        if executor is None:
            ex.close(abort=aborted)  # (aborting kills the workers: a running experiment's thread then fails fast)
        if threads is not None:
            threads.shutdown(wait=True, cancel_futures=True)
    return [done[n] for n in order if n in done]


def write_index(root: Path, runs: list[RunOutput], *, quick: bool = False) -> Path:
    """The index report over experiments: verdicts, headline counts, links (a ``quick`` run's opens with
    :data:`SMOKE_TEST`)."""
    lines = [
        "# attsvm: reproduction of Tarzanagh, Li, Thrampoulidis, Oymak (2023)",
        "",
        *([SMOKE_TEST, ""] if quick else []),
        "| experiment | verdict | headlines passed | time (s) | report |",
        "|---|---|---|---|---|",
    ]
    index = []
    for r in runs:
        hl = r.results["headlines"]
        judged = [h for h in hl if h["passed"] is not None]
        ok = sum(h["passed"] is True for h in judged)
        verdict = "agrees" if r.passed else "**disagrees (see report)**"
        rel = r.report.relative_to(root).as_posix() if r.report else ""
        lines.append(f"| {r.name} | {verdict} | {ok}/{len(judged)} | {r.seconds:.1f} | [{rel}]({rel}) |")
        index.append(
            {
                "experiment": r.name,
                "passed": r.passed,
                "headlines_passed": ok,
                "headlines_judged": len(judged),
                "seconds": r.seconds,
                "report": rel,
            }
        )
    lines.append("")
    for r in runs:
        failed = [h for h in r.results["headlines"] if h["passed"] is False]
        for h in failed:
            lines.append(f"- {r.name}: {h['name']} = {_fmt(h['value'])} does not meet {h['criterion']}")
    atomic_write(root / "index.md", "\n".join(lines) + "\n")
    atomic_write(root / "index.json", json.dumps(_jsonable(index), indent=2))
    return root / "index.md"
