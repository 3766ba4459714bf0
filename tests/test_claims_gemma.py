"""The claims on a hybrid local/global decoder (attsvm.analysis.claims_gemma), checked on tiny random Gemma 3
models against the dense reference implementations of attsvm.analysis.claims. Every number these tests
produce comes from a random model: a smoke test of the machinery, never evidence about Gemma."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")

import itertools

import torch

from attsvm.analysis import claims, claims_gemma, gemma
from attsvm.analysis._models import load_model
from gguf_tiny import write_tiny_gemma3_gguf

WINDOW = 16


def _folder(root: Path, window: int) -> Path:
    g = write_tiny_gemma3_gguf(root / "tiny.gguf", seed=5, sliding_window=window)
    return gemma.gguf_to_folder(g, root / "folder")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """A tiny Gemma 3 whose sliding window (16) is shorter than the windows measured."""
    net, tok = load_model(_folder(tmp_path_factory.mktemp("g16"), WINDOW), causal_lm=True)
    return net, tok


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """The same layout with a window (128) longer than every sequence: every layer is plainly causal."""
    folder = _folder(tmp_path_factory.mktemp("g128"), 128)
    net, tok = load_model(folder, causal_lm=True)
    return net, tok, folder


def _ids(tok, n: int, start: int = 500) -> list[int]:
    train, _ = claims_gemma.corpus_streams(tok)
    return [tok.bos_token_id, *train[start : start + n - 1]]


def _dense(net, ids: list[int]) -> np.ndarray:
    probs = []
    hooks = [
        layer.self_attn.register_forward_hook(lambda m, a, o: probs.append(o[1][0].double().numpy()))
        for layer in net.model.layers
    ]
    try:
        with torch.no_grad():
            net(torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    return np.stack(probs)


def test_streaming_reductions_equal_the_dense_metrics_with_sliding_windows(tiny) -> None:
    net, tok = tiny
    ids = _ids(tok, 80)
    got = claims_gemma.measure_window(net, tok, ids)
    A = _dense(net, ids)
    _, window, kinds = claims_gemma._gemma_layout(net)
    assert window == [WINDOW] * 5 + [None] and kinds[-1] == "full_attention"
    ref = claims.sequence_metrics(A, claims._special_mask(tok, ids), True, windows=window)
    for f in ("top1", "top3", "entropy", "top3_ex", "special_mass", "first", "support", "support_share"):
        np.testing.assert_allclose(getattr(got.seq, f), getattr(ref, f), rtol=1e-12, atol=1e-12, err_msg=f)
    np.testing.assert_allclose(got.seq.support_by_length, ref.support_by_length, rtol=1e-12, equal_nan=True)
    assert got.seq.pairs_top3 == pytest.approx(ref.pairs_top3) and got.seq.pairs_top3_ex == pytest.approx(
        ref.pairs_top3_ex
    )
    # the sliding layers count only their window's keys: the causal-only reference differs there
    causal_only = claims.sequence_metrics(A, claims._special_mask(tok, ids), True)
    assert not np.allclose(causal_only.support_share[:, :5], got.seq.support_share[:, :5])
    np.testing.assert_allclose(causal_only.support_share[:, 5], got.seq.support_share[:, 5], rtol=1e-12)
    # BOS removed and renormalised, from the dense maps
    rest = A[:, :, 3:, 1:]
    t3 = np.sort(rest / rest.sum(-1, keepdims=True), -1)[..., -3:].sum(-1)
    np.testing.assert_allclose(got.top3_nobos, t3.mean(-1), rtol=1e-12)
    # a layer subset is the dense metrics of those layers
    sub = claims_gemma._subset(got, np.array([5]))
    ref5 = claims.sequence_metrics(A[5:], claims._special_mask(tok, ids), True)
    np.testing.assert_allclose(sub.support, ref5.support, rtol=1e-12)
    np.testing.assert_allclose(sub.support_by_length, ref5.support_by_length, rtol=1e-12, equal_nan=True)
    assert sub.pairs_top3 == pytest.approx(ref5.pairs_top3)


def test_serving_matches_the_dense_simulation_when_no_window_binds(wide) -> None:
    net, tok, _ = wide
    ids = _ids(tok, 64)
    got = claims_gemma.measure_window(net, tok, ids, serving=True)
    A = _dense(net, ids)
    ref_lost = claims.serving_metrics(A)
    for mode in ("layer_shared", "all"):  # one key head: the group shares its keys, as "layer_shared" does
        np.testing.assert_allclose(got.serving["lost"][mode], ref_lost[mode], rtol=1e-9, atol=1e-12, err_msg=mode)
    ref_ppl = claims.serving_perplexity(net, ids, A, 0.5)
    for mode in claims.SERVING_MODES:
        assert got.serving["ppl_ratio"][mode] == pytest.approx(ref_ppl[mode], rel=1e-4), mode
    assert any(abs(v - 1) > 1e-3 for v in got.serving["ppl_ratio"].values())  # eviction changed the predictions


def test_serving_caches_only_the_window_of_a_sliding_layer(tiny) -> None:
    net, tok = tiny
    ids = _ids(tok, 96)
    got = claims_gemma.measure_window(net, tok, ids, serving=True)
    S = len(ids) - claims.SERVING_EVAL
    mods, window, _ = claims_gemma._gemma_layout(net)
    scorer = claims_gemma._ServingScorer(len(mods), len(ids), window)
    A = torch.from_numpy(_dense(net, ids))
    for ell in range(len(mods)):
        scorer.add(ell, A[ell])
    keep = scorer.keep()["per_head"]
    for ell in range(5):  # sliding: half of the last WINDOW keys, nothing older
        assert keep[ell].sum() == WINDOW // 2 and not keep[ell, : S - WINDOW].any()
    assert keep[5].sum() == round(0.5 * S)
    np.testing.assert_allclose(got.serving["lost_by_layer"]["per_head"], scorer.lost(keep), rtol=1e-12)
    # the masked forward: keeping everything reproduces the loss of the plain forward
    x = torch.tensor([ids])
    masks: list = [None] * len(mods)
    hooks = [
        m.register_forward_pre_hook(
            lambda mod, a, kw, ell=ell: masks.__setitem__(ell, kw["attention_mask"]), with_kwargs=True
        )
        for ell, m in enumerate(mods)
    ]
    with torch.no_grad():
        lg = net(x).logits[0, S - 1 : -1].double()
    for h in hooks:
        h.remove()
    base = float(torch.nn.functional.cross_entropy(lg, x[0, S:]))
    everything = np.ones((len(mods), S), dtype=bool)
    assert claims_gemma._masked_loss(net, x, mods, masks, everything, S) == pytest.approx(base, rel=1e-6)
    assert claims_gemma._masked_loss(net, x, mods, masks, keep, S) != pytest.approx(base, rel=1e-6)


def test_rope_truncation_is_exact_at_full_rank_and_degrades_below(tiny) -> None:
    net, tok = tiny
    ids = _ids(tok, 64)
    got = claims_gemma.measure_window(net, tok, ids, lowrank_ranks=(1, 4, 16))
    low = got.lowrank
    assert low is not None and low.ranks == (1, 4, 16)
    np.testing.assert_array_equal(low.top1[-1], 1.0)
    assert np.abs(low.output_error[-1]).max() < 1e-10
    assert low.top1[0].mean() < 1.0 and low.output_error[0].mean() > 1e-3


def test_mla_latent_is_exact_at_full_size_and_restores_the_weights(wide) -> None:
    net, tok, _ = wide
    _, held = claims_gemma.corpus_streams(tok)
    heldout = [[tok.bos_token_id, *held[:63]]]
    before = {k: v.clone() for k, v in net.state_dict().items()}
    out = claims_gemma.mla_gemma(net, heldout, (4, 32))  # stacked [W_k; W_v]: 2 × 16 rows
    nll, n = claims_gemma._nll(net, torch.tensor(heldout))
    with torch.no_grad():
        ref = net(torch.tensor(heldout), labels=torch.tensor(heldout)).loss
    assert np.exp(nll / n) == pytest.approx(float(torch.exp(ref)), rel=1e-5)
    assert out[32] == pytest.approx(np.exp(nll / n), rel=1e-9) and out[4] != pytest.approx(out[32], rel=1e-3)
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_window_plan_spreads_disjoint_windows() -> None:
    plan = claims_gemma.window_plan(10_000, (512, 1024), (3, 2))
    assert sorted(n for _, n in plan) == [511, 511, 511, 1023, 1023]
    ends = sorted((s, s + n) for s, n in plan)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(ends)) and ends[-1][1] <= 10_000
    with pytest.raises(ValueError, match="too few"):
        claims_gemma.window_plan(2_000, (1024,), (3,))


def test_claims_run_on_a_gemma_folder_smoke(wide, tmp_path: Path) -> None:
    """Smoke test on a random tiny Gemma 3 folder: every claim per layer type, the report's tables."""
    _, _, folder = wide
    res = claims.run_claims([str(folder)], out=tmp_path, quick=True, progress=False)
    got = {(r["model"], r["claim"]) for r in res["records"]}
    name = str(folder)
    for model in (name, f"{name}:sliding", f"{name}:global"):
        for claim in ("concentration", "sinks", "support", "low-rank"):
            assert (model, claim) in got
    assert (name, "serving") in got
    sm = res["gemma"]["summary"][name]
    assert sm["windows"] == {"512": 2, "1024": 2}
    assert np.asarray(sm["per_head"]["top1"]).shape == (6, 4)
    assert set(sm["by_layer_type"]) == {"sliding", "global"}
    report = (tmp_path / "report.md").read_text()
    assert f"## {name} by layer type" in report and "| 5 | global |" in report
    assert json.loads((tmp_path / "results.json").read_text())["gemma"]["summary"][name]["layers"] == 6


@pytest.mark.slow
def test_claims_quick_on_the_real_gemma(tmp_path: Path) -> None:
    """The real Gemma 3 270M ([llm] extra): the quick run measures every claim per layer type."""
    pytest.importorskip(gemma.PACKAGE)
    res = claims.run_claims(["gemma3-270m"], out=tmp_path, quick=True, progress=False)
    recs = {(r["model"], r["claim"]): r for r in res["records"]}
    for model in ("gemma3-270m", "gemma3-270m:sliding", "gemma3-270m:global"):
        assert {c for m, c in recs if m == model} >= {"concentration", "sinks", "support", "low-rank"}
    assert ("gemma3-270m", "serving") in recs
    sm = res["gemma"]["summary"]["gemma3-270m"]
    assert sm["layers"] == 18 and sm["by_layer_type"]["global"]["layers"] == [5, 11, 17]
    # a pretrained model, not a random one: global layers sink on BOS, far above chance (1/N of the mass)
    assert sm["by_layer_type"]["global"]["first_token_mass"][1] > 0.2
    low = recs[("gemma3-270m", "low-rank")]["details"]
    assert low["top1_agreement"][-1] == 1.0  # full rank is exact
    mla = sm["mla_latent_perplexity"]
    assert 5 < mla["512"] < 100  # the unchanged model's held-out perplexity on pydoc text
