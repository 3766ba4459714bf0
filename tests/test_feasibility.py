"""Feasibility and infeasibility certificates (docs/spec.md §3, theorem of alternatives)."""

from __future__ import annotations

import numpy as np
import pytest

from attsvm.datasets import paper_instance, random_instance
from attsvm.problem import AttentionProblem
from attsvm.svm import (
    AttentionSVM,
    ConstraintSet,
    InfeasibleSVMError,
    att_svm_constraints,
    feasible,
)
from attsvm.svm.feasibility import farkas_lp, feasible_constraints

CERT_TOL = 1e-8  # ‖Σ λ_k a_k z_kᵀ‖_F of a valid certificate (unit-norm data)


def _duplicate_tokens() -> tuple[AttentionProblem, np.ndarray]:
    p = paper_instance(6, 8, 10, seed=1)
    alpha = p.optimal_tokens()
    X = p.X.copy()
    X[2, (alpha[2] + 1) % 8] = X[2, alpha[2]]  # a token equal to the selected one: a_k = 0
    return AttentionProblem(X, p.y, p.v, Z=p.Z), alpha


def _zero_query() -> tuple[AttentionProblem, np.ndarray]:
    p = paper_instance(6, 8, 10, seed=1)
    Z = p.Z.copy()
    Z[4] = 0.0  # z_i = 0: every margin of sequence 4 is 0
    return AttentionProblem(p.X, p.y, p.v, Z=Z), p.optimal_tokens()


def _small_d() -> tuple[AttentionProblem, np.ndarray]:
    p = paper_instance(6, 8, 3, seed=1)  # d = 3 < max(T − 1, n): infeasible for this draw
    return p, p.optimal_tokens(ties="first")


CASES = {"duplicate_tokens": _duplicate_tokens, "zero_query": _zero_query, "d_too_small": _small_d}


def _assert_certificate(problem, alpha, lam):
    cs = att_svm_constraints(problem, alpha)
    assert lam.shape == (problem.n, problem.T)
    assert np.all(lam >= 0) and lam.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.all(lam[~cs.mask] == 0)
    assert np.linalg.norm(cs.adjoint(lam)) <= CERT_TOL


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("method", ["solver", "lp"])
def test_infeasible_cases_are_certified(case, method):
    p, alpha = CASES[case]()
    rep = feasible(p, alpha, method=method)
    assert not rep.feasible and not rep
    assert rep.W is None and rep.method == method
    _assert_certificate(p, alpha, rep.certificate)
    assert rep.certificate_residual == pytest.approx(
        np.linalg.norm(att_svm_constraints(p, alpha).adjoint(rep.certificate)), abs=1e-15
    )


def test_certificate_points_at_the_cause():
    p, alpha = _duplicate_tokens()
    lam = feasible(p, alpha, method="lp").certificate
    assert lam[2, (alpha[2] + 1) % 8] == pytest.approx(1.0)  # the zero constraint alone
    p, alpha = _zero_query()
    lam = feasible(p, alpha).certificate
    assert lam[4].sum() == pytest.approx(1.0)  # all its weight on the zero-query sequence


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("norm,backend", [("fro", "auto"), ("nuc", "auto"), ("fro", "cvxpy")])
def test_estimator_infeasible_status_and_raise(case, norm, backend):
    p, alpha = CASES[case]()
    svm = AttentionSVM(norm, backend=backend).fit(p, alpha)
    assert svm.status_ == "infeasible" and svm.W_ is None and svm.objective_ is None
    _assert_certificate(p, alpha, svm.certificate_)
    assert "infeasible" in svm.summary()
    with pytest.raises(InfeasibleSVMError, match=r"infeasible.*certifies it") as exc:
        AttentionSVM(norm, backend=backend, on_infeasible="raise").fit(p, alpha)
    _assert_certificate(p, alpha, exc.value.certificate)
    np.testing.assert_array_equal(exc.value.tokens, alpha)


def test_feasible_report_has_margin_certificate():
    p = paper_instance(6, 8, 10, seed=0)
    for method in ("solver", "lp"):
        rep = feasible(p, method=method)
        assert rep.feasible and rep.certificate is None
        cs = att_svm_constraints(p)
        assert cs.apply(rep.W)[cs.mask].min() >= 1 - 1e-10
        assert rep.min_margin >= 1 - 1e-10 and rep.max_violation <= 1e-10


@pytest.mark.parametrize("seed", range(6))
def test_solver_and_lp_agree_around_the_threshold(seed):
    """Near d ≈ max(T−1, n) draws go both ways; the two independent methods must agree."""
    rng = np.random.default_rng(seed)
    n, T = int(rng.integers(2, 7)), int(rng.integers(3, 8))
    d = max(1, max(T - 1, n) - int(rng.integers(0, 3)))
    p = random_instance(n, T, d, seed=seed, self_attention=bool(seed % 2))
    alpha = p.optimal_tokens(ties="first")
    a, b = feasible(p, alpha, method="solver"), feasible(p, alpha, method="lp")
    assert a.feasible == b.feasible
    if not a.feasible:
        _assert_certificate(p, alpha, a.certificate)
        _assert_certificate(p, alpha, b.certificate)


def test_general_constraint_set_with_equalities():
    """Alternative for equality rows: λ_E free, bᵀλ > 0. Two contradictory equalities."""
    p = paper_instance(3, 4, 6, seed=0)
    cs0 = att_svm_constraints(p, np.zeros(3, dtype=np.int64))
    A = cs0.A.copy()
    A[0, 2] = A[0, 1]  # same feature, two right-hand sides 1 and 2
    eq = np.zeros_like(cs0.mask)
    eq[0, 1:3] = True
    rhs = np.ones((3, 4))
    rhs[0, 2] = 2.0
    cs = ConstraintSet(A, cs0.Z, cs0.mask, rhs, eq)
    for method in ("solver", "lp"):
        rep = feasible_constraints(cs, method=method)
        assert not rep.feasible
        lam = rep.certificate
        assert np.linalg.norm(cs.adjoint(lam)) <= CERT_TOL and (cs.rhs * lam).sum() > 0
        assert np.all(lam[cs.inequality] >= 0)
    assert farkas_lp(att_svm_constraints(paper_instance(6, 8, 10, seed=0))) is None


def test_locally_optimal_report():
    """docs/spec.md §2: opt is locally optimal; a selection whose support holds a better token is not."""
    from attsvm.svm import locally_optimal

    p = paper_instance(6, 8, 10, seed=0)
    opt = p.optimal_tokens()
    rep = locally_optimal(p, opt)
    assert rep.feasible and rep.locally_optimal and rep.failed_sequences == []
    np.testing.assert_array_equal(rep.support, AttentionSVM().fit(p, opt).support_)
    worst = np.argmin(p.scores, axis=1)  # every other token scores higher: any support token offends
    rep = locally_optimal(p, worst)
    assert rep.feasible and not rep.locally_optimal
    g = p.scores
    for i in rep.failed_sequences:
        assert rep.offending[i] and all(g[i, t] >= g[i, worst[i]] for t in rep.offending[i])
    p3, alpha = _small_d()
    rep = locally_optimal(p3, alpha)
    assert not rep.feasible and not rep.locally_optimal


@pytest.mark.filterwarnings("ignore:Solution may be inaccurate")
def test_cvxpy_time_limit_is_reported():
    from attsvm.svm import solve_cvxpy

    cs = att_svm_constraints(paper_instance(15, 15, 20, seed=0))
    raw = solve_cvxpy(cs, "nuc", solver="CLARABEL", time_limit=1e-4)
    assert raw.status == "max_iter" and raw.info["cvxpy_status"] == "user_limit"
