"""``attsvm solve``: solve one attention SVM and print its certificate (docs/spec.md §3)."""

from __future__ import annotations

import argparse
import json
import zipfile
from pathlib import Path
from typing import Any

# the generated instance's shape and seed when the options are not given
GENERATED = {"n": 6, "T": 8, "d": 10, "seed": 0}

HELP = "solve the attention SVM of a generated (paper recipe) or saved instance and print its certificate"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_argument_group("instance (generated with the published data recipe unless --input)")
    src.add_argument(
        "--input",
        type=Path,
        default=None,
        metavar="FILE.npz",
        help="load an instance saved by AttentionProblem.to_npz (arrays X, y, v, Z or query_index)",
    )
    # (defaults None, filled in by run: an option given together with --input is an error, not ignored)
    src.add_argument("--n", type=int, default=None, help=f"sequences (default {GENERATED['n']})")
    src.add_argument("--T", type=int, default=None, help=f"tokens per sequence (default {GENERATED['T']})")
    src.add_argument("--d", type=int, default=None, help=f"embedding dimension (default {GENERATED['d']})")
    src.add_argument(
        "--seed", type=int, default=None, help=f"seed of the published recipe (default {GENERATED['seed']})"
    )
    src.add_argument("--self-attention", action="store_true", help="z_i = x_{i,q} instead of cross-attention queries")
    src.add_argument(
        "--query-index", type=int, default=None, help="q for --self-attention (default 0); needs --self-attention"
    )
    svm = parser.add_argument_group("solver")
    svm.add_argument(
        "--tokens", type=str, default=None, help="comma-separated token selection alpha (default: the optimal tokens)"
    )
    svm.add_argument("--norm", choices=("fro", "nuc"), default="fro", help="Frobenius or nuclear norm (default fro)")
    svm.add_argument("--rank", type=int, default=None, help="rank constraint (nuclear norm only)")
    svm.add_argument("--backend", choices=("auto", "cvxpy"), default="auto", help="our solvers or the cvxpy reference")
    svm.add_argument("--tol", type=float, default=1e-9, help="certificate tolerance (default 1e-9)")
    svm.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the full result as JSON")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from ..datasets import paper_instance
    from ..problem import AttentionProblem
    from ..svm import AttentionSVM
    from ._errors import InputError, UsageError

    if args.query_index is not None and not args.self_attention and args.input is None:
        raise UsageError(
            f"--query-index {args.query_index} needs --self-attention (cross-attention has no query token); "
            "add --self-attention or drop --query-index"
        )
    if args.json is not None and args.json.is_dir():
        raise UsageError(f"--json must be a file path, got the folder {str(args.json)!r}")
    if args.input is not None:
        given = [f"--{k.replace('_', '-')}" for k in (*GENERATED, "query_index") if getattr(args, k) is not None]
        given += ["--self-attention"] if args.self_attention else []
        if given:
            raise UsageError(
                f"--input loads a saved instance; {', '.join(given)} "
                f"{'describes' if len(given) == 1 else 'describe'} a generated one: drop "
                f"{'it' if len(given) == 1 else 'them'} or drop --input"
            )
        if not args.input.exists():
            raise UsageError(f"--input {str(args.input)!r} does not exist")
        if not args.input.is_file():
            raise InputError(
                f"--input {str(args.input)!r} is a folder; expected a .npz file saved by AttentionProblem.to_npz"
            )
        try:
            problem = AttentionProblem.from_npz(args.input)
        except (OSError, EOFError, ValueError, TypeError, KeyError, zipfile.BadZipFile) as exc:
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise InputError(
                f"--input {str(args.input)!r} is not a readable attsvm instance (.npz with arrays "
                f"X, y and v, Z or query_index): {reason}"
            ) from None
        source: dict[str, Any] = {"input": str(args.input)}
    else:
        for k, v in GENERATED.items():
            if getattr(args, k) is None:
                setattr(args, k, v)
        query_index = 0 if args.query_index is None else args.query_index
        problem = paper_instance(
            args.n, args.T, args.d, seed=args.seed, self_attention=args.self_attention, query_index=query_index
        )
        source = {
            "recipe": "paper_instance",
            "n": args.n,
            "T": args.T,
            "d": args.d,
            "seed": args.seed,
            "self_attention": args.self_attention,
            "query_index": query_index if args.self_attention else None,
        }
    tokens = None
    if args.tokens is not None:
        try:
            tokens = np.array([int(t) for t in args.tokens.split(",")], dtype=np.int64)
        except ValueError:
            raise ValueError(f"--tokens must be comma-separated integers, got {args.tokens!r}") from None
    svm = AttentionSVM(args.norm, rank=args.rank, backend=args.backend, tol=args.tol).fit(problem, tokens)
    print(f"instance: {problem!r}")
    print(svm.summary())
    if args.json is not None:
        out = {"instance": source, "result": svm.to_dict()}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1, allow_nan=False))
        print(f"wrote {args.json}")
    return 0 if svm.status_ in ("optimal", "infeasible") else 1  # (certified either way; anything else: 1)
