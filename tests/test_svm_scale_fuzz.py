"""A certificate that cannot lie: results do not depend on units, and statuses are always backed.

Whenever the status is "optimal" the objective agrees with an independent solve of the rescaled
problem (the analytic rescaling: for X → cX per sequence the constraints are row rescalings, so
‖W‖ is unchanged; for a global c on X and Z, W scales by 1/c²), and "infeasible" always comes with
a Farkas certificate that the certificate module verifies.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attsvm.datasets import paper_instance, random_instance
from attsvm.problem import AttentionProblem
from attsvm.svm import AttentionSVM, att_svm_constraints, farkas_certificate, feasible

OBJ_RTOL = 1e-6  # agreement with the independent (unit-scale) solve


def _rescale(p: AttentionProblem, cx: np.ndarray, cz: np.ndarray) -> AttentionProblem:
    return AttentionProblem(p.X * cx[:, None, None], p.y, p.head, Z=p.queries * cz[:, None])


def _check(p_unit: AttentionProblem, p: AttentionProblem, factor: float, norm: str) -> None:
    alpha = p_unit.optimal_tokens(ties="first")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ref = AttentionSVM(norm).fit(p_unit, alpha)
        svm = AttentionSVM(norm).fit(p, alpha)
    if svm.status_ == "optimal":
        assert ref.status_ in ("optimal", "optimal_inaccurate")
        assert svm.objective_ == pytest.approx(ref.objective_ * factor, rel=OBJ_RTOL)
    if svm.status_ == "infeasible":
        cert = farkas_certificate(att_svm_constraints(p, alpha), svm.certificate_)
        assert cert.valid
        assert not feasible(p, alpha)
    if ref.status_ == "optimal":  # a feasible, well-solved instance never turns into "infeasible"
        assert svm.status_ != "infeasible"


scales = st.floats(-8, 8)


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 6), T=st.integers(2, 8), extra=st.integers(0, 4), seed=st.integers(0, 10_000),
       g=scales, per=st.lists(st.floats(-4, 4), min_size=6, max_size=6), norm=st.sampled_from(["fro", "nuc"]),
       near_tie=st.booleans())
def test_certificate_fuzz(n, T, extra, seed, g, per, norm, near_tie):
    d = max(T - 1, n) + extra
    p = random_instance(n, T, d, seed=seed)
    if near_tie:  # a near-duplicate token: a_k tiny but non-zero
        X = p.X.copy()
        X[:, -1] = X[:, 0] + 1e-7 * np.random.default_rng(seed).standard_normal((n, d))
        p = AttentionProblem(X, p.y, p.head, Z=p.queries)
    cx = 10.0 ** (g + np.asarray(per[:n]))  # global × per-sequence scaling of X
    _check(p, _rescale(p, cx, np.ones(n)), 1.0, norm)  # (row rescalings: ‖W‖ unchanged)
    c = 10.0 ** g
    _check(p, _rescale(p, np.full(n, c), np.full(n, c)), c ** -2, norm)


@pytest.mark.parametrize("norm", ["fro", "nuc"])
@pytest.mark.parametrize("cx,cz", [(1e8, 1.0), (1e-8, 1.0), (1e6, 1e6)])
def test_issue_scale_examples(norm, cx, cz):
    p = paper_instance(6, 8, 10, seed=0)
    n = p.n
    _check(p, _rescale(p, np.full(n, cx), np.full(n, cz)), 1.0 / (cx * cz), norm)
    svm = AttentionSVM(norm).fit(_rescale(p, np.full(n, cx), np.full(n, cz)))
    assert svm.status_ == "optimal"


def test_per_sequence_rescaling_stays_feasible():
    p = paper_instance(6, 8, 10, seed=0)
    per = 10.0 ** np.array([-5, -2.5, 0, 2.5, 5, 0])
    q = _rescale(p, per, per)
    assert feasible(q)
    ref = AttentionSVM().fit(p)
    svm = AttentionSVM().fit(q)
    assert svm.status_ in ("optimal", "optimal_inaccurate")
    assert svm.max_violation_ <= 1e-6 * 1e10  # (margins of the tiny sequence are relative to its scale)
    assert ref.status_ == "optimal"


def test_large_T_tiny_d_is_solved():
    p = paper_instance(2, 1000, 2, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        svm = AttentionSVM().fit(p)
    assert feasible(p)
    assert svm.status_ in ("optimal", "optimal_inaccurate") and svm.relative_violation_ <= 1e-9
    assert svm.relative_gap_ <= 1e-8


@pytest.mark.parametrize("norm", ["fro", "nuc"])
def test_a_wrong_W_or_lambda_is_rejected_for_every_norm(norm):
    from attsvm.svm import optimality_certificate

    p = paper_instance(6, 8, 10, seed=0)
    cs = att_svm_constraints(p)
    svm = AttentionSVM(norm).fit(p)
    good = optimality_certificate(cs, svm.W_, svm.dual_coef_, norm)
    assert good.passes(1e-8)
    assert not optimality_certificate(cs, 0.99 * svm.W_, svm.dual_coef_, norm).passes(1e-8)  # infeasible W
    assert not optimality_certificate(cs, 1.01 * svm.W_, svm.dual_coef_, norm).passes(1e-8)  # too large W
    assert not optimality_certificate(cs, svm.W_, 0.9 * svm.dual_coef_, norm).passes(1e-8)  # wrong λ
    # and a wrong Farkas λ is rejected too
    assert not farkas_certificate(cs, np.where(cs.mask, 1.0, 0.0)).valid
