"""Malformed arguments to the real-model SVM view and the LM helpers (stop-8 audit 9): named errors where a head
index out of range silently returned e₁, a string flag switched quick mode on, and config fields went unchecked
until training (or never)."""

from __future__ import annotations

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

from attsvm.analysis import lm
from attsvm.analysis.svm_view import collect_pairs, ov_direction, parse_head, svm_view


@pytest.fixture(scope="module")
def gpt2():
    cfg = transformers.GPT2Config(vocab_size=300, n_embd=32, n_layer=2, n_head=2, n_positions=128)
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.mark.parametrize(
    "layer, head, exc, named",
    [
        (0, 7, ValueError, "layer:head must be within"),  # (returned [1, 0, 0, ...])
        (0, -1, ValueError, "head must be >= 0"),  # (returned [1, 0, 0, ...])
        (-1, 0, ValueError, "layer must be >= 0"),  # (the last layer, silently)
        (0.5, 0, TypeError, "layer must be an integer"),
        (True, 0, TypeError, "layer must be an integer"),
    ],
)
def test_ov_direction_checks_layer_and_head(gpt2, layer, head, exc, named):
    with pytest.raises(exc, match=named):
        ov_direction(gpt2, layer, head)


def test_ov_direction_on_good_indices_is_a_unit_vector(gpt2):
    v = ov_direction(gpt2, np.int64(1), 1)
    assert v.shape == (32,) and np.linalg.norm(v) == pytest.approx(1.0)


def test_svm_view_and_collect_pairs_check_their_arguments(gpt2):
    tok = lambda *a, **k: None  # noqa: E731  (never reached)
    with pytest.raises(TypeError, match="quick must be a bool"):
        svm_view(gpt2, 0, 0, quick="no", tok=tok)  # (quick mode silently on)
    with pytest.raises(ValueError, match="seed must be >= 0"):
        svm_view(gpt2, 0, 0, seed=-1, tok=tok)
    with pytest.raises(TypeError, match="tok"):
        svm_view(gpt2, 0, 0)
    with pytest.raises(TypeError, match="layer must be an integer"):
        svm_view(gpt2, 1.7, 0, tok=tok)  # (an IndexError deep in numpy)
    with pytest.raises(TypeError, match="model must be a transformers model"):
        ov_direction(None, 0, 0)
    for kwargs, named in (
        ({"T": 0}, "T must be >= 2"),
        ({"max_windows": 0}, "max_windows"),
        ({"n_pairs": 0}, "n_pairs"),
    ):
        args = {"n_pairs": 4, "T": 4, "seed": 0, **kwargs}
        with pytest.raises(ValueError, match=named):
            collect_pairs(gpt2, tok, 0, 0, **args)
    with pytest.raises(ValueError, match="non-negative"):
        parse_head("-1:-3")


@pytest.mark.parametrize(
    "make, exc, named",
    [
        (lambda: lm.LMConfig(weight_decay=float("nan")), ValueError, "weight_decay"),
        (lambda: lm.LMConfig(weight_decay=-5.0), ValueError, "weight_decay"),
        (lambda: lm.LlamaLMConfig(weight_decay="0.01"), TypeError, "weight_decay"),
        (lambda: lm.LMConfig(heldout_every=1), ValueError, "heldout_every"),  # (refused only when training)
        (lambda: lm.LlamaLMConfig(warm="0.5"), TypeError, "warm"),
        (lambda: lm.LlamaLMConfig(answer_weight=-3.0), ValueError, "answer_weight"),
        (lambda: lm.LlamaLMConfig(head_dim=7), ValueError, "head_dim must be even"),
        (lambda: lm.encode_heldout(None, lm.TINY_LM, n_seq=2, seq_len=0), ValueError, "seq_len"),  # (ZeroDivision)
        (lambda: lm.encode_heldout(None, lm.TINY_LM, n_seq=0, seq_len=8), ValueError, "n_seq"),
        (lambda: lm.build_tokenizer(["a b c"], 10), ValueError, "vocab_size"),  # (a 257-token vocab, silently)
        (lambda: lm.build_tokenizer("abc def", 300), TypeError, "texts must be a list"),
        (lambda: lm.build_word_tokenizer("a b c", 600), TypeError, "texts must be a list"),
        (lambda: lm.load_lm(None), TypeError, "folder"),
        (lambda: lm.default_lm_dir(None), TypeError, "config"),
    ],
)
def test_lm_helpers_name_their_arguments(make, exc, named):
    with pytest.raises(exc, match=named):
        make()


def test_numpy_bool_attention_bias_is_accepted():
    assert lm.LlamaLMConfig(attention_bias=np.bool_(True)).attention_bias is True  # ("must be a bool, got bool")
