"""The batched trainer on a CUDA device against the CPU, measured in the same run.

1. **Agreement**: the same runs trained on the CPU and on the GPU (W and (K, Q) with normalized GD,
   ℓp mirror descent with p = 3, Polyak's step) give the same trajectories (max |ΔW| printed; float64 on
   both, so only the order of floating-point sums differs).
2. **Throughput**: R runs of ``paper_instance(6, 8, 10)`` × ``--steps`` normalized-GD steps, for growing R:
   time per step and runs·steps per second on each device, and the ratio.

    python benchmarks/bench_cuda.py                 # needs torch.cuda.is_available()
    python benchmarks/bench_cuda.py --out res.json  # also write the numbers as JSON

It needs only the core install (numpy, scipy, torch, tqdm). On a machine without CUDA it says so and exits 0.

A full run (the default --steps and --runs) writes its tables to benchmarks/records/ (``--record`` records any
run, ``--no-record`` none; docs/performance.md is generated from the records).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
from _options import int_list, positive_int
from _record import Recorder, add_option, wanted

from attsvm.datasets import paper_instance
from attsvm.train import train


def agreement(steps: int) -> dict[str, float]:
    probs = [paper_instance(6, 8, 10, seed=s) for s in range(4)]
    seeds = list(range(4))
    cases = {
        "W, normalized GD": {"param": "W"},
        "KQ, normalized GD": {"param": "KQ"},
        "W, l3 mirror descent": {"param": "W", "optimizer": "md", "p": 3.0, "lr": 0.5},
        "W, Polyak step": {"param": "W", "lr": "polyak"},
    }
    out = {}
    for name, kw in cases.items():
        seeds_k = [0, 1, 3, 5] if kw.get("lr") == "polyak" else seeds  # (runs whose Polyak steps stay finite)
        pr = [paper_instance(6, 8, 10, seed=s) for s in seeds_k] if kw.get("lr") == "polyak" else probs
        a = train(pr, steps=steps, seed=seeds_k, record_W=True, progress=False, **kw)
        b = train(pr, steps=steps, seed=seeds_k, record_W=True, progress=False, device="cuda", **kw)
        Wa, Wb = np.asarray(a.history["W"]), np.asarray(b.history["W"])
        out[name] = float(np.abs(Wa - Wb).max() / max(np.abs(Wa).max(), 1e-300))
    return out


def throughput(runs: list[int], steps: int) -> list[dict[str, float]]:
    rows = []
    for R in runs:
        probs = [paper_instance(6, 8, 10, seed=s) for s in range(R)]
        row: dict[str, float] = {"R": R}
        for dev in ("cpu", "cuda"):
            train(probs[: min(R, 8)], steps=10, seed=list(range(min(R, 8))), progress=False, device=dev)  # warm-up
            if dev == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            train(probs, steps=steps, seed=list(range(R)), progress=False, device=dev)
            if dev == "cuda":
                torch.cuda.synchronize()
            row[f"{dev}_s"] = time.perf_counter() - t0
        row["speedup"] = row["cpu_s"] / row["cuda_s"]
        rows.append(row)
        print(
            f"R = {R:6d}: CPU {row['cpu_s']:7.2f} s, CUDA {row['cuda_s']:7.2f} s "
            f"({R * steps / row['cuda_s']:.3g} run-steps/s), CUDA ×{row['speedup']:.1f}",
            flush=True,
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=positive_int, default=500)
    ap.add_argument("--runs", type=int_list, default=[100, 1000, 10000])
    ap.add_argument("--out", default=None)
    add_option(ap, "the default --steps and --runs")
    args = ap.parse_args()
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        ap.error(f"--out: no folder {os.path.dirname(os.path.abspath(args.out))!r} to write {args.out!r} in")
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to compare")
        return 0
    rec = Recorder("bench_cuda", wanted(args, ap, ("steps", "runs")))
    device = torch.cuda.get_device_name(0)
    print(f"torch {torch.__version__} on {device}", flush=True)
    agree = agreement(args.steps)
    for name, d in agree.items():
        print(f"agreement {name:24s} max |ΔW| / max |W| = {d:.1e}", flush=True)
    rows = throughput(args.runs, args.steps)
    rec.table(
        "The same runs trained on the CPU and on the GPU",
        ["case", "max |ΔW| / max |W|"],
        [[name, f"{d:.0e}"] for name, d in agree.items()],
        [f"GPU: {device}", f"{args.steps} steps on (6, 8, 10), float64 on both devices"],
    )
    rec.table(
        "Batched training throughput, CPU against CUDA",
        ["runs R", "CPU (s)", "CUDA (s)", "CUDA run-steps/s", "CUDA speed-up"],
        [[int(r["R"]), round(r["cpu_s"], 2), round(r["cuda_s"], 2), f"{r['R'] * args.steps / r['cuda_s']:.3g}",
          f"{r['speedup']:.1f}×"] for r in rows],
        [f"GPU: {device}; the CPU column: this machine's cores",
         f"normalized GD on paper_instance(6, 8, 10), {args.steps} steps"],
    )  # fmt: skip
    rec.write()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"agreement": agree, "throughput": rows, "device": torch.cuda.get_device_name(0)}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
