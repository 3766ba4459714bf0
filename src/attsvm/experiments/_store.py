"""Crash-safe persistence of finished trials: one Parquet file per trial, written atomically, each
stamped with the fingerprint of the run that wrote it.

A trial's DataFrame goes to ``<dir>/<key>.parquet`` through a temporary file in the same folder and
``os.replace`` (atomic on POSIX), so a run killed at any instant (SIGKILL included) leaves only
complete trial files behind. Each file carries, in its Parquet metadata, the fingerprint of the
experiment, its settings and the code that computed it; a store opened with a fingerprint sees only
the files that match it, so a resume never mixes trials of other settings or other code.

A store never deletes anything on its own: only the folder's writer, holding the folder lock,
removes the temporary files of a writer that was killed (:meth:`TrialStore.remove_stale_temp_files`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from .._extras import require

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["TrialStore", "check_key", "FINGERPRINT_KEY"]

_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=+-]{0,120}$")
_SUFFIX = ".parquet"
FINGERPRINT_KEY = b"attsvm.fingerprint"
EXPERIMENT_KEY = b"attsvm.experiment"


def check_key(key: object) -> str:
    """A trial key is a short file-name-safe string (it names the trial's file)."""
    if not isinstance(key, str) or not _KEY.match(key):
        raise ValueError(f"trial key must match {_KEY.pattern} (it names a file), got {key!r}")
    return key


class TrialStore:
    """Finished trials of one run, as Parquet files under ``root``.

    ``fingerprint`` (a string) selects the trials of one run: :meth:`done` and :meth:`load` see only
    files stamped with it, and :meth:`save` stamps it. None sees every file (and stamps none).
    ``create=False`` opens a store for reading only: a missing folder is an empty store. ``experiment`` (a name)
    is stamped too, so that :meth:`other_experiments` can tell a trial of another experiment from one of an
    older run of this one.
    """

    def __init__(
        self, root: str | Path, fingerprint: str | None = None, *, create: bool = True, experiment: str | None = None
    ) -> None:
        self.root = Path(root)
        self.fingerprint = fingerprint
        self.experiment = experiment
        if create:
            self.root.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        return self.root / f"{check_key(key)}{_SUFFIX}"

    def _files(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return [p for p in self.root.glob(f"*{_SUFFIX}") if not p.name.startswith(".")]

    @staticmethod
    def file_fingerprint(path: Path) -> str | None:
        """The fingerprint stamped in a trial file (None for an unstamped or unreadable file)."""
        pq = require("pyarrow.parquet", feature="reading trial files")
        try:
            meta = pq.read_schema(path).metadata or {}
        except (OSError, ValueError):  # pyarrow raises ArrowInvalid (a ValueError) on a foreign file
            return None
        fp = meta.get(FINGERPRINT_KEY)
        return fp.decode() if fp is not None else None

    def done(self) -> set[str]:
        """Keys of every persisted trial of this run (matching fingerprint)."""
        files = self._files()
        if self.fingerprint is not None:
            files = [p for p in files if self.file_fingerprint(p) == self.fingerprint]
        return {p.name[: -len(_SUFFIX)] for p in files}

    def unreadable(self) -> set[str]:
        """Keys of trial files whose Parquet schema cannot be read (damaged or truncated): ``reproduce``
        recomputes them; ``plot`` refuses to draw a run that has any."""
        pq = require("pyarrow.parquet", feature="reading trial files")
        bad = set()
        for p in self._files():
            try:
                pq.read_schema(p)
            except (OSError, ValueError):
                bad.add(p.name[: -len(_SUFFIX)])
        return bad

    def foreign(self) -> set[str]:
        """Keys of trial files written by another run (other settings or code): never loaded."""
        if self.fingerprint is None:
            return set()
        return {p.name[: -len(_SUFFIX)] for p in self._files() if self.file_fingerprint(p) != self.fingerprint}

    def other_experiments(self) -> dict[str, str]:
        """``{key: experiment}`` of the trial files stamped by another experiment than this store's (none when the
        store has no experiment; files written before experiments were stamped say nothing)."""
        if self.experiment is None:
            return {}
        pq = require("pyarrow.parquet", feature="reading trial files")
        out = {}
        for p in self._files():
            try:
                meta = pq.read_schema(p).metadata or {}
            except (OSError, ValueError):
                continue
            name = meta.get(EXPERIMENT_KEY)
            if name is not None and name.decode() != self.experiment:
                out[p.name[: -len(_SUFFIX)]] = name.decode()
        return out

    def remove_stale_temp_files(self) -> int:
        """Delete temporary files left by a killed writer. Only the folder's lock holder may call this."""
        n = 0
        for stray in self.root.glob(".*.tmp*"):
            try:
                stray.unlink()
                n += 1
            except OSError:  # pragma: no cover - already gone
                pass
        return n

    def save(self, key: str, frame: pd.DataFrame) -> Path:
        """Persist one trial atomically (temp file + fsync + rename), stamped with the fingerprint."""
        pd = require("pandas", feature="saving trials")
        pa = require("pyarrow", feature="saving trials")
        pq = require("pyarrow.parquet", feature="saving trials")
        if not isinstance(frame, pd.DataFrame):
            raise TypeError(f"a trial must return a pandas DataFrame, got {type(frame).__name__} (trial {key!r})")
        final = self.path(key)
        frame = frame.copy()
        frame["trial"] = key
        table = pa.Table.from_pandas(frame.reset_index(drop=True), preserve_index=False)
        given = {FINGERPRINT_KEY: self.fingerprint, EXPERIMENT_KEY: self.experiment}
        stamps = {k: v.encode() for k, v in given.items() if v is not None}
        if stamps:
            table = table.replace_schema_metadata({**(table.schema.metadata or {}), **stamps})
        tmp = self.root / f".{key}.tmp{os.getpid()}"
        pq.write_table(table, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        return final

    def load(self, keys: list[str] | set[str] | None = None) -> pd.DataFrame:
        """The given trials (default: every trial of this run) concatenated, in sorted key order."""
        pd = require("pandas", feature="loading trials")
        names = sorted(self.done()) if keys is None else sorted(keys)
        frames = [pd.read_parquet(self.path(k)) for k in names]
        if not frames:
            return pd.DataFrame({"trial": pd.Series([], dtype=str)})
        return pd.concat(frames, ignore_index=True)
