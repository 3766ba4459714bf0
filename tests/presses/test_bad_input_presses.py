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


@pytest.mark.parametrize(
    "make, field, value, exc",
    [
        (lambda: SVMarginPress(compression_ratio=0.5), "compression_ratio", 1.5, ValueError),  # (kept 0 keys)
        (lambda: H2OPress(compression_ratio=0.5), "compression_ratio", "0.5", TypeError),
        (lambda: SVMarginPress(compression_ratio=0.5), "window_size", 0, ValueError),  # (a raw size mismatch)
        (lambda: H2OPress(), "n_sink", -1, ValueError),
        (lambda: SVMarginDecodingPress(), "target_size", 0, ValueError),
        (lambda: H2ODecodingPress(), "compression_interval", 2.5, TypeError),
        (lambda: SVMarginDecodingPress(), "carry", "no", TypeError),  # ("no" kept carrying on)
        (lambda: H2ODecodingPress(), "window_size", 0, ValueError),
    ],
)
def test_a_field_reassigned_after_construction_is_checked_at_once(make, field, value, exc):
    press = make()
    with pytest.raises(exc, match=field):
        setattr(press, field, value)


def test_a_reassigned_field_takes_effect_checked():
    model = llama()
    p = SVMarginPress(compression_ratio=0.5, window_size=8)
    p.compression_ratio = np.float32(0.25)  # (numpy numbers accepted, stored as Python numbers)
    assert type(p.compression_ratio) is float
    p.window_size = np.int64(4)
    assert type(p.window_size) is int
    prefill(model, p, ids())
    d = SVMarginDecodingPress(target_size=8)
    d.window_size, d.n_sink = 16, 2  # (the base press kept its own window: the change was silently lost)
    assert (d.base_press.window_size, d.base_press.n_sink) == (16, 2)


def test_base_press_is_checked_and_not_silently_overridden():
    with pytest.raises(TypeError, match="base_press"):
        SVMarginDecodingPress(base_press="x")  # (kvpress's bare AssertionError)
    with pytest.raises(ValueError, match="window_size and n_sink configure the default base press"):
        SVMarginDecodingPress(base_press=H2OPress(window_size=4), window_size=16)  # (16 was ignored)
    assert SVMarginDecodingPress(base_press=H2OPress(window_size=4)).base_press.window_size == 4


def test_window_settings_with_a_windowless_base_press_are_refused():
    with pytest.raises(ValueError, match="window_size and n_sink configure the default base press"):
        SVMarginDecodingPress(base_press=kvpress.KnormPress(), window_size=16)  # (16 was silently ignored)
    with pytest.raises(ValueError, match="n_sink"):
        SVMarginDecodingPress(base_press=kvpress.KnormPress()).n_sink = 2
    d = H2ODecodingPress(base_press=H2OPress(window_size=16), window_size=16)  # (agreeing values are fine)
    assert (d.window_size, d.n_sink) == (16, 4)
    assert H2ODecodingPress(base_press=H2OPress(window_size=8, n_sink=1)).window_size == 8  # (repr shows the base's)


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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("case", ["max", "inf", "nan"])
def test_protected_keys_strictly_beat_scores_at_the_dtype_limit(dtype, case):
    top = {"max": torch.finfo(dtype).max, "inf": math.inf, "nan": math.nan}[case]
    scores = torch.tensor([[[0.0, top, 2.0, 1.0, 0.5]]], dtype=dtype)
    out = kvp.protect(scores, 1, 1)  # (the dtype's max only tied; NaN and inf were ranked above the protected)
    assert bool(torch.isfinite(out).all())
    assert bool((out[..., [0, -1]].amin() > out[..., 1:-1].amax()).all())
    assert sorted(out.topk(2, dim=-1).indices.flatten().tolist()) == [0, 4]


@pytest.mark.parametrize("n_kv_heads, exc", [(3, ValueError), (0, ValueError), (2.0, TypeError)])
def test_score_helpers_check_n_kv_heads(n_kv_heads, exc):
    logits = torch.randn(1, 4, 3, 6)
    visible = torch.ones(3, 6, dtype=torch.bool).tril(3)
    for fn in (kvp.margin_scores, kvp.attention_scores):
        with pytest.raises(exc, match="n_kv_heads"):  # (a raw reshape RuntimeError / ZeroDivisionError)
            fn(logits, visible, n_kv_heads)


def test_window_scores_are_a_float64_softmax_in_every_dtype():
    logits = torch.randn(1, 4, 3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 30
    visible = torch.ones(3, 6, dtype=torch.bool).tril(3)
    for x in (logits, logits.to(torch.bfloat16)):  # (bf16 logits: the softmax in float64 all the same)
        probs = torch.softmax(x.double().masked_fill(~visible, -math.inf), -1)
        ref = probs.sum(-2).view(1, 2, 2, 6).sum(2)
        torch.testing.assert_close(kvp.attention_scores(x, visible, 2), ref, rtol=1e-12, atol=1e-14)
        logp = probs.log()
        margin = (logp.amax(-1, keepdim=True) - logp).amin(-2).view(1, 2, 2, 6).amin(2)
        torch.testing.assert_close(kvp.margin_scores(x, visible, 2), -margin, rtol=1e-12, atol=1e-12)
    # margins past float32's 103 nats stay finite and ordered (a float32 softmax underflowed them to one tie)
    far = torch.tensor([[[[0.0, -150.0, -200.0, -120.0]]]])
    got = kvp.margin_scores(far, torch.ones(1, 4, dtype=torch.bool), 1)[0, 0]
    torch.testing.assert_close(got, torch.tensor([0.0, -150.0, -200.0, -120.0], dtype=torch.float64))


@pytest.mark.parametrize("cls", [SVMarginPress, H2OPress, SVMarginDecodingPress], ids=lambda c: c.__name__)
def test_a_model_without_rope_is_named_up_front(cls):
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=32)
    )
    press = cls() if cls is SVMarginDecodingPress else cls(compression_ratio=0.5)
    with pytest.raises(ValueError, match="model must be a RoPE decoder"), press(gpt2):  # (AttributeError: 'model')
        pass


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("cls", [SVMarginPress, H2OPress, SVMarginDecodingPress], ids=lambda c: c.__name__)
def test_a_left_padded_batch_is_refused_as_the_cache_refuses_it(cls, attn):
    """Padding would be scored, protected as sinks and counted in the budget: refused, naming the press."""
    model = llama(attn)
    x = ids()
    x2 = torch.cat([x, x], 0)
    mask = torch.ones_like(x2)
    mask[0, :5] = 0  # (row 0 left-padded)
    press = cls(compression_ratio=0.5, window_size=8) if cls is not SVMarginDecodingPress else cls(window_size=8)
    cache = transformers.DynamicCache(config=model.config)

    def prefill_and_step() -> None:
        with torch.no_grad(), press(model):
            model(input_ids=x2, attention_mask=mask, past_key_values=cache)
            model(input_ids=x2[:, -1:], attention_mask=torch.cat([mask, mask[:, -1:]], 1), past_key_values=cache)

    with pytest.raises(ValueError, match=f"{cls.__name__} does not support padded batches"):
        prefill_and_step()
    with torch.no_grad(), press(model):  # (an all-ones mask is no padding)
        model(input_ids=x2, attention_mask=torch.ones_like(x2), past_key_values=transformers.DynamicCache())
