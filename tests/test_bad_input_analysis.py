"""Bad input to the analysis entry points is refused with an error that names the argument.

Pins, for ``attsvm.analysis``:

* ``claims.keep_sets``: a budget ≤ 0 or a float budget is refused (it was used as a slice), a plain list of
  scores is read as an array, NaN scores and a non-bool ``shared`` are refused;
* ``claims.bootstrap_ci``: ``n = 0`` resamples and a bad ``seed`` are refused by name; values near the float
  limit give a finite mean and interval (they overflowed to inf/NaN), and ordinary values the same numbers
  as the plain mean;
* ``claims.sequence_metrics``: empty attention (N = 0), NaN attention and a non-bool ``causal`` are refused;
* ``kv_compare.CompareConfig``: a scalar ``ratios``, a string ``tasks``, non-integer ``seeds``, an empty
  ``methods`` and a ``min_accuracy`` outside [0, 1] or not a number are refused; lists are read as tuples;
* ``kv_cache.select_keep``: ``stats`` of the wrong shape (or missing for a scoring policy) and ``n_seen``
  below the keys stored are refused; ``make_policy`` takes numpy integers for ``recent``;
* ``tasks.score_row`` with ``answers=None`` and ``tasks.ruler_scores(None)`` raise a named TypeError.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from attsvm.analysis import claims, kv_cache, kv_compare, tasks

REL = 1e-12  # relative tolerance of a mean computed after exact power-of-two scaling


# ------------------------------------------------------------------------------------------------ keep_sets
def _scores() -> np.ndarray:
    return np.random.default_rng(0).random((2, 3, 10))


@pytest.mark.parametrize("budget", [0, -1])
def test_keep_sets_refuses_a_budget_below_one(budget):
    with pytest.raises(ValueError, match=rf"budget must be >= 1, got {budget}"):
        claims.keep_sets(_scores(), budget)


def test_keep_sets_refuses_a_float_budget():
    with pytest.raises(TypeError, match=r"budget must be an integer, got float 2\.5"):
        claims.keep_sets(_scores(), 2.5)


def test_keep_sets_reads_a_plain_list_as_the_array():
    sc = _scores()
    np.testing.assert_array_equal(claims.keep_sets(sc.tolist(), 4), claims.keep_sets(sc, 4))


def test_keep_sets_refuses_wrong_shape_nan_scores_and_a_non_bool_shared():
    with pytest.raises(ValueError, match=r"score must have shape \(L, H, S\), got \(10,\)"):
        claims.keep_sets(np.zeros(10), 4)
    sc = _scores()
    sc[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="score must not hold NaN"):
        claims.keep_sets(sc, 4)
    with pytest.raises(TypeError, match="shared must be a bool"):
        claims.keep_sets(_scores(), 4, shared="yes")


# ------------------------------------------------------------------------------------------------ bootstrap_ci
def test_bootstrap_ci_refuses_zero_resamples():
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        claims.bootstrap_ci([1.0, 2.0, 3.0], n=0)


@pytest.mark.parametrize(
    ("seed", "exc", "msg"), [("a", TypeError, "seed must be an integer"), (-1, ValueError, "seed must be >= 0")]
)
def test_bootstrap_ci_checks_the_seed(seed, exc, msg):
    with pytest.raises(exc, match=msg):
        claims.bootstrap_ci([1.0, 2.0, 3.0], seed=seed)


def test_bootstrap_ci_does_not_overflow_near_the_float_limit_and_keeps_ordinary_means():
    big = 1.5e308
    with np.errstate(all="raise"):
        mean, lo, hi = claims.bootstrap_ci([big, big, big, big], n=50)
    assert (mean, lo, hi) == (big, big, big)
    mean, lo, hi = claims.bootstrap_ci([big, -big, big, big], n=200)
    assert mean == pytest.approx(0.5 * big, rel=REL)
    assert np.isfinite([lo, hi]).all() and -big <= lo <= mean <= hi <= big
    # (and ordinary values give the plain mean and percentiles)
    v = np.random.default_rng(3).normal(size=40) * 7.0
    mean, lo, hi = claims.bootstrap_ci(v, seed=5, n=300)
    means = v[np.random.default_rng(5).integers(0, v.size, size=(300, v.size))].mean(1)
    assert mean == pytest.approx(v.mean(), rel=REL)
    assert lo == pytest.approx(np.quantile(means, 0.025), rel=REL)
    assert hi == pytest.approx(np.quantile(means, 0.975), rel=REL)


# ------------------------------------------------------------------------------------------------ sequence_metrics
def test_sequence_metrics_refuses_empty_attention():
    with pytest.raises(ValueError, match=r"attn must have L, H >= 1 and N >= 1, got shape \(1, 1, 0, 0\)"):
        claims.sequence_metrics(np.zeros((1, 1, 0, 0)), np.zeros(0, dtype=bool), False)


def test_sequence_metrics_refuses_nan_attention():
    a = np.full((1, 2, 5, 5), 0.2)
    a[0, 1, 2, 3] = np.nan
    with pytest.raises(ValueError, match="attn must be finite, got 1 NaN/inf entries"):
        claims.sequence_metrics(a, np.zeros(5, dtype=bool), False)


def test_sequence_metrics_refuses_a_non_bool_causal():
    with pytest.raises(TypeError, match="causal must be a bool"):
        claims.sequence_metrics(np.full((1, 1, 5, 5), 0.2), np.zeros(5, dtype=bool), "no")


# ------------------------------------------------------------------------------------------------ CompareConfig
@pytest.mark.parametrize(
    ("kwargs", "exc", "msg"),
    [
        ({"ratios": 0.5}, TypeError, "ratios must be a tuple, got float 0.5"),
        ({"tasks": "vt"}, TypeError, "tasks must be a tuple, got str 'vt'"),
        ({"seeds": ("a",)}, TypeError, "seeds must be an integer, got str 'a'"),
        ({"seeds": (1.5,)}, TypeError, "seeds must be an integer, got float 1.5"),
        ({"methods": ()}, ValueError, r"methods must be non-empty, got \(\)"),
        ({"min_accuracy": 5}, ValueError, r"min_accuracy must be in \[0, 1\]"),
        ({"min_accuracy": -0.1}, ValueError, r"min_accuracy must be in \[0, 1\]"),
        ({"min_accuracy": "x"}, TypeError, "min_accuracy must be a real number"),
    ],
)
def test_compare_config_refuses_bad_fields(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        kv_compare.CompareConfig(**kwargs)


def test_compare_config_reads_lists_as_tuples():
    cfg = kv_compare.CompareConfig(ratios=[0.5], tasks=["vt"], seeds=[np.int64(1)], methods=["full"])
    assert (cfg.ratios, cfg.tasks, cfg.seeds, cfg.methods) == ((0.5,), ("vt",), (1,), ("full",))
    assert type(cfg.seeds[0]) is int


# ------------------------------------------------------------------------------------------------ kv_cache
def _positions() -> torch.Tensor:
    return torch.arange(4).view(1, 1, 4)


def test_select_keep_refuses_stats_of_the_wrong_shape():
    pol = kv_cache.SVMarginPolicy(recent=0)
    stats = torch.zeros(1, 1, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"stats must have the shape of positions \(1, 1, 4\), got \(1, 1, 3\)"):
        kv_cache.select_keep(pol, stats, _positions(), 2, 4)


def test_select_keep_refuses_missing_stats_for_a_scoring_policy():
    with pytest.raises(ValueError, match="stats must be a tensor of shape"):
        kv_cache.select_keep(kv_cache.SVMarginPolicy(recent=0), None, _positions(), 2, 4)


@pytest.mark.parametrize("n_seen", [-1, 3])
def test_select_keep_refuses_n_seen_below_the_keys_stored(n_seen):
    stats = torch.zeros(1, 1, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=rf"n_seen must be >= 4, got {n_seen}"):
        kv_cache.select_keep(kv_cache.SVMarginPolicy(recent=0), stats, _positions(), 2, n_seen)


def test_make_policy_accepts_numpy_integers():
    pol = kv_cache.make_policy("h2o", recent=np.int64(3), sinks=np.int32(1))
    assert pol.protected(10) == (1, 3) and type(pol.recent) is int
    assert kv_cache.make_policy("svm", recent=np.float32(0.5)).protected(10) == (0, 5)


# ------------------------------------------------------------------------------------------------ tasks
def test_score_row_refuses_answers_none():
    with pytest.raises(TypeError, match="answers must be a non-empty list of strings, got NoneType"):
        tasks.score_row("a", None)


def test_ruler_scores_refuses_none():
    with pytest.raises(TypeError, match="df must be a pandas DataFrame"):
        tasks.ruler_scores(None)
    df = pd.DataFrame({"task": ["vt"], "answer": [["a"]], "predicted_answer": ["a b"]})
    assert tasks.ruler_scores(df) == {"vt": 100.0}


def test_serving_metrics_refuses_nan_and_malformed_attention():
    N = 2 * claims.PAGE + claims.SERVING_EVAL
    A = np.full((1, 1, N, N), 1.0 / N)
    A[0, 0, 3, 2] = np.nan
    with pytest.raises(ValueError, match="attn must be finite"):
        claims.serving_metrics(A)
    with pytest.raises(ValueError, match=r"attn must have shape \(L, H, N, N\)"):
        claims.serving_metrics(np.ones((2, N, N)))
