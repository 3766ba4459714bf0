"""The ℓp attention SVM and its LP limits (docs/spec.md §8), checked against cvxpy's ``pnorm`` and by hand."""

from __future__ import annotations

import numpy as np
import pytest

from attsvm.datasets import paper_instance, random_instance
from attsvm.svm import AttentionSVM, att_svm_constraints, optimality_certificate
from attsvm.svm.lp import LpOptions, dual_map, solve_lp
from attsvm.svm.norms import L1, LINF, lp_norm

# relative objective agreement with cvxpy (Clarabel, interior point)
CVXPY_RTOL = 1e-6
# p = 2 against the Frobenius solver (both exact to round-off)
FRO_RTOL = 1e-9
# the certificate tolerance the estimator is asked for (its default)
CERT_TOL = 1e-9
# LP limits against a brute-force check of the certificate
LP_RTOL = 1e-7

P_VALUES = (1.25, 1.75, 3.0, 4.0)


@pytest.fixture(scope="module", params=[(6, 8, 10, 0), (8, 6, 12, 3)], ids=["paper-6-8-10", "paper-8-6-12"])
def problem(request):
    n, T, d, seed = request.param
    return paper_instance(n, T, d, seed=seed)


@pytest.mark.parametrize("p", P_VALUES)
def test_lp_matches_cvxpy_pnorm(problem, p):
    ours = AttentionSVM("lp", p=p).fit(problem)
    ref = AttentionSVM("lp", p=p, backend="cvxpy").fit(problem)
    assert ours.status_ == "optimal"
    assert ours.max_violation_ <= 1e-8
    assert ours.relative_gap_ <= CERT_TOL
    assert ref.W_ is not None
    assert abs(ours.objective_ - ref.objective_) <= CVXPY_RTOL * ref.objective_
    # the objective is the entrywise ℓp norm, computed independently here
    assert ours.objective_ == pytest.approx(np.sum(np.abs(ours.W_) ** p) ** (1 / p), rel=1e-12)


def test_lp_random_instance_and_support():
    prob = random_instance(5, 6, 9, seed=4)
    ours = AttentionSVM("lp", p=1.5).fit(prob)
    ref = AttentionSVM("lp", p=1.5, backend="cvxpy").fit(prob)
    assert ours.status_ == "optimal"
    assert abs(ours.objective_ - ref.objective_) <= CVXPY_RTOL * ref.objective_
    # complementary slackness: λ vanishes off the tight rows
    lam = ours.dual_coef_
    slack = np.where(np.isfinite(ours.margins_), ours.margins_ - 1.0, 0.0)
    assert np.all(np.abs(lam * slack) <= 1e-8 * lam.max())


def test_p2_equals_frobenius(problem):
    fro = AttentionSVM("fro").fit(problem)
    l2 = AttentionSVM("lp", p=2.0).fit(problem)
    assert l2.status_ == "optimal"
    assert np.abs(l2.W_ - fro.W_).max() <= FRO_RTOL * np.abs(fro.W_).max()
    assert l2.objective_ == pytest.approx(fro.objective_, rel=FRO_RTOL)


def test_certificate_checked_independently_and_perturbed_W_rejected(problem):
    p = 3.0
    svm = AttentionSVM("lp", p=p).fit(problem)
    cs = svm.constraints_
    lam = svm.dual_coef_
    q = p / (p - 1)
    # by hand: primal ½‖W‖_p², dual 1ᵀλ − ½‖Σλ_k a_k z_kᵀ‖_q², margins ≥ 1
    Y = np.einsum("nt,ntd,ne->de", lam, cs.A, cs.Z)
    primal = 0.5 * np.sum(np.abs(svm.W_) ** p) ** (2 / p)
    dual = lam.sum() - 0.5 * np.sum(np.abs(Y) ** q) ** (2 / q)
    assert (primal - dual) / (primal + dual) <= CERT_TOL
    margins = np.einsum("ntd,de,ne->nt", cs.A, svm.W_, cs.Z)
    assert margins[cs.mask].min() >= 1 - 1e-10
    # at the optimum W ∝ sign(M)|M|^{q−1} (docs/spec.md §8)
    assert np.allclose(dual_map(Y, p), svm.W_, atol=1e-7 * np.abs(svm.W_).max())
    # a perturbed W fails the certificate: shrunk (infeasible) or moved off the optimum (gap)
    nm = lp_norm(p)
    shrunk = optimality_certificate(cs, 0.99 * svm.W_, lam, nm)
    assert not shrunk.passes(CERT_TOL)
    rng = np.random.default_rng(0)
    moved = 1.05 * (svm.W_ + 0.05 * np.abs(svm.W_).max() * rng.standard_normal(svm.W_.shape))
    assert not optimality_certificate(cs, moved, lam, nm).passes(CERT_TOL)


def test_other_p_is_a_different_direction(problem):
    W175 = AttentionSVM("lp", p=1.75).fit(problem).W_
    W3 = AttentionSVM("lp", p=3.0).fit(problem).W_
    corr = np.vdot(W175, W3) / np.linalg.norm(W175) / np.linalg.norm(W3)
    assert corr < 0.999  # the norm changes the max-margin direction


def test_infeasible_instance_same_farkas_certificate():
    prob = paper_instance(6, 8, 3, seed=1)  # d too small: infeasible for every norm
    ref = AttentionSVM("fro").fit(prob)
    assert ref.status_ == "infeasible"
    for kw in (dict(norm="lp", p=1.5), dict(norm="lp", p=3.0), dict(norm="l1"), dict(norm="linf")):
        svm = AttentionSVM(**kw).fit(prob)
        assert svm.status_ == "infeasible", kw
        lam = svm.certificate_
        cs = svm.constraints_
        assert lam.min() >= 0 and lam.sum() == pytest.approx(1.0)
        resid = np.linalg.norm(np.einsum("nt,ntd,ne->de", lam, cs.A, cs.Z))
        assert resid <= 1e-8


@pytest.mark.parametrize("norm,obj", [("l1", L1), ("linf", LINF)])
def test_lp_limits_certified(problem, norm, obj):
    svm = AttentionSVM(norm).fit(problem)
    assert svm.status_ == "optimal"
    W = svm.W_
    value = np.abs(W).sum() if norm == "l1" else np.abs(W).max()
    assert svm.objective_ == pytest.approx(value, rel=1e-12)
    # optimality against any other feasible point: the ℓp solutions are feasible, so none beats W here
    for pp in (1.5, 3.0):
        other = AttentionSVM("lp", p=pp).fit(problem).W_
        other_value = np.abs(other).sum() if norm == "l1" else np.abs(other).max()
        assert value <= other_value * (1 + LP_RTOL)
    # the dual certificate by hand: λ/max(1, ‖Y‖°) is dual feasible
    cs = svm.constraints_
    Y = np.einsum("nt,ntd,ne->de", svm.dual_coef_, cs.A, cs.Z)
    dual = svm.dual_coef_.sum() / max(1.0, obj.dual_norm(Y))
    assert (value - dual) / value <= LP_RTOL


def test_solver_options_and_warm_path():
    cs = att_svm_constraints(paper_instance(6, 8, 10, seed=0))
    loose = solve_lp(cs, 1.75, options=LpOptions(newton_iter=0, lbfgs_gtol=1e-3, primal_route=False), tol=1e-12)
    assert loose.status == "optimal_inaccurate"
    tight = solve_lp(cs, 1.75)
    assert tight.status == "optimal" and tight.info["relative_gap"] <= CERT_TOL


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(norm="lp"), ValueError, r"p is required for norm='lp'"),
        (dict(norm="lp", p=1.0), ValueError, r"p must be None or a number with 1 < p < inf; got 1.0"),
        (dict(norm="lp", p=0.5), ValueError, r"p must be"),
        (dict(norm="lp", p=float("inf")), ValueError, r"p must be"),
        (dict(norm="lp", p="two"), ValueError, r"p must be None or a number with 1 < p < inf; got 'two'"),
        (dict(norm="fro", p=3.0), ValueError, r"p=3.0 applies to norm='lp' only"),
        (dict(norm="lp", p=3.0, rank=2), ValueError, r"rank=2 is only defined for norm='nuc'"),
        (dict(norm="l1", backend="cvxpy"), ValueError, r"backend='cvxpy' has no 'l1' formulation"),
    ],
)
def test_bad_p(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        AttentionSVM(**kwargs).fit(paper_instance(4, 5, 6, seed=0))


def test_lp_norm_helper_names_p():
    with pytest.raises(ValueError, match="p must satisfy 1 < p < inf"):
        lp_norm(1.0)
    with pytest.raises(ValueError, match="p must be a number"):
        lp_norm("3")  # type: ignore[arg-type]


def test_scale_invariance():
    from attsvm.svm import ConstraintSet

    cs = att_svm_constraints(paper_instance(6, 8, 10, seed=0))
    base = AttentionSVM("lp", p=3.0).fit_constraints(cs)
    for s in (1e-8, 1e8):
        svm = AttentionSVM("lp", p=3.0).fit_constraints(ConstraintSet(cs.A * s, cs.Z, cs.mask))
        assert svm.status_ == "optimal"
        assert np.allclose(svm.W_ * s, base.W_, rtol=1e-6, atol=1e-8 * np.abs(base.W_).max())


@pytest.mark.parametrize(("seed", "n", "T", "d"), [(3, 2, 6, 2), (15, 6, 8, 3), (60, 6, 8, 3), (178, 2, 6, 2)])
@pytest.mark.parametrize("p", [1.5, 3.0, 4.0])
def test_feasible_instances_where_the_dual_stalled_are_solved(seed, n, T, d, p):
    """These answered "error" (reported infeasible, no Farkas certificate) or "optimal_inaccurate" for p = 3, where
    the Frobenius and LP norms solve them: the primal route certifies them, at a norm no larger than cvxpy's
    W made feasible."""
    import warnings

    from attsvm.datasets import paper_instance

    prob = paper_instance(n, T, d, seed=seed)
    e = AttentionSVM("lp", p=p).fit(prob)
    assert e.status_ == "optimal" and e.relative_violation_ <= 1e-9
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = AttentionSVM("lp", p=p, backend="cvxpy").fit(prob)
    # cvxpy's W scaled up until it meets every margin is feasible, so its norm bounds the optimum from above
    cs = e.constraints_
    m = cs.apply(ref.W_)[cs.mask]
    feasible_ref = float(np.sum(np.abs(ref.W_) ** p) ** (1 / p)) * max(1.0, float(np.max(cs.rhs[cs.mask] / m)))
    assert e.objective_ <= feasible_ref * (1 + 1e-6)
    assert e.objective_ >= ref.objective_ * (1 - 1e-2)  # (cvxpy's inaccurate W misses margins at these norms)
