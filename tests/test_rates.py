"""diagnostics.rate_fit: decay rates with intervals (docs/spec.md §8), and lr="polyak" in train."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attsvm.datasets import paper_instance, random_instance
from attsvm.diagnostics import rate_fit
from attsvm.model import Batch, excess_risk_scaled, parameterization, risk_and_grad, risk_and_scaled_grad
from attsvm.problem import loss_fn
from attsvm.svm import AttentionSVM
from attsvm.train import train

RATE_TOL = 0.02  # recovered exponent vs the true one, with 2% log-normal noise on 40 points
EXACT_TOL = 1e-10  # noiseless data


def test_power_law_recovered_with_an_interval_that_covers_it():
    rng = np.random.default_rng(0)
    t = np.geomspace(10, 1e4, 40)
    y = 3.0 * t**-1.5 * np.exp(0.02 * rng.standard_normal(t.size))
    fit = rate_fit(t, y, model="power")
    assert fit.model == "power" and abs(fit.rate - 1.5) <= RATE_TOL
    assert fit.ci[0] <= 1.5 <= fit.ci[1] and fit.decaying and fit.r2 > 0.99
    np.testing.assert_allclose(fit.predict(t), 3.0 * t**-1.5, rtol=0.05)


def test_exponential_recovered_and_auto_tells_the_two_apart():
    t = np.linspace(1, 200, 50)
    exp_y = 0.5 * np.exp(-0.03 * t)
    fit = rate_fit(t, exp_y, model="exp")
    assert fit.rate == pytest.approx(0.03, abs=EXACT_TOL) and fit.coef == pytest.approx(0.5, rel=EXACT_TOL)
    assert rate_fit(t, exp_y).model == "exp"
    assert rate_fit(t, 2.0 * t**-0.7).model == "power"


def test_a_flat_series_is_not_decaying():
    rng = np.random.default_rng(1)
    t = np.arange(1.0, 30.0)
    fit = rate_fit(t, 1e-3 * np.exp(0.05 * rng.standard_normal(t.size)), model="power")
    assert not fit.decaying or abs(fit.rate) < 0.1


@pytest.mark.parametrize(
    "t,y,kw,match",
    [
        ([1, 2, 3], [1, 2], {}, "same length"),
        ([1, 2], [1, 2], {}, "at least 3 points"),
        ([0, 1, 2], [1, 2, 3], {}, "t must be positive"),
        ([1, 2, 3], [1, 0, 3], {}, "y must be positive"),
        ([1, 2, 3], [1, 2, 3], {"model": "linear"}, "model"),
        ([1, 2, 3], [1, 2, 3], {"level": 1.5}, "level"),
    ],
)
def test_bad_input(t, y, kw, match):
    with pytest.raises(ValueError, match=match):
        rate_fit(t, y, **kw)


# ------------------------------------------------------------------ Polyak's step with L* and the excess risk
EXCESS_RTOL = 1e-9  # the cancellation-free excess risk against the plain difference, where that is exact enough
STEP_RTOL = 1e-10  # one training step against its closed form


def _min_risk(p) -> float:
    return float(np.mean(loss_fn("logistic", p.scores.max(axis=1))))


def test_excess_risk_equals_the_plain_difference_away_from_saturation():
    probs = [random_instance(3, 4, 5, seed=s) for s in range(3)]
    b = Batch.from_problems(probs)
    rng = np.random.default_rng(0)
    W = torch.as_tensor(rng.standard_normal((3, 5, 5)))
    L, _, _, c = risk_and_scaled_grad(b, W)
    E = excess_risk_scaled(b, W) * torch.exp(-c)
    plain = L.numpy() - np.array([_min_risk(p) for p in probs])
    np.testing.assert_allclose(E.numpy(), plain, rtol=EXCESS_RTOL)


def test_excess_risk_is_exact_past_round_off():
    """Far along W_mm the excess risk is ~1e-40: the plain difference L − L* is 0, the cancellation-free
    one matches a 50-digit evaluation."""
    import mpmath

    p = paper_instance(3, 4, 5, seed=0)
    W_mm = AttentionSVM().fit(p).W_
    scale = 60.0
    b = Batch.from_problems(p)
    W = torch.as_tensor(scale * W_mm)[None]
    L, _, _, c = risk_and_scaled_grad(b, W)
    assert float(L[0]) - _min_risk(p) <= 1e-15  # lost to round-off
    got = float(excess_risk_scaled(b, W)[0] * torch.exp(-c[0]))
    mpmath.mp.dps = 60
    g = p.logits(scale * W_mm)
    gam = p.scores
    total = mpmath.mpf(0)
    for i in range(p.n):
        e = [mpmath.e ** mpmath.mpf(float(x)) for x in g[i]]
        u = sum(ei * mpmath.mpf(float(gi)) for ei, gi in zip(e, gam[i])) / sum(e)
        best = mpmath.mpf(float(gam[i].max()))
        total += mpmath.log(1 + mpmath.e ** (-u)) - mpmath.log(1 + mpmath.e ** (-best))
    want = float(total / p.n)
    assert 0 < want < 1e-20
    assert got == pytest.approx(want, rel=1e-8)


def test_lr_polyak_is_one_polyak_step_with_the_infimum_of_the_risk():
    p = random_instance(3, 4, 5, seed=3)
    res0 = train(p, steps=0, n_init=2, init="gaussian", init_scale=0.5, progress=False)
    res = train(p, steps=1, n_init=2, init="gaussian", init_scale=0.5, lr="polyak", progress=False)
    par = parameterization("W", 5)
    params = (torch.as_tensor(res0.W),)
    L, gW, _ = risk_and_grad(Batch.from_problems(p), par.weights(params))
    eta = (L - _min_risk(p)) / (gW**2).sum((-2, -1))
    expect = params[0] - eta[:, None, None] * gW
    np.testing.assert_allclose(res.W, expect.numpy(), rtol=0, atol=STEP_RTOL * float(expect.abs().max()))


def test_lr_polyak_runs_do_not_depend_on_their_batch():
    seeds = [0, 1, 3]  # (runs that stay finite: see the rates experiment on unbounded Polyak steps)
    probs = [paper_instance(6, 8, 10, seed=s) for s in seeds]
    together = train(probs, steps=200, seed=seeds, lr="polyak", progress=False)
    assert np.isfinite(together.W).all()
    for r, p in enumerate(probs):
        alone = train(p, steps=200, seed=seeds[r], lr="polyak", progress=False)
        np.testing.assert_allclose(together.W[r], alone.W[0], rtol=1e-10, atol=1e-10 * np.abs(alone.W).max())


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"lr": "polyak", "normalized": True}, "not normalized"),
        ({"lr": "polyak", "optimizer": "md", "p": 3.0}, "optimizer='md'"),
        ({"lr": "polyak", "penalty": 0.1}, "no penalty"),
        ({"lr": "fast"}, "lr"),
    ],
)
def test_lr_polyak_bad_combinations(kw, match):
    with pytest.raises(ValueError, match=match):
        train(random_instance(3, 4, 5, seed=0), steps=1, progress=False, **kw)


def test_lr_polyak_needs_a_linear_head():
    from attsvm.experiments.svm_eq import relu_instance

    with pytest.raises(ValueError, match="linear head"):
        train(relu_instance(3, 4, 5, 1), steps=1, lr="polyak", progress=False)
