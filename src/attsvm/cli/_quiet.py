"""Third-party noise off for the commands that run real transformers (``analyze``, ``kv-bench``, ``lm-train``,
``kv-compare``, ``claims``), unless ``-v`` is given.

Inside :func:`third_party_quiet` the warnings and log messages of the libraries underneath (transformers,
torch, huggingface_hub, tokenizers, safetensors, accelerate, gguf, kvpress, tqdm, numba, cvxpy) are not shown,
nor the progress bars of transformers and huggingface_hub ("Loading weights", "Writing model shards"). Everything
is restored on exit, so a command called from Python leaves the process as it found it. attsvm's own warnings,
log messages and progress bar are untouched.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import re
import warnings
from collections.abc import Iterator

__all__ = ["THIRD_PARTY", "third_party_quiet"]

# top-level packages whose warnings and log records are silenced
THIRD_PARTY: tuple[str, ...] = (
    "transformers",
    "torch",
    "huggingface_hub",
    "tokenizers",
    "safetensors",
    "accelerate",
    "gguf",
    "kvpress",
    "tqdm",
    "numba",
    "llvmlite",
    "cvxpy",
    "clarabel",
    "scs",
)
_MODULES = r"(" + "|".join(re.escape(p) for p in THIRD_PARTY) + r")(\..*)?"


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # (a broken install, or a module without a spec)
        return False


@contextlib.contextmanager
def _transformers_quiet() -> Iterator[None]:
    """transformers' own verbosity and progress bars (its loggers are configured by the library on first use, so
    its API is called rather than ``logging``)."""
    if not _installed("transformers"):
        yield
        return
    import transformers.utils.logging as tl

    verbosity, bars = tl.get_verbosity(), tl.is_progress_bar_enabled()
    tl.set_verbosity_error()
    tl.disable_progress_bar()
    try:
        yield
    finally:
        tl.set_verbosity(verbosity)
        if bars:
            tl.enable_progress_bar()


@contextlib.contextmanager
def _hub_quiet() -> Iterator[None]:
    """huggingface_hub's verbosity and progress bars."""
    if not _installed("huggingface_hub"):
        yield
        return
    import huggingface_hub.utils as hu
    import huggingface_hub.utils.logging as hl

    verbosity, disabled = hl.get_verbosity(), hu.are_progress_bars_disabled()
    hl.set_verbosity_error()
    hu.disable_progress_bars()
    try:
        yield
    finally:
        hl.set_verbosity(verbosity)
        if not disabled:
            hu.enable_progress_bars()


@contextlib.contextmanager
def _loggers_quiet() -> Iterator[None]:
    """The standard-library loggers of the other packages: errors only."""
    loggers = [logging.getLogger(name) for name in THIRD_PARTY if name not in ("transformers", "huggingface_hub")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


@contextlib.contextmanager
def third_party_quiet() -> Iterator[None]:
    """Silence third-party warnings, log messages and progress bars for the duration (module doc)."""
    with warnings.catch_warnings(), contextlib.ExitStack() as stack:
        warnings.filterwarnings("ignore", module=_MODULES)
        # deprecation notices are the libraries' business even when attributed to the calling attsvm line
        # (stacklevel); attsvm raises none of these categories itself
        for category in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
            warnings.filterwarnings("ignore", category=category)
        stack.enter_context(_loggers_quiet())
        stack.enter_context(_hub_quiet())
        stack.enter_context(_transformers_quiet())
        yield
