"""One prefill for every press (attsvm.analysis.kv_oneprefill) against kvpress's own pipeline run press by press,
on a tiny random Gemma 3 (sliding window 16, one global layer in three, MQA) with contexts past the window.
Runs in the kvpress venv; random weights: the test is that the answers are identical, not that they are good."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
kvpress = pytest.importorskip("kvpress")
transformers = pytest.importorskip("transformers")

from kvpress import (
    KeyDiffPress,
    KnormPress,
    ObservedAttentionPress,
    SnapKVPress,
    StreamingLLMPress,
    ThinKPress,
    TOVAPress,
)
from kvpress.pipeline import KVPressTextGenerationPipeline

from attsvm.analysis.kv_oneprefill import answers_one_prefill, record_prefill
from attsvm.analysis.lm import build_tokenizer
from attsvm.integrations.kvpress import H2OPress, HybridPress, SVMarginPress, SVMSupportPress
from tiny_models import GEMMA3_TYPES, tiny_gemma3

pytestmark = pytest.mark.kvpress


@pytest.fixture(scope="module")
def setup():
    texts = ["the secret code is 1234 and the key opens the door", "attention is a support vector machine"] * 20
    tok = build_tokenizer(texts, vocab_size=300)
    net = tiny_gemma3(len(tok), positions=512)
    net.generation_config.eos_token_id = tok.eos_token_id
    pipe = KVPressTextGenerationPipeline(model=net, tokenizer=tok)
    return net, tok, pipe


PRESSES = {
    "full": None,
    # (first: ThinK zeroes key channels of its inputs in place; every later method must still see the prefill's)
    "think": lambda: ThinKPress(key_channel_compression_ratio=0.75, window_size=8),
    "knorm": lambda: KnormPress(0.5),
    "snapkv": lambda: SnapKVPress(0.5, window_size=8),
    "tova": lambda: TOVAPress(0.5),
    "streaming_llm": lambda: StreamingLLMPress(0.5, n_sink=2),
    "keydiff": lambda: KeyDiffPress(0.5),
    "observed_attention": lambda: ObservedAttentionPress(0.5),
    "svm_margin": lambda: SVMarginPress(0.5, window_size=8),
    "svm_support": lambda: SVMSupportPress(0.5, window_size=8),
    "h2o": lambda: H2OPress(0.5, window_size=8),
}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_one_prefill_answers_equal_kvpress_pipeline_press_by_press(setup, seed):
    net, tok, pipe = setup
    g = torch.Generator().manual_seed(seed)
    ctx = torch.randint(0, len(tok) - 1, (1, 70), generator=g)
    questions = [torch.randint(0, len(tok) - 1, (1, 5), generator=g) for _ in range(2)]
    presses = {name: (None if make is None else HybridPress(make())) for name, make in PRESSES.items()}
    ours = answers_one_prefill(net, ctx, questions, presses, max_new_tokens=6)
    differ = set()
    for name, make in PRESSES.items():
        press = None if make is None else HybridPress(make())
        # one question per pipeline call: kvpress's pipeline removes an answer from the cache by truncating each
        # layer to its former length, which leaves a sliding-window layer's rolled window (and its count) changed
        ref = [
            pipe._forward({"context_ids": ctx, "questions_ids": [q]}, max_new_tokens=6, press=press)[0]
            for q in questions
        ]
        got = [tok.decode(torch.tensor(a), skip_special_tokens=True) for a in ours[name]]
        assert got == ref, name
        if name != "full" and got != [tok.decode(torch.tensor(a), skip_special_tokens=True) for a in ours["full"]]:
            differ.add(name)
    assert differ  # compression changed some answers: the comparison is not vacuous


def test_the_prefill_is_recorded_once_per_layer(setup):
    net, _, _ = setup
    rec = record_prefill(net, torch.arange(40)[None])
    assert sorted(rec.modules) == list(range(len(GEMMA3_TYPES))) and rec.context_length == 40
    assert sorted(rec.hidden) == [i for i, t in enumerate(GEMMA3_TYPES) if t == "full_attention"]
    assert all(rec.hidden[i].shape == (1, 40, 32) for i in rec.hidden)
    with pytest.raises(ValueError, match="context_ids"):
        record_prefill(net, torch.arange(40))


def test_methods_of_one_cache_shape_decode_as_one_batch(setup):
    """Three caches of one shape answer in one batch: one forward per decoding step, not one per cache; a cache
    that cannot be decoded gets its exception in place of its answer, the others their answers."""
    from attsvm.analysis.kv_oneprefill import answer_from_cache, answers_from_caches, compressed_cache

    net, tok, _ = setup
    g = torch.Generator().manual_seed(7)
    ctx = torch.randint(0, len(tok) - 1, (1, 70), generator=g)
    q = torch.randint(0, len(tok) - 1, (1, 5), generator=g)
    rec = record_prefill(net, ctx)
    presses = [HybridPress(KnormPress(0.5)), HybridPress(SnapKVPress(0.5, window_size=8)), SVMarginPress(0.5)]
    caches = [compressed_cache(rec, p, net) for p in presses]
    broken = compressed_cache(rec, None, net)
    broken.layers[-1].keys = broken.layers[-1].keys[..., :3]  # (a head dimension the model cannot use)
    calls = []
    hook = net.register_forward_hook(lambda *a: calls.append(1))
    try:
        got = answers_from_caches(net, [*caches, broken], q, rec.context_length, 6)
    finally:
        hook.remove()
    alone = [answer_from_cache(net, compressed_cache(rec, p, net), q, rec.context_length, 6) for p in presses]
    assert got[:3] == alone
    assert isinstance(got[3], Exception)
    assert len(calls) <= 6 + 2  # one batch of three (≤ 6 steps), then the broken cache alone (fails at once, twice)


def test_a_seeded_cache_of_a_randomised_press_does_not_depend_on_what_ran_before(setup):
    """kvpress's LeverageScorePress sketches with torch's global generator: with ``seed`` its cache is the same
    whatever drew from the generator before; without it, it changes."""
    from kvpress import LeverageScorePress

    from attsvm.analysis.kv_oneprefill import compressed_cache

    net, tok, _ = setup
    ctx = torch.randint(0, len(tok) - 1, (1, 70), generator=torch.Generator().manual_seed(11))
    rec = record_prefill(net, ctx)
    press = HybridPress(LeverageScorePress(compression_ratio=0.5))

    def kept(seed):
        torch.randn(17)  # (another method's draw)
        cache = compressed_cache(rec, press, net, seed=seed)
        return [layer.keys.clone() for layer in cache.layers]

    a, b = kept(0), kept(0)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    c, d = kept(None), kept(None)
    assert not all(torch.equal(x, y) for x, y in zip(c, d, strict=True))


def test_a_seeded_cache_leaves_the_callers_generator_alone_and_bad_input_is_named(setup):
    from attsvm.analysis.kv_oneprefill import answers_from_caches, compressed_cache

    net, tok, _ = setup
    rec = record_prefill(net, torch.randint(0, len(tok) - 1, (1, 40), generator=torch.Generator().manual_seed(5)))
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    compressed_cache(rec, HybridPress(KnormPress(0.5)), net, seed=7)
    assert torch.equal(torch.rand(3), expected)  # (the press ran under its own seed; the caller's draws go on)
    with pytest.raises(ValueError, match="seed"):
        compressed_cache(rec, None, net, seed=-1)
    cache = compressed_cache(rec, None, net)
    with pytest.raises(ValueError, match=r"^batch must be"):
        answers_from_caches(net, [cache], torch.tensor([[1, 2]]), rec.context_length, 3, batch=0)
