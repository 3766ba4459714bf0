"""Exit codes of the ``attsvm`` command and the errors that map to them.

Every failure ends with one line on stderr, ``attsvm COMMAND: error: WHAT`` (``-vv`` prints its
traceback before it), and one of these exit codes, the same with or without ``-vv``:

====  =====================================================================================
0     success
1     the result does not hold up: a reproduced claim disagrees with the paper, or ``solve``
      certified neither an optimum nor infeasibility (e.g. optimal_inaccurate)
2     usage error: a bad argument, option value or setting, an input path that does not exist, a
      missing optional extra, or sizes too large for this machine's memory
3     data error: an input file or folder that cannot be read or used (missing, truncated,
      not an instance, a run folder of other settings, a folder that holds another
      command's results, an output path that is a file or not writable)
4     incomplete run: ``plot`` of a run stopped part-way ("k of N trials"; claims not evaluated)
5     busy: another attsvm process is writing that folder
70    internal error (a bug: please report it with the ``-vv`` traceback)
130   interrupted by SIGINT (Ctrl-C); 143: terminated by SIGTERM. Finished trials are kept:
      rerun the same command to resume
====  =====================================================================================
"""

from __future__ import annotations

import sys
import zipfile

__all__ = [
    "EXIT_OK",
    "EXIT_DISAGREES",
    "EXIT_USAGE",
    "EXIT_DATA",
    "EXIT_INCOMPLETE",
    "EXIT_BUSY",
    "EXIT_INTERNAL",
    "EXIT_SIGINT",
    "EXIT_SIGTERM",
    "CLIError",
    "UsageError",
    "InputError",
    "Terminated",
    "exit_code_for",
    "message_for",
    "EPILOG",
    "COMMAND_EPILOG",
]

EXIT_OK = 0
EXIT_DISAGREES = 1
EXIT_USAGE = 2
EXIT_DATA = 3
EXIT_INCOMPLETE = 4
EXIT_BUSY = 5
EXIT_INTERNAL = 70
EXIT_SIGINT = 130
EXIT_SIGTERM = 143

EPILOG = """exit codes:
  0    success
  1    a reproduced claim disagrees with the paper, or `solve` certified neither an optimum nor
       infeasibility (e.g. status optimal_inaccurate)
  2    usage error: a bad argument, option value or setting, an input path that does not
       exist, a missing optional extra, or sizes too large for this machine's memory
  3    data error: an input file or folder that cannot be read or used (truncated, not an
       instance, a run of other settings, a folder holding another command's results,
       an output path that is a file or read-only)
  4    incomplete run: `plot` of a run stopped part-way (claims not evaluated)
  5    busy: another attsvm process is writing that folder
  70   internal error (a bug; rerun with -vv for the traceback and report it)
  130  interrupted (Ctrl-C); 143 terminated (SIGTERM): finished trials are kept, rerun to resume
every error is one line on stderr; -vv shows its traceback too (same exit code)."""

# each command's --help: the list above is given once, in `attsvm --help`
COMMAND_EPILOG = "exit codes: see attsvm --help"


class CLIError(Exception):
    """An error of the command line with its exit code."""

    exit_code = EXIT_USAGE


class UsageError(CLIError, ValueError):
    """A bad argument or option value (exit 2)."""

    exit_code = EXIT_USAGE


class InputError(CLIError):
    """An input file or folder that cannot be read or used (exit 3)."""

    exit_code = EXIT_DATA


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM, so that the same cleanup as Ctrl-C runs (exit 143)."""


def exit_code_for(exc: BaseException) -> int:
    """The exit code of an exception that ended a command (see the module doc)."""
    if isinstance(exc, Terminated):
        return EXIT_SIGTERM
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_SIGINT
    if isinstance(exc, CLIError):
        return exc.exit_code
    folders = sys.modules.get("attsvm._folders")  # loaded whenever one of its errors was raised
    if folders is not None:
        if isinstance(exc, folders.FolderBusyError):
            return EXIT_BUSY
        if isinstance(exc, folders.RunFolderError):
            return EXIT_DATA
    extras = sys.modules.get("attsvm._extras")
    if extras is not None and isinstance(exc, extras.MissingExtraError):
        return EXIT_USAGE
    if isinstance(exc, (OSError, EOFError, zipfile.BadZipFile)):
        return EXIT_DATA
    if isinstance(exc, (ValueError, TypeError, MemoryError)):
        return EXIT_USAGE
    return EXIT_INTERNAL


def message_for(exc: BaseException) -> str:
    """One line describing ``exc`` for the user."""
    if isinstance(exc, Terminated):
        text = "terminated (SIGTERM); finished work is kept, rerun the same command to resume"
    elif isinstance(exc, KeyboardInterrupt):
        text = "interrupted (Ctrl-C); finished work is kept, rerun the same command to resume"
    elif isinstance(exc, OSError) and exc.strerror and not isinstance(exc, CLIError):
        where = f": {exc.filename!s}" if exc.filename is not None else ""
        text = f"{exc.strerror}{where}"
    else:
        text = str(exc) or type(exc).__name__
        if isinstance(exc, MemoryError) and "this machine's" not in text:  # (not attsvm's own size check)
            text = f"out of memory ({text}): the sizes asked for do not fit this machine; choose smaller ones"
        elif exit_code_for(exc) == EXIT_INTERNAL:
            text = f"internal error ({type(exc).__name__}: {text}); rerun with -vv for the traceback and report it"
        elif isinstance(exc, (EOFError, zipfile.BadZipFile)):
            text = f"cannot read the input ({type(exc).__name__}: {text})"
    return " ".join(text.split())  # one line
