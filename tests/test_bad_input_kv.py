"""Malformed arguments to the eviction cache's public helpers (stop-8 audit 9): named errors where they used to
be bare AssertionErrors, AttributeErrors, a ZeroDivisionError, or negative protection counts accepted."""

from __future__ import annotations

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
