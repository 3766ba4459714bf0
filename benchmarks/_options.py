"""argparse types shared by the benchmark scripts: a bad option value ends in argparse's one-line usage
error (exit 2) naming the option, before any work (``type=positive_int`` and so on); and :func:`timed`, the one
timing rule of the solver benchmarks.

The scripts run as ``python benchmarks/x.py``, so this folder is on ``sys.path`` and ``from _options import
...`` finds this module."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from typing import Any

SEED_MAX = 2**63 - 1  # (attsvm._validation.SEED_MAX: the largest seed attsvm accepts)


def _number(text: str, kind: type) -> float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
        ) from None


def positive_int(text: str) -> int:
    """An integer >= 1."""
    v = int(_number(text, int))
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def nonneg_int(text: str) -> int:
    """An integer >= 0."""
    v = int(_number(text, int))
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def seed(text: str) -> int:
    """A random seed: an integer in [0, 2**63 - 1]."""
    v = nonneg_int(text)
    if v > SEED_MAX:
        raise argparse.ArgumentTypeError(f"must be <= {SEED_MAX}, got {v}")
    return v


def positive_float(text: str) -> float:
    """A finite number > 0."""
    v = _number(text, float)
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return v


def fraction(text: str) -> float:
    """A number in (0, 1]."""
    v = _number(text, float)
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text!r}")
    return v


def size_triple(text: str) -> str:
    """``n,T,d``: three integers, n, d >= 1 and T >= 2 (kept as text: the scripts parse it themselves)."""
    parts = text.split(",")
    try:
        n, T, d = (int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected n,T,d (three integers), got {text!r}") from None
    if n < 1 or T < 2 or d < 1:
        raise argparse.ArgumentTypeError(f"expected n >= 1, T >= 2, d >= 1, got {text!r}")
    return text


def int_list(text: str) -> list[int]:
    """Comma-separated integers >= 1."""
    return [positive_int(p) for p in text.split(",")]


# Solves faster than this many seconds are repeated (``repeat`` times) and the best time is kept: single
# millisecond timings on a shared machine are mostly noise ...
REPEAT_BELOW_S = 2.0
# ... and repeated until this much time was spent on them (millisecond solves: dozens of runs).
MIN_TOTAL_S = 0.5


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """(best wall time, result of the first run); solves under REPEAT_BELOW_S are repeated at least ``repeat``
    times and until MIN_TOTAL_S was spent on them (the same rule for both sides of a comparison)."""
    t0 = time.perf_counter()
    out = fn()
    best = spent = time.perf_counter() - t0
    runs = 1
    if best < REPEAT_BELOW_S:
        while runs < repeat or spent < MIN_TOTAL_S:
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            best, spent, runs = min(best, dt), spent + dt, runs + 1
    return best, out
