"""The retrieval LM's training recipe and its ablations: training time, held-out perplexity, full-cache accuracy.

``attsvm.analysis.lm.RETRIEVAL_LM`` (the model every ``attsvm kv-compare`` comparison runs on) must reach 0.9
full-cache accuracy on every task at 1,024 tokens, else the comparison is void. Three settings make the small
Llama find its induction heads within minutes on CPU (docs: :class:`attsvm.analysis.lm.LlamaLMConfig`); each
ablation turns one of them back:

- ``no-bias``: ``attention_bias=False`` (Llama's default projections);
- ``no-warm``: ``warm=0`` (no phase of repeated random codes);
- ``rope-10k``: ``rope_theta=10_000`` (Llama 2's RoPE base).

Every row trains a fresh model (seeded) in a temporary folder and scores greedy answers on held-out filler
(``--samples`` contexts per task, seed 123, the slow test's setting). A run of the four rows takes 15–20
minutes on 2 cores; ``--only default`` about 5.

    .venv/bin/python benchmarks/bench_retrieval_lm.py [--only default no-bias ...] [--samples 25] [--seed 0]

A full run (the default --only, --samples and --tokens) writes its table to benchmarks/records/ (``--record``
records any run, ``--no-record`` none; docs/performance.md is generated from the records).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

from _options import positive_int, seed
from _record import Recorder, add_option, wanted

ABLATIONS = {
    "default": {},
    "no-bias": {"attention_bias": False},
    "no-warm": {"warm": 0.0},
    "rope-10k": {"rope_theta": 10_000.0},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=list(ABLATIONS), default=list(ABLATIONS))
    ap.add_argument("--samples", type=positive_int, default=25, help="contexts per task for the accuracy")
    ap.add_argument("--seed", type=seed, default=0, help="training seed")
    ap.add_argument("--tokens", type=positive_int, default=1024, help="context length of the accuracy tasks")
    add_option(ap, "the default --only, --samples and --tokens")
    args = ap.parse_args()
    # the accuracy tasks need room for their needles: check --tokens now, not after 15-20 min of training
    from attsvm.analysis.tasks import TASKS, make_rows

    for task in TASKS:
        try:
            make_rows(task, 1, n_tokens=args.tokens, seed=123)
        except ValueError as exc:
            ap.error(f"--tokens {args.tokens} is too short for task {task}: {exc}")

    from attsvm.analysis.lm import RETRIEVAL_LM, full_cache_accuracy, load_llama_lm, train_llama_lm

    rec = Recorder("bench_retrieval_lm", wanted(args, ap, ("only", "samples", "tokens")))

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only:
            config = dataclasses.replace(RETRIEVAL_LM, seed=args.seed, **ABLATIONS[name])
            folder = train_llama_lm(Path(tmp) / name, config, force=True)
            meta = json.loads((folder / "attsvm_lm.json").read_text())
            model, tok = load_llama_lm(folder)
            acc = full_cache_accuracy(model, tok, n_tokens=args.tokens, n_samples=args.samples, seed=123)
            rows.append((name, meta["train_seconds"], meta["heldout_ppl"], acc))
            print(f"{name}: trained in {meta['train_seconds']:.0f} s, ppl {meta['heldout_ppl']:.1f}, {acc}", flush=True)
    tasks = list(rows[0][3])
    print(f"\n| recipe | train s | held-out ppl | {' | '.join(tasks)} | min |")
    print("|---|---|---|" + "---|" * (len(tasks) + 1))
    for name, secs, ppl, acc in rows:
        cells = " | ".join(f"{acc[t]:.2f}" for t in tasks)
        print(f"| {name} | {secs:.0f} | {ppl:.1f} | {cells} | {min(acc.values()):.2f} |")
    rec.table(
        "The retrieval LM's recipe and its ablations",
        ["recipe", "train s", "held-out ppl", *tasks, "min"],
        [[name, round(secs), round(ppl, 1), *(f"{acc[t]:.2f}" for t in tasks), f"{min(acc.values()):.2f}"]
         for name, secs, ppl, acc in rows],
        [f"full-cache accuracy over {args.samples} contexts per task at {args.tokens} tokens (seed 123)",
         f"training seed {args.seed}; each row trains a fresh model"],
    )  # fmt: skip
    rec.write()


if __name__ == "__main__":
    main()
