"""Benchmark: our spectral-norm Att-SVM solver against cvxpy (``sigma_max``), in the same run.

For each size (n, T, d) of the published data recipe (docs/spec.md §6, seed 0) it solves ``min ‖W‖₂`` s.t. the
Att-SVM constraints of the optimal tokens with

* ours: :func:`attsvm.svm.spectral.solve_spectral` (Nesterov–Todd interior point on the SDP form in the reduced
  coordinates, K × K Newton systems; certified duality gap);
* cvxpy (``solve_cvxpy(cs, "spectral")``, the auxiliary-variable formulation) with SCS at eps 1e-9 and with
  Clarabel, each under a time cap;

and prints the times, the time ratios (cvxpy / ours, and against the faster cvxpy solver of the size), the
objectives' relative difference, and each answer's constraint violation and relative duality gap as the one
certificate (:mod:`attsvm.svm.certificate`) computes them from (W, λ). Timings on a shared machine are noisy:
compare ratios within one run. Both sides are warmed up on a tiny instance first, and solves under 2 s are
timed best-of-``--repeat``.

    .venv/bin/python benchmarks/bench_spectral.py                    # (6,8,10) (15,15,20) (50,20,50)
    .venv/bin/python benchmarks/bench_spectral.py --sizes 15,15,20 --solvers SCS --no-record

A full run (the default --sizes, --cap, --solvers and --repeat) writes its table to benchmarks/records/
(``--record`` records any run, ``--no-record`` none; docs/performance.md is generated from the records).
"""

from __future__ import annotations

import argparse
import os
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
from _options import REPEAT_BELOW_S, positive_float, positive_int, seed, size_triple, timed
from _record import Recorder, add_option, wanted

from attsvm.datasets import paper_instance
from attsvm.svm import att_svm_constraints, optimality_certificate, solve_cvxpy
from attsvm.svm.cvxpy_backend import SOLVERS
from attsvm.svm.spectral import solve_spectral

DEFAULT_SIZES = ["6,8,10", "15,15,20", "50,20,50"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sizes",
        nargs="*",
        action="extend",
        default=None,
        type=size_triple,
        help="n,T,d triples (the flag may be repeated; default: 6,8,10 15,15,20 50,20,50)",
    )
    ap.add_argument("--cap", type=positive_float, default=900.0, help="time cap per cvxpy solve, seconds")
    ap.add_argument("--seed", type=seed, default=0)
    ap.add_argument("--solvers", default="SCS,CLARABEL", help='cvxpy solvers to time ("": ours only)')
    ap.add_argument(
        "--repeat",
        type=positive_int,
        default=3,
        help=f"best of at least this many runs for solves under {REPEAT_BELOW_S:g} s (both sides)",
    )
    add_option(ap, "the default --sizes, --cap, --solvers and --repeat")
    args = ap.parse_args()
    solvers = [v.upper() for v in args.solvers.split(",") if v]
    unknown = [v for v in solvers if v not in SOLVERS]
    if unknown:
        ap.error(f'--solvers: unknown solver(s) {", ".join(unknown)}; choose from {", ".join(SOLVERS)} (or "")')
    rec = Recorder("bench_spectral", wanted(args, ap, ("sizes", "cap", "solvers", "repeat")))
    args.sizes = args.sizes or DEFAULT_SIZES
    # warm-up outside the timings (imports, cvxpy's canonicalisation caches, BLAS start-up)
    p0 = paper_instance(4, 4, 5, seed=args.seed)
    cs0 = att_svm_constraints(p0, p0.optimal_tokens(ties="first"))
    solve_spectral(cs0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for solver in solvers:
            solve_cvxpy(cs0, "spectral", solver=solver, time_limit=args.cap)
    header = (
        f"{'n,T,d':>10} {'solver':>9} {'time[s]':>9} {'ratio':>7} {'vs best':>8} {'objective':>14} "
        f"{'rel.diff':>9} {'violation':>9} {'rel.gap':>9}  status"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for size in args.sizes:
        n, T, d = (int(v) for v in size.split(","))
        p = paper_instance(n, T, d, seed=args.seed)
        cs = att_svm_constraints(p, p.optimal_tokens(ties="first"))
        t_ours, raw = timed(lambda cs=cs: solve_spectral(cs), args.repeat)
        cert = optimality_certificate(cs, raw.W, raw.dual, "spectral")
        f_ours = cert.objective
        results = [("ours", t_ours, raw, cert)]
        for solver in solvers:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t_ref, ref = timed(
                    lambda cs=cs, solver=solver: solve_cvxpy(cs, "spectral", solver=solver, time_limit=args.cap),
                    args.repeat,
                )
            ref_cert = None if ref.W is None else optimality_certificate(cs, ref.W, ref.dual, "spectral")
            results.append((solver, t_ref, ref, ref_cert))
        done = [t for name, t, r, c in results[1:] if c is not None]
        t_best = min(done) if done else float("nan")
        for name, t, r, c in results:
            ratio = t / t_ours
            vs_best = t_best / t_ours if name == "ours" else float("nan")
            if c is None:
                dashes = " ".join(f"{'—':>{w}}" for w in (14, 9, 9, 9))
                print(f"{size:>10} {name:>9} {t:9.3f} {ratio:7.1f} {'':>8} {dashes}  {r.status}")
                rows.append([size, name, round(t, 3), f"{ratio:.1f}", "", "—", "—", "—", "—", str(r.status)])
                continue
            diff = (c.objective - f_ours) / f_ours
            best = f"{vs_best:.1f}" if name == "ours" and np.isfinite(vs_best) else ""
            print(
                f"{size:>10} {name:>9} {t:9.3f} {ratio:7.1f} {best:>8} {c.objective:14.10f} {diff:9.1e} "
                f"{c.violation:9.1e} {c.relative_gap:9.1e}  {r.status}"
            )
            rows.append(
                [size, name, round(t, 3), f"{ratio:.1f}", best, f"{c.objective:.10f}", f"{diff:.1e}",
                 f"{c.violation:.1e}", f"{c.relative_gap:.1e}", str(r.status)]
            )  # fmt: skip
    rec.table(
        "Spectral: ours against cvxpy",
        ["n,T,d", "solver", "time (s)", "ratio", "vs best", "objective", "rel. diff", "violation", "rel. gap",
         "status"],
        rows,
        [
            "ratio: the solver's time over ours; vs best: the faster cvxpy solver's time over ours",
            "rel. diff: the objective against ours; violation and rel. gap: the certificate of (W, λ)",
            f"cvxpy: sigma_max, the auxiliary-variable formulation, capped at {args.cap:.0f} s; SCS at eps 1e-9",
            f"best of at least {args.repeat} runs for solves under {REPEAT_BELOW_S:g} s; seed {args.seed}",
        ],
    )  # fmt: skip
    rec.write()


if __name__ == "__main__":
    main()
