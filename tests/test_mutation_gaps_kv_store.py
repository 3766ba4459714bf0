"""Pins behaviours of the KV eviction policies/cache and the trial store that a mutation audit found untested.

Small random Llama models (no weights on disk) for the cache; temporary folders for the store.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


# ------------------------------------------------------------------------------------------------- the policies
def test_a_negative_int_recent_is_refused_and_named():
    from attsvm.analysis.kv_cache import EvictionPolicy, StreamingPolicy

    with pytest.raises(ValueError, match="recent"):
        EvictionPolicy(recent=-1)
    with pytest.raises(ValueError, match="recent"):
        StreamingPolicy(recent=-1)
    assert EvictionPolicy(recent=0).recent == 0


def test_protected_recent_tokens_leave_room_for_the_sinks():
    from attsvm.analysis.kv_cache import StreamingPolicy

    assert StreamingPolicy(sinks=4, recent=10).protected(8) == (4, 4)
    assert StreamingPolicy(sinks=10, recent=3).protected(8) == (8, 0)


def test_a_fractional_recent_window_is_rounded_down():
    from attsvm.analysis.kv_cache import H2OPolicy

    assert H2OPolicy(recent=0.5).protected(7) == (0, 3)
    assert H2OPolicy(recent=0.5).protected(8) == (0, 4)


def test_tova_scores_by_the_last_query_of_the_step():
    from attsvm.analysis.kv_cache import TOVAPolicy

    stats = torch.zeros(1, 1, 1)  # one stored key, two new queries: S + q = 3
    probs = torch.tensor([[[[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]]]])  # (1, 1, 2, 3)
    out = TOVAPolicy().accumulate(stats, probs)
    assert out.shape == (1, 1, 3)
    assert torch.equal(out[0, 0], probs[0, 0, 1])


def test_random_priorities_follow_the_seed():
    from attsvm.analysis.kv_cache import RandomPolicy

    positions = torch.arange(32).reshape(1, 1, 32)
    p0 = RandomPolicy(seed=0).priority(None, positions)
    p1 = RandomPolicy(seed=1).priority(None, positions)
    p1_again = RandomPolicy(seed=1).priority(None, positions)
    assert not torch.equal(p0, p1)
    assert torch.equal(p1, p1_again)


# ---------------------------------------------------------------------------------------------------- the cache
VOCAB = 61
N_LAYERS = 2


@pytest.fixture(scope="module")
def llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    model = transformers.LlamaForCausalLM(cfg)
    model.config._attn_implementation = "eager"
    return model.double().eval()


def _ids(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


def _forward(model, ids, cache):
    from attsvm.analysis.kv_cache import cache_kwargs

    with torch.no_grad():
        return model(input_ids=ids, use_cache=True, **cache_kwargs(model, cache))


@pytest.mark.models
def test_a_prefill_counts_every_evicted_key(llama):
    from attsvm.analysis.kv_cache import EvictionCache

    with EvictionCache(llama, "h2o", 8) as cache:
        _forward(llama, _ids(20), cache)
        assert cache.n_evicted == 12 * N_LAYERS
        assert all(cache.stored_length(i) == 8 for i in range(N_LAYERS))


@pytest.mark.models
def test_mask_sizes_after_eviction_offset_the_evicted_keys(llama):
    from attsvm.analysis.kv_cache import EvictionCache

    with EvictionCache(llama, "h2o", 8) as cache:
        _forward(llama, _ids(20), cache)
        layer = cache.layers[0]
        assert layer.keys.shape[-2] == 8 and layer.cumulative_length == 20
        assert layer.get_mask_sizes(2) == (8 + 2, 20 - 8)


@pytest.mark.models
def test_after_eviction_a_new_token_does_not_see_the_token_after_it(llama):
    from attsvm.analysis.kv_cache import EvictionCache

    ids = _ids(22)
    alt = ids.clone()
    alt[0, 21] = (alt[0, 21] + 1) % VOCAB  # only the second new token differs
    firsts = []
    for seq in (ids, alt):
        with EvictionCache(llama, "recent", 8) as cache:
            _forward(llama, seq[:, :20], cache)
            out = _forward(llama, seq[:, 20:22], cache)
            firsts.append(out.logits[0, 0])
    torch.testing.assert_close(firsts[0], firsts[1], rtol=0, atol=1e-12)


@pytest.mark.models
def test_stored_length_of_a_layer_past_the_last_is_a_value_error(llama):
    from attsvm.analysis.kv_cache import EvictionCache

    with EvictionCache(llama, "h2o", 8) as cache:
        with pytest.raises(ValueError, match="layer_idx"):
            cache.stored_length(len(cache.layers))
        assert cache.stored_length(len(cache.layers) - 1) == 0


@pytest.mark.models
def test_policy_keywords_with_a_policy_instance_are_refused(llama):
    from attsvm.analysis.kv_cache import EvictionCache, H2OPolicy

    with pytest.raises(TypeError, match="keyword"):
        EvictionCache(llama, H2OPolicy(), 8, recent=2)


# ---------------------------------------------------------------------------------------------------- the store
def test_save_leaves_the_callers_frame_alone(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    from attsvm.experiments._store import TrialStore

    df = pd.DataFrame({"a": [1, 2]})
    TrialStore(tmp_path).save("k", df)
    assert list(df.columns) == ["a"]


def test_load_concatenates_in_sorted_key_order(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    from attsvm.experiments._store import TrialStore

    store = TrialStore(tmp_path)
    store.save("b", pd.DataFrame({"x": [1, 2]}))
    store.save("a", pd.DataFrame({"x": [3]}))
    assert store.load(["b", "a"])["trial"].tolist() == ["a", "b", "b"]
    assert store.load()["trial"].tolist() == ["a", "b", "b"]


def test_an_empty_store_loads_a_frame_with_only_the_trial_column(tmp_path):
    pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    from attsvm.experiments._store import TrialStore

    df = TrialStore(tmp_path).load()
    assert df.columns.tolist() == ["trial"]
    assert len(df) == 0


def test_dot_files_are_not_trials(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    from attsvm.experiments._store import TrialStore

    store = TrialStore(tmp_path)
    store.save("k", pd.DataFrame({"a": [1]}))
    pd.DataFrame({"a": [2], "trial": ["x"]}).to_parquet(tmp_path / ".x.parquet")
    assert store.done() == {"k"}
