"""The eviction cache on every attention layout: MHA, GQA 4:2, MQA 4:1 × every policy × RoPE and GPT-2 models.

Random small configs (no weights on disk). Runs under the newest transformers (main venv) and under
transformers 5.2.x (the kvpress venv, see scripts/kvpress_env.sh): the test command runs this file in both.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attsvm.analysis.kv_cache import (
    POLICIES,
    EvictionCache,
    attention_layout,
    cache_kwargs,
    make_policy,
    returned_cache,
)

pytestmark = pytest.mark.models

N_TOKENS = 20  # decoded one at a time
BUDGET = 7
VOCAB = 61
# (architecture, query heads, KV heads): RoPE Llama on all three layouts, Qwen2 (q/k/v biases) GQA,
# Mistral MQA, GPT-2 (learned positions; MHA only: it has no grouped layout)
LAYOUTS = [("llama", 4, 4), ("llama", 4, 2), ("llama", 4, 1), ("qwen2", 4, 2), ("mistral", 4, 1), ("gpt2", 4, 4)]
LAYOUT_IDS = [f"{a}-{h}:{k}" for a, h, k in LAYOUTS]


def build(arch: str, n_heads: int, n_kv: int, *, seed: int = 0, layers: int = 2, **extra):
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, num_hidden_layers=layers, num_attention_heads=n_heads)
    if arch == "gpt2":
        assert n_heads == n_kv
        cfg = transformers.GPT2Config(
            vocab_size=VOCAB, n_layer=layers, n_head=n_heads, n_embd=32, n_positions=128, **extra
        )
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cls = {
            "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
            "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
            "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        }[arch]
        cfg = cls[0](
            hidden_size=32,
            intermediate_size=64,
            num_key_value_heads=n_kv,
            max_position_embeddings=128,
            **common,
            **extra,
        )
        model = cls[1](cfg)
    model.config._attn_implementation = "eager"
    return model.double().eval()


_MODELS: dict[tuple, object] = {}


def model_for(layout):
    if layout not in _MODELS:
        _MODELS[layout] = build(*layout)
    return _MODELS[layout]


def ids_for(batch: int = 2, n: int = N_TOKENS, seed: int = 1):
    return torch.randint(0, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed))


def decode(model, ids, cache):
    """One token at a time; logits (B, N, V) and, per step, every layer's stored positions."""
    logits, snaps = [], []
    past = cache
    with torch.no_grad():
        for t in range(ids.shape[1]):
            out = model(input_ids=ids[:, t : t + 1], use_cache=True, **cache_kwargs(model, past))
            past = returned_cache(out) if cache is None else cache
            logits.append(out.logits[:, -1])
            if cache is not None:
                snaps.append([layer.positions.clone() for layer in cache.layers])
    return torch.stack(logits, 1), snaps


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_budget_is_exact_per_kv_head_and_protected_tokens_survive(layout, name):
    model = model_for(layout)
    _, _, n_kv = layout
    ids = ids_for()
    policy = make_policy(name)
    n_sinks, n_recent = policy.protected(BUDGET)
    runs = {}
    for fuse in (False, True):
        with EvictionCache(model, make_policy(name), BUDGET, fuse_layers=fuse) as cache:
            logits, snaps = decode(model, ids, cache)
            runs[fuse] = (logits, snaps, cache.n_fused_steps)
        assert cache.n_evicted == 2 * (N_TOKENS - BUDGET)  # per layer: one per step past the budget
    for t, layers in enumerate(runs[True][1]):
        seen = t + 1
        for pos in layers:
            assert pos.shape == (ids.shape[0], n_kv, min(seen, BUDGET))  # exactly the budget per KV head
            assert torch.all(pos.sort(-1).values.diff(dim=-1) > 0) and int(pos.max()) < seen
            must = set(range(min(n_sinks, seen))) | set(range(max(0, seen - n_recent), seen))
            for row in pos.reshape(-1, pos.shape[-1]).tolist():
                assert must <= set(row), (name, t, sorted(must - set(row)))
    assert runs[True][2] > 0 and runs[False][2] == 0
    if name != "random":  # the fused fast path is the per-layer rule, bit for bit
        assert torch.equal(runs[False][0], runs[True][0])
        assert all(torch.equal(a, b) for a, b in zip(runs[False][1][-1], runs[True][1][-1]))


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_full_budget_equals_no_eviction_in_logits_and_generate(layout, name):
    model = model_for(layout)
    ids = ids_for()
    ref, _ = decode(model, ids, None)
    with EvictionCache(model, name, budget=N_TOKENS) as cache:
        got, _ = decode(model, ids, cache)
    assert cache.n_evicted == 0
    assert torch.equal(got, ref)
    with EvictionCache(model, name, budget=3) as cache:  # the check can fail: a small budget changes them
        small, _ = decode(model, ids, cache)
    assert not torch.allclose(small, ref)
    prompt = ids[:1, :6]
    with torch.no_grad():
        expected = model.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0)
        with EvictionCache(model, name, budget=32) as cache:
            out = model.generate(
                prompt, max_new_tokens=10, do_sample=False, pad_token_id=0, **cache_kwargs(model, cache)
            )
    assert torch.equal(out, expected)
    with torch.no_grad(), EvictionCache(model, name, budget=4) as cache:  # a prompt longer than the budget
        short = model.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0, **cache_kwargs(model, cache))
    assert cache.stored_length() == 4 and cache.stored_length(1) == 4
    assert cache.get_seq_length() == short.shape[1] - 1 > 6  # every token but the last one generated was seen


# ------------------------------------------------------------------ the group reduction against an unrolled loop
def _reference(name: str, probs_per_step, group: int, budget: int, protected: tuple[int, int]):
    """Per-step eviction of one layer written out with Python loops over rows, KV heads and group members.

    ``probs_per_step[t]`` is the layer's attention (B, H_q, 1, S+1) at step t over its stored keys (slot order)
    and the new key. Returns the final slot positions (B, H_kv, budget) and statistics."""
    B, Hq = probs_per_step[0].shape[:2]
    Hkv = Hq // group
    slots = [[[] for _ in range(Hkv)] for _ in range(B)]
    stats = [[[] for _ in range(Hkv)] for _ in range(B)]
    n_sinks, n_recent = protected
    for t, probs in enumerate(probs_per_step):
        n_seen = t + 1
        for b in range(B):
            for h in range(Hkv):
                S1 = len(slots[b][h]) + 1
                assert probs.shape[-1] == S1
                pos, st = slots[b][h] + [t], stats[b][h] + [math.inf if name == "svm" else 0.0]
                for j in range(S1):
                    per_head = []
                    for g in range(group):
                        p = probs[b, h * group + g, 0].tolist()
                        if name == "svm":
                            per_head.append(math.log(max(p)) - math.log(p[j]))
                        else:
                            per_head.append(p[j])
                    if name == "svm":
                        st[j] = min(st[j], min(per_head))
                    elif name == "h2o":
                        st[j] = st[j] + sum(per_head)
                    else:  # tova
                        st[j] = sum(per_head) / group
                if S1 > budget:
                    free = [j for j in range(S1) if not (pos[j] < n_sinks or pos[j] >= n_seen - n_recent)]
                    key = (lambda j, st=st: -st[j]) if name == "svm" else (lambda j, st=st: st[j])
                    victim = min(free, key=lambda j: (key(j), j))
                    pos[victim], st[victim] = pos[-1], st[-1]
                    pos, st = pos[:-1], st[:-1]
                slots[b][h], stats[b][h] = pos, st
    return torch.tensor(slots), torch.tensor(stats, dtype=torch.float64)


@pytest.mark.parametrize("name", ["svm", "h2o", "tova"])
@pytest.mark.parametrize("layout", [("llama", 4, 2), ("llama", 4, 1)], ids=["gqa-4:2", "mqa-4:1"])
def test_group_reduction_equals_an_unrolled_per_group_reference(layout, name):
    model = model_for(layout)
    ids = ids_for()
    from attsvm.analysis.kv_cache import attention_modules

    last = attention_modules(model)[1]
    for fuse in (False, True):
        seen = []
        handle = last.register_forward_hook(lambda mod, args, out, seen=seen: seen.append(out[1].clone()))
        try:
            with EvictionCache(model, name, BUDGET, fuse_layers=fuse) as cache:
                decode(model, ids, cache)
                layer = cache.layers[1]
                got_pos, got_stats = layer.positions.clone(), layer.stats.clone()
        finally:
            handle.remove()
        ref_pos, ref_stats = _reference(name, seen, layout[1] // layout[2], BUDGET, make_policy(name).protected(BUDGET))
        assert torch.equal(got_pos, ref_pos), (fuse, got_pos, ref_pos)
        torch.testing.assert_close(got_stats, ref_stats, rtol=1e-12, atol=1e-12)
    # and the group matters: without the reduction (first head of each group only) the statistics differ
    _, first_only = _reference(
        name, [p[:, :: layout[1] // layout[2]] for p in seen], 1, BUDGET, make_policy(name).protected(BUDGET)
    )
    assert not torch.allclose(first_only, ref_stats)


# ------------------------------------------------------------------ bad input
def test_padded_batches_are_refused_with_a_clear_error():
    model = model_for(("llama", 4, 2))
    ids = ids_for(batch=2, n=8)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding of row 0
    with EvictionCache(model, "h2o", BUDGET) as cache, pytest.raises(ValueError, match="padded batches"):
        model.generate(
            ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0, **cache_kwargs(model, cache)
        )
    assert cache.get_seq_length() == 0  # refused before any token was stored
    with EvictionCache(model, "svm", BUDGET) as cache, pytest.raises(ValueError, match="padded batches"):
        model.model(input_ids=ids, attention_mask=mask, **cache_kwargs(model, cache))  # the decoder stack alone
    with EvictionCache(model, "h2o", BUDGET) as cache:  # an all-ones mask is fine
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=4,
            do_sample=False,
            pad_token_id=0,
            **cache_kwargs(model, cache),
        )
    assert cache.get_seq_length() == 8 + 3


def test_layouts_the_cache_cannot_handle_are_refused_before_generation():
    assert attention_layout(model_for(("llama", 4, 1))).kind == "MQA"
    assert attention_layout(model_for(("llama", 4, 2))).group_size == 2
    assert attention_layout(model_for(("gpt2", 4, 4))).kind == "MHA"
    odd = build("llama", 4, 4)
    odd.config.num_key_value_heads = 3
    with pytest.raises(ValueError, match="num_key_value_heads=3"):
        EvictionCache(odd, "svm", 8)
    sliding = build("qwen2", 4, 2, use_sliding_window=True, sliding_window=4, max_window_layers=0)
    with pytest.raises(ValueError, match="sliding"):
        EvictionCache(sliding, "svm", 8)
    mistral = build("mistral", 4, 1, sliding_window=16)
    assert attention_layout(mistral).sliding_window == 16
    with pytest.raises(ValueError, match="exceeds the model's sliding window"):
        EvictionCache(mistral, "svm", 17)
    EvictionCache(mistral, "svm", 16).close()
    with pytest.raises(ValueError, match="budget must be >= 1"):
        EvictionCache(model_for(("llama", 4, 2)), "svm", 0)
    with pytest.raises(TypeError, match="model must be a transformers model"):
        attention_layout(object())
