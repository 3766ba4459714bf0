"""One executor interface for trials: in-process, a local process pool, or Dask distributed.

``make_executor(workers, scheduler)`` picks:

* ``scheduler="ADDRESS"`` (e.g. ``tcp://10.0.0.5:8786``): a running Dask scheduler;
* ``scheduler="local:N"``: a Dask ``LocalCluster`` of N single-threaded worker processes on loopback;
* otherwise ``workers > 1``: a ``ProcessPoolExecutor`` (spawned processes);
* otherwise in-process.

Every executor yields ``(item, result)`` pairs *as they complete*, so the caller persists each
finished trial at once. Trial functions are pure and seeded, so every executor gives identical data.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any

__all__ = ["Executor", "SerialExecutor", "PoolExecutor", "DaskExecutor", "make_executor"]

log = logging.getLogger(__name__)


class Executor:
    """Run ``fn(*args)`` for many argument tuples; yield ``(tag, result)`` in completion order."""

    description = "executor"

    def map_unordered(self, fn: Callable[..., Any], jobs: Iterable[tuple[Any, tuple]]) -> Iterator[tuple[Any, Any]]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SerialExecutor(Executor):
    description = "in-process"

    def map_unordered(self, fn, jobs):  # type: ignore[no-untyped-def]
        for tag, args in jobs:
            yield tag, fn(*args)


class PoolExecutor(Executor):
    """A local pool of ``workers`` spawned processes (spawn: safe with torch's thread pools)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.description = f"local process pool ({workers} workers)"
        self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"))

    def map_unordered(self, fn, jobs):  # type: ignore[no-untyped-def]
        futures = {self._pool.submit(fn, *args): tag for tag, args in jobs}
        try:
            for fut in as_completed(futures):
                yield futures[fut], fut.result()
        finally:
            for fut in futures:
                fut.cancel()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class DaskExecutor(Executor):
    """Dask distributed: a running scheduler (``address``) or a loopback ``LocalCluster`` of N workers."""

    def __init__(self, scheduler: str, temp_dir: Path | None = None) -> None:
        try:
            import dask
            from distributed import Client, LocalCluster
        except ImportError as exc:  # pragma: no cover - dask is a core dependency
            raise ValueError("--scheduler needs dask[distributed] installed") from exc
        if temp_dir is not None and not os.environ.get("DASK_TEMPORARY_DIRECTORY"):
            temp_dir.mkdir(parents=True, exist_ok=True)
            os.environ["DASK_TEMPORARY_DIRECTORY"] = str(temp_dir)
        if os.environ.get("DASK_TEMPORARY_DIRECTORY"):
            dask.config.set({"temporary-directory": os.environ["DASK_TEMPORARY_DIRECTORY"]})
        self._cluster = None
        if scheduler.startswith("local:"):
            try:
                n = int(scheduler.split(":", 1)[1])
                if n < 1:
                    raise ValueError
            except ValueError:
                raise ValueError(f"--scheduler local:N needs a positive worker count N, got {scheduler!r}") from None
            self._cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                         host="127.0.0.1", dashboard_address=None)
            self._client = Client(self._cluster)
            self.description = f"Dask LocalCluster ({n} worker processes, loopback)"
        else:
            try:
                self._client = Client(scheduler, timeout="20s")
            except OSError as exc:
                raise ValueError(f"--scheduler {scheduler!r}: cannot reach a Dask scheduler there ({exc})") from None
            self.description = f"Dask scheduler at {scheduler}"

    def map_unordered(self, fn, jobs):  # type: ignore[no-untyped-def]
        from distributed import as_completed as dask_as_completed

        futures = {}
        for tag, args in jobs:
            fut = self._client.submit(fn, *args, pure=False)
            futures[fut.key] = (tag, fut)
        try:
            for fut in dask_as_completed([f for _, f in futures.values()]):
                yield futures[fut.key][0], fut.result()
        finally:
            for _, f in futures.values():
                f.cancel()

    def close(self) -> None:
        self._client.close()
        if self._cluster is not None:
            self._cluster.close()


def make_executor(workers: int = 1, scheduler: str | None = None, temp_dir: Path | None = None) -> Executor:
    """The executor for ``--workers`` / ``--scheduler`` (see module doc)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"--workers must be a positive integer, got {workers!r}")
    if scheduler:
        return DaskExecutor(scheduler, temp_dir)
    if workers > 1:
        return PoolExecutor(workers)
    return SerialExecutor()
