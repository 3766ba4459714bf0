"""Presses on a hybrid local/global model (a tiny random Gemma 3: sliding window 16, one global layer in three,
4 query heads on 1 KV head) with contexts longer than the window, and the press defects fixed with them.

Runs in the kvpress venv (``.venv-kvpress``); skipped elsewhere. Random weights: these test the cache mechanics,
not eviction quality."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
kvpress = pytest.importorskip("kvpress")
transformers = pytest.importorskip("transformers")

from kvpress import (
    AdaKVPress,
    ChunkPress,
    KnormPress,
    PerLayerCompressionPress,
    SnapKVPress,
    StreamingLLMPress,
    TOVAPress,
)
from kvpress.utils import compute_n_kept as kvpress_n_kept

import attsvm.integrations.kvpress as kvp
from attsvm.integrations.kvpress import (
    H2OPress,
    HybridPress,
    SVMarginDecodingPress,
    SVMarginPress,
    SVMSupportPress,
    compute_n_kept,
)
from tiny_models import GEMMA3_TYPES, logits_with_keys_hidden, tiny_gemma3

pytestmark = pytest.mark.kvpress

WINDOW = 16
N = 61  # prefill length, past the window
VOCAB = 101
TYPES = list(GEMMA3_TYPES)


@pytest.fixture(scope="module")
def gemma():
    return tiny_gemma3(VOCAB, window=WINDOW, dtype=torch.float64)


def _ids(n: int = N, seed: int = 1):
    return torch.randint(3, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


def _prefill(net, press, x):
    cache = transformers.DynamicCache(config=net.config)
    with torch.no_grad():
        if press is None:
            net(input_ids=x, past_key_values=cache)
        else:
            with press(net):
                net(input_ids=x, past_key_values=cache)
    return cache


def _decode(net, cache, new, *, positions: bool):
    n0 = cache.get_seq_length()
    kw = {"position_ids": torch.arange(n0, n0 + new.shape[1])[None]} if positions else {}
    with torch.no_grad():
        return net(input_ids=new, past_key_values=cache, **kw).logits


PRESSES = {
    "knorm": lambda r: HybridPress(KnormPress(r)),
    "snapkv": lambda r: HybridPress(SnapKVPress(r, window_size=8)),
    "tova": lambda r: HybridPress(TOVAPress(r)),
    "streaming": lambda r: HybridPress(StreamingLLMPress(r, n_sink=2)),
    "svm": lambda r: SVMarginPress(r, window_size=8),
    "h2o": lambda r: H2OPress(r, window_size=8),
    "svm_support": lambda r: SVMSupportPress(r, window_size=8),
    "hybrid-svm": lambda r: HybridPress(SVMarginPress(r, window_size=8)),
}


@pytest.mark.parametrize("name", list(PRESSES))
def test_ratio_zero_is_the_full_cache_past_the_window(gemma, name):
    x, new = _ids(), _ids(4, seed=2)
    ref = _decode(gemma, _prefill(gemma, None, x), new, positions=True)
    got = _decode(gemma, _prefill(gemma, PRESSES[name](0.0), x), new, positions=True)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", list(PRESSES))
def test_sliding_layers_keep_their_window_and_global_layers_evict(gemma, name):
    cache = _prefill(gemma, PRESSES[name](0.5), _ids())
    expected = [WINDOW - 1 if t == "sliding_attention" else compute_n_kept(N, 0.5) for t in TYPES]
    assert [layer.keys.shape[2] for layer in cache.layers] == expected
    # decoding works and its positions come from the cache (the sliding layers count every token)
    new = _ids(3, seed=2)
    a = _decode(gemma, cache, new, positions=False)
    b = _decode(gemma, _prefill(gemma, PRESSES[name](0.5), _ids()), new, positions=True)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_plain_kvpress_presses_break_on_the_sliding_layers(gemma):
    """The gap HybridPress closes: kvpress compresses the sliding layers too, and decoding past the window fails."""
    cache = _prefill(gemma, KnormPress(0.5), _ids())
    assert cache.layers[0].keys.shape[2] < WINDOW - 1
    with pytest.raises(RuntimeError):
        _decode(gemma, cache, _ids(3, seed=2), positions=True)


@pytest.mark.parametrize("name", ["knorm", "svm", "snapkv"])
def test_decoding_equals_the_full_model_with_the_evicted_keys_masked(gemma, name):
    """After eviction, the next tokens' logits are those of the uncompressed model whose global layers hide the
    evicted keys from the new queries: keys, positions and masks of the compressed cache are right."""
    x, new = _ids(), _ids(4, seed=2)
    full = _prefill(gemma, None, x)
    cache = _prefill(gemma, PRESSES[name](0.5), x)
    # which prefill slots each global layer kept (keys are unique vectors)
    hidden: dict[int, torch.Tensor] = {}
    for i, (layer, ref) in enumerate(zip(cache.layers, full.layers)):
        if TYPES[i] == "full_attention":
            kept = [int(torch.nonzero((ref.keys[0, 0] == k).all(-1))[0]) for k in layer.keys[0, 0]]
            drop = torch.ones(N, dtype=torch.bool)
            drop[kept] = False
            hidden[i] = drop
    got = _decode(gemma, cache, new, positions=True)  # a multi-token step: its tokens see their past only
    ref = logits_with_keys_hidden(gemma, x, new, hidden)
    # (eager attention takes its softmax in float32: masked and removed keys agree to float32 rounding)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got, _decode(gemma, full, new, positions=True), atol=1e-3)  # eviction mattered


# ---------------------------------------------------------------------------------------- the defects
def test_compression_ratio_one_empties_a_layer_as_in_kvpress():
    assert compute_n_kept(10, 1.0) == kvpress_n_kept(10, 1.0) == 0
    press = SVMarginPress(0.5, window_size=4)
    press.compression_ratio = 1.0  # (PerLayerCompressionPress assigns per-layer ratios, 1 included)
    assert press.compression_ratio == 1.0
    with pytest.raises(ValueError, match=r"compression_ratio must be in \[0, 1\]"):
        press.compression_ratio = 1.5


def test_per_layer_compression_with_ratio_one(gemma):
    x = _ids()
    press = PerLayerCompressionPress(SVMarginPress(window_size=8), [0.0, 0.0, 0.1, 0.0, 0.0, 1.0])
    cache = _prefill(gemma, press, x)
    sizes = [layer.keys.shape[2] for layer in cache.layers]
    assert sizes[2] == compute_n_kept(N, 0.1) and sizes[5] == 0 and sizes[0] == WINDOW - 1


def test_decoding_press_accepts_an_adakv_base():
    d = SVMarginDecodingPress(base_press=AdaKVPress(SVMarginPress(window_size=4)))
    assert isinstance(d.base_press, AdaKVPress)
    with pytest.raises(TypeError, match="ScorerPress or AdaKVPress"):
        SVMarginDecodingPress(base_press=object())


def test_chunk_press_rotates_the_window_at_the_chunks_own_positions():
    """ChunkPress hands a press slices of the prefill: the window queries are the chunk's last tokens, at the
    chunk's positions, exactly as a standalone pass over the chunk would see them."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=100.0,
    )
    model = transformers.LlamaForCausalLM(cfg).double().eval()
    press = SVMarginPress(0.5, window_size=4)
    attn = model.model.layers[0].self_attn
    seen = {}
    h = attn.register_forward_hook(lambda m, a, kw, out: seen.update(kw=dict(kw)), with_kwargs=True)
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad(), press(model):  # (sets attn.rotary_emb)
        model(input_ids=_ids(48), past_key_values=cache)
    h.remove()
    kw = seen["kw"]
    hs = kw["hidden_states"]
    keys = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=_ids(48), past_key_values=keys)
    k = keys.layers[0].keys
    cos, sin = kw["position_embeddings"]
    for i in (0, 16, 32):
        chunk = hs[:, i : i + 16]  # a view, as ChunkPress slices it
        got = press.raw_score(attn, chunk, k[:, :, i : i + 16], kw)
        alone = dict(kw, position_embeddings=(cos[:, i : i + 16], sin[:, i : i + 16]))
        ref = press.raw_score(attn, chunk.clone(), k[:, :, i : i + 16], alone)
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad(), ChunkPress(SVMarginPress(0.5, window_size=4), chunk_length=16)(model):
        model(input_ids=_ids(48), past_key_values=cache)
    assert cache.layers[0].keys.shape[2] == 3 * compute_n_kept(16, 0.5)


def test_a_budget_below_the_protected_keys_keeps_sinks_then_the_newest():
    scores = torch.randn(1, 2, 20, dtype=torch.float64)
    out = kvp.protect(scores, 6, 2)
    for b, expect in ((3, {0, 1, 19}), (5, {0, 1, 17, 18, 19}), (8, {0, 1, *range(14, 20)})):
        for h in range(2):
            assert set(out[0, h].topk(b).indices.tolist()) == expect
    assert set(out[0, 0].topk(10).indices.tolist()) >= {0, 1, *range(14, 20)}


def test_a_cache_built_without_config_as_kvpress_pipeline_does(gemma):
    """kvpress's pipeline prefills into ``DynamicCache()``, where every layer stores every key: the sliding layers
    are cut to their window (as a cache built from the config holds them), the global layers evict, and decoding
    equals the full cache at ratio 0."""
    x, new = _ids(), _ids(3, seed=2)

    def run(press):
        cache = transformers.DynamicCache()
        with torch.no_grad():
            if press is None:
                gemma.model(input_ids=x, past_key_values=cache)
            else:
                with press(gemma):
                    gemma.model(input_ids=x, past_key_values=cache)
            sizes = [layer.keys.shape[2] for layer in cache.layers]
            pos = torch.arange(N, N + new.shape[1])[None]
            return gemma(input_ids=new, past_key_values=cache, position_ids=pos).logits, sizes

    ref, _ = run(None)
    got, sizes = run(HybridPress(SnapKVPress(0.0, window_size=8)))
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    _, sizes = run(HybridPress(SnapKVPress(0.5, window_size=8)))
    assert sizes == [WINDOW - 1 if t == "sliding_attention" else compute_n_kept(N, 0.5) for t in TYPES]
    cache = transformers.DynamicCache()
    with torch.no_grad(), HybridPress(SnapKVPress(0.5, window_size=8))(gemma):
        gemma.model(input_ids=x, past_key_values=cache)
    assert cache.is_sliding == [t == "sliding_attention" for t in TYPES]


def test_margin_scores_on_a_global_layer_are_the_models_own(gemma):
    """On a Gemma global layer (q/k RMS norms, the global RoPE base) the press's recomputed window margins equal
    those read off the model's own attention probabilities (eager attention: softmax in float32)."""
    x = _ids()
    seen = {}
    attn = gemma.model.layers[2].self_attn
    h = attn.register_forward_hook(lambda m, a, kw, out: seen.update(kw=kw, probs=out[1]), with_kwargs=True)
    press = SVMarginPress(0.5, window_size=8)
    try:
        _prefill(gemma, press, x)
    finally:
        h.remove()
    keys = _prefill(gemma, None, x).layers[2].keys
    logp = seen["probs"][0, :, -8:, :].log()
    ref = -(logp.amax(-1, keepdim=True) - logp).amin(1).view(1, 4, N).amin(1)  # one KV head for 4 query heads
    with torch.no_grad():
        got = press.raw_score(attn, seen["kw"]["hidden_states"], keys, seen["kw"])[0]
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
