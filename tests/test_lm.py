"""The small causal LM trained by attsvm: seeded, cached, a normal HF checkpoint."""

from __future__ import annotations

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from attsvm.analysis.lm import TINY_LM, LMConfig, load_lm, split_corpus, train_lm

pytestmark = pytest.mark.models


def test_training_is_seeded_cached_and_loads(tmp_path):
    a = train_lm(tmp_path / "a", TINY_LM)
    b = train_lm(tmp_path / "b", TINY_LM)
    ma, _ = load_lm(a)
    mb, tok = load_lm(b)
    for (na, pa), (_, pb) in zip(ma.named_parameters(), mb.named_parameters()):
        assert torch.equal(pa, pb), na
    meta = json.loads((a / "attsvm_lm.json").read_text())
    assert meta["config"] == dataclasses.asdict(TINY_LM)
    assert meta["train_loss_last50"] < meta["train_loss_first"]  # it learned something in 8 steps
    stamp = (a / "model.safetensors").stat().st_mtime_ns
    assert train_lm(a, TINY_LM) == a and (a / "model.safetensors").stat().st_mtime_ns == stamp  # reused
    assert ma.config._attn_implementation == "eager"
    text = "The assert statement"
    assert tok.decode(tok(text)["input_ids"]) == text


def test_heldout_topics_are_never_trained_on():
    train, held = split_corpus(10)
    assert not set(train) & set(held) and len(held) >= 5


def test_bad_settings_are_named(tmp_path):
    with pytest.raises(ValueError, match="n_embd must be divisible by n_head"):
        LMConfig(n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="seq_len must be <= n_positions"):
        LMConfig(seq_len=600, n_positions=512)
    with pytest.raises(FileNotFoundError, match="not an attsvm LM checkpoint"):
        load_lm(tmp_path)


# ------------------------------------------------------------------------------- the Llama retrieval LM
from attsvm.analysis.lm import (
    RETRIEVAL_LM,
    TINY_RETRIEVAL_LM,
    LlamaLMConfig,
    build_word_tokenizer,
    generate_answer,
    load_llama_lm,
    train_llama_lm,
)

ACCURACY_BAR = 0.9  # full-cache accuracy the retrieval LM must reach on every task (else kv-compare is void)


def test_word_tokenizer_keeps_codes_whole_and_counts_words():
    from attsvm.analysis.tasks import KEY_CODES, VALUE_CODES, make_rows, split_words

    train, _ = split_corpus(10)
    tok = build_word_tokenizer(list(train.values()), 600)
    assert len(tok) == 600
    for code in (KEY_CODES[3], VALUE_CODES[97]):
        assert len(tok.encode(code, add_special_tokens=False)) == 1
    text = "k17 v42 . the value of k17 ?"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    ctx = make_rows("niah_single", 1, n_tokens=200, seed=0)["context"][0]
    assert len(tok.encode(ctx, add_special_tokens=False)) == len(split_words(ctx)) == 200
    # kvpress tokenizes context and question separately: the concatenation gives the same tokens
    assert tok.encode("<s>" + ctx, add_special_tokens=False)[0] == tok.bos_token_id


def test_llama_training_is_seeded_cached_and_loads(tmp_path):
    a = train_llama_lm(tmp_path / "a", TINY_RETRIEVAL_LM)
    b = train_llama_lm(tmp_path / "b", TINY_RETRIEVAL_LM)
    ma, tok = load_llama_lm(a)
    mb, _ = load_llama_lm(b)
    for (na, pa), (_, pb) in zip(ma.named_parameters(), mb.named_parameters()):
        assert torch.equal(pa, pb), na
    cfg = ma.config
    assert cfg.model_type == "llama" and cfg.num_attention_heads == 4 and cfg.num_key_value_heads == 2  # GQA
    # the recipe's architecture: projections with biases, a slow RoPE base
    assert cfg.attention_bias and ma.model.layers[0].self_attn.q_proj.bias is not None
    assert cfg.rope_parameters["rope_theta"] == TINY_RETRIEVAL_LM.rope_theta == 500_000.0
    assert ma.config._attn_implementation == "eager"
    meta = json.loads((a / "attsvm_lm.json").read_text())
    assert meta["config"] == dataclasses.asdict(TINY_RETRIEVAL_LM) and meta["arch"] == "llama"
    assert set(meta["full_cache_accuracy"]) == {"niah_single", "niah_multikey", "mqar", "vt"}
    assert meta["heldout_ppl"] > 1.0 and meta["n_params"] < 5_000_000
    stamp = (a / "model.safetensors").stat().st_mtime_ns
    assert train_llama_lm(a, TINY_RETRIEVAL_LM) == a and (a / "model.safetensors").stat().st_mtime_ns == stamp
    other = dataclasses.replace(TINY_RETRIEVAL_LM, seed=1)
    assert train_llama_lm(a, other) == a and (a / "model.safetensors").stat().st_mtime_ns != stamp  # retrained
    answer = generate_answer(ma, tok, "k17 v42 . the end", "\nQuestion : what is the value of k17 ?", "Answer : k17", 2)
    assert isinstance(answer, str)


def test_warm_phase_draws_repeated_codes_without_drills(tmp_path, monkeypatch):
    """The first ``warm`` fraction of the steps: a share ``warm_repeat_share`` of repeated codes and no drills."""
    from attsvm.analysis import lm

    seen = []
    real = lm._task_batch

    def spy(*args, drill, repeat):
        seen.append((drill, repeat))
        return real(*args, drill=drill, repeat=repeat)

    monkeypatch.setattr(lm, "_task_batch", spy)
    config = dataclasses.replace(TINY_RETRIEVAL_LM, steps=8, warm=0.5, warm_repeat_share=0.8)
    train_llama_lm(tmp_path / "w", config)
    assert seen == [(0.0, 0.8)] * 4 + [(config.drill_share, config.repeat_share)] * 4


def test_llama_settings_are_checked(tmp_path):
    with pytest.raises(ValueError, match="n_head must be divisible by n_kv_head"):
        LlamaLMConfig(n_head=4, n_kv_head=3)
    with pytest.raises(ValueError, match="min_len must be in"):
        LlamaLMConfig(min_len=2000)
    with pytest.raises(ValueError, match="vocab_size must be >= 512"):
        LlamaLMConfig(vocab_size=300)
    with pytest.raises(ValueError, match="warm must be in"):
        LlamaLMConfig(warm=1.0)
    with pytest.raises(ValueError, match="warm_repeat_share"):
        LlamaLMConfig(warm_repeat_share=1.5)
    with pytest.raises(ValueError, match="rope_theta"):
        LlamaLMConfig(rope_theta=0.0)
    with pytest.raises(TypeError, match="attention_bias must be a bool"):
        LlamaLMConfig(attention_bias=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config must be a LlamaLMConfig"):
        train_llama_lm(tmp_path, TINY_LM)
    with pytest.raises(FileNotFoundError, match="not an attsvm Llama LM checkpoint"):
        load_llama_lm(tmp_path)


@pytest.mark.slow
def test_retrieval_lm_reaches_the_accuracy_bar_with_the_full_cache():
    from attsvm.analysis.lm import full_cache_accuracy

    model, tok = load_llama_lm(train_llama_lm(None, RETRIEVAL_LM))
    acc = full_cache_accuracy(model, tok, n_tokens=1024, n_samples=25, seed=123)
    assert min(acc.values()) >= ACCURACY_BAR, acc
