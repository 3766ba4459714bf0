"""The small causal LM trained by attsvm (issue #5 part 4a): seeded, cached, a normal HF checkpoint."""

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
