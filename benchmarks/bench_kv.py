"""Decoding-step cost of the KV-cache eviction policies against no eviction (speed; limits below).

Two models, weights random (speed does not depend on them): ``gpt2`` has the `attsvm lm-train` architecture
(4 layers, d=128, MHA; limit 1.20), ``llama`` is a small RoPE Llama with grouped-query attention (4 layers,
d=256, 8 query heads on 2 KV heads, ~4.5M parameters; limit 1.10) and ``llama-retrieval`` has the shape of the
retrieval LM (2 layers, d=64, 4 query heads on 2 KV heads; limit 1.10). For each
policy we decode ``N`` tokens one at a time with a cache budget of ``25 %`` of N and time the steps
after the budget is reached; the reference is the same loop with transformers' DynamicCache (no
eviction, eager attention — the implementation the score-based policies need; the sdpa reference is
printed too, and the per-layer eviction path, ``fuse_layers=False``, for the svm policy).

All caches decode in lockstep: at every step each cache runs its forward pass once, in a fresh random
order, so load changes on a shared machine hit every cache alike. Each step's time is the median over
``--repeats`` passes, a cache's cost is the sum over the timed steps, and every ratio compares numbers
measured in the same run. Timings on a shared machine are still noisy.

    .venv/bin/python benchmarks/bench_kv.py [--model gpt2 llama] [--tokens 256] [--batch 1] [--repeats 5]

A full run (the default --model, --tokens and --repeats) writes its table to benchmarks/records/ (``--record``
records any run, ``--no-record`` none; docs/performance.md is generated from the records).
"""

from __future__ import annotations

import argparse
import time

import torch
from _options import fraction, positive_int
from _record import Recorder, add_option, wanted

from attsvm.analysis.kv_cache import cache_kwargs, returned_cache

LIMITS = {"gpt2": 1.20, "llama": 1.10, "llama-retrieval": 1.10}
TITLES = {
    "gpt2": "tiny GPT-2 LM (4 layers, d=128, MHA)",
    "llama": "small Llama (4 layers, d=256, GQA 8:2, RoPE)",
    "llama-retrieval": "retrieval-LM-shaped Llama (2 layers, d=64, GQA 4:2, head_dim 32, RoPE)",
}


def build(kind: str, attn: str):
    torch.manual_seed(0)
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        from attsvm.analysis.lm import LMConfig

        c = LMConfig()
        cfg = GPT2Config(
            vocab_size=c.vocab_size, n_positions=c.n_positions, n_embd=c.n_embd, n_layer=c.n_layer, n_head=c.n_head
        )
        model = GPT2LMHeadModel(cfg).eval()
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        if kind == "llama":
            cfg = LlamaConfig(
                vocab_size=2048,
                hidden_size=256,
                intermediate_size=688,
                num_hidden_layers=4,
                num_attention_heads=8,
                num_key_value_heads=2,
                max_position_embeddings=4096,
            )
        else:  # the shape of attsvm's retrieval LM (analysis/lm.py, RETRIEVAL_LM)
            from attsvm.analysis.lm import RETRIEVAL_LM

            cfg = LlamaConfig(
                vocab_size=1024,
                hidden_size=64,
                intermediate_size=192,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=32,
                max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": RETRIEVAL_LM.rope_theta},
                attention_bias=RETRIEVAL_LM.attention_bias,
            )
        model = LlamaForCausalLM(cfg).eval()
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
            out = model(input_ids=ids[:, t : t + 1], use_cache=True, **cache_kwargs(model, past))
            past = returned_cache(out) if cache is None else cache
    return time.perf_counter() - w0, time.process_time() - c0


def lockstep(models: dict, ids: torch.Tensor, make_cache: dict, start: int, gen: torch.Generator) -> dict:
    """One decode of ids (B, N) per cache, all in lockstep; per-step wall seconds (N - start,) per cache."""
    names = list(make_cache)
    caches = {k: make_cache[k]() for k in names}
    past = {k: caches[k] for k in names}
    times = {k: torch.zeros(ids.shape[1] - start, dtype=torch.float64) for k in names}
    try:
        with torch.no_grad():
            for t in range(ids.shape[1]):
                for i in torch.randperm(len(names), generator=gen).tolist():
                    k = names[i]
                    t0 = time.perf_counter()
                    out = models[k](input_ids=ids[:, t : t + 1], use_cache=True, **cache_kwargs(models[k], past[k]))
                    dt = time.perf_counter() - t0
                    if caches[k] is None:
                        past[k] = returned_cache(out)
                    if t >= start:
                        times[k][t - start] = dt
    finally:
        for c in caches.values():
            if c is not None:
                c.close()
    return times


def bench(kind: str, args: argparse.Namespace, rows: list | None = None) -> dict[str, float]:
    """Run one model's lockstep comparison; print its table (and add its rows to ``rows``); return the ratios."""
    from attsvm.analysis.kv_cache import POLICIES, EvictionCache

    eager, sdpa = build(kind, "eager"), build(kind, "sdpa")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, eager.config.vocab_size, (args.batch, args.tokens), generator=g)
    budget = max(1, round(args.budget * args.tokens))
    make_cache = {"none (eager)": lambda: None, "none (sdpa)": lambda: None}
    models = {"none (eager)": eager, "none (sdpa)": sdpa}
    for k in POLICIES:
        make_cache[k] = lambda k=k: EvictionCache(eager, k, budget)
        models[k] = eager
    make_cache["svm per-layer"] = lambda: EvictionCache(eager, "svm", budget, fuse_layers=False)
    models["svm per-layer"] = eager
    decode(eager, ids, None, budget)  # warm-up
    gen = torch.Generator().manual_seed(1)
    runs = [lockstep(models, ids, make_cache, budget, gen) for _ in range(args.repeats)]
    steps = args.tokens - budget
    cost = {k: float(torch.stack([r[k] for r in runs]).median(dim=0).values.sum()) for k in make_cache}
    ref = cost["none (eager)"]
    print(
        f"{TITLES[kind]}, batch {args.batch}, {args.tokens} tokens, budget {budget} "
        f"({100 * args.budget:g} %), {steps} timed steps in lockstep, per-step median of {args.repeats}, "
        f"{args.threads} thread(s)"
    )
    print(
        f"{'cache':>14} {'ms/step':>9} {'ratio':>7}   (ratio: vs no eviction, eager attention; limit "
        f"{LIMITS[kind]:.2f})"
    )
    for k, c in cost.items():
        print(f"{k:>14} {1e3 * c / steps:9.3f} {c / ref:7.3f}")
        if rows is not None:
            rows.append([kind, k, round(1e3 * c / steps, 3), round(c / ref, 3), f"{LIMITS[kind]:.2f}"])
    return {k: c / ref for k, c in cost.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", nargs="+", choices=sorted(LIMITS), default=["gpt2", "llama"])
    ap.add_argument("--tokens", type=positive_int, default=256)
    ap.add_argument("--batch", type=positive_int, default=1)
    ap.add_argument("--budget", type=fraction, default=0.25)
    ap.add_argument("--repeats", type=positive_int, default=5)
    ap.add_argument("--threads", type=positive_int, default=1)
    add_option(ap, "the default --model, --tokens and --repeats")
    args = ap.parse_args()
    budget = max(1, round(args.budget * args.tokens))  # (as bench() computes it)
    if budget >= args.tokens:
        ap.error(
            f"--budget {args.budget:g} of --tokens {args.tokens} keeps {budget} tokens: nothing left to time "
            "(the decode is timed after the first budget tokens)"
        )
    if "gpt2" in args.model:
        from attsvm.analysis.lm import LMConfig

        positions = LMConfig().n_positions  # (build's GPT-2 has a learned position table this long)
        if args.tokens > positions:
            ap.error(f"--tokens must be <= {positions} with --model gpt2 (its position table), got {args.tokens}")
    torch.set_num_threads(args.threads)
    rec = Recorder("bench_kv", wanted(args, ap, ("model", "tokens", "repeats")))
    rows: list = []
    for kind in args.model:
        bench(kind, args, rows)
        print()
    rec.table(
        "Decoding-step cost of eviction against no eviction",
        ["model", "cache", "ms per step", "ratio", "limit"],
        rows,
        [
            *(f"{kind}: {TITLES[kind]}" for kind in args.model),
            f"batch {args.batch}, {args.tokens} tokens, budget {100 * args.budget:g} % of them, "
            f"{args.threads} thread(s)",
            f"the steps after the budget is reached, in lockstep, each step the median of {args.repeats} passes",
            "ratio: against no eviction with eager attention; limit: the ratio each policy should stay under",
        ],
    )
    rec.write()


if __name__ == "__main__":
    main()
