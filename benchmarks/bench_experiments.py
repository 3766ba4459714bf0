"""Time every reproduced experiment at full paper settings (docs/spec.md §6), against the published code.

    .venv/bin/python benchmarks/bench_experiments.py                 # all, in-process
    .venv/bin/python benchmarks/bench_experiments.py --workers 2     # local process pool
    .venv/bin/python benchmarks/bench_experiments.py --only local-convergence svm-rank

Each experiment runs from scratch into a fresh folder (no resume), exactly as ``attsvm reproduce NAME``
does. ``PUBLISHED_SECONDS`` holds the published code's times, measured with its notebooks on the
machine that ran this benchmark (svm-eq extrapolated); compare ratios measured on one machine. The
load average is printed with the timings, which are noisy on a shared machine.

For the experiments whose published code trains one configuration at a time (joint-training, rates,
ntp-convergence, svm-eq-mlp, hierarchy), the same run also times a per-run loop written the published way
(``published_loops.py``: a torch module per run, ``backward()``, ``torch.optim.SGD``) on
``--loop-sample`` runs of each kind, extrapolates it linearly to the experiment's whole training
workload, and prints the ratio to the *whole* experiment (training + SVMs + report).

A full run (no --quick or --only, the default --loop-sample; any --workers) writes its table to
benchmarks/records/ (``--record`` records any run, ``--no-record`` none; docs/performance.md is generated from
the records).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _options import positive_int
from _record import Recorder, add_option, wanted

os.environ.setdefault("OMP_NUM_THREADS", "1")

# seconds, measured with the published notebooks (see the module doc)
PUBLISHED_SECONDS = {"local-convergence": 2.6 * 60, "svm-rank": 5.4 * 60, "svm-eq": 7 * 3600}
TARGET_ALL_SECONDS = 600


def main(argv: list[str] | None = None) -> int:
    from attsvm.experiments import experiment_names, make_executor, reproduce

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="experiments to time (default: all)")
    ap.add_argument("--workers", type=positive_int, default=1)
    ap.add_argument("--scheduler", default=None)
    ap.add_argument("--out", default=None, help="keep the outputs here (default: a temporary folder)")
    ap.add_argument("--quick", action="store_true", help="time the --quick sizes instead")
    ap.add_argument("--loop-sample", type=positive_int, default=4, help="runs of each kind timed in the per-run loops")
    add_option(ap, "no --quick or --only, the default --loop-sample")
    args = ap.parse_args(argv)
    if args.only:  # (underscores accepted for dashes, as attsvm's get_experiment does)
        args.only = [name.replace("_", "-") for name in args.only]
        unknown = [name for name in args.only if name not in experiment_names()]
        if unknown:
            ap.error(f"--only: unknown experiment(s) {', '.join(unknown)}; choose from {', '.join(experiment_names())}")
    if args.scheduler:
        kind, _, count = args.scheduler.partition(":")
        if kind == "local":
            if not (count.isdigit() and int(count) >= 1):
                ap.error(f"--scheduler local:N needs a positive worker count N, got {args.scheduler!r}")
        elif not args.scheduler.rpartition(":")[2].isdigit():
            ap.error(f"--scheduler must be local:N or a Dask scheduler address tcp://HOST:PORT, got {args.scheduler!r}")
    rec = Recorder(
        "bench_experiments",
        wanted(args, ap, ("quick", "only", "loop_sample")),
        argv=None if argv is None else [__file__, *argv],
    )
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch
    from published_loops import LOOPS

    from attsvm.experiments import get_experiment

    names = args.only or experiment_names()
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="attsvm-bench-"))
    ex = make_executor(args.workers, args.scheduler, temp_dir=root / ".dask-tmp")
    rows = []
    total = 0.0
    try:
        for name in names:
            out = root / name
            if out.exists():
                shutil.rmtree(out)
            load0 = os.getloadavg()[0]
            t0 = time.perf_counter()
            run = reproduce(name, out=out, quick=args.quick, executor=ex, progress=False, command=sys.argv)
            dt = time.perf_counter() - t0
            total += dt
            judged = [h for h in run.results["headlines"] if h["passed"] is not None]
            ok = sum(h["passed"] is True for h in judged)
            pub = None if args.quick else PUBLISHED_SECONDS.get(name)  # (measured at the paper's settings)
            if name in LOOPS:  # a per-run loop written the published way, timed now on a sample
                threads = torch.get_num_threads()
                torch.set_num_threads(1)
                try:
                    sec, part, whole = LOOPS[name](get_experiment(name).settings(quick=args.quick), args.loop_sample)
                finally:
                    torch.set_num_threads(threads)
                pub = sec * whole / part
                print(f"  {name}: per-run loop {sec:.1f} s for {part}/{whole} of the work -> {pub:.0f} s", flush=True)
            ratio = f"{pub / dt:8.1f}x" if pub else "       -"
            rows.append((name, dt, run.n_trials, ok, len(judged), ratio, load0))
            print(
                f"{name:18s} {dt:8.1f} s  trials {run.n_trials:4d}  claims {ok}/{len(judged)}  "
                f"speed-up vs published {ratio}  (load {load0:.1f})",
                flush=True,
            )
    finally:
        ex.close()
    print(f"\n{'experiment':18s} {'seconds':>9s} {'trials':>7s} {'claims':>7s} {'vs published':>13s}")
    for name, dt, nt, ok, nj, ratio, _ in rows:
        print(f"{name:18s} {dt:9.1f} {nt:7d} {ok:>3d}/{nj:<3d} {ratio:>13s}")
    print(
        f"{'total':18s} {total:9.1f}   (target for `attsvm reproduce all`: < {TARGET_ALL_SECONDS} s; "
        f"executor: {ex.description}; outputs in {root})"
    )
    table = [
        [name, round(dt, 1), nt, f"{ok}/{nj}", ratio.strip(), round(load, 1)]
        for name, dt, nt, ok, nj, ratio, load in rows
    ]
    rec.table(
        "Every experiment at " + ("--quick settings" if args.quick else "the paper's settings"),
        ["experiment", "seconds", "trials", "claims", "vs published", "load at start"],
        [*table, ["total", round(total, 1), "", "", "", ""]],
        [
            f"executor: {ex.description}",
            "each experiment from scratch into a fresh folder, as `attsvm reproduce NAME` does",
            "vs published: the published code's time over ours; for the experiments with a per-run loop, "
            f"that loop timed on {args.loop_sample} runs of each kind and extrapolated",
        ],
    )
    rec.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
