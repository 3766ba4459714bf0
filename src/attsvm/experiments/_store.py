"""Crash-safe persistence of finished trials: one Parquet file per trial, written atomically.

A trial's DataFrame goes to ``<dir>/<key>.parquet`` through a temporary file in the same folder and
``os.replace`` (atomic on POSIX), so a run killed at any instant (SIGKILL included) leaves only
complete trial files behind; rerunning skips every key already present. Stray temporary files of a
killed writer are ignored and cleaned up.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd

__all__ = ["TrialStore", "check_key"]

_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=+-]{0,120}$")
_SUFFIX = ".parquet"


def check_key(key: object) -> str:
    """A trial key is a short file-name-safe string (it names the trial's file)."""
    if not isinstance(key, str) or not _KEY.match(key):
        raise ValueError(f"trial key must match {_KEY.pattern} (it names a file), got {key!r}")
    return key


class TrialStore:
    """Finished trials of one run, as Parquet files under ``root``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        for stray in self.root.glob(".*.tmp*"):  # left by a writer killed mid-write
            try:
                stray.unlink()
            except OSError:  # pragma: no cover - raced with another process
                pass

    def path(self, key: str) -> Path:
        return self.root / f"{check_key(key)}{_SUFFIX}"

    def done(self) -> set[str]:
        """Keys of every persisted trial."""
        return {p.name[: -len(_SUFFIX)] for p in self.root.glob(f"*{_SUFFIX}") if not p.name.startswith(".")}

    def save(self, key: str, frame: pd.DataFrame) -> Path:
        """Persist one trial atomically (temp file + fsync + rename)."""
        if not isinstance(frame, pd.DataFrame):
            raise TypeError(f"a trial must return a pandas DataFrame, got {type(frame).__name__} (trial {key!r})")
        final = self.path(key)
        frame = frame.copy()
        frame["trial"] = key
        tmp = self.root / f".{key}.tmp{os.getpid()}"
        frame.reset_index(drop=True).to_parquet(tmp, index=False)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        return final

    def load(self, keys: list[str] | None = None) -> pd.DataFrame:
        """All persisted trials (or the given keys) concatenated, in sorted key order."""
        names = sorted(self.done()) if keys is None else sorted(keys)
        frames = [pd.read_parquet(self.path(k)) for k in names]
        if not frames:
            return pd.DataFrame({"trial": pd.Series([], dtype=str)})
        return pd.concat(frames, ignore_index=True)
