"""Benchmark: our nuclear-norm Att-SVM* solver against the best cvxpy formulation, in the same run.

For each size (n, T, d) of the published data recipe (docs/spec.md §6, seed 0) it solves Att-SVM* for the
optimal tokens with

* ours: :func:`attsvm.svm.nuclear.solve_nuclear` (augmented Lagrangian on the reduced
  Burer–Monteiro factors + active-set Newton polish, certified duality gap);
* cvxpy with the auxiliary-variable formulation (``solve_cvxpy(..., formulation="aux")``) and SCS,
  then Clarabel, each under a time cap;

and prints the times, the time ratios (cvxpy / ours), the objectives' relative difference and the
constraint violations. Timings on a shared machine are noisy: compare ratios within one run. Both
sides are warmed up on a tiny instance first, and solves under 2 s are timed best-of-``--repeat``
(at least; short ones are repeated until 0.5 s was spent on them).

    .venv/bin/python benchmarks/bench_nuclear.py                 # the five default sizes
    .venv/bin/python benchmarks/bench_nuclear.py --sizes 50,20,50 --cap 120

A full run (the default --sizes, --cap, --solvers and --repeat) writes its table to benchmarks/records/
(``--record`` records any run, ``--no-record`` none; docs/performance.md is generated from the records).
"""

from __future__ import annotations

import argparse
import os
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
from _options import MIN_TOTAL_S, REPEAT_BELOW_S, positive_float, positive_int, seed, size_triple, timed
from _record import Recorder, add_option, wanted

from attsvm.datasets import paper_instance
from attsvm.svm import att_svm_constraints, solve_cvxpy
from attsvm.svm.cvxpy_backend import SOLVERS
from attsvm.svm.nuclear import solve_nuclear

DEFAULT_SIZES = ["6,8,10", "15,15,20", "50,20,50", "100,20,100", "200,32,128"]
# Clarabel's SDP at (100, 20, 100) took > 20 GB of memory on the development machine: only run it
# where n·d is at most this (override with --clarabel-max-nd).
CLARABEL_MAX_ND = 2500


def _nuc(W: np.ndarray) -> float:
    return float(np.linalg.svd(W, compute_uv=False).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sizes",
        nargs="*",
        action="extend",
        default=None,
        type=size_triple,
        help="n,T,d triples (the flag may be repeated; default: 6,8,10 15,15,20 50,20,50 100,20,100 200,32,128)",
    )
    ap.add_argument("--cap", type=positive_float, default=300.0, help="time cap per cvxpy solve, seconds")
    ap.add_argument("--seed", type=seed, default=0)
    ap.add_argument("--solvers", default="SCS,CLARABEL", help='cvxpy solvers to time ("": ours only)')
    ap.add_argument(
        "--clarabel-max-nd",
        type=positive_int,
        default=CLARABEL_MAX_ND,
        help="skip Clarabel when n*d exceeds this (its SDP needs tens of GB beyond)",
    )
    ap.add_argument(
        "--repeat",
        type=positive_int,
        default=3,
        help=f"best of at least this many runs for solves under {REPEAT_BELOW_S:g} s, and of as many as "
        f"fit in {MIN_TOTAL_S:g} s (both sides)",
    )
    add_option(ap, "the default --sizes, --cap, --solvers and --repeat")
    args = ap.parse_args()
    solvers = [v.upper() for v in args.solvers.split(",") if v]  # (--solvers "": ours only)
    unknown = [v for v in solvers if v not in SOLVERS]
    if unknown:
        ap.error(f'--solvers: unknown solver(s) {", ".join(unknown)}; choose from {", ".join(SOLVERS)} (or "")')
    rec = Recorder("bench_nuclear", wanted(args, ap, ("sizes", "cap", "solvers", "repeat")))
    args.sizes = args.sizes or DEFAULT_SIZES
    rows = []
    # warm-up outside the timings: first-call costs (imports, cvxpy's canonicalisation caches, BLAS
    # start-up) would otherwise be charged to whichever solver runs first
    p0 = paper_instance(4, 4, 5, seed=args.seed)
    cs0 = att_svm_constraints(p0, p0.optimal_tokens(ties="first"))
    solve_nuclear(cs0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for solver in solvers:
            solve_cvxpy(cs0, "nuc", solver=solver, time_limit=args.cap)
    header = (
        f"{'n,T,d':>12} {'solver':>10} {'time[s]':>9} {'ratio':>8} {'objective':>16} {'rel.diff':>9} "
        f"{'violation':>9} {'rel.gap':>9}"
    )
    print(header)
    print("-" * len(header))
    for size in args.sizes:
        n, T, d = (int(v) for v in size.split(","))
        p = paper_instance(n, T, d, seed=args.seed)
        cs = att_svm_constraints(p, p.optimal_tokens(ties="first"))
        t_ours, raw = timed(lambda cs=cs: solve_nuclear(cs), args.repeat)
        f_ours = _nuc(raw.W) if raw.W is not None else float("nan")
        print(
            f"{size:>12} {'ours':>10} {t_ours:9.4f} {1.0:8.1f} {f_ours:16.10f} {0.0:9.1e} "
            f"{cs.violation(raw.W):9.1e} {raw.info.get('relative_gap', float('nan')):9.1e}  [{raw.status}]"
        )
        rows.append(
            [size, "ours", round(t_ours, 4), "1.0", f"{f_ours:.10f}", "0", f"{cs.violation(raw.W):.1e}",
             f"{raw.info.get('relative_gap', float('nan')):.1e}", raw.status]
        )  # fmt: skip
        for solver in solvers:
            if solver == "CLARABEL" and n * d > args.clarabel_max_nd:
                print(f"{size:>12} {solver:>10}  skipped (n*d > {args.clarabel_max_nd}: memory)")
                rows.append([size, solver, "—", "—", "—", "—", "—", "—", f"skipped (n·d > {args.clarabel_max_nd})"])
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t_ref, ref = timed(
                    lambda cs=cs, solver=solver: solve_cvxpy(cs, "nuc", solver=solver, time_limit=args.cap), args.repeat
                )
            if ref.W is None:
                print(
                    f"{size:>12} {solver:>10} {t_ref:9.4f} {t_ref / t_ours:8.1f} {'—':>16} {'—':>9} {'—':>9} "
                    f"{'—':>9}  [{ref.status}, cap {args.cap:.0f}s]"
                )
                rows.append(
                    [size, solver, round(t_ref, 4), f"{t_ref / t_ours:.1f}", "—", "—", "—", "—",
                     f"{ref.status}, cap {args.cap:.0f} s"]
                )  # fmt: skip
                continue
            f_ref = _nuc(ref.W)
            print(
                f"{size:>12} {solver:>10} {t_ref:9.4f} {t_ref / t_ours:8.1f} {f_ref:16.10f} "
                f"{(f_ref - f_ours) / f_ours:9.1e} {cs.violation(ref.W):9.1e} {'':>9}  [{ref.status}]"
            )
            rows.append(
                [size, solver, round(t_ref, 4), f"{t_ref / t_ours:.1f}", f"{f_ref:.10f}",
                 f"{(f_ref - f_ours) / f_ours:.1e}", f"{cs.violation(ref.W):.1e}", "", ref.status]
            )  # fmt: skip
    rec.table(
        "Nuclear: ours against cvxpy",
        ["n,T,d", "solver", "time (s)", "ratio", "objective", "rel. diff", "violation", "rel. gap", "status"],
        rows,
        [
            "ratio: the solver's time over ours; rel. diff: its objective against ours",
            f"cvxpy: the auxiliary-variable formulation, capped at {args.cap:.0f} s per solve; SCS at eps 1e-9",
            f"best of at least {args.repeat} runs (and of 0.5 s of runs) for solves under {REPEAT_BELOW_S:g} s",
            f"seed {args.seed}",
        ],
    )
    rec.write()


if __name__ == "__main__":
    main()
