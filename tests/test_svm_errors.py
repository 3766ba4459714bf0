"""Bad input to the solvers raises errors that name the argument."""

from __future__ import annotations

import pytest

from attsvm.datasets import paper_instance, random_instance
from attsvm.svm import (
    AttentionSVM,
    NotFittedError,
    att_svm_constraints,
    feasible,
    locally_optimal,
    solve_cvxpy,
    solve_frobenius,
)


@pytest.fixture(scope="module")
def problem():
    return paper_instance(6, 8, 10, seed=0)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(norm="l3"), ValueError, r"norm must be one of 'fro', 'nuc', 'lp', 'l1', 'linf', 'spectral'; got 'l3'"),
        (dict(norm=True), ValueError, r"norm must be one of"),
        (dict(backend="scs"), ValueError, r"backend must be one of 'auto', 'cvxpy'; got 'scs'"),
        (dict(on_infeasible="ignore"), ValueError, r"on_infeasible must be one of 'status', 'raise'"),
        (dict(norm="nuc", rank=0), ValueError, r"rank must be None or an integer >= 1; got 0"),
        (dict(norm="nuc", rank=2.5), TypeError, r"rank must be None or an integer >= 1; got 2.5"),
        (dict(norm="nuc", rank="2"), TypeError, r"rank must be None or an integer >= 1; got '2'"),
        (dict(rank=2), ValueError, r"rank=2 is only defined for norm='nuc'"),
        (dict(norm="nuc", rank=2, backend="cvxpy"), ValueError, r"rank=2 needs backend='auto'"),
        (dict(tol=0.0), ValueError, r"tol must be a finite number > 0; got 0.0"),
        (dict(tol=float("nan")), ValueError, r"tol must be a finite number > 0"),
        (dict(tol="small"), TypeError, r"tol must be a finite number > 0; got 'small'"),
        (dict(max_iter=0), ValueError, r"max_iter must be None or an integer >= 1; got 0"),
        (dict(seed=-1), ValueError, r"seed must be an integer >= 0 and <= 9223372036854775807; got -1"),
        (dict(solver="ECOS", backend="cvxpy"), ValueError, r"solver must be one of None, 'CLARABEL', 'SCS'"),
        (dict(solver="SCS"), ValueError, r"solver='SCS' applies to backend='cvxpy' only"),
    ],
)
def test_bad_parameters_are_named(problem, kwargs, exc, match):
    svm = AttentionSVM(**kwargs)  # __init__ only stores (sklearn style) ...
    with pytest.raises(exc, match=match):  # ... fit checks
        svm.fit(problem)


@pytest.mark.parametrize(
    "tokens,exc,match",
    [
        ([0, 1], ValueError, r"tokens must hold one token index per sequence: shape \(6,\), got \(2,\)"),
        ([0, 1, 2, 3, 4, 8], ValueError, r"tokens must be token indices in \[0, 8\)"),
        ([0, 1, 2, 3, 4, -1], ValueError, r"tokens must be token indices in \[0, 8\)"),
        ([0.5, 1, 2, 3, 4, 5], TypeError, r"tokens must be integer token indices"),
    ],
)
def test_bad_tokens(problem, tokens, exc, match):
    with pytest.raises(exc, match=match):
        AttentionSVM().fit(problem, tokens)
    with pytest.raises(exc, match=match):
        feasible(problem, tokens)
    with pytest.raises(exc, match=match):
        locally_optimal(problem, tokens)


def test_bad_problem_and_constraints(problem):
    with pytest.raises(TypeError, match="problem must be an AttentionProblem, got ndarray"):
        AttentionSVM().fit(problem.X)
    with pytest.raises(TypeError, match="cs must be a ConstraintSet, got AttentionProblem"):
        AttentionSVM().fit_constraints(problem)
    with pytest.raises(TypeError, match="cs must be a ConstraintSet"):
        solve_frobenius(problem)
    with pytest.raises(TypeError, match="problem must be an AttentionProblem"):
        feasible("x")
    with pytest.raises(TypeError, match="problem must be an AttentionProblem"):
        locally_optimal(None)


def test_tied_optimal_tokens_are_reported():
    p = random_instance(3, 4, 5, seed=0)
    X = p.X.copy()
    opt = p.optimal_tokens()
    X[1, (opt[1] + 1) % 4] = X[1, opt[1]]  # two tokens with the top score in sequence 1
    from attsvm.problem import AttentionProblem, TieError

    q = AttentionProblem(X, p.y, p.v, Z=p.Z)
    with pytest.raises(TieError, match=r"not unique in 1 sequence\(s\) \(sequence 1"):
        AttentionSVM().fit(q)


def test_backend_arguments():
    cs = att_svm_constraints(paper_instance(3, 4, 5, seed=0))
    with pytest.raises(ValueError, match="norm must be one of 'fro', 'nuc', 'spectral'; got 'inf'"):
        solve_cvxpy(cs, "inf")
    with pytest.raises(ValueError, match="formulation must be one of 'aux', 'loop'; got 'fast'"):
        solve_cvxpy(cs, "fro", formulation="fast")
    with pytest.raises(ValueError, match="solver must be one of 'CLARABEL', 'SCS'; got 'MOSEK'"):
        solve_cvxpy(cs, "fro", solver="mosek")
    with pytest.raises(ValueError, match="time_limit must be > 0"):
        solve_cvxpy(cs, "fro", time_limit=0)
    with pytest.raises(ValueError, match="method must be one of 'auto', 'dense', 'matrix_free'; got 'cg'"):
        solve_frobenius(cs, method="cg")
    with pytest.raises(ValueError, match=r"tol must be > 0, got -1\.0"):
        solve_frobenius(cs, tol=-1.0)
    with pytest.raises(ValueError, match="max_iter must be >= 1, got 0"):
        solve_frobenius(cs, max_iter=0)
    with pytest.raises(ValueError, match="method must be one of 'solver', 'lp'; got 'magic'"):
        feasible(paper_instance(3, 4, 5, seed=0), method="magic")


def test_unfitted_estimator():
    svm = AttentionSVM("nuc", tol=1e-6)
    assert repr(svm) == "AttentionSVM(norm='nuc', tol=1e-06)"
    with pytest.raises(NotFittedError, match="not fitted yet"):
        svm.summary()
    with pytest.raises(NotFittedError, match="not fitted yet"):
        svm.to_dict()
    with pytest.raises(NotFittedError, match="not fitted yet"):
        _ = svm.W_
    assert not hasattr(svm, "status_")  # an AttributeError, as scikit-learn's NotFittedError
    assert issubclass(NotFittedError, ValueError) and issubclass(NotFittedError, AttributeError)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(n=0, T=3, d=2), ValueError, "n must be >= 1, got 0"),
        (dict(n=2, T=1, d=2), ValueError, "T must be >= 2, got 1"),
        (dict(n=2, T=3, d=2.0), TypeError, "d must be an integer"),
    ],
)
def test_dataset_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        paper_instance(**kwargs, seed=0)
    with pytest.raises(ValueError, match="seed must be >= 0, got -3"):
        paper_instance(2, 3, 2, seed=-3)


@pytest.mark.parametrize("scale", [1e160, 1e200, 1e-160, 1e-170])
@pytest.mark.parametrize("norm", ["fro", "nuc"])
def test_data_beyond_float64_gets_a_status_never_a_crash_or_a_false_answer(norm, scale):
    # rows of norm ~scale: their squared norms over- or underflow in float64. Before: a bare AssertionError
    # in the solvers (1e160), and a feasible instance certified "infeasible" (1e-170: rows whose norms
    # underflow to 0 "verified" a Farkas λ on them). Now whatever comes back is a status, the same from fit,
    # fit_many and fit_stack, "optimal" only with fit's W at unit scale, rescaled, and "infeasible" only
    # for the infeasible instance
    import warnings

    import numpy as np

    from attsvm.problem import AttentionProblem

    for shape, seed in (((3, 4, 5), 0), ((6, 8, 3), 1)):  # feasible; infeasible (d < T − 1)
        p = paper_instance(*shape, seed=seed)
        a = p.optimal_tokens(ties="first")
        ref = AttentionSVM(norm).fit(p, a)
        for X, Z in ((p.X * scale, p.Z), (p.X, p.Z * scale)):
            q = AttentionProblem(X, p.y, p.v, Z=Z)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                fits = [AttentionSVM(norm).fit(q, a), *AttentionSVM(norm).fit_many([q], [a])]
                stack = AttentionSVM(norm).fit_stack(X[None], Z[None], a[None])
            assert fits[0].status_ == fits[1].status_ == stack.status[0]
            if fits[0].status_ == "error":  # (a status that says what to do)
                assert "rescale X or Z" in fits[0].info_["message"]
            if fits[0].status_ == "optimal":
                assert ref.status_ == "optimal"
                np.testing.assert_allclose(fits[0].W_ * scale, ref.W_, rtol=0, atol=1e-6 * np.abs(ref.W_).max())
            if fits[0].status_ == "infeasible":
                assert ref.status_ == "infeasible"


def test_a_batch_names_the_position_of_a_fit_that_raises(monkeypatch):
    # (a ValueError from one instance's fit inside fit_many / fit_stack carries its position)
    import numpy as np

    probs = [paper_instance(3, 4, 5, seed=s) for s in range(4)]
    toks = [q.optimal_tokens(ties="first") for q in probs]
    real = AttentionSVM._fit

    def fit(self, cs, alpha):  # (instance 2 is the one whose data the solver "refuses")
        if np.array_equal(cs.Z, probs[2].queries):
            raise ValueError("boom")
        return real(self, cs, alpha)

    monkeypatch.setattr(AttentionSVM, "_fit", fit)
    with pytest.raises(ValueError, match=r"^problems\[2\]: boom"):
        AttentionSVM("l1").fit_many(probs, toks)
    X, Z, A = np.stack([q.X for q in probs]), np.stack([q.Z for q in probs]), np.stack(toks)
    with pytest.raises(ValueError, match=r"^instance 2 \(X\[2\], Z\[2\]\): boom"):
        AttentionSVM("l1").fit_stack(X, Z, A)
