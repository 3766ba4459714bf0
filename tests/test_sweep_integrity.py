"""Sweep folders keep their integrity under races, kills and readers.

* two sweeps with different settings started at the same instant on one folder never mix;
* a resume uses only trials with the run's fingerprint (settings + code), even without config.json;
* ``plot`` of a stopped run says "k of N trials", marks the claims "not evaluated" and exits 4;
* ``plot`` of a run with a damaged trial file names it and exits 3, and a resume recomputes it;
* a reader never deletes anything, and a killed sweep plus a concurrent ``plot`` loses no file;
* SIGINT, SIGTERM and SIGKILL of a ``--workers 2`` sweep leave no live worker.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from attsvm._folders import LOCK_FILE, FolderLock
from attsvm.cli import main
from attsvm.experiments import FolderBusyError, RunFolderError, TrialStore, fingerprint, get_experiment, plot_run
from attsvm.experiments import reproduce as run_reproduce

# a tiny local-convergence sweep: 2 trials (W and (K,Q)) of one 20-step run each
TINY = {"runs": 1, "chunk": 1, "steps": 20, "record_every": 10}
# for the kill tests: 8 trials, each slow enough that a kill lands part-way
KILL = {"runs": 4, "chunk": 1, "steps": 300, "record_every": 50}
RACES = 20  # different-settings races per test run (each starts two sweeps at the same instant)
SURVIVOR_WAIT = 5.0  # seconds after the kill within which every worker must be gone
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def _cli(out: Path, settings: dict, *extra: str) -> list[str]:
    return (
        [
            sys.executable,
            "-m",
            "attsvm",
            "reproduce",
            "local-convergence",
            "--quick",
            "--no-progress",
            "--out",
            str(out),
        ]
        + [a for k, v in settings.items() for a in ("--set", f"{k}={v}")]
        + list(extra)
    )


def _fingerprints(out: Path) -> set[str | None]:
    return {TrialStore.file_fingerprint(p) for p in (out / "trials").glob("*.parquet")}


def _race(out: Path, lrs: tuple[float, float]) -> list[tuple[float, str, int]]:
    """Start two sweeps on ``out`` at the same instant (two threads released by one barrier; the folder
    lock is an ``flock`` on a file opened by each, so threads contend exactly like processes)."""
    barrier, got = threading.Barrier(len(lrs)), []

    def one(lr: float) -> None:
        barrier.wait()
        try:
            r = run_reproduce(
                "local-convergence",
                quick=True,
                out=out,
                overrides={**TINY, "lr": lr},
                progress=False,
                command=[f"race lr={lr}"],
            )
            got.append((lr, "ok", r.n_computed))
        except FolderBusyError:
            got.append((lr, "busy", 0))
        except RunFolderError as exc:
            got.append((lr, "refused" if "different settings" in str(exc) else f"other: {exc}", 0))

    threads = [threading.Thread(target=one, args=(lr,)) for lr in lrs]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    return sorted(got)


def _check_no_mix(out: Path, winner_lr: float) -> bool:
    """True when config.json and every trial file belong to the one run with ``lr=winner_lr``."""
    exp = get_experiment("local-convergence")
    settings = exp.settings(quick=True, overrides={**TINY, "lr": winner_lr})
    cfg = json.loads((out / "config.json").read_text())
    return (
        cfg["settings"] == settings
        and cfg["fingerprint"] == fingerprint(exp, settings)
        and _fingerprints(out) == {cfg["fingerprint"]}
        and len(list((out / "trials").glob("*.parquet"))) == 2
    )


def test_two_sweeps_with_different_settings_started_together_never_mix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import attsvm.experiments._runner as runner

    monkeypatch.setattr(runner, "_draw", lambda *a, **k: [])  # figures are not what races; keep each race short
    mixes, outcomes = 0, []
    for i in range(RACES):
        out = tmp_path / f"race{i}"
        got = _race(out, (0.1, 0.2))
        outcomes.append(tuple(g[1] for g in got))
        winners = [g for g in got if g[1] == "ok"]
        assert len(winners) == 1, f"race {i}: exactly one sweep may write the folder, got {got}"
        assert all(g[1] in ("ok", "busy", "refused") for g in got), got
        mixes += not _check_no_mix(out, winners[0][0])
    assert mixes == 0, outcomes
    print(f"\n{RACES} races, {mixes} mixes; outcomes {sorted(set(outcomes))}")


def test_two_sweep_processes_started_together_never_mix(tmp_path: Path) -> None:
    out = tmp_path / "procs"
    cmds = [_cli(out, {**TINY, "lr": lr}) for lr in (0.1, 0.2)]
    procs = [subprocess.Popen(c, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for c in cmds]
    codes = [p.wait(timeout=300) for p in procs]
    errs = [p.stderr.read() for p in procs]
    ok = [i for i, c in enumerate(codes) if c in (0, 1)]  # 1: tiny settings may disagree with the paper
    assert len(ok) == 1, (codes, errs)
    loser = 1 - ok[0]
    assert codes[loser] in (3, 5) and len(errs[loser].strip().splitlines()) == 1, errs[loser]
    assert _check_no_mix(out, (0.1, 0.2)[ok[0]])


def test_equal_settings_never_compute_a_trial_twice(tmp_path: Path) -> None:
    got = _race(tmp_path / "same", (0.1, 0.1))
    assert sum(g[2] for g in got) == 2, got  # 2 trials, each computed once (the other run was busy or resumed)
    assert {g[1] for g in got} <= {"ok", "busy"}


def test_the_second_writer_gets_a_message_naming_the_folder_and_the_holder(tmp_path: Path) -> None:
    out = tmp_path / "held"
    out.mkdir()
    with (
        FolderLock(out, "attsvm reproduce local-convergence (test holder)"),
        pytest.raises(
            FolderBusyError,
            match=rf"'{out}' is being written by another attsvm process "
            rf"\(pid {os.getpid()}: attsvm reproduce local-convergence",
        ),
    ):
        run_reproduce("local-convergence", quick=True, out=out, overrides=TINY, progress=False)
    assert not (out / "config.json").exists(), "the refused run must write nothing"


def test_resume_uses_only_trials_with_the_runs_fingerprint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, ref = tmp_path / "run", tmp_path / "ref"
    first = run_reproduce("local-convergence", quick=True, out=out, overrides=TINY, progress=False)
    assert first.n_computed == 2
    (out / "config.json").unlink()  # the settings guard is gone; the fingerprints must still protect the data
    other = {**TINY, "lr": 0.2}
    with caplog.at_level(logging.WARNING, logger="attsvm.experiments._runner"):
        again = run_reproduce("local-convergence", quick=True, out=out, overrides=other, progress=False)
    assert again.n_computed == again.n_trials == 2, "trials of other settings must not be reused"
    assert "2 trial file(s)" in caplog.text and "ignored and recomputed" in caplog.text
    fresh = run_reproduce("local-convergence", quick=True, out=ref, overrides=other, progress=False)
    cols = ["trial", "param", "run", "step"]
    pd.testing.assert_frame_equal(
        TrialStore(out / "trials").load().sort_values(cols).reset_index(drop=True),
        TrialStore(ref / "trials").load().sort_values(cols).reset_index(drop=True),
    )
    assert again.results["headlines"] == fresh.results["headlines"]

    # other code (an edited experiment module): the same settings recompute everything
    import attsvm.experiments._runner as runner

    monkeypatch.setattr(runner, "code_version", lambda exp: "edited")
    edited = run_reproduce("local-convergence", quick=True, out=out, overrides=other, progress=False)
    assert edited.n_computed == 2
    # and the same code and settings resume without computing anything
    assert run_reproduce("local-convergence", quick=True, out=out, overrides=other, progress=False).n_computed == 0


def test_plot_of_a_partial_run_reports_k_of_n_and_does_not_judge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "partial"
    settings = {**TINY, "runs": 2}  # 4 trials
    run_reproduce("local-convergence", quick=True, out=out, overrides={**settings, "threshold": 0.9999}, progress=False)
    # the state a killed run leaves: some trials, no results.json; the claims would FAIL at threshold 0.9999
    (out / "results.json").unlink()
    (out / "report.md").unlink()
    for p in sorted((out / "trials").glob("*.parquet"))[:1]:
        p.unlink()
    assert main(["plot", str(out)]) == 4
    text = capsys.readouterr().out
    assert "incomplete run, 3 of 4 trials" in text and "not evaluated" in text
    res = json.loads((out / "results.json").read_text())
    assert res["complete"] is False and res["n_trials_done"] == 3 and res["n_trials"] == 4
    assert res["passed"] is None and all(h["passed"] is None for h in res["headlines"])
    assert {h["verdict"] for h in res["headlines"]} == {"not evaluated"}
    assert set(res["not_evaluated"]) == set(get_experiment("local-convergence").claims)
    report = (out / "report.md").read_text()
    assert "3 of 4 trials" in report and "not evaluated" in report and "FAIL" not in report


def test_plot_of_a_run_with_a_damaged_trial_file_says_so_and_reproduce_recomputes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "damaged"
    run_reproduce("local-convergence", quick=True, out=out, overrides=TINY, progress=False)
    victim = sorted((out / "trials").glob("*.parquet"))[0]
    victim.write_bytes(victim.read_bytes()[:40])  # a truncated file: not an incomplete run, a damaged one
    assert main(["plot", str(out)]) == 3
    err = capsys.readouterr().err
    assert f"1 damaged trial file(s) that cannot be read ({victim.name})" in err and "rerun `attsvm reproduce`" in err
    assert victim.exists(), "plot is a reader: it deletes nothing"
    again = run_reproduce("local-convergence", quick=True, out=out, overrides=TINY, progress=False)
    assert again.n_computed == 1 and TrialStore(out / "trials").unreadable() == set()
    assert main(["plot", str(out)]) == 0


def test_readers_delete_nothing_and_a_busy_folder_is_not_plotted(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_reproduce("local-convergence", quick=True, out=out, overrides=TINY, progress=False)
    stale = out / "trials" / ".W-s00000-00001.tmp4242"
    stale.write_bytes(b"a killed writer's half file")
    TrialStore(out / "trials")
    plot_run(out)
    assert stale.exists(), "plot and TrialStore are readers: they never delete"
    with FolderLock(out, "a running sweep"), pytest.raises(FolderBusyError):
        plot_run(out)
    assert stale.exists()


# ----------------------------------------------------------------------------- real processes, real signals
def _children(pid: int) -> set[int]:
    """Direct children of ``pid`` (a /proc scan; no psutil)."""
    kids = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.add(int(d.name))
    return kids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie is dead (waiting for its new parent to reap it)


def _terminal_signals() -> None:
    """In the child, before exec: SIGINT as a terminal's Ctrl-C finds it. A disposition of SIG_IGN is inherited
    through exec, and Python then installs no KeyboardInterrupt handler; in the full suite (never alone) the
    interrupted sweep ran to completion and exited 0, so the child no longer depends on what the test process
    inherited."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_and_wait_for_workers(cmd: list[str], out: Path) -> tuple[subprocess.Popen, set[int]]:
    proc = subprocess.Popen(
        cmd,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_terminal_signals,  # (runs between fork and exec; it only resets a signal disposition)
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        kids = _children(proc.pid)
        if len(kids) >= 3 and len(list((out / "trials").glob("*.parquet"))) >= 1:  # 2 workers + resource tracker
            return proc, kids
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"the sweep never got its workers running: {proc.stderr.read()[-2000:]}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="scans /proc")
@pytest.mark.parametrize("sig, code", [(signal.SIGKILL, -signal.SIGKILL), (signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_killing_a_two_worker_sweep_leaves_no_survivor(tmp_path: Path, sig: int, code: int) -> None:
    inherited = signal.getsignal(signal.SIGINT)  # (reported on failure)
    out = tmp_path / "killed"
    proc, kids = _start_and_wait_for_workers(_cli(out, KILL, "--workers", "2"), out)
    os.kill(proc.pid, sig)
    proc.wait(timeout=60)
    err = proc.stderr.read()
    assert proc.returncode == code, f"(the test process's SIGINT disposition: {inherited!r}) {err[-2000:]}"
    if sig != signal.SIGKILL:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert "Traceback" not in err and len(lines) == 1, err
        assert "rerun the same command to resume" in lines[0]
    deadline = time.monotonic() + SURVIVOR_WAIT
    while time.monotonic() < deadline and any(_alive(k) for k in kids):
        time.sleep(0.1)
    survivors = [k for k in kids if _alive(k)]
    assert not survivors, f"processes outlived the sweep ({signal.Signals(sig).name}): {survivors}"
    # nothing finished was lost, and the rerun completes the sweep (once: the other signals end the same way)
    done = {p.name for p in (out / "trials").glob("*.parquet")}
    assert 1 <= len(done) < 8
    if sig != signal.SIGKILL:
        return
    rerun = subprocess.run(_cli(out, KILL), check=False, env=ENV, capture_output=True, text=True, timeout=300)
    assert rerun.returncode in (0, 1), rerun.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert res["n_trials"] == 8 and res["n_trials_computed_this_run"] == 8 - len(done)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="scans /proc")
def test_a_killed_sweep_plus_a_concurrent_plot_loses_no_file(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(_cli(out, KILL), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    busy = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if len(list((out / "trials").glob("*.parquet"))) >= 2:
            break
        if (out / "config.json").exists():
            busy += main(["plot", str(out)]) == 5  # the sweep holds the lock: plot is refused, touches nothing
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read()[-2000:]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    before = {p.name for p in (out / "trials").iterdir()}
    assert main(["plot", str(out)]) == 4  # partial: k of 8
    after = {p.name for p in (out / "trials").iterdir()}
    assert before == after, "plot must not delete or add trial files"
    rerun = subprocess.run(_cli(out, KILL), check=False, env=ENV, capture_output=True, text=True, timeout=300)
    assert rerun.returncode in (0, 1), rerun.stderr[-2000:]
    done_before = {n for n in before if n.endswith(".parquet")}
    res = json.loads((out / "results.json").read_text())
    assert res["complete"] is True and res["n_trials_computed_this_run"] == 8 - len(done_before)
    assert done_before <= {p.name for p in (out / "trials").glob("*.parquet")}
    assert (out / LOCK_FILE).exists()
    assert main(["plot", str(out)]) in (0, 1)


def test_a_resume_with_other_code_never_leaves_the_old_results_as_this_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import attsvm.experiments._runner as runner

    out = tmp_path / "run"
    run_reproduce("local-convergence", quick=True, out=out, overrides=TINY, progress=False)
    assert (out / "results.json").exists()
    exp = get_experiment("local-convergence")

    def crash(*a: object, **k: object) -> None:
        raise RuntimeError("killed mid-sweep")

    monkeypatch.setattr(runner, "code_version", lambda exp: "edited")
    monkeypatch.setattr(type(exp), "run_trial", crash)
    with pytest.raises(RuntimeError, match="killed mid-sweep"):
        run_reproduce("local-convergence", quick=True, out=out, overrides=TINY, progress=False)
    assert not (out / "results.json").exists(), "results of the old code must not pass for the new run's"
    res = plot_run(out).results
    assert res["complete"] is False and res["n_trials_done"] == 0 and res["n_trials"] == 2


def test_an_edit_to_a_solver_changes_every_fingerprint(tmp_path, monkeypatch):
    """Trials depend on the solvers and trainers they call, not only on their experiment's module: an
    edit anywhere in the package (e.g. a solver whose results move within its certificate's tolerance)
    gives new fingerprints, so a resumed folder never mixes trials from before and after it."""
    import attsvm.experiments._runner as runner

    tree = tmp_path / "pkg"
    (tree / "svm").mkdir(parents=True)
    (tree / "svm" / "solver.py").write_text("STEP = 0.95\n")
    (tree / "train.py").write_text("LR = 1.0\n")
    before = runner._tree_hash(tree)
    (tree / "svm" / "solver.py").write_text("STEP = 0.9\n")
    runner._tree_hash.cache_clear()
    assert runner._tree_hash(tree) != before
    # the package's own tree is part of every experiment's code version, hence of its fingerprint
    exp = get_experiment("svm-rank")
    settings = dict(exp.defaults)
    fp = fingerprint(exp, settings)
    monkeypatch.setattr(runner, "PACKAGE_ROOT", tree)
    assert fingerprint(exp, settings) != fp
