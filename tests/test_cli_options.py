"""Options that the command line used to ignore or accept silently are usage errors naming them.

Each case is one line on stderr with the exit code of ``attsvm --help`` (2: usage, 3: data), before
any model is loaded or any trial is computed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from attsvm.cli import build_parser, main
from attsvm.cli._errors import EXIT_DATA, EXIT_USAGE

LC = ["reproduce", "local-convergence", "--quick", "--no-progress"]
TINY = ["--set", "runs=1", "--set", "steps=10", "--set", "record_every=10", "--set", "chunk=1"]


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# (case id, argv, a fragment of the message); checked by the command before it computes anything
RUN_CASES = [
    (
        "solve-query-index-without-self-attention",
        ["solve", "--query-index", "3"],
        "--query-index 3 needs --self-attention",
    ),
    ("solve-input-with-n", ["solve", "--input", "{npz}", "--n", "7"], "--n describes a generated one: drop it"),
    (
        "solve-input-with-seed-and-self-attention",
        ["solve", "--input", "{npz}", "--seed", "3", "--self-attention"],
        "--seed, --self-attention describe a generated one: drop them or drop --input",
    ),
    ("solve-input-with-query-index", ["solve", "--input", "{npz}", "--query-index", "2"], "--query-index describes"),
    ("train-m-with-param-W", ["train", "--steps", "5", "--no-svm", "--m", "3"], "--m 3 needs --param KQ"),
    (
        "train-m-with-default-param",
        ["train", "--steps", "5", "--no-svm", "--param", "W", "--m", "2"],
        "--m 2 needs --param KQ",
    ),
    (
        "train-classes-with-linear-head",
        ["train", "--steps", "5", "--no-svm", "--classes", "5"],
        "--classes 5 needs --head multiclass (the linear head",
    ),
    (
        "train-classes-with-relu-head",
        ["train", "--steps", "5", "--no-svm", "--head", "relu", "--classes", "4"],
        "--classes 4 needs --head multiclass (the relu head",
    ),
    ("reproduce-scheduler-empty", [*LC, *TINY, "--scheduler", ""], "--scheduler must be local:N (N >= 1) or"),
    (
        "reproduce-scheduler-not-an-address",
        [*LC, *TINY, "--scheduler", "not an address"],
        "--scheduler must be local:N (N >= 1) or a Dask scheduler address",
    ),
    ("reproduce-scheduler-no-port", [*LC, *TINY, "--scheduler", "tcp://10.0.0.5"], "got 'tcp://10.0.0.5'"),
    ("reproduce-scheduler-port-too-big", [*LC, *TINY, "--scheduler", "host:70000"], "got 'host:70000'"),
    (
        "reproduce-workers-with-scheduler",
        [*LC, *TINY, "--scheduler", "local:1", "--workers", "2"],
        "--workers cannot be combined with --scheduler",
    ),
    (
        "analyze-quick-with-max-windows",
        ["analyze", "minilm", "--quick", "--max-windows", "3"],
        "--quick fixes 4 windows of 128 tokens (2 for compression); drop --quick or --max-windows",
    ),
    (
        "analyze-quick-with-max-length-and-compression",
        ["analyze", "minilm", "--quick", "--max-length", "64", "--compression-windows", "4"],
        "drop --quick or --max-length and --compression-windows",
    ),
]


@pytest.mark.parametrize("argv, fragment", [c[1:] for c in RUN_CASES], ids=[c[0] for c in RUN_CASES])
def test_ignored_option_is_a_usage_error(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    cli_exit: Callable[[list[str]], int],
    argv: list[str],
    fragment: str,
) -> None:
    if argv[0] in ("reproduce", "analyze"):
        argv = [*argv, "--out", str(tmp_path / "out")]
    if "{npz}" in argv:
        from attsvm.datasets import paper_instance

        paper_instance(6, 8, 10, seed=0).to_npz(tmp_path / "p.npz")
        argv = [str(tmp_path / "p.npz") if a == "{npz}" else a for a in argv]
    assert cli_exit(argv) == EXIT_USAGE
    line = _one_line(capsys)
    assert line.startswith(f"attsvm {argv[0]}: error: ") and fragment in line, line
    assert not (tmp_path / "out").exists()  # refused before anything was written


# (case id, argv, the option named, the expected range); refused by the parser itself
PARSE_CASES = [
    ("analyze-threads-zero", ["analyze", "minilm", "--threads", "0"], "--threads", ">= 1, got '0'"),
    ("analyze-threads-negative", ["analyze", "minilm", "--threads", "-1"], "--threads", ">= 1, got '-1'"),
    ("analyze-max-windows-zero", ["analyze", "minilm", "--max-windows", "0"], "--max-windows", ">= 1, got '0'"),
    (
        "analyze-max-windows-zero-quick",
        ["analyze", "minilm", "--quick", "--max-windows", "0"],
        "--max-windows",
        ">= 1, got '0'",
    ),
    ("analyze-svm-pairs-zero", ["analyze", "minilm", "--svm-pairs", "0"], "--svm-pairs", ">= 2, got '0'"),
    ("analyze-svm-window-one", ["analyze", "minilm", "--svm-window", "1"], "--svm-window", ">= 2, got '1'"),
    ("kv-bench-threads-zero", ["kv-bench", "--threads", "0"], "--threads", ">= 1, got '0'"),
    ("kv-bench-threads-negative", ["kv-bench", "--threads", "-1"], "--threads", ">= 1, got '-1'"),
    ("kv-bench-seq-len-one", ["kv-bench", "--seq-len", "1"], "--seq-len", ">= 2, got '1'"),
    ("kv-bench-n-seq-zero", ["kv-bench", "--n-seq", "0"], "--n-seq", ">= 1, got '0'"),
    ("lm-train-threads-zero", ["lm-train", "--threads", "0"], "--threads", ">= 1, got '0'"),
    ("kv-compare-threads-zero", ["kv-compare", "--threads", "0"], "--threads", ">= 1, got '0'"),
    ("claims-threads-zero", ["claims", "--threads", "0"], "--threads", ">= 1, got '0'"),
    ("analyze-threads-word", ["analyze", "minilm", "--threads", "two"], "--threads", ">= 1, got 'two'"),
]


@pytest.mark.parametrize("argv, option, expected", [c[1:] for c in PARSE_CASES], ids=[c[0] for c in PARSE_CASES])
def test_out_of_range_count_is_refused_at_parse_time(
    capsys: pytest.CaptureFixture[str], argv: list[str], option: str, expected: str
) -> None:
    with pytest.raises(SystemExit) as info:  # the parser refuses it: no model is loaded
        build_parser().parse_args(argv)
    assert info.value.code == EXIT_USAGE
    line = _one_line(capsys)
    assert f"attsvm {argv[0]}: error: argument {option}: expected an integer {expected}" in line, line


def test_vv_keeps_the_usage_exit_code_and_shows_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-vv", "solve", "--query-index", "3"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "Traceback" in err and "UsageError" in err
    assert err.strip().splitlines()[-1].startswith("attsvm solve: error: --query-index 3 needs --self-attention")


def test_vv_keeps_the_data_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty.npz").write_bytes(b"")
    assert main(["-vv", "solve", "--input", str(tmp_path / "empty.npz")]) == EXIT_DATA
    assert "is not a readable attsvm instance" in capsys.readouterr().err


def test_plot_of_a_file_says_a_folder_is_expected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "results.json").write_text("{}")
    assert main(["plot", str(tmp_path / "results.json")]) == EXIT_DATA
    line = _one_line(capsys)
    assert "results.json' is a file; expected a run folder written by `attsvm reproduce`" in line, line
    assert "no such folder" not in line


def test_plot_without_positive_values_draws_linear_panels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "lc"
    # n = d = 1: every 1 − corr is 0 or NaN, so panels (b) and (c) have nothing to draw on a log scale
    argv = [*LC, "--set", "n=1", "--set", "d=1", "--set", "runs=2", "--set", "steps=40", "--set", "chunk=2"]
    assert main([*argv, "--out", str(out)]) in (0, 1)  # computed, figures drawn; the claims may disagree
    assert (out / "figures" / "local_convergence.png").stat().st_size > 0
    capsys.readouterr()
    assert main(["plot", str(out)]) == 0
    assert "figure:" in capsys.readouterr().out


def test_scheduler_logs_nothing_at_the_default_verbosity(tmp_path: Path) -> None:
    import subprocess
    import sys

    pytest.importorskip("distributed")
    # a process of its own: the command configures logging as a user's shell sees it
    argv = [*LC, *TINY, "--scheduler", "local:1", "--out", str(tmp_path / "o")]
    code = "import sys; from attsvm.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr
    assert "INFO" not in proc.stderr, proc.stderr  # Dask's ~40 INFO lines per run stay hidden without -v


@pytest.mark.parametrize(
    "argv, named",
    [
        (["solve", "--n", "100000", "--T", "1000", "--d", "1000"], "n=100000, T=1000, d=1000"),
        (["train", "--n", "1000000000"], "--n 1000000000"),
        (["train", "--runs", "10000000", "--n", "50", "--T", "50", "--d", "50", "--steps", "2"], "--runs 10000000"),
    ],
)
def test_sizes_past_the_machines_memory_are_refused_before_allocation(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 naming the sizes, at once (these exited 70 with torch's allocator message, or hung for hours)."""
    assert main(argv) == EXIT_USAGE
    line = _one_line(capsys)
    assert named in line and "this machine's" in line


def test_paper_instance_past_the_machines_memory_is_a_named_memory_error() -> None:
    from attsvm.datasets import paper_instance

    with pytest.raises(MemoryError, match="n=1000000, T=1000, d=1000"):
        paper_instance(10**6, 1000, 1000, seed=0)


def test_solve_exit_codes_follow_the_certificate_and_the_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import numpy as np

    assert main(["solve", "--norm", "nuc", "--rank", "1"]) == 1  # optimal_inaccurate is not certified (was 0)
    assert "optimal_inaccurate" in capsys.readouterr().out
    for name, X in (("str", np.array([[["a"]]])), ("complex", np.ones((2, 3, 2), complex))):
        path = tmp_path / f"{name}.npz"
        np.savez(path, X=X, y=np.ones(len(X)), v=np.ones(X.shape[-1]), Z=np.ones((len(X), X.shape[-1])))
        assert main(["solve", "--input", str(path)]) == EXIT_DATA  # (was 2, without the file)
        assert str(path) in _one_line(capsys)


def test_a_model_folder_without_config_is_a_data_error_in_claims_as_in_analyze(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "m").mkdir()
    assert main(["claims", "--models", str(tmp_path / "m"), "--out", str(tmp_path / "c")]) == EXIT_DATA
    assert "config.json" in _one_line(capsys)
    assert main(["claims", "--models", str(tmp_path / "nope"), "--out", str(tmp_path / "c")]) == EXIT_USAGE
