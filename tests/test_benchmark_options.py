"""Benchmark scripts refuse bad command-line options up front: argparse's usage error (exit 2) naming the
option, before any work, instead of a traceback, a silently used value or minutes of work first. Each case
runs the script as ``__main__`` (``runpy``, in this process: the imports are paid once, not per case); one
case runs it as ``python benchmarks/x.py ...`` in a subprocess, for the real process's exit status."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import runpy
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"

# (script, arguments, the option the error must name)
CASES = [
    ("bench_svm.py", ["--cap", "-5", "--sizes", "2,3,2"], "--cap"),  # BM1
    ("bench_svm.py", ["--cap", "nan", "--sizes", "2,3,2"], "--cap"),  # BM1
    ("bench_svm.py", ["--sizes", "1,2"], "--sizes"),  # BM5
    ("bench_lp.py", ["--cap", "-1", "--quick"], "--cap"),  # BM2
    ("bench_kv.py", ["--budget", "-0.5", "--tokens", "16", "--repeats", "1"], "--budget"),  # BM3
    ("bench_kv.py", ["--budget", "nan", "--tokens", "16", "--repeats", "1"], "--budget"),  # BM3
    ("bench_kv.py", ["--budget", "1", "--tokens", "16", "--repeats", "1"], "--budget"),  # nothing left to time
    ("bench_kv.py", ["--tokens", "0", "--repeats", "1"], "--tokens"),  # BM3
    ("bench_kv.py", ["--repeats", "0", "--tokens", "16"], "--repeats"),  # BM3
    ("bench_batch.py", ["--rounds", "0", "--quick"], "--rounds"),  # BM4
    ("bench_peers.py", ["--repeat", "0", "--quick"], "--repeat"),  # BM4
    ("bench_gc.py", ["--calls", "0"], "--calls"),
    ("bench_gc.py", ["--size", "6,1,10"], "--size"),
    ("bench_nuclear.py", ["--repeat", "0", "--sizes", "2,3,2", "--solvers", ""], "--repeat"),  # BM5
    ("bench_nuclear.py", ["--sizes", "1,2", "--solvers", ""], "--sizes"),  # BM5
    ("bench_nuclear.py", ["--sizes", "2,3,2", "--solvers", "BOGUS"], "--solvers"),
    ("bench_experiments.py", ["--loop-sample", "-1", "--quick", "--only", "svm-eq"], "--loop-sample"),  # BM6
    ("bench_experiments.py", ["--only", "bogus"], "--only"),  # BM6
    ("bench_experiments.py", ["--workers", "0", "--quick", "--only", "svm-eq"], "--workers"),  # BM6
    ("bench_experiments.py", ["--scheduler", "bogus", "--quick", "--only", "svm-eq"], "--scheduler"),  # BM6
    ("bench_train.py", ["--runs", "0", "--quick"], "--runs"),  # BM7
    ("bench_train.py", ["--ref-runs", "-1", "--quick"], "--ref-runs"),  # BM7
    ("bench_train.py", ["--steps", "-1", "--quick"], "--steps"),  # BM7
    ("bench_train.py", ["--device", "bogus", "--quick"], "--device"),  # BM7
    ("bench_retrieval_lm.py", ["--samples", "0"], "--samples"),  # BM8
    ("bench_retrieval_lm.py", ["--tokens", "5"], "--tokens"),  # BM8 (too short for the tasks' needles)
    ("bench_cuda.py", ["--runs", "abc"], "--runs"),  # BM9
]

# the extras a script imports before it parses its options (the others need only the core install)
NEEDS = {"bench_kv.py": "transformers", "bench_experiments.py": "pandas", "bench_retrieval_lm.py": "pandas"}


def _check_usage_error(script: str, option: str, code: object, out: str, err: str) -> None:
    assert code == 2, (code, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    assert err.startswith("usage: "), err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and errors[0].startswith(f"{script}: error: "), err
    assert option in errors[0], errors[0]
    assert out == "", out  # (refused before any work)


@pytest.mark.parametrize(("script", "args", "option"), CASES, ids=[f"{s[:-3]} {' '.join(a)}" for s, a, _ in CASES])
def test_bad_option_is_a_usage_error(script: str, args: list[str], option: str, monkeypatch, capsys) -> None:
    if script in NEEDS and importlib.util.find_spec(NEEDS[script]) is None:
        pytest.skip(f"{script} needs {NEEDS[script]}")
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.setattr(sys, "argv", [script, *args])
    environ = dict(os.environ)
    try:
        with pytest.raises(SystemExit) as exc:
            runpy.run_path(str(BENCH / script), run_name="__main__")
    finally:  # (some scripts set thread variables at import)
        os.environ.clear()
        os.environ.update(environ)
    out, err = capsys.readouterr()
    _check_usage_error(script, option, exc.value.code, out, err)


def test_a_bad_option_exits_the_real_process_with_status_2() -> None:
    script, args, option = "bench_train.py", ["--steps", "-1", "--quick"], "--steps"
    env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg", HF_HUB_OFFLINE="1")
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    _check_usage_error(script, option, proc.returncode, proc.stdout, proc.stderr)
    assert time.perf_counter() - t0 < 30


def test_shared_option_types() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        opts = importlib.import_module("_options")
    finally:
        sys.path.remove(str(BENCH))
    assert opts.positive_int("3") == 3 and opts.nonneg_int("0") == 0 and opts.seed("7") == 7
    assert opts.positive_float("2.5") == 2.5 and opts.fraction("1") == 1.0 and opts.fraction("0.25") == 0.25
    assert opts.size_triple("2,3,2") == "2,3,2" and opts.int_list("100,1000") == [100, 1000]
    bad = [
        (opts.positive_int, "0"),
        (opts.positive_int, "1.5"),
        (opts.nonneg_int, "-1"),
        (opts.seed, str(2**63)),
        (opts.positive_float, "0"),
        (opts.positive_float, "inf"),
        (opts.positive_float, "nan"),
        (opts.fraction, "0"),
        (opts.fraction, "1.01"),
        (opts.size_triple, "2,1,2"),
        (opts.size_triple, "2,3,2,1"),
        (opts.int_list, "100,,1000"),
    ]
    for fn, text in bad:
        with pytest.raises(argparse.ArgumentTypeError):
            fn(text)
