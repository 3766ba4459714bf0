"""Malformed settings and arguments of ``reproduce``/``plot``, and damaged run folders (stop-8 audit).

Each is refused before anything is written, with an error naming the setting or the folder entry; a run
that fails before persisting a trial leaves no ``config.json`` behind (it used to, and the corrected
command was then refused as "different settings").
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

import attsvm.experiments as E
from attsvm._folders import RunFolderError
from attsvm.cli._errors import EXIT_USAGE, exit_code_for, message_for
from attsvm.experiments._registry import get_experiment

TINY = {"steps": 20, "record_every": 10}  # gd-paths at a few seconds


# -------------------------------------------------------------------------------------------- settings
@pytest.mark.parametrize(
    "name, overrides, named",
    [
        ("local-convergence", {"T": 1}, "'T'"),
        ("nuclear-identity", {"rank_fracs": [2.0]}, "rank_fracs"),
        ("nuclear-identity", {"rank_fracs": [0.0]}, "rank_fracs"),  # (rounded up to rank 1 silently)
        ("svm-eq-mlp", {"params": ["X"]}, "params"),  # (a KeyError inside the trial: exit 70)
        ("svm-eq-mlp", {"activations": ["tanh"]}, "activations"),
        ("svm-rank", {"nT": [[5]]}, "nT"),
        ("svm-rank", {"max_seeds": 1}, "max_seeds"),  # (the claims could not be evaluated: exit 1)
        ("hierarchy", {"configs": [["W"]]}, "configs"),
        ("hierarchy", {"configs": [["W", 0]]}, "configs"),
        ("hierarchy", {"rolling": [100_000]}, "rolling"),
        ("hierarchy", {"rolling": [510]}, "rolling"),  # (not a recorded step: all-NaN silently)
        ("multiclass", {"C": 1}, "'C'"),
        ("gd-paths", {"Ts": [4]}, "Ts"),
        ("reg-path", {"r_min": 100.0, "r_max": 1.0}, "r_min < r_max"),
        ("reg-path", {"fit_from": 1e9}, "fit_from"),
        ("reg-path", {"n_radii": 1}, "fit_from"),
        ("rates", {"fit_from": 100_000}, "fit_from"),
        ("rates", {"target": 2.0}, "target"),
        ("ntp-convergence", {"fin_threshold": 5.0}, "fin_threshold"),
    ],
)
def test_settings_that_cannot_run_or_be_evaluated_are_refused(name, overrides, named):
    with pytest.raises(ValueError, match=named):
        get_experiment(name).settings(quick=True, overrides=overrides)


@pytest.mark.parametrize("name", ["svm-eq", "ntp-convergence", "overparam", "joint-training", "low-rank", "rates"])
def test_one_token_per_sequence_is_refused_as_a_setting(name):
    # (a generic rule: these failed inside their first trial, with messages that did not name the setting)
    with pytest.raises(ValueError, match="setting 'T' must be >= 2"):
        get_experiment(name).settings(quick=True, overrides={"T": 1})


@pytest.mark.parametrize(
    "name, overrides, named",
    [
        ("gd-paths", {"Ts": [3.0]}, "Ts"),  # (a torch error inside the trial)
        ("svm-rank", {"nT": [[5.0, 5]]}, "nT"),
        ("hierarchy", {"configs": [[1, "W"]]}, "configs"),  # (int('W') inside the trial)
    ],
)
def test_list_elements_are_typed_like_the_default(name, overrides, named):
    with pytest.raises(ValueError, match=named):
        get_experiment(name).settings(quick=True, overrides=overrides)


def test_numpy_overrides_become_plain_json():
    s = get_experiment("gd-paths").settings(overrides={"steps": np.int64(50), "lr": np.float32(0.5), "Ts": (3,)})
    assert json.loads(json.dumps(s))["steps"] == 50 and type(s["steps"]) is int and s["Ts"] == [3]


def test_every_experiments_own_settings_are_accepted_back():
    for name in E.experiment_names():
        exp = get_experiment(name)
        for quick in (False, True):
            s = exp.settings(quick=quick)
            assert exp.settings(quick=quick, overrides=s) == s


# -------------------------------------------------------------------------------------- a failed new run
def test_a_refused_setting_writes_nothing(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="'T'"):
        E.reproduce("local-convergence", out=out, quick=True, progress=False, overrides={"T": 1})
    assert not out.exists()


def test_a_run_failing_before_its_first_trial_leaves_no_config(tmp_path, monkeypatch):
    exp = get_experiment("gd-paths")

    def refuse(self, settings, trial):
        raise ValueError("refused inside the trial")

    monkeypatch.setattr(type(exp), "run_trial", refuse)
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="refused inside the trial"):
        E.reproduce("gd-paths", out=out, quick=True, progress=False, overrides=TINY)
    assert not (out / "config.json").exists()
    monkeypatch.undo()
    done = E.reproduce("gd-paths", out=out, quick=True, progress=False, overrides={**TINY, "steps": 30})
    assert done.n_computed == done.n_trials == 4


def test_a_bad_scheduler_is_named_and_leaves_no_config(tmp_path):
    pytest.importorskip("distributed")
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="--scheduler 'bogus' is not a Dask scheduler address"):
        E.reproduce("gd-paths", out=out, quick=True, progress=False, scheduler="bogus", overrides=TINY)
    assert not (out / "config.json").exists()


# ------------------------------------------------------------------------------ the Python API's arguments
@pytest.mark.parametrize(
    "kwargs, exc, named",
    [
        ({"quick": "no"}, TypeError, "quick"),
        ({"progress": "no"}, TypeError, "progress"),
        ({"overrides": "steps=5"}, TypeError, "overrides"),
        ({"out": 5}, TypeError, "--out"),
        ({"command": "attsvm reproduce"}, TypeError, "command"),
        ({"scheduler": 5}, TypeError, "--scheduler"),
    ],
)
def test_reproduce_checks_its_arguments(tmp_path, kwargs, exc, named):
    args = {"out": tmp_path / "run", "quick": True, "progress": False, "overrides": TINY, **kwargs}
    with pytest.raises(exc, match=named):
        E.reproduce("gd-paths", **args)
    assert not (tmp_path / "run").exists()


def test_reproduce_takes_numpy_counts(tmp_path):
    r = E.reproduce("gd-paths", out=tmp_path / "r", quick=True, progress=False, workers=np.int64(1), overrides=TINY)
    assert r.n_trials == 4


def test_plot_run_and_execute_trial_check_their_arguments():
    with pytest.raises(TypeError, match="directory"):
        E.plot_run(None)
    with pytest.raises(ValueError, match="missing"):
        E.execute_trial("gd-paths", {}, {})
    settings = get_experiment("gd-paths").settings(quick=True)
    with pytest.raises(ValueError, match="trial"):
        E.execute_trial("gd-paths", settings, {"T": 3})


def test_out_of_memory_is_a_usage_error_with_a_plain_message():
    exc = MemoryError("Unable to allocate 74.5 GiB for an array with shape (100000, 100000)")
    assert exit_code_for(exc) == EXIT_USAGE
    assert message_for(exc).startswith("out of memory (Unable to allocate 74.5 GiB")


# ------------------------------------------------------------------------------------ damaged run folders
@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "gd"
    E.reproduce("gd-paths", out=out, quick=True, progress=False, overrides=TINY)
    return out


@pytest.fixture
def damaged(finished, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(finished, out)
    return out


def _swap(path: Path) -> None:
    """Replace ``path`` by the other kind of entry (a file by a folder and back)."""
    if path.is_dir():
        shutil.rmtree(path)
        path.write_text("x")
    else:
        path.unlink()
        path.mkdir()


@pytest.mark.parametrize("entry", ["trials", "figures", "config.json", "results.json", "report.md"])
def test_an_entry_of_the_wrong_kind_is_named(damaged, entry):
    _swap(damaged / entry)
    kind = "is a file" if entry in ("trials", "figures") else "is a folder"
    with pytest.raises(RunFolderError, match=f"{entry}' {kind}.*damaged"):
        E.reproduce("gd-paths", out=damaged, quick=True, progress=False, overrides=TINY)
    with pytest.raises(RunFolderError, match=f"{entry}' {kind}"):
        E.plot_run(damaged)


def test_a_truncated_trial_is_reported_as_damaged_not_foreign(damaged, caplog):
    path = sorted((damaged / "trials").glob("*.parquet"))[0]
    path.write_bytes(path.read_bytes()[:300])
    with caplog.at_level(logging.WARNING, logger="attsvm.experiments._runner"):
        r = E.reproduce("gd-paths", out=damaged, quick=True, progress=False, overrides=TINY)
    assert r.n_computed == 1
    text = caplog.text
    assert "1 trial file(s)" in text and "are damaged" in text and "fingerprint differs" not in text


@pytest.mark.parametrize(
    "edit, named",
    [({"steps": "abc"}, "'steps' must be of type int"), ({"lr": -1.0}, "'lr'"), ({"Ts": [4]}, "Ts")],
)
def test_plot_refuses_a_config_whose_settings_cannot_run(damaged, edit, named):
    path = damaged / "config.json"
    config = json.loads(path.read_text())
    config["settings"].update(edit)
    path.write_text(json.dumps(config))
    with pytest.raises(RunFolderError, match=named):
        E.plot_run(damaged)


def test_plot_refuses_a_config_missing_a_setting(damaged):
    path = damaged / "config.json"
    config = json.loads(path.read_text())
    del config["settings"]["lr"]
    path.write_text(json.dumps(config))
    with pytest.raises(RunFolderError, match=r"missing setting\(s\) \['lr'\]"):
        E.plot_run(damaged)


def test_plot_refuses_settings_edited_after_the_run(damaged):
    """A hand-edited setting that still runs (steps 7 for trials computed with others) is not what the trials
    were computed with: refused, where plot used to report the edited value."""
    path = damaged / "config.json"
    config = json.loads(path.read_text())
    config["settings"]["steps"] = 7
    path.write_text(json.dumps(config))
    with pytest.raises(RunFolderError, match="not those its trials were computed with"):
        E.plot_run(damaged)
    config["settings"]["steps"] = TINY["steps"]  # (restored: plotted again)
    path.write_text(json.dumps(config))
    assert E.plot_run(damaged).results["complete"]


def test_a_full_disk_while_a_figure_is_written_is_a_data_error_naming_it(damaged, monkeypatch, capsys):
    """Out of space during the PDF: exit 3 with the OS's message (matplotlib's PDF writer failed with an
    AttributeError of its own, exit 70), and no half-written figure left behind."""
    import errno
    import os

    from attsvm.cli import main

    real = os.fsync

    def full(fd):
        if os.fstat(fd).st_size > 0 and ".pdf.tmp" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(os, "fsync", full)
    assert main(["plot", str(damaged)]) == 3
    assert "No space left on device" in capsys.readouterr().err
    assert not [p for p in damaged.rglob("*") if ".tmp" in p.name]


def test_plot_names_a_trial_of_another_experiment(damaged):
    """A trial file of another experiment put in place of one of the run's read as a missing trial ("incomplete",
    exit 4); it is a data error naming the file and its experiment."""
    import pyarrow.parquet as pq

    from attsvm.experiments._store import EXPERIMENT_KEY, FINGERPRINT_KEY

    path = sorted((damaged / "trials").glob("*.parquet"))[0]
    table = pq.read_table(path)
    meta = dict(table.schema.metadata)
    assert meta[EXPERIMENT_KEY] == b"gd-paths"  # (every trial is stamped with its experiment)
    meta.update({EXPERIMENT_KEY: b"svm-rank", FINGERPRINT_KEY: b"0" * 24})
    pq.write_table(table.replace_schema_metadata(meta), path)
    with pytest.raises(RunFolderError, match=rf"{path.stem} \(svm-rank\)"):
        E.plot_run(damaged)
    assert exit_code_for(RunFolderError("x")) == 3
