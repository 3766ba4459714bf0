"""`attsvm analyze` on Gemma 3 (RoPE heads, sliding and global layers): exact RoPE logits, the anatomy,
the SVM view in the heads' rotated coordinates, and the command line — on a tiny random Gemma 3 model
written by the tests themselves (the real model only in the slow test)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")

import torch

from attsvm.analysis import gemma
from attsvm.analysis._models import load_model
from attsvm.analysis.anatomy import MIN_KEYS, AttentionStats, _window_stats, analyze, default_svm_heads
from attsvm.analysis.rope_heads import rope_logits, rope_window, visible_mask
from attsvm.analysis.svm_view import RopeSVMView, rope_svm_views, svm_view
from attsvm.cli import main
from gguf_tiny import write_tiny_gemma3_gguf

WINDOW = 16  # the tiny model's sliding window


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gemma_analyze")
    gguf_file = write_tiny_gemma3_gguf(root / "tiny.gguf", seed=3, sliding_window=WINDOW, quantize=True)
    return gemma.gguf_to_folder(gguf_file, root / "folder", source={"test": "tiny"})


@pytest.fixture(scope="module")
def tiny(tiny_folder: Path) -> tuple[object, object]:
    return load_model(tiny_folder)


@pytest.fixture(scope="module")
def long_ids(tiny: tuple[object, object]) -> list[int]:
    _, tok = tiny
    ids = tok(" ".join(["attention token window sliding test"] * 12))["input_ids"][:56]  # type: ignore[operator]
    assert len(ids) > 3 * WINDOW
    return list(ids)


def test_rope_logits_are_the_models_attention(tiny: tuple[object, object], long_ids: list[int]) -> None:
    net, _ = tiny
    win = rope_window(net, long_ids, attention=True)
    assert win.layer_types == ("sliding_attention",) * 5 + ("full_attention",) and win.window == WINDOW
    logits = rope_logits(net, long_ids)
    assert len(logits) == 6
    for ell, lg in enumerate(logits):
        assert lg.dtype == torch.float64 and lg.shape == (4, len(long_ids), len(long_ids))
        np.testing.assert_allclose(
            torch.softmax(lg, -1).numpy(), win.attention[ell].numpy(), atol=1e-5, err_msg=f"layer {ell}"
        )
        assert torch.equal(lg, win.logits(ell))


def test_dropping_the_sliding_mask_changes_the_attention(tiny: tuple[object, object], long_ids: list[int]) -> None:
    """Causal-only logits match the model on the global layer and miss it on every sliding layer."""
    net, _ = tiny
    win = rope_window(net, long_ids, attention=True)
    N = len(long_ids)
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    vis = visible_mask(N, "sliding_attention", WINDOW)
    assert vis[WINDOW, 1] and not vis[WINDOW, 0] and vis.sum() < causal.sum()
    for ell in range(win.n_layers):
        p = torch.softmax(win.logits(ell, masked=False).masked_fill(~causal, -math.inf), -1)
        err = float((p - win.attention[ell]).abs().max())
        if win.layer_types[ell] == "sliding_attention":
            assert err > 1e-3, ell
        else:
            assert err < 1e-5, ell


def test_layer_capture_and_full_rank_truncation(tiny: tuple[object, object], long_ids: list[int]) -> None:
    net, _ = tiny
    win = rope_window(net, long_ids, layers=[5])
    assert win.q[0] is None and win.q[5] is not None
    with pytest.raises(ValueError, match="layer"):
        win.logits(0)
    k1, kfull = win.truncated_keys(5, (1, 16))
    torch.testing.assert_close(kfull, win.k[5], rtol=0, atol=1e-12)
    assert not torch.allclose(k1, win.k[5])
    with pytest.raises(ValueError, match="layers"):
        rope_window(net, long_ids, layers=[6])


def test_window_stats_with_a_causal_visible_mask_equal_the_causal_ones() -> None:
    """The ``visible`` path of the margin statistics reduces to the causal one (MiniLM/GPT-2 unchanged)."""
    rng = np.random.default_rng(0)
    H, N = 3, 20
    lg = torch.from_numpy(rng.standard_normal((H, N, N)) * 3)
    special = torch.zeros(N, dtype=torch.bool)
    special[0] = True
    a, b = AttentionStats(1, H, 1.0), AttentionStats(1, H, 1.0)
    _window_stats(lg, special, True, 1.0, a, 0)
    _window_stats(lg, special, True, 1.0, b, 0, visible=torch.ones(N, N, dtype=torch.bool).tril())
    for name in ("top1", "top3", "top1_content", "special_mass", "n_support", "margin_hist"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    # with a sliding window, the histogram counts exactly the visible non-top keys
    c = AttentionStats(1, H, 1.0)
    vis = visible_mask(N, "sliding_attention", 5)
    _window_stats(lg, special, True, 1.0, c, 0, visible=vis)
    kept = vis.sum(-1) >= MIN_KEYS
    assert c.margin_hist.sum() == H * float((vis[kept].sum(-1) - 1).sum())


def test_default_svm_heads() -> None:
    gemma270 = tuple("full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18))
    assert default_svm_heads(gemma270, 4, True) == [(0, 0), (5, 0), (6, 0), (11, 0)]
    full = default_svm_heads(gemma270, 4, False)
    assert sorted({layer for layer, _ in full}) == [0, 5, 6, 11, 17] and len(full) == 20


def test_analyze_tiny_gemma_quick(tiny_folder: Path, tmp_path: Path) -> None:
    res = analyze(str(tiny_folder), quick=True)
    s = res.summary()
    assert s["layer_types"] == ["sliding"] * 5 + ["global"]
    by = s["by_layer_type"]
    assert set(by) == {"sliding", "global"} and by["global"]["layers"] == [5]
    # the sliding window bounds the keys a sliding query sees, so its support keys; not the global layer's
    assert by["sliding"]["mean_support_keys"] <= WINDOW < by["global"]["mean_support_keys"]
    assert s["max_length"] > WINDOW and res.attention.n_queries > 0
    # rank d_head truncation leaves the attention unchanged
    assert res.compression.ranks[-1] == 16
    np.testing.assert_allclose(res.compression.top1_agreement[..., -1], 1.0)
    np.testing.assert_allclose(res.compression.kl[..., -1], 0.0, atol=1e-9)
    assert {r["layer_type"] for r in res.records()} == {"sliding", "global"}
    assert [(v["layer"], v["head"]) for v in res.svm_heads] == [(0, 0), (5, 0)]
    for v in res.svm_heads:
        assert v["certified"] and -1 <= v["corr_fro"] <= 1 and -1 <= v["corr_nuc"] <= 1
    out = res.save(tmp_path / "a")
    from attsvm.analysis._anatomy_report import plot_anatomy, write_anatomy_report

    plot_anatomy(out)
    report = write_anatomy_report(out).read_text()
    assert "## Sliding vs global layers" in report and "## SVM view of RoPE heads" in report
    assert "| 5 | global |" in report


def test_svm_view_of_a_tiny_rope_head(tiny: tuple[object, object]) -> None:
    net, tok = tiny
    view = svm_view(net, 5, 1, tok=tok, quick=True)
    assert isinstance(view, RopeSVMView) and view.layer_type == "global"
    assert view.fro_status == "optimal" and view.nuc_status == "optimal"
    assert view.d == view.d_head == 16 and view.n_pairs >= 2 and view.T == 6
    assert max(view.positions) > WINDOW  # queries far past the sliding window's reach
    for c in (view.corr_fro, view.corr_nuc, view.corr_fro_projected, view.corr_nuc_projected):
        assert -1.0 <= c <= 1.0
    assert view.margin_efficiency > 0  # W_h = s·I separates the head's own selection
    assert len(view.other_heads["corr_fro"]) == 3 and all(-1 <= c <= 1 for c in view.random_lowrank["corr_fro"])
    views = rope_svm_views(net, tok, [(0, 0), (0, 2)], quick=True)
    assert [v.layer_type for v in views] == ["sliding", "sliding"]
    assert all(v.fro_certificate["max_violation"] < 1e-6 for v in views)
    with pytest.raises(ValueError, match="layer:head"):
        rope_svm_views(net, tok, [(6, 0)], quick=True)
    assert "RoPE" in view.markdown()


def test_cli_analyze_tiny_gemma(tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    assert main(["analyze", str(tiny_folder), "--quick", "--out", str(out), "--svm-head", "5:1"]) == 0
    for name in ("report.md", "heads.json", "svm_heads.json", "svm_view.json", "svm_view.md", "spectra.png"):
        assert (out / name).is_file(), name
    assert json.loads((out / "svm_view.json").read_text())["layer_type"] == "global"
    assert "6x4 heads" in capsys.readouterr().out


def test_cli_names_the_missing_llm_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ATTSVM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(sys.modules, gemma.PACKAGE, None)
    assert main(["analyze", "gemma3-270m", "--quick", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and '".[llm]"' in err[0]


def test_cli_defaults_match_the_library() -> None:
    from attsvm.analysis import anatomy
    from attsvm.cli import _analyze

    assert _analyze.ROPE_DEFAULT == anatomy.ROPE_DEFAULT and _analyze.ROPE_QUICK == anatomy.ROPE_QUICK


@pytest.mark.slow
def test_real_gemma_analyze_quick() -> None:
    """The real Gemma 3 270M ([llm] extra): the quick anatomy, with its sliding/global summaries."""
    pytest.importorskip(gemma.PACKAGE)
    res = analyze("gemma3-270m", quick=True)
    s = res.summary()
    assert (s["n_layers"], s["n_heads"], s["d_head"]) == (18, 4, 256)
    assert [i for i, t in enumerate(s["layer_types"]) if t == "global"] == [5, 11, 17]
    assert s["max_length"] > 512  # windows longer than the sliding window
    by = s["by_layer_type"]
    assert by["sliding"]["mean_support_keys"] <= 512 and by["global"]["n_heads"] == 12
    assert [(v["layer"], v["head"]) for v in res.svm_heads] == [(0, 0), (5, 0), (6, 0), (11, 0)]
    assert all(v["certified"] and -1 <= v["corr_fro"] <= 1 for v in res.svm_heads)
    agree = res.compression.top1_agreement.mean((0, 1))
    assert agree[-1] > agree[0]
