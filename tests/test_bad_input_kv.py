"""Malformed arguments to the eviction cache's public helpers (stop-8 audit 9): named errors where they used to
be bare AssertionErrors, AttributeErrors, a ZeroDivisionError, or negative protection counts accepted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attsvm.analysis import kv_cache as kc

POS = torch.arange(6).view(1, 1, 6)
STATS = torch.rand(1, 1, 6, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    "args, exc, named",
    [
        ((kc.SVMarginPolicy(), STATS, POS, 6, (-1, -2)), ValueError, r"protected\[0\]"),  # (protected nothing)
        ((kc.SVMarginPolicy(), STATS, POS, 2, (0, 1)), ValueError, "n_seen"),  # (n_seen < S keys stored)
        (("svm", STATS, POS, 6, (1, 1)), TypeError, "policy must be an EvictionPolicy"),
        ((kc.SVMarginPolicy(), None, POS, 6, (0, 0)), ValueError, "stats must be a tensor"),  # (bare assert)
        ((kc.SVMarginPolicy(), STATS, POS, 6, 3), TypeError, "protected must be a pair"),
    ],
)
def test_eviction_scores_checks_its_arguments(args, exc, named):
    with pytest.raises(exc, match=named):
        kc.eviction_scores(*args)


def test_eviction_scores_on_good_arguments_are_select_keeps():
    pol = kc.SVMarginPolicy(recent=0)
    score = kc.eviction_scores(pol, STATS, POS, 6, (1, 0))
    assert score[..., 0].item() == float("-inf") and torch.equal(score[..., 1:], STATS[..., 1:])


@pytest.mark.parametrize("budget, exc", [(-5, ValueError), (2.5, TypeError), ("5", TypeError)])
def test_protected_checks_the_budget(budget, exc):
    with pytest.raises(exc, match="budget"):  # (-5 gave (-5, 0); 2.5 gave (0, 0))
        kc.SVMarginPolicy().protected(budget)


@pytest.mark.parametrize("policy", [kc.SVMarginPolicy(), kc.H2OPolicy(), kc.TOVAPolicy()], ids=lambda p: p.name)
def test_a_scoring_policy_without_statistics_is_named(policy):
    with pytest.raises(ValueError, match=f"stats must be a tensor of the keys' statistics for the '{policy.name}'"):
        policy.priority(None, POS)


def test_tova_accumulate_needs_a_new_key():
    with pytest.raises(ValueError, match="probs"):  # (ZeroDivisionError)
        kc.TOVAPolicy().accumulate(torch.zeros(1, 1, 3), torch.ones(1, 1, 1, 3) / 3)


def test_eviction_layer_and_model_helpers_check_their_arguments():
    with pytest.raises(TypeError, match="policy must be an EvictionPolicy"):
        kc.EvictionLayer("svm", 4, 1)
    with pytest.raises(TypeError, match=r"model must be a torch\.nn\.Module"):
        kc.attention_modules(None)
    with pytest.raises(TypeError, match="model must be a transformers model"):
        kc.cache_kwargs(None, None)


@pytest.mark.parametrize("policy", [kc.SVMarginPolicy(), kc.H2OPolicy(), kc.TOVAPolicy()], ids=lambda p: p.name)
def test_accumulate_checks_shapes_and_types(policy):
    probs = torch.ones(1, 1, 1, 3) / 3
    with pytest.raises(ValueError, match=r"stats .* must match probs"):  # (a raw size mismatch / ZeroDivisionError)
        policy.accumulate(torch.zeros(1, 1, 7), probs)
    with pytest.raises(ValueError, match=r"stats .* must match probs"):
        policy.accumulate(torch.zeros(1, 2, 2), probs)
    with pytest.raises(TypeError, match=r"probs must be a torch\.Tensor"):  # (AttributeError: no attribute 'log')
        policy.accumulate(None, probs.numpy())
    with pytest.raises(TypeError, match=r"stats must be a torch\.Tensor"):
        policy.accumulate([0.0, 0.0], probs)
    assert policy.accumulate(torch.zeros(1, 1, 2), probs).shape == (1, 1, 3)  # (good shapes still work)


def test_select_keep_refuses_nan_statistics_and_float_positions():
    pol = kc.SVMarginPolicy()
    with pytest.raises(ValueError, match="stats must not hold NaN"):  # (silently kept [3, 4, 5])
        kc.select_keep(pol, torch.full((1, 1, 6), float("nan")), POS, 3, 6)
    with pytest.raises(TypeError, match="positions must be an integer tensor"):  # (silently accepted)
        kc.select_keep(pol, STATS, POS.double(), 3, 6)
    with pytest.raises(TypeError, match="positions must be an integer tensor"):
        kc.eviction_scores(pol, STATS, POS.float(), 6, (1, 1))


@pytest.mark.parametrize("output", [None, "x", 3])
def test_returned_cache_refuses_a_non_output(output):
    with pytest.raises(TypeError, match="output must be a model's forward output"):  # (silently None)
        kc.returned_cache(output)


# ------------------------------------------------------------------ analysis.lm (stop-8 audit 9: L4, L7, L10)
lm = pytest.importorskip("attsvm.analysis.lm")


@pytest.mark.parametrize(
    "make, named",
    [
        (lambda: lm.LMConfig(lr=1e200), "lr must be <= 1"),
        (lambda: lm.LlamaLMConfig(lr=10.0), "lr must be <= 1"),
        (lambda: lm.LlamaLMConfig(answer_weight=1e300), "answer_weight must be <= 1e6"),
        (lambda: lm.LlamaLMConfig(init_std=1e200), "init_std must be <= 1"),
        (lambda: lm.LlamaLMConfig(rope_theta=1e-300), "rope_theta must be > 1"),
        (lambda: lm.LlamaLMConfig(rope_theta=1.0), "rope_theta must be > 1"),
    ],
)
def test_lm_configs_refuse_values_that_overflow_training(make, named):
    with pytest.raises(ValueError, match=named):  # (accepted; training then overflows)
        make()


def test_lm_configs_keep_numpy_numbers_and_good_values():
    assert lm.LlamaLMConfig(lr=np.float32(1e-3), answer_weight=np.float64(3.0), rope_theta=np.int64(10_000)).lr > 0
    assert lm.LMConfig(lr=1.0).lr == 1.0


def test_split_corpus_refuses_a_split_without_held_out_topics():
    with pytest.raises(ValueError, match="heldout_every=1000000000 holds out no topic"):  # (silently all train)
        lm.split_corpus(10**9)
    assert lm.split_corpus(10)[1]


@pytest.mark.parametrize(
    "question_ids, n_seen, exc, named",
    [
        (torch.tensor([[1, 2]]), -5, ValueError, "n_seen"),  # (silently decoded at negative positions)
        (torch.tensor([[1, 2]]), "3", TypeError, "n_seen"),
        ([[1, 2]], 3, TypeError, "question_ids"),  # (AttributeError: no attribute 'shape')
        (torch.tensor([1, 2]), 3, TypeError, "question_ids"),
        (torch.tensor([[1.0, 2.0]]), 3, TypeError, "question_ids"),
    ],
)
def test_decode_answer_checks_its_arguments(question_ids, n_seen, exc, named):
    with pytest.raises(exc, match=named):
        lm.decode_answer(None, None, None, question_ids, n_seen, 2)


@pytest.mark.parametrize("field", ["context", "question", "answer_prefix"])
def test_encode_query_and_generate_answer_need_strings(field):
    texts = {"context": "a b", "question": "q?", "answer_prefix": "A:", field: None}
    with pytest.raises(TypeError, match=f"{field} must be a str"):  # (can only concatenate str)
        lm.generate_answer(None, None, texts["context"], texts["question"], texts["answer_prefix"], 2)
