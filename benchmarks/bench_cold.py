"""The first ``fit_many`` call of a fresh process against later calls, and against ``fit`` one at a time.

Each round starts a fresh interpreter that imports attsvm, builds B problems at (n, T, d) = (6, 8, 10) (the
paper's recipe, ``attsvm.datasets.paper_instance``), and times: the first ``fit_many`` on them, a second
(warm) ``fit_many`` on the same problems, and ``fit`` on each problem one at a time (after the warm call).
Printed per batch size B: the import and build times, then µs per instance for first, warm and ``fit``; the
ratios first / warm and first / fit. The machine's load is not controlled: run it idle, or read the ratios.

    python benchmarks/bench_cold.py                  # B = 20, 50, 300; 3 rounds each
    python benchmarks/bench_cold.py --sizes 300 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from _options import positive_int
from _record import Recorder, add_option, wanted

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from attsvm.datasets import paper_instance
from attsvm.svm import AttentionSVM
t1 = time.perf_counter()
B = int(sys.argv[1])
probs = [paper_instance(6, 8, 10, seed=s) for s in range(B)]
t2 = time.perf_counter()
est = AttentionSVM()
a = time.perf_counter(); first = est.fit_many(probs); b = time.perf_counter()
c = time.perf_counter(); est.fit_many(probs); d = time.perf_counter()
e = time.perf_counter()
for p in probs:
    AttentionSVM().fit(p)
f = time.perf_counter()
assert all(x.status_ == "optimal" for x in first)
print(json.dumps({"import": t1 - t0, "build": t2 - t1, "first": (b - a) / B, "warm": (d - c) / B, "fit": (f - e) / B}))
"""


def run_child(B: int) -> dict[str, float]:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    out = subprocess.run([sys.executable, "-c", CHILD, str(B)], capture_output=True, text=True, env=env, check=False)
    if out.returncode:
        raise SystemExit(f"the child process failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", type=positive_int, nargs="+", default=[20, 50, 300], help="batch sizes B")
    ap.add_argument("--rounds", type=positive_int, default=3, help="fresh interpreters per size (median shown)")
    add_option(ap, "the default --sizes and --rounds")
    args = ap.parse_args()
    rec = Recorder("bench_cold", wanted(args, ap, ("sizes", "rounds")))
    rows = []
    print(f"{'B':>5} {'import s':>9} {'build s':>8} {'first µs':>9} {'warm µs':>8} {'fit µs':>7} "
          f"{'first/warm':>10} {'first/fit':>9}")  # fmt: skip
    for B in args.sizes:
        runs = [run_child(B) for _ in range(args.rounds)]
        m = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        ratio_w, ratio_f = m["first"] / m["warm"], m["first"] / m["fit"]
        print(
            f"{B:>5} {m['import']:>9.3f} {m['build']:>8.3f} {1e6 * m['first']:>9.0f} {1e6 * m['warm']:>8.1f} "
            f"{1e6 * m['fit']:>7.0f} {ratio_w:>10.2f} {ratio_f:>9.2f}",
            flush=True,
        )
        rows.append(
            [B, f"{m['import']:.3f} s", f"{m['build']:.3f} s", f"{1e6 * m['first']:.0f} µs",
             f"{1e6 * m['warm']:.1f} µs", f"{1e6 * m['fit']:.0f} µs", f"{ratio_w:.2f}", f"{ratio_f:.2f}"]
        )  # fmt: skip
    rec.table(
        "First fit_many call of a fresh process against warm calls and fit, (6, 8, 10)",
        ["B", "import", "build B problems", "first fit_many / inst", "warm fit_many / inst", "fit / inst",
         "first / warm", "first / fit"],
        rows,
        [f"median of {args.rounds} fresh interpreters per B; OMP_NUM_THREADS=1"],
    )  # fmt: skip
    rec.write()


if __name__ == "__main__":
    main()
