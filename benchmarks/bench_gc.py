"""fit_many with and without its pause of the cyclic garbage collector, measured in the same run.

``AttentionSVM.fit_many`` builds one estimator per instance (a few Python containers each) with the
collector paused (``attsvm.svm.batch.gc_paused``): none of them is in a cycle, and in a process that
imported torch each full collection walks hundreds of thousands of objects. This script times what a
sweep sees: the mean time per instance over ``--calls`` back-to-back calls, each result kept until the
next call replaces it, on ``paper_instance(n, T, d)`` for 1,000 instances, in rounds that alternate
between the library as it is and the library with the pause replaced by a no-op, and prints the ratio.

    .venv/bin/python benchmarks/bench_gc.py                 # (6, 8, 10), 20 calls, 3 rounds
    .venv/bin/python benchmarks/bench_gc.py --size 15,15,20 --calls 10
"""

from __future__ import annotations

import argparse
import contextlib
import time

import numpy as np
from _options import positive_int, size_triple


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=size_triple, default="6,8,10", help="n,T,d (default 6,8,10)")
    ap.add_argument("--instances", type=positive_int, default=1000)
    ap.add_argument("--calls", type=positive_int, default=20, help="back-to-back calls per round")
    ap.add_argument("--rounds", type=positive_int, default=3)
    args = ap.parse_args()
    import torch  # noqa: F401  (a user's process: its objects are what a full collection walks)

    from attsvm.datasets import paper_instance
    from attsvm.svm import AttentionSVM, batch

    n, T, d = (int(v) for v in args.size.split(","))
    probs = [paper_instance(n, T, d, seed=s) for s in range(args.instances)]
    toks = [p.optimal_tokens(ties="first") for p in probs]
    est = AttentionSVM()
    paused = batch.gc_paused
    means: dict[str, list[float]] = {"paused": [], "not paused": []}

    def run() -> float:
        out = est.fit_many(probs, toks)
        t0 = time.perf_counter()
        for _ in range(args.calls):
            out = est.fit_many(probs, toks)  # (the previous result is freed when this one replaces it)
        dt = (time.perf_counter() - t0) / args.calls / args.instances
        assert all(e.status_ == "optimal" for e in out)
        return dt

    try:
        for _ in range(args.rounds):
            for how in means:
                batch.gc_paused = paused if how == "paused" else contextlib.nullcontext  # type: ignore[assignment]
                means[how].append(run())
    finally:
        batch.gc_paused = paused
    a, b = np.min(means["paused"]), np.min(means["not paused"])
    print(f"(n, T, d) = {(n, T, d)}, {args.instances} instances, mean over {args.calls} calls (best of {args.rounds}):")
    print(f"  fit_many, collector paused     {a * 1e6:8.2f} µs per instance")
    print(f"  fit_many, collector not paused {b * 1e6:8.2f} µs per instance")
    print(f"  the pause makes fit_many {b / a:.2f}× as fast")


if __name__ == "__main__":
    main()
