"""The experiment interface: settings, trials, headline numbers (docs/spec.md §6).

An :class:`Experiment` is a declarative description of one reproduced figure:

* ``defaults`` — the paper's settings (docs/spec.md §6 table, the official code's values);
* ``quick`` — overrides that shrink it to a CI-sized run;
* ``claims`` — the statements of the paper it checks, by id;
* ``trials(settings)`` — the trials, each a small JSON-able dict with a unique ``"key"``; a trial is a
  *batch* (e.g. a chunk of seeds trained as one tensor program), so that paper scale stays fast;
* ``more_trials(settings, data)`` — optional follow-up trials decided from finished data (used by
  ``svm-eq``, whose acceptance rule discards seeds until enough runs are accepted);
* ``run_trial(settings, trial)`` — pure and seeded: the same inputs give the same DataFrame;
* ``aggregate(settings, data)`` — headline numbers, each tied to a claim with pass/fail;
* ``plot(settings, data, results, outdir)`` — figures drawn only from saved data.

Plotting never computes, and computing never plots.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from .._validation import check_choice

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "MIN_FIT_POINTS",
    "Experiment",
    "Headline",
    "Trial",
    "apply_overrides",
    "check_names",
    "chunks",
    "headline",
    "parse_overrides",
]

Trial = dict[str, Any]


@dataclass(frozen=True)
class Headline:
    """One measured number and the paper claim it checks.

    ``passed`` is None for numbers that are reported without a pass/fail criterion (e.g. a drop count).
    """

    name: str
    value: Any
    claim: str
    passed: bool | None
    criterion: str = ""
    paper: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["value"] = _jsonable(self.value)
        return out


def _jsonable(x: Any) -> Any:
    """Turn numpy scalars/arrays (and nested containers of them) into JSON types; NaN → None."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, (np.bool_, bool)):
        return bool(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        v = float(x)
        return None if math.isnan(v) else v
    return x


@dataclass
class Experiment:
    """Base class of the registered experiments (see module doc). Subclasses override the methods."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    spec: ClassVar[str] = "docs/spec.md §6"
    claims: ClassVar[dict[str, str]] = {}
    defaults: ClassVar[dict[str, Any]] = {}
    quick: ClassVar[dict[str, Any]] = {}
    # name of the setting that ``--runs N`` overrides (None: the experiment has no notion of runs)
    runs_key: ClassVar[str | None] = "runs"
    figure_names: ClassVar[tuple[str, ...]] = ()
    # claims that the measurements at the experiment's settings contradict (the disagreement is the
    # finding, reported in the report's disagreements section); the tests accept a FAIL on these only
    expected_disagreements: ClassVar[frozenset[str]] = frozenset()
    # seconds of one core at the default settings (measured, README); only orders the experiments of an
    # overlapped `reproduce all`, longest first, so the long ones do not finish last
    cost_hint: ClassVar[float] = 10.0
    # whether `attsvm reproduce NAME` (full settings, no --workers or --scheduler) runs on a Dask LocalCluster of
    # one worker per usable core rather than a process pool: for sweeps of many thousands of trials
    dask_default: ClassVar[bool] = False

    # ---------------------------------------------------------------- settings
    def settings(self, quick: bool = False, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """The paper defaults, then the quick size, then the user's overrides (typed and checked)."""
        s = json.loads(json.dumps(self.defaults))  # deep copy through JSON: settings stay JSON-able
        if quick:
            s.update(json.loads(json.dumps(self.quick)))
        if overrides:
            unknown = sorted(set(overrides) - set(s))
            if unknown:
                raise ValueError(
                    f"--set: unknown setting(s) {unknown} for experiment {self.name!r}; known: {sorted(s)}"
                )
            for key, val in overrides.items():
                _check_type(key, val, s[key])
            s.update({key: _plain(val) for key, val in overrides.items()})
        self.validate(s)
        return s

    def validate(self, settings: dict[str, Any]) -> None:
        """Check settings; raise ValueError naming the setting. Subclasses extend.

        The generic rules (each documented in ``attsvm reproduce --help``): counts (int settings) are
        >= 1, except seeds (names ending in ``seed``), which are >= 0, and T, which is >= 2; at most :data:`MAX_COUNT`;
        numbers are finite; ``lr`` and thresholds are > 0; list settings are non-empty, without
        repeated values, and hold positive counts.
        """
        for key, val in settings.items():
            _check_value(key, val)

    # ---------------------------------------------------------------- trials
    def trials(self, settings: dict[str, Any]) -> list[Trial]:
        raise NotImplementedError

    def more_trials(self, settings: dict[str, Any], data: pd.DataFrame) -> list[Trial]:
        """Follow-up trials decided from finished data; [] when the experiment is complete."""
        return []

    def run_trial(self, settings: dict[str, Any], trial: Trial) -> pd.DataFrame:
        raise NotImplementedError

    # ---------------------------------------------------------------- results
    def aggregate(self, settings: dict[str, Any], data: pd.DataFrame) -> tuple[list[Headline], dict[str, Any]]:
        """Headline numbers (with claims and pass/fail) and a dict of extra summary tables."""
        raise NotImplementedError

    def plot(self, settings: dict[str, Any], data: pd.DataFrame, results: dict[str, Any], outdir: Path) -> list[Path]:
        """Draw the figures (PNG and PDF) from saved data; return the written paths."""
        raise NotImplementedError

    def describe(self) -> str:
        """One paragraph for ``attsvm list`` and the report."""
        return self.title


# ---------------------------------------------------------------------------- --set parsing
def parse_overrides(pairs: list[str] | None) -> dict[str, str]:
    """Split ``key=value`` strings (the CLI's ``--set``); values stay strings until typed."""
    out: dict[str, str] = {}
    for p in pairs or []:
        if "=" not in p:
            raise ValueError(f"--set expects key=value, got {p!r}")
        k, v = p.split("=", 1)
        k = k.strip()
        if not k:
            raise ValueError(f"--set expects key=value with a non-empty key, got {p!r}")
        out[k] = v.strip()
    return out


def _coerce(raw: str, default: Any, key: str) -> Any:
    """Type ``raw`` like ``default``: bool, int, float, str, or a list (JSON or comma-separated)."""
    try:
        if isinstance(default, bool):
            low = raw.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        if isinstance(default, list):
            text = raw if raw.startswith("[") else "[" + raw + "]"
            val = json.loads(text)
            if not isinstance(val, list):
                raise ValueError
            if default and not isinstance(default[0], list):
                proto = default[0]
                val = [_coerce(json.dumps(x) if not isinstance(x, str) else x, proto, key) for x in val]
            return val
        if default is None:
            return json.loads(raw)
        return raw
    except (ValueError, json.JSONDecodeError):
        raise ValueError(
            f"--set {key}={raw!r}: expected a value of type {type(default).__name__} (like the default {default!r})"
        ) from None


def apply_overrides(defaults: dict[str, Any], raw: dict[str, str]) -> dict[str, Any]:
    """Type the ``--set`` strings by the type of each default; unknown keys raise ValueError."""
    unknown = sorted(set(raw) - set(defaults))
    if unknown:
        raise ValueError(f"--set: unknown setting(s) {unknown}; known: {sorted(defaults)}")
    return {k: _coerce(v, defaults[k], k) for k, v in raw.items()}


MAX_COUNT = 10**7  # the largest count setting accepted (a typo like n=1e20 fails fast instead of exhausting memory)


def _check_type(key: str, val: Any, default: Any) -> None:
    """An override must have its default's type (an int setting never silently truncates 1.7 to 1)."""
    if isinstance(default, bool):
        ok = isinstance(val, (bool, np.bool_))
    elif isinstance(default, int):
        ok = isinstance(val, (int, np.integer)) and not isinstance(val, bool)
    elif isinstance(default, float):
        ok = isinstance(val, (int, float, np.integer, np.floating)) and not isinstance(val, bool)
    elif isinstance(default, list):
        ok = isinstance(val, (list, tuple))
    elif isinstance(default, str):
        ok = isinstance(val, str)
    else:
        ok = True
    if not ok:
        raise ValueError(
            f"setting {key!r} must be of type {type(default).__name__} (like the default {default!r}), got {val!r}"
        )
    if isinstance(default, list) and default:
        proto = default[0]
        for v in val:  # each element typed like the default's first (position by position for rows)
            if isinstance(proto, list):
                if not isinstance(v, (list, tuple)):
                    raise ValueError(f"setting {key!r} holds lists (like the default's {proto!r}), got {v!r}")
                for w, p in zip(v, proto):
                    _check_type(key, w, p)
            else:
                _check_type(key, v, proto)


def _plain(x: Any) -> Any:
    """A typed override as plain JSON types (numpy scalars → Python, tuples → lists); NaN stays NaN
    (and is refused by the checks), unlike :func:`_jsonable`."""
    if isinstance(x, (list, tuple, np.ndarray)):
        return [_plain(v) for v in x]
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    return x


# settings that are correlations or probabilities to reach: each in (0, 1]
UNIT_SETTINGS = frozenset(
    {"threshold", "joint_threshold", "corr_threshold", "mass_threshold", "loss_threshold", "tau", "thred_low",
     "thred_high"}
)  # fmt: skip


def _check_value(key: str, val: Any) -> None:
    if isinstance(val, bool) or val is None or isinstance(val, str):
        return
    if key in UNIT_SETTINGS and isinstance(val, (int, float, np.integer, np.floating)) and not 0 < val <= 1:
        raise ValueError(f"setting {key!r} is a correlation or probability threshold: it must be in (0, 1], got {val}")
    if isinstance(val, (int, np.integer)):
        low = 0 if key.endswith("seed") else 2 if key == "T" else 1  # (T: attention needs two tokens to choose)
        if val < low:
            raise ValueError(f"setting {key!r} must be >= {low}, got {val}")
        if val > MAX_COUNT:
            raise ValueError(f"setting {key!r} must be <= {MAX_COUNT}, got {val}")
    elif isinstance(val, (float, np.floating)):
        if not math.isfinite(val):
            raise ValueError(f"setting {key!r} must be finite, got {val}")
        if (key == "lr" or "thre" in key or key.startswith(("r_", "tau"))) and not val > 0:
            raise ValueError(f"setting {key!r} must be > 0, got {val}")
    elif isinstance(val, (list, tuple)):
        if not val:
            raise ValueError(f"setting {key!r} must be a non-empty list")
        seen = [json.dumps(v, sort_keys=True) for v in val]
        if len(set(seen)) != len(seen):
            dup = sorted({v for v in seen if seen.count(v) > 1})
            raise ValueError(f"setting {key!r} has repeated values {', '.join(dup)}; each value must appear once")
        for v in val:
            if isinstance(v, (list, tuple)):
                for w in v:
                    _check_value(key, w)
            else:
                _check_value(key, v)


MIN_FIT_POINTS = 3  # a rate or decay fit with an interval needs three points (diagnostics.rate_fit)


def check_names(key: str, values: list[Any], allowed: tuple[str, ...]) -> None:
    """Raise ValueError naming setting ``key`` when one of ``values`` is not in ``allowed``."""
    for v in values:
        check_choice(v, f"each value of setting {key!r}", allowed)


def chunks(n: int, size: int) -> list[tuple[int, int]]:
    """Split ``range(n)`` into half-open blocks ``[a, b)`` of at most ``size`` (``size`` >= 1)."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"chunk size must be an integer >= 1, got {size!r}")
    size = int(size)
    return [(a, min(n, a + size)) for a in range(0, n, size)]


def headline(name: str, value: Any, claim: str, passed: bool | None, criterion: str = "", paper: str = "") -> Headline:
    """Shorthand for a :class:`Headline` with JSON-safe value and a plain-bool verdict."""
    return Headline(name, _jsonable(value), claim, None if passed is None else bool(passed), criterion, paper)


def diverged_headline(
    count: int | dict[str, int], claim: str, what: str = "whose final iterate is", detail: str = ""
) -> Headline:
    """The checked headline of the runs whose result is non-finite (``count``: a number, or one per
    group): a diverged run is no evidence, so any such run fails ``claim``."""
    total = sum(count.values()) if isinstance(count, dict) else count
    name = f"runs {what} non-finite (NaN/inf){detail}"
    return headline(name, count, claim, total == 0, "= 0 (a diverged run is no evidence)")
