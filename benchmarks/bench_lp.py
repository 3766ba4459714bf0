"""Speed of the ℓp attention SVM (``AttentionSVM(norm="lp")``) against cvxpy's ``pnorm``, in the same run.

For each size (n, T, d) of the published data recipe (``paper_instance``, seed 0, cross-attention,
optimal tokens) and each p it times

* ours: ``AttentionSVM("lp", p=p).fit`` (the certificate included);
* the published formulation of the mirror-descent analysis (AttentionMD): cvxpy ``pnorm`` with one
  constraint per pair (``formulation="loop"``), and cvxpy's vectorised formulation (``"aux"``), both with
  Clarabel, each in a child process killed at ``--cap`` seconds (modelling included);

and prints the time ratio to the fastest cvxpy formulation, the relative objective difference and the
max constraint violation of every answer (ours must be ≤ 1e-8).

    .venv/bin/python benchmarks/bench_lp.py --quick          # (15,15,20) and (50,20,50), p = 1.75, 3
    .venv/bin/python benchmarks/bench_lp.py --cap 300        # adds (100,20,100)

A full run (no --quick, the default --cap) writes its table to benchmarks/records/ (``--record`` records any
run, ``--no-record`` none; docs/performance.md is generated from the records).

Timings on a shared machine are noisy; the ratios compare runs made back to back.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
from _options import positive_float
from _record import Recorder, add_option, wanted

SIZES = [(15, 15, 20), (50, 20, 50), (100, 20, 100)]
QUICK_SIZES = SIZES[:2]
PS = (1.75, 3.0)


def _instance(n: int, T: int, d: int):
    from attsvm.datasets import paper_instance
    from attsvm.svm import att_svm_constraints

    p = paper_instance(n, T, d, seed=0)
    return att_svm_constraints(p, p.optimal_tokens(ties="first"))


def _cvxpy_child(q, size, p, formulation):  # runs in a child process
    warnings.simplefilter("ignore")
    from attsvm.svm.cvxpy_backend import solve_cvxpy_lp

    cs = _instance(*size)
    t0 = time.perf_counter()
    raw = solve_cvxpy_lp(cs, p, formulation=formulation)
    q.put((time.perf_counter() - t0, str(raw.status), raw.W))


def _cvxpy(size, p, formulation, cap):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    proc = ctx.Process(target=_cvxpy_child, args=(q, size, p, formulation))
    proc.start()
    proc.join(cap)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return None
    return q.get() if not q.empty() else None


def _ours(size, p, repeat=3):
    from attsvm.svm import AttentionSVM

    cs = _instance(*size)
    best = np.inf
    svm = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        svm = AttentionSVM("lp", p=p).fit_constraints(cs)
        best = min(best, time.perf_counter() - t0)
    return best, svm, cs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the two smaller sizes only")
    ap.add_argument("--cap", type=positive_float, default=120.0, help="seconds per cvxpy solve (default 120)")
    add_option(ap, "no --quick, the default --cap")
    args = ap.parse_args()
    rec = Recorder("bench_lp", wanted(args, ap, ("quick", "cap")))
    rows = []
    sizes = QUICK_SIZES if args.quick else SIZES
    cols = f"{'size':>14} {'p':>5} {'ours':>9} {'loop':>9} {'aux':>9}"
    print(f"{cols} {'× fastest':>10} {'rel obj':>9} {'viol':>8} status")
    for size in sizes:
        for p in PS:
            t_ours, svm, cs = _ours(size, p)
            res = {f: _cvxpy(size, p, f, args.cap) for f in ("loop", "aux")}
            times = {f: (r[0] if r is not None else np.inf) for f, r in res.items()}
            fastest = min(times.values())
            ref_W = next((r[2] for r in res.values() if r is not None and r[2] is not None), None)
            rel = np.nan
            if ref_W is not None:
                ref_obj = float(np.sum(np.abs(ref_W) ** p) ** (1 / p))
                rel = abs(svm.objective_ - ref_obj) / ref_obj

            def fmt(t):
                return f">{args.cap:.0f}s" if not np.isfinite(t) else f"{t:.3f}s"

            ratio = fastest / t_ours
            shown = f"{ratio:.0f}×" if np.isfinite(ratio) else f"≥{args.cap / t_ours:.0f}×"
            print(
                f"{size!s:>14} {p:5.2f} {t_ours:8.3f}s {fmt(times['loop']):>9} {fmt(times['aux']):>9} "
                f"{shown:>10} "
                f"{rel:9.1e} {svm.max_violation_:8.1e} {svm.status_}"
            )
            rows.append(
                [str(size), p, f"{t_ours:.3f} s", fmt(times["loop"]), fmt(times["aux"]), shown, f"{rel:.1e}",
                 f"{svm.max_violation_:.1e}", svm.status_]
            )  # fmt: skip
    rec.table(
        "ℓp: ours against cvxpy pnorm",
        ["size", "p", "ours", "cvxpy loop", "cvxpy aux", "× fastest", "rel. obj. diff", "violation", "status"],
        rows,
        [
            "cvxpy with Clarabel, modelling included, each solve in a child process killed at the cap",
            f"cap {args.cap:.0f} s per cvxpy solve; ours: the best of 3 fits, certificate included",
            "× fastest: the fastest cvxpy formulation's time over ours",
        ],
    )
    rec.write()


if __name__ == "__main__":
    main()
