"""``attsvm train``: train one-layer attention on generated instances and compare with the SVMs (docs/spec.md §4–5)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HELP = "train 1-layer attention by (normalized) GD on generated instances; report selected tokens, SVM correlations"


def _lr(value: str) -> float | str:
    if value == "auto":
        return value
    try:
        lr = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--lr must be 'auto' or a positive number, got {value!r}") from None
    if not lr > 0:
        raise argparse.ArgumentTypeError(f"--lr must be > 0, got {value!r}")
    return lr


def add_arguments(parser: argparse.ArgumentParser) -> None:
    data = parser.add_argument_group("instances (linear head: the published recipe; relu/multiclass: Gaussian)")
    data.add_argument("--n", type=int, default=6, help="sequences (default 6)")
    data.add_argument("--T", type=int, default=8, help="tokens per sequence (default 8)")
    data.add_argument("--d", type=int, default=10, help="embedding dimension (default 10)")
    data.add_argument(
        "--head", choices=("linear", "relu", "multiclass"), default="linear", help="prediction head (default linear)"
    )
    data.add_argument(
        "--classes", type=int, default=None, help="classes of the multiclass head (default 3); needs --head multiclass"
    )
    data.add_argument("--self-attention", action="store_true", help="z_i = x_{i,0} instead of cross-attention")
    data.add_argument(
        "--runs", type=int, default=1, help="R instances, seeds SEED..SEED+R-1 (each run's init uses its instance seed)"
    )
    data.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    tr = parser.add_argument_group("training")
    tr.add_argument("--param", choices=("W", "KQ"), default="W", help="train W or (K, Q) (default W)")
    tr.add_argument("--m", type=int, default=None, help="inner dimension of K, Q (default d); needs --param KQ")
    tr.add_argument("--steps", type=int, default=2000, help="GD steps (default 2000)")
    tr.add_argument(
        "--lr", type=_lr, default="auto", help="step size, or 'auto' (0.1 normalized, 1/L_W plain; default auto)"
    )
    norm = tr.add_mutually_exclusive_group()
    norm.add_argument(
        "--normalized",
        dest="normalized",
        action="store_true",
        default=True,
        help="normalized GD, the paper's (default)",
    )
    norm.add_argument("--plain", dest="normalized", action="store_false", help="plain GD")
    tr.add_argument(
        "--init",
        choices=("pytorch", "zeros", "gaussian"),
        default="pytorch",
        help="initialisation (default: the published nn.Linear init)",
    )
    tr.add_argument("--record-every", type=int, default=1, help="history stride (default 1)")
    tr.add_argument(
        "--device",
        default=None,
        help="torch device, e.g. cpu or cuda:0 (default cpu); it must be available on this machine",
    )
    tr.add_argument("--no-svm", action="store_true", help="skip the SVM comparisons (training only)")
    out = parser.add_argument_group("output")
    out.add_argument(
        "--save",
        type=Path,
        default=None,
        metavar="PATH",
        help="save the trajectory to a file: PATH.json (history + summary) or PATH.npz (arrays)",
    )


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from .._validation import check_fits_memory
    from ..datasets import paper_instance, random_instance
    from ..train import train
    from ._errors import UsageError

    if args.save is not None and (args.save.is_dir() or args.save.suffix not in (".json", ".npz")):
        raise UsageError(
            f"--save must be a file path ending in .json or .npz, got {str(args.save)!r}"
            + (" (a folder)" if args.save.is_dir() else "")
        )
    if args.m is not None and args.param != "KQ":
        raise UsageError(
            f"--m {args.m} needs --param KQ (it is the inner dimension of K, Q; --param {args.param} trains W "
            "directly): add --param KQ or drop --m"
        )
    if args.classes is not None and args.head != "multiclass":
        raise UsageError(
            f"--classes {args.classes} needs --head multiclass (the {args.head} head has no classes): "
            "add --head multiclass or drop --classes"
        )
    if args.device is not None:
        _check_device(args.device)
    if args.runs < 1:
        raise ValueError(f"--runs must be >= 1, got {args.runs}")
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    # every run's instance (float64, with the validated copy) and its iterate and gradient (d × d), up front: a
    # request past the machine's memory is refused before the first instance is built
    check_fits_memory(
        float(args.runs) * (16.0 * args.n * (args.T + 1) * args.d + 32.0 * args.d * args.d + 8.0 * args.steps),
        f"--runs {args.runs} instances at --n {args.n}, --T {args.T}, --d {args.d}",
    )
    seeds = list(range(args.seed, args.seed + args.runs))
    if args.head == "linear":
        problems = [paper_instance(args.n, args.T, args.d, seed=s, self_attention=args.self_attention) for s in seeds]
    else:
        problems = [
            random_instance(
                args.n,
                args.T,
                args.d,
                seed=s,
                head=args.head,
                n_classes=3 if args.classes is None else args.classes,
                self_attention=args.self_attention,
            )
            for s in seeds
        ]
    save_W = args.save is not None
    res = train(
        problems,
        param=args.param,
        steps=args.steps,
        lr=args.lr,
        normalized=args.normalized,
        init=args.init,
        m=args.m,
        seed=seeds,
        record_every=args.record_every,
        record_W=save_W,
        device=args.device,
    )
    print(
        f"trained {res.n_runs} run(s): param={res.param} steps={res.steps} "
        f"{'normalized' if res.normalized else 'plain'} GD, loss={res.loss}, "
        f"n={args.n} T={args.T} d={args.d} head={args.head} ({res.wall_time:.2f} s)"
    )
    summary: list[dict] = []
    kinds: dict[str, int] = {}
    for r in range(res.n_runs):
        row = {
            "run": r,
            "seed": seeds[r],
            "selected": res.selected[r].tolist(),
            "final_loss": float(res.final_loss[r]),
            "W_norm": float(res.history["W_norm"][r, -1]),
            "min_max_prob": float(res.history["max_prob"][r, -1].min()),
        }
        summary.append(row)
    if not args.no_svm:
        from ..diagnostics import convergence_type, svm_equivalence

        norm = "fro" if res.param == "W" else "nuc"
        for r, row in enumerate(summary):
            rep = convergence_type(res.problem(r), res.W[r], norm=norm)
            row.update(
                kind=rep.kind,
                corr_fro=_f(rep.corr_fro),
                corr_nuc=_f(rep.corr_nuc),
                optimal=rep.optimal.tolist(),
                locally_optimal=rep.locally_optimal,
            )
            kinds[rep.kind] = kinds.get(rep.kind, 0) + 1
            if args.head != "linear" and res.param == "W":
                eq = svm_equivalence(res, r)
                row.update(
                    O_sizes=eq.O.sum(axis=1).tolist(),
                    selective=eq.selective,  # False: every O_i is the whole sequence, W^eq = 0
                    corr_eq=_f(eq.corr_eq),
                    scale=_f(eq.scale),
                    residual=_f(eq.residual),
                )
    cols = "run  selected tokens          loss       ‖W‖     min max-prob"
    if not args.no_svm:
        cols += "  corr_fro  corr_nuc  type"
    print(cols)
    for row in summary:
        line = (
            f"{row['run']:>3}  {row['selected']!s:<24} {row['final_loss']:.3e}  {row['W_norm']:8.2f}  "
            f"{row['min_max_prob']:.6f}"
        )
        if "kind" in row:
            line += f"  {_s(row['corr_fro'])}  {_s(row['corr_nuc'])}  {row['kind']}"
        if "corr_eq" in row:
            corr_eq = _s(row["corr_eq"]).strip() if row["selective"] else "n/a (not selective yet)"
            line += f"  |O_i|={row['O_sizes']} corr(W, W^eq)={corr_eq}"
        print(line)
    if kinds:
        print(
            "convergence types (docs/spec.md §4, tau=0.99): " + ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items()))
        )
    if args.save is not None:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        if args.save.suffix == ".json":
            payload = {
                "settings": {
                    "param": res.param,
                    "steps": res.steps,
                    "normalized": res.normalized,
                    "loss": res.loss,
                    "init": res.init,
                    "penalty": res.penalty,
                    "m": res.m,
                    "seeds": seeds,
                    "lr": res.lr if isinstance(res.lr, str) else res.lr.tolist(),
                    "n": args.n,
                    "T": args.T,
                    "d": args.d,
                    "head": args.head,
                    "self_attention": args.self_attention,
                },
                "summary": summary,
                "history": {k: np.asarray(v).tolist() for k, v in res.history.items()},
                "W": res.W.tolist(),
            }
            args.save.write_text(json.dumps(payload, allow_nan=False))
        else:
            np.savez_compressed(args.save, **res.trajectory_arrays())  # type: ignore[arg-type]
        print(f"wrote {args.save}")
    return 0


def _check_device(name: str) -> None:
    """A usage error unless ``name`` is a torch device that this machine has."""
    import torch

    from ._errors import UsageError

    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        raise UsageError(f"--device {name!r} is not a torch device (e.g. cpu, cuda, cuda:0, mps)") from None
    available = {
        "cpu": True,
        "cuda": torch.cuda.is_available(),
        "meta": False,
        "mps": bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()),
    }
    if not available.get(dev.type, False):
        raise UsageError(
            f"--device {name!r} is not available on this machine"
            + (" (torch.cuda.is_available() is False)" if dev.type == "cuda" else "")
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise UsageError(f"--device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")


def _f(x: float) -> float | None:
    import math

    return None if x is None or not math.isfinite(x) else float(x)


def _s(x: float | None) -> str:
    return "     n/a" if x is None else f"{x:8.4f}"
