"""Malformed press arguments and extreme logits (stop-8 audit 9; runs in the kvpress venv only).

Each is a named error or a finite answer, where it used to be a string flag read as True, numpy integers
refused, a field reassigned after construction taking effect unchecked, NaN scores, or protected keys
that only tied the best unprotected one in bfloat16.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
kvpress = pytest.importorskip("kvpress")
transformers = pytest.importorskip("transformers")

from test_presses import ids, llama, prefill

from attsvm.integrations import kvpress as kvp
from attsvm.integrations.kvpress import (
    H2ODecodingPress,
    H2OPress,
    SVMarginDecodingPress,
    SVMarginPress,
    compute_n_kept,
)

pytestmark = pytest.mark.kvpress


@pytest.mark.parametrize("cls", [SVMarginDecodingPress, H2ODecodingPress], ids=["svm", "h2o"])
@pytest.mark.parametrize("carry", ["no", None, 1])
def test_carry_must_be_a_bool(cls, carry):
    with pytest.raises(TypeError, match="carry must be a bool"):  # ("no" kept carrying on)
        cls(carry=carry)


def test_numpy_numbers_are_accepted():
    p = SVMarginPress(compression_ratio=np.float32(0.5), window_size=np.int64(8), n_sink=np.int64(2))
    assert (p.window_size, p.n_sink) == (8, 2) and type(p.window_size) is int
    d = SVMarginDecodingPress(target_size=np.int64(8), compression_interval=np.int64(4))
    assert (d.target_size, d.compression_interval) == (8, 4)
    assert kvp.check_compression_ratio(np.int64(0)) == 0.0
    assert compute_n_kept(np.int64(10), 0.5) == 5


@pytest.mark.parametrize(
    "k_len, exc", [(-10, ValueError), (0, ValueError), (10.7, TypeError), (True, TypeError), (math.inf, TypeError)]
)
def test_compute_n_kept_checks_k_len(k_len, exc):
    with pytest.raises(exc, match="k_len"):
        compute_n_kept(k_len, 0.5)


def test_a_field_reassigned_after_construction_is_checked_at_score_time():
    model = llama()
    p = SVMarginPress(compression_ratio=0.5, window_size=8)
    p.compression_ratio = 1.5  # (kept 0 keys silently)
    with pytest.raises(ValueError, match="compression_ratio"):
        prefill(model, p, ids())
    p = SVMarginPress(compression_ratio=0.5, window_size=8)
    p.window_size = 0  # (a raw size-mismatch error)
    with pytest.raises(ValueError, match="window_size"):
        prefill(model, p, ids())


def test_base_press_is_checked_and_not_silently_overridden():
    with pytest.raises(TypeError, match="base_press"):
        SVMarginDecodingPress(base_press="x")  # (kvpress's bare AssertionError)
    with pytest.raises(ValueError, match="window_size and n_sink configure the default base press"):
        SVMarginDecodingPress(base_press=H2OPress(window_size=4), window_size=16)  # (16 was ignored)
    assert SVMarginDecodingPress(base_press=H2OPress(window_size=4)).base_press.window_size == 4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_protected_keys_strictly_beat_every_other_score(dtype):
    scores = torch.tensor([[[256.0, 1.0, 2.0, 250.0]]], dtype=dtype)
    out = kvp.protect(scores, 1, 0)  # (bf16: 256 + 1 rounded back to 256, a tie)
    assert bool((out[..., -1] > out[..., :-1].amax()).all()) and bool(torch.isfinite(out).all())
    assert out[..., -1:].topk(1).indices.item() == 0 and out.topk(1, dim=-1).indices.item() == 3


def test_huge_and_infinite_logits_give_no_nan():
    logits = torch.randn(1, 4, 3, 6, dtype=torch.float64) * 1e39  # beyond float32 (was NaN for H2O)
    visible = torch.ones(3, 6, dtype=torch.bool).tril(3)
    assert torch.isfinite(kvp.attention_scores(logits, visible, 2)).all()
    logits[0, 0, 0, 0] = math.inf  # (margins were inf − inf = NaN)
    assert not torch.isnan(kvp.margin_scores(logits, visible, 2)).any()
    assert not torch.isnan(kvp.attention_scores(logits, visible, 2)).any()


def test_h2o_on_a_model_with_huge_query_key_weights_scores_no_nan():
    model = llama()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(1e150)
            layer.self_attn.k_proj.weight.mul_(1e150)
    seen = []
    press = H2OPress(compression_ratio=0.5, window_size=8)
    score = press.score

    def spy(*args, **kwargs):
        s = score(*args, **kwargs)
        seen.append(bool(torch.isnan(s).any()))
        return s

    press.score = spy
    prefill(model, press, ids())
    assert seen and not any(seen)
