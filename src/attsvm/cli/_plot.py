"""``attsvm plot DIR``: redraw a run's figures and report from its saved data (no recomputation)."""

from __future__ import annotations

import argparse

HELP = "redraw the figures and report of a reproduce run from its saved data"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", nargs="+", help="run folder(s) written by `attsvm reproduce`")


def run(args: argparse.Namespace) -> int:
    from attsvm.experiments import plot_run

    for d in args.directory:
        r = plot_run(d)
        for f in r.figures:
            print(f"figure: {f}")
        print(f"report: {r.report}")
    return 0
