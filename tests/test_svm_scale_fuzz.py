"""A certificate that cannot lie: results do not depend on units, and statuses are always backed.

Whenever the status is "optimal" the objective agrees with an independent solve of the rescaled
problem, and "infeasible" always comes with a Farkas certificate that the certificate module
verifies. The independent solves: the analytic rescaling (X_i → c_i X_i with z_i → z_i / c_i leaves
every a_k z_kᵀ unchanged; X → c_x X, Z → c_z Z scales W by 1/(c_x c_z)), and cvxpy's Clarabel on
the same, arbitrarily rescaled problem.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attsvm.datasets import paper_instance, random_instance
from attsvm.problem import AttentionProblem
from attsvm.svm import AttentionSVM, att_svm_constraints, farkas_certificate, feasible, optimality_certificate

OBJ_RTOL = 1e-6  # agreement with the independent (unit-scale) solve


def _rescale(p: AttentionProblem, cx: np.ndarray, cz: np.ndarray) -> AttentionProblem:
    return AttentionProblem(p.X * cx[:, None, None], p.y, p.head, Z=p.queries * cz[:, None])


def _check(p_unit: AttentionProblem, p: AttentionProblem, factor: float, norm: str, backend: str = "auto") -> None:
    alpha = p_unit.optimal_tokens(ties="first")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = AttentionSVM(norm, backend=backend, tol=1e-7 if backend == "cvxpy" else 1e-9).fit(p_unit, alpha)
        # Clarabel fails ("error") on some badly scaled instances: SCS is the reference there
        if backend == "cvxpy" and ref.status_ == "error":
            ref = AttentionSVM(norm, backend=backend, tol=1e-7, solver="SCS").fit(p_unit, alpha)
        svm = AttentionSVM(norm).fit(p, alpha)
    if svm.status_ == "optimal":
        assert ref.status_ in ("optimal", "optimal_inaccurate")
        if ref.status_ == "optimal":
            assert svm.objective_ == pytest.approx(ref.objective_ * factor, rel=OBJ_RTOL)
        else:  # the reference's own certificate brackets the optimum: ours must lie inside it
            lo, hi = _bracket(ref, norm)
            assert lo * factor * (1 - OBJ_RTOL) <= svm.objective_ <= hi * factor * (1 + OBJ_RTOL)
    if svm.status_ == "infeasible":
        cert = farkas_certificate(att_svm_constraints(p, alpha), svm.certificate_)
        assert cert.valid
        assert not feasible(p, alpha)
    if ref.status_ == "optimal":  # a feasible, well-solved instance never turns into "infeasible"
        assert svm.status_ != "infeasible"


def _bracket(ref: AttentionSVM, norm: str) -> tuple[float, float]:
    """[lower, upper] bounds on the optimal objective (‖W‖_F or ‖W‖_*) from ``ref``'s certificate,
    recomputed independently: the dual bound, and the primal value of ``ref``'s W made feasible by scaling
    (W/min_k m_k meets every row when the smallest margin m is positive). The certificate's values are
    ½‖W‖_F² for the Frobenius norm."""
    cs = ref.constraints_
    cert = optimality_certificate(cs, ref.W_, ref.dual_coef_, norm)
    m = float((cs.apply(ref.W_)[cs.mask] / cs.rhs[cs.mask]).min())
    assert m > 0, "the reference's W misses a row by its whole margin"
    lo, hi = (np.sqrt(2 * max(cert.dual, 0.0)), np.sqrt(2 * cert.primal)) if norm == "fro" else (cert.dual, cert.primal)
    return lo, hi / min(m, 1.0)


scales = st.floats(-8, 8)


def _instance(n, T, extra, seed, near_tie):
    d = max(T - 1, n) + extra
    p = random_instance(n, T, d, seed=seed)
    if near_tie:  # a near-duplicate token: a_k tiny but non-zero
        X = p.X.copy()
        X[:, -1] = X[:, 0] + 1e-7 * np.random.default_rng(seed).standard_normal((n, d))
        p = AttentionProblem(X, p.y, p.head, Z=p.queries)
    return p


FUZZ = dict(
    n=st.integers(1, 6),
    T=st.integers(2, 8),
    extra=st.integers(0, 4),
    seed=st.integers(0, 10_000),
    gx=scales,
    gz=scales,
    per=st.lists(st.floats(-8, 8), min_size=6, max_size=6),
    norm=st.sampled_from(["fro", "nuc"]),
    near_tie=st.booleans(),
)


def _fuzz_analytic(n, T, extra, seed, gx, gz, per, norm, near_tie):
    p = _instance(n, T, extra, seed, near_tie)
    c = 10.0 ** np.asarray(per[:n])  # per sequence: X_i × c_i, z_i / c_i (the same problem) ...
    cx, cz = 10.0**gx, 10.0**gz  # ... and global units of X and Z
    _check(p, _rescale(p, cx * c, cz / c), 1.0 / (cx * cz), norm)


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(**FUZZ)
def test_certificate_fuzz_analytic_rescaling(n, T, extra, seed, gx, gz, per, norm, near_tie):
    _fuzz_analytic(n, T, extra, seed, gx, gz, per, norm, near_tie)


@pytest.mark.slow
@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(**FUZZ)
def test_certificate_fuzz_analytic_rescaling_slow(n, T, extra, seed, gx, gz, per, norm, near_tie):
    _fuzz_analytic(n, T, extra, seed, gx, gz, per, norm, near_tie)


def _fuzz_cvxpy(n, T, extra, seed, per):
    pytest.importorskip("cvxpy")
    p = _instance(n, T, extra, seed, False)
    q = _rescale(p, 10.0 ** np.asarray(per[:n]), np.ones(n))  # a different problem per sequence
    _check(q, q, 1.0, "fro", backend="cvxpy")


CVX = dict(
    n=st.integers(1, 5),
    T=st.integers(2, 6),
    extra=st.integers(0, 3),
    seed=st.integers(0, 10_000),
    per=st.lists(st.floats(-3, 3), min_size=5, max_size=5),
)


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(**CVX)
def test_certificate_fuzz_against_cvxpy(n, T, extra, seed, per):
    _fuzz_cvxpy(n, T, extra, seed, per)


@pytest.mark.slow
@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(**CVX)
def test_certificate_fuzz_against_cvxpy_slow(n, T, extra, seed, per):
    _fuzz_cvxpy(n, T, extra, seed, per)


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
    # a_k z_kᵀ spans 20 orders of magnitude here: each row is judged relative to its own scale
    # (certificate module doc), and the violation is at the round-off floor of the largest rows
    assert svm.relative_violation_ <= 1e-9
    cs = att_svm_constraints(q)
    scale = np.sqrt(cs.gram_diag()) * np.linalg.norm(svm.W_)
    v = np.maximum(cs.rhs - cs.apply(svm.W_), 0.0) * cs.mask
    assert np.all(v <= 1e-12 * np.maximum(cs.rhs, scale))
    assert ref.status_ == "optimal"
    # the same problem written with z_i / c_i (a_k z_kᵀ unchanged) is the same problem
    same = AttentionSVM().fit(_rescale(p, per, 1.0 / per))
    assert same.status_ == "optimal" and same.objective_ == pytest.approx(ref.objective_, rel=OBJ_RTOL)


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


@pytest.mark.parametrize("c", [1e-6, 1.0, 1e6])
def test_nuclear_info_is_in_the_users_units(c):
    """The solvers work in reduced units; what they report (objective, dual bound, the rank
    solver's comparison with the convex optimum) is lifted back."""
    from attsvm.svm import solve_nuclear, solve_nuclear_rank

    p = paper_instance(6, 8, 10, seed=0)
    cs = att_svm_constraints(_rescale(p, np.full(p.n, c), np.ones(p.n)))
    raw = solve_nuclear(cs)
    nuc = np.linalg.svd(raw.W, compute_uv=False).sum()
    assert raw.status == "optimal"
    assert raw.info["objective"] == pytest.approx(nuc, rel=1e-9)
    assert raw.info["dual_objective"] == pytest.approx(nuc, rel=1e-8)
    hi = solve_nuclear_rank(cs, rank=10, convex=raw)
    assert hi.info["reached_convex_optimum"] and hi.status == "optimal"


@pytest.mark.parametrize("norm", ["fro", "nuc"])
def test_tokens_equal_up_to_round_off_are_tied_in_every_unit(norm):
    """Tokens one ulp apart are tied: the row is round-off, and 10·x rounds differently from x, so a
    "solution" of 1/ulp would differ between units (found by the slow fuzz). Both units say infeasible,
    with a valid Farkas certificate, through fit and fit_many alike; a near tie of 1e-7 stays a real,
    unit-independent constraint, also beside a coordinate of 1e8 (the rule is per coordinate)."""
    for gap, big, want in ((np.spacing(1.0), 0.0, "infeasible"), (1e-7, 0.0, "optimal"), (1e-7, 1e8, "optimal")):
        X = np.array([[[1.0, 0.3, big], [1.0 - gap, 0.3, big]], [[0.2, 1.0, 0.0], [0.1, -1.0, 0.0]]])
        Z = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
        p = AttentionProblem(X, np.ones(2), np.array([1.0, 1.0, 0.0]), Z=Z)
        alpha = np.array([0, 0])
        fits = []
        for c in (1.0, 10.0, 1e-3):
            q = _rescale(p, np.array([c, 1.0]), np.array([1.0 / c, 1.0]))
            one = AttentionSVM(norm).fit(q, alpha)
            many = AttentionSVM(norm).fit_many([q, q], [alpha, alpha])
            for svm in (one, *many):
                assert svm.status_ == want
                if want == "infeasible":
                    assert farkas_certificate(att_svm_constraints(q, alpha), svm.certificate_).valid
                else:
                    assert svm.objective_ == pytest.approx(one.objective_, rel=OBJ_RTOL)
            fits.append(one)
        if want == "optimal":
            assert all(f.objective_ == pytest.approx(fits[0].objective_, rel=OBJ_RTOL) for f in fits)


def test_every_constraint_builder_ties_the_same_rows():
    """att_svm_constraints, pair_differences and the W^eq constraints (one-element sets) give the same
    rows, tied ones included, so that fit, fit_many and svm_eq solve the same program."""
    from attsvm.svm import svm_eq
    from attsvm.tokens import pair_differences

    X = np.array([[[1.0, 0.3], [np.nextafter(1.0, 2.0), 0.3], [0.0, 1.0]]])
    p = AttentionProblem(X, np.ones(1), np.array([1.0, 0.0]), Z=np.array([[1.0, 0.5]]))
    alpha = np.array([0])
    A = att_svm_constraints(p, alpha).A
    assert np.all(A[0, 1] == 0) and np.all(A[0, 2] != 0)
    np.testing.assert_array_equal(pair_differences(p, alpha)[0], A)
    O = np.zeros((1, 3), dtype=bool)
    O[0, 0] = True
    assert svm_eq(p, O).status_ == "infeasible"


def test_fit_many_ties_the_rows_that_fit_ties():
    """The Frobenius batch builds its rows itself: a token one ulp from the selected one (beside a large
    coordinate) is tied there too, so fit_many says "infeasible" where fit does (review of this rule)."""
    p = random_instance(3, 4, 8, seed=0)
    X = p.X.copy()
    X[..., 0] += 1e8
    X[0, 1] = X[0, 0]
    X[0, 1, 0] = np.nextafter(X[0, 0, 0], np.inf)
    q = AttentionProblem(X, p.y, p.head, Z=p.queries)
    alpha = np.array([0, 1, 2])
    one = AttentionSVM().fit(q, alpha)
    many = AttentionSVM().fit_many([q, q], [alpha, alpha])
    assert one.status_ == "infeasible"
    assert [m.status_ for m in many] == ["infeasible", "infeasible"]
    assert np.all(many[0].constraints_.A[0, 1] == 0)
