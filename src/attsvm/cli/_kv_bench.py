"""``attsvm kv-bench``: KV-cache eviction policies against the budget on the LM and MiniLM (issue #5 part 4)."""

from __future__ import annotations

import argparse
import logging

HELP = "compare KV-cache eviction policies (svm margin, H2O, TOVA, StreamingLLM, recent, random) vs budget"

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="tiny LM, short sequences, 12 topics (CI)")
    parser.add_argument("--out", default="results/kv-bench", help="output folder (default: %(default)s)")
    parser.add_argument("--lm", default=None, help="LM checkpoint folder (default: train/reuse the cached one)")
    parser.add_argument("--budgets", default="0.05,0.1,0.25,0.5", help="fractions of the context (default: %(default)s)")
    parser.add_argument("--policies", default=None, help="comma-separated subset of the policies (default: all)")
    parser.add_argument("--n-seq", type=int, default=16, help="held-out LM sequences (default: %(default)s)")
    parser.add_argument("--seq-len", type=int, default=None,
                        help="tokens per LM sequence (default: the LM's training context, 128)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random policy")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    import torch

    from attsvm.analysis.kv_bench import kv_bench, plot_kv_bench, write_kv_report
    from attsvm.analysis.kv_cache import POLICIES

    torch.set_num_threads(max(1, int(args.threads)))
    try:
        budgets = tuple(float(b) for b in args.budgets.split(","))
    except ValueError as exc:
        raise ValueError(f"--budgets must be comma-separated fractions, got {args.budgets!r}") from exc
    policies = POLICIES if args.policies is None else tuple(p.strip() for p in args.policies.split(","))
    res = kv_bench(quick=args.quick, lm_dir=args.lm, budgets=budgets, policies=policies, n_seq=args.n_seq,
                   seq_len=args.seq_len, seed=args.seed, progress=log.isEnabledFor(logging.INFO))
    out = res.save(args.out)
    plot_kv_bench(out)
    report = write_kv_report(out)
    print(f"kv-bench: {len(policies)} policies x {len(budgets)} budgets in {res.seconds:.0f} s -> {report}")
    return 0
