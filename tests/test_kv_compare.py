"""`attsvm kv-compare` in the main environment (attsvm's methods; kvpress's run in tests/kvpress/)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("pandas")

from attsvm.analysis.kv_compare import (
    ATTSVM_CACHES,
    QUICK_COMPARE,
    BudgetMismatch,
    CompareConfig,
    Method,
    _method,
    answer_context,
    available_methods,
    bootstrap_ci,
    compute_n_kept,
    kv_compare,
    plot_kv_compare,
    write_compare_report,
)
from attsvm.analysis.lm import TINY_RETRIEVAL_LM, load_llama_lm, train_llama_lm
from attsvm.analysis.tasks import make_rows
from attsvm.cli import main

pytestmark = pytest.mark.models

TINY_COMPARE = dataclasses.replace(
    QUICK_COMPARE,
    n_tokens=40,
    n_samples=1,
    ratios=(0.5, 0.9),
    chunk=8,
    window_size=4,
    ppl_sequences=1,
    ppl_context=24,
    ppl_continuation=8,
    n_boot=50,
    lm=TINY_RETRIEVAL_LM,
)


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    return train_llama_lm(tmp_path_factory.mktemp("lm") / "tiny", TINY_RETRIEVAL_LM)


def test_n_kept_is_kvpress_rule_and_ratios_are_checked():
    assert compute_n_kept(1025, 0.25) == 768 and compute_n_kept(1025, 0.9) == 102 and compute_n_kept(3, 0.9) == 1
    assert compute_n_kept(10, 0.0) == 10
    for bad in (1.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="ratio"):
            compute_n_kept(10, bad)
    with pytest.raises(ValueError, match="ratio"):
        CompareConfig(ratios=(0.5, 1.0))
    with pytest.raises(ValueError, match="methods"):
        CompareConfig(methods=("h2o",))


def test_bootstrap_ci_resamples_contexts():
    assert bootstrap_ci(np.ones(6), np.arange(6), n_boot=100) == (1.0, 1.0)
    scores = np.array([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    lo, hi = bootstrap_ci(scores, np.arange(6), n_boot=2000)
    assert lo < 0.5 < hi
    # one context holding all rows: resampling it can never change the mean
    assert bootstrap_ci(scores, np.zeros(6), n_boot=100) == (0.5, 0.5)
    with pytest.raises(ValueError, match="equal non-empty"):
        bootstrap_ci(scores, np.arange(5), n_boot=10)


def test_every_method_keeps_n_kept_and_a_cache_that_never_evicts_equals_the_full_cache(tiny_lm):
    model, tok = load_llama_lm(tiny_lm)
    rows = make_rows("mqar", 1, n_tokens=40, seed=3)
    context = rows["context"][0]
    queries = [(r.question, r.answer_prefix, r.max_new_tokens) for r in rows.itertuples()]
    full, n, n_all = answer_context(model, tok, _method("full", 4), 0.0, context, queries)
    assert n_all == n == 41  # bos + 40 context tokens
    names, _ = available_methods(ATTSVM_CACHES)
    for name in names:
        preds, _, kept = answer_context(model, tok, _method(name, 4), 0.5, context, queries, chunk=8)
        assert kept == compute_n_kept(n, 0.5) and len(preds) == len(queries)
    from attsvm.analysis.kv_cache import EvictionCache

    for kind, chunk in (("decode", 8), ("decode", 7), ("oneshot", 8)):
        # a cache that never evicts: the chunked prefill and the decoding path answer exactly as the full cache
        roomy = Method("roomy", "attsvm", kind, lambda m, r, k: EvictionCache(m, "svm", budget=k + 64))
        same, _, _ = answer_context(model, tok, roomy, 0.0, context, queries, chunk=chunk)
        assert same == full, (kind, chunk)


def test_a_method_that_keeps_a_different_number_is_refused(tiny_lm):
    from attsvm.analysis.kv_cache import EvictionCache

    model, tok = load_llama_lm(tiny_lm)
    greedy = Method("greedy", "attsvm", "decode", lambda m, r, k: EvictionCache(m, "recent", budget=k - 1))
    with pytest.raises(BudgetMismatch, match="must keep n_kept"):
        answer_context(model, tok, greedy, 0.5, "k17 v42 . " * 10, [("\nQuestion : ?", "Answer : k17", 2)])


def test_kv_compare_writes_results_report_parquet_and_figures(tiny_lm, tmp_path):
    res = kv_compare(TINY_COMPARE, lm_dir=tiny_lm)
    out = res.save(tmp_path / "cmp")
    figs = plot_kv_compare(out)
    report = write_compare_report(out).read_text()
    assert all(p.is_file() and p.stat().st_size > 0 for p in figs)
    data = json.loads((out / "results.json").read_text())
    runnable, skipped = available_methods()
    methods = {s["method"] for s in data["results"]}
    assert methods == set(runnable)
    for s in data["results"]:
        assert 0.0 <= s["ci_low"] <= s["accuracy"] <= s["ci_high"] <= 1.0
        if s["method"] != "full":
            cell = [
                t["n_kept"]
                for t in data["results"]
                if (t["task"], t["ratio"], t["mode"]) == (s["task"], s["ratio"], s["mode"]) and t["method"] != "full"
            ]
            assert len(set(cell)) == 1  # the same number of keys for every method
    assert {s["mode"] for s in data["results"]} == {"agnostic", "aware"}
    assert {p["method"] for p in data["perplexity"]} == set(runnable)
    import pandas as pd

    rows = pd.read_parquet(out / "rows.parquet")
    assert len(rows) == sum(s["n_rows"] for s in data["results"])
    assert "## Verdict" in report
    # the tiny model cannot retrieve: the comparison must say it is void, never pass silently
    assert data["meta"]["void"] and "COMPARISON VOID" in report
    if skipped:
        assert "attsvm's methods only" in report


def test_cli_quick_runs_and_bad_ratios_are_named(tiny_lm, tmp_path, capsys):
    out = tmp_path / "q"
    assert (
        main(
            [
                "kv-compare",
                "--quick",
                "--lm",
                str(tiny_lm),
                "--out",
                str(out),
                "--samples",
                "1",
                "--ratios",
                "0.5,0.9",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    assert (out / "report.md").is_file() and (out / "rows.parquet").is_file() and (out / "accuracy.png").is_file()
    assert "kv-compare:" in capsys.readouterr().out
    assert main(["kv-compare", "--quick", "--ratios", "0.5,1.0", "--out", str(tmp_path / "bad")]) == 2
    assert "ratio must be in [0, 1)" in capsys.readouterr().err


def test_verdicts_need_enough_contexts_and_separated_intervals():
    from attsvm.analysis.kv_compare import MIN_VERDICT_CONTEXTS, _verdicts

    def cell(method, acc, lo, hi, n):
        return {
            "method": method,
            "mode": "agnostic",
            "task": "vt",
            "ratio": 0.5,
            "accuracy": acc,
            "ci_low": lo,
            "ci_high": hi,
            "n_contexts": n,
        }

    n = MIN_VERDICT_CONTEXTS
    assert _verdicts([cell("svm_margin_cache", 1, 1, 1, n), cell("knorm", 0, 0, 0, n)])[0]["verdict"] == "win"
    assert _verdicts([cell("svm_margin_cache", 0, 0, 0, n), cell("knorm", 1, 1, 1, n)])[0]["verdict"] == "lose"
    assert (
        _verdicts([cell("svm_margin_cache", 0.6, 0.2, 0.9, n), cell("knorm", 0.5, 0.1, 0.8, n)])[0]["verdict"] == "tie"
    )
    one = _verdicts([cell("svm_margin_cache", 1, 1, 1, 1), cell("knorm", 0, 0, 0, 1)])
    assert one[0]["verdict"] == "too few contexts"
