"""Documented invariants that no other test pinned (found by a mutation audit: each test below fails
when the line it names is changed). Certificates (docs/spec.md §3), constraint sets, problems (§2),
run folders and trial keys (§6), the stacked fit and the rank tolerance (§4)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from attsvm import AttentionProblem, AttentionSVM, Head, TieError
from attsvm._folders import OWNER_FILE, RunFolderError, claim_folder, folder_owner, refuse_foreign
from attsvm.datasets import paper_instance
from attsvm.metrics import matrix_rank
from attsvm.svm._base import ConstraintSet
from attsvm.svm.certificate import (
    FARKAS_BMIN,
    ROW_FLOOR,
    farkas_certificate,
    find_farkas,
    optimality_certificate,
)

E1 = np.array([1.0, 0.0])


def _set(rows, Z, mask=None, rhs=None, equality=None) -> ConstraintSet:
    A = np.asarray(rows, dtype=float)
    return ConstraintSet(
        A, np.asarray(Z, dtype=float), np.ones(A.shape[:2], bool) if mask is None else mask, rhs, equality
    )


# ---------------------------------------------------------------- Farkas certificates
def test_a_contradiction_at_round_off_level_is_not_a_proof_of_infeasibility():
    # a_ᵀWz = 1 and a_ᵀWz = 1 − 1e-12 with the same a, z: λ = (1, −1) cancels exactly, but bᵀλ is round-off
    cs = _set([[E1, E1]], [E1], rhs=[[1.0, 1.0 - 1e-12]], equality=np.ones((1, 2), bool))
    cert = farkas_certificate(cs, np.array([[1.0, -1.0]]))
    assert cert.residual == 0.0 and 0 < cert.b_ratio < FARKAS_BMIN
    assert not cert.valid
    assert cs.violation(np.zeros((2, 2))) == 1.0  # (the equality rows' |m − b| at W = 0)


def test_a_farkas_candidate_with_a_negative_inequality_multiplier_is_refused():
    # aᵀWz ≥ 1 and −aᵀWz ≥ 1 are contradictory: λ = (½, ½) proves it; a third row with λ < 0 is not a proof
    rows = [[E1, -E1, np.array([0.0, 1.0])]]
    cs = _set(rows, [E1])
    assert farkas_certificate(cs, np.array([[0.5, 0.5, 0.0]])).valid
    assert not farkas_certificate(cs, np.array([[0.5, 0.5, -1e-3]])).valid


def test_an_unattainable_zero_row_with_a_negative_right_hand_side_is_proved_by_the_zero_row():
    # 0 = −1 (a zero feature row, equality): λ must take the sign of b to give bᵀλ > 0
    cs = _set([[np.zeros(2), E1]], [E1], rhs=[[-1.0, 1.0]], equality=np.array([[True, False]]))
    cert = find_farkas(cs, lp=False)
    assert cert is not None and cert.valid and cert.source == "zero row"
    assert cert.lam[0, 0] < 0


# ---------------------------------------------------------------- optimality certificates
def test_the_certificate_clips_negative_inequality_multipliers():
    cs = _set([[E1]], [E1])
    cert = optimality_certificate(cs, np.eye(2), np.array([[-1.0]]), "fro")
    assert cert.lam[0, 0] == 0.0


def test_a_row_with_zero_right_hand_side_is_scaled_by_the_row_floor():
    # equality aᵀWz = 0 with a = z = e1 and W = −e1e1ᵀ: violation 1, scale ROW_FLOOR·‖a‖‖z‖‖W‖_F
    cs = _set([[E1]], [E1], rhs=[[0.0]], equality=np.ones((1, 1), bool))
    cert = optimality_certificate(cs, np.diag([-1.0, 0.0]), np.zeros((1, 1)), "fro")
    assert cert.violation == 1.0
    assert ROW_FLOOR == 1e-3
    assert cert.relative_violation == pytest.approx(1e3, rel=1e-12)


def test_the_support_includes_every_equality_row():
    # the inequality is slack (margin 3) and the equality (margin 0, b = 0.5) not met: support = the equality
    cs = _set([[E1, np.array([0.0, 1.0])]], [E1], rhs=[[1.0, 0.5]], equality=np.array([[False, True]]))
    cert = optimality_certificate(cs, 3.0 * np.eye(2), np.zeros((1, 2)), "fro")
    assert cert.support.tolist() == [[False, True]]


# ---------------------------------------------------------------- constraint sets
def test_masked_rows_are_zeroed_and_are_never_equalities():
    cs = ConstraintSet(np.ones((1, 2, 2)), np.ones((1, 2)), np.array([[True, False]]), None, np.ones((1, 2), bool))
    assert cs.A[0, 1].tolist() == [0.0, 0.0] and cs.A[0, 0].tolist() == [1.0, 1.0]
    assert cs.apply(np.eye(2))[0, 1] == 0.0
    assert cs.equality.tolist() == [[True, False]] and cs.rhs.tolist() == [[1.0, 0.0]]


# ---------------------------------------------------------------- problems
def test_multiclass_labels_must_be_class_indices():
    rng = np.random.default_rng(0)
    X, C = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 3))
    Z = rng.standard_normal((2, 4))
    for y in ([-1, 0], [0.5, 1]):
        with pytest.raises(ValueError, match="class indices"):
            AttentionProblem(X, np.array(y), Head.multiclass(C), Z=Z)
    with pytest.raises(ValueError, match="at least 2 columns"):
        Head.multiclass(np.ones((4, 1)))  # one class is no classification


def test_query_index_bounds():
    p = paper_instance(3, 5, 4, seed=0)
    with pytest.raises(ValueError, match="query_index"):
        AttentionProblem(p.X, p.y, p.head, query_index=5)
    assert AttentionProblem(p.X, p.y, p.head, query_index=-5).query_index == 0
    assert AttentionProblem(p.X, p.y, p.head, query_index=-1).query_index == 4


def test_scores_within_tie_rtol_tie_and_the_data_are_read_only():
    p = paper_instance(3, 5, 4, seed=0)
    X = p.X.copy()
    top = p.optimal_tokens()[1]
    other = (top + 1) % 5
    X[1, other] = X[1, top] * (1 - 1e-13)  # its score within 1e-13 of the top, relative (TIE_RTOL = 1e-12)
    with pytest.raises(TieError):
        AttentionProblem(X, p.y, p.head, Z=p.Z).optimal_tokens()
    assert p.X.flags.writeable is False
    with pytest.raises(ValueError, match="W must have shape"):
        p.logits(np.zeros((1, 1, 4, 4)))


# ---------------------------------------------------------------- run folders
def test_a_folder_of_another_program_is_refused_unless_allowed(tmp_path: Path):
    d = tmp_path / "theirs"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    with pytest.raises(RunFolderError, match="files of another program"):
        claim_folder(d, "reproduce")
    claim_folder(d, "reproduce", allow_foreign=True)
    assert (d / "notes.txt").read_text() == "mine"


def test_the_owner_marker_is_written_read_and_checked(tmp_path: Path):
    d = tmp_path / "run"
    d.mkdir()
    claim_folder(d, "plot")
    assert folder_owner(d) == "plot"
    with pytest.raises(RunFolderError, match="the results of `attsvm plot`"):
        refuse_foreign(d, "lm-train")
    (d / OWNER_FILE).write_text(json.dumps({"command": None}))
    with pytest.raises(RunFolderError, match="corrupt"):
        folder_owner(d)


def test_older_run_folders_are_recognised_by_their_files(tmp_path: Path):
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "trials").mkdir(parents=True)
    b.mkdir()
    (b / "config.json").write_text(json.dumps({"experiment": "x"}))
    assert folder_owner(a) == "reproduce" and folder_owner(b) == "reproduce"


# ---------------------------------------------------------------- trials, stacks, rank
def test_settings_that_give_duplicate_trials_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from attsvm.experiments import get_experiment, reproduce

    exp = get_experiment("local-convergence")
    real = type(exp).trials
    monkeypatch.setattr(type(exp), "trials", lambda self, s: (lambda t: t + t[:1])(real(self, s)))
    with pytest.raises(ValueError, match="duplicate trials"):
        reproduce("local-convergence", quick=True, out=tmp_path / "o", progress=False)


def test_fit_stack_names_queries_of_width_zero():
    X = np.random.default_rng(0).standard_normal((2, 3, 4, 5))
    with pytest.raises(ValueError, match=r"Z must have shape \(2, 3, d_z\)"):
        AttentionSVM().fit_stack(X, np.zeros((2, 3, 0)), np.zeros((2, 3), dtype=np.int64))


def test_the_rank_tolerance_is_the_specs_1e_7():
    assert matrix_rank(np.diag([1.0, 1e-6])) == 2
    assert matrix_rank(np.diag([1.0, 1e-8])) == 1


# ---------------------------------------------------------------- second audit: tokens (docs/spec.md §2–3)
def test_a_support_token_whose_score_equals_the_selected_one_is_offending():
    from attsvm.datasets import random_instance
    from attsvm.tokens import local_optimality_report

    p = random_instance(2, 3, 4, seed=0)
    X = p.X.copy()
    X[0, 1] = X[0, 0]  # γ_01 = γ_00: the test is γ_{iα_i} > γ_it, so token 1 offends
    q = AttentionProblem(X, p.y, p.head, Z=p.Z)
    support = np.zeros((2, 3), bool)
    support[0, 1] = True
    rep = local_optimality_report(q, np.array([0, 0]), support, True)
    assert rep.passed.tolist() == [False, True] and rep.offending[0] == [1]
    infeasible = local_optimality_report(q, np.array([0, 0]), support, False)
    assert not infeasible.feasible and not infeasible.locally_optimal


def test_tied_rows_are_zeroed_within_tie_ulps_only():
    from attsvm.tokens import TIE_ULPS, differences

    eps = np.finfo(np.float64).eps
    sel = np.array([[1.0, 2.0, 3.0]])
    X = np.stack([sel[0], sel[0] * (1 + 100 * eps), sel[0] * (1 + 4 * eps)])[None]  # (1, 3, 3)
    A = differences(sel, X)
    assert TIE_ULPS == 8.0
    assert np.abs(A[0, 1]).max() > 0  # 100 ulps apart: a real difference
    assert not A[0, 2].any()  # 4 ulps apart: tied, exactly 0


@pytest.mark.parametrize("few", [1 << 30, 0])
def test_large_differences_find_the_same_ties(monkeypatch: pytest.MonkeyPatch, few: int) -> None:
    # large arrays screen rows by their first coordinate before the full test: the same zeros either way,
    # including rows tied in the first coordinate only and rows tied to within a few ulps
    from attsvm import _rows

    monkeypatch.setattr(_rows, "_FEW", few)
    eps = np.finfo(np.float64).eps
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2, 3, 6, 4))  # (..., n, T, d)
    sel = X[..., 0, :].copy()
    X[..., 1, :] = sel * (1 + 4 * eps)  # tied
    X[..., 2, 0] = sel[..., 0]  # first coordinate only: not tied
    X[1, 2, 3, :] = sel[1, 2] * (1 + 100 * eps)  # 100 ulps: not tied
    A = _rows.differences(sel, X)
    zero = (A == 0).all(-1)
    expected = np.zeros((2, 3, 6), bool)
    expected[..., :2] = True
    assert np.array_equal(zero, expected)
    assert np.array_equal(A[~zero], (sel[..., None, :] - X)[~zero])


def test_margins_one_part_in_1e5_from_1_are_not_support():
    from attsvm.tokens import SUPPORT_TOL, support_tokens

    assert SUPPORT_TOL == 1e-6
    assert not support_tokens(np.array([[np.inf, 1 + 1e-5, 1 - 1e-5]])).any()
    assert support_tokens(np.array([[np.inf, 1 + 1e-7, 1 - 1e-7]]))[0, 1:].all()


# ---------------------------------------------------------------- diagnostics
def test_negative_runs_are_named():
    from attsvm.diagnostics import convergence_types, svm_equivalence
    from attsvm.train import train

    r = train([paper_instance(6, 8, 10, seed=0)], steps=2)
    with pytest.raises(ValueError, match=r"must be in \[0, 1\)"):
        svm_equivalence(r, -1)
    with pytest.raises(ValueError, match=r"runs must be in \[0, 1\), got \[-1\]"):
        convergence_types(r, runs=[-1])


def test_rate_fit_interval_and_r2_are_the_textbook_ones():
    from scipy import stats

    from attsvm.diagnostics import rate_fit

    rng = np.random.default_rng(3)
    t = np.geomspace(1, 100, 12)
    y = t**-0.3 * np.exp(0.8 * rng.standard_normal(12))
    fit = rate_fit(t, y, model="power")
    ref = stats.linregress(np.log(t), np.log(y))
    half = stats.t.ppf(0.975, 10) * ref.stderr
    np.testing.assert_allclose(fit.ci, (-ref.slope - half, -ref.slope + half), rtol=1e-10)
    assert fit.r2 == pytest.approx(ref.rvalue**2, rel=1e-10) and fit.r2 < 0.5
    assert fit.rate > 0 and not fit.decaying  # a positive rate whose interval holds 0 is not evidence


# ---------------------------------------------------------------- estimator and solver routes
def test_dual_is_the_farkas_certificate_when_infeasible():
    p = paper_instance(6, 8, 10, seed=0)
    X = p.X.copy()
    a = p.optimal_tokens()
    X[0, (a[0] + 1) % 8] = X[0, a[0]]  # a duplicate of the selected token: no margin possible
    e = AttentionSVM().fit(AttentionProblem(X, p.y, p.head, Z=p.Z), a)
    assert e.status_ == "infeasible" and np.array_equal(e.dual_, e.certificate_)


def test_fit_many_with_the_cvxpy_backend_uses_cvxpy():
    probs = [paper_instance(3, 4, 5, seed=s) for s in range(2)]
    for e in AttentionSVM(backend="cvxpy").fit_many(probs):
        assert e.backend_.startswith("cvxpy:") and "path" not in e.info_


def test_a_vanished_row_that_every_w_satisfies_is_no_obstacle():
    rng = np.random.default_rng(0)
    A, Z = rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 5))
    rhs = np.ones((3, 4))
    A[1, 2], rhs[1, 2] = 0.0, 0.0  # 0 ≥ 0
    e = AttentionSVM().fit_constraints(ConstraintSet(A, Z, np.ones((3, 4), bool), rhs))
    assert e.status_ == "optimal"


def test_the_zero_row_test_is_per_sequence():
    p = paper_instance(4, 5, 6, seed=0)
    X = p.X.copy()
    X[1] *= 1e-14  # a sequence at another scale: its rows are not zero rows
    assert AttentionSVM().fit(AttentionProblem(X, p.y, p.head, Z=p.Z)).status_ == "optimal"


def test_the_working_set_keeps_equality_rows_from_the_start():
    from attsvm.svm.frobenius import solve_frobenius

    rng = np.random.default_rng(1)
    A, Z = rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 5))
    rhs, eq = np.ones((3, 4)), np.zeros((3, 4), bool)
    rhs[0, 1], rhs[2, 3] = 0.5, -0.3
    eq[0, 1] = eq[2, 3] = True
    cs = ConstraintSet(A, Z, np.ones((3, 4), bool), rhs, eq)
    ref = solve_frobenius(cs)
    ws = solve_frobenius(cs, working_set=True, working_set_start=1)
    np.testing.assert_allclose(ws.W, ref.W, atol=1e-12)
    m = cs.apply(ws.W)
    np.testing.assert_allclose(m[eq], rhs[eq], atol=1e-10)


# ---------------------------------------------------------------- training
def test_normalize_by_norm_normalises_updates_whose_squares_underflow():
    import torch

    from attsvm.training.optim import NormalizeByNorm

    (u,), _ = NormalizeByNorm(0.0).update(
        (torch.full((1, 2, 2), 1e-170, dtype=torch.float64),), None, (), loss=None, step=0
    )
    assert float(torch.linalg.norm(u)) == pytest.approx(1.0, rel=1e-12)


def test_a_zero_step_is_refused_and_the_auto_step_is_one_over_the_bound():
    from attsvm.train import train
    from attsvm.training.bounds import gradient_bound, smoothness_bound
    from attsvm.training.optim import gd

    p = paper_instance(6, 8, 10, seed=0)
    with pytest.raises(ValueError, match="lr must be a positive float"):
        train(p, steps=1, optimizer=gd(0.0))
    res = train(p, param="KQ", normalized=False, init="gaussian", init_scale=0.05, steps=1)
    assert float(res.lr[0]) == pytest.approx(1.0 / (smoothness_bound(p) + gradient_bound(p)), rel=1e-9)
