"""Benchmark: batched training (attsvm.train) against the published per-run training loop.

Workload (docs/spec.md §6 local-convergence): n=6, T=8, d=10, RUNS runs (seed = run) × 2000 normalized GD
steps, for W and again for (K, Q), with the trajectory (W and the top softmax probability)
recorded at every step. The reference trains one run at a time the way the published notebook
does: an ``nn.Linear`` attention module, autograd, per-parameter gradient normalisation and
``torch.optim.SGD``. Both run in this process with one intra-op thread, so the ratio is measured
on the same machine at the same time (timings on a shared machine are noisy; the ratio less so).

Then it prints how the batched trainer's time per step grows with the number of runs R and with
n, T and d.

    .venv/bin/python benchmarks/bench_train.py            # full: 100 reference runs per param
    .venv/bin/python benchmarks/bench_train.py --quick    # 10 reference runs, extrapolated
    .venv/bin/python benchmarks/bench_train.py --span     # span form against dense W, by shape

``--span`` times ``train(space="span")`` against ``train(space="dense")`` (attsvm.training.span) on
1,000 runs × 200 normalized steps, recorded every 100 steps, for the shapes that set the crossover
constants of ``space="auto"``; the svm-eq shapes (n=3, T=4, ReLU head) come first. With numba the span
form runs its compiled loop, and its torch loop is timed too.

A full run (no --quick, the default --runs, --steps and --ref-runs) writes its tables to benchmarks/records/
(``--record`` records any run, ``--no-record`` none; docs/performance.md is generated from the records).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from _options import positive_int
from _record import Recorder, add_option, wanted

from attsvm.datasets import paper_instance
from attsvm.experiments.svm_eq import relu_instance
from attsvm.metrics import correlation
from attsvm.train import NORMALIZE_EPS, train
from attsvm.training.loop import check_device


class PublishedAttention(torch.nn.Module):
    """The published module's computation (nn.Linear logits zᵀ W_lin x or (W_q z)ᵀ (W_k x))."""

    def __init__(self, d: int, univariate: bool) -> None:
        super().__init__()
        self.univariate = univariate
        if univariate:
            self.W = torch.nn.Linear(d, d, bias=False)
        else:
            self.query = torch.nn.Linear(d, d, bias=False)
            self.key = torch.nn.Linear(d, d, bias=False)

    def forward(self, X: torch.Tensor, Z: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n, _, d = X.shape
        z = Z.reshape(n, 1, d)
        if self.univariate:
            s = torch.softmax(z @ self.W(X).transpose(-2, -1), dim=-1)
        else:
            s = torch.softmax(self.query(z) @ self.key(X).transpose(-2, -1), dim=-1)
        return (s @ X) @ v, s


def reference_run(seed: int, univariate: bool, steps: int, n: int, T: int, d: int):
    p = paper_instance(n, T, d, seed=seed)
    X, Z, v, Y = (torch.tensor(a) for a in (p.X, p.Z, p.v, p.y))
    torch.manual_seed(seed)
    model = PublishedAttention(d, univariate).double()
    params = [model.W.weight] if univariate else [model.query.weight, model.key.weight]
    opt = torch.optim.SGD(params, lr=0.1)
    Ws = np.zeros((steps, d, d))
    probs = np.zeros(steps)
    for it in range(steps):
        opt.zero_grad()
        out, s = model(X, Z, v)
        loss = torch.log(1 + torch.exp(-Y * out.view(-1))).mean()
        if not univariate:
            loss = loss + NORMALIZE_EPS * (model.key.weight.norm() ** 2 + model.query.weight.norm() ** 2)
        loss.backward()
        for w in params:
            w.grad /= w.grad.norm() + NORMALIZE_EPS
        opt.step()
        W = model.W.weight.detach().T if univariate else model.query.weight.T.mm(model.key.weight).T.detach()
        Ws[it] = W.numpy()
        probs[it] = s.detach().max(dim=-1)[0].mean()
    return Ws, probs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=positive_int, default=100)
    ap.add_argument("--steps", type=positive_int, default=2000)
    ap.add_argument("--ref-runs", type=positive_int, default=None, help="reference runs timed (default: all)")
    ap.add_argument("--quick", action="store_true", help="10 reference runs, smaller scaling sweep")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--span", action="store_true", help="only the span-form against dense-W comparison")
    add_option(ap, "no --quick, the default --runs, --steps and --ref-runs")
    args = ap.parse_args()
    try:
        check_device(args.device, "--device")
    except (TypeError, ValueError) as exc:
        ap.error(str(exc))
    if args.ref_runs is not None and args.ref_runs > args.runs:
        ap.error(f"--ref-runs must be <= --runs ({args.runs}), got {args.ref_runs}")
    torch.set_num_threads(1)
    rec = Recorder("bench_train", wanted(args, ap, ("quick", "runs", "steps", "ref_runs")))
    if args.span:
        span_table(args.device, rec)
        rec.write()
        return
    n, T, d = 6, 8, 10
    R, steps = args.runs, args.steps
    ref_runs = args.ref_runs or (min(10, R) if args.quick else R)
    probs = [paper_instance(n, T, d, seed=s) for s in range(R)]
    print(
        f"workload: n={n} T={T} d={d}, {R} runs x {steps} normalized steps, recorded every step "
        f"(torch {torch.__version__}, 1 thread, device {args.device}); timings are wall-clock on a "
        "shared machine, so noisy"
    )
    rows = []
    for param in ("W", "KQ"):
        t0 = time.perf_counter()
        res = train(probs, param=param, steps=steps, seed=list(range(R)), record_W=True, device=args.device)
        t_ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        ref_W = []
        for s in range(ref_runs):
            Ws, _ = reference_run(s, param == "W", steps, n, T, d)
            ref_W.append(Ws[-1])
        t_ref = (time.perf_counter() - t0) * R / ref_runs
        agree = correlation(res.W[:ref_runs], np.array(ref_W))
        k = min(steps, 50)
        early = np.abs(res.history["W"][0, 1 : k + 1] - reference_run(0, param == "W", k, n, T, d)[0]).max()
        print(
            f"[{param:2s}] batched {t_ours:7.2f} s | published loop {t_ref:7.2f} s"
            f"{'' if ref_runs == R else f' (extrapolated from {ref_runs} runs)'} | speed-up "
            f"{t_ref / t_ours:6.1f}x | first {k} steps max|ΔW| {early:.1e} | corr(final W, reference) "
            f"min {agree.min():.4f}"
        )
        rows.append(
            ["W" if param == "W" else "(K, Q)", round(t_ours, 2), round(t_ref, 2), f"{t_ref / t_ours:.1f}×",
             f"{early:.1e}", f"{agree.min():.4f}"]
        )  # fmt: skip
    rec.table(
        "Batched training against the published per-run loop",
        ["parameterization", "attsvm batched (s)", "published-style loop (s)", "speed-up",
         f"max |ΔW|, first {min(steps, 50)} steps", "min corr(final W, reference)"],
        rows,
        [
            f"n={n}, T={T}, d={d}; {R} runs × {steps} normalized GD steps, W recorded at every step",
            "both in this process with one intra-op thread, device " + args.device,
            "the loop: nn.Linear, autograd, torch.optim.SGD, one run at a time"
            + ("" if ref_runs == R else f"; timed on {ref_runs} runs, extrapolated to {R}"),
        ],
    )  # fmt: skip
    scaling = []
    print("\nscaling of the batched trainer (normalized GD on W, 200 steps, record every step):")
    print(f"{'R':>6} {'n':>4} {'T':>4} {'d':>4} {'ms/step':>9} {'us/step/run':>12}")
    base = dict(R=100, n=6, T=8, d=10)
    sweeps = [
        ("R", [1, 10, 100, 1000] if not args.quick else [1, 100, 1000]),
        ("n", [6, 24, 96]),
        ("T", [8, 32, 128]),
        ("d", [10, 40, 160]),
    ]
    for key, values in sweeps:
        for val in values:
            cfg = dict(base, **{key: val})
            ps = [paper_instance(cfg["n"], cfg["T"], cfg["d"], seed=s) for s in range(min(cfg["R"], 100))]
            n_init = max(1, cfg["R"] // len(ps))
            t0 = time.perf_counter()
            train(ps, steps=200, n_init=n_init, device=args.device)
            dt = (time.perf_counter() - t0) / 200
            print(
                f"{cfg['R']:>6} {cfg['n']:>4} {cfg['T']:>4} {cfg['d']:>4} {1e3 * dt:9.3f} {1e6 * dt / cfg['R']:12.2f}"
            )
            scaling.append([cfg["R"], cfg["n"], cfg["T"], cfg["d"], round(1e3 * dt, 3), round(1e6 * dt / cfg["R"], 2)])
    rec.table(
        "Scaling of the batched trainer",
        ["R", "n", "T", "d", "ms per step", "µs per step and run"],
        scaling,
        ["normalized GD on W, 200 steps, recorded every step; one parameter varied at a time"],
    )
    rec.write()


def span_table(device: str, rec: Recorder, runs: int = 1000, steps: int = 200) -> None:
    """Dense W against the span form (its compiled loop where numba is installed, and its torch loop),
    same runs, same run: time ratios and agreement."""
    from attsvm.training import span

    compiled = span.compiled() is not None and torch.device(device).type == "cpu"
    print(f"span form vs dense W: {runs} runs x {steps} normalized steps, record every 100 (1 thread)")
    print(
        f"{'instance':>10} {'n':>3} {'T':>3} {'d':>3} {'dense s':>8} {'span s':>8} {'torch s':>8} "
        f"{'dense/span':>10} {'torch/span':>10} {'auto':>6}"
    )
    shapes = [("relu", 3, 4, d) for d in (4, 6, 8, 10)]
    shapes += [
        ("paper", n, T, d) for n, T, d in [(3, 4, 3), (6, 4, 10), (3, 8, 10), (6, 8, 10), (10, 4, 10), (6, 8, 20)]
    ]
    if compiled:  # compiled once, outside the timings
        train(relu_instance(3, 4, 4, 1), steps=2, progress=False, space="span")
    rows = []
    for kind, n, T, d in shapes:
        if kind == "relu":
            probs = [relu_instance(n, T, d, s) for s in range(1, runs + 1)]
        else:
            probs = [paper_instance(n, T, d, seed=s) for s in range(runs)]
        ts, Ws = {}, {}
        for name, space, loop in (("dense", "dense", None), ("span", "span", None), ("torch", "span", False)):
            if loop is False and not compiled:
                continue
            saved = span._compiled_module
            if loop is False:
                span._compiled_module = False  # the span form's torch loop
            try:
                t0 = time.perf_counter()
                Ws[name] = train(
                    probs, steps=steps, lr=0.1, record_every=100, progress=False, threads=1, space=space, device=device
                ).W
                ts[name] = time.perf_counter() - t0
            finally:
                span._compiled_module = saved
        ts.setdefault("torch", ts["span"])
        auto = "span" if span.span_is_cheaper(n, T, d, 100, compiled=compiled) else "dense"
        print(
            f"{kind:>10} {n:>3} {T:>3} {d:>3} {ts['dense']:8.2f} {ts['span']:8.2f} {ts['torch']:8.2f} "
            f"{ts['dense'] / ts['span']:9.2f}x {ts['torch'] / ts['span']:9.2f}x {auto:>6}"
        )
        rows.append(
            [
                kind, n, T, d, round(ts["dense"], 2), round(ts["span"], 2), round(ts["torch"], 2),
                f"{ts['dense'] / ts['span']:.2f}×", f"{ts['torch'] / ts['span']:.2f}×", auto,
            ]
        )  # fmt: skip
    rec.table(
        "Span form against dense W",
        [
            "instance", "n", "T", "d", "dense (s)", "span (s)", "span, torch loop (s)", "dense / span",
            "torch loop / span", 'space="auto"',
        ],
        rows,
        [
            f"{runs} runs × {steps} normalized steps, recorded every 100, one thread, device {device}; "
            f"span: the {'compiled' if compiled else 'torch'} loop"
        ],
    )  # fmt: skip


if __name__ == "__main__":
    main()
