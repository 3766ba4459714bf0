"""The ``phase`` experiment: its certified answers checked by an independent LP, its statistics, and its run on a
real Dask scheduler with two worker processes on 127.0.0.1 equal to the in-process run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attsvm.experiments import TrialStore, experiment_names, get_experiment, reproduce
from attsvm.experiments.phase import fit_boundary, instances, wilson_interval

# a small sweep across the feasibility boundary: 2 × 2 pairs × 4 d × 8 instances in chunks of 4
SMALL = {"ns": [2, 5], "Ts": [3, 6], "ds": [1, 2, 4, 8], "runs": 8, "chunk": 4, "nuclear_runs": 2}


def _frames(out: Path) -> pd.DataFrame:
    df = TrialStore(out / "trials").load()
    return df.drop(columns=["trial"], errors="ignore").sort_values(["n", "T", "d", "instance"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def serial_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("phase") / "serial"
    reproduce("phase", quick=True, overrides=SMALL, out=out, progress=False, command=["test"])
    return out


def _lp_feasible(X: np.ndarray, Z: np.ndarray) -> bool:
    """Independent check (HiGHS through scipy): is there a W with (x_i0 − x_it)ᵀ W z_i ≥ 1 for every t ≠ 0?"""
    from scipy.optimize import linprog

    n, T, d = X.shape
    A = X[:, :1, :] - X[:, 1:, :]  # (n, T−1, d)
    rows = np.einsum("ntd,ne->ntde", A, Z).reshape(n * (T - 1), d * Z.shape[-1])
    # the LP in its own scale: rows normalised to unit norm, right-hand sides 1/‖row‖
    norms = np.linalg.norm(rows, axis=1)
    res = linprog(
        np.zeros(rows.shape[1]), A_ub=-rows / norms[:, None], b_ub=-1 / norms, bounds=(None, None), method="highs"
    )
    assert res.status in (0, 2), res.message
    return res.status == 0


def test_every_answer_agrees_with_an_independent_lp_and_certificates_verify(serial_run: Path) -> None:
    df = _frames(serial_run)
    assert len(df) == 2 * 2 * 4 * 8
    assert set(df.status) <= {"optimal", "infeasible"}
    assert 0 < df.feasible.sum() < len(df)  # the sweep crosses the boundary
    inf = df[df.status == "infeasible"]
    assert (inf.farkas_residual <= 1e-9).all() and df.farkas_residual[df.feasible].isna().all()
    # spot-check: every infeasible instance and as many feasible ones, regenerated from their seeds
    pick = pd.concat([inf, df[df.feasible].sample(min(len(inf), int(df.feasible.sum())), random_state=0)])
    for row in pick.itertuples():
        X, Z = instances(0, row.n, row.T, row.d, row.instance, row.instance + 1)
        assert _lp_feasible(X[0], Z[0]) == row.feasible, row
    # the support and rank columns read the certified W: every other token a support vector only where feasible
    assert not (df.all_support & ~df.feasible).any()
    feas = df[df.feasible]
    assert (feas.rank_fro >= 1).all() and (feas.rank_fro <= np.minimum(feas.n, feas.d)).all()
    nuc = df[df.rank_nuc >= 0]
    assert len(nuc) > 0 and (nuc.rank_nuc <= nuc.rank_fro).all()


def test_instances_do_not_depend_on_the_chunking() -> None:
    X, Z = instances(3, 4, 5, 6, 0, 10)
    X2, Z2 = instances(3, 4, 5, 6, 7, 9)
    assert np.array_equal(X[7:9], X2) and np.array_equal(Z[7:9], Z2)
    assert not np.array_equal(instances(4, 4, 5, 6, 0, 1)[0], X[:1])  # the seed matters


def test_wilson_interval_and_the_logistic_boundary() -> None:
    lo, hi = wilson_interval(np.array([0, 5, 10]), np.array([10, 10, 10]))
    # reference values of the Wilson score interval at 95 %
    np.testing.assert_allclose(lo, [0.0, 0.2366, 0.7225], atol=1e-4)
    np.testing.assert_allclose(hi, [0.2775, 0.7634, 1.0], atol=1e-4)
    assert np.isnan(wilson_interval(0, 0)[0])
    d = np.array([1, 2, 4, 8, 16, 32])
    p = 1 / (1 + (d / 5.0) ** -3.0)  # a logistic in log d with d50 = 5
    m = np.full(d.size, 100000)
    assert fit_boundary(d, np.round(p * m), m) == pytest.approx(5.0, rel=1e-2)
    assert np.isnan(fit_boundary(d, m, m))  # never below ½: no boundary in range


def test_the_report_compares_with_the_sufficient_condition_and_the_generic_count(serial_run: Path) -> None:
    res = json.loads((serial_run / "results.json").read_text())
    claims = {h["claim"] for h in res["headlines"]}
    assert claims == {"P1", "P2", "P3", "P4"}
    bnd = pd.DataFrame(res["summary"]["boundaries"])
    assert {"d50", "sufficient_d", "cover_d50", "count_d"} <= set(bnd.columns)
    assert (bnd.sufficient_d == np.maximum(bnd["T"] - 1, bnd.n)).all()
    figs = sorted(p.name for p in (serial_run / "figures").glob("*.png"))
    assert figs == ["phase_feasible.png", "phase_rank.png", "phase_support.png"]


def test_phase_is_a_study_run_by_name_not_by_reproduce_all() -> None:
    assert "phase" not in experiment_names() and "phase" in experiment_names(studies=True)
    s = get_experiment("phase").settings()
    assert s["ns"][0] == 2 and s["ns"][-1] == 32 and s["Ts"][-1] == 32 and s["ds"][0] == 1 and s["ds"][-1] == 64
    with pytest.raises(ValueError, match="'Ts'"):
        get_experiment("phase").settings(overrides={"Ts": [1, 2]})
    with pytest.raises(ValueError, match="'max_rows' = 1 leaves no \\(n, T\\) pair"):
        get_experiment("phase").settings(overrides={"max_rows": 1})


def _start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def test_a_real_dask_scheduler_with_two_workers_gives_the_local_results(serial_run: Path, tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    dask = Path(sys.executable).with_name("dask")
    if not dask.exists():
        pytest.skip("the dask command is not installed beside this Python")
    env = dict(os.environ, DASK_TEMPORARY_DIRECTORY=str(tmp_path / "dask-tmp"), OMP_NUM_THREADS="1")
    sched_file = tmp_path / "scheduler.json"
    procs = [
        _start(
            [str(dask), "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
             "--scheduler-file", str(sched_file)],
            env,
            tmp_path / "scheduler.log",
        )
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sched_file.exists(), (tmp_path / "scheduler.log").read_text()
        address = json.loads(sched_file.read_text())["address"]
        assert address.startswith("tcp://127.0.0.1:")
        for i in range(2):
            procs.append(
                _start(
                    [str(dask), "worker", address, "--nthreads", "1", "--nworkers", "1", "--no-dashboard",
                     "--host", "127.0.0.1", "--local-directory", str(tmp_path / f"w{i}")],
                    env,
                    tmp_path / f"worker{i}.log",
                )
            )  # fmt: skip
        from distributed import Client

        with Client(address, timeout="30s") as c:
            c.wait_for_workers(2, timeout=60)
        out = tmp_path / "dask"
        run = reproduce(
            "phase", quick=True, overrides=SMALL, out=out, scheduler=address, progress=False, command=["test"]
        )
        assert run.n_computed == run.n_trials == 2 * 2 * 4 * 2
        pd.testing.assert_frame_equal(_frames(out), _frames(serial_run), check_exact=True)
        a = json.loads((out / "results.json").read_text())["headlines"]
        b = json.loads((serial_run / "results.json").read_text())["headlines"]
        assert a == b
    finally:
        for p in procs[::-1]:
            p.terminate()
        for p in procs[::-1]:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def test_a_resumed_run_computes_only_the_missing_trials(serial_run: Path, tmp_path: Path) -> None:
    import shutil

    out = tmp_path / "resume"
    shutil.copytree(serial_run, out)
    files = sorted((out / "trials").glob("*.parquet"))
    for f in files[::5]:
        f.unlink()
    run = reproduce("phase", quick=True, overrides=SMALL, out=out, progress=False, command=["test"])
    assert run.n_computed == len(files[::5]) and run.n_trials == len(files)
    pd.testing.assert_frame_equal(_frames(out), _frames(serial_run), check_exact=True)


def test_the_command_line_runs_phase_on_a_local_dask_cluster_by_default(monkeypatch, tmp_path: Path) -> None:
    """Full settings with neither --workers nor --scheduler: a LocalCluster of the usable cores."""
    import attsvm.experiments as experiments
    from attsvm.cli import main

    seen = {}

    def fake(name, **kw):
        seen.update(kw, name=name)
        raise SystemExit(0)

    monkeypatch.setattr(experiments, "reproduce", fake)
    monkeypatch.setattr("attsvm.cli._reproduce.usable_cores", lambda: 2)
    with pytest.raises(SystemExit):
        main(["reproduce", "phase", "--out", str(tmp_path / "p")])
    assert seen["name"] == "phase" and seen["scheduler"] == "local:2"
    seen.clear()
    with pytest.raises(SystemExit):
        main(["reproduce", "phase", "--workers", "1", "--out", str(tmp_path / "q")])
    assert seen["scheduler"] is None and seen["workers"] == 1
    seen.clear()
    with pytest.raises(SystemExit):
        main(["reproduce", "overparam", "--out", str(tmp_path / "r")])
    assert seen["scheduler"] is None
