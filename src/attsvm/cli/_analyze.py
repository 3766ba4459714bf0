"""``attsvm analyze MODEL``: head anatomy of a real transformer (docs/spec.md §7)."""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path

from ._args import int_at_least
from ._text import count

HELP = "head anatomy of a real transformer (rank, sparsity, margins, low-rank compression, SVM view)"

log = logging.getLogger(__name__)

MAX_LENGTH = 256  # tokens per window by default
COMPRESSION_WINDOWS = 16  # windows of the low-rank compression curves by default
# Gemma 3 (RoPE, sliding layers): (windows, tokens per window, compression windows); attsvm.analysis.anatomy
ROPE_DEFAULT = (24, 1024, 4)
ROPE_QUICK = (2, 768, 1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        help="'minilm' (the bundled all-MiniLM-L6-v2), 'gemma3-270m' (Gemma 3 270M, the [llm] extra) or a local "
        "Hugging Face model folder",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke test: 4 windows of 128 tokens, 2 for compression, and an SVM view of at most 12 pairs "
        f"of 6 keys (Gemma 3: {ROPE_QUICK[0]} windows of {ROPE_QUICK[1]} tokens, {ROPE_QUICK[2]} for compression); "
        "not combinable with --max-windows, --max-length or --compression-windows",
    )
    parser.add_argument("--out", default="results/analyze", help="output folder (default: %(default)s)")
    parser.add_argument(
        "--max-windows",
        type=int_at_least(1),
        default=None,
        help=f"cap on corpus windows (default: all; Gemma 3: {ROPE_DEFAULT[0]})",
    )
    parser.add_argument(
        "--max-length",
        type=int_at_least(2),
        default=None,
        help=f"tokens per window (default: {MAX_LENGTH}; Gemma 3: {ROPE_DEFAULT[1]})",
    )
    parser.add_argument(
        "--compression-windows",
        type=int_at_least(1),
        default=None,
        help=f"windows used for the low-rank compression curves (default: {COMPRESSION_WINDOWS}; "
        f"Gemma 3: {ROPE_DEFAULT[2]})",
    )
    parser.add_argument(
        "--delta", type=float, default=1.0, help="support-key margin δ in logits (default: %(default)s)"
    )
    parser.add_argument(
        "--svm-head",
        default=None,
        metavar="LAYER:HEAD",
        help="also run the SVM view of this head (e.g. 2:5); see `attsvm.analysis.svm_view`",
    )
    parser.add_argument(
        "--svm-pairs",
        type=int_at_least(2),
        default=32,
        help="(sequence, query) pairs for the SVM view (default %(default)s: n <= d_head keeps the "
        "rank <= d_head nuclear SVM convex, since some W*_mm has rank <= n)",
    )
    parser.add_argument(
        "--svm-window", type=int_at_least(2), default=8, help="keys per query (T) for the SVM view (default: 8)"
    )
    parser.add_argument("--threads", type=int_at_least(1), default=1, help="torch CPU threads (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the SVM view's pair sampling")


def run(args: argparse.Namespace) -> int:
    from ._errors import UsageError

    if args.quick:
        options = (
            ("--max-windows", args.max_windows),
            ("--max-length", args.max_length),
            ("--compression-windows", args.compression_windows),
        )
        given = [option for option, value in options if value is not None]
        if given:
            fixed = (
                f"{ROPE_QUICK[0]} windows of {ROPE_QUICK[1]} tokens ({ROPE_QUICK[2]} for compression)"
                if args.model.lower() == "gemma3-270m"
                else "4 windows of 128 tokens (2 for compression)"
            )
            raise UsageError(f"--quick fixes {fixed}; drop --quick or {' and '.join(given)}")
    if not (math.isfinite(args.delta) and args.delta > 0):
        raise UsageError(f"--delta must be a finite margin > 0, got {args.delta}")
    if args.model.lower() not in ("minilm", "gemma3-270m") and not Path(args.model).is_dir():
        raise UsageError(
            f"MODEL must be 'minilm', 'gemma3-270m' or a local Hugging Face model folder, got {args.model!r} "
            "(no such folder)"
        )
    import torch

    from attsvm.analysis import plot_anatomy, write_anatomy_report
    from attsvm.analysis.anatomy import analyze

    from ._output import owned_folders

    torch.set_num_threads(args.threads)
    if args.svm_head is not None:  # check the head before the (long) anatomy run
        import json

        from attsvm.analysis import resolve_model
        from attsvm.analysis.svm_view import parse_head

        layer, head = parse_head(args.svm_head)
        cfg = json.loads((resolve_model(args.model) / "config.json").read_text())
        L = cfg.get("num_hidden_layers", cfg.get("n_layer"))
        H = cfg.get("num_attention_heads", cfg.get("n_head"))
        if L is not None and H is not None and not (0 <= layer < L and 0 <= head < H):
            raise ValueError(f"--svm-head must be within 0..{L - 1}:0..{H - 1}, got {args.svm_head}")
    with owned_folders((args.out, "analyze", "--out")):
        res = analyze(
            args.model,
            quick=args.quick,
            max_windows=args.max_windows,
            max_length=args.max_length,  # None: the model's default (MAX_LENGTH; Gemma 3: ROPE_DEFAULT)
            compression_windows=args.compression_windows,
            delta=args.delta,
            progress=log.isEnabledFor(logging.INFO),
            seed=args.seed,
        )
        out = res.save(args.out)
        plot_anatomy(out)
        if args.svm_head is not None:
            from attsvm.analysis.svm_view import parse_head, svm_view

            layer, head = parse_head(args.svm_head)
            view = svm_view(
                args.model, layer, head, n_pairs=args.svm_pairs, T=args.svm_window, seed=args.seed, quick=args.quick
            )
            view.save(out)
        report = write_anatomy_report(out)
    from attsvm.analysis.claims import SMOKE_TEST

    s = res.summary()
    smoke = f" ({SMOKE_TEST})" if args.quick else ""
    print(
        f"{s['model']}: {s['n_layers']}x{s['n_heads']} heads over {count(s['n_windows'], 'window')}; max rank "
        f"{s['max_rank']} (d_head {s['d_head']}); top-1>=95% share {s['overall_top1_95']:.3f}, top-3 "
        f"{s['overall_top3_95']:.3f}; {s['seconds']:.0f} s{smoke} -> {report}"
    )
    return 0
