"""Benchmark records: each run's printed tables as JSON files in ``benchmarks/records/``.

``docs/scripts/performance.py`` renders every record into ``docs/performance.md``. A script makes a
:class:`Recorder` when it starts (the time and the machine's load are taken then), hands it each table it
prints, and writes at the end::

    rec = Recorder("bench_batch", wanted(args, ap, ("quick", "rounds")))
    ...
    rec.table("fit_many against fit", columns, rows, notes)
    rec.write()

A record holds one table: ``benchmark`` (the script's name), ``title``, ``utc`` (ISO time of the run's start),
``machine`` (one line: CPUs, CPU model, load average at the start, versions), ``command`` (the argv),
``columns``, ``rows`` (lists of strings and numbers, one cell per column) and ``notes`` (short one-line
facts needed to read the table). A table copied by hand from an older printed output also has ``source``.
A run writes ``<benchmark>-<UTC time>.json``, or ``<benchmark>-<UTC time>-<k>.json`` for its k-th table
when it prints several.

Recording is the ``--record`` / ``--no-record`` option of each script (:func:`add_option`); without either,
a full run (every option that shrinks the work at its default) is recorded and a reduced run is not.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib.metadata
import json
import math
import os
import platform
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

RECORDS = Path(__file__).resolve().with_name("records")
REQUIRED = {
    "benchmark": str,
    "title": str,
    "utc": str,
    "machine": str,
    "command": list,
    "columns": list,
    "rows": list,
    "notes": list,
}
OPTIONAL = {"source": str}
# the order of the keys in a file
ORDER = ("benchmark", "title", "utc", "machine", "command", "source", "columns", "rows", "notes")


def add_option(parser: argparse.ArgumentParser, full: str) -> None:
    """``--record`` / ``--no-record``; ``full`` says which runs count as full (recorded by default)."""
    parser.add_argument(
        "--record",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write this run's tables to benchmarks/records/ (docs/performance.md is generated from them); "
        f"default: on for a full run ({full}), off otherwise",
    )


def wanted(args: argparse.Namespace, parser: argparse.ArgumentParser, shrinking: Iterable[str]) -> bool:
    """``--record`` / ``--no-record`` if given, else whether every option in ``shrinking`` has its default."""
    if args.record is not None:
        return bool(args.record)
    return all(getattr(args, name) == parser.get_default(name) for name in shrinking)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    """One line: CPU count and model, the load average now, the thread setting and the versions."""
    parts = [f"{os.cpu_count()} CPUs ({_cpu_model()})"]
    with contextlib.suppress(OSError):
        parts.append("load {:.2f} {:.2f} {:.2f} at the start".format(*os.getloadavg()))
    if "OMP_NUM_THREADS" in os.environ:
        parts.append(f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
    versions = [f"Python {platform.python_version()}"]
    for package in ("numpy", "torch"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions.append(f"{package} {importlib.metadata.version(package)}")
    return "; ".join([*parts, ", ".join(versions)])


def command(argv: Sequence[str] | None = None) -> list[str]:
    """The script's argv with its path relative to the repository (``benchmarks/x.py``)."""
    argv = list(sys.argv if argv is None else argv)
    return [f"benchmarks/{Path(argv[0]).name}", *argv[1:]]


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def stamp(utc: str) -> str:
    """The file-name form of an ISO time: ``2026-12-05T19:50:00Z`` → ``20261205T195000Z``."""
    return utc.replace("-", "").replace(":", "")


def _cell(value: object) -> str | int | float:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    try:  # numpy scalars
        return _cell(value.item())  # type: ignore[attr-defined]
    except AttributeError:
        return str(value)


def problems(record: object) -> list[str]:
    """What is wrong with a record (an empty list when nothing is)."""
    if not isinstance(record, dict):
        return ["a record is a JSON object"]
    out = [f"missing field {key!r}" for key in REQUIRED if key not in record]
    out += [f"unknown field {key!r}" for key in record if key not in REQUIRED and key not in OPTIONAL]
    for key, kind in {**REQUIRED, **OPTIONAL}.items():
        if key in record and not isinstance(record[key], kind):
            out.append(f"{key!r} is not a {kind.__name__}")
    if out:
        return out
    if not record["columns"] or not all(isinstance(c, str) for c in record["columns"]):
        out.append("'columns' must be a non-empty list of strings")
    if not record["command"] or not all(isinstance(c, str) for c in record["command"]):
        out.append("'command' must be a non-empty list of strings")
    for i, row in enumerate(record["rows"]):
        if not isinstance(row, list) or len(row) != len(record["columns"]):
            out.append(f"row {i} does not have one cell per column")
        elif not all(isinstance(c, str | int | float) and not isinstance(c, bool) for c in row):
            out.append(f"row {i} has a cell that is not a string or a number")
        elif any(isinstance(c, float) and not math.isfinite(c) for c in row):
            out.append(f"row {i} has a number that is not finite")
    for key in ("title", "machine", *(["source"] if "source" in record else [])):
        if not record[key].strip() or "\n" in record[key]:
            out.append(f"{key!r} must be one non-empty line")
    if not all(isinstance(n, str) and n.strip() and "\n" not in n for n in record["notes"]):
        out.append("'notes' must be one-line strings")
    try:
        _dt.datetime.fromisoformat(record["utc"])
    except ValueError:
        out.append(f"'utc' is not an ISO date or time: {record['utc']!r}")
    return out


def dumps(record: dict) -> str:
    """The file's text: one key per line, one row or note per line."""
    lines = []
    keys = [key for key in ORDER if key in record]
    for i, key in enumerate(keys):
        value = record[key]
        end = "," if i < len(keys) - 1 else ""
        if key in ("rows", "notes") and value:
            items = [json.dumps(v, ensure_ascii=False) for v in value]
            body = ",\n".join(f"  {item}" for item in items)
            lines.append(f" {json.dumps(key)}: [\n{body}\n ]{end}")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}{end}")
    return "{\n" + "\n".join(lines) + "\n}\n"


def load(path: Path) -> dict:
    """A record file, checked (ValueError naming the file when something is wrong)."""
    record = json.loads(Path(path).read_text(encoding="utf-8"))
    bad = problems(record)
    if bad:
        raise ValueError(f"{path}: {'; '.join(bad)}")
    return record


def write(record: dict, folder: Path = RECORDS, name: str | None = None) -> Path:
    """Check ``record`` and write it into ``folder`` (as ``name``, default ``<benchmark>-<UTC time>.json``)."""
    bad = problems(record)
    if bad:
        raise ValueError("; ".join(bad))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (name or f"{record['benchmark']}-{stamp(record['utc'])}.json")
    stem, k = path.stem, 1
    while path.exists():  # (two runs in one second: never overwrite)
        k += 1
        path = folder / f"{stem}_{k}.json"
    path.write_text(dumps(record), encoding="utf-8")
    return path


class Recorder:
    """Collects one run's tables; :meth:`write` puts each in its own record (nothing when not ``enabled``)."""

    def __init__(
        self, benchmark: str, enabled: bool, *, folder: Path = RECORDS, argv: Sequence[str] | None = None
    ) -> None:
        self.benchmark = benchmark
        self.enabled = enabled
        self.folder = Path(folder)
        self.utc = utc_now()
        self.machine = machine()
        self.command = command(argv)
        self.tables: list[dict] = []

    def table(
        self, title: str, columns: Sequence[str], rows: Iterable[Sequence[object]], notes: Iterable[str] = ()
    ) -> dict:
        record = {
            "benchmark": self.benchmark,
            "title": title,
            "utc": self.utc,
            "machine": self.machine,
            "command": self.command,
            "columns": list(columns),
            "rows": [[_cell(c) for c in row] for row in rows],
            "notes": list(notes),
        }
        bad = problems(record)
        if bad:
            raise ValueError(f"table {title!r}: {'; '.join(bad)}")
        self.tables.append(record)
        return record

    def write(self) -> list[Path]:
        """Write the tables (if recording); print and return their paths."""
        if not self.enabled or not self.tables:
            return []
        base = f"{self.benchmark}-{stamp(self.utc)}"
        paths = []
        for k, record in enumerate(self.tables, 1):
            name = f"{base}.json" if len(self.tables) == 1 else f"{base}-{k}.json"
            paths.append(write(record, self.folder, name))
        for path in paths:
            print(f"recorded {_shown(path)}")
        return paths


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(RECORDS.parents[1]))
    except ValueError:
        return str(path)
