"""``attsvm kv-bench``: KV-cache eviction policies against the budget on the LM and MiniLM (docs/spec.md §7).

``--quick`` fixes the LM evaluation to 2 sequences of 64 tokens; combining it with ``--n-seq`` or
``--seq-len`` is a usage error rather than a silent override. Such a run is a smoke test: its report and
``kv_bench.json`` say so and name no winners.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from ._args import int_at_least
from ._text import count

HELP = "compare KV-cache eviction policies (svm_margin, h2o, tova, streaming, recent, random) against the budget"

log = logging.getLogger(__name__)

N_SEQ = 16  # held-out LM sequences by default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke test, not evidence: tiny LM, short sequences, 12 topics; the report names no winners",
    )
    parser.add_argument("--out", default="results/kv-bench", help="output folder (default: %(default)s)")
    parser.add_argument("--lm", default=None, help="LM checkpoint folder (default: train/reuse the cached one)")
    parser.add_argument(
        "--budgets", default="0.05,0.1,0.25,0.5", help="fractions of the context (default: %(default)s)"
    )
    parser.add_argument(
        "--policies",
        default=None,
        help="comma-separated subset of svm_margin, h2o, tova, streaming, recent, random (default: all; svm and "
        "svm-margin are accepted for svm_margin)",
    )
    parser.add_argument(
        "--n-seq",
        type=int_at_least(1),
        default=None,
        help=f"held-out LM sequences (default: {N_SEQ}; --quick: 2, not combinable with --n-seq)",
    )
    parser.add_argument(
        "--seq-len",
        type=int_at_least(2),
        default=None,
        help="tokens per LM sequence (default: the LM's training context, 128; --quick: 64, "
        "not combinable with --seq-len)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random policy")
    parser.add_argument("--threads", type=int_at_least(1), default=1, help="torch CPU threads (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    from ._errors import InputError, UsageError
    from ._output import owned_folders

    if args.quick and (args.n_seq is not None or args.seq_len is not None):
        given = " and ".join(f for f, v in (("--n-seq", args.n_seq), ("--seq-len", args.seq_len)) if v is not None)
        raise UsageError(f"--quick fixes 2 sequences of 64 tokens; drop --quick or {given}")
    try:
        budgets = tuple(float(b) for b in args.budgets.split(","))
    except ValueError as exc:
        raise UsageError(f"--budgets must be comma-separated fractions, got {args.budgets!r}") from exc
    from attsvm._folders import check_output_folder, folder_owner, refuse_foreign

    if args.lm is not None:
        if Path(args.lm).resolve() == Path(args.out).resolve():
            raise UsageError("--lm and --out must be different folders")
        owner = folder_owner(args.lm)
        if owner not in (None, "lm-train"):
            what = "files of another program" if owner == "another program" else f"results of `attsvm {owner}`"
            raise InputError(
                f"--lm {args.lm!r} is not an LM checkpoint folder: it holds {what}, which training "
                "an LM there would overwrite. Point --lm at an `attsvm lm-train` folder or a new one"
            )
    if Path(args.out).exists():  # refused before the (long) benchmark; locked and claimed when saving
        check_output_folder(args.out)
        refuse_foreign(args.out, "kv-bench")
    import torch

    from attsvm.analysis.kv_bench import POLICY_NAMES, SMOKE_TEST, kv_bench, plot_kv_bench, policy_name, write_kv_report

    policies = POLICY_NAMES
    if args.policies is not None:
        policies = tuple(dict.fromkeys(policy_name(p.strip()) for p in args.policies.split(",") if p.strip()))
        unknown = [p for p in policies if p not in POLICY_NAMES]
        if unknown or not policies:
            raise UsageError(
                f"--policies must be a comma-separated subset of {', '.join(POLICY_NAMES)}, got {args.policies!r}"
            )
    torch.set_num_threads(args.threads)
    res = kv_bench(
        quick=args.quick,
        lm_dir=args.lm,
        budgets=budgets,
        policies=policies,
        n_seq=N_SEQ if args.n_seq is None else args.n_seq,
        seq_len=args.seq_len,
        seed=args.seed,
        progress=log.isEnabledFor(logging.INFO),
    )
    with owned_folders((args.out, "kv-bench", "--out")) as (out,):
        out = res.save(out)
        plot_kv_bench(out)
        report = write_kv_report(out)
    sizes = f"{count(len(policies), 'policy', 'policies')} x {count(len(budgets), 'budget')}"
    smoke = f" ({SMOKE_TEST})" if res.smoke_test else ""
    print(f"kv-bench: {sizes} in {res.seconds:.0f} s{smoke} -> {report}")
    return 0
