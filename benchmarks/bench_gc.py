"""fit_many with and without its pause of the cyclic garbage collector, measured in the same run.

``AttentionSVM.fit_many`` builds one estimator per instance (a few Python containers each) with the
collector paused (``attsvm.svm.batch.gc_paused``): none of them is in a cycle, and in a process that
imported torch each full collection walks hundreds of thousands of objects (about 0.12 s). This script
times what a sweep sees: the mean time per instance over ``--calls`` back-to-back calls, each result kept
until the next call replaces it, on ``paper_instance(n, T, d)`` for 1,000 instances, in rounds that
alternate between the library as it is and the library with the pause replaced by a no-op; it prints the
mean over all rounds of each, the ratio, and the collections of each generation with their time
(``gc.callbacks``). A full collection comes once in tens of calls, so the windows must be long: over 20
calls the mean depends on whether one falls inside it.

    .venv/bin/python benchmarks/bench_gc.py                 # (6, 8, 10), 100 calls, 2 rounds
    .venv/bin/python benchmarks/bench_gc.py --size 15,15,20 --calls 30

A full run (the default --size, --instances, --calls and --rounds) writes its table to benchmarks/records/
(``--record`` records any run, ``--no-record`` none; docs/performance.md is generated from the records).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import time

import numpy as np
from _options import positive_int, size_triple
from _record import Recorder, add_option, wanted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=size_triple, default="6,8,10", help="n,T,d (default 6,8,10)")
    ap.add_argument("--instances", type=positive_int, default=1000)
    ap.add_argument("--calls", type=positive_int, default=100, help="back-to-back calls per round")
    ap.add_argument("--rounds", type=positive_int, default=2)
    add_option(ap, "the default --size, --instances, --calls and --rounds")
    args = ap.parse_args()
    rec = Recorder("bench_gc", wanted(args, ap, ("size", "instances", "calls", "rounds")))
    import torch  # noqa: F401  (a user's process: its objects are what a full collection walks)

    from attsvm.datasets import paper_instance
    from attsvm.svm import AttentionSVM, batch

    n, T, d = (int(v) for v in args.size.split(","))
    probs = [paper_instance(n, T, d, seed=s) for s in range(args.instances)]
    toks = [p.optimal_tokens(ties="first") for p in probs]
    est = AttentionSVM()
    paused = batch.gc_paused
    means: dict[str, list[float]] = {"paused": [], "not paused": []}
    collections: dict[str, dict[int, list[float]]] = {how: {0: [], 1: [], 2: []} for how in means}
    mode = ["paused"]
    began = [0.0, 0]

    def watch(phase: str, info: dict) -> None:  # (gc.callbacks: each collection's generation and time)
        if phase == "start":
            began[:] = [time.perf_counter(), info["generation"]]
        else:
            collections[mode[0]][int(began[1])].append(time.perf_counter() - began[0])

    def run() -> float:
        out = est.fit_many(probs, toks)
        t0 = time.perf_counter()
        for _ in range(args.calls):
            out = est.fit_many(probs, toks)  # (the previous result is freed when this one replaces it)
        dt = (time.perf_counter() - t0) / args.calls / args.instances
        assert all(e.status_ == "optimal" for e in out)
        return dt

    gc.callbacks.append(watch)
    try:
        for _ in range(args.rounds):
            for how in means:
                batch.gc_paused = paused if how == "paused" else contextlib.nullcontext  # type: ignore[assignment]
                mode[0] = how
                means[how].append(run())
    finally:
        batch.gc_paused = paused
        gc.callbacks.remove(watch)
    a, b = np.mean(means["paused"]), np.mean(means["not paused"])
    calls = args.calls * args.rounds
    print(f"(n, T, d) = {(n, T, d)}, {args.instances} instances, mean over {args.rounds} rounds of {args.calls} calls:")
    for how, mean in (("paused", a), ("not paused", b)):
        seen = ", ".join(f"gen {g}: {len(ts)} ({sum(ts) * 1e3:.0f} ms)" for g, ts in collections[how].items())
        print(f"  fit_many, collector {how:<10} {mean * 1e6:8.2f} µs per instance; {calls} calls collected {seen}")
    print(f"  the pause makes fit_many {b / a:.2f}× as fast")
    rec.table(
        "fit_many with and without its pause of the garbage collector",
        ["collector", "µs per instance", "gen 0", "gen 1", "gen 2 (full)"],
        [
            [how, round(mean * 1e6, 2)] + [f"{len(ts)} ({sum(ts) * 1e3:.0f} ms)" for ts in collections[how].values()]
            for how, mean in (("paused", a), ("not paused", b))
        ],
        [
            f"(n, T, d) = {(n, T, d)}, {args.instances} instances, {args.rounds} rounds of {args.calls} calls",
            f"gen k: the collections of {calls} calls and their time; the pause makes fit_many {b / a:.2f}× as fast",
        ],
    )
    rec.write()


if __name__ == "__main__":
    main()
