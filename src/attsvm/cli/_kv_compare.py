"""``attsvm kv-compare``: kvpress's presses beside attsvm's policies on retrieval tasks (docs/spec.md §7).

Without kvpress installed the command runs attsvm's own methods only and its report says so in bold at the top;
the kvpress environment (``make install-kvpress`` in a clone: kvpress 0.5.5, transformers 5.2.x) adds kvpress's
presses.

Method names: the SV-margin methods are ``svm_margin_press``, ``svm_margin_cache`` and ``svm_margin_oneshot``
(retrieval-llama; ``svm_cache`` and ``svm_oneshot`` are accepted too) and ``svm_margin`` (gemma3-270m; ``svm``
is accepted too); hyphens may stand for underscores. ``--quick`` runs are smoke tests: no verdicts.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from ._args import int_at_least
from ._text import count

HELP = "KV-cache compression on retrieval tasks: kvpress presses vs attsvm policies (accuracy, perplexity)"

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="retrieval-llama",
        choices=("retrieval-llama", "gemma3-270m"),
        help="retrieval-llama (the in-repo Llama and its word tasks) or gemma3-270m (Gemma 3 270M, the [llm] "
        "extra; natural-language RULER tasks at 1,024-4,096 tokens, every press from one prefill per context; run "
        "it in the kvpress environment) (default: %(default)s)",
    )
    parser.add_argument(
        "--query-aware", action="store_true", help="gemma3-270m: the question is compressed with the context"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke test, not evidence (no verdicts): 256-token contexts, one seed, the quick model; gemma3-270m: "
        "2 tasks x 2 contexts of 1,024 tokens at ratio 0.5",
    )
    parser.add_argument("--out", default="results/kv-compare", help="output folder (default: %(default)s)")
    parser.add_argument(
        "--lm", default=None, help="retrieval-LM checkpoint folder (default: train/reuse the cached one)"
    )
    parser.add_argument(
        "--methods",
        default=None,
        help="comma-separated subset of the methods (default: all available), e.g. svm_margin_cache,h2o_cache,"
        "tova_cache (retrieval-llama) or svm_margin,svm_support,h2o,snapkv (gemma3-270m)",
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
        METHOD_ALIASES,
        METHODS,
        QUICK_COMPARE,
        SMOKE_TEST,
        CompareConfig,
        kv_compare,
        plot_kv_compare,
        write_compare_report,
    )

    torch.set_num_threads(args.threads)
    if args.model == "gemma3-270m":
        return _run_gemma(args)
    config = QUICK_COMPARE if args.quick else CompareConfig()
    changes: dict = {}
    if args.methods is not None:
        changes["methods"] = _methods(args.methods, METHODS, METHOD_ALIASES)
    if args.ratios is not None:
        changes["ratios"] = _ratios(args.ratios)
    if args.seeds is not None:
        if args.seeds < 1:
            raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
        changes["seeds"] = tuple(range(args.seeds))
    if args.samples is not None:
        changes["n_samples"] = args.samples
    config = dataclasses.replace(config, **changes)
    res = kv_compare(config, lm_dir=args.lm, progress=log.isEnabledFor(logging.INFO))
    res.meta["smoke_test"] = bool(args.quick)  # (the report then gives no verdicts)
    out = res.save(args.out)
    plot_kv_compare(out)
    report = write_compare_report(out)
    status = "COMPARISON VOID (full-cache accuracy below the bar)" if res.meta["void"] else "full-cache gate passed"
    only = "; attsvm's methods only (kvpress not installed)" if res.meta["skipped_methods"] else ""
    smoke = f"; {SMOKE_TEST}" if args.quick else ""
    methods = count(len(res.meta["methods"]), "method")
    print(f"kv-compare: {methods} in {res.meta['seconds']:.0f} s, {status}{only}{smoke} -> {report}")
    return 0


def _methods(text: str, known: Sequence[str], aliases: dict[str, str]) -> tuple[str, ...]:
    """``--methods``: names (hyphens for underscores and ``aliases`` accepted) checked against ``known``."""
    from ._errors import UsageError

    names = []
    for part in text.split(","):
        name = part.strip().replace("-", "_")
        if name:
            names.append(aliases.get(name, name))
    if not names or any(n not in known for n in names):
        listed = ", ".join(known)
        raise UsageError(f"--methods must be a comma-separated subset of {listed}, got {text!r}")
    return tuple(dict.fromkeys(names))


def _ratios(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(r) for r in text.split(","))
    except ValueError as exc:
        raise ValueError(f"--ratios must be comma-separated numbers in [0, 1), got {text!r}") from exc


def _run_gemma(args: argparse.Namespace) -> int:
    import dataclasses

    from attsvm.analysis.claims import SMOKE_TEST
    from attsvm.analysis.kv_gemma import (
        ATTSVM_PRESSES,
        KVPRESS_PRESSES,
        QUICK_GEMMA,
        GemmaCompareConfig,
        run_gemma_compare,
    )

    from ._errors import UsageError
    from ._output import owned_folders

    if args.lm is not None or args.seeds is not None:
        raise UsageError("--lm and --seeds apply to --model retrieval-llama; gemma3-270m uses --samples")
    config = QUICK_GEMMA if args.quick else GemmaCompareConfig()
    changes: dict = {"query_aware": bool(args.query_aware)}
    if args.methods is not None:
        aliases = {"svm": "svm_margin"}
        changes["methods"] = _methods(args.methods, [*KVPRESS_PRESSES, *ATTSVM_PRESSES], aliases)
    if args.ratios is not None:
        changes["ratios"] = _ratios(args.ratios)
    if args.samples is not None:
        if args.samples < 1:
            raise ValueError(f"--samples must be >= 1, got {args.samples}")
        changes["contexts"] = args.samples
    config = dataclasses.replace(config, **changes)
    with owned_folders((args.out, "kv-compare", "--out")) as (out,):
        res = run_gemma_compare(out, config)
    wins = sum(v["verdict"] == "win" for v in res["verdicts"])
    ties = sum(v["verdict"] == "tie" for v in res["verdicts"])
    losses = sum(v["verdict"] == "loss" for v in res["verdicts"])
    tally = (
        SMOKE_TEST
        if args.quick
        else f"attsvm vs the best other press: {count(wins, 'win')}, {count(ties, 'tie')}, "
        f"{count(losses, 'loss', 'losses')}"
    )
    failed = count(len(res["errors"]), "press", "presses")
    print(f"kv-compare gemma3-270m: {res['seconds']:.0f} s; {tally}; {failed} could not run -> {out / 'report.md'}")
    return 0
