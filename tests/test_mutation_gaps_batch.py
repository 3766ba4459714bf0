"""Behaviours of the Frobenius stack (attsvm.svm.stack, attsvm.svm.batch, attsvm.svm._active_set) that a
mutation audit found unpinned: the tie rule of the compiled kernel, the certificate scalars the stack
reports, the estimators built from the batch, and fit_stack's validation (docs/spec.md §3)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")

from attsvm.datasets import paper_instance
from attsvm.problem import AttentionProblem
from attsvm.svm import AttentionSVM, _fitted, batch
from attsvm.svm import _active_set as gi
from attsvm.svm.certificate import ROW_FLOOR
from attsvm.svm.frobenius import FrobeniusOptions

CERT_RTOL = 1e-9  # a certificate scalar against its recomputation from the stack's own arrays (round-off)
CERT_TOL = 1e-9  # the estimator's default tolerance
TIE_OFFSET = 1e4  # a shift of every token: a tie within the tie rule is then far above ZERO_ROW_RTOL


def _stack(probs, toks):
    return (
        np.stack([p.X for p in probs]),
        np.stack([p.queries for p in probs]),
        np.stack([np.asarray(t, dtype=np.int64) for t in toks]),
    )


def _feasible(B=8, shape=(6, 8, 10)):
    probs = [paper_instance(*shape, seed=s) for s in range(B)]
    return _stack(probs, [p.optimal_tokens(ties="first") for p in probs])


def test_a_tie_within_the_tie_rule_leaves_the_kernel_even_when_its_row_is_not_tiny():
    # pins the kernel's own tie test (attsvm.tokens.differences' rule): with every token shifted by 1e4, a token
    # one ulp from the selected one makes a row of norm ~1e-12, above ZERO_ROW_RTOL of the others, so only
    # the tie rule sends it to fit, which sees a zero row with right-hand side 1: infeasible
    X, Z, a = _feasible(2)
    X[1] += TIE_OFFSET
    X[1, 0, (a[1, 0] + 1) % X.shape[2]] = np.nextafter(X[1, 0, a[1, 0]], np.inf)
    out = gi.solve_stack(X, Z, a, gi.GI_TOL, gi.max_iterations(42))
    assert out["code"][0] >= 0 and out["code"][1] == batch.LEAVE_TIED
    stack = AttentionSVM().fit_stack(X, Z, a)
    assert stack.status.tolist() == ["optimal", "infeasible"]


def test_the_certificate_scalars_of_the_stack_are_those_of_its_own_arrays():
    # pins each certificate scalar of an instance the kernel certified (stats of _active_set._solve_one) to
    # its definition over the stack's W, margins and λ: violation max(1 − m)⁺, complementarity max |λ(m − 1)|,
    # relative gap |gap| / (|primal| + |dual|) with primal ½‖W‖² and dual primal − gap
    X, Z, a = _feasible()
    stack = AttentionSVM().fit_stack(X, Z, a)
    assert stack.optimal.all() and all(e.info_["path"] == "batched-active-set" for e in stack)
    mask = np.isfinite(stack.margins)
    res = np.where(mask, stack.margins - 1.0, 0.0)
    viol = np.maximum(-res, 0.0).max(axis=(1, 2))
    compl = np.abs(stack.dual_coef * res).max(axis=(1, 2))
    primal = 0.5 * stack.objective**2
    dual = primal - stack.duality_gap
    rel_gap = np.abs(stack.duality_gap) / (np.abs(primal) + np.abs(dual))
    np.testing.assert_allclose(stack.max_violation, viol, rtol=CERT_RTOL, atol=0)
    np.testing.assert_allclose(stack.complementary_slackness, compl, rtol=CERT_RTOL, atol=0)
    np.testing.assert_allclose(stack.relative_gap, rel_gap, rtol=CERT_RTOL, atol=0)
    # (round-off leaves them nonzero: a scalar written as 0 would not be read here as a match)
    assert (stack.complementary_slackness > 0).any() and (stack.duality_gap != 0).any()
    # the multipliers of an optimal instance are λ ≥ 0, zero off the support, and W = Σ λ_it a_it z_iᵀ
    assert (stack.dual_coef >= 0).all() and not (stack.dual_coef[~stack.support] > 0).any()
    A = X[np.arange(len(X))[:, None], np.arange(X.shape[1]), a][:, :, None, :] - X
    W = np.einsum("bnt,bntd,bne->bde", stack.dual_coef, A, Z)
    np.testing.assert_allclose(stack.W, W, rtol=0, atol=CERT_RTOL * np.abs(W).max())


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_the_relative_violation_is_scaled_by_each_rows_norm(scale):
    # pins the row scale of the relative violation (docs/spec.md §3): row k's violation over
    # max(1, ROW_FLOOR ‖W‖ ‖a_k‖ ‖z_i‖), a number that does not change when X is scaled
    X, Z, a = _feasible()
    X = X * scale
    stack = AttentionSVM().fit_stack(X, Z, a)
    assert all(e.info_["path"] == "batched-active-set" for e in stack)
    A = X[np.arange(len(X))[:, None], np.arange(X.shape[1]), a][:, :, None, :] - X
    s = np.linalg.norm(A, axis=3) * np.linalg.norm(Z, axis=2)[:, :, None]
    wn = np.linalg.norm(stack.W, axis=(1, 2))
    mask = np.isfinite(stack.margins)
    v = np.where(mask, np.maximum(1.0 - stack.margins, 0.0), 0.0)
    rel = (v / np.maximum(1.0, ROW_FLOOR * wn[:, None, None] * s)).max(axis=(1, 2))
    assert (v > 0).any()  # (round-off leaves some rows a hair under 1)
    np.testing.assert_allclose(stack.relative_violation, rel, rtol=CERT_RTOL, atol=0)


def test_the_estimators_report_fits_global_scale_and_the_batch_size():
    # pins the global scale g of the kernel (the power of two at the upper median of 1/s, as fit's
    # reduction) and the batch size in the info of the estimators built from the stack
    probs = [paper_instance(6, 8, 10, seed=s) for s in range(5)]
    scaled = [AttentionProblem(p.X * c, p.y, p.v, Z=p.Z) for p, c in zip(probs, (1e-3, 0.37, 1.0, 5.0, 1e3))]
    toks = [p.optimal_tokens(ties="first") for p in probs]
    stack = AttentionSVM().fit_stack(*_stack(scaled, toks))
    for b, (p, t) in enumerate(zip(scaled, toks)):
        info = stack[b].info_
        assert info["path"] == "batched-active-set" and info["batch_size"] == len(probs) and info["K"] == 42
        assert info["global_scale"] == AttentionSVM().fit(p, t).info_["global_scale"], b
    assert len({stack[b].info_["global_scale"] for b in range(len(probs))}) > 1


def test_an_infeasible_or_tied_entry_has_no_certificate_scalars_and_no_support():
    # pins the NaN of every certificate scalar (complementarity included) and the empty support of the
    # instances the batch did not certify, whichever way they came back (a Farkas proof, fit's LP)
    rng = np.random.default_rng(0)
    probs = [paper_instance(10, 5, 4, seed=s) for s in range(12)]  # dependent rows: infeasible selections
    toks = [p.optimal_tokens(ties="first") if s % 3 else rng.integers(0, 5, size=10) for s, p in enumerate(probs)]
    X, Z, a = _stack(probs, toks)
    X[4, 2, (a[4, 2] + 1) % 5] = X[4, 2, a[4, 2]]  # a tied row: fit's route
    stack = AttentionSVM().fit_stack(X, Z, a)
    bad = ~stack.optimal
    assert bad.sum() >= 2 and set(stack.status[bad].tolist()) == {"infeasible"}
    for name in ("max_violation", "relative_violation", "duality_gap", "relative_gap", "complementary_slackness"):
        assert np.isnan(getattr(stack, name)[bad]).all(), name
        assert np.isfinite(getattr(stack, name)[~bad]).all(), name
    assert np.isnan(stack.objective[bad]).all() and np.isnan(stack.W[bad]).all()
    assert not stack.support[bad].any() and np.isnan(stack.dual_coef[bad]).all()
    assert np.isfinite(stack.certificate[bad]).all() and np.isnan(stack.certificate[~bad]).all()


def test_fit_stack_refuses_boolean_indices_and_queries_without_features():
    # pins two refusals of fit_stack's arrays: a bool is not an instance number (True would be instance 1),
    # and a query of no features (d_z = 0) is named, not solved
    X, Z, a = _feasible(3, (3, 4, 5))
    stack = AttentionSVM().fit_stack(X, Z, a)
    for b in (True, np.bool_(False), 1.0):
        with pytest.raises(TypeError, match="indexed by an instance number"):
            stack[b]
    with pytest.raises(ValueError, match=r"Z must have shape \(3, 3, d_z\)"):
        AttentionSVM().fit_stack(X, Z[:, :, :0], a)


def test_the_iteration_budget_is_exact():
    # pins the budget's boundary: an instance that needs c iterations is solved with max_iter = c, the same
    # as with the default budget, and leaves with LEAVE_MAX_ITER at c − 1
    X, Z, a = _feasible(4)
    full = gi.solve_stack(X, Z, a, gi.GI_TOL, gi.max_iterations(42))
    assert (full["code"] > 0).all()
    for b, c in enumerate(full["code"].tolist()):
        sl = slice(b, b + 1)
        exact = gi.solve_stack(X[sl], Z[sl], a[sl], gi.GI_TOL, c)
        assert exact["code"][0] == c
        np.testing.assert_array_equal(exact["W"][0], full["W"][b])
        assert gi.solve_stack(X[sl], Z[sl], a[sl], gi.GI_TOL, c - 1)["code"][0] == batch.LEAVE_MAX_ITER


def test_certified_needs_a_code_both_tolerances_and_a_finite_w():
    # pins each condition of Stacked.certified: an iteration count (not a LEAVE_* code), the relative
    # violation and the relative gap within tol, and a finite W; an instance failing any goes to fit
    X, Z, a = _feasible(6)
    st = batch.solve_arrays(AttentionSVM(), X, Z, a, FrobeniusOptions())
    assert st.certified(CERT_TOL).all()
    st.code[1] = batch.LEAVE_MAX_ITER
    st.stats[2, 1] = 10 * CERT_TOL
    st.stats[3, 3] = 10 * CERT_TOL
    st.W[4, 0, 0] = np.inf
    assert st.certified(CERT_TOL).tolist() == [True, False, False, False, False, True]
    assert st.certified(100 * CERT_TOL).tolist() == [True, False, True, True, False, True]


def test_a_candidate_that_does_not_verify_goes_to_fit():
    # pins _fitted.infeasible's verification (batch.farkas_of): the kernel's Farkas candidate is accepted only when it
    # verifies; a corrupted one gives None (the instance then goes through fit)
    rng = np.random.default_rng(0)
    probs = [paper_instance(10, 5, 4, seed=s) for s in range(10)]
    X, Z, a = _stack(probs, [rng.integers(0, 5, size=10) for _ in probs])
    est = AttentionSVM()
    st = batch.solve_arrays(est, X, Z, a, FrobeniusOptions())
    proved = np.flatnonzero(st.code == batch.LEAVE_INFEASIBLE).tolist()
    assert proved and _fitted.infeasible(est, st, proved[0]).status_ == "infeasible"
    st.lam[proved[0]] = np.where(st.mask[proved[0]], 1.0, 0.0)  # λ > 0 on every row: Σ λ a zᵀ ≠ 0
    assert _fitted.infeasible(est, st, proved[0]) is None
    assert proved[0] not in _fitted.proved_infeasible(est, st)


def test_the_rank_deficient_boundary_is_strict():
    # pins deficient_shape at K = d·d_z (n ≥ d_z): as many rows as W has entries is full rank, one more is not
    assert not batch.deficient_shape((4, 5, 4, 4))  # K = 16 = 4 · 4
    assert batch.deficient_shape((4, 5, 4, 3))  # K = 16 > 4 · 3
    assert not batch.deficient_shape((3, 5, 4, 4))  # K = 12 = 4 · min(4, 3): n bounds the rank of the queries
    assert batch.deficient_shape((3, 6, 4, 4))  # K = 15 > 4 · 3


def test_the_stacks_estimators_carry_fits_constraint_set():
    # pins the constraint set of the estimators the batch builds (batch._solve_compiled's mask, the rows,
    # the right-hand side): no constraint at α_i, exactly the rows, mask and rhs that fit builds
    probs = [paper_instance(4, 6, 8, seed=s) for s in range(3)]
    toks = [p.optimal_tokens(ties="first") for p in probs]
    stack = AttentionSVM().fit_stack(*_stack(probs, toks))
    for b, (p, t) in enumerate(zip(probs, toks)):
        got, ref = stack[b].constraints_, AttentionSVM().fit(p, t).constraints_
        assert stack[b].info_["path"] == "batched-active-set"
        assert not got.mask[np.arange(p.n), t].any()
        for name in ("A", "Z", "mask", "rhs", "equality"):
            np.testing.assert_array_equal(getattr(got, name), getattr(ref, name), err_msg=name)


def test_the_numpy_routes_uncertified_entries_have_no_certificate_scalars(monkeypatch):
    # pins, on the NumPy route (which computes a certificate for every instance of its chunk), the NaN of
    # every certificate scalar of an instance it did not certify: complementarity too, not a stale number
    monkeypatch.setenv("ATTSVM_COMPILED", "0")
    monkeypatch.setattr(batch, "_compiled_module", None)
    X, Z, a = _feasible(4)
    X[1, 0, (a[1, 0] + 1) % X.shape[2]] = X[1, 0, a[1, 0]]  # a duplicate of the selected token: infeasible
    stack = AttentionSVM().fit_stack(X, Z, a)
    monkeypatch.setattr(batch, "_compiled_module", None)
    bad = stack.status == "infeasible"
    assert bad.tolist() == [False, True, False, False] and stack.optimal[~bad].all()
    for name in ("max_violation", "relative_violation", "duality_gap", "relative_gap", "complementary_slackness"):
        assert np.isnan(getattr(stack, name)[bad]).all(), name
    assert not stack.support[bad].any() and np.isnan(stack.dual_coef[bad]).all()
