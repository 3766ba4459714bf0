"""Speed of our attention-SVM solvers against cvxpy, measured in the same run.

For each size (n, T, d) of the published data recipe (``paper_instance``, seed 0, cross-attention,
optimal tokens) it times

* Frobenius: ours (``AttentionSVM("fro")``, certificate included) vs cvxpy with the published
  one-constraint-per-pair loop formulation and the vectorised auxiliary-variable one (Clarabel);
* nuclear: ours (``AttentionSVM("nuc")``) vs cvxpy's vectorised formulation with SCS and Clarabel;

each cvxpy solve in a child process killed at ``--cap`` seconds (wall clock, modelling included),
and prints time ratios, objective agreement and the max constraint violation of every answer. Then
it solves the large case n·T = 100,000 at d = 256 with our Frobenius solver alone (a child process,
so its peak resident memory is its own).

    .venv/bin/python benchmarks/bench_svm.py                    # the full tables (recorded)
    .venv/bin/python benchmarks/bench_svm.py --quick            # small sizes, 20 s cap
    .venv/bin/python benchmarks/bench_svm.py --quick --sizes 6,8,10 15,15,20   # just these
    .venv/bin/python benchmarks/bench_svm.py --threads          # one BLAS thread against the pool

A full run (no --quick, --sizes, --cap or --skip-large) writes its tables to benchmarks/records/ (``--record``
records any run, ``--no-record`` none; docs/performance.md is generated from the records).

``--threads`` times our fits inside the solver's own one-thread limit (attsvm._threads) against the
same fits with the BLAS library's default pool, alternating in one process.

Timings on a shared machine are noisy; the ratios compare runs made back to back.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import sys
import time
import warnings

if "--threads-child" not in sys.argv:  # (the --threads table measures the library's default pool)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
from _options import positive_float, size_triple
from _record import Recorder, add_option, wanted

SIZES = [(6, 8, 10), (15, 15, 20), (50, 20, 50), (100, 20, 100), (200, 32, 128)]
QUICK_SIZES = SIZES[:3]
LARGE = (250, 400, 256)  # n·T = 100,000 (K = 99,750 constraints), d = 256


def _instance(n: int, T: int, d: int):
    from attsvm.datasets import paper_instance
    from attsvm.svm import att_svm_constraints

    p = paper_instance(n, T, d, seed=0)
    return p, att_svm_constraints(p, p.optimal_tokens(ties="first"))


def _cvxpy_child(q, size, norm, solver, formulation, cap):  # runs in a child process
    warnings.simplefilter("ignore")
    from attsvm.svm import solve_cvxpy

    _, cs = _instance(*size)
    t0 = time.perf_counter()
    raw = solve_cvxpy(cs, norm, solver=solver, formulation=formulation, time_limit=cap)
    elapsed = time.perf_counter() - t0
    q.put((elapsed, raw.status, raw.W))


# Largest n·d at which Clarabel's nuclear-norm SDP is attempted (memory, not time, is the limit).
CLARABEL_NUC_MAX_ND = 2500


def add_references(line, size, norm, refs, svm, cs, cap, capped):
    """Time each cvxpy reference ``(key, solver, formulation)`` and record its time, status,
    relative objective difference to ours and violation in ``line`` (a formulation that already
    hit the cap at a smaller size is skipped and stays in ``capped``)."""
    for key, solver, form in refs:
        t, st, W = time_cvxpy(size, norm, solver, form, cap, skip=norm + key in capped)
        if t is None:
            capped.add(norm + key)
        line[key] = t
        line[key + "_status"] = st
        line[key + "_objdiff"] = None if W is None else abs(_obj(W, norm) - svm.objective_) / svm.objective_
        line[key + "_viol"] = None if W is None else cs.violation(W)


def time_cvxpy(size, norm, solver, formulation, cap, skip=False):
    """(seconds or None when capped, status, W) of one cvxpy solve, wall clock incl. modelling.

    ``skip``: the same formulation already hit the cap at a smaller size — not run again."""
    if skip:
        return None, "skipped", None
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    proc = ctx.Process(target=_cvxpy_child, args=(q, size, norm, solver, formulation, cap))
    proc.start()
    try:
        elapsed, status, W = q.get(timeout=cap + 5)
    except Exception:  # queue.Empty: the cap was hit (modelling or solving)
        proc.kill()
        proc.join()
        return None, f"cap {cap:.0f}s", None
    proc.join()
    if elapsed > cap:
        return None, f"cap {cap:.0f}s", W
    return elapsed, status, W


# Our solves are repeated (best time kept) until this much time was spent on them, at least
# ``repeat`` times: sub-millisecond timings on a shared machine are mostly noise otherwise.
OURS_MIN_TOTAL_S = 0.5


def time_ours(size, norm, repeat=3):
    """(best wall time of ``AttentionSVM(norm).fit``, certificate included; fitted svm; constraints),
    after an untimed warm-up fit on a tiny instance (first-call costs: imports, BLAS start-up)."""
    from attsvm.svm import AttentionSVM

    p, cs = _instance(*size)
    best = np.inf
    svm = None
    spent = 0.0
    runs = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p0, _ = _instance(4, 4, 5)
        AttentionSVM(norm).fit(p0, p0.optimal_tokens(ties="first"))  # warm-up on a tiny instance, not timed
        while runs < repeat or spent < OURS_MIN_TOTAL_S:
            t0 = time.perf_counter()
            svm = AttentionSVM(norm).fit(p, p.optimal_tokens(ties="first"))
            dt = time.perf_counter() - t0
            best, spent, runs = min(best, dt), spent + dt, runs + 1
            if dt > OURS_MIN_TOTAL_S:  # slow solves: one timed run is enough
                break
    return best, svm, cs


def _ours_child(q, size, norm):
    t, svm, cs = time_ours(size, norm, repeat=1)
    svm.constraints_ = None  # keep the pickle small
    q.put((t, svm))


def time_ours_child(size, norm, cap):
    """Our solver in a child process killed at ``cap`` seconds; (time, fitted svm, cs) or None."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    proc = ctx.Process(target=_ours_child, args=(q, size, norm))
    proc.start()
    try:
        t, svm = q.get(timeout=cap)
    except Exception:
        proc.kill()
        proc.join()
        return None
    proc.join()
    return t, svm, _instance(*size)[1]


def _obj(W, norm):
    return float(np.linalg.norm(W)) if norm == "fro" else float(np.linalg.svd(W, compute_uv=False).sum())


def dense_floor(cs, support):
    """(Gram seconds, Cholesky seconds) of the dense floor: the Gram matrix of the support rows
    ``G_kl = (a_kᵀa_l)(z_kᵀz_l)`` and one Cholesky factorisation of it, the work no exact method avoids."""
    from scipy.linalg.lapack import dpotrf

    A = cs.A[support]
    Zs = cs.Z[np.nonzero(support)[0]]
    t0 = time.perf_counter()
    G = A @ A.T
    G *= Zs @ Zs.T
    t1 = time.perf_counter()
    _, info = dpotrf(G.T, lower=0, overwrite_a=1)
    t2 = time.perf_counter()
    if info != 0:  # (a support Gram that is not positive definite has no floor of this kind)
        return np.nan, np.nan
    return t1 - t0, t2 - t1


def _large_child(q, size):
    from attsvm.svm import AttentionSVM

    p, _ = _instance(*size)
    t0 = time.perf_counter()
    svm = AttentionSVM("fro").fit(p, p.optimal_tokens(ties="first"))
    elapsed = time.perf_counter() - t0
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # Linux: KiB
    floor = dense_floor(svm.constraints_, svm.support_) if svm.status_ == "optimal" else (np.nan, np.nan)
    q.put(
        (
            elapsed,
            peak_gb,
            svm.status_,
            svm.objective_,
            svm.max_violation_,
            svm.relative_gap_,
            int(svm.support_.sum()),
            svm.constraints_.n_constraints,
            svm.info_.get("rounds"),
            floor[0],
            floor[1],
            svm.info_.get("path"),
        )
    )


def run_large(cap: float, size=LARGE):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    proc = ctx.Process(target=_large_child, args=(q, size))
    proc.start()
    try:
        out = q.get(timeout=cap)
    except Exception:
        proc.kill()
        proc.join()
        return None
    proc.join()
    return out


def fmt_t(t):
    return "> cap" if t is None else (f"{t * 1e3:.1f} ms" if t < 1 else f"{t:.2f} s")


def fmt_ratio(ref, ours, capped_at=None):
    if ref is None:
        return f"> {capped_at / ours:,.0f}×" if capped_at else "—"
    return f"{ref / ours:,.0f}×"


def _time_fits(case: tuple, one_thread: bool) -> float:
    """ms per fit of ``case`` in this (fresh) process, with or without the estimator's one-thread limit."""
    from unittest import mock

    import attsvm.svm.estimator as est_mod
    from attsvm.datasets import paper_instance
    from attsvm.svm import AttentionSVM

    (n, T, d), reps, norm = case
    probs = [paper_instance(n, T, d, seed=r) for r in range(reps)]
    toks = [p.optimal_tokens(ties="first") for p in probs]
    limit = 10**12 if one_thread else -1  # (the Frobenius and the nuclear thresholds alike)
    with mock.patch.multiple(est_mod, SMALL_SOLVE_ELEMENTS=limit, SMALL_NUCLEAR_ELEMENTS=limit):
        AttentionSVM(norm=norm).fit(probs[0], toks[0])
        t0 = time.perf_counter()
        for p, a in zip(probs, toks):
            AttentionSVM(norm=norm).fit(p, a)
    return (time.perf_counter() - t0) / reps * 1e3


def threads_table(rec: Recorder) -> int:
    """Our fits with one BLAS thread (what the estimator does below attsvm._threads.SMALL_SOLVE_ELEMENTS,
    or SMALL_NUCLEAR_ELEMENTS for the nuclear norm) against the library's default pool, each in a fresh
    Python process started as a user would start a script (a multiprocessing child does not show the
    pool's slowdown), without OMP_NUM_THREADS."""
    import subprocess

    cases = [((6, 8, 10), 50, "fro"), ((15, 15, 20), 20, "fro"), ((50, 20, 50), 5, "fro"), ((100, 20, 100), 3, "fro")]
    cases += [((15, 5, 10), 20, "nuc"), ((50, 20, 50), 2, "nuc"), ((100, 20, 100), 1, "nuc")]
    print(f"{'(n, T, d)':>14} {'norm':>5} {'pool (ms)':>10} {'1 thread (ms)':>14} {'pool / 1 thread':>16}")
    rows = []
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    for (n, T, d), reps, norm in cases:
        res = {}
        for one in (False, True):
            arg = f"{n},{T},{d},{reps},{norm},{int(one)}"
            out = subprocess.run(
                [sys.executable, __file__, "--threads-child", arg], env=env, capture_output=True, text=True, check=True
            )
            res[one] = float(out.stdout.strip().splitlines()[-1])
        print(f"{(n, T, d)!s:>14} {norm:>5} {res[False]:>10.2f} {res[True]:>14.2f} {res[False] / res[True]:>15.1f}×")
        rows.append([str((n, T, d)), norm, round(res[False], 2), round(res[True], 2), f"{res[False] / res[True]:.1f}×"])
    rec.table(
        "One BLAS thread against the default pool",
        ["(n, T, d)", "norm", "pool (ms)", "1 thread (ms)", "pool / 1 thread"],
        rows,
        [
            "ms per fit, each setting in a fresh process without OMP_NUM_THREADS",
            "1 thread: the estimator's own one-thread limit; pool: the BLAS library's default pool",
        ],
    )
    rec.write()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="sizes up to (50, 20, 50), 20 s cap, no large case")
    ap.add_argument(
        "--cap", type=positive_float, default=300.0, help="wall-clock cap per cvxpy solve in seconds (default 300)"
    )
    ap.add_argument("--skip-large", action="store_true", help="skip the n·T = 100,000 case")
    ap.add_argument(
        "--sizes",
        nargs="*",
        action="extend",
        default=None,
        type=size_triple,
        metavar="n,T,d",
        help="only these sizes (n,T,d triples) instead of the default list (or --quick's)",
    )
    add_option(ap, "no --quick, --sizes, --cap or --skip-large")
    ap.add_argument("--threads", action="store_true", help="only: one BLAS thread vs the default pool, our solvers")
    ap.add_argument("--threads-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument(
        "--large",
        nargs="?",
        const=",".join(map(str, LARGE)),
        default=None,
        type=size_triple,
        metavar="n,T,d",
        help=f"only: the large case (default {LARGE[0]},{LARGE[1]},{LARGE[2]}) against its dense floor",
    )
    args = ap.parse_args(argv)
    if args.threads_child:
        n, T, d, reps, norm, one = args.threads_child.split(",")
        print(_time_fits(((int(n), int(T), int(d)), int(reps), norm), one == "1"))
        return 0
    full = wanted(args, ap, ("quick", "sizes", "cap", "skip_large"))
    rec = Recorder("bench_svm", full, argv=None if argv is None else [__file__, *argv])
    if args.threads:
        return threads_table(rec)
    if args.large:
        return large_table(rec, tuple(int(v) for v in args.large.split(",")), max(args.cap, 600.0))
    sizes = QUICK_SIZES if args.quick else SIZES
    if args.sizes:
        sizes = [tuple(int(v) for v in size.split(",")) for size in args.sizes]
    cap = 20.0 if args.quick and args.cap == 300.0 else args.cap

    import cvxpy  # noqa: F401  (imported once here, so children never pay for the import)

    from attsvm.svm import solve_cvxpy

    _, cs0 = _instance(3, 3, 3)
    solve_cvxpy(cs0, "fro")  # warm up cvxpy's first-call caches before forking
    capped: set[str] = set()
    rows_fro, rows_nuc = [], []
    for size in sizes:
        t_ours, svm, cs = time_ours(size, "fro")
        line = {
            "size": size,
            "K": cs.n_constraints,
            "ours": t_ours,
            "viol": svm.max_violation_,
            "gap": svm.relative_gap_,
            "status": svm.status_,
        }
        add_references(
            line, size, "fro", (("loop", "CLARABEL", "loop"), ("aux", "CLARABEL", "aux")), svm, cs, cap, capped
        )
        rows_fro.append(line)
        best = min([t for t in (line["loop"], line["aux"]) if t is not None], default=None)
        print(
            f"fro {size}: ours {fmt_t(t_ours)} ({svm.status_}, viol {svm.max_violation_:.1e}, gap "
            f"{svm.relative_gap_:.1e}) | loop {fmt_t(line['loop'])} [{fmt_ratio(line['loop'], t_ours, cap)}] "
            f"| aux {fmt_t(line['aux'])} [{fmt_ratio(line['aux'], t_ours, cap)}] | best cvxpy "
            f"[{fmt_ratio(best, t_ours, cap)}] | obj diff aux {line['aux_objdiff']}",
            flush=True,
        )

        res = time_ours_child(size, "nuc", max(cap, 60.0))
        if res is None:
            print(f"nuc {size}: ours did not finish within {max(cap, 60.0):.0f} s", flush=True)
            rows_nuc.append(
                {
                    "size": size,
                    "K": cs.n_constraints,
                    "ours": None,
                    "viol": None,
                    "gap": None,
                    "status": "cap",
                    "scs": None,
                    "scs_viol": None,
                    "clarabel": None,
                    "clarabel_viol": None,
                    "clarabel_objdiff": None,
                }
            )
            continue
        t_ours, svm, cs = res
        line = {
            "size": size,
            "K": cs.n_constraints,
            "ours": t_ours,
            "viol": svm.max_violation_,
            "gap": svm.relative_gap_,
            "status": svm.status_,
        }
        n_, _, d_ = size
        if n_ * d_ > CLARABEL_NUC_MAX_ND:  # Clarabel's nuclear SDP needed > 20 GB at (100, 20, 100)
            capped.add("nucclarabel")
        add_references(
            line, size, "nuc", (("scs", "SCS", "aux"), ("clarabel", "CLARABEL", "aux")), svm, cs, cap, capped
        )
        rows_nuc.append(line)
        best = min([t for t in (line["scs"], line["clarabel"]) if t is not None], default=None)
        print(
            f"nuc {size}: ours {fmt_t(t_ours)} ({svm.status_}, viol {svm.max_violation_:.1e}, gap "
            f"{svm.relative_gap_:.1e}) | SCS {fmt_t(line['scs'])} viol {line['scs_viol']} "
            f"[{fmt_ratio(line['scs'], t_ours, cap)}] | Clarabel {fmt_t(line['clarabel'])} "
            f"[{fmt_ratio(line['clarabel'], t_ours, cap)}] | best [{fmt_ratio(best, t_ours, cap)}]",
            flush=True,
        )

    large = None
    if not (args.quick or args.skip_large):
        large = _print_large(run_large(max(cap, 600.0)), LARGE)

    record(rec, rows_fro, rows_nuc, large, cap)
    rec.write()
    return 0


def _print_large(large, size):
    if large is None:
        print(f"large case {size}: did not finish", flush=True)
        return None
    floor = large[9] + large[10]
    print(
        f"large {size} (K={large[7]}): {large[0]:.1f} s, peak RSS {large[1]:.2f} GB, status {large[2]}, "
        f"violation {large[4]:.1e}, relative gap {large[5]:.1e}, support {large[6]}, rounds {large[8]}, "
        f"path {large[11]}; dense floor {floor:.1f} s (Gram {large[9]:.1f} + Cholesky {large[10]:.1f}), "
        f"{large[0] / floor:.2f}× the floor",
        flush=True,
    )
    return large


def large_table(rec: Recorder, size, cap: float) -> int:
    """Only the large case: our solve against the dense floor of its support, in one process."""
    large = _print_large(run_large(cap, size), size)
    if large is None:
        return 1
    rec.table("Large case, our Frobenius solver alone", LARGE_COLUMNS, [_large_cells(large, size)], LARGE_NOTES)
    rec.write()
    return 0


NOTES = [
    "cvxpy: wall clock per solve, modelling included, each in a child process killed at the cap",
    '"> cap" after a formulation hit the cap at a smaller size: not run again (a lower bound)',
    '"ours" includes the certificate (violation, duality gap, support, rank) of AttentionSVM.fit',
]
FRO_NOTES = [
    "loop: the published formulation, one cvxpy constraint per pair; aux: auxiliary variables u_i = W z_i",
    "ours: dense Gram + Cholesky for K ≤ 300, Newton-CG above, working set for K > 4000 or a singular Gram, "
    "the active set on one Cholesky factor first from K = 20,000",
]
NUC_NOTES = ["cvxpy SCS at eps_abs = eps_rel = 1e-9 (at its defaults it stops at violations around 1e-5)"]


def _e(x):
    return "—" if x is None else f"{x:.0e}"


def fro_cells(r, cap) -> list[str]:
    """One row of the Frobenius table: ours against cvxpy's two formulations."""
    best = min([t for t in (r["loop"], r["aux"]) if t is not None], default=None)
    return [
        str(r["size"]),
        str(r["K"]),
        fmt_t(r["ours"]),
        f"{_e(r['viol'])} / {_e(r['gap'])}",
        fmt_t(r["loop"]),
        fmt_t(r["aux"]),
        fmt_ratio(r["loop"], r["ours"], cap),
        fmt_ratio(best, r["ours"], cap),
        _e(r["aux_objdiff"]),
    ]


def nuc_cells(r, cap) -> list[str]:
    """One row of the nuclear table: ours against cvxpy with SCS and Clarabel."""
    if r["ours"] is None:
        return [str(r["size"]), str(r["K"]), "> cap", "—", "—", "—", "—", "—"]
    best = min([t for t in (r["scs"], r["clarabel"]) if t is not None], default=None)
    return [
        str(r["size"]),
        str(r["K"]),
        f"{fmt_t(r['ours'])} ({r['status']})",
        f"{_e(r['viol'])} / {_e(r['gap'])}",
        f"{fmt_t(r['scs'])} ({_e(r['scs_viol'])})",
        f"{fmt_t(r['clarabel'])} ({_e(r['clarabel_viol'])})",
        fmt_ratio(best, r["ours"], cap),
        _e(r["clarabel_objdiff"]),
    ]


FRO_COLUMNS = [
    "(n, T, d)",
    "K",
    "ours",
    "violation / rel. gap",
    "cvxpy loop (published)",
    "cvxpy aux (Clarabel)",
    "× loop",
    "× best cvxpy",
    "obj. diff (aux)",
]
NUC_COLUMNS = [
    "(n, T, d)",
    "K",
    "ours",
    "violation / rel. gap",
    "cvxpy SCS (violation)",
    "cvxpy Clarabel (violation)",
    "× best cvxpy",
    "obj. diff (Clarabel)",
]
LARGE_COLUMNS = [
    "(n, T, d)",
    "K",
    "time (s)",
    "peak RSS (GB)",
    "status",
    "violation",
    "rel. gap",
    "support constraints",
    "working-set rounds",
    "dense floor (s)",
    "× floor",
]
LARGE_NOTES = [
    "peak RSS: the child process's own peak resident memory",
    "dense floor: the Gram matrix of the support rows and one Cholesky factorisation of it, one BLAS thread "
    "like the solve, timed in the same process after it",
]


def _large_cells(large, size):
    floor = large[9] + large[10]
    return [str(size), large[7], round(large[0], 1), round(large[1], 2), large[2], _e(large[4]), _e(large[5]),
            large[6], str(large[8]), round(floor, 1), round(large[0] / floor, 2)]  # fmt: skip


def record(rec: Recorder, rows_fro, rows_nuc, large, cap) -> None:
    """The run's tables, cell for cell as the tables print them."""
    notes = [f"cap {cap:.0f} s per cvxpy solve", *NOTES]
    rec.table("Frobenius: ours against cvxpy", FRO_COLUMNS, [fro_cells(r, cap) for r in rows_fro], notes + FRO_NOTES)
    rec.table("Nuclear: ours against cvxpy", NUC_COLUMNS, [nuc_cells(r, cap) for r in rows_nuc], notes + NUC_NOTES)
    if large is not None:
        rec.table("Large case, our Frobenius solver alone", LARGE_COLUMNS, [_large_cells(large, LARGE)], LARGE_NOTES)


if __name__ == "__main__":
    sys.exit(main())
