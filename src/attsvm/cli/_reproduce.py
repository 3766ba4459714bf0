"""``attsvm reproduce NAME|all``: run an experiment of docs/spec.md §6 and write results, figures, report."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attsvm.experiments import RunOutput

# `--workers auto` never starts more processes than this (each holds its own torch)
MAX_AUTO_WORKERS = 8

# `--scheduler`: local:N, or the address of a running Dask scheduler, [PROTOCOL://]HOST:PORT
SCHEDULER_FORMS = "local:N (N >= 1) or a Dask scheduler address [tcp|tls|ws|wss|ucx://]HOST:PORT"
_ADDRESS = re.compile(r"^(?:(?:tcp|tls|ws|wss|ucx)://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})$")

HELP = "reproduce a paper experiment (or 'all'): results.json, figures, report.md; resumable"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="experiment name (see `attsvm list`) or 'all'")
    parser.add_argument("--quick", action="store_true", help="a small CI-sized run")
    parser.add_argument("--runs", type=int, default=None, help="override the number of runs")
    parser.add_argument(
        "--out",
        default=None,
        help="output folder (default results/NAME; rerun to resume). One writer at a time: a "
        "second run on the same folder exits 5; a folder of other settings or another "
        "command exits 3",
    )
    parser.add_argument(
        "--workers",
        default=None,
        help="local worker processes; 1 runs in-process; 'auto' (default): one per usable core, at most "
        f"{MAX_AUTO_WORKERS}, for full runs, in-process for --quick. Not combinable with --scheduler",
    )
    parser.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDR|local:N",
        help="run the trials on Dask: a running scheduler at [tcp://]HOST:PORT, or local:N for a loopback "
        "LocalCluster of N workers (which replace --workers); `phase` runs on a LocalCluster of one worker per "
        "usable core unless told otherwise",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a setting, typed like its default (an int setting refuses 1.7); counts "
        "are >= 1 (seeds >= 0, T >= 2), lr and thresholds > 0, lists non-empty without repeats, and each "
        "experiment's own rules (the error names the setting); all are checked before anything is written; "
        "repeatable",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from attsvm.experiments import apply_overrides, get_experiment, parse_overrides, reproduce, reproduce_all

    from ._errors import EXIT_DISAGREES, EXIT_OK, UsageError

    if args.scheduler is not None:
        check_scheduler(args.scheduler)
        if args.workers is not None:
            hint = (
                f"use --scheduler local:{args.workers} for {args.workers} local Dask workers, or drop --scheduler"
                if str(args.workers).isdigit() and int(args.workers) >= 1
                else "drop --workers, or use --scheduler local:N for N local Dask workers"
            )
            raise UsageError(f"--workers cannot be combined with --scheduler: the Dask workers run the trials ({hint})")
    raw = parse_overrides(args.overrides)
    common = dict(
        quick=args.quick,
        runs=args.runs,
        workers=workers("auto" if args.workers is None else args.workers, quick=args.quick),
        scheduler=args.scheduler,
        progress=not args.no_progress,
        command=["attsvm", *sys.argv[1:]],
    )
    if args.name == "all":
        if raw:
            raise ValueError("--set cannot be combined with 'all' (settings differ per experiment)")
        root = Path(args.out or "results")
        with _dask_logging(args):
            outs = reproduce_all(out=root, **common, on_done=lambda r: _say(r, quick=args.quick))
        print(f"index:   {root / 'index.md'}")
        return EXIT_OK if all(r.passed for r in outs) else EXIT_DISAGREES
    exp = get_experiment(args.name)
    overrides = apply_overrides(exp.settings(quick=args.quick), raw)
    if exp.dask_default and args.scheduler is None and args.workers is None and not args.quick:
        args.scheduler = f"local:{workers('auto', quick=False)}"  # (its own default: a Dask LocalCluster)
        common.update(scheduler=args.scheduler, workers=1)
    with _dask_logging(args):
        r = reproduce(exp.name, out=args.out, overrides=overrides, **common)
    _say(r, quick=args.quick)
    return EXIT_OK if r.passed else EXIT_DISAGREES


def check_scheduler(value: str) -> str:
    """``--scheduler``'s value, checked for its form before anything connects (a usage error otherwise)."""
    from ._errors import UsageError

    if value.startswith("local:"):
        n = value.split(":", 1)[1]
        if not (n.isdigit() and int(n) >= 1):
            raise UsageError(f"--scheduler local:N needs a positive worker count N, got {value!r}")
        return value
    m = _ADDRESS.match(value)
    if m is None or not 1 <= int(m.group(2)) <= 65535:
        raise UsageError(f"--scheduler must be {SCHEDULER_FORMS}, got {value!r}")
    return value


@contextlib.contextmanager
def _dask_logging(args: argparse.Namespace) -> Iterator[None]:
    """Dask's own logging at the command's verbosity: ``distributed`` logs at INFO by default, in this
    process and in every worker it starts (about 40 lines a run); ``-v`` shows them again."""
    if args.scheduler is None or getattr(args, "verbose", 0) >= 1:
        yield
        return
    with contextlib.suppress(ImportError):
        import distributed  # noqa: F401  (its import sets the level of its loggers: save it after)
    logger = logging.getLogger("distributed")
    level = logger.level
    logger.setLevel(logging.WARNING)
    key, before = "DASK_LOGGING__DISTRIBUTED", os.environ.get("DASK_LOGGING__DISTRIBUTED")
    os.environ[key] = "warning"  # read by dask.config on import in the worker processes
    try:
        yield
    finally:
        logger.setLevel(level)
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def usable_cores() -> int:
    """The CPUs this process may use: its affinity mask, capped by a cgroup v2 CPU quota (a container
    limited to 2 CPUs on a large host reports the host's cores otherwise)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cores


def workers(value: str | int, *, quick: bool) -> int:
    """The worker count of ``--workers``: a positive integer, or ``auto`` (the usable cores, at most
    :data:`MAX_AUTO_WORKERS`; 1 for ``--quick`` runs, whose trials are too small to pay for processes)."""
    if value == "auto":
        if quick:
            return 1
        return max(1, min(usable_cores(), MAX_AUTO_WORKERS))
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if n < 1 or str(value).strip() != str(n):
        raise ValueError(f"--workers must be a positive integer or 'auto', got {value!r}")
    return n


def _say(r: RunOutput, *, quick: bool = False) -> None:
    hl = r.results["headlines"]
    judged = [h for h in hl if h["passed"] is not None]
    ok = sum(h["passed"] is True for h in judged)
    if quick:  # (shrunk settings: the checks show the pipeline runs, not whether the paper holds)
        verdict = "smoke test: reduced settings, not evidence"
    else:
        verdict = "agrees with the paper" if r.passed else "DISAGREES with the paper on some claims (see report)"
    print(
        f"{r.name}: {ok}/{len(judged)} headline checks pass — {verdict}; "
        f"{r.n_computed}/{r.n_trials} trials computed in {r.seconds:.1f} s"
    )
    for f in r.figures:
        if f.suffix == ".png":
            print(f"  figure:  {f}")
    print(f"  report:  {r.report}")
    print(f"  results: {r.out / 'results.json'}")
