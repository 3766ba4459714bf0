"""diagnostics.rate_fit: decay rates with intervals (docs/spec.md §8), and lr="polyak" in train."""

from __future__ import annotations

import numpy as np
import pytest

from attsvm.diagnostics import rate_fit

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
