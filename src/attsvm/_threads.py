"""BLAS thread pools around small solves (docs/spec.md §3).

A solve of a small attention SVM is hundreds of small matrix products and factorisations. With
OpenBLAS's default of one thread per core, each of them wakes the other threads, and on a 2-core
machine the threads mostly wait for each other: in a fresh script on 2 cores a Frobenius fit at
(n, T, d) = (15, 15, 20) took 8.0 ms with the default pool and 1.1 ms with one thread, the nuclear fit
at (50, 20, 50) 804 ms against 286 ms, at (100, 20, 100) 1.83 s against 1.17 s
(``benchmarks/bench_svm.py --threads``). :func:`blas_threads` limits the BLAS pool for the duration of
a block through a cached ``threadpoolctl`` controller (about 3 µs per block), and leaves it alone
where threadpoolctl is not importable.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = [
    "batch_threads",
    "compiled_wanted",
    "blas_threads",
    "run_ranges",
    "start_helpers",
    "wait_started",
    "SMALL_SOLVE_ELEMENTS",
    "SMALL_NUCLEAR_ELEMENTS",
]

# Problems with at most this many token features (n·T·d) are solved with one BLAS thread; larger ones
# keep the library's pool. Measured on 2 cores: one thread is faster per iteration at every size tried up
# to here; the Frobenius solver's large products gain from the pool above it ((250, 100, 256): 5.4 s with
# the pool against 10.7 s with one thread).
SMALL_SOLVE_ELEMENTS = 500_000
# The nuclear solver's limit: at (200, 32, 128) (819,200 features) it took 4.0–9.2 s with one thread over
# seeds 0–9 and 10.7–13.7 s with the pool (seeds 0–4; 2026-12-04, after the polish's release rule).
SMALL_NUCLEAR_ELEMENTS = 1_000_000


def compiled_wanted() -> bool:
    """Whether the environment allows the numba-compiled kernels (the solvers' batches, the span training
    loop): ``ATTSVM_COMPILED=0`` turns them all off."""
    return os.environ.get("ATTSVM_COMPILED", "1") != "0"


def batch_threads() -> int:
    """Threads for a compiled batch of independent solves (:mod:`attsvm.svm.batch`): the environment
    variable ``ATTSVM_NUM_THREADS`` when set (the experiment executors set it to 1 in each worker), else
    the CPUs this process may run on."""
    value = os.environ.get("ATTSVM_NUM_THREADS")
    if value is not None:
        try:
            threads = int(value)
        except ValueError:
            threads = 0
        if threads < 1:
            raise ValueError(f"ATTSVM_NUM_THREADS must be a positive integer, got {value!r}")
        return threads
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on Linux)
        return os.cpu_count() or 1


_controller: Any = None
_controller_failed = False


def _get_controller() -> Any:
    global _controller, _controller_failed
    if _controller is None and not _controller_failed:
        try:
            from threadpoolctl import ThreadpoolController

            _controller = ThreadpoolController()
        except Exception:  # (not installed, or a platform it cannot inspect): leave the pools alone
            _controller_failed = True
    return _controller


_lock = threading.Lock()
_depth = 0  # blocks currently inside a limit, in any thread
_restore: Any = None  # the outermost block's limiter


@contextlib.contextmanager
def blas_threads(limit: int | None) -> Iterator[None]:
    """Inside the block the BLAS pool has at most ``limit`` threads (None: unchanged).

    The pool is process-wide: only the outermost of nested or concurrent blocks (in any thread) sets it,
    and the last one to leave restores it, so overlapping blocks never restore the pool under one
    another."""
    global _depth, _restore
    ctl = _get_controller() if limit is not None else None
    if ctl is None:
        yield
        return
    with _lock:
        if _depth == 0:
            _restore = ctl.limit(limits=limit, user_api="blas")
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _restore is not None:
                _restore.restore_original_limits()
                _restore = None


def run_ranges(
    solve: Callable[[int, int], None], B: int, threads: int, min_per_thread: int, chunks_per_thread: int
) -> None:
    """``solve(lo, hi)`` over contiguous ranges covering ``range(B)``, on up to ``threads`` threads: the
    compiled kernels' batches (:mod:`attsvm.svm._active_set`, :mod:`attsvm.svm._sdp_compiled`), whose
    instances are independent and whose kernels release the GIL.

    A thread gets at least ``min_per_thread`` instances (below that, starting it costs more than it
    saves). With more than one thread the stack is cut into up to ``chunks_per_thread`` ranges per
    thread (a multiple of the threads, all of one size to within an instance), taken in turn by whichever
    thread is free: a thread that the machine slows (another process, an uneven range) holds up the
    others by one range at most. The results do not depend on
    the split."""
    parts = max(1, min(int(threads), B // max(1, min_per_thread)))
    if parts == 1:
        solve(0, B)
        return
    # a multiple of the threads: 3 equal ranges on 2 threads leave one idle for a third of the time
    chunks = parts * max(1, min(chunks_per_thread, B // (max(1, min_per_thread) * parts)))
    ranges = list(itertools.pairwise([B * j // chunks for j in range(chunks + 1)]))
    take = itertools.count()  # (next() on a count is atomic under the GIL)

    def work() -> None:
        for j in iter(take.__next__, None):
            if j >= len(ranges):
                return
            solve(*ranges[j])

    pool = _pool(parts)
    futures = [pool.submit(work) for _ in range(parts - 1)]
    try:
        work()  # (this thread too)
    finally:  # (an error here returns only once the pool's threads have stopped writing)
        for f in futures:
            f.exception()
    for f in futures:
        f.result()


def start_helpers(work: Callable[[], object], helpers: int) -> tuple[list[Future[object]], list[threading.Event]]:
    """Run ``work()`` on ``helpers`` threads of the process's pool: a compiled kernel that releases the GIL
    and solves the chunks of a stack that no thread has claimed (:class:`attsvm.svm._active_set.StackJob`),
    while the calling thread does other work. Returns the futures and, per helper, an event set just
    before it calls ``work``.

    A pool thread needs the GIL to start, and a caller that keeps it (building Python objects) lets it have
    it only after the interpreter's switch interval (5 ms, longer than a small stack's solve). So the
    caller should release the GIL until the events are set: in a kernel of its own, or waiting for them
    (:func:`wait_started`)."""
    started = [threading.Event() for _ in range(helpers)]

    def run(ev: threading.Event) -> object:
        ev.set()
        return work()

    pool = _pool(helpers + 1)
    return [pool.submit(run, ev) for ev in started], started


def wait_started(started: list[threading.Event], timeout: float | None = None) -> bool:
    """Wait (without the GIL) until each helper of :func:`start_helpers` has started its work, or for
    ``timeout`` seconds in all; whether all have started (a helper queued behind another caller's, in a
    busy pool, starts only once a pool thread is free)."""
    end = None if timeout is None else time.monotonic() + timeout
    return all(ev.wait(None if end is None else max(0.0, end - time.monotonic())) for ev in started)


_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _forget_pool() -> None:
    """In a child made by fork: the parent's pool threads do not exist here (a job submitted to the
    inherited pool would never run), so the child starts its own pool when it needs one."""
    global _executor, _executor_lock
    _executor = None
    _executor_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def _pool(parts: int) -> ThreadPoolExecutor:
    """A process-wide pool with at least ``parts − 1`` threads (kept between calls: starting threads
    costs more than a small stack's solve)."""
    global _executor
    with _executor_lock:
        if _executor is None or _executor._max_workers < parts - 1:
            if _executor is not None:  # (its threads exit once the jobs already given to it are done)
                _executor.shutdown(wait=False)
            _executor = ThreadPoolExecutor(max(1, parts - 1), thread_name_prefix="attsvm-batch")
        return _executor
