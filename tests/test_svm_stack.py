"""AttentionSVM.fit_stack: a stack of SVMs of one shape in, stacked arrays out, entry by entry what fit
returns (docs/spec.md §3; attsvm.svm.stack)."""

from __future__ import annotations

import numpy as np
import pytest

import test_svm_batch
from attsvm.datasets import paper_instance
from attsvm.problem import AttentionProblem
from attsvm.svm import AttentionSVM, InfeasibleSVMError, SVMStack, batch
from attsvm.svm.certificate import FARKAS_RTOL, farkas_certificate
from attsvm.svm.frobenius import FrobeniusOptions
from test_svm_batch import ROUTES, _assert_same, _duplicate_selected

route = test_svm_batch.route  # (the fixture: each test that takes it runs on both routes of attsvm.svm.batch)

W_RTOL = 1e-8  # W of the stack against fit's, relative to ‖W‖ (both exact to round-off)
CERT_TOL = 1e-9  # the default tolerance: every "optimal" passes it
NUC_W_RTOL = 1e-4  # the nuclear batch is another method than fit's: W within what the certificate allows


def _stack(problems: list[AttentionProblem], toks: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    return np.stack([p.X for p in problems]), np.stack([p.queries for p in problems]), np.stack(toks)


def _mixed_one_shape() -> tuple[list[AttentionProblem], list[np.ndarray]]:
    """(6, 8, 10) instances: feasible at the optimal tokens, some at random selections (several
    infeasible), two with a duplicate selected token (a zero row: fit's route), one whose explicit
    selection ties two tokens."""
    rng = np.random.default_rng(1)
    probs, toks = [], []
    for s in range(60):
        p = paper_instance(6, 8, 10, seed=s)
        probs.append(p)
        toks.append(p.optimal_tokens(ties="first") if s % 3 else rng.integers(0, p.T, size=p.n))
    for s in (3, 7):
        a = probs[s].optimal_tokens()
        probs.append(_duplicate_selected(probs[s], a))
        toks.append(a)
    return probs, toks


def _check_entry(stack: SVMStack, b: int, ref: AttentionSVM) -> None:
    """Entry b of every array of ``stack`` against the estimator ``ref`` that fit returns."""
    assert stack.status[b] == ref.status_
    np.testing.assert_array_equal(stack.tokens[b], ref.tokens_)
    if ref.W_ is None:
        assert np.isnan(stack.W[b]).all() and np.isnan(stack.objective[b]) and np.isnan(stack.max_violation[b])
        assert not stack.support[b].any()
        if ref.status_ == "infeasible":  # the stack's own certificate verifies (Farkas certificates are not unique)
            cert = farkas_certificate(stack[b].constraints_, stack.certificate[b])
            assert cert.valid and cert.relative_residual <= FARKAS_RTOL
        return
    assert np.isnan(stack.certificate[b]).all()
    scale = np.abs(ref.W_).max()
    np.testing.assert_allclose(stack.W[b], ref.W_, rtol=0, atol=W_RTOL * scale)
    np.testing.assert_allclose(stack.margins[b], ref.margins_, rtol=W_RTOL, atol=W_RTOL)
    np.testing.assert_array_equal(stack.support[b], ref.support_)
    assert stack.objective[b] == pytest.approx(ref.objective_, rel=W_RTOL)
    assert stack.relative_violation[b] <= CERT_TOL and stack.relative_gap[b] <= CERT_TOL
    # the arrays hold the estimator's numbers (views of one another where the batch solved the instance,
    # copies where fit did)
    e = stack[b]
    for arr, attr in (
        (stack.max_violation, "max_violation_"),
        (stack.relative_violation, "relative_violation_"),
        (stack.duality_gap, "duality_gap_"),
        (stack.relative_gap, "relative_gap_"),
        (stack.complementary_slackness, "complementary_slackness_"),
        (stack.objective, "objective_"),
    ):
        assert arr[b] == getattr(e, attr)
    np.testing.assert_array_equal(stack.dual_coef[b], e.dual_coef_)
    assert stack.n_iter[b] == e.n_iter_


def test_fit_stack_equals_fit_entry_by_entry(route):
    probs, toks = _mixed_one_shape()
    # (10, 5, 4): rank-deficient (K = 40 rows, 16 entries of W), many infeasible: the compiled route proves
    # most of them infeasible itself; the NumPy route leaves the whole shape to fit
    deficient = [paper_instance(10, 5, 4, seed=s) for s in range(40)]
    for group, gtoks in ((probs, toks), (deficient, [p.optimal_tokens(ties="first") for p in deficient])):
        stack = AttentionSVM().fit_stack(*_stack(group, gtoks))
        assert len(stack) == len(group)
        for b, (p, t) in enumerate(zip(group, gtoks)):
            ref = AttentionSVM().fit(p, t)
            _check_entry(stack, b, ref)
            _assert_same(stack[b], ref)  # the estimator of entry b, as fit_many's
        many = AttentionSVM().fit_many(group, gtoks)
        assert [stack[b].info_.get("path") for b in range(len(stack))] == [m.info_.get("path") for m in many]
    paths = [(str(stack.status[b]), stack[b].info_.get("path")) for b in range(len(stack))]
    if route == "compiled":  # (10, 5, 4): optimal and infeasible from the batch, one infeasible from fit
        assert sorted(set(paths)) == [
            ("infeasible", ROUTES[route]),
            ("infeasible", "ldp-nnls"),
            ("optimal", ROUTES[route]),
        ]
    else:
        assert all(path != ROUTES[route] for _, path in paths)


def test_fit_stack_other_shapes_and_norms_read_off_the_estimators():
    probs = [paper_instance(4, 5, 6, seed=s) for s in range(6)]
    toks = [p.optimal_tokens(ties="first") for p in probs]
    X, Z, A = _stack(probs, toks)
    # nuclear: fit_many's batched interior point; rank-constrained: one at a time
    for est in (AttentionSVM("nuc"), AttentionSVM("nuc", rank=1)):
        stack = est.fit_stack(X, Z, A)
        many = est.fit_many(probs, toks)
        for b, m in enumerate(many):
            assert stack.status[b] == m.status_
            np.testing.assert_allclose(stack.W[b], m.W_, rtol=0, atol=NUC_W_RTOL * np.abs(m.W_).max())
            assert stack[b].status_ == m.status_
    # beyond the batch (K = 380 > 80 rows with an explicit max_iter: the NumPy route's limit): fit
    big = [paper_instance(20, 20, 30, seed=s) for s in range(2)]
    btoks = [p.optimal_tokens(ties="first") for p in big]
    stack = AttentionSVM(max_iter=10_000).fit_stack(*_stack(big, btoks))
    for b, p in enumerate(big):
        ref = AttentionSVM(max_iter=10_000).fit(p, btoks[b])
        _check_entry(stack, b, ref)
        assert stack[b].info_.get("path") == ref.info_.get("path")


def test_fit_stack_validates_its_arrays_and_names_them():
    probs = [paper_instance(3, 4, 5, seed=s) for s in range(3)]
    X, Z, A = _stack(probs, [p.optimal_tokens(ties="first") for p in probs])
    est = AttentionSVM()
    with pytest.raises(ValueError, match="X must have 4 dimensions"):
        est.fit_stack(X[0], Z, A)
    with pytest.raises(ValueError, match=r"Z must have shape \(3, 3, d_z\)"):
        est.fit_stack(X, Z[:2], A)
    with pytest.raises(ValueError, match=r"tokens must hold one token index per sequence: shape \(3, 3\)"):
        est.fit_stack(X, Z, A[:, :2])
    bad = A.copy()
    bad[2, 1] = 4
    with pytest.raises(ValueError, match=r"tokens\[2, 1\] = 4 is not a token index in \[0, 4\)"):
        est.fit_stack(X, Z, bad)
    with pytest.raises(TypeError, match="tokens must be integer token indices"):
        est.fit_stack(X, Z, A + 0.5)
    Xn = X.copy()
    Xn[1, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="X must be finite"):
        est.fit_stack(Xn, Z, A)
    with pytest.raises(ValueError, match="T >= 2"):
        est.fit_stack(X[:, :, :1], Z, np.zeros_like(A))
    with pytest.raises(ValueError, match="norm"):
        AttentionSVM(norm="l3").fit_stack(X, Z, A)
    stack = est.fit_stack(X, Z, A.astype(float))  # integral floats are token indices
    with pytest.raises(IndexError, match="instance 3 out of range for a stack of 3"):
        stack[3]
    with pytest.raises(TypeError, match="indexed by an instance number"):
        stack["0"]
    assert stack[-1] is stack[2]  # (built once)


def test_fit_stack_keeps_no_view_of_the_callers_arrays(route):
    probs = [paper_instance(3, 4, 5, seed=s) for s in range(4)]
    X, Z, A = _stack(probs, [p.optimal_tokens(ties="first") for p in probs])
    stack = AttentionSVM().fit_stack(X, Z, A)
    W = stack.W.copy()
    e = stack[1]
    Z0, A0 = e.constraints_.Z.copy(), e.tokens_.copy()
    X[:] = 0.0
    Z[:] = 0.0
    A[:] = 0
    np.testing.assert_array_equal(stack.W, W)
    np.testing.assert_array_equal(e.constraints_.Z, Z0)
    np.testing.assert_array_equal(e.tokens_, A0)
    np.testing.assert_array_equal(stack.tokens[1], A0)


def test_fit_stack_empty_infeasible_raise_and_scale():
    est = AttentionSVM()
    empty = est.fit_stack(np.zeros((0, 2, 3, 4)), np.zeros((0, 2, 4)), np.zeros((0, 2), dtype=int))
    assert len(empty) == 0 and empty.W.shape == (0, 4, 4) and list(empty) == []
    p = paper_instance(6, 8, 10, seed=4)
    a = p.optimal_tokens()
    q = _duplicate_selected(p, a)
    X, Z, A = _stack([p, q], [a, a])
    with pytest.raises(InfeasibleSVMError):
        AttentionSVM(on_infeasible="raise").fit_stack(X, Z, A)
    stack = est.fit_stack(X, Z, A)
    assert stack.status.tolist() == ["optimal", "infeasible"] and stack.optimal.tolist() == [True, False]
    assert "2 instances: 1 infeasible, 1 optimal;" in repr(stack) and "SVMStack(0 instances; " in repr(empty)
    # scale invariance (docs/spec.md §3): X by c, Z by c' gives W / (c c')
    for c in (1e-8, 1e8):
        scaled = est.fit_stack(X * c, Z / c**0.5, A)
        assert scaled.status.tolist() == stack.status.tolist()
        np.testing.assert_allclose(scaled.W[0] * c**0.5, stack.W[0], rtol=1e-9, atol=0)


def test_the_numpy_route_in_chunks_equals_one_chunk(monkeypatch):
    # (the NumPy route splits a stack into chunks of CHUNK_FLOATS Gram entries and joins their arrays)
    monkeypatch.setenv("ATTSVM_COMPILED", "0")
    monkeypatch.setattr(batch, "_compiled_module", None)
    probs, toks = _mixed_one_shape()
    one = AttentionSVM().fit_stack(*_stack(probs, toks))
    monkeypatch.setattr(batch, "CHUNK_FLOATS", 7 * 42 * 42)  # chunks of 7 instances
    calls = []
    real = batch._solve_chunk
    monkeypatch.setattr(batch, "_solve_chunk", lambda *a: calls.append(a[1].shape[0]) or real(*a))
    chunked = AttentionSVM().fit_stack(*_stack(probs, toks))
    assert calls == [7] * 8 + [6]  # (62 instances: 9 chunks)
    monkeypatch.setattr(batch, "_compiled_module", None)
    assert chunked.status.tolist() == one.status.tolist()
    np.testing.assert_array_equal(chunked.W, one.W)
    np.testing.assert_array_equal(chunked.relative_gap, one.relative_gap)
    assert [e.info_.get("path") for e in chunked] == [e.info_.get("path") for e in one]
    assert sum(e.info_.get("path") == ROUTES["numpy"] for e in chunked) > 7  # (several chunks in the batch)


def test_fit_stack_honours_max_iter_as_fit_does():
    # (an explicit max_iter takes the NumPy route, with that budget, as fit_many)
    probs = [paper_instance(6, 8, 10, seed=s) for s in range(6)]
    toks = [p.optimal_tokens(ties="first") for p in probs]
    est = AttentionSVM(max_iter=2)
    with pytest.warns(RuntimeWarning, match="iteration limit"):
        stack = est.fit_stack(*_stack(probs, toks))
    with pytest.warns(RuntimeWarning, match="iteration limit"):
        refs = [AttentionSVM(max_iter=2).fit(p, t) for p, t in zip(probs, toks)]
    assert stack.status.tolist() == [r.status_ for r in refs] and "max_iter" in stack.status.tolist()
    for b, r in enumerate(refs):
        np.testing.assert_array_equal(stack.W[b], r.W_)


def test_fit_stack_keeps_the_parameters_it_was_fitted_with():
    probs = [paper_instance(4, 5, 6, seed=s) for s in range(3)]
    X, Z, A = _stack(probs, [p.optimal_tokens(ties="first") for p in probs])
    svm = AttentionSVM(tol=1e-8)
    stack = svm.fit_stack(X, Z, A)
    svm.set_params(norm="nuc", tol=1e-15)  # (a sweep reuses its estimator)
    for e in stack:
        assert (e.norm, e.tol, e.status_) == ("fro", 1e-8, "optimal")


def test_the_batch_solves_an_empty_stack_on_both_routes(route):
    X, Z, A = np.zeros((0, 2, 3, 4)), np.zeros((0, 2, 4)), np.zeros((0, 2), dtype=np.int64)
    st = batch.solve_arrays(AttentionSVM(), X, Z, A, FrobeniusOptions())
    assert st.W.shape == (0, 4, 4) and st.lam.shape == (0, 2, 3) and st.certified(1e-9).shape == (0,)


def test_far_out_of_range_float_tokens_are_named_as_given():
    probs = [paper_instance(3, 4, 5, seed=s) for s in range(2)]
    X, Z, _ = _stack(probs, [p.optimal_tokens(ties="first") for p in probs])
    with pytest.raises(ValueError, match=r"tokens\[0, 0\] = 1e\+300 is not a token index in \[0, 4\)"):
        AttentionSVM().fit_stack(X, Z, np.full((2, 3), 1e300))
    with pytest.raises(TypeError, match=r"got tokens\[1, 2\] = 0.5"):
        AttentionSVM().fit_stack(X, Z, np.array([[0, 1, 2], [0, 1, 0.5]]))
