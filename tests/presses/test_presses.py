"""attsvm's presses against kvpress's contract, on a random GQA Llama (runs in the kvpress venv only).

Run: ``.venv-kvpress/bin/python -m pytest -q -m kvpress tests/presses`` (scripts/kvpress_env.sh builds that venv;
kvpress 0.5.5 needs transformers 5.2.x and patches attention functions when imported). In the main venv, where
kvpress is not installed, the module is skipped.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
kvpress = pytest.importorskip("kvpress")
transformers = pytest.importorskip("transformers")

from kvpress import AdaKVPress, DecodingPress, KeyRerotationPress, PrefillDecodingPress
from kvpress.utils import compute_n_kept as kvpress_n_kept

from attsvm.integrations.kvpress import H2ODecodingPress, H2OPress, SVMarginDecodingPress, SVMarginPress, compute_n_kept

pytestmark = pytest.mark.kvpress

VOCAB = 97
CONTEXT = 40
RATIOS = (0.25, 0.5, 0.9)
# float64 model, but eager attention takes its softmax in float32: scores recomputed from the hidden states agree
# with the ones read off the model's own probabilities to float32 precision (a RoPE mix-up is off by ~1e-2)
ATOL, RTOL = 1e-6, 1e-5


def llama(attn: str = "sdpa", *, n_kv: int = 2, seed: int = 0, bias: bool = False):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=n_kv,
        max_position_embeddings=256,
        rope_theta=100.0,
        attention_bias=bias,  # the retrieval LM has q/k/v/o biases
    )
    model = transformers.LlamaForCausalLM(cfg)
    if bias:  # transformers initialises biases to zero: give them values, or a press ignoring them would pass
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("_proj.bias"):
                    p.normal_(0.0, 0.5)
    model.config._attn_implementation = attn
    return model.double().eval()


@pytest.fixture(scope="module")
def model():
    return llama()


def ids(n: int = CONTEXT, seed: int = 1):
    return torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


def prefill(model, press, x):
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad(), press(model):
        model(input_ids=x, past_key_values=cache)
    return cache


def n_stored(cache):
    return [layer.keys.shape[2] for layer in cache.layers]


@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("cls", [SVMarginPress, H2OPress], ids=["svm", "h2o"])
def test_every_layer_keeps_compute_n_kept_keys(model, cls, ratio):
    cache = prefill(model, cls(compression_ratio=ratio, window_size=8), ids())
    n = compute_n_kept(CONTEXT, ratio)
    assert n == kvpress_n_kept(CONTEXT, ratio)
    assert n_stored(cache) == [n, n]
    # and the kept keys are the protected ones plus the best-scored: the sinks and the window survive
    full = prefill(model, cls(compression_ratio=0.0), ids())
    for layer, ref in zip(cache.layers, full.layers):
        kept = ref.keys[0]  # (H_kv, K, d): which original slots survived, per KV head
        for h in range(kept.shape[0]):
            slots = [int(torch.nonzero((kept[h] == k).all(-1))[0]) for k in layer.keys[0, h]]
            must = set(range(4)) | set(range(CONTEXT - 8, CONTEXT))
            assert must <= set(slots) or len(slots) < len(must)


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_prefill_scores_equal_the_models_own_attention(bias):
    """The press recomputes the window's logits with RoPE from the hidden states; they must be the model's."""
    model = llama("eager", bias=bias)
    x = ids()
    w = 8
    seen = {}
    attn = model.model.layers[1].self_attn
    handle = attn.register_forward_hook(lambda m, a, kw, out: seen.update(kw=kw, probs=out[1]), with_kwargs=True)
    press = SVMarginPress(compression_ratio=0.5, window_size=w)
    try:
        with torch.no_grad(), press(model):
            cache = transformers.DynamicCache(config=model.config)
            model(input_ids=x, past_key_values=cache, output_attentions=True)
    finally:
        handle.remove()
    # reference: margins log p_top − log p_t of the last w queries from the model's probabilities
    logp = seen["probs"][0, :, -w:, :].log()  # (H_q, w, K)
    margin = (logp.amax(-1, keepdim=True) - logp).amin(1)  # (H_q, K); masked keys: +inf
    ref = -margin.view(2, 2, CONTEXT).amin(1)  # min over each group of 2 query heads
    with torch.no_grad():
        kw = dict(seen["kw"])
        full_keys = _prefill_keys(model, x)[1]
        got = press.raw_score(attn, kw["hidden_states"], full_keys, kw)[0]
    finite = torch.isfinite(ref)
    assert finite.all()
    torch.testing.assert_close(got, ref, rtol=RTOL, atol=ATOL)


def _prefill_keys(model, x):
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=x, past_key_values=cache)
    return [layer.keys for layer in cache.layers]


@pytest.mark.parametrize("cls", [SVMarginPress, H2OPress], ids=["svm", "h2o"])
def test_composes_with_key_rerotation(model, cls):
    cache = prefill(model, KeyRerotationPress(cls(compression_ratio=0.5, window_size=8)), ids())
    plain = prefill(model, cls(compression_ratio=0.5, window_size=8), ids())
    n = compute_n_kept(CONTEXT, 0.5)
    assert n_stored(cache) == n_stored(plain) == [n, n]
    for a, b in zip(cache.layers, plain.layers):  # the same keys kept (in position order there, topk order here)
        assert torch.equal(a.values.sort(dim=2).values, b.values.sort(dim=2).values)
    assert not torch.allclose(cache.layers[0].keys, plain.layers[0].keys)  # re-rotated to positions 0..n-1


@pytest.mark.parametrize("cls", [SVMarginPress, H2OPress], ids=["svm", "h2o"])
def test_composes_with_adakv(model, cls):
    press = AdaKVPress(cls(compression_ratio=0.5, window_size=8))
    x = ids()
    cache = prefill(model, press, x)
    n = compute_n_kept(CONTEXT, 0.5)
    assert n_stored(cache) == [CONTEXT, CONTEXT]  # AdaKV masks instead of cutting: n_kept per head on average
    for layer in model.model.layers:
        b, h, s = layer.self_attn.masked_key_indices
        assert len(s) == 2 * (CONTEXT - n)
        assert not ({0, 1, 2, 3} | set(range(CONTEXT - 8, CONTEXT))) & set(s.tolist())  # protected never masked
    with torch.no_grad():
        out = model(input_ids=ids(1, seed=5), past_key_values=cache)
    assert torch.isfinite(out.logits).all()


@pytest.mark.parametrize(
    "make",
    [
        lambda: DecodingPress(base_press=SVMarginPress(window_size=4), compression_interval=4, target_size=24),
        lambda: DecodingPress(base_press=H2OPress(window_size=4), compression_interval=4, target_size=24),
        lambda: SVMarginDecodingPress(
            compression_interval=4, target_size=24, hidden_states_buffer_size=4, window_size=4
        ),
        lambda: H2ODecodingPress(compression_interval=4, target_size=24, hidden_states_buffer_size=4, window_size=4),
    ],
    ids=["decoding-svm", "decoding-h2o", "svm-decoding", "h2o-decoding"],
)
def test_decoding_presses_cut_every_layer_to_the_target(model, make):
    press = make()
    cache = transformers.DynamicCache(config=model.config)
    sizes = []
    with torch.no_grad(), press(model):
        model(input_ids=ids(30), past_key_values=cache)
        tok = ids(12, seed=3)
        for t in range(12):
            model(input_ids=tok[:, t : t + 1], past_key_values=cache, position_ids=torch.tensor([[30 + t]]))
            sizes.append(n_stored(cache))
    # every compression_interval steps each layer is cut to target_size, in between it grows by one per step
    assert sizes[3] == [24, 24] and sizes[7] == [24, 24] and sizes[11] == [24, 24]
    assert sizes[0] == [31, 31] and sizes[5] == [26, 26]


def _decode_and_capture(model, press_cls, steps: int, **kw):
    """Prefill 20 tokens (no press), then decode ``steps`` tokens under a decoding press that compresses once at
    the last step; returns the keep-priority it computed then, the probabilities the model gave each step, and the
    scores with every buffered query rotated to the current position (kvpress's window presses' choice)."""
    captured = {}
    base_cls = press_cls

    class Spy(base_cls):
        def window_probs(self, module, hidden_states, keys, kwargs):
            out = super().window_probs(module, hidden_states, keys, kwargs)
            if module.layer_idx == 1 and "scores" not in captured:  # the compression step's call only
                stats = self.policy.accumulate(None, out)  # (the first compression: nothing carried)
                captured["scores"] = self.policy.priority(stats, torch.zeros_like(stats, dtype=torch.long))
                captured["hidden"], captured["keys"] = hidden_states.clone(), keys.clone()
                captured["kwargs"] = {k: v for k, v in kwargs.items() if not k.startswith("attsvm")}
                captured["module"] = module
            return out

    probs = []
    attn = model.model.layers[1].self_attn
    handle = attn.register_forward_hook(lambda m, a, out: probs.append(out[1]))
    press = (SVMarginDecodingPress if press_cls is SVMarginPress else H2ODecodingPress)(
        base_press=Spy(window_size=steps),
        compression_interval=steps,
        target_size=16,
        hidden_states_buffer_size=steps,
        **kw,
    )
    cache = transformers.DynamicCache(config=model.config)
    try:
        with torch.no_grad():
            model(input_ids=ids(20), past_key_values=cache)
            probs.clear()
            with press(model):
                tok = ids(steps, seed=4)
                for t in range(steps):
                    model(input_ids=tok[:, t : t + 1], past_key_values=cache, output_attentions=True)
            spy = press.base_press
            # what a window press that rotates every buffered query to the current position would compute
            now = dict(captured["kwargs"])
            now.pop("position_ids", None)
            cos, sin = now["position_embeddings"]
            n = captured["hidden"].shape[1]
            now["position_embeddings"] = (cos.expand(-1, n, -1), sin.expand(-1, n, -1))
            rotated_now = spy.raw_score(captured["module"], captured["hidden"], captured["keys"], now)
    finally:
        handle.remove()
    return captured["scores"], probs, rotated_now


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("press_cls", [SVMarginPress, H2OPress], ids=["svm", "h2o"])
def test_decoding_press_scores_equal_a_full_recomputation(press_cls, bias):
    """At the compression step, the scores from the buffered hidden states (RoPE at their own positions) equal
    the ones recomputed from the model's own attention at every buffered step; rotating all buffered queries to
    the current position (kvpress's window presses) gives other scores."""
    model = llama("eager", bias=bias)
    steps = 6
    scores, probs, rotated_now = _decode_and_capture(model, press_cls, steps)
    K = 20 + steps
    assert scores.shape == (1, 2, K) and len(probs) == steps
    ref = (
        torch.zeros(2, K, dtype=torch.float64)
        if press_cls is H2OPress
        else torch.full((2, K), -math.inf, dtype=torch.float64)
    )
    for p in probs:  # step t: query at position 20 + t sees keys 0..20 + t
        p = p[0, :, 0, :]  # (H_q, 20 + t + 1)
        if press_cls is SVMarginPress:
            logp = p.log()
            s = -(logp.amax(-1, keepdim=True) - logp).view(2, 2, -1).amin(1)  # −min margin over the group
            ref[:, : s.shape[-1]] = torch.maximum(ref[:, : s.shape[-1]], s)
        else:
            ref[:, : p.shape[-1]] += p.view(2, 2, -1).sum(1)
    torch.testing.assert_close(scores[0], ref, rtol=RTOL, atol=ATOL)
    assert not torch.allclose(rotated_now[0], ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cls", [H2ODecodingPress, SVMarginDecodingPress], ids=["h2o", "svm"])
def test_decoding_press_carries_the_statistic_across_compressions(cls):
    """Two compressions: at the second, a kept key's statistic is the carried one combined (sum for H2O, running
    minimum margin for svm) with the second round's queries, read off the model's own attention."""
    from attsvm.integrations.kvpress import protect

    model = llama("eager")
    press = cls(compression_interval=3, target_size=22, hidden_states_buffer_size=3, window_size=3)
    probs = []
    attn = model.model.layers[0].self_attn
    handle = attn.register_forward_hook(lambda m, a, out: probs.append(out[1][0, :, 0, :]))
    cache = transformers.DynamicCache(config=model.config)
    try:
        with torch.no_grad(), press(model):
            model(input_ids=ids(24), past_key_values=cache)
            tok = ids(6, seed=6)
            for t in range(3):
                model(input_ids=tok[:, t : t + 1], past_key_values=cache, output_attentions=True)
            first = press.carried_scores(0)[0].clone()  # (H_kv, 22) after the first compression
            probs.clear()
            for t in range(3, 6):
                model(input_ids=tok[:, t : t + 1], past_key_values=cache, output_attentions=True)
            second = press.carried_scores(0)[0]
    finally:
        handle.remove()
    assert first.shape == second.shape == (2, 22) and n_stored(cache) == [22, 22]
    total = (
        torch.zeros(2, 25, dtype=torch.float64)
        if cls is H2ODecodingPress
        else torch.full((2, 25), -math.inf, dtype=torch.float64)
    )
    for p in probs:  # the second round's queries over 22 + t keys
        n = p.shape[-1]
        if cls is H2ODecodingPress:
            total[:, :n] += p.view(2, 2, n).sum(1)
        else:
            logp = p.log()
            total[:, :n] = torch.maximum(total[:, :n], -(logp.amax(-1, keepdim=True) - logp).view(2, 2, n).amin(1))
    if cls is H2ODecodingPress:
        total[:, :22] += first
    else:
        total[:, :22] = torch.maximum(total[:, :22], first)
    keep = protect(total[None], 3, 4)[0].topk(22, dim=-1).indices.sort(dim=-1).values
    torch.testing.assert_close(second, total.gather(1, keep), rtol=RTOL, atol=ATOL)
    assert not torch.allclose(first, second[:, :22])  # the second round did change the statistic


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="compression_ratio must be in"):
        SVMarginPress(compression_ratio=1.0)
    with pytest.raises(ValueError, match="compression_ratio must be in"):
        H2OPress(compression_ratio=-0.1)
    with pytest.raises(ValueError, match="window_size must be >= 1"):
        SVMarginPress(window_size=0)
    with pytest.raises(ValueError, match="target_size must be >= 1"):
        SVMarginDecodingPress(target_size=0)
    with pytest.raises(TypeError, match="n_sink must be an int"):
        H2OPress(n_sink=1.5)


def _word_tokenizer():
    """A word-level tokenizer over the model's vocabulary, built in memory (no files, no network)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "[BOS]": 1, **{f"w{i}": i + 2 for i in range(VOCAB - 2)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=core, bos_token="[BOS]", unk_token="[UNK]")


@pytest.mark.parametrize(
    "make",
    [
        lambda: SVMarginPress(compression_ratio=0.5, window_size=8),
        lambda: H2OPress(compression_ratio=0.5, window_size=8),
        lambda: AdaKVPress(SVMarginPress(compression_ratio=0.5, window_size=8)),
        lambda: KeyRerotationPress(SVMarginPress(compression_ratio=0.5, window_size=8)),
        lambda: SVMarginDecodingPress(compression_interval=4, target_size=20, window_size=4),
        lambda: H2ODecodingPress(compression_interval=4, target_size=20, window_size=4),
        lambda: PrefillDecodingPress(
            prefilling_press=SVMarginPress(compression_ratio=0.5, window_size=8),
            decoding_press=SVMarginDecodingPress(compression_interval=4, target_size=20, window_size=4),
        ),
    ],
    ids=["svm", "h2o", "adakv-svm", "rerotation-svm", "svm-decoding", "h2o-decoding", "prefill+decoding-svm"],
)
def test_presses_run_in_kvpress_pipeline(model, make):
    """kvpress's own text-generation pipeline (context, question, greedy answer) with each press."""
    from kvpress import KVPressTextGenerationPipeline

    press = make()
    model.generation_config.eos_token_id = 0
    pipe = KVPressTextGenerationPipeline(model=model, tokenizer=_word_tokenizer())
    context = " ".join(f"w{(7 * i) % (VOCAB - 2)}" for i in range(60))
    cache = transformers.DynamicCache(config=model.config)
    out = pipe(context, question="w3 w5", press=press, max_new_tokens=6, cache=cache)
    assert isinstance(out["answer"], str) and out["answer"].strip()
    n_context = 61  # [BOS] + 60 words
    if isinstance(press, (SVMarginDecodingPress, H2ODecodingPress, PrefillDecodingPress)):  # cut to 20 / 4 steps
        assert all(n < 20 + 4 for n in n_stored(cache))
    else:  # the compressed context (AdaKV masks instead of cutting)
        expected = n_context if isinstance(press, AdaKVPress) else compute_n_kept(n_context, 0.5)
        assert n_stored(cache) == [expected, expected]


@pytest.mark.parametrize("press_cls", [SVMarginPress, H2OPress], ids=["svm", "h2o"])
def test_the_press_scores_through_the_caches_policy(press_cls, monkeypatch):
    """The presses hold no scoring arithmetic of their own: the score is the policy's (the one EvictionCache runs),
    so a change to the policy's rule changes the press's score."""
    from attsvm.analysis import kv_cache

    assert type(press_cls.policy) is {SVMarginPress: kv_cache.SVMarginPolicy, H2OPress: kv_cache.H2OPolicy}[press_cls]
    model = llama("eager")
    seen = {}
    attn = model.model.layers[0].self_attn
    handle = attn.register_forward_hook(lambda m, a, kw, out: seen.update(kw=kw), with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=ids(24), past_key_values=transformers.DynamicCache(config=model.config))
    finally:
        handle.remove()
    kw = seen["kw"]
    keys = attn.k_proj(kw["hidden_states"]).view(1, 24, 2, -1).transpose(1, 2)  # (the scores only rank these)
    press = press_cls(0.5, window_size=8)
    before = press.raw_score(attn, kw["hidden_states"], keys, kw)
    monkeypatch.setattr(type(press_cls.policy), "accumulate", lambda self, stats, probs: probs.sum(-2) * 0 + 7.0)
    after = press.raw_score(attn, kw["hidden_states"], keys, kw)
    assert not torch.equal(before, after) and bool((after.abs() == 7.0).all())


def test_the_support_press_solves_once_per_prefill_and_never_reuses_another_contexts_keys(monkeypatch):
    """SVMSupportPress presses of every ratio share one solve of a prefill's keys; another context (new keys of
    the same shape) is solved anew; each keeps kvpress's number of keys."""
    from attsvm.integrations import _presses
    from attsvm.integrations.kvpress import SVMSupportPress

    calls = []
    real = _presses.svm_support_scores
    monkeypatch.setattr(_presses, "svm_support_scores", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = llama()
    seen = {}
    attn = model.model.layers[0].self_attn
    handle = attn.register_forward_hook(lambda m, a, kw, out: seen.update(kw=kw), with_kwargs=True)
    try:
        scores = []
        for seed in (1, 2):
            cache = transformers.DynamicCache(config=model.config)
            with torch.no_grad():
                model(input_ids=ids(seed=seed), past_key_values=cache)
            kw, keys = seen["kw"], cache.layers[0].keys
            for ratio in (0.25, 0.5, 0.75):
                press = SVMSupportPress(ratio, window_size=8)
                scores.append(press.raw_score(attn, kw["hidden_states"], keys, kw))
                assert press.last_info[0]["unsolved"] == 0
    finally:
        handle.remove()
    assert len(calls) == 2  # (one solve per context, not per ratio)
    assert torch.equal(scores[0], scores[2]) and not torch.equal(scores[0], scores[3])
    for ratio in (0.25, 0.5):
        cache = prefill(model, SVMSupportPress(ratio, window_size=8), ids())
        assert n_stored(cache) == [compute_n_kept(CONTEXT, ratio)] * 2
