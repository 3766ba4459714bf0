"""Diagnostics against the SVM theory (docs/spec.md §4, §5): convergence type, correlations, SVM-equivalence."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

from attsvm.datasets import paper_instance, random_instance
from attsvm.diagnostics import (
    TAU,
    convergence_type,
    convergence_types,
    correlation_trajectories,
    mixture_prediction,
    svm_equivalence,
)
from attsvm.svm import AttentionSVM, locally_optimal
from attsvm.train import train

# certificate tolerance of the equality / margin constraints of W^eq and W_fin
CONSTRAINT_TOL = 1e-7
# two solutions of the same convex program (mixture weights)
MIXTURE_ATOL = 1e-4
# agreement with a cvxpy/Clarabel solve of the same program written pair by pair
CONIC_ATOL = 1e-4


@pytest.fixture(scope="module")
def local_runs():
    """Published local-convergence recipe: seed 0 converges globally, seed 2 locally (checked below)."""
    probs = [paper_instance(6, 8, 10, seed=s) for s in (0, 2)]
    return train(probs, steps=2000, seed=[0, 2], record_every=250, record_W=True)


def test_convergence_types_of_trained_runs(local_runs):
    reps = convergence_types(local_runs)
    assert [r.kind for r in reps] == ["global", "local"]
    g, loc = reps
    assert g.is_optimal and g.corr >= TAU and g.corr_nuc < g.corr_fro
    assert not loc.is_optimal and loc.locally_optimal and loc.corr >= TAU
    assert locally_optimal(local_runs.problem(1), loc.tokens).locally_optimal
    assert g.to_dict()["kind"] == "global"


def test_kq_local_optimality_uses_the_nuclear_support():
    """(K, Q) runs are judged against Att-SVM* — its support tokens decide local optimality too."""
    p = paper_instance(6, 8, 10, seed=2)
    res = train(p, param="KQ", steps=2000, seed=2)
    (rep,) = convergence_types(res)
    assert rep.norm == "nuc" and not rep.is_optimal and rep.corr >= TAU
    assert rep.kind == "local" and rep.locally_optimal
    # with the Frobenius SVM's support the same selection is not locally optimal
    assert not locally_optimal(p, rep.tokens).locally_optimal


def test_convergence_type_classifies_svm_directions():
    """W = c·W^α_mm selects α with corr 1: the type is decided by α alone (opt / locally optimal / not)."""
    p = paper_instance(6, 8, 10, seed=2)
    opt = p.optimal_tokens()
    W_opt = AttentionSVM().fit(p, opt).W_
    assert convergence_type(p, 7.0 * W_opt).kind == "global"
    rng = np.random.default_rng(0)
    not_local = None
    for _ in range(100):
        a = rng.integers(0, p.T, size=p.n)
        if not locally_optimal(p, a).locally_optimal and locally_optimal(p, a).feasible:
            not_local = a
            break
    assert not_local is not None
    W_bad = AttentionSVM().fit(p, not_local).W_
    rep = convergence_type(p, 7.0 * W_bad)
    assert rep.kind == "not locally optimal" and rep.corr == pytest.approx(1.0) and rep.locally_optimal is False
    # the right tokens but the wrong direction (a component invisible to every logit) is not convergence
    Zb = np.linalg.qr(p.queries.T)[0]  # (d, n) basis of span{z_i}
    E = np.random.default_rng(1).standard_normal((10, 10)) @ (np.eye(10) - Zb @ Zb.T)
    E *= np.linalg.norm(W_opt) / np.linalg.norm(E)
    rep = convergence_type(p, W_opt + E)
    np.testing.assert_allclose(p.logits(W_opt + E), p.logits(W_opt), atol=1e-12)
    assert rep.is_optimal and rep.corr < TAU and rep.kind == "not locally optimal"
    # the nuclear judgement uses Att-SVM*
    rep_nuc = convergence_type(p, AttentionSVM("nuc").fit(p, opt).W_, norm="nuc")
    assert rep_nuc.kind == "global" and rep_nuc.corr == pytest.approx(1.0, abs=1e-6)


def test_correlation_trajectories(local_runs):
    tr = correlation_trajectories(local_runs)
    assert tr["corr_fro"].shape == (2, 9) and tr["W_mm"].shape == (2, 10, 10)
    np.testing.assert_array_equal(tr["step"], np.arange(0, 2001, 250))
    assert np.all(tr["corr_fro"][:, -1] >= TAU) and np.all(tr["corr_nuc"][:, -1] < tr["corr_fro"][:, -1])
    assert np.all(np.diff(tr["corr_fro"][:, 2:], axis=1) > 0)
    reps = convergence_types(local_runs)
    np.testing.assert_allclose(tr["corr_fro"][:, -1], [r.corr_fro for r in reps], atol=1e-9)
    plain = train(paper_instance(6, 8, 10, seed=0), steps=5)
    with pytest.raises(ValueError, match="record_W=True"):
        correlation_trajectories(plain)


def test_svm_equivalence_relu_head():
    probs = [random_instance(3, 4, 6, seed=s, head="relu") for s in range(5)]
    res = train(probs, steps=2001, init="zeros", record_every=500, record_W=True)
    converged = 0
    for r in range(res.n_runs):
        e = svm_equivalence(res, r)
        p = res.problem(r)
        assert e.status_eq in ("optimal", "optimal_inaccurate")
        g = p.logits(e.W_eq)
        for i in range(p.n):
            inside = np.flatnonzero(e.O[i])
            outside = np.flatnonzero(~e.O[i])
            assert np.ptp(g[i, inside]) <= CONSTRAINT_TOL  # equal logits inside O_i
            if outside.size:
                assert g[i, inside].min() - g[i, outside].max() >= 1 - CONSTRAINT_TOL  # margin 1 to the rest
            gf = p.logits(e.W_fin)[i]
            s = res.probs[r, i]
            np.testing.assert_allclose(
                gf[inside] - gf[inside[0]], np.log(s[inside] / s[inside[0]]), atol=CONSTRAINT_TOL
            )
        # the least-squares scale: the residual is orthogonal to W^eq
        resid = res.W[r] - e.scale * e.W_eq - e.W_fin
        assert abs(np.sum(resid * e.W_eq)) <= 1e-8 * np.linalg.norm(res.W[r]) * np.linalg.norm(e.W_eq)
        assert e.corr_eq_traj.shape == (6,) and e.max_masked_prob.shape == (6,)  # steps 0, 500, …, 2000, 2001
        if e.max_masked_prob[-1] < 1e-8:  # the run has converged: W(k) ≈ R·W^eq + W_fin, corr → 1
            converged += 1
            assert e.corr_eq >= TAU and e.residual <= 0.1
    assert converged >= 2


def test_svm_equivalence_multiclass_and_mixture_prediction():
    p = random_instance(4, 5, 6, seed=0, head="multiclass", n_classes=3)
    res = train(p, steps=2000, init="gaussian", init_scale=0.05, n_init=4, record_every=500, record_W=True)
    e = svm_equivalence(res, 0)
    assert e.O.sum() > p.n  # some sequence keeps several tokens: the finite component matters
    assert e.corr_eq >= 0.95 and np.all(np.diff(e.corr_eq_traj[1:]) > 0)
    mp = mixture_prediction(res)
    assert mp.predicted.shape == (4, 5) and mp.match.shape == (4, 4)
    assert mp.match_rate >= 0.75 and mp.exact_runs >= 0.5
    # what training selects is what the convex program predicts
    np.testing.assert_array_equal(mp.selected[0], mp.predicted)


def test_mixture_prediction_matches_cvxpy_convex_program():
    """The predicted O_i are the supports of the convex program solved independently by cvxpy."""
    p = random_instance(4, 5, 6, seed=0, head="multiclass", n_classes=3)
    res = train(p, steps=10, init="zeros")
    mp = mixture_prediction(res)
    B = p.X @ p.head.weights  # (n, T, C)

    def ce(i, s):
        c = B[i].T @ s
        return np.logaddexp.reduce(c) - c[int(p.y[i])]

    for i in range(p.n):
        s = cp.Variable(p.T, nonneg=True)
        logits = B[i].T @ s
        prob = cp.Problem(cp.Minimize(cp.log_sum_exp(logits) - logits[int(p.y[i])]), [cp.sum(s) == 1])
        prob.solve(solver=cp.CLARABEL)
        ref = np.maximum(s.value, 0) / np.maximum(s.value, 0).sum()
        assert ce(i, mp.mixture[i]) <= ce(i, ref) + 1e-9
        np.testing.assert_allclose(mp.mixture[i], ref, atol=MIXTURE_ATOL)  # the conic solver's accuracy
        np.testing.assert_array_equal(mp.predicted[i], ref >= 1e-6)


def _independent_eq_constraints(p, O, s):
    """W^eq / W_fin constraints written directly from docs/spec.md §5, all pairs (t, τ), by cvxpy."""
    W = cp.Variable((p.d, p.d))
    cons_eq, cons_fin = [], []
    for i in range(p.n):
        z = p.queries[i]
        inside, outside = np.flatnonzero(O[i]), np.flatnonzero(~O[i])
        for t in inside:
            for tau in inside:
                if t < tau:
                    a = p.X[i, t] - p.X[i, tau]
                    cons_eq.append(a @ W @ z == 0)
                    cons_fin.append(a @ W @ z == np.log(s[i, t] / s[i, tau]))
            for tau in outside:
                cons_eq.append((p.X[i, t] - p.X[i, tau]) @ W @ z >= 1)
    out = []
    for cons in (cons_eq, cons_fin):
        cp.Problem(cp.Minimize(cp.norm(W, "fro")), cons).solve(solver=cp.CLARABEL)
        out.append(W.value.copy())
    return out


def test_equivalence_solutions_against_direct_formulation():
    probs = [random_instance(3, 4, 6, seed=s, head="relu") for s in range(3)]
    res = train(probs, steps=1500, init="zeros")
    checked = 0
    for r in range(3):
        e = svm_equivalence(res, r)
        if e.O.sum() == e.O.shape[0]:
            continue  # single tokens: W_fin = 0, nothing to cross-check
        W_eq, W_fin = _independent_eq_constraints(res.problem(r), e.O, res.probs[r])
        # same minimisers up to the conic solver's accuracy, and never a larger norm than its solution
        np.testing.assert_allclose(e.W_eq, W_eq, atol=CONIC_ATOL * max(1.0, np.abs(W_eq).max()))
        np.testing.assert_allclose(e.W_fin, W_fin, atol=CONIC_ATOL * max(1.0, np.abs(W_fin).max()))
        assert np.linalg.norm(e.W_eq) <= np.linalg.norm(W_eq) * (1 + 1e-7)
        checked += 1
    assert checked >= 1


def test_diagnostics_errors(local_runs):
    p = local_runs.problem(0)
    with pytest.raises(ValueError, match="tau must be a correlation threshold"):
        convergence_type(p, local_runs.W[0], tau=2.0)
    with pytest.raises(ValueError, match="norm must be one of 'fro', 'nuc'"):
        convergence_type(p, local_runs.W[0], norm="spectral")
    with pytest.raises(ValueError, match="W must have shape \\(10, 10\\)"):
        convergence_type(p, np.eye(3))
    with pytest.raises(TypeError, match="problem must be an AttentionProblem"):
        convergence_type(local_runs, local_runs.W[0])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="run must be in \\[0, 2\\)"):
        svm_equivalence(local_runs, 5)
    with pytest.raises(ValueError, match="eps must be in \\(0, 1\\)"):
        svm_equivalence(local_runs, 0, eps=2.0)
    with pytest.raises(ValueError, match="compares runs of one instance"):
        mixture_prediction(local_runs)
    with pytest.raises(ValueError, match="needs a convex head"):
        mixture_prediction(train(p, steps=1))
    with pytest.raises(ValueError, match=r"eps must be in \(0, 1\)|eps must be > 0"):
        svm_equivalence(local_runs, 0, eps=-1.0)


@pytest.mark.parametrize("head", ["relu", "multiclass"])
def test_svm_equivalence_before_attention_is_selective(head: str) -> None:
    # after 3 steps every O_i is the whole sequence: SVM-eq has no margin row, W^eq = 0, and the
    # decomposition is undefined (NaN), not an error
    res = train([random_instance(6, 8, 10, head=head, seed=0)], steps=3, record_W=True)
    rep = svm_equivalence(res)
    assert rep.O.all() and not rep.selective
    assert rep.W_eq is not None and not np.any(rep.W_eq)
    assert all(np.isnan(x) for x in (rep.scale, rep.residual, rep.corr_eq, rep.corr_eq_fin))
    assert rep.corr_eq_traj is not None and np.isnan(rep.corr_eq_traj).all()
    assert np.isfinite(rep.corr_mm_top)  # the top tokens' SVM still compares
    d = rep.to_dict()
    assert np.isnan(d["corr_eq"]) and np.isnan(d["scale"])


def test_runs_out_of_range_and_empty_probabilities_are_named() -> None:
    from attsvm.diagnostics import convergence_types, correlation_trajectories
    from attsvm.svm.equivalence import selected_sets

    r = train([paper_instance(6, 8, 10, seed=0)], steps=3, record_W=True)
    with pytest.raises(ValueError, match=r"runs must be in \[0, 1\), got \[5\]"):
        convergence_types(r, runs=[5])
    with pytest.raises(ValueError, match=r"runs must be in \[0, 1\), got \[7\]"):
        correlation_trajectories(r, runs=[7])
    with pytest.raises(TypeError, match="runs must be a sequence of run indices, got int"):
        correlation_trajectories(r, runs=3)
    with pytest.raises(ValueError, match=r"probs must have shape \(n, T\) or \(R, n, T\) with n, T >= 1"):
        selected_sets(np.zeros((2, 0)))
    assert len(convergence_types(r, runs=[0])) == 1
