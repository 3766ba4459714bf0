"""``attsvm`` command line: thin — parse, call the library, write results.

Each subcommand lives in its own module ``attsvm.cli._<name>`` exposing ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``. Modules import heavy and optional dependencies
(torch, pandas, matplotlib, transformers) inside ``run``, so that ``attsvm --help``, ``solve`` and
``train`` work on the core install.

Errors are handled once, in :func:`main`: every failure is one line on stderr and an exit code of
:mod:`attsvm.cli._errors` (listed once, in ``attsvm --help``; each command's help points there); ``-vv``
prints the traceback first and keeps the exit code.

``-v`` / ``--verbose`` may be given before or after the command (``attsvm -v kv-bench`` = ``attsvm kv-bench
-v``): more logging, and, for the commands that run real transformers (:data:`QUIET_COMMANDS`), the warnings,
log messages and progress bars of the libraries underneath, which are otherwise silenced
(:mod:`attsvm.cli._quiet`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import signal
import sys
import traceback
from collections.abc import Sequence

from ._errors import COMMAND_EPILOG, EPILOG, EXIT_USAGE, Terminated, exit_code_for, message_for
from ._quiet import third_party_quiet

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
    ("claims", "_claims"),
)

# the commands whose third-party warnings, log messages and progress bars are silenced unless -v is given
QUIET_COMMANDS: frozenset[str] = frozenset({"analyze", "kv-bench", "lm-train", "kv-compare", "claims"})

VERBOSE_HELP = (
    f"more logging; for {', '.join(n for n, _ in COMMANDS if n in QUIET_COMMANDS)} also the warnings and progress "
    "bars of transformers, torch and the other libraries underneath (silenced otherwise); -vv: debug logging and "
    "tracebacks. Also accepted after the command"
)
QUIET_VERBOSE_HELP = (
    "more logging, and the warnings and progress bars of transformers, torch and the other libraries underneath "
    "(silenced otherwise); -vv: debug logging and tracebacks (same as attsvm -v)"
)
PLAIN_VERBOSE_HELP = "more logging; -vv: debug logging and tracebacks (same as attsvm -v)"


def version() -> str:
    """attsvm's version: the installed distribution's, else the package's ``__version__``."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("attsvm")
    except PackageNotFoundError:  # (run from a source tree that is not installed)
        from attsvm import __version__

        return __version__


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2) instead of usage + error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="attsvm",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Transformers as Support Vector Machines: attention SVMs, training, reproductions.",
    )
    parser.add_argument("--version", action="version", version=f"attsvm {version()}", help="print the version and exit")
    parser.add_argument("-v", "--verbose", action="count", default=0, help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS:
        try:
            mod = importlib.import_module(f"attsvm.cli.{module}")
        except ModuleNotFoundError as exc:  # a command whose module is not part of this build
            if exc.name != f"attsvm.cli.{module}":
                raise
            continue
        p = sub.add_parser(
            name,
            help=mod.HELP,
            description=mod.HELP,
            epilog=COMMAND_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_arguments(p)
        # (its own dest: a subcommand's default would overwrite the count given before the command)
        p.add_argument(
            "-v",
            "--verbose",
            dest="command_verbose",
            action="count",
            default=0,
            help=QUIET_VERBOSE_HELP if name in QUIET_COMMANDS else PLAIN_VERBOSE_HELP,
        )
        p.set_defaults(_run=mod.run)
    return parser


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit code (see ``attsvm --help`` for their meaning)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.verbose += getattr(args, "command_verbose", 0)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "_run", None):
        parser.print_help()
        return EXIT_USAGE
    previous = None
    # not the main thread (e.g. main() called from a worker thread): no handler
    with contextlib.suppress(ValueError):
        previous = signal.signal(signal.SIGTERM, _on_sigterm)  # the same cleanup as Ctrl-C
    try:
        with third_party_quiet() if args.command in QUIET_COMMANDS and not args.verbose else contextlib.nullcontext():
            return int(args._run(args) or 0)
    except (Exception, KeyboardInterrupt) as exc:  # the one place where errors become messages
        if args.verbose >= 2 and not isinstance(exc, KeyboardInterrupt):
            traceback.print_exc()  # then the same one line and exit code as without -vv
        print(f"attsvm {args.command}: error: {message_for(exc)}", file=sys.stderr)
        return exit_code_for(exc)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
