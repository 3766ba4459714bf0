"""Pins found by a mutation audit of experiments/_base.py, experiments/_runner.py and cli/_reproduce.py.

Every run here is tiny (``--quick`` and a handful of steps); nothing runs at paper scale.
"""

from __future__ import annotations

import json
import os
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from attsvm._folders import OWNER_FILE, RunFolderError, folder_owner
from attsvm.cli import _reproduce as cli_reproduce
from attsvm.cli._errors import UsageError
from attsvm.experiments import RunOutput, apply_overrides, get_experiment, parse_overrides, reproduce
from attsvm.experiments._base import chunks, headline
from attsvm.experiments._runner import execute_trial, plot_run

LC = ["reproduce", "local-convergence", "--quick", "--no-progress"]
TINY = ["--set", "runs=1", "--set", "steps=10", "--set", "record_every=10", "--set", "chunk=1"]
TINY_OV = {"runs": 1, "steps": 10, "record_every": 10, "chunk": 1}


def _tiny_run(out: Path, **extra: object) -> RunOutput:
    return reproduce(
        "local-convergence", quick=True, out=out, overrides={**TINY_OV, **extra}, progress=False, command=["test"]
    )


def _err_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines and "Traceback" not in err, err
    return lines[-1]


# ---------------------------------------------------------------------------- _base.py
def test_quick_settings_are_defaults_then_quick() -> None:
    exp = get_experiment("local-convergence")
    assert exp.settings(quick=True) == {**exp.defaults, **exp.quick}
    assert exp.settings(quick=False) == exp.defaults
    assert exp.settings(quick=True) != exp.settings(quick=False)


def test_unknown_override_is_refused() -> None:
    exp = get_experiment("local-convergence")
    with pytest.raises(ValueError, match="unknown setting"):
        exp.settings(overrides={"nope": 1})


def test_int_setting_refuses_a_float_override() -> None:
    exp = get_experiment("local-convergence")
    with pytest.raises(ValueError, match="'runs' must be of type int"):
        exp.settings(quick=True, overrides={"runs": 1.7})


def test_int_setting_refuses_a_bool_override() -> None:
    exp = get_experiment("local-convergence")
    with pytest.raises(ValueError, match="'runs' must be of type int"):
        exp.settings(quick=True, overrides={"runs": True})


@pytest.mark.parametrize("raw", ["4.5", "[4, 6.5]", "4,x"])
def test_list_elements_are_coerced_like_the_default_element(raw: str) -> None:
    exp = get_experiment("svm-eq")
    s = exp.settings(quick=True)
    with pytest.raises(ValueError, match=r"--set ds="):
        apply_overrides(s, {"ds": raw})


def test_list_elements_coerce_to_ints() -> None:
    s = get_experiment("svm-eq").settings(quick=True)
    got = apply_overrides(s, {"ds": "4,8"})
    assert got == {"ds": [4, 8]} and all(type(x) is int for x in got["ds"])


def test_unit_threshold_accepts_one() -> None:
    exp = get_experiment("local-convergence")
    s = exp.settings(quick=True, overrides=apply_overrides(exp.settings(quick=True), {"threshold": "1"}))
    assert s["threshold"] == 1.0
    with pytest.raises(ValueError, match=r"must be in \(0, 1\]"):
        exp.settings(quick=True, overrides={"threshold": 1.01})


def test_infinite_lr_is_refused_by_settings() -> None:
    exp = get_experiment("local-convergence")
    with pytest.raises(ValueError, match="'lr' must be finite"):
        exp.settings(quick=True, overrides={"lr": float("inf")})


def test_cli_infinite_lr_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cli_exit: Callable[[list[str]], int]
) -> None:
    code = cli_exit([*LC, *TINY, "--set", "lr=inf", "--out", str(tmp_path / "r")])
    assert code == 2
    assert "must be finite" in _err_line(capsys)
    assert not (tmp_path / "r" / "results.json").exists()


def test_reg_path_negative_r_min_is_refused() -> None:
    exp = get_experiment("reg-path")
    ov = apply_overrides(exp.settings(quick=True), parse_overrides(["r_min=-1"]))
    with pytest.raises(ValueError, match="'r_min' must be > 0"):
        exp.settings(quick=True, overrides=ov)


def test_svm_rank_nested_list_counts_are_checked() -> None:
    exp = get_experiment("svm-rank")
    ov = apply_overrides(exp.settings(quick=True), parse_overrides(["nT=[[0,5]]"]))
    assert ov == {"nT": [[0, 5]]}
    with pytest.raises(ValueError, match="'nT' must be >= 1"):
        exp.settings(quick=True, overrides=ov)


def test_chunks_last_block_is_short() -> None:
    assert chunks(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert chunks(8, 4) == [(0, 4), (4, 8)]
    assert chunks(3, 10) == [(0, 3)]


def test_headline_verdict_is_a_plain_bool() -> None:
    h = headline("x", 1, "C1", np.False_)
    assert h.passed is False
    assert headline("x", 1, "C1", np.True_).passed is True
    assert headline("x", 1, "C1", None).passed is None


def test_parse_overrides_splits_at_the_first_equals() -> None:
    assert parse_overrides(["a=b=c"]) == {"a": "b=c"}
    assert parse_overrides([" k = v "]) == {"k": "v"}


# ---------------------------------------------------------------------------- _runner.py
def test_run_claims_its_folder_and_removes_stale_temp_files(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _tiny_run(out)
    assert folder_owner(out) == "reproduce"
    # the owner marker itself, not only the config.json fallback of folder_owner
    assert json.loads((out / OWNER_FILE).read_text())["command"] == "reproduce"
    stale = out / "trials" / ".k.tmp999"
    stale.write_bytes(b"half a trial")
    again = _tiny_run(out)  # resumes: nothing to compute, but the killed writer's temp file goes
    assert again.n_computed == 0
    assert not stale.exists()
    assert folder_owner(out) == "reproduce"


def test_run_refuses_a_folder_of_another_command(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / OWNER_FILE).write_text(json.dumps({"command": "lm-train"}))
    with pytest.raises(RunFolderError, match="lm-train"):
        _tiny_run(out)
    assert not (out / "config.json").exists()


def test_cli_diverged_run_exits_1_and_reports_the_disagreement(
    tmp_path: Path, cli_exit: Callable[[list[str]], int]
) -> None:
    out = tmp_path / "r"
    assert cli_exit([*LC, *TINY, "--set", "lr=1e300", "--out", str(out)]) == 1
    report = (out / "report.md").read_text()
    assert "**FAIL**" in report
    assert "## Disagreements with the paper" in report
    assert "Every headline number agrees" not in report
    results = json.loads((out / "results.json").read_text())
    assert results["passed"] is False


def test_plot_refuses_a_config_whose_settings_are_not_a_dict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cli_exit: Callable[[list[str]], int]
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"experiment": "local-convergence", "settings": []}))
    assert cli_exit(["plot", str(out)]) == 3
    assert "not an attsvm run config" in _err_line(capsys)


def test_execute_trial_restores_torch_threads() -> None:
    torch = pytest.importorskip("torch")
    exp = get_experiment("local-convergence")
    s = exp.settings(quick=True, overrides=TINY_OV)
    trial = exp.trials(s)[0]
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        frame = execute_trial("local-convergence", s, trial)
        assert len(frame) > 0
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_plot_recomputes_results_saved_as_incomplete(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = _tiny_run(out)
    assert first.complete
    path = out / "results.json"
    saved = json.loads(path.read_text())
    saved["complete"] = False  # (as a run interrupted before its last trial had written it)
    saved["passed"] = None
    for h in saved["headlines"]:
        h["passed"] = None
        h["verdict"] = "not evaluated"
    path.write_text(json.dumps(saved))
    r = plot_run(out)
    assert r.complete
    assert r.results["complete"] is True
    assert [h["passed"] for h in r.results["headlines"]] == [h["passed"] for h in first.results["headlines"]]
    assert json.loads(path.read_text())["complete"] is True
    assert "not evaluated" not in (out / "report.md").read_text()


# ---------------------------------------------------------------------------- cli/_reproduce.py
def _fake_output(tmp_path: Path, name: str, passed: bool) -> RunOutput:
    hl = [{"name": "h", "value": 1, "claim": "C1", "passed": passed, "criterion": "", "paper": ""}]
    return RunOutput(name, tmp_path / name, {"headlines": hl}, [], None, 1, 1, 0.0)


@pytest.mark.parametrize("verdicts, code", [((True, False), 1), ((True, True), 0)])
def test_cli_reproduce_all_exit_code_and_out(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    cli_exit: Callable[[list[str]], int],
    verdicts: tuple[bool, bool],
    code: int,
) -> None:
    import attsvm.experiments as experiments

    seen: dict[str, object] = {}

    def fake_reproduce_all(**kwargs: object) -> list[RunOutput]:
        seen.update(kwargs)
        return [_fake_output(tmp_path, f"e{i}", p) for i, p in enumerate(verdicts)]

    monkeypatch.setattr(experiments, "reproduce_all", fake_reproduce_all)
    assert cli_exit(["reproduce", "all", "--quick", "--no-progress", "--out", str(tmp_path)]) == code
    assert seen["out"] == tmp_path
    assert seen["quick"] is True
    assert f"index:   {tmp_path / 'index.md'}" in capsys.readouterr().out


def test_scheduler_port_zero_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cli_exit: Callable[[list[str]], int]
) -> None:
    with pytest.raises(UsageError):
        cli_reproduce.check_scheduler("host:0")
    assert cli_reproduce.check_scheduler("host:1") == "host:1"
    assert cli_exit([*LC, *TINY, "--scheduler", "host:0", "--out", str(tmp_path / "r")]) == 2
    assert "got 'host:0'" in _err_line(capsys)
    assert not (tmp_path / "r").exists()


def test_dask_logging_restores_an_absent_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    key = "DASK_LOGGING__DISTRIBUTED"
    monkeypatch.delenv(key, raising=False)
    with cli_reproduce._dask_logging(Namespace(scheduler="local:1", verbose=0)):
        assert os.environ.get(key) == "warning"
    assert key not in os.environ


def test_dask_logging_restores_a_present_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    key = "DASK_LOGGING__DISTRIBUTED"
    monkeypatch.setenv(key, "debug")
    with cli_reproduce._dask_logging(Namespace(scheduler="local:1", verbose=0)):
        assert os.environ.get(key) == "warning"
    assert os.environ.get(key) == "debug"


def test_auto_workers_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_reproduce, "usable_cores", lambda: 16)
    assert cli_reproduce.workers("auto", quick=False) == cli_reproduce.MAX_AUTO_WORKERS
    assert cli_reproduce.workers("auto", quick=True) == 1
    monkeypatch.setattr(cli_reproduce, "usable_cores", lambda: 3)
    assert cli_reproduce.workers("auto", quick=False) == 3


@pytest.mark.parametrize("value", ["02", "+2", "2.0", "0", "-1", "two"])
def test_workers_must_be_a_plain_positive_integer(value: str) -> None:
    with pytest.raises(ValueError, match="--workers must be a positive integer or 'auto'"):
        cli_reproduce.workers(value, quick=False)
    assert cli_reproduce.workers("2", quick=False) == 2
