"""EvictionCache on a hybrid local/global model: a tiny random Gemma 3 (sliding window 16, one global layer in
three, 4 query heads on 1 KV head) with contexts past the window. Random weights: cache mechanics only."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attsvm.analysis.kv_cache import EvictionCache, EvictionLayer, attention_layout, cache_kwargs
from tiny_models import GEMMA3_TYPES, logits_with_keys_hidden, tiny_gemma3

WINDOW = 16
N = 61
VOCAB = 101
TYPES = GEMMA3_TYPES


@pytest.fixture(scope="module")
def gemma():
    return tiny_gemma3(VOCAB, window=WINDOW, dtype=torch.float64)


def _ids(n: int = N, seed: int = 1):
    return torch.randint(3, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


def test_layout_of_a_hybrid_model(gemma):
    lay = attention_layout(gemma)
    assert lay.kind == "MQA" and lay.local_window == WINDOW and lay.sliding_window is None
    assert [lay.is_local(i) for i in range(len(TYPES))] == [t == "sliding_attention" for t in TYPES]


@pytest.mark.parametrize("policy", ["svm", "h2o", "streaming"])
def test_sliding_layers_keep_their_window_and_global_layers_evict(gemma, policy):
    budget = 24
    with EvictionCache(gemma, policy, budget=budget) as cache, torch.no_grad():
        out = gemma(_ids(), **cache_kwargs(gemma, cache))
        for _ in range(3):
            nxt = out.logits[:, -1:].argmax(-1)
            out = gemma(nxt, **cache_kwargs(gemma, cache))
        sizes = [cache.stored_length(i) for i in range(len(TYPES))]
    assert sizes == [WINDOW - 1 if t == "sliding_attention" else budget for t in TYPES]
    assert cache.get_seq_length() == N + 3
    assert all(isinstance(la, EvictionLayer) == (t == "full_attention") for la, t in zip(cache.layers, TYPES))


def test_a_budget_above_the_context_is_the_full_cache(gemma):
    x = _ids()
    ref = gemma.generate(x, max_new_tokens=6, do_sample=False)
    with EvictionCache(gemma, "svm", budget=N + 10) as cache:
        got = gemma.generate(x, max_new_tokens=6, do_sample=False, **cache_kwargs(gemma, cache))
    assert torch.equal(got, ref)


def test_decoding_equals_the_full_model_with_the_evicted_keys_masked(gemma):
    """One step after an evicting prefill: the global layers' query sees exactly the kept keys and itself."""
    x, new = _ids(), _ids(1, seed=2)
    with EvictionCache(gemma, "svm", budget=20) as cache, torch.no_grad():
        gemma(x, **cache_kwargs(gemma, cache))
        kept = {i: set(cache.layers[i].positions[0, 0].tolist()) for i, t in enumerate(TYPES) if t == "full_attention"}
        got = gemma(new, **cache_kwargs(gemma, cache)).logits
    ref = logits_with_keys_hidden(
        gemma, x, new, {i: torch.tensor([p not in k for p in range(N)]) for i, k in kept.items()}
    )
    assert len(kept[2]) == 20
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)  # (eager softmax in float32)
    with torch.no_grad():
        full = gemma(torch.cat([x, new], 1)).logits[:, N:]
    assert not torch.allclose(got, full, atol=1e-3)  # the eviction mattered
