"""``attsvm plot DIR``: redraw a run's figures and report from its saved data (no recomputation)."""

from __future__ import annotations

import argparse

HELP = (
    "redraw the figures and report of a reproduce run from its saved data; a run stopped part-way is "
    "reported as 'k of N trials' with its claims not evaluated (exit 4)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", nargs="+", help="run folder(s) written by `attsvm reproduce`")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from attsvm.experiments import plot_run

    from ._errors import EXIT_INCOMPLETE, EXIT_OK, InputError, UsageError

    for d in args.directory:  # every path checked before any figure is redrawn
        if not Path(d).exists():
            raise UsageError(f"DIRECTORY {d!r} does not exist; expected a run folder written by `attsvm reproduce`")
        if Path(d).is_file():
            raise InputError(f"DIRECTORY {d!r} is a file; expected a run folder written by `attsvm reproduce`")
    code = EXIT_OK
    for d in args.directory:
        r = plot_run(d)
        for f in r.figures:
            print(f"figure: {f}")
        print(f"report: {r.report}")
        if not r.complete:
            res = r.results
            print(
                f"{r.name}: incomplete run, {res['n_trials_done']} of {res['n_trials']} trials; claims "
                f"{', '.join(res.get('not_evaluated', []))} not evaluated (rerun the command in config.json "
                "to finish it)"
            )
            code = EXIT_INCOMPLETE
    return code
