"""KV-cache eviction on the trained tiny GPT-2 LM: budget kept, protected keys kept, exact at 100 %, generate."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from attsvm.analysis.kv_cache import (
    POLICIES,
    EvictionCache,
    EvictionPolicy,
    H2OPolicy,
    SVMarginPolicy,
    cache_kwargs,
    make_policy,
    returned_cache,
    select_keep,
)
from attsvm.analysis.lm import TINY_LM, encode_heldout, load_lm

pytestmark = pytest.mark.models

N_STEPS = 40  # decoded tokens per check
BUDGET = 12


@pytest.fixture(scope="module")
def tiny_lm(tiny_lm_folder):
    torch.set_num_threads(1)
    model, tok = load_lm(tiny_lm_folder)
    ids = encode_heldout(tok, TINY_LM, n_seq=2, seq_len=N_STEPS)
    return model, tok, ids


def _decode(model, ids, cache):
    """Feed ids (B, N) one token at a time; returns logits (B, N, V) and per-step snapshots of positions."""
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
def test_policy_keeps_exactly_the_budget_and_its_protected_keys(tiny_lm, name):
    model, _, ids = tiny_lm
    policy = make_policy(name)
    n_sinks, n_recent = policy.protected(BUDGET)
    with EvictionCache(model, policy, BUDGET) as cache:
        _, snaps = _decode(model, ids, cache)
    assert cache.n_evicted > 0
    for t, layers in enumerate(snaps):
        seen = t + 1
        for pos in layers:  # (B, H, S)
            assert pos.shape[-1] == min(seen, BUDGET)
            # no duplicates, all in the past
            assert torch.all(pos.sort(-1).values.diff(dim=-1) > 0) and int(pos.max()) < seen
            must = set(range(min(n_sinks, seen))) | set(range(max(0, seen - n_recent), seen))
            for row in pos.reshape(-1, pos.shape[-1]).tolist():
                assert must <= set(row), (name, t, sorted(must - set(row)))
    # the position rules: StreamingLLM = 4 sinks + the most recent; recent = the most recent only
    final = [set(row) for p in snaps[-1] for row in p.reshape(-1, p.shape[-1]).tolist()]
    if name == "streaming":
        assert all(r == set(range(4)) | set(range(N_STEPS - BUDGET + 4, N_STEPS)) for r in final)
    if name == "recent":
        assert all(r == set(range(N_STEPS - BUDGET, N_STEPS)) for r in final)


@pytest.mark.parametrize("name", POLICIES)
def test_full_budget_reproduces_the_unpruned_logits_exactly(tiny_lm, name):
    model, _, ids = tiny_lm
    ref, _ = _decode(model, ids, None)
    with EvictionCache(model, name, budget=N_STEPS) as cache:
        got, _ = _decode(model, ids, cache)
    assert cache.n_evicted == 0
    assert torch.equal(got, ref)
    # and a small budget really changes them (the test would catch a cache that never evicts)
    with EvictionCache(model, name, budget=4) as cache:
        small, _ = _decode(model, ids, cache)
    assert not torch.allclose(small, ref)


def test_generate_with_the_cache_gives_the_same_tokens_at_full_budget(tiny_lm):
    model, _, ids = tiny_lm
    prompt = ids[:1, :10]
    with torch.no_grad():
        ref = model.generate(prompt, max_new_tokens=20, do_sample=False)
        for name in POLICIES:
            with EvictionCache(model, name, budget=64) as cache:
                out = model.generate(prompt, max_new_tokens=20, do_sample=False, **cache_kwargs(model, cache))
            assert torch.equal(out, ref), name
            with EvictionCache(model, name, budget=6) as cache:
                model.generate(prompt, max_new_tokens=20, do_sample=False, **cache_kwargs(model, cache))
            assert cache.stored_length() == 6 and cache.get_seq_length() == 29


def test_svm_margin_statistic_is_the_running_minimum_margin():
    pol = SVMarginPolicy()
    p1 = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64).view(1, 1, 1, 3)
    s1 = pol.accumulate(None, p1)
    torch.testing.assert_close(s1.view(-1), torch.tensor([0.0, math.log(3.5), math.log(7.0)], dtype=torch.float64))
    p2 = torch.tensor([0.1, 0.6, 0.1, 0.2], dtype=torch.float64).view(1, 1, 1, 4)  # key 1 becomes the top
    s2 = pol.accumulate(s1, p2)
    torch.testing.assert_close(s2.view(-1), torch.tensor([0.0, 0.0, math.log(6.0), math.log(3.0)], dtype=torch.float64))
    # a masked (zero-probability) key gets no margin from that query
    p3 = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]], dtype=torch.float64).view(1, 1, 2, 3)
    s3 = pol.accumulate(None, p3)
    torch.testing.assert_close(s3.view(-1)[2], torch.tensor(0.0, dtype=torch.float64))
    # the farthest key is evicted first
    keep = select_keep(SVMarginPolicy(recent=0), s2.view(1, 1, 4), torch.arange(4).view(1, 1, 4), 3, 4)
    assert keep.view(-1).tolist() == [0, 1, 3]


def test_h2o_accumulates_attention_and_protects_its_recent_half():
    pol = H2OPolicy()
    assert pol.protected(10) == (0, 5)
    probs = torch.tensor([[0.6, 0.4, 0.0], [0.5, 0.1, 0.4]], dtype=torch.float64).view(1, 1, 2, 3)
    torch.testing.assert_close(pol.accumulate(None, probs).view(-1), torch.tensor([1.1, 0.5, 0.4], dtype=torch.float64))


def test_bad_arguments_are_named(tiny_lm):
    model, _, _ = tiny_lm
    with pytest.raises(ValueError, match="policy must be one of"):
        make_policy("lru")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="budget must be >= 1"):
        EvictionCache(model, "h2o", budget=0)
    with pytest.raises(TypeError, match="fuse_layers must be a bool"):
        EvictionCache(model, "h2o", budget=8, fuse_layers="yes")
    with EvictionCache(model, "h2o", budget=8, fuse_layers=np.False_) as cache:  # (numpy bools are bools)
        assert cache._can_fuse is False
    with pytest.raises(TypeError, match="recent must be an int"):
        EvictionPolicy(recent="half")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="recent as a share of the budget must be in"):
        H2OPolicy(recent=1.5)
    model.config._attn_implementation = "sdpa"
    try:
        with pytest.raises(ValueError, match="needs attention probabilities"):
            EvictionCache(model, "tova", budget=8)
        EvictionCache(model, "recent", budget=8).close()  # position-only policies do not need them
    finally:
        model.config._attn_implementation = "eager"


def _decode_chunks(model, ids, cache, chunks):
    """Feed ids (B, N) in the given chunk sizes; logits of every fed position (B, N, V) and final positions."""
    logits, t = [], 0
    with torch.no_grad():
        for c in chunks:
            out = model(input_ids=ids[:, t : t + c], use_cache=True, **cache_kwargs(model, cache))
            logits.append(out.logits)
            t += c
    return torch.cat(logits, 1), [layer.positions.clone() for layer in cache.layers]


@pytest.mark.parametrize("name", POLICIES)
def test_fused_layers_evict_exactly_like_per_layer_eviction(tiny_lm, name):
    """The fused steady state (one eviction step for all layers) is the per-layer rule, bit for bit — also
    when a multi-token chunk mid-decode dissolves the group and it forms again."""
    model, _, ids = tiny_lm
    chunks = [3] + [1] * 20 + [2] + [1] * 15  # sums to N_STEPS
    assert sum(chunks) == N_STEPS
    runs = {}
    for fuse in (False, True):
        with EvictionCache(model, make_policy(name), BUDGET, fuse_layers=fuse) as cache:
            logits, positions = _decode_chunks(model, ids, cache, chunks)
            runs[fuse] = (logits, positions, [layer.stats for layer in cache.layers], cache.n_evicted)
            fused = [layer.group is not None for layer in cache.layers]
            n_fused = cache.n_fused_steps
        assert all(fused) if fuse else not any(fused)  # the fast path is on at the end (re-formed after the chunk)
        # and ran every steady step: tokens 14..23 and 27..40 (token 13 and 26 are the per-layer steps that
        # reach the steady state: the first eviction, the first one-token step after the 2-token chunk)
        assert n_fused == (24 if fuse else 0)
    (l0, p0, s0, n0), (l1, p1, s1, n1) = runs[False], runs[True]
    assert n0 == n1 > 0
    if name == "random":  # one draw for all layers instead of one per layer: same rule, other random numbers
        assert all(p.shape[-1] == BUDGET for p in p1)
        return
    assert torch.equal(l0, l1)
    assert all(torch.equal(a, b) for a, b in zip(p0, p1))
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(s0, s1))


def test_fused_layers_recover_like_per_layer_eviction_when_a_pass_stops_part_way(tiny_lm):
    """A forward pass that raises before the last layer leaves the fused step half done; the next pass must
    finish it exactly as per-layer eviction would have (no newest key overwritten before its eviction)."""
    from attsvm.analysis.kv_cache import attention_modules

    model, _, ids = tiny_lm
    last = attention_modules(model)[max(attention_modules(model))]

    def boom(mod, args):
        raise KeyboardInterrupt

    runs = {}
    for fuse in (False, True):
        logits = []
        with EvictionCache(model, "svm", BUDGET, fuse_layers=fuse) as cache, torch.no_grad():
            for t in range(N_STEPS):
                if t == 25:  # layers before the last have run (and been observed), the last never runs
                    handle = last.register_forward_pre_hook(boom)
                    with pytest.raises(KeyboardInterrupt):
                        model(input_ids=ids[:, t : t + 1], use_cache=True, **cache_kwargs(model, cache))
                    handle.remove()
                    if fuse:
                        group = cache.layers[0].group
                        assert group is not None and group.n_observed == len(cache.layers) - 1
                logits.append(model(input_ids=ids[:, t : t + 1], use_cache=True, **cache_kwargs(model, cache)).logits)
            runs[fuse] = (torch.cat(logits, 1), [layer.positions.clone() for layer in cache.layers])
    assert torch.equal(runs[False][0], runs[True][0])
    assert all(torch.equal(a, b) for a, b in zip(runs[False][1], runs[True][1]))


class _DecayH2O(H2OPolicy):
    """H2O with decayed accumulation: overrides accumulate only (it must not inherit H2O's in-place update_)."""

    def accumulate(self, stats, probs):
        total = probs.sum(dim=-2)
        if stats is not None:
            total[..., : stats.shape[-1]].add_(0.5 * stats)
        return total


class _LastQueryPerHead(EvictionPolicy):
    """A policy written to the (B, H, q, S+q) contract with explicit dimensions (no leading-dim freedom)."""

    name = "last-query"

    def accumulate(self, stats, probs):
        return probs[:, :, -1, :]

    def priority(self, stats, positions):
        return stats


@pytest.mark.parametrize("cls", [_DecayH2O, _LastQueryPerHead])
def test_fused_layers_keep_custom_policies_exact(tiny_lm, cls):
    """Custom policies see their own (B, H, ...) shapes and their own accumulate on the fused path too."""
    model, _, ids = tiny_lm
    runs = {}
    for fuse in (False, True):
        with EvictionCache(model, cls(), BUDGET, fuse_layers=fuse) as cache:
            logits, positions = _decode_chunks(model, ids, cache, [1] * N_STEPS)
            runs[fuse] = (logits, positions, [layer.stats.clone() for layer in cache.layers], cache.n_fused_steps)
    assert runs[True][3] > 0 and runs[False][3] == 0
    assert torch.equal(runs[False][0], runs[True][0])
    assert all(torch.equal(a, b) for a, b in zip(runs[False][1], runs[True][1]))
    assert all(torch.equal(a, b) for a, b in zip(runs[False][2], runs[True][2]))


def test_beam_search_does_not_refuse_every_step_and_matches_per_layer(tiny_lm):
    """Beam search reorders the cache every step: the layers stay per layer (no stacking per step) and the
    beams equal those of per-layer eviction."""
    model, _, ids = tiny_lm
    prompt = ids[:, :10]
    outs, fused = {}, {}
    with torch.no_grad():
        for fuse in (False, True):
            with EvictionCache(model, "svm", 8, fuse_layers=fuse) as cache:
                outs[fuse] = model.generate(
                    prompt, max_new_tokens=15, do_sample=False, num_beams=3, **cache_kwargs(model, cache)
                )
                fused[fuse] = (cache.n_fused_steps, any(layer.group is not None for layer in cache.layers))
    assert torch.equal(outs[False], outs[True])
    assert fused[True] == (0, False)


def test_a_budget_above_the_stored_keys_and_an_unknown_layer_are_named(tiny_lm):
    s = torch.zeros(1, 1, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"budget must be in \[1, 4\] \(the keys stored\), got 5"):
        select_keep(SVMarginPolicy(recent=0), s, torch.arange(4).view(1, 1, 4), 5, 4)
    model, _, _ = tiny_lm
    with EvictionCache(model, "svm", budget=6) as cache:
        n_layers = len(cache.layers)
        with pytest.raises(ValueError, match=rf"layer_idx must be in \[0, {n_layers}\), got 99"):
            cache.stored_length(99)
    with pytest.raises(ValueError, match="seed must be <= 9223372036854775807"):
        make_policy("random", seed=2**70)


@pytest.mark.parametrize(("n_sinks", "n_recent"), [(0, 0), (2, 0), (0, 3), (2, 3), (4, 6)])
def test_the_cache_and_the_presses_protect_the_same_keys(n_sinks, n_recent):
    """One protection rule: the keys the cache never evicts (eviction_scores −inf) are those protected_rank
    ranks, and protect (the presses') raises exactly those above every other key."""
    from attsvm.analysis.kv_scores import H2OPolicy, eviction_scores, protect, protected_rank

    K = 12
    positions = torch.arange(K).expand(1, 2, K)
    stats = torch.rand(1, 2, K, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    masked = torch.isinf(eviction_scores(H2OPolicy(), stats, positions, K, (n_sinks, n_recent)))
    ranked = protected_rank(positions, K, n_sinks, n_recent) > 0
    assert torch.equal(masked, ranked) and int(ranked[0, 0].sum()) == min(K, n_sinks + n_recent)
    raised = protect(stats, n_recent, n_sinks)
    if ranked.any():
        assert bool((raised[ranked].view(1, 2, -1).amin(-1) > raised[~ranked].view(1, 2, -1).amax(-1)).all())


def test_a_closed_cache_says_so_instead_of_blaming_the_attention(tiny_lm):
    model, _, ids = tiny_lm
    with EvictionCache(model, "svm", BUDGET) as cache:
        _decode(model, ids[:, :3], cache)
    with pytest.raises(RuntimeError, match="EvictionCache is closed"):  # (it said: load the model eager)
        _decode(model, ids[:, 3:5], cache)


def test_the_sv_margin_policy_has_one_name_and_accepts_the_old_spelling():
    from attsvm.analysis.kv_cache import POLICIES, make_policy

    assert "svm_margin" in POLICIES and "svm" not in POLICIES
    assert make_policy("svm_margin").name == make_policy("svm").name == "svm_margin"
    with pytest.raises(ValueError, match="policy"):
        make_policy("svm_margins")
