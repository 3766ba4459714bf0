"""The sweep machinery: identical results on a real Dask LocalCluster, and crash-safe resume after a
real SIGKILL of the ``attsvm reproduce`` process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from attsvm.experiments import TrialStore, reproduce

# a small local-convergence sweep: 8 trials of 1 run each (W and (K,Q) × 4 seeds)
SWEEP = {"runs": 4, "chunk": 1, "steps": 300, "record_every": 50}


def _frames(out: Path) -> pd.DataFrame:
    df = TrialStore(out / "trials").load()
    return df.sort_values(["trial", "param", "run", "step"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def serial_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("serial") / "lc"
    reproduce("local-convergence", quick=True, overrides=SWEEP, out=out, progress=False, command=["test"])
    return out


def test_dask_local_cluster_gives_identical_results(serial_run: Path, tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    os.environ.setdefault("DASK_TEMPORARY_DIRECTORY", str(tmp_path / "dask-tmp"))
    out = tmp_path / "dask"
    run = reproduce(
        "local-convergence", quick=True, overrides=SWEEP, out=out, scheduler="local:2", progress=False, command=["test"]
    )
    assert run.n_computed == run.n_trials == 8
    pd.testing.assert_frame_equal(_frames(out), _frames(serial_run), check_exact=True)
    a = json.loads((out / "results.json").read_text())["headlines"]
    b = json.loads((serial_run / "results.json").read_text())["headlines"]
    assert a == b


def test_local_process_pool_gives_identical_results(serial_run: Path, tmp_path: Path, monkeypatch) -> None:
    import multiprocessing
    import threading

    from attsvm.experiments._executor import PoolExecutor

    closes: list[tuple[str, str]] = []
    close = PoolExecutor.close

    def spy(self: PoolExecutor, abort: bool = False) -> None:
        closes.append(("start", threading.current_thread().name))
        close(self, abort)
        closes.append(("end", threading.current_thread().name))

    monkeypatch.setattr(PoolExecutor, "close", spy)
    out = tmp_path / "pool"
    reproduce("local-convergence", quick=True, overrides=SWEEP, out=out, workers=2, progress=False, command=["t"])
    pd.testing.assert_frame_equal(_frames(out), _frames(serial_run), check_exact=True)
    # the workers were released in the background while the results were drawn, and were gone on return
    assert closes == [("start", "attsvm-close-executor"), ("end", "attsvm-close-executor")]
    assert not multiprocessing.active_children()


def test_sigkill_mid_sweep_then_resume_loses_nothing(serial_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "killed"
    cmd = [
        sys.executable,
        "-m",
        "attsvm",
        "reproduce",
        "local-convergence",
        "--quick",
        "--no-progress",
        "--out",
        str(out),
    ] + [a for k, v in SWEEP.items() for a in ("--set", f"{k}={v}")]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    trials = out / "trials"
    deadline = time.monotonic() + 120
    n_at_kill = 0
    while time.monotonic() < deadline and proc.poll() is None:
        n_at_kill = len(list(trials.glob("*.parquet"))) if trials.exists() else 0
        if n_at_kill >= 2:
            break
        time.sleep(0.02)
    assert proc.poll() is None, f"the sweep ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
    os.kill(proc.pid, signal.SIGKILL)  # a real SIGKILL: no cleanup code runs
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    done_before = {p.name for p in trials.glob("*.parquet")}
    assert 2 <= len(done_before) < 8, "the kill must land part-way through the sweep"
    assert not (out / "results.json").exists()

    # rerun the same command: finished trials are skipped, the rest computed, each trial exactly once
    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert res["n_trials"] == 8
    assert res["n_trials_computed_this_run"] == 8 - len(done_before)
    files = sorted(p.name for p in trials.glob("*.parquet"))
    assert len(files) == 8 and not list(trials.glob(".*"))
    df = _frames(out)
    assert not df.duplicated(["trial", "param", "run", "step"]).any()
    pd.testing.assert_frame_equal(df, _frames(serial_run), check_exact=True)
    assert res["headlines"] == json.loads((serial_run / "results.json").read_text())["headlines"]


def _thread_counts() -> tuple[int, list[int]]:
    import torch
    from threadpoolctl import threadpool_info

    return torch.get_num_threads(), [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


def test_pool_workers_run_one_thread_per_pool() -> None:
    """Each local pool worker is one core: torch and BLAS pools of size 1 (two pools of N threads per
    worker oversubscribed the machine and made 2 workers slower than 1)."""
    pytest.importorskip("threadpoolctl")
    from attsvm.experiments._executor import make_executor

    with make_executor(2, None) as ex:
        counts = [res for _, res in ex.map_unordered(_thread_counts, [(k, ()) for k in range(2)])]
    for torch_threads, blas in counts:
        assert torch_threads == 1 and blas and all(n == 1 for n in blas)


def test_an_error_of_the_background_close_reaches_the_caller() -> None:
    from attsvm.experiments._executor import Executor
    from attsvm.experiments._runner import _Closing

    class Broken(Executor):
        def close(self, abort: bool = False) -> None:
            raise RuntimeError("the pool broke while closing")

    closing = _Closing(Broken())
    closing.start()
    with pytest.raises(RuntimeError, match="the pool broke"):
        closing.join()
    quiet = _Closing(Broken())  # (while another error propagates, the caller joins without raising)
    quiet.start()
    quiet.join(reraise=False)
    assert isinstance(quiet.error, RuntimeError) and not quiet.is_alive()


def test_an_error_writing_the_results_is_not_masked_by_the_close(monkeypatch, tmp_path) -> None:
    from attsvm.experiments import _runner
    from attsvm.experiments._executor import PoolExecutor

    real_close = PoolExecutor.close

    def broken_close(self, abort: bool = False) -> None:
        real_close(self, abort=abort)  # (the workers do exit: no process is left behind)
        raise RuntimeError("the pool broke while closing")

    def broken_write(*args, **kwargs):
        raise OSError("disk full while writing results.json")

    monkeypatch.setattr(PoolExecutor, "close", broken_close)
    monkeypatch.setattr(_runner, "_write_results", broken_write)
    with pytest.raises(OSError, match="disk full"):
        _runner.reproduce("local-convergence", out=tmp_path / "r", quick=True, workers=2, progress=False)
