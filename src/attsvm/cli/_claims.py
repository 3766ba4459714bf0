"""``attsvm claims``: the theory's claims about real models, each measured with a verdict (docs/spec.md §7).

``--quick`` is a smoke test: the numbers are measured and written, every verdict reads "smoke test: settings too
small for a verdict", and ``results.json`` says ``"smoke_test": true``.
"""

from __future__ import annotations

import argparse
import logging

from ._args import int_at_least

HELP = "measure the texts' claims on real models (sparsity, sinks, support keys, low rank, serving) with verdicts"

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--models",
        default="minilm,gpt2-tiny,llama-tiny",
        help="comma-separated: minilm, gpt2-tiny (the in-repo GPT-2 LM), llama-tiny (the in-repo retrieval "
        "Llama if cached, else a seeded random-init Llama, labelled as such), gemma3-270m (Gemma 3 270M, the "
        "[llm] extra; windows of 512-4096 tokens, per layer type) or local model folders (default: %(default)s)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke test, not evidence (no verdicts): 4 short windows per model, barely trained LMs; gemma3-270m: "
        "2 x 512 and 2 x 1024 tokens (about 1 minute)",
    )
    parser.add_argument("--out", default="results/claims", help="output folder (default: %(default)s)")
    parser.add_argument(
        "--max-windows",
        type=int,
        default=None,
        help="corpus windows per model (default 48; quick 4); gemma3-270m: per window length (default 8, 8, 3, 2 "
        "at 512, 1024, 2048, 4096 tokens)",
    )
    parser.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="tokens per window (default 256; quick 64); gemma3-270m: the longest window length (default 4096)",
    )
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    parser.add_argument("--threads", type=int_at_least(1), default=1, help="torch CPU threads (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    from ._errors import UsageError
    from ._output import owned_folders

    models = [m.strip() for m in str(args.models).split(",") if m.strip()]
    if not models:
        raise UsageError("--models must name at least one model")
    if args.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {args.seed}")
    with owned_folders((args.out, "claims", "--out")) as (out,):
        import torch

        from attsvm.analysis.claims import run_claims

        torch.set_num_threads(args.threads)
        res = run_claims(
            models, out=out, quick=args.quick, max_windows=args.max_windows, max_length=args.max_length, seed=args.seed
        )
    for r in res["records"]:
        print(
            f"{r['model']:12s} {r['claim']:14s} {r['value']:.3g} [{r['ci'][0]:.3g}, {r['ci'][1]:.3g}]  {r['verdict']}"
        )
    print(f"report: {out / 'report.md'}")
    return 0
