"""Every bad input to the command line gives one line on stderr and its documented exit code.

The exit codes are those of ``attsvm --help`` (``attsvm.cli._errors``): 2 usage, 3 data, 4 incomplete,
5 busy, 130/143 interrupted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from attsvm.cli import main
from attsvm.cli._errors import EPILOG, EXIT_BUSY, EXIT_DATA, EXIT_USAGE
from attsvm.datasets import paper_instance

Q = ["--quick", "--no-progress"]
LC = ["reproduce", "local-convergence", *Q]
TINY = ["--set", "runs=1", "--set", "steps=10", "--set", "record_every=10", "--set", "chunk=1"]


@pytest.fixture
def files(tmp_path: Path) -> Path:
    paper_instance(3, 4, 5, seed=0).to_npz(tmp_path / "good.npz")
    (tmp_path / "empty.npz").write_bytes(b"")
    (tmp_path / "trunc.npz").write_bytes((tmp_path / "good.npz").read_bytes()[:200])
    (tmp_path / "adir.npz").mkdir()
    np.savez(tmp_path / "nokeys.npz", foo=np.zeros(3))
    (tmp_path / "afile").write_text("x")
    (tmp_path / "somedir").mkdir()
    for name, text in (
        ("trunc", '{"experiment": "local-conv'),
        ("empty", "{}"),
        ("list", "[1, 2]"),
        ("unknown", '{"experiment": "nope", "settings": {}}'),
    ):
        (tmp_path / f"run_{name}").mkdir()
        (tmp_path / f"run_{name}" / "config.json").write_text(text)
    lm = tmp_path / "reproduce_run"  # a folder holding another command's results
    lm.mkdir()
    (lm / "config.json").write_text(json.dumps({"experiment": "local-convergence", "settings": {}}))
    (lm / "trials").mkdir()
    ro = tmp_path / "readonly"
    ro.mkdir()
    ro.chmod(0o555)
    return tmp_path


# (case id, argv with {tmp} for the fixture folder, exit code, a fragment of the message)
CASES = [
    ("out-is-a-file", LC + TINY + ["--out", "{tmp}/afile"], EXIT_DATA, "is a file, not a folder"),
    ("out-not-creatable", LC + TINY + ["--out", "/proc/attsvm-no/x"], EXIT_DATA, "cannot create the folder"),
    (
        "out-of-another-command",
        ["reproduce", "gd-paths", *Q, "--out", "{tmp}/reproduce_run"],
        EXIT_DATA,
        "holds a run of experiment 'local-convergence'",
    ),
    ("input-empty", ["solve", "--input", "{tmp}/empty.npz"], EXIT_DATA, "is not a readable attsvm instance"),
    ("input-truncated", ["solve", "--input", "{tmp}/trunc.npz"], EXIT_DATA, "is not a readable attsvm instance"),
    ("input-directory", ["solve", "--input", "{tmp}/adir.npz"], EXIT_DATA, "is a folder"),
    ("input-missing", ["solve", "--input", "{tmp}/nope.npz"], EXIT_USAGE, "does not exist"),
    ("input-missing-keys", ["solve", "--input", "{tmp}/nokeys.npz"], EXIT_DATA, "missing ['X', 'y']"),
    (
        "set-list-empty",
        ["reproduce", "nuclear-identity", *Q, "--set", "ds=[]", "--out", "{tmp}/o"],
        EXIT_USAGE,
        "setting 'ds' must be a non-empty list",
    ),
    (
        "set-list-repeats",
        ["reproduce", "nuclear-identity", *Q, "--set", "ds=[3,3]", "--out", "{tmp}/o"],
        EXIT_USAGE,
        "setting 'ds' has repeated values 3",
    ),
    (
        "set-huge-float-for-int",
        [*LC, "--set", "n=1e20", "--out", "{tmp}/o"],
        EXIT_USAGE,
        "expected a value of type int",
    ),
    (
        "set-huge-int",
        [*LC, "--set", "n=100000000000000000000", "--out", "{tmp}/o"],
        EXIT_USAGE,
        "setting 'n' must be <= ",
    ),
    ("set-float-for-int", [*LC, "--set", "runs=1.7", "--out", "{tmp}/o"], EXIT_USAGE, "expected a value of type int"),
    ("set-chunk-zero", [*LC, "--set", "chunk=0", "--out", "{tmp}/o"], EXIT_USAGE, "setting 'chunk' must be >= 1"),
    ("set-lr-negative", [*LC, "--set", "lr=-0.1", "--out", "{tmp}/o"], EXIT_USAGE, "setting 'lr' must be > 0"),
    ("set-lr-nan", [*LC, "--set", "lr=nan", "--out", "{tmp}/o"], EXIT_USAGE, "setting 'lr' must be finite"),
    ("set-unknown", [*LC, "--set", "nope=1", "--out", "{tmp}/o"], EXIT_USAGE, "unknown setting"),
    ("runs-zero", [*LC, "--runs", "0", "--out", "{tmp}/o"], EXIT_USAGE, "--runs must be a positive integer"),
    ("workers-zero", [*LC, "--workers", "0", "--out", "{tmp}/o"], EXIT_USAGE, "--workers must be a positive"),
    ("workers-word", [*LC, "--workers", "two", "--out", "{tmp}/o"], EXIT_USAGE, "or 'auto', got 'two'"),
    ("workers-float", [*LC, "--workers", "1.5", "--out", "{tmp}/o"], EXIT_USAGE, "or 'auto', got '1.5'"),
    (
        "scheduler-local-zero",
        LC + TINY + ["--scheduler", "local:0", "--out", "{tmp}/o"],
        EXIT_USAGE,
        "positive worker count",
    ),
    ("unknown-experiment", ["reproduce", "nope", "--out", "{tmp}/o"], EXIT_USAGE, "unknown experiment 'nope'"),
    (
        "train-device-nonsense",
        ["train", "--steps", "5", "--no-svm", "--device", "banana"],
        EXIT_USAGE,
        "is not a torch device",
    ),
    (
        "train-save-dir",
        ["train", "--steps", "5", "--no-svm", "--save", "{tmp}/somedir"],
        EXIT_USAGE,
        "--save must be a file path",
    ),
    (
        "train-save-suffix",
        ["train", "--steps", "5", "--no-svm", "--save", "{tmp}/x.txt"],
        EXIT_USAGE,
        "ending in .json or .npz",
    ),
    ("train-lr-negative", ["train", "--steps", "5", "--lr", "-0.1"], EXIT_USAGE, "--lr must be > 0"),
    ("solve-json-dir", ["solve", "--json", "{tmp}/somedir"], EXIT_USAGE, "--json must be a file path"),
    (
        "solve-query-index-float",
        ["solve", "--self-attention", "--query-index", "1.7"],
        EXIT_USAGE,
        "invalid int value: '1.7'",
    ),
    ("solve-bad-norm", ["solve", "--norm", "l1"], EXIT_USAGE, "invalid choice"),
    ("plot-truncated-config", ["plot", "{tmp}/run_trunc"], EXIT_DATA, "run_trunc/config.json' is not valid JSON"),
    ("plot-empty-config", ["plot", "{tmp}/run_empty"], EXIT_DATA, "is not an attsvm run config"),
    ("plot-list-config", ["plot", "{tmp}/run_list"], EXIT_DATA, "is not an attsvm run config"),
    ("plot-unknown-experiment", ["plot", "{tmp}/run_unknown"], EXIT_DATA, "unknown experiment 'nope'"),
    ("plot-no-config", ["plot", "{tmp}/somedir"], EXIT_DATA, "config.json is missing"),
    ("plot-missing-folder", ["plot", "{tmp}/nope"], EXIT_USAGE, "DIRECTORY '{tmp}/nope' does not exist"),
    ("set-refused-by-its-trial", [*LC, "--set", "T=1", "--out", "{tmp}/o"], EXIT_USAGE, "setting 'T' must be >= 2"),
    ("claims-negative-seed", ["claims", "--seed", "-1", "--out", "{tmp}/c"], EXIT_USAGE, "--seed must be >= 0"),
    (
        "analyze-delta-nan",
        ["analyze", "minilm", "--delta", "nan", "--out", "{tmp}/a"],
        EXIT_USAGE,
        "--delta must be a finite margin > 0",
    ),
    (
        "kv-compare-lm-not-a-checkpoint",
        ["kv-compare", "--lm", "{tmp}/somedir", "--out", "{tmp}/kvc"],
        EXIT_DATA,
        "somedir' is not an attsvm Llama LM checkpoint",
    ),
    (
        "kv-bench-quick-and-n-seq",
        ["kv-bench", "--quick", "--n-seq", "5", "--out", "{tmp}/kv"],
        EXIT_USAGE,
        "--quick fixes 2 sequences of 64 tokens; drop --quick or --n-seq",
    ),
    (
        "kv-bench-lm-into-results",
        ["kv-bench", "--lm", "{tmp}/reproduce_run", "--out", "{tmp}/kv"],
        EXIT_DATA,
        "is not an LM checkpoint folder: it holds results of `attsvm reproduce`",
    ),
    (
        "lm-train-into-results",
        ["lm-train", "--quick", "--out", "{tmp}/reproduce_run"],
        EXIT_DATA,
        "holds the results of `attsvm reproduce`; `attsvm lm-train` would overwrite them",
    ),
    ("no-command-option", ["reproduce"], EXIT_USAGE, "the following arguments are required: name"),
    ("bad-option", ["solve", "--nope"], EXIT_USAGE, "unrecognized arguments: --nope"),
]
if os.geteuid() != 0:  # root writes through permission bits
    CASES.append(("out-read-only", LC + TINY + ["--out", "{tmp}/readonly"], EXIT_DATA, "is not writable"))


@pytest.mark.parametrize("argv, code, fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_gives_one_line_and_its_exit_code(
    files: Path,
    capsys: pytest.CaptureFixture[str],
    cli_exit: Callable[[list[str]], int],
    argv: list[str],
    code: int,
    fragment: str,
) -> None:
    argv = [a.replace("{tmp}", str(files)) for a in argv]
    fragment = fragment.replace("{tmp}", str(files))
    rc = cli_exit(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == code, err
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert "Traceback" not in err
    assert lines[0].startswith("attsvm"), lines[0]
    assert fragment in lines[0], lines[0]


def test_device_cuda_without_cuda_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["train", "--steps", "5", "--no-svm", "--device", "cuda"]) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--device 'cuda' is not available on this machine" in err


def test_busy_folder_exits_5(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from attsvm.experiments import FolderLock

    out = tmp_path / "busy"
    out.mkdir()
    with FolderLock(out, "another sweep"):
        rc = main(LC + TINY + ["--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == EXIT_BUSY and "\n" not in err and "is being written by another attsvm process" in err


def test_exit_codes_are_documented_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert EPILOG.splitlines()[0] in text
    for code in ("0", "1", "2", "3", "4", "5", "130"):
        assert f"\n  {code} " in text


def test_workers_auto_uses_the_cores_for_full_runs_only() -> None:
    from attsvm.cli._reproduce import MAX_AUTO_WORKERS, usable_cores, workers

    assert workers("auto", quick=False) == max(1, min(usable_cores(), MAX_AUTO_WORKERS))
    assert workers("auto", quick=True) == 1  # quick trials are too small to pay for processes
    assert workers("3", quick=True) == 3 and workers(" 2", quick=False) == 2


def test_usable_cores_honours_a_cgroup_cpu_quota(tmp_path: Path) -> None:
    import builtins
    from unittest import mock

    from attsvm.cli import _reproduce

    real_open = builtins.open

    def fake(quota: str):
        def opener(path, *a, **k):
            if str(path) == "/sys/fs/cgroup/cpu.max":
                f = tmp_path / "cpu.max"
                f.write_text(quota)
                return real_open(f, *a, **k)
            return real_open(path, *a, **k)

        return opener

    with mock.patch.object(_reproduce.os, "sched_getaffinity", return_value=set(range(16)), create=True):
        with mock.patch("builtins.open", fake("150000 100000\n")):
            assert _reproduce.usable_cores() == 1  # 1.5 CPUs of quota: one worker
        with mock.patch("builtins.open", fake("400000 100000\n")):
            assert _reproduce.usable_cores() == 4
        with mock.patch("builtins.open", fake("max 100000\n")):
            assert _reproduce.usable_cores() == 16
