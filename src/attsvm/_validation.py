"""Input checking shared by every public entry point.

Each helper raises ``ValueError``/``TypeError`` naming the argument, what was expected and what
came, so that no user ever sees a numpy traceback from deep inside a solver.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "as_float_array",
    "check_choice",
    "check_positive_int",
    "check_finite_scalar",
    "check_bool",
    "warn_nonfinite",
    "Choice",
    "Integer",
    "Real",
    "ParamSpec",
    "check_param",
]


def as_float_array(
    value: Any,
    name: str,
    *,
    ndim: int | None = None,
    shape: tuple[int | None, ...] | None = None,
    copy: bool = True,
) -> NDArray[np.float64]:
    """Return ``value`` as a finite float64 array, or raise naming ``name``.

    ``shape`` entries that are ``None`` are free; others must match exactly. With ``copy=False`` a
    float64 array comes back as it is (for a caller that only reads it during the call).
    """
    if value is None:
        raise TypeError(f"{name} must be an array, got None")
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch tensor
        value = value.detach().cpu().numpy()
    try:
        arr = np.asarray(value)
    except Exception as exc:  # pragma: no cover - exotic inputs
        raise TypeError(f"{name} must be array-like, got {type(value).__name__}") from exc
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    if np.iscomplexobj(arr):
        raise TypeError(f"{name} must be real, got complex dtype {arr.dtype}")
    arr = arr.astype(np.float64, copy=copy)
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {arr.shape}")
    if shape is not None and (
        arr.ndim != len(shape) or any(s is not None and s != a for s, a in zip(shape, arr.shape))
    ):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise ValueError(f"{name} must have shape {want}, got {arr.shape}")
    # (a finite sum means every entry is finite — a NaN or inf propagates —, and costs no temporary;
    # a sum that overflows from finite entries falls through to the entry-by-entry check)
    with np.errstate(over="ignore", invalid="ignore"):  # (an overflowing or inf − inf sum is only a hint)
        total = arr.sum()
    if not np.isfinite(total) and not np.all(np.isfinite(arr)):
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise ValueError(f"{name} must be finite, got {bad} NaN/inf entries")
    return arr


def check_choice(value: Any, name: str, allowed: Iterable[Any]) -> Any:
    """Check that ``value`` is one of ``allowed`` (modes are checked in one place)."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(repr(a) for a in allowed)}; got {value!r}")
    return value


# The largest seed: seeds are handled as int64 (run_seeds adds run offsets in int64; sweeps store them
# as int64 columns), so they must fit in a signed 64-bit integer.
SEED_MAX = 2**63 - 1


def check_positive_int(value: Any, name: str, *, minimum: int = 1, maximum: int | None = None) -> int:
    """Check an integer argument ``>= minimum`` (and ``<= maximum``)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return int(value)


def check_bool(value: Any, name: str) -> bool:
    """Check a flag: a Python or numpy bool (a string such as ``"no"`` is refused, not read as True)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool (True or False), got {type(value).__name__} {value!r}")
    return bool(value)


def warn_nonfinite(what: str, *arrays: Any) -> bool:
    """Warn (RuntimeWarning) when any of ``arrays`` holds NaN or inf; return whether it did.

    For trainers, whose iterates may leave the float64 range when the step size or the data are
    extreme: the result is returned as computed, and the warning says so.
    """
    bad = any(not np.all(np.isfinite(np.asarray(a, dtype=np.float64))) for a in arrays)
    if bad:
        warnings.warn(
            f"{what} produced non-finite values (NaN/inf); check lr and the data", RuntimeWarning, stacklevel=3
        )
    return bad


def machine_memory() -> int | None:
    """Bytes of physical memory of this machine (None where the platform does not say)."""
    import os

    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):  # pragma: no cover - not Linux/macOS
        return None


def check_fits_memory(n_bytes: float, what: str) -> None:
    """A MemoryError naming ``what`` (the sizes asked for) when ``n_bytes`` exceed half of this machine's memory,
    raised before anything is allocated."""
    total = machine_memory()
    if total is not None and n_bytes > total / 2:
        raise MemoryError(
            f"{what} need about {n_bytes / 2**30:,.1f} GiB, more than half of this machine's "
            f"{total / 2**30:,.1f} GiB: choose smaller sizes"
        )


def check_seed(value: Any, name: str = "seed") -> int:
    """Check a random seed: an integer in [0, SEED_MAX]."""
    return check_positive_int(value, name, minimum=0, maximum=SEED_MAX)


def check_finite_scalar(value: Any, name: str, *, positive: bool = False) -> float:
    """Check a real finite scalar (optionally ``> 0``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


# ---------------------------------------------------------------- declarative parameter specs
# (sklearn's ``_parameter_constraints`` habit: an estimator lists one spec per parameter and
# :func:`check_param` checks a value against it with a uniform message
# "{name} must be {expected}; got {value!r}" — TypeError for a wrong type, ValueError otherwise.)


class ParamSpec:
    """Base class of the parameter specs below."""

    expected: str = ""

    def wrong_type(self, value: Any) -> bool:
        return False

    def ok(self, value: Any) -> bool:
        raise NotImplementedError


@dataclass(frozen=True)
class Choice(ParamSpec):
    """One of a fixed set of values (compared with ``==`` and of the same type)."""

    options: tuple[Any, ...]

    @property
    def expected(self) -> str:  # type: ignore[override]
        return "one of " + ", ".join(repr(o) for o in self.options)

    def ok(self, value: Any) -> bool:
        return any(value is o or (type(value) is type(o) and value == o) for o in self.options)


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


@dataclass(frozen=True)
class Integer(ParamSpec):
    """An integer ``>= minimum`` (or None when ``optional``)."""

    minimum: int = 1
    optional: bool = False
    maximum: int | None = None

    @property
    def expected(self) -> str:  # type: ignore[override]
        top = "" if self.maximum is None else f" and <= {self.maximum}"
        return ("None or " if self.optional else "") + f"an integer >= {self.minimum}{top}"

    def wrong_type(self, value: Any) -> bool:
        return not (_is_int(value) or (self.optional and value is None))

    def ok(self, value: Any) -> bool:
        if self.optional and value is None:
            return True
        return _is_int(value) and value >= self.minimum and (self.maximum is None or value <= self.maximum)


@dataclass(frozen=True)
class Real(ParamSpec):
    """A finite real number (``> 0`` when ``positive``)."""

    positive: bool = True

    @property
    def expected(self) -> str:  # type: ignore[override]
        return "a finite number > 0" if self.positive else "a finite number"

    def wrong_type(self, value: Any) -> bool:
        return not _is_real(value)

    def ok(self, value: Any) -> bool:
        return _is_real(value) and bool(np.isfinite(value)) and (not self.positive or value > 0)


def check_param(value: Any, name: str, spec: ParamSpec) -> Any:
    """Check ``value`` against ``spec``; raise naming ``name``, the expectation and the value."""
    if spec.ok(value):
        return value
    exc = TypeError if spec.wrong_type(value) else ValueError
    raise exc(f"{name} must be {spec.expected}; got {value!r}")


def check_selection(tokens: Any, n: int, T: int, name: str = "tokens") -> NDArray[np.int64]:
    """A token selection α: one integer index in [0, T) per sequence, shape (n,) (docs/spec.md §2)."""
    arr = np.asarray(tokens)
    if arr.shape != (n,):
        raise ValueError(f"{name} must hold one token index per sequence: shape ({n},), got {arr.shape}")
    if arr.dtype.kind not in "iu":  # (not an integer dtype)
        if arr.dtype.kind == "f" and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise TypeError(f"{name} must be integer token indices, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= T):
        raise ValueError(
            f"{name} must be token indices in [0, {T}), got values outside: {arr[(arr < 0) | (arr >= T)][:10]}"
        )
    return arr.astype(np.int64)


def check_tokens(X: Any) -> NDArray[np.float64]:
    """Tokens X of shape (n, T, d) with n ≥ 1, d ≥ 1 and T ≥ 2 (docs/spec.md §1), as float64."""
    X = as_float_array(X, "X", ndim=3)
    n, T, d = X.shape
    if n < 1 or d < 1:
        raise ValueError(f"X must have n >= 1 sequences and d >= 1 features, got shape {X.shape}")
    if T < 2:
        raise ValueError(f"X must have T >= 2 tokens per sequence (attention needs a choice), got T={T}")
    return X


def check_labels(y: Any, n: int, *, binary: bool = True) -> NDArray[np.float64]:
    """Labels y of shape (n,) as float64; ``binary`` also asks for values in {−1, +1}."""
    y_arr = as_float_array(y, "y", ndim=1)
    if y_arr.shape[0] != n:
        raise ValueError(f"y must have one label per sequence: expected shape ({n},), got {y_arr.shape}")
    if binary and not ((y_arr == 1.0) | (y_arr == -1.0)).all():  # (np.isin costs 10× more on small y)
        bad = np.unique(y_arr[~np.isin(y_arr, (-1.0, 1.0))])[:10]
        raise ValueError(f"y must hold labels in {{-1, +1}}, got other values {bad}")
    return y_arr
