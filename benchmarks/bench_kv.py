"""Decoding-step cost of the KV-cache eviction policies against no eviction (issue #5, speed).

The LM has the `attsvm lm-train` architecture (weights random: speed does not depend on them). For each
policy we decode ``N`` tokens one at a time with a cache budget of ``25 %`` of N and time the steps
after the budget is reached; the reference is the same loop with transformers' DynamicCache (no
eviction, eager attention — the implementation the score-based policies need; the sdpa reference is
printed too). Ratios are measured in the same run, interleaved, median of ``--repeats``; timings on a
shared machine are noisy.

    .venv/bin/python benchmarks/bench_kv.py [--tokens 256] [--batch 1] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def build(attn: str):
    from transformers import GPT2Config, GPT2LMHeadModel

    from attsvm.analysis.lm import LMConfig

    c = LMConfig()
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=c.vocab_size, n_positions=c.n_positions, n_embd=c.n_embd, n_layer=c.n_layer,
                     n_head=c.n_head)
    model = GPT2LMHeadModel(cfg).eval()
    model.config._attn_implementation = attn
    return model


def decode(model, ids, cache, start: int) -> tuple[float, float]:
    """(wall, CPU) seconds spent on steps ``start..N-1`` of a one-token-at-a-time decode of ids (B, N)."""
    past = cache
    w0 = c0 = 0.0
    with torch.no_grad():
        for t in range(ids.shape[1]):
            if t == start:
                w0, c0 = time.perf_counter(), time.process_time()
            out = model(input_ids=ids[:, t:t + 1], cache=past, use_cache=True)
            past = out.past_key_values if cache is None else cache
    return time.perf_counter() - w0, time.process_time() - c0


def main() -> None:
    from attsvm.analysis.kv_cache import POLICIES, EvictionCache

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--budget", type=float, default=0.25)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    eager, sdpa = build("eager"), build("sdpa")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, eager.config.vocab_size, (args.batch, args.tokens), generator=g)
    budget = max(1, int(round(args.budget * args.tokens)))
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in ("none (eager)", "none (sdpa)", *POLICIES)}
    decode(eager, ids, None, budget)  # warm-up
    g_order = torch.Generator().manual_seed(1)
    for _ in range(args.repeats):  # each round: every cache once, in a fresh random order (drift hits all alike)
        for i in torch.randperm(len(times), generator=g_order).tolist():
            k = list(times)[i]
            if k.startswith("none"):
                times[k].append(decode(eager if k == "none (eager)" else sdpa, ids, None, budget))
            else:
                with EvictionCache(eager, k, budget) as cache:
                    times[k].append(decode(eager, ids, cache, budget))
    steps = args.tokens - budget
    ref_w = statistics.median(t[0] for t in times["none (eager)"])
    ref_c = statistics.median(t[1] for t in times["none (eager)"])
    print(f"tiny LM (4 layers, d=128), batch {args.batch}, {args.tokens} tokens, budget {budget} "
          f"({100 * args.budget:g} %), {steps} timed steps, median of {args.repeats}, {args.threads} thread(s)")
    print(f"{'cache':>14} {'wall ms/step':>13} {'ratio':>7} {'CPU ms/step':>12} {'ratio':>7} {'paired':>7}"
          "   (ratio: vs no eviction, eager; paired: median over rounds of the same-round CPU ratio)")
    ref = times["none (eager)"]
    for k, v in times.items():
        w = statistics.median(t[0] for t in v)
        c = statistics.median(t[1] for t in v)
        paired = statistics.median(t[1] / r[1] for t, r in zip(v, ref))
        print(f"{k:>14} {1e3 * w / steps:13.3f} {w / ref_w:7.3f} {1e3 * c / steps:12.3f} {c / ref_c:7.3f} {paired:7.3f}")


if __name__ == "__main__":
    main()
