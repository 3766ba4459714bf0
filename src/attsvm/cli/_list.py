"""``attsvm list``: the reproducible experiments, their claims and settings."""

from __future__ import annotations

import argparse
import json

HELP = "list the reproducible experiments (docs/spec.md §6) with their claims and settings"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="show one experiment in full")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    from attsvm.experiments import experiment_names, get_experiment

    names = [args.name] if args.name else experiment_names(studies=True)
    exps = [get_experiment(n) for n in names]
    if args.json:
        print(
            json.dumps(
                [
                    {"name": e.name, "title": e.title, "claims": e.claims, "defaults": e.defaults, "quick": e.quick}
                    for e in exps
                ],
                indent=2,
            )
        )
        return 0
    for e in exps:
        print(f"{e.name}: {e.title}")
        if args.name:
            print(f"  {e.describe()}")
            for cid, text in e.claims.items():
                print(f"  claim {cid}: {text}")
        print("  settings: " + ", ".join(f"{k}={v}" for k, v in e.defaults.items()))
        print("  --quick:  " + ", ".join(f"{k}={v}" for k, v in e.quick.items()))
    if not args.name:
        print("\nrun one with: attsvm reproduce NAME [--quick] [--out DIR] [--workers N] [--set key=value]")
    return 0
