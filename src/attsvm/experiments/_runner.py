"""Run an experiment into an output folder: resumable sweep, results, figures, report.

Layout of a run folder::

    config.json    everything to rerun it: experiment, settings, versions, command line
    trials/*.parquet  one file per finished trial (atomic; a rerun skips them)
    results.json   headline numbers, each with its claim and pass/fail
    figures/*.png, *.pdf   drawn from the saved data only (``attsvm plot DIR``)
    report.md      the paper's claim, the measured numbers and the figures side by side
"""

from __future__ import annotations

import json
import logging
import os
import platform
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ._base import Experiment, _jsonable
from ._executor import Executor, make_executor
from ._registry import experiment_names, get_experiment
from ._store import TrialStore, check_key

__all__ = ["reproduce", "reproduce_all", "plot_run", "RunOutput", "execute_trial", "versions", "write_index"]

log = logging.getLogger(__name__)

CONFIG = "config.json"
RESULTS = "results.json"
REPORT = "report.md"


def versions() -> dict[str, str]:
    """Versions of attsvm and of the libraries whose numerics the results depend on."""
    out: dict[str, str] = {"python": platform.python_version(), "platform": platform.platform()}
    import importlib.metadata as md

    for pkg in ("attsvm", "numpy", "scipy", "torch", "cvxpy", "clarabel", "scs", "pandas", "pyarrow",
                "dask", "distributed", "matplotlib"):
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
    try:
        import torch

        prev = torch.get_num_threads()
        torch.set_num_threads(1)
    except ImportError:  # pragma: no cover
        torch, prev = None, 0
    # Solver notices (iteration limits, fallbacks) are per-solve: their outcomes are recorded in the
    # trial data (status columns), so during a trial they are silenced below ERROR (warnings → DEBUG).
    svm_log = logging.getLogger("attsvm.svm")
    old_level = svm_log.level
    svm_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            frame = get_experiment(name).run_trial(settings, trial)
        for w in caught:
            log.debug("%s %s: %s", name, trial.get("key"), w.message)
        return frame
    finally:
        svm_log.setLevel(old_level)
        if torch is not None and prev:
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


def _check_config(out: Path, config: dict[str, Any]) -> None:
    """Refuse to resume into a folder that holds a run of another experiment or other settings."""
    path = out / CONFIG
    if not path.exists():
        return
    old = json.loads(path.read_text())
    if old.get("experiment") != config["experiment"]:
        raise ValueError(f"--out {str(out)!r} holds a run of experiment {old.get('experiment')!r}, "
                         f"not {config['experiment']!r}; choose another --out")
    if old.get("settings") != config["settings"]:
        diff = sorted(k for k in set(old.get("settings", {})) | set(config["settings"])
                      if old.get("settings", {}).get(k) != config["settings"].get(k))
        raise ValueError(f"--out {str(out)!r} holds a run of {config['experiment']} with different settings "
                         f"({', '.join(diff)}); resuming would mix them. Choose another --out or delete it")


def _run_pending(exp: Experiment, settings: dict[str, Any], trials: list[dict[str, Any]], store: TrialStore,
                 executor: Executor, progress: bool) -> int:
    done = store.done()
    keys = [check_key(t["key"]) for t in trials]
    if len(set(keys)) != len(keys):
        raise AssertionError(f"{exp.name}: duplicate trial keys")
    pending = [t for t in trials if t["key"] not in done]
    if not pending:
        return 0
    from tqdm.auto import tqdm

    bar = tqdm(total=len(trials), initial=len(trials) - len(pending), desc=exp.name, unit="trial",
               disable=None if progress else True, leave=False)
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


def reproduce(name: str, *, out: str | Path | None = None, quick: bool = False, runs: int | None = None,
              workers: int = 1, scheduler: str | None = None, overrides: dict[str, Any] | None = None,
              progress: bool = True, command: list[str] | None = None,
              executor: Executor | None = None) -> RunOutput:
    """Run (or resume) experiment ``name`` into ``out`` and write results, figures and report.

    ``overrides`` are typed settings (see :func:`attsvm.experiments.apply_overrides` for ``--set``
    strings); ``runs`` overrides the experiment's run count. Rerunning into the same folder skips
    every persisted trial; a folder holding other settings is refused.
    """
    exp = get_experiment(name)
    ov = dict(overrides or {})
    if runs is not None:
        if exp.runs_key is None:
            raise ValueError(f"--runs: experiment {exp.name!r} has no run count (use --set)")
        if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
            raise ValueError(f"--runs must be a positive integer, got {runs!r}")
        ov[exp.runs_key] = runs
    settings = exp.settings(quick=quick, overrides=ov)
    out = Path(out) if out is not None else Path("results") / exp.name
    out.mkdir(parents=True, exist_ok=True)
    config = {"experiment": exp.name, "title": exp.title, "quick": quick, "settings": settings,
              "claims": exp.claims, "versions": versions(),
              "command": command if command is not None else list(sys.argv),
              "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _check_config(out, config)
    if not (out / CONFIG).exists():
        _atomic_write(out / CONFIG, json.dumps(_jsonable(config), indent=2))
    store = TrialStore(out / "trials")
    t0 = time.perf_counter()
    own = executor is None
    ex = executor or make_executor(workers, scheduler, temp_dir=out / ".dask-tmp")
    log.info("%s: running on %s", exp.name, ex.description)
    computed = 0
    try:
        trials = exp.trials(settings)
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
    finally:
        if own:
            ex.close()
    seconds = time.perf_counter() - t0
    data = store.load([t["key"] for t in trials])
    results = _write_results(exp, settings, data, out, seconds=seconds, n_trials=len(trials), computed=computed)
    figures = _draw(exp, settings, data, results, out)
    report = write_report(exp, settings, results, figures, out)
    return RunOutput(exp.name, out, results, figures, report, len(trials), computed, seconds)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _write_results(exp: Experiment, settings: dict[str, Any], data: pd.DataFrame, out: Path, *,
                   seconds: float, n_trials: int, computed: int) -> dict[str, Any]:
    headlines, extra = exp.aggregate(settings, data)
    results = {"experiment": exp.name, "title": exp.title, "claims": exp.claims,
               "headlines": [h.to_dict() for h in headlines],
               "passed": all(h.passed is not False for h in headlines),
               "n_trials": n_trials, "n_trials_computed_this_run": computed,
               "seconds_this_run": round(seconds, 3), "summary": _jsonable(extra)}
    _atomic_write(out / RESULTS, json.dumps(results, indent=2))
    return results


def _draw(exp: Experiment, settings: dict[str, Any], data: pd.DataFrame, results: dict[str, Any],
          out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    figdir = out / "figures"
    figdir.mkdir(exist_ok=True)
    try:
        return exp.plot(settings, data, results, figdir)
    finally:
        plt.close("all")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_fmt(x)}" for k, x in v.items())
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def write_report(exp: Experiment, settings: dict[str, Any], results: dict[str, Any], figures: list[Path],
                 out: Path) -> Path:
    """``report.md``: the paper's claims, the measured numbers with pass/fail, and the figures."""
    hl = results["headlines"]
    failed = [h for h in hl if h["passed"] is False]
    lines = [f"# {exp.name}: {exp.title}", "",
             f"Reproduces {exp.spec}. {exp.describe()}", "", "## What the paper claims", ""]
    lines += [f"- **{cid}**: {text}" for cid, text in exp.claims.items()]
    lines += ["", "## What we measured", "", "| claim | quantity | measured | criterion | verdict |",
              "|---|---|---|---|---|"]
    for h in hl:
        verdict = {True: "PASS", False: "**FAIL**", None: "reported"}[h["passed"]]
        cells = [h["claim"], h["name"], _fmt(h["value"]), h["criterion"], verdict]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    lines.append("")
    if failed:
        lines += ["## Disagreements with the paper", "",
                  "The following measured numbers do **not** support the paper's claim at these settings "
                  "(the settings were not tuned to hide this):", ""]
        lines += [f"- {h['name']} = {_fmt(h['value'])} (needed {h['criterion']}; claim {h['claim']}: "
                  f"{exp.claims.get(h['claim'], '')})" for h in failed]
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
    lines += ["## Settings", "", "```json", json.dumps(settings, indent=2), "```", "",
              f"{results['n_trials']} trials; {results['n_trials_computed_this_run']} computed in the last "
              f"invocation ({results['seconds_this_run']:.1f} s). Rerun with the command in `config.json`; "
              "redraw with `attsvm plot DIR`.", ""]
    path = out / REPORT
    _atomic_write(path, "\n".join(lines))
    return path


def plot_run(directory: str | Path) -> RunOutput:
    """Redraw the figures and report of a finished run from its saved data (no trial is recomputed)."""
    out = Path(directory)
    cfg_path = out / CONFIG
    if not cfg_path.exists():
        raise FileNotFoundError(f"{str(out)!r} is not a run folder: {CONFIG} is missing")
    config = json.loads(cfg_path.read_text())
    exp = get_experiment(config["experiment"])
    settings = config["settings"]
    store = TrialStore(out / "trials")
    data = store.load()
    if (out / RESULTS).exists():
        results = json.loads((out / RESULTS).read_text())
    else:
        results = _write_results(exp, settings, data, out, seconds=0.0, n_trials=len(store.done()), computed=0)
    figures = _draw(exp, settings, data, results, out)
    report = write_report(exp, settings, results, figures, out)
    return RunOutput(exp.name, out, results, figures, report, results.get("n_trials", 0), 0, 0.0)


def reproduce_all(*, out: str | Path | None = None, names: list[str] | None = None, runs: int | None = None,
                  workers: int = 1, scheduler: str | None = None, executor: Executor | None = None,
                  on_done: Any = None, **kwargs: Any) -> list[RunOutput]:
    """Run every experiment (each into ``out/NAME``, one shared executor) and write ``out/index.md``
    and ``out/index.json``. ``runs`` applies to the experiments that have a run count; ``on_done(run)``
    is called after each experiment (the CLI prints where its outputs are)."""
    root = Path(out) if out is not None else Path("results")
    root.mkdir(parents=True, exist_ok=True)
    runs_out: list[RunOutput] = []
    ex = executor or make_executor(workers, scheduler, temp_dir=root / ".dask-tmp")
    try:
        for name in names or experiment_names():
            exp = get_experiment(name)
            r = reproduce(name, out=root / name, executor=ex, runs=runs if exp.runs_key else None, **kwargs)
            runs_out.append(r)
            write_index(root, runs_out)
            if on_done is not None:
                on_done(r)
    finally:
        if executor is None:
            ex.close()
    return runs_out


def write_index(root: Path, runs: list[RunOutput]) -> Path:
    """The index report over experiments: verdicts, headline counts, links."""
    lines = ["# attsvm: reproduction of Tarzanagh, Li, Thrampoulidis, Oymak (2023)", "",
             "| experiment | verdict | headlines passed | time (s) | report |", "|---|---|---|---|---|"]
    index = []
    for r in runs:
        hl = r.results["headlines"]
        judged = [h for h in hl if h["passed"] is not None]
        ok = sum(h["passed"] is True for h in judged)
        verdict = "agrees" if r.passed else "**disagrees (see report)**"
        rel = r.report.relative_to(root).as_posix() if r.report else ""
        lines.append(f"| {r.name} | {verdict} | {ok}/{len(judged)} | {r.seconds:.1f} | [{rel}]({rel}) |")
        index.append({"experiment": r.name, "passed": r.passed, "headlines_passed": ok,
                      "headlines_judged": len(judged), "seconds": r.seconds, "report": rel})
    lines.append("")
    for r in runs:
        failed = [h for h in r.results["headlines"] if h["passed"] is False]
        for h in failed:
            lines.append(f"- {r.name}: {h['name']} = {_fmt(h['value'])} does not meet {h['criterion']}")
    _atomic_write(root / "index.md", "\n".join(lines) + "\n")
    _atomic_write(root / "index.json", json.dumps(_jsonable(index), indent=2))
    return root / "index.md"
