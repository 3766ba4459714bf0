"""``attsvm claims`` (docs/spec.md §7): each metric against values computed by hand on tiny constructed
attention maps, the bootstrap and the verdict rule, and the command end to end (--quick)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from attsvm.analysis.claims import (
    DELTAS,
    MIN_KEYS,
    SINK_EPS,
    _verdict,
    bootstrap_ci,
    sequence_metrics,
    verdicts,
)

TOL = 1e-12  # hand-computed values


def _tiny_llama(seed: int):
    """A random-init GQA Llama (2 layers, 4 query heads on 2 KV heads, head_dim 8) with eager attention."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    cfg._attn_implementation = "eager"
    return LlamaForCausalLM(cfg).eval()


def _maps() -> np.ndarray:
    """Layer 1, two heads over 4 keys (bidirectional): head 0 sinks 0.9 on key 0 (0.1/3 elsewhere), head 1
    is uniform."""
    A = np.zeros((1, 2, 4, 4))
    A[0, 0] = np.array([0.9, 0.1 / 3, 0.1 / 3, 0.1 / 3])
    A[0, 1] = 0.25
    return A


def test_concentration_sink_and_support_by_hand():
    m = sequence_metrics(_maps(), np.zeros(4, dtype=bool), causal=False)
    assert abs(m.top1[0, 0] - 0.9) <= TOL and abs(m.top1[0, 1] - 0.25) <= TOL
    assert abs(m.top3[0, 0] - (0.9 + 0.2 / 3)) <= TOL and abs(m.top3[0, 1] - 0.75) <= TOL
    assert abs(m.entropy[0, 1] - math.log(4)) <= TOL
    assert abs(m.first[0, 0] - 0.9) <= TOL and abs(m.first[0, 1] - 0.25) <= TOL
    assert m.pairs_top3 == 0.5  # head 0's 4 queries qualify (0.967 ≥ 0.95), head 1's do not
    # margins: head 0 has log(0.9/(0.1/3)) = 3.30 to the others; head 1 all zero
    j = {d: k for k, d in enumerate(DELTAS)}
    assert m.support[j[0.5], 0, 0] == 1 and m.support[j[2.0], 0, 0] == 1 and m.support[j[4.0], 0, 0] == 4
    assert m.support[j[0.5], 0, 1] == 4 and abs(m.support_share[j[0.5], 0, 1] - 1.0) <= TOL
    rec = {r.claim: r for r in verdicts("toy", [m])}
    assert rec["sinks"].value == 0.5 and SINK_EPS < 0.9  # one of the two heads is a sink
    assert abs(rec["concentration"].details["share_with_specials"][0] - 0.5) <= TOL


def test_special_keys_are_removed_and_renormalised():
    special = np.array([True, False, False, False])
    m = sequence_metrics(_maps(), special, causal=False)
    assert abs(m.special_mass[0, 0] - 0.9) <= TOL and abs(m.special_mass[0, 1] - 0.25) <= TOL
    assert abs(m.top3_ex[0, 0] - 1.0) <= TOL and abs(m.top3_ex[0, 1] - 1.0) <= TOL  # 3 keys left
    assert m.pairs_top3_ex == 1.0


def test_causal_maps_count_only_queries_with_enough_keys():
    N = 6
    A = np.zeros((1, 1, N, N))
    for q in range(N):
        A[0, 0, q, : q + 1] = 1.0 / (q + 1)  # uniform over the visible keys
    m = sequence_metrics(A, np.zeros(N, dtype=bool), causal=True)
    counted = [q for q in range(N) if q + 1 >= MIN_KEYS]
    assert abs(m.top1[0, 0] - np.mean([1.0 / (q + 1) for q in counted])) <= TOL
    j1 = DELTAS.index(1.0)
    assert abs(m.support[j1, 0, 0] - np.mean([q + 1 for q in counted])) <= TOL
    assert abs(m.support_share[j1, 0, 0] - 1.0) <= TOL


def test_bootstrap_and_verdicts():
    assert bootstrap_ci([0.3, 0.3, 0.3]) == (0.3, 0.3, 0.3)
    mean, lo, hi = bootstrap_ci(np.r_[np.zeros(50), np.ones(50)], seed=1)
    assert mean == 0.5 and 0.35 < lo < 0.5 < hi < 0.65
    assert _verdict(0.6, 0.7, 0.5) == "supported" and _verdict(0.3, 0.4, 0.5) == "not supported"
    assert _verdict(0.4, 0.6, 0.5) == "mixed"
    assert (
        _verdict(2.0, 2.5, 3.0, above=False) == "supported" and _verdict(3.5, 4.0, 3.0, above=False) == "not supported"
    )


@pytest.mark.parametrize(
    "attn, special, match",
    [(np.zeros((2, 4, 4)), np.zeros(4, bool), "attn"), (np.zeros((1, 1, 4, 4)), np.zeros(3, bool), "special")],
)
def test_bad_input(attn, special, match):
    with pytest.raises(ValueError, match=match):
        sequence_metrics(attn, special, causal=False)


def test_claims_command_quick(tmp_path, monkeypatch):
    from attsvm.cli import main

    monkeypatch.setenv("ATTSVM_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "claims"
    assert main(["claims", "--quick", "--out", str(out)]) == 0  # the default models: minilm, gpt2-tiny, llama-tiny
    res = json.loads((out / "results.json").read_text())
    recs = res["records"]
    assert {(r["model"], r["claim"]) for r in recs} == {
        (m, c) for m in ("minilm", "gpt2-tiny", "llama-tiny") for c in ("concentration", "sinks", "support", "low-rank")
    } | {("gpt2-tiny", "serving"), ("llama-tiny", "serving")}
    assert any("minilm" in x for x in res["not_measured"])  # (no serving simulation: not causal)
    lr = next(r for r in recs if r["model"] == "llama-tiny" and r["claim"] == "low-rank")
    assert "mla_latent_perplexity" in lr["details"]
    assert res["smoke_test"] is True  # --quick: numbers, no verdicts
    for r in recs:
        assert r["verdict"] == "smoke test: settings too small for a verdict"
        assert r["ci"][0] <= r["value"] <= r["ci"][1] and r["citation"] and r["definition"]
    assert "random-init" in res["models"]["llama-tiny"]
    report = (out / "report.md").read_text()
    assert "## sinks" in report and "Gu et al." in report and "## Not measured" in report
    assert (out / "claims.png").stat().st_size > 1000


def test_full_rank_projection_changes_nothing_and_lower_ranks_do():
    """At r = d_head the truncated heads equal the model's: identical selections and support, zero output
    error, margins unchanged."""
    import torch

    from attsvm.analysis._models import attention_inputs, corpus_windows, load_model, qk_weights
    from attsvm.analysis.claims import lowrank_metrics, value_weights

    net, tok = load_model("minilm")
    _, ids = next(iter(corpus_windows(tok, max_length=24, max_windows=1)))
    with torch.no_grad():
        out = net(torch.tensor([ids]), output_hidden_states=True)
    inputs = [x[0].double().numpy() for x in attention_inputs(net, out.hidden_states)]
    w = qk_weights(net)
    Wv, bv = value_weights(net)
    m = lowrank_metrics(w, Wv, bv, inputs, (1, w.d_head))
    j = m.ranks.index(w.d_head)
    assert np.all(m.top1[j] == 1.0) and np.all(m.jaccard[j] == 1.0)
    assert np.abs(m.output_error[j]).max() <= 1e-9 and np.abs(m.margin_ratio[j] - 1.0).max() <= 1e-9
    assert m.top1[0].mean() < 1.0 and m.output_error[0].mean() > 1e-3  # rank 1 does change the heads


def test_mla_latent_of_full_size_keeps_the_perplexity(tiny_lm_folder):
    from attsvm.analysis.claims import mla_perplexity
    from attsvm.analysis.lm import TINY_LM, encode_heldout, load_lm

    net, tok = load_lm(tiny_lm_folder)
    held = encode_heldout(tok, TINY_LM, n_seq=2, seq_len=32)
    d = int(net.config.hidden_size)
    ppl = mla_perplexity(net, held, [1, d])
    import torch

    with torch.no_grad():
        ref = float(torch.exp(net(held, labels=held).loss))
    assert abs(ppl[d] - ref) <= 1e-9 * ref
    assert ppl[1] != ppl[d]
    from attsvm.analysis._models import load_model

    bert = load_model("minilm")[0]
    with pytest.raises(ValueError, match="GPT-2"):
        mla_perplexity(bert, held, [4])


def test_keep_sets_pages_and_shared_by_hand():
    from attsvm.analysis.claims import keep_sets

    score = np.array([[[5.0, 1.0, 9.0, 9.0, 2.0, 8.0, 8.0, 8.0], [0.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 3.0]]])
    per = keep_sets(score, 2)
    assert per[0, 0].tolist() == [False, True, False, False, True, False, False, False]
    assert per[0, 1].tolist() == [True, False, False, False, False, False, False, True]
    pages = keep_sets(score, 4, page=4)  # one page of 4: the one holding each head's best key
    assert pages[0, 0].tolist() == [True] * 4 + [False] * 4 and pages[0, 1].tolist() == [True] * 4 + [False] * 4
    shared = keep_sets(score, 2, shared=True)  # min over heads: keys 0 (0.0) and 1 (1.0)
    assert shared[0, 0].tolist() == shared[0, 1].tolist() == [True, True] + [False] * 6


def test_page_size_one_equals_per_token_eviction():
    from attsvm.analysis.claims import keep_sets

    rng = np.random.default_rng(0)
    score = rng.random((3, 4, 50))
    for budget in (1, 7, 25, 50):
        assert np.array_equal(keep_sets(score, budget, page=1), keep_sets(score, budget))
        assert np.array_equal(keep_sets(score, budget, page=1, shared=True), keep_sets(score, budget, shared=True))


def test_serving_simulation_loses_nothing_with_the_whole_cache_and_something_below():
    from attsvm.analysis.claims import SERVING_MODES, serving_metrics

    rng = np.random.default_rng(1)
    N = 80
    g = rng.standard_normal((2, 2, N, N)) * 3
    g = np.where(np.tril(np.ones((N, N), dtype=bool)), g, -np.inf)
    A = np.exp(g - g.max(-1, keepdims=True))
    A /= A.sum(-1, keepdims=True)
    out = serving_metrics(A, ratios=(1.0, 0.25))
    for mode in SERVING_MODES:
        assert abs(out[mode][0]) <= TOL and out[mode][1] > 0
    with pytest.raises(ValueError, match="serving"):
        serving_metrics(A[:, :, :20, :20])


def test_rope_low_rank_at_full_rank_reproduces_the_model_attention():
    """The pre-RoPE projection at r = head_dim changes nothing, and the captured logits are the model's own:
    the model's attention maps equal softmax of them (GQA Llama, random init)."""
    import torch

    from attsvm.analysis.claims import _rope_inputs, rope_lowrank_metrics

    net = _tiny_llama(0)
    ids = list(range(3, 27))
    m = rope_lowrank_metrics(net, ids, (1, 8))
    j = m.ranks.index(8)
    assert np.all(m.top1[j] == 1.0) and np.all(m.jaccard[j] == 1.0) and m.output_error[j].max() <= 1e-9
    assert m.top1[0].mean() < 1.0
    cap = _rope_inputs(net, ids)
    with torch.no_grad():
        att = net(torch.tensor([ids]), output_attentions=True).attentions
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    c = cap[1]
    q = c["attn"].q_proj(c["x"]).view(1, -1, 4, 8).transpose(1, 2)
    k = c["attn"].k_proj(c["x"]).view(1, -1, 2, 8).transpose(1, 2)
    qr, kr = apply_rotary_pos_emb(q, k, *c["pe"])
    lg = (qr @ kr.repeat_interleave(2, dim=1).transpose(-1, -2)) * c["attn"].scaling
    lg = lg.masked_fill(torch.ones(24, 24, dtype=torch.bool).triu(1), -float("inf"))
    assert torch.allclose(torch.softmax(lg, -1), att[1], atol=1e-6)


def test_serving_perplexity_is_one_with_the_whole_cache_and_moves_below():
    from attsvm.analysis.claims import SERVING_MODES, _model_attention, serving_perplexity

    net = _tiny_llama(1)
    ids = [int(t) for t in np.random.default_rng(0).integers(0, 64, 72)]
    attn, _ = _model_attention(net, ids)
    full = serving_perplexity(net, ids, attn, ratio=1.0)
    assert all(abs(full[m] - 1.0) <= 1e-12 for m in SERVING_MODES)
    cut = serving_perplexity(net, ids, attn, ratio=0.1)
    assert any(abs(cut[m] - 1.0) > 1e-4 for m in SERVING_MODES)
