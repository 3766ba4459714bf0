"""AttentionSVM follows scikit-learn's estimator protocol (get_params/set_params/clone, NotFittedError)."""

from __future__ import annotations

import numpy as np
import pytest

from attsvm.datasets import paper_instance
from attsvm.svm import AttentionSVM, NotFittedError

sklearn_base = pytest.importorskip("sklearn.base")


def test_clone_round_trips():
    svm = AttentionSVM("nuc", tol=1e-7, max_iter=50, seed=3)
    twin = sklearn_base.clone(svm)
    assert twin is not svm and twin.get_params() == svm.get_params()
    assert twin.get_params(deep=True) == svm.get_params(deep=False)
    p = paper_instance(6, 8, 10, seed=0)
    svm.fit(p)
    fresh = sklearn_base.clone(svm)  # clone drops fitted state
    with pytest.raises(NotFittedError):
        _ = fresh.status_
    assert fresh.get_params() == svm.get_params()


def test_grid_search_style_set_params():
    p = paper_instance(6, 8, 10, seed=0)
    base = AttentionSVM()
    objectives = {}
    for params in ({"norm": "fro"}, {"norm": "nuc", "tol": 1e-8}, {"norm": "nuc", "rank": 10}):
        est = sklearn_base.clone(base).set_params(**params)
        assert all(est.get_params()[k] == v for k, v in params.items())
        est.fit(p)
        assert est.status_ == "optimal"
        objectives[tuple(sorted(params.items()))] = est.objective_
    nuc = objectives[(("norm", "nuc"), ("tol", 1e-8))]
    assert objectives[(("norm", "nuc"), ("rank", 10))] == pytest.approx(nuc, rel=1e-6)


@pytest.mark.parametrize(
    "params,exc,match",
    [
        ({"norm": "l3"}, ValueError, "norm must be one of 'fro', 'nuc', 'lp', 'l1', 'linf', 'spectral'; got 'l3'"),
        ({"tol": "small"}, TypeError, "tol must be a finite number > 0; got 'small'"),
        ({"rank": 0}, ValueError, "rank must be None or an integer >= 1; got 0"),
        ({"max_iter": 2.5}, TypeError, "max_iter must be None or an integer >= 1; got 2.5"),
        ({"C": 1.0}, ValueError, "invalid parameter 'C' for AttentionSVM"),
    ],
)
def test_set_params_validates(params, exc, match):
    svm = AttentionSVM()
    with pytest.raises(exc, match=match):
        svm.set_params(**params)
    assert svm.get_params() == AttentionSVM().get_params()  # nothing was set


def test_not_fitted_error_is_value_and_attribute_error():
    svm = AttentionSVM()
    for name in ("W_", "objective_", "support_", "rank_", "certificate_", "dual_", "status_"):
        with pytest.raises(NotFittedError, match="not fitted yet"):
            getattr(svm, name)
        assert not hasattr(svm, name)
    with pytest.raises(ValueError, match="not fitted yet"):
        svm.summary()
    with pytest.raises(AttributeError, match="no attribute 'bogus'"):
        _ = svm.bogus
    svm.fit(paper_instance(4, 5, 6, seed=0))
    assert np.isfinite(svm.objective_) and svm.dual_ is svm.dual_coef_


def test_refit_revalidates_changed_parameters():
    """fit skips re-checking parameters only while each is the very object last checked: a parameter
    changed between fits, by attribute or by set_params, is checked again."""
    p = paper_instance(3, 4, 5, seed=0)
    est = AttentionSVM().fit(p)
    assert est.fit(p).status_ == "optimal"
    est.tol = -1.0
    with pytest.raises(ValueError, match="tol"):
        est.fit(p)
    est.tol, est.norm = 1e-8, "l3"
    with pytest.raises(ValueError, match="norm"):
        est.fit(p)
    est.norm, est.rank = "fro", 2
    with pytest.raises(ValueError, match="rank"):
        est.fit(p)
    est.set_params(rank=None)
    assert est.fit(p).status_ == "optimal"


RANK_RTOL = 1e-7  # the documented relative threshold of rank_


def test_rank_is_read_off_the_fitted_W_and_follows_refits():
    """rank_ (computed from W_ on first read for the Frobenius norm, with the certificate's SVD for
    the nuclear one) is W_'s numerical rank, and a refit on another problem replaces it."""
    p = paper_instance(3, 4, 5, seed=0)
    q = paper_instance(6, 8, 10, seed=1)
    for norm in ("fro", "nuc"):
        est = AttentionSVM(norm)
        for prob in (p, q, p):
            est.fit(prob)
            s = np.linalg.svd(est.W_, compute_uv=False)
            assert est.rank_ == int((s > RANK_RTOL * s[0]).sum()) == np.linalg.matrix_rank(est.W_, tol=RANK_RTOL * s[0])
