"""``attsvm`` command line: thin — parse, call the library, write results.

Each subcommand lives in its own module ``attsvm.cli._<name>`` exposing ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``. Modules import heavy dependencies (torch,
transformers) inside ``run`` so that ``attsvm --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

__all__ = ["main"]

# (command, module) in the order shown by --help
COMMANDS: tuple[tuple[str, str], ...] = (
    ("solve", "_solve"),
    ("train", "_train"),
    ("list", "_list"),
    ("reproduce", "_reproduce"),
    ("plot", "_plot"),
    ("analyze", "_analyze"),
    ("kv-bench", "_kv_bench"),
    ("lm-train", "_lm_train"),
    ("kv-compare", "_kv_compare"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attsvm",
        description="Transformers as Support Vector Machines: attention SVMs, training, reproductions.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS:
        try:
            mod = importlib.import_module(f"attsvm.cli.{module}")
        except ModuleNotFoundError as exc:  # a command whose module is not part of this build
            if exc.name != f"attsvm.cli.{module}":
                raise
            continue
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        # bad input: a clear message, no traceback (use -vv to see it)
        if args.verbose >= 2:
            raise
        print(f"attsvm {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
