"""``attsvm kv-compare``: kvpress's presses beside attsvm's policies on retrieval tasks (docs/spec.md §7).

Without kvpress installed the command runs attsvm's own methods only and its report says so in bold at the top;
``pip install "attsvm[kvpress]"`` (kvpress 0.5.5, transformers 5.2.x) adds kvpress's presses.
"""

from __future__ import annotations

import argparse
import logging

from ._args import int_at_least

HELP = "KV-cache compression on retrieval tasks: kvpress presses vs attsvm policies (accuracy, perplexity)"

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="256-token contexts, one seed, the quick model (CI)")
    parser.add_argument("--out", default="results/kv-compare", help="output folder (default: %(default)s)")
    parser.add_argument(
        "--lm", default=None, help="retrieval-LM checkpoint folder (default: train/reuse the cached one)"
    )
    parser.add_argument(
        "--methods", default=None, help="comma-separated subset of the methods (default: all available)"
    )
    parser.add_argument(
        "--ratios", default=None, help="comma-separated compression ratios (default: 0.25,0.5,0.75,0.9)"
    )
    parser.add_argument("--seeds", type=int, default=None, help="number of task seeds (default: 3; quick: 1)")
    parser.add_argument("--samples", type=int, default=None, help="contexts per task and seed")
    parser.add_argument(
        "--threads", type=int_at_least(1), default=1, help="torch CPU threads (default: %(default)s; the model is tiny)"
    )


def run(args: argparse.Namespace) -> int:
    import dataclasses

    import torch

    from attsvm.analysis.kv_compare import (
        QUICK_COMPARE,
        CompareConfig,
        kv_compare,
        plot_kv_compare,
        write_compare_report,
    )

    torch.set_num_threads(args.threads)
    config = QUICK_COMPARE if args.quick else CompareConfig()
    changes: dict = {}
    if args.methods is not None:
        changes["methods"] = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    if args.ratios is not None:
        try:
            changes["ratios"] = tuple(float(r) for r in args.ratios.split(","))
        except ValueError as exc:
            raise ValueError(f"--ratios must be comma-separated numbers in [0, 1), got {args.ratios!r}") from exc
    if args.seeds is not None:
        if args.seeds < 1:
            raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
        changes["seeds"] = tuple(range(args.seeds))
    if args.samples is not None:
        changes["n_samples"] = args.samples
    config = dataclasses.replace(config, **changes)
    res = kv_compare(config, lm_dir=args.lm, progress=log.isEnabledFor(logging.INFO))
    out = res.save(args.out)
    plot_kv_compare(out)
    report = write_compare_report(out)
    status = "COMPARISON VOID (full-cache accuracy below the bar)" if res.meta["void"] else "full-cache gate passed"
    only = "; attsvm's methods only (kvpress not installed)" if res.meta["skipped_methods"] else ""
    print(f"kv-compare: {len(res.meta['methods'])} methods in {res.meta['seconds']:.0f} s, {status}{only} -> {report}")
    return 0
