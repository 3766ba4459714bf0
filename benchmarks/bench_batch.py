"""Benchmark: AttentionSVM.fit_many (one vectorised program) against fit one instance at a time.

Workload: R instances ``paper_instance(n, T, d, seed=r)`` at their optimal tokens, Frobenius and
nuclear norms, certificates included on both sides. Everything runs in this process, alternating, so the
ratios are measured on the same machine at the same time (timings on a shared machine are noisy; the
ratios less so). Every instance's W is checked against the one-at-a-time solution; for the nuclear
norm (a batched interior point against fit's augmented Lagrangian: two independent methods) the
objectives too.

Both norms time both routes: the NumPy one (``numpy``, what fit_many runs without numba: the batched
active set of attsvm.svm.batch, where instances above BATCH_MAX_K = 80 rows go one at a time, and the
batched interior point of attsvm.svm._sdp) and the compiled one (numba: the dual active set of
attsvm.svm._active_set and the interior point of attsvm.svm._sdp_compiled; ``compiled ×1`` on one
thread, ``compiled ×N`` on N, the machine's cores or ATTSVM_NUM_THREADS). fit and the NumPy route run
with one BLAS thread.

    .venv/bin/python benchmarks/bench_batch.py            # R = 1000, 500 and 200
    .venv/bin/python benchmarks/bench_batch.py --quick    # R = 200, 100 and 40
    .venv/bin/python benchmarks/bench_batch.py --norm nuc # the nuclear rows only

A full run (no --quick, the default --rounds; either norm) writes its table to benchmarks/records/
(``--record`` records any run, ``--no-record`` none; docs/performance.md is generated from the records).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
from _options import positive_int
from _record import Recorder, add_option, wanted

from attsvm.datasets import paper_instance
from attsvm.svm import AttentionSVM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer instances")
    ap.add_argument("--rounds", type=positive_int, default=3, help="alternating rounds (minimum reported)")
    ap.add_argument("--norm", choices=("fro", "nuc", "both"), default="both")
    add_option(ap, "no --quick, the default --rounds")
    args = ap.parse_args()
    rec = Recorder("bench_batch", wanted(args, ap, ("quick", "rounds")))
    sizes = []
    if args.norm in ("fro", "both"):
        sizes += [
            ("fro", (6, 8, 10), 200 if args.quick else 1000),
            ("fro", (8, 8, 10), 100 if args.quick else 500),
            ("fro", (15, 15, 20), 40 if args.quick else 200),
            ("fro", (20, 20, 30), 10 if args.quick else 50),  # K = 380, near COMPILED_MAX_K
        ]
    if args.norm in ("nuc", "both"):  # svm-rank's shapes: the smallest and the largest interior point
        sizes += [("nuc", (5, 10, 10), 40 if args.quick else 200), ("nuc", (15, 5, 20), 20 if args.quick else 100)]
    from attsvm._threads import batch_threads
    from attsvm.svm import batch

    threads = batch_threads()
    routes = {"numpy": (False, 1), "compiled ×1": (None, 1), f"compiled ×{threads}": (None, threads)}
    if batch.compiled() is None:
        print("numba is not installed: the compiled columns are skipped (pip install -e '.[fast]')")
        routes = {"numpy": (False, 1)}
    print(
        f"{'norm':>4} {'(n, T, d)':>14} {'K':>5} {'R':>5} {'fit (µs/inst)':>14} "
        + " ".join(f"{name:>13}" for name in routes)
        + f" {'best ×fit':>9} {'max ΔW/‖W‖':>11} {'max Δobj':>9}"
    )
    rows = []
    for norm, (n, T, d), R in sizes:
        probs = [paper_instance(n, T, d, seed=r) for r in range(R)]
        toks = [p.optimal_tokens(ties="first") for p in probs]
        est = AttentionSVM(norm)  # type: ignore[arg-type]
        these = routes
        times: dict[str, list[float]] = {name: [] for name in ["fit", *these]}
        for module, th in these.values():  # warm-up (compiles or loads the kernels)
            batch._compiled_module = module
            os.environ["ATTSVM_NUM_THREADS"] = str(th)
            est.fit_many(probs[:8], toks[:8])
        many: list = []
        for _ in range(args.rounds):
            t = time.perf_counter()
            one = [AttentionSVM(norm).fit(p, a) for p, a in zip(probs, toks)]  # type: ignore[arg-type]
            times["fit"].append((time.perf_counter() - t) / R)
            for name, (module, th) in these.items():
                batch._compiled_module = module
                os.environ["ATTSVM_NUM_THREADS"] = str(th)
                t = time.perf_counter()
                out = est.fit_many(probs, toks)
                times[name].append((time.perf_counter() - t) / R)
                many.append(out)
        dw = max(float(np.abs(a.W_ - b.W_).max() / np.abs(b.W_).max()) for m in many for a, b in zip(m, one))
        dobj = max(abs(a.objective_ - b.objective_) / b.objective_ for m in many for a, b in zip(m, one))
        assert all(x.status_ == "optimal" for m in many for x in m)
        best = min(min(times[name]) for name in these)
        K = n * (T - 1)
        cells = " ".join(f"{min(times[name]) * 1e6:>13.1f}" for name in these)
        print(
            f"{norm:>4} {(n, T, d)!s:>14} {K:>5} {R:>5} {min(times['fit']) * 1e6:>14.1f} {cells} "
            f"{min(times['fit']) / best:>8.1f}× {dw:>11.1e} {dobj:>9.1e}"
        )
        rows.append(
            [norm, str((n, T, d)), K, R, round(min(times["fit"]) * 1e6, 1),
             *(round(min(times[name]) * 1e6, 1) for name in these), f"{min(times['fit']) / best:.1f}×",
             f"{dw:.1e}", f"{dobj:.1e}"]
        )  # fmt: skip
    batch._compiled_module = None
    rec.table(
        "fit_many against fit, one instance at a time",
        ["norm", "(n, T, d)", "K", "instances", "fit", *routes, "best × fit", "max ΔW/‖W‖", "max Δobj"],
        rows,
        [
            "µs per instance, certificates included, the best of the alternating rounds",
            "numpy: the NumPy route; compiled ×N: the numba route on N threads",
            "max ΔW/‖W‖, max Δobj: fit_many's answers against fit's, every instance",
            f"{args.rounds} rounds, alternating fit and each route in one process",
        ],
    )
    rec.write()


if __name__ == "__main__":
    main()
