"""Benchmark: AttentionSVM.fit_many (one vectorised program) against fit one instance at a time.

Workload: R instances ``paper_instance(n, T, d, seed=r)`` at their optimal tokens, Frobenius and
nuclear norms, certificates included on both sides. Both run in this process with one thread, alternating, so the
ratio is measured on the same machine at the same time (timings on a shared machine are noisy; the
ratio less so). Every instance's W is checked against the one-at-a-time solution; for the nuclear
norm (a batched interior point against fit's augmented Lagrangian: two independent methods) the
objectives too.

    .venv/bin/python benchmarks/bench_batch.py            # R = 1000, 500 and 200
    .venv/bin/python benchmarks/bench_batch.py --quick    # R = 200, 100 and 40
    .venv/bin/python benchmarks/bench_batch.py --norm nuc # the nuclear rows only

(15, 15, 20) has K = 210 > BATCH_MAX_K: fit_many solves it one at a time, so its row shows the cost of
the dispatch only.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from attsvm.datasets import paper_instance
from attsvm.svm import AttentionSVM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer instances")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (minimum reported)")
    ap.add_argument("--norm", choices=("fro", "nuc", "both"), default="both")
    args = ap.parse_args()
    sizes = []
    if args.norm in ("fro", "both"):
        sizes += [
            ("fro", (6, 8, 10), 200 if args.quick else 1000),
            ("fro", (8, 8, 10), 100 if args.quick else 500),
            ("fro", (15, 15, 20), 40 if args.quick else 200),
        ]
    if args.norm in ("nuc", "both"):  # svm-rank's shapes: the smallest and the largest interior point
        sizes += [("nuc", (5, 10, 10), 40 if args.quick else 200), ("nuc", (15, 5, 20), 20 if args.quick else 100)]
    print(
        f"{'norm':>4} {'(n, T, d)':>14} {'K':>5} {'R':>5} {'fit (µs/inst)':>14} {'fit_many':>10} {'speed-up':>9} "
        f"{'max ΔW/‖W‖':>11} {'max Δobj':>9}"
    )
    for norm, (n, T, d), R in sizes:
        probs = [paper_instance(n, T, d, seed=r) for r in range(R)]
        toks = [p.optimal_tokens(ties="first") for p in probs]
        est = AttentionSVM(norm)  # type: ignore[arg-type]
        est.fit_many(probs[:8], toks[:8])  # warm-up
        one_t, many_t = [], []
        for _ in range(args.rounds):
            t = time.perf_counter()
            one = [AttentionSVM(norm).fit(p, a) for p, a in zip(probs, toks)]  # type: ignore[arg-type]
            one_t.append((time.perf_counter() - t) / R)
            t = time.perf_counter()
            many = est.fit_many(probs, toks)
            many_t.append((time.perf_counter() - t) / R)
        dw = max(float(np.abs(a.W_ - b.W_).max() / np.abs(b.W_).max()) for a, b in zip(many, one))
        dobj = max(abs(a.objective_ - b.objective_) / b.objective_ for a, b in zip(many, one))
        assert all(m.status_ == "optimal" for m in many)
        K = n * (T - 1)
        print(
            f"{norm:>4} {(n, T, d)!s:>14} {K:>5} {R:>5} {min(one_t) * 1e6:>14.1f} {min(many_t) * 1e6:>10.1f} "
            f"{min(one_t) / min(many_t):>8.1f}× {dw:>11.1e} {dobj:>9.1e}"
        )


if __name__ == "__main__":
    main()
