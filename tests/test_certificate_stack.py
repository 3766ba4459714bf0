"""certify_stack: the optimality certificate of a stack of Frobenius Att-SVM(α) instances at once
(attsvm.svm.certificate), against the one-instance certificate and as the oracle of the compiled kernel's."""

from __future__ import annotations

import numpy as np
import pytest

from attsvm.datasets import paper_instance
from attsvm.svm import AttentionSVM, batch
from attsvm.svm._base import att_svm_constraints
from attsvm.svm.certificate import certify_stack, optimality_certificate
from attsvm.svm.frobenius import FrobeniusOptions

SCALARS = ("violation", "relative_violation", "gap", "relative_gap", "complementarity")


def _stack(B: int, shape=(6, 8, 10), seed: int = 0):
    rng = np.random.default_rng(seed)
    probs = [paper_instance(*shape, seed=100 + s) for s in range(B)]
    alpha = np.stack([p.optimal_tokens(ties="first") for p in probs])
    css = [att_svm_constraints(p, a) for p, a in zip(probs, alpha)]
    A = np.stack([cs.A for cs in css])
    Z = np.stack([cs.Z for cs in css])
    mask = np.stack([cs.mask for cs in css])
    return rng, probs, alpha, css, A, Z, mask


@pytest.mark.parametrize("B", [1, 5])
def test_certify_stack_is_the_one_instance_certificate_of_each_instance(B):
    # any (W, λ), optimal or not: each instance's numbers are optimality_certificate's to round-off
    rng, _, _, css, A, Z, mask = _stack(B)
    d, dz = A.shape[3], Z.shape[2]
    W = rng.normal(size=(B, d, dz))
    lam = np.where(mask, rng.normal(size=mask.shape), 0.0)  # (negative entries: clipped by both)
    got = certify_stack(A, Z, mask, W, lam)
    for b, cs in enumerate(css):
        ref = optimality_certificate(cs, W[b], lam[b], "fro")
        for name in SCALARS:
            assert getattr(got, name)[b] == pytest.approx(getattr(ref, name), rel=1e-12, abs=1e-13), name
        assert got.primal[b] == pytest.approx(ref.primal, rel=1e-13)
        np.testing.assert_allclose(got.margins[b][cs.mask], ref.margins[cs.mask], rtol=1e-12, atol=1e-12)
        assert np.isinf(got.margins[b][~cs.mask]).all()
        np.testing.assert_array_equal(got.lam[b], ref.lam)
        np.testing.assert_array_equal(got.support[b], ref.support)


def test_certify_stack_takes_the_multipliers_by_row_or_by_token_alike():
    # the batch passes its gathered rows and λ over them; the (n, T) layout gives the same numbers bit for bit
    rng, _, _, _, A, Z, mask = _stack(4)
    B, n, T, d = A.shape
    K = n * (T - 1)
    W = rng.normal(size=(B, d, Z.shape[2]))
    lam = np.where(mask, np.abs(rng.normal(size=mask.shape)), 0.0)
    idx = np.nonzero(mask.reshape(B, n * T))[1].reshape(B, K)
    at = np.arange(B)[:, None]
    rows = (A.reshape(B, n * T, d)[at, idx], Z[at, idx // T], idx)
    by_token = certify_stack(A, Z, mask, W, lam)
    by_row = certify_stack(A, Z, mask, W, lam.reshape(B, n * T)[at, idx], rows=rows)
    for a, b in zip(by_token, by_row):
        np.testing.assert_array_equal(a, b)


def test_an_optimal_stack_is_certified_and_a_perturbed_one_is_not():
    _, probs, alpha, _, A, Z, mask = _stack(3)
    fits = [AttentionSVM().fit(p, a) for p, a in zip(probs, alpha)]
    W = np.stack([e.W_ for e in fits])
    lam = np.stack([e.dual_coef_ for e in fits])
    ok = certify_stack(A, Z, mask, W, lam)
    assert (ok.relative_violation <= 1e-9).all() and (ok.relative_gap <= 1e-9).all()
    np.testing.assert_array_equal(ok.support, np.stack([e.support_ for e in fits]))
    W[1] *= 0.9  # every margin 10% short
    bad = certify_stack(A, Z, mask, W, lam)
    assert bad.relative_violation[1] == pytest.approx(0.1, rel=1e-9)
    assert bad.relative_violation[[0, 2]].tolist() == ok.relative_violation[[0, 2]].tolist()


def test_the_numpy_route_certifies_with_certify_stack(monkeypatch):
    monkeypatch.setenv("ATTSVM_COMPILED", "0")
    monkeypatch.setattr(batch, "_compiled_module", None)
    _, _, alpha, _, _, Z, _ = _stack(4)
    X = np.stack([paper_instance(6, 8, 10, seed=100 + s).X for s in range(4)])
    st = batch.solve_arrays(AttentionSVM(), X, Z, alpha, FrobeniusOptions(tol=1e-10))
    monkeypatch.setattr(batch, "_compiled_module", None)
    cert = certify_stack(st.A, st.Zq, st.mask, st.W, st.lam)
    assert st.certified(1e-9).all()
    for j, name in enumerate(SCALARS):  # (λ by token: the same sums as the route's λ by row)
        np.testing.assert_array_equal(st.stats[:, j], getattr(cert, name), err_msg=name)
    np.testing.assert_array_equal(st.margins, cert.margins)
    np.testing.assert_array_equal(st.support, cert.support)


@pytest.mark.parametrize("shape", [(6, 8, 10), (10, 5, 4), (15, 15, 20)])
def test_the_compiled_kernels_certificate_agrees_with_certify_stack(shape):
    # the kernel computes the certificate inside its solve, row by row; certify_stack is its oracle
    pytest.importorskip("numba")
    if batch.compiled() is None:
        pytest.skip("the compiled route is off (ATTSVM_COMPILED=0)")
    B = 12
    rng = np.random.default_rng(7)
    probs = [paper_instance(*shape, seed=200 + s) for s in range(B)]
    alpha = np.stack([p.optimal_tokens(ties="first") if s % 2 else rng.integers(0, shape[1], size=shape[0])
                      for s, p in enumerate(probs)])  # fmt: skip
    X = np.stack([p.X for p in probs])
    Z = np.stack([p.queries for p in probs])
    st = batch.solve_arrays(AttentionSVM(), X, Z, alpha, FrobeniusOptions(tol=1e-10))
    assert st.path == "batched-active-set"
    solved = np.flatnonzero(st.code >= 0)
    assert solved.size >= B // 2
    s = solved
    cert = certify_stack(st.A[s], st.Zq[s], st.mask[s], st.W[s], st.lam[s])
    # (round-off of margins of size 1, of a gap between objectives of size primal, of λ·residual)
    primal, lam = cert.primal.max(), max(1.0, cert.lam.max())
    np.testing.assert_allclose(st.stats[s, 0], cert.violation, rtol=0, atol=1e-12)
    np.testing.assert_allclose(st.stats[s, 1], cert.relative_violation, rtol=0, atol=1e-12)
    np.testing.assert_allclose(st.stats[s, 2], cert.gap, rtol=0, atol=1e-12 * primal)
    np.testing.assert_allclose(st.stats[s, 3], cert.relative_gap, rtol=0, atol=1e-12)
    np.testing.assert_allclose(st.stats[s, 4], cert.complementarity, rtol=0, atol=1e-12 * lam)
    finite = st.mask[s]
    np.testing.assert_allclose(st.margins[s][finite], cert.margins[finite], rtol=1e-12, atol=1e-12)
    assert np.isinf(st.margins[s][~finite]).all()
    np.testing.assert_array_equal(st.support[s], cert.support)
    # and the verdict: the kernel's instances certify by the oracle's numbers exactly when by its own
    ok = (cert.relative_violation <= 1e-9) & (cert.relative_gap <= 1e-9)
    np.testing.assert_array_equal(st.certified(1e-9)[s], ok)
