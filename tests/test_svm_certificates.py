"""Every solution carries a certificate that actually certifies it (docs/spec.md §3; cvxpy's test_KKT style)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attsvm.datasets import paper_instance, random_instance
from attsvm.svm import AttentionSVM, RawSolution, att_svm_constraints
from attsvm.tokens import margins as token_margins
from attsvm.tokens import support_tokens

VIOLATION_TOL = 1e-8  # primal feasibility required of every returned solution
GAP_TOL = 1e-8  # relative duality gap of our solvers
CS_TOL = 1e-8  # complementary slackness max |λ_k (m_k − 1)|


def _check_certificate(svm: AttentionSVM, problem, tokens, cs_tol: float = CS_TOL) -> None:
    cs = att_svm_constraints(problem, tokens)
    W, lam = svm.W_, svm.dual_coef_
    # primal feasibility, recomputed from scratch
    m = token_margins(problem, tokens, W)
    assert np.min(m) >= 1.0 - VIOLATION_TOL
    assert svm.max_violation_ <= VIOLATION_TOL
    np.testing.assert_allclose(svm.margins_, m, rtol=1e-12, atol=1e-12)
    # dual feasibility and the (n, T) layout: λ ≥ 0, zero at α_i
    assert np.all(lam >= 0) and np.all(lam[np.arange(problem.n), tokens] == 0)
    # complementary slackness: λ_k > 0 only on tight constraints
    fin = np.isfinite(m)
    assert np.max(np.abs(lam[fin] * (m[fin] - 1.0))) <= cs_tol * max(1.0, lam.sum())
    assert svm.complementary_slackness_ <= cs_tol * max(1.0, lam.sum())
    # strong duality, recomputed: ½‖W‖² = 1ᵀλ − ½‖𝒜*λ‖² (Frobenius)
    if svm.norm == "fro":
        dual = lam.sum() - 0.5 * np.sum(cs.adjoint(lam) ** 2)
        assert 0.5 * np.sum(W**2) - dual <= GAP_TOL * max(1.0, 0.5 * np.sum(W**2))
        assert svm.objective_ == pytest.approx(np.linalg.norm(W), rel=1e-12)
        assert svm.rank_ <= problem.n  # row space ⊂ span{z_i} (docs/spec.md §3)
    else:
        dual = lam.sum() / max(1.0, np.linalg.norm(cs.adjoint(lam), 2))
        nuc = np.linalg.svd(W, compute_uv=False).sum()
        assert nuc - dual <= 1e-6 * nuc
    assert svm.relative_gap_ <= (GAP_TOL if svm.norm == "fro" else 1e-6)
    # support = tight constraints, and every positive multiplier sits on one
    np.testing.assert_array_equal(svm.support_, support_tokens(m))
    if svm.norm == "fro":  # (the nuclear dual may weight near-tight constraints at tolerance level)
        assert np.all(svm.support_[lam > 1e-5 * lam.max()])


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 12),
    T=st.integers(2, 12),
    extra=st.integers(0, 10),
    self_att=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_frobenius_certificate_on_random_instances(n, T, extra, self_att, seed):
    d = max(T - 1, n) + extra + (1 if self_att else 0)  # generic feasibility (docs/spec.md §3)
    p = random_instance(n, T, d, seed=seed, self_attention=self_att)
    alpha = p.optimal_tokens(ties="first")
    svm = AttentionSVM("fro").fit(p, alpha)
    if svm.status_ == "infeasible":  # possible for self-attention draws; must be certified
        assert svm.certificate_residual_ <= 1e-7
        return
    assert svm.status_ == "optimal"
    _check_certificate(svm, p, alpha)


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 6), T=st.integers(2, 6), seed=st.integers(0, 1000))
def test_nuclear_certificate_on_random_instances(n, T, seed):
    p = random_instance(n, T, max(T - 1, n) + 2, seed=seed)
    alpha = p.optimal_tokens(ties="first")
    svm = AttentionSVM("nuc", tol=1e-8, max_iter=200).fit(p, alpha)
    assert svm.status_ in ("optimal", "optimal_inaccurate")
    # whatever the backend claims, the reported numbers are recomputed and consistent ...
    cs = att_svm_constraints(p, alpha)
    lam = svm.dual_coef_
    nuc = np.linalg.svd(svm.W_, compute_uv=False).sum()
    dual = lam.sum() / max(1.0, np.linalg.norm(cs.adjoint(lam), 2))
    assert svm.duality_gap_ == pytest.approx(nuc - dual, rel=1e-9, abs=1e-12)
    assert svm.max_violation_ == pytest.approx(cs.violation(svm.W_), abs=1e-15)
    assert (svm.status_ == "optimal") == (svm.relative_gap_ <= 1e-8 and svm.max_violation_ <= 1e-8)
    # ... and an "optimal" claim passes the independent KKT check
    if svm.status_ == "optimal":
        _check_certificate(svm, p, alpha)


@pytest.mark.parametrize("backend", ["auto", "cvxpy"])
@pytest.mark.parametrize("norm", ["fro", "nuc"])
def test_backends_agree_on_paper_instance(norm, backend):
    p = paper_instance(6, 8, 10, seed=0)
    ref = AttentionSVM(norm, backend="cvxpy", tol=1e-6).fit(p)
    svm = AttentionSVM(norm, backend=backend, tol=1e-6).fit(p)
    assert svm.status_ == "optimal"
    assert svm.objective_ == pytest.approx(ref.objective_, rel=1e-5)
    assert svm.backend_.startswith("cvxpy" if backend == "cvxpy" else ("frobenius" if norm == "fro" else "nuclear"))
    _check_certificate(svm, p, p.optimal_tokens(), cs_tol=1e-6)


def test_a_wrong_solution_is_not_certified(monkeypatch):
    """The certificate is recomputed, not trusted: a perturbed W or λ must lose 'optimal'."""
    from attsvm.svm import frobenius

    p = paper_instance(6, 8, 10, seed=0)
    good = frobenius.solve_frobenius(att_svm_constraints(p))

    def shrunk(cs, **kw):  # infeasible W (margins 0.99), and λ from the true optimum
        return RawSolution(0.99 * good.W, good.dual, "optimal", 1, {})

    def suboptimal(cs, **kw):  # feasible but too large W: positive gap
        return RawSolution(1.01 * good.W, good.dual, "optimal", 1, {})

    monkeypatch.setattr(frobenius, "solve_frobenius", shrunk)
    svm = AttentionSVM().fit(p)
    assert svm.status_ == "optimal_inaccurate" and svm.max_violation_ == pytest.approx(0.01, rel=1e-6)
    monkeypatch.setattr(frobenius, "solve_frobenius", suboptimal)
    svm = AttentionSVM().fit(p)
    assert svm.status_ == "optimal_inaccurate" and svm.max_violation_ == 0.0
    assert svm.relative_gap_ > 1e-3


def test_iteration_limit_is_reported():
    p = paper_instance(15, 15, 20, seed=0)
    with pytest.warns(RuntimeWarning, match="iteration limit"):
        svm = AttentionSVM(max_iter=1).fit(p)
    assert svm.status_ == "max_iter" and svm.n_iter_ == 1


def test_rank_constrained_reports_convex_optimum():
    p = paper_instance(6, 8, 10, seed=0)
    full = AttentionSVM("nuc", tol=1e-8, max_iter=200).fit(p)
    hi = AttentionSVM("nuc", rank=10, tol=1e-8, max_iter=200).fit(p)
    assert hi.reached_convex_optimum_ is True and hi.status_ == "optimal"
    assert hi.objective_ == pytest.approx(full.objective_, rel=1e-6)
    lo = AttentionSVM("nuc", rank=1, tol=1e-8).fit(p)
    assert lo.rank_ <= 1 and lo.max_violation_ <= VIOLATION_TOL
    assert lo.objective_ >= full.objective_ * (1 - 1e-9)
    assert lo.reached_convex_optimum_ == (abs(lo.objective_ - full.objective_) <= 1e-6 * full.objective_)


def test_to_dict_and_summary_are_complete():
    import json

    p = paper_instance(6, 8, 10, seed=0)
    svm = AttentionSVM().fit(p)
    d = json.loads(json.dumps(svm.to_dict(), allow_nan=False))
    assert d["status"] == "optimal" and d["n_support"] == int(svm.support_.sum())
    assert d["margins"][0][int(svm.tokens_[0])] is None  # +inf at α_i
    np.testing.assert_allclose(np.array(d["W"]), svm.W_)
    s = svm.summary()
    for word in ("objective", "support", "violation", "duality gap", "time"):
        assert word in s
    assert "fitted: optimal" in repr(svm)


def test_cvxpy_solver_failure_becomes_a_status(monkeypatch):
    """A cvxpy SolverError (or any backend exception) is reported as status "error" with its message."""
    cp = pytest.importorskip("cvxpy")

    def boom(self, *args, **kwargs):
        raise cp.error.SolverError("solver crashed")

    monkeypatch.setattr(cp.Problem, "solve", boom)
    with pytest.warns(RuntimeWarning, match="returned no solution"):
        svm = AttentionSVM(backend="cvxpy").fit(paper_instance(4, 5, 6, seed=0))
    assert svm.status_ == "error" and "solver crashed" in svm.info_["message"]


def test_lp_failure_is_not_an_exception(monkeypatch):
    """HiGHS failing inside the Farkas LP yields no certificate (never an escaping exception)."""
    import scipy.optimize

    from attsvm.svm import find_farkas

    def broken(*args, **kwargs):
        raise RuntimeError("HiGHS failed")

    monkeypatch.setattr(scipy.optimize, "linprog", broken)
    p = paper_instance(6, 8, 3, seed=1)  # infeasible (d too small)
    cs = att_svm_constraints(p, p.optimal_tokens(ties="first"))
    assert find_farkas(cs) is None
    svm = AttentionSVM().fit(p, p.optimal_tokens(ties="first"))  # the Frobenius ray still certifies it
    assert svm.status_ == "infeasible" and svm.certificate_ is not None


@pytest.mark.parametrize("norm", ["nuc", "l1", "linf"])
def test_norm_objectives_report_the_dual_feasible_multipliers_they_certify(norm):
    # (degree-1 objectives: the certificate scores λ/max(1, ‖𝒜*(λ)‖°); dual_coef_ is that point, so
    # ‖𝒜*(dual_coef_)‖° ≤ 1 and bᵀ dual_coef_ is the dual objective, whatever λ the backend returned)
    from attsvm.problem import AttentionProblem
    from attsvm.svm import get_norm, optimality_certificate

    nm = get_norm(norm)
    for seed in range(6):
        p = random_instance(3, 4, 5, seed=seed)
        f = AttentionSVM(norm).fit(p)
        if f.W_ is None:
            continue
        cs = f.constraints_
        Y = cs.adjoint(f.dual_coef_)
        assert nm.dual_norm(Y) <= 1 + 1e-12
        cert = optimality_certificate(cs, f.W_, f.dual_coef_, norm)
        assert cert.dual == pytest.approx(float((cs.rhs * f.dual_coef_).sum()), rel=1e-12)
        np.testing.assert_allclose(cert.lam, f.dual_coef_, rtol=1e-12, atol=0)  # (a fixed point)
    # one row, a 1 × 1 W: the multiplier is unique, 1/|a z| (fit's small-problem route returned 1.04× that)
    rng = np.random.default_rng(3)
    X, Z = rng.standard_normal((1, 2, 1)), rng.standard_normal((1, 1))
    t = np.array([int(np.argmax(X[0, :, 0] * Z[0, 0]))])
    q = AttentionProblem(X, np.ones(1), np.ones(1), Z=Z)
    a = X[0, t[0], 0] - X[0, 1 - t[0], 0]
    for e in (AttentionSVM(norm).fit(q, t), *AttentionSVM(norm).fit_many([q], [t])):
        assert e.dual_coef_[0, 1 - t[0]] == pytest.approx(1 / abs(a * Z[0, 0]), rel=1e-9)
