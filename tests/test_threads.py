"""BLAS thread pools around small solves (attsvm._threads)."""

from __future__ import annotations

import threading
import time
from unittest import mock

import numpy as np
import pytest

from attsvm._threads import SMALL_SOLVE_ELEMENTS, blas_threads
from attsvm.datasets import paper_instance
from attsvm.svm import AttentionSVM

threadpoolctl = pytest.importorskip("threadpoolctl")


def _blas_threads() -> list[int]:
    return [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]


def test_blas_threads_limits_inside_and_restores_after():
    before = _blas_threads()
    with blas_threads(1):
        assert _blas_threads() and all(n == 1 for n in _blas_threads())
    assert _blas_threads() == before
    with blas_threads(None):  # None leaves the pool alone
        assert _blas_threads() == before


def test_small_fits_run_on_one_blas_thread_large_ones_keep_the_pool():
    """The limit each fit asks for (recorded at the call, so that the test tells "one thread" from "the
    pool" whatever the pool is in this process: the test session starts with one BLAS thread), and the
    pool inside the block of a small fit."""
    import attsvm.svm.backends as backends_mod
    import attsvm.svm.estimator as est_mod

    asked: list[int | None] = []
    inside: list[list[int]] = []
    real_limit, real_solve = est_mod.blas_threads, backends_mod.solve

    def limit(n):
        asked.append(n)
        return real_limit(n)

    def solve(cs, request):  # (the solve stage of every fit: attsvm.svm.pipeline)
        inside.append(_blas_threads())
        return real_solve(cs, request)

    p = paper_instance(6, 8, 10, seed=0)
    assert p.X.size <= SMALL_SOLVE_ELEMENTS
    with mock.patch.object(est_mod, "blas_threads", limit), mock.patch.object(backends_mod, "solve", solve):
        AttentionSVM().fit(p)
        AttentionSVM("nuc").fit(p)
        with mock.patch.object(est_mod, "SMALL_SOLVE_ELEMENTS", 0):  # as if the instance were large
            AttentionSVM().fit(p)
            AttentionSVM("nuc").fit(p)  # (the nuclear solver has a limit of its own)
        with mock.patch.object(est_mod, "SMALL_NUCLEAR_ELEMENTS", 0):
            AttentionSVM("nuc").fit(p)
    assert asked == [1, 1, None, 1, None]
    assert all(n == 1 for n in inside[0]) and all(n == 1 for n in inside[1])
    # fit_many's one-at-a-time fits (here: max_iter keeps them out of the batch) share one limit around them
    asked.clear()
    inside.clear()
    with mock.patch.object(est_mod, "blas_threads", limit), mock.patch.object(backends_mod, "solve", solve):
        AttentionSVM("nuc", max_iter=200).fit_many([p, p])
        with mock.patch.object(est_mod, "SMALL_NUCLEAR_ELEMENTS", 0):
            AttentionSVM("nuc", max_iter=200).fit_many([p, p])
    assert asked == [1, 1, 1, None, None, None]
    assert all(n == 1 for n in inside[0] + inside[1])


def test_overlapping_blocks_in_two_threads_restore_the_pool_once():
    """The pool is process-wide: a block that ends while another thread is still inside one must not
    restore it under that thread, and the last one out restores it."""
    import threading

    before = _blas_threads()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, list[int]] = {}

    def a():
        with blas_threads(1):
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def b():
        a_in.wait(5)
        with blas_threads(1):
            b_in.set()
            a_out.wait(5)
            seen["b after a left"] = _blas_threads()

    ta, tb = threading.Thread(target=a), threading.Thread(target=b)
    ta.start(), tb.start()
    ta.join(10), tb.join(10)
    assert all(n == 1 for n in seen["b after a left"])
    assert _blas_threads() == before


def test_experiment_workers_run_the_compiled_batch_on_one_thread():
    # each worker of the process pool takes one core: its compiled batches too (ATTSVM_NUM_THREADS)
    import subprocess
    import sys

    code = (
        "import os; os.environ['ATTSVM_NUM_THREADS'] = '4'\n"
        "from attsvm._threads import batch_threads\n"
        "from attsvm.experiments._executor import _single_threaded\n"
        "before = batch_threads(); _single_threaded(); print(before, batch_threads())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["4", "1"]


def test_run_ranges_covers_every_instance_once_and_waits_for_its_threads_on_error():
    from attsvm._threads import run_ranges

    for B, threads, per in ((1000, 3, 10), (7, 2, 1), (5, 4, 8), (0, 2, 1)):
        hits = np.zeros(B, dtype=int)
        run_ranges(lambda lo, hi, h=hits: h.__setitem__(slice(lo, hi), h[lo:hi] + 1), B, threads, per, 4)
        assert (hits == 1).all()
    # the calling thread fails: the error reaches the caller only once the other threads have stopped
    finished: list[tuple[int, int]] = []

    def solve(lo: int, hi: int) -> None:
        if threading.current_thread() is threading.main_thread():
            raise RuntimeError("boom")
        time.sleep(0.005)
        finished.append((lo, hi))

    with pytest.raises(RuntimeError, match="boom"):
        run_ranges(solve, 400, 2, 10, 4)
    count = len(finished)
    time.sleep(0.05)
    assert len(finished) == count


def test_a_larger_pool_replaces_the_smaller_one_and_shuts_it_down(monkeypatch):
    from attsvm import _threads

    monkeypatch.setattr(_threads, "_executor", None)
    small = _threads._pool(2)
    assert _threads._pool(2) is small  # (kept between calls)
    large = _threads._pool(4)
    assert large is not small and large._max_workers >= 3
    with pytest.raises(RuntimeError, match="shutdown"):
        small.submit(int)  # (its idle threads exit instead of lingering until the process ends)
    large.shutdown(wait=True)


@pytest.mark.parametrize(
    ("B", "threads", "per", "ranges"),
    [(200, 2, 64, 2), (130, 2, 64, 2), (127, 2, 64, 1), (1000, 2, 64, 8), (300, 3, 64, 3), (5000, 4, 10, 16)],
)
def test_run_ranges_splits_into_a_multiple_of_the_threads(B, threads, per, ranges):
    # 200 instances at 64 per thread on 2 threads: 2 ranges of 100, not 3 of 67 (one thread would solve two
    # of them while the other idles); too few for two threads: one range on the calling thread
    from attsvm._threads import run_ranges

    got: list[tuple[int, int]] = []
    lock = threading.Lock()

    def solve(lo: int, hi: int) -> None:
        with lock:
            got.append((lo, hi))

    run_ranges(solve, B, threads, per, 4)
    sizes = sorted(hi - lo for lo, hi in got)
    assert len(got) == ranges and sum(sizes) == B and sizes[-1] - sizes[0] <= 1
