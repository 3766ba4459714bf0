"""``attsvm lm-train``: train (or reuse) the small GPT-2-style LM on the pydoc corpus (docs/spec.md §7)."""

from __future__ import annotations

import argparse
import logging

from ._args import int_at_least

HELP = "train the small GPT-2-style causal LM on the pydoc corpus (seeded, cached)"

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None, help="checkpoint folder (default: ~/.cache/attsvm/lm-<hash>)")
    parser.add_argument("--quick", action="store_true", help="a 2-layer model trained for 150 steps")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: 600; quick: 150)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="retrain even if a matching checkpoint exists")
    parser.add_argument("--threads", type=int_at_least(1), default=2, help="torch CPU threads (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import json
    from pathlib import Path

    from ._output import owned_folders

    # --out: checked and locked before anything is trained (default: the cache folder named by the settings)
    with owned_folders(*([] if args.out is None else [(args.out, "lm-train", "--out")])):
        import torch

        from attsvm.analysis.lm import QUICK_LM, LMConfig, train_lm

        torch.set_num_threads(args.threads)
        config = QUICK_LM if args.quick else LMConfig()
        changes = {"seed": args.seed}
        if args.steps is not None:
            changes["steps"] = args.steps
        config = dataclasses.replace(config, **changes)
        folder = train_lm(args.out, config, force=args.force, progress=log.isEnabledFor(logging.INFO))
    meta = json.loads((Path(folder) / "attsvm_lm.json").read_text())
    print(
        f"LM in {folder}: {meta['n_params']} parameters, held-out perplexity {meta['heldout_ppl']:.2f} "
        f"(trained in {meta['seconds']:.0f} s)"
    )
    return 0
