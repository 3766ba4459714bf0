"""One executor interface for trials: in-process, a local process pool, or Dask distributed.

``make_executor(workers, scheduler)`` picks:

* ``scheduler="ADDRESS"`` (e.g. ``tcp://10.0.0.5:8786``): a running Dask scheduler;
* ``scheduler="local:N"``: a Dask ``LocalCluster`` of N single-threaded worker processes on loopback;
* otherwise ``workers > 1``: a ``ProcessPoolExecutor`` (spawned processes);
* otherwise in-process.

Every executor yields ``(item, result)`` pairs *as they complete*, so the caller persists each
finished trial at once. Trial functions are pure and seeded, so every executor gives identical data.

Worker processes of the local pool never outlive the sweep: each one ignores SIGINT (the parent
handles Ctrl-C for the whole process group and stops the workers), asks the kernel to SIGKILL it
when its parent dies (``prctl(PR_SET_PDEATHSIG)`` on Linux) and, as a portable fallback, runs a
watchdog thread that exits when its parent process is gone. ``close(abort=True)`` kills the
workers at once instead of waiting for their running trials.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import signal
import sys
import threading
import time
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
    # whether close() may run in another thread while the caller goes on (attsvm.experiments.reproduce
    # then writes and draws the results while the workers exit)
    close_in_background = False

    def map_unordered(self, fn: Callable[..., Any], jobs: Iterable[tuple[Any, tuple]]) -> Iterator[tuple[Any, Any]]:
        raise NotImplementedError

    def close(self, abort: bool = False) -> None:
        """Release the workers; ``abort=True`` (after an error or an interrupt) does not wait for them."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, et: object, *exc: object) -> None:
        self.close(abort=et is not None)


class SerialExecutor(Executor):
    description = "in-process"

    def map_unordered(self, fn: Callable[..., Any], jobs: Iterable[tuple[Any, tuple]]) -> Iterator[tuple[Any, Any]]:
        for tag, args in jobs:
            yield tag, fn(*args)


_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_WATCHDOG_PERIOD = 0.5  # seconds between a worker's checks that its parent is alive


def _single_threaded() -> None:
    """One worker, one core: torch's and the BLAS library's thread pools of size 1 in this process, and
    one thread for the compiled Frobenius batch (``ATTSVM_NUM_THREADS``, attsvm._threads.batch_threads).

    Without it each of N workers on N cores runs two pools of N threads, and tiny tensor and BLAS calls
    spend their time waiting for each other (lp-convergence ran 2.1× slower on 2 workers than on 1). The
    BLAS pool is already loaded when this runs (numpy is imported with the trial function), so it is
    resized through threadpoolctl (a core dependency); the environment variables also reach libraries
    loaded later (scipy's own OpenBLAS) and anything the worker starts."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "ATTSVM_NUM_THREADS"):
        os.environ[var] = "1"
    with contextlib.suppress(ImportError):
        import torch

        torch.set_num_threads(1)
    with contextlib.suppress(ImportError):
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1)


def _worker_init(parent: int) -> None:
    """Run in each pool worker at start: die with the parent, leave Ctrl-C to it, one thread per pool."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _single_threaded()
    # tqdm's default lock is a multiprocessing semaphore registered with the resource tracker; a worker
    # that is killed could not unregister it (the tracker would report a "leaked semaphore")
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # no prctl: the watchdog below still works
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)

    def watchdog() -> None:
        while True:
            time.sleep(_WATCHDOG_PERIOD)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watchdog, name="attsvm-parent-watchdog", daemon=True).start()


class PoolExecutor(Executor):
    """A local pool of ``workers`` spawned processes (spawn: safe with torch's thread pools) that never
    outlive the parent (see the module doc)."""

    close_in_background = True  # (the workers take about 0.8 s to exit on 2 cores)

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.description = f"local process pool ({workers} workers)"
        self._pool = ProcessPoolExecutor(
            max_workers=workers, mp_context=get_context("spawn"), initializer=_worker_init, initargs=(os.getpid(),)
        )

    def map_unordered(self, fn: Callable[..., Any], jobs: Iterable[tuple[Any, tuple]]) -> Iterator[tuple[Any, Any]]:
        futures = {self._pool.submit(fn, *args): tag for tag, args in jobs}
        for fut in as_completed(futures):  # left early (error, interrupt): close(abort=True) stops the rest
            yield futures[fut], fut.result()

    def close(self, abort: bool = False) -> None:
        if not abort:
            self._pool.shutdown(wait=True, cancel_futures=True)
            return
        procs = list((getattr(self._pool, "_processes", None) or {}).values())  # private: the live workers
        self._pool.shutdown(wait=False, cancel_futures=True)  # drop the queued trials first
        for proc in procs:
            with contextlib.suppress(OSError, ValueError):  # already gone
                proc.kill()
        for proc in procs:
            proc.join(timeout=5)
        # with the workers gone the pool's manager thread sees a broken pool and ends at once; waiting for
        # it lets the pool release its queues, so no semaphore is left for the resource tracker to report
        self._pool.shutdown(wait=True)
        gc.collect()


class DaskExecutor(Executor):
    """Dask distributed: a running scheduler (``address``) or a loopback ``LocalCluster`` of N workers."""

    def __init__(self, scheduler: str, temp_dir: Path | None = None) -> None:
        from .._extras import require

        dask = require("dask", feature="--scheduler (Dask)")
        distributed = require("distributed", feature="--scheduler (Dask)")
        Client, LocalCluster = distributed.Client, distributed.LocalCluster
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
            self._cluster = LocalCluster(
                n_workers=n,
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                dashboard_address=None,
            )
            self._client = Client(self._cluster)
            self.description = f"Dask LocalCluster ({n} worker processes, loopback)"
        else:
            try:
                self._client = Client(scheduler, timeout="20s")
            except OSError as exc:
                raise ValueError(f"--scheduler {scheduler!r}: cannot reach a Dask scheduler there ({exc})") from None
            except (ValueError, TypeError) as exc:  # (distributed's address parser: "missing port number", ...)
                raise ValueError(
                    f"--scheduler {scheduler!r} is not a Dask scheduler address: expected tcp://HOST:PORT or "
                    f"local:N ({exc})"
                ) from None
            self.description = f"Dask scheduler at {scheduler}"

    def map_unordered(self, fn: Callable[..., Any], jobs: Iterable[tuple[Any, tuple]]) -> Iterator[tuple[Any, Any]]:
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

    def close(self, abort: bool = False) -> None:
        self._client.close()
        if self._cluster is not None:
            # the nannies kill workers that take over 4 s to exit and say so at WARNING: no news to the user
            nanny = logging.getLogger("distributed.nanny")
            level = nanny.level
            nanny.setLevel(logging.ERROR)
            try:
                self._cluster.close()
            finally:
                nanny.setLevel(level)


def make_executor(workers: int = 1, scheduler: str | None = None, temp_dir: Path | None = None) -> Executor:
    """The executor for ``--workers`` / ``--scheduler`` (see module doc)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"--workers must be a positive integer, got {workers!r}")
    if scheduler:
        return DaskExecutor(scheduler, temp_dir)
    if workers > 1:
        return PoolExecutor(workers)
    return SerialExecutor()
