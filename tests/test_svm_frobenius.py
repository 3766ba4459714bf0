"""Our Frobenius solver against two independent implementations (cvxpy, scikit-learn SVC), docs/spec.md §3."""

from __future__ import annotations

import numpy as np
import pytest

from attsvm.datasets import paper_instance, random_instance
from attsvm.svm import (
    AttentionSVM,
    ConstraintSet,
    att_svm_constraints,
    solve_cvxpy,
    solve_frobenius,
)
from attsvm.svm.certificate import optimality_certificate

OBJ_RTOL = 1e-6  # objective agreement between implementations
W_ATOL = 1e-4  # W agreement between implementations
CERT_TOL = 1e-10  # our solver's own violation / gap target
PATH_TOL = 1e-8  # dense vs matrix-free path

SHAPES = [(6, 8, 10), (15, 15, 20), (5, 5, 3), (20, 4, 12)]


def _sklearn_W(cs: ConstraintSet) -> np.ndarray:
    """Hard-margin SVM on the features vec(a_k z_kᵀ), each also added negated with label −1.

    The symmetric data forces the intercept to 0, so this is exactly min ‖W‖_F s.t. 𝒜(W) ≥ 1.
    """
    from sklearn.svm import SVC

    feats = np.einsum("kd,ke->kde", cs.A[cs.mask], cs.Z[np.nonzero(cs.mask)[0]]).reshape(-1, cs.d * cs.d)
    Xs = np.vstack([feats, -feats])
    ys = np.r_[np.ones(len(feats)), -np.ones(len(feats))]
    clf = SVC(kernel="linear", C=1e10, tol=1e-10, max_iter=10_000_000).fit(Xs, ys)
    assert abs(clf.intercept_[0]) < 1e-5
    return clf.coef_.reshape(cs.d, cs.d)


@pytest.mark.parametrize("n,T,d", SHAPES)
def test_three_implementations_agree(n, T, d):
    p = paper_instance(n, T, d, seed=3)
    cs = att_svm_constraints(p, p.optimal_tokens(ties="first"))
    ours = solve_frobenius(cs)
    if ours.status == "infeasible":
        pytest.skip("this draw is infeasible (covered by test_feasibility)")
    assert ours.status == "optimal"
    ref = solve_cvxpy(cs, "fro")
    assert ref.status in ("optimal", "optimal_inaccurate")
    W_skl = _sklearn_W(cs)

    def f(W):
        return float(np.linalg.norm(W))

    assert f(ours.W) == pytest.approx(f(ref.W), rel=OBJ_RTOL)
    assert f(ours.W) == pytest.approx(f(W_skl), rel=OBJ_RTOL)
    np.testing.assert_allclose(ours.W, ref.W, atol=W_ATOL)
    np.testing.assert_allclose(ours.W, W_skl, atol=W_ATOL)
    # the duals are the SVM's support coefficients: W = 𝒜*(λ), ‖W‖² = 1ᵀλ (docs/spec.md §3)
    np.testing.assert_allclose(cs.adjoint(ours.dual), ours.W, atol=1e-12)
    assert f(ours.W) ** 2 == pytest.approx(ours.dual.sum(), rel=1e-10)


@pytest.mark.parametrize("n,T,d", [(15, 15, 20), (40, 10, 30)])
def test_dense_and_matrix_free_paths_agree(n, T, d):
    p = paper_instance(n, T, d, seed=0)
    cs = att_svm_constraints(p, p.optimal_tokens(ties="first"))
    a = solve_frobenius(cs, method="dense")
    b = solve_frobenius(cs, method="matrix_free")
    assert a.info["path"] == "dense" and b.info["path"] == "matrix_free"
    assert a.status == b.status == "optimal"
    np.testing.assert_allclose(a.W, b.W, atol=PATH_TOL)
    for r in (a, b):
        assert cs.violation(r.W) <= CERT_TOL and abs(r.info["gap"]) <= CERT_TOL * max(1, np.sum(r.W**2))


def test_solution_lives_in_the_data_subspaces():
    """Row space ⊂ span{z_i}, column space ⊂ span{a_k}; hence rank(W_mm) ≤ n (docs/spec.md §3)."""
    p = random_instance(4, 6, 12, seed=5)
    svm = AttentionSVM().fit(p, p.optimal_tokens())
    Z = p.queries
    P_z = Z.T @ np.linalg.pinv(Z.T)
    np.testing.assert_allclose(svm.W_ @ P_z, svm.W_, atol=1e-10)
    assert svm.rank_ <= p.n


def _eq_constraints(seed: int, n=5, T=6, d=8) -> ConstraintSet:
    """A docs/spec.md §5 shaped set: equalities inside O_i (free-sign rhs), inequalities ≥ 1 outside."""
    rng = np.random.default_rng(seed)
    p = random_instance(n, T, d, seed=seed)
    A, mask = att_svm_constraints(p, np.zeros(n, dtype=np.int64)).A, None
    cs0 = att_svm_constraints(p, np.zeros(n, dtype=np.int64))
    equality = np.zeros((n, T), dtype=bool)
    equality[:, 1] = True  # O_i = {0, 1}
    rhs = np.where(equality, rng.normal(size=(n, T)), 1.0)
    del A, mask
    return ConstraintSet(cs0.A, cs0.Z, cs0.mask, rhs, equality)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equality_constraints_against_cvxpy(seed):
    cs = _eq_constraints(seed)
    ours = solve_frobenius(cs)
    ref = solve_cvxpy(cs, "fro")
    assert ours.status == "optimal" and ref.status == "optimal"
    np.testing.assert_allclose(ours.W, ref.W, atol=W_ATOL)
    assert np.linalg.norm(ours.W) == pytest.approx(np.linalg.norm(ref.W), rel=OBJ_RTOL)
    eq = cs.equality
    np.testing.assert_allclose(cs.apply(ours.W)[eq], cs.rhs[eq], atol=1e-10)
    # equality multipliers are free: both signs occur, and they match cvxpy's (sign convention)
    np.testing.assert_allclose(ours.dual[eq], ref.dual[eq], atol=1e-4)
    assert np.all(ours.dual[cs.inequality] >= 0)


def test_pure_equality_set_is_the_least_norm_solution():
    cs0 = _eq_constraints(4)
    cs = ConstraintSet(cs0.A, cs0.Z, cs0.equality, cs0.rhs, cs0.equality)
    ours = solve_frobenius(cs)
    F = np.einsum("kd,ke->kde", cs.A[cs.mask], cs.Z[np.nonzero(cs.mask)[0]]).reshape(cs.n_constraints, -1)
    w = np.linalg.lstsq(F, cs.rhs[cs.mask], rcond=None)[0]
    np.testing.assert_allclose(ours.W.ravel(), w, atol=1e-10)


def test_cvxpy_formulations_agree():
    """The published loop formulation and the vectorised aux one solve the same problem."""
    p = paper_instance(6, 8, 10, seed=0)
    cs = att_svm_constraints(p)
    for norm in ("fro", "nuc"):
        a = solve_cvxpy(cs, norm, formulation="aux")
        b = solve_cvxpy(cs, norm, formulation="loop")
        c = solve_cvxpy(cs, norm, reduce=True)
        atol = 1e-6 if norm == "fro" else W_ATOL  # Clarabel's SDP path is less accurate
        for other in (b, c):
            assert other.status == "optimal"
            np.testing.assert_allclose(a.W, other.W, atol=atol)
        np.testing.assert_allclose(a.dual, b.dual, atol=atol)


def test_no_constraints_gives_zero():
    p = paper_instance(3, 4, 5, seed=0)
    cs = att_svm_constraints(p)
    empty = ConstraintSet(cs.A, cs.Z, np.zeros_like(cs.mask))
    r = solve_frobenius(empty)
    assert r.status == "optimal" and np.all(r.W == 0)


def test_huge_scale_stays_finite():
    """Tokens of norm 1e-6 need ‖W‖ ~ 1e6 × the unit-norm solution: the solver must stay exact (no overflow, no NaN)."""
    p = random_instance(5, 6, 10, seed=2, token_norm=1e-6)
    cs = att_svm_constraints(p)
    r = solve_frobenius(cs)
    assert r.status == "optimal" and np.all(np.isfinite(r.W))
    assert cs.violation(r.W) <= 1e-8
    q = random_instance(5, 6, 10, seed=2)
    r1 = solve_frobenius(att_svm_constraints(q))
    np.testing.assert_allclose(r.W * 1e-6, r1.W, rtol=1e-6, atol=1e-8)


def test_working_set_matches_direct_solve():
    """Constraint generation (used for large K) returns the same exact solution and multipliers."""
    p = paper_instance(12, 60, 16, seed=4)  # T ≫ d: few support constraints among K = 708
    cs = att_svm_constraints(p, p.optimal_tokens(ties="first"))
    ws = solve_frobenius(cs, working_set=True)
    direct = solve_frobenius(cs, working_set=False, method="dense")
    assert ws.status == direct.status == "optimal"
    assert ws.info["rounds"] >= 2 and ws.info["working_set_size"] < cs.n_constraints
    np.testing.assert_allclose(ws.W, direct.W, atol=PATH_TOL)
    np.testing.assert_allclose(ws.dual, direct.dual, atol=1e-6)
    assert cs.violation(ws.W) <= CERT_TOL


def test_stalled_newton_instance_is_solved_exactly():
    """paper_instance(10, 5, 3, seed=20): K = 40 constraints on 9 reduced features; the projected
    Newton iteration stalls on it, and the LDP/NNLS route must return the cvxpy optimum."""
    p = paper_instance(10, 5, 3, seed=20)
    ours = AttentionSVM("fro").fit(p)
    ref = AttentionSVM("fro", backend="cvxpy", tol=1e-6).fit(p)
    assert ours.status_ == "optimal"
    assert ours.max_violation_ <= CERT_TOL * 100
    assert ours.objective_ == pytest.approx(ref.objective_, rel=OBJ_RTOL)
    np.testing.assert_allclose(ours.W_, ref.W_, atol=W_ATOL * max(1.0, np.abs(ref.W_).max()))


@pytest.mark.parametrize("seed", range(4))
def test_ldp_route_matches_cvxpy(seed):
    """The NNLS least-distance route on its own, with equality rows (docs/spec.md §5 shape)."""
    from attsvm.svm.frobenius import FrobeniusOptions, _ldp_nnls

    p = random_instance(4, 5, 6, seed=seed)
    cs = att_svm_constraints(p)
    eq = np.zeros_like(cs.mask)
    eq[0] = cs.mask[0]  # every constraint of sequence 0 becomes an equality
    cs = ConstraintSet(cs.A, cs.Z, cs.mask, cs.rhs, eq)
    raw = _ldp_nnls(cs, FrobeniusOptions(tol=1e-12))
    ref = solve_cvxpy(cs, "fro")
    assert raw is not None and raw.status == "optimal"
    assert cs.violation(raw.W) <= 1e-9
    np.testing.assert_allclose(raw.W, ref.W, atol=W_ATOL)
    np.testing.assert_allclose(cs.adjoint(raw.dual), raw.W, atol=1e-9)  # W = 𝒜*(λ)


# --------------------------------------------------------------------------- PDAS warm start (dense path)
PDAS_CASES = [(6, 8, 10, 0), (6, 8, 10, 5), (15, 15, 20, 1), (12, 6, 9, 7), (20, 10, 16, 3)]


@pytest.mark.parametrize("n,T,d,seed", PDAS_CASES)
def test_pdas_warm_start_matches_cold_start_and_cvxpy(n, T, d, seed):
    """The primal-dual active-set warm start lands on the exact optimum (the Newton loop only
    certifies it), and agrees with the cold-started projected Newton and with Clarabel."""
    from attsvm.svm.frobenius import FrobeniusOptions

    p = paper_instance(n, T, d, seed=seed)
    cs = att_svm_constraints(p, p.optimal_tokens(ties="first"))
    warm = solve_frobenius(cs)
    assert warm.status == "optimal"
    assert 1 <= warm.info["pdas_iterations"] < FrobeniusOptions().pdas_max_iter  # the face settled ...
    assert warm.n_iter == warm.info["pdas_iterations"] + 1  # ... and was certified at once
    cold = solve_frobenius(cs, FrobeniusOptions(pdas_max_k=0))  # cold start from λ = 0
    assert "pdas_iterations" not in cold.info and cold.status == "optimal"
    np.testing.assert_allclose(warm.W, cold.W, atol=PATH_TOL * max(1.0, np.abs(cold.W).max()))
    ref = solve_cvxpy(cs, "fro")
    assert float(np.linalg.norm(warm.W)) == pytest.approx(float(np.linalg.norm(ref.W)), rel=OBJ_RTOL)
    assert cs.violation(warm.W) <= CERT_TOL


@pytest.mark.parametrize("seed", [0, 3, 4])
def test_pdas_that_does_not_settle_falls_back_to_projected_newton(seed):
    """d = 4 with K > r_a·r_z: the Gram matrix is singular and the active-set guess cycles; the
    projected Newton iteration must then take over from λ = 0 and still return the optimum."""
    from attsvm.svm.frobenius import FrobeniusOptions

    p = paper_instance(10, 6, 4, seed=seed)
    cs = att_svm_constraints(p, p.optimal_tokens(ties="first"))
    raw = solve_frobenius(cs, ldp_max_k=0)  # (by default such instances take the LDP route first)
    pdas_max_iter = FrobeniusOptions().pdas_max_iter
    assert raw.info["pdas_iterations"] == pdas_max_iter  # the warm start gave up
    assert raw.n_iter > pdas_max_iter + 1
    ref = solve_cvxpy(cs, "fro")
    assert raw.status == "optimal" and cs.violation(raw.W) <= CERT_TOL
    assert float(np.linalg.norm(raw.W)) == pytest.approx(float(np.linalg.norm(ref.W)), rel=OBJ_RTOL)


def test_wrong_pdas_guess_only_moves_the_start(monkeypatch):
    """A warm start on the wrong face (here: every constraint forced active with λ = 1) is not
    accepted as it is: the certificate check rejects it and Newton converges to the true optimum."""
    import attsvm.svm.frobenius as frobenius

    p = paper_instance(15, 15, 20, seed=0)
    cs = att_svm_constraints(p, p.optimal_tokens(ties="first"))
    good = solve_frobenius(cs)
    monkeypatch.setattr(frobenius, "_pdas", lambda G, b, ineq, ridge, max_iter: (np.ones(b.size), 1))
    bad = solve_frobenius(cs)
    assert bad.status == "optimal" and bad.n_iter > 2
    np.testing.assert_allclose(bad.W, good.W, atol=PATH_TOL * max(1.0, np.abs(good.W).max()))


REDUCE_RTOL = 1e-12  # the dense reduction against the general one (round-off only)


@pytest.mark.parametrize("n,T,d", [(6, 8, 10), (15, 15, 20), (3, 40, 4)])
def test_dense_reduction_is_the_general_reduction(n, T, d):
    """reduce_dense's Gram matrix, b̂ and g are those of reduce(cs, subspace=False) (docs/spec.md §3),
    on both of its branches (K ≤ d + d_z scales the Gram matrix, larger K the rows)."""
    from attsvm.svm.reduction import reduce, reduce_dense

    p = paper_instance(n, T, d, seed=1)
    cs = att_svm_constraints(p, p.optimal_tokens(ties="first"))
    for c in (cs, ConstraintSet(cs.A * 1e-7, cs.Z * 3e5, cs.mask)):  # and in other units
        dense, full = reduce_dense(c), reduce(c, subspace=False)
        assert dense is not None
        np.testing.assert_allclose(dense.G, full.problem.gram(), rtol=REDUCE_RTOL, atol=REDUCE_RTOL)
        np.testing.assert_allclose(dense.b, full.problem.rhs.ravel()[dense.idx], rtol=REDUCE_RTOL)
        assert dense.global_scale == full.global_scale


def test_dense_reduction_declines_zero_rows_and_the_solver_still_certifies():
    """A duplicate of the selected token makes a zero row: reduce_dense returns None and the general
    route reports the instance infeasible with a verified Farkas certificate."""
    from attsvm.svm.reduction import reduce_dense

    p = paper_instance(3, 4, 5, seed=0)
    opt = p.optimal_tokens()
    X = p.X.copy()
    X[0, (opt[0] + 1) % p.T] = X[0, opt[0]]
    cs = att_svm_constraints(type(p)(X, p.y, p.v, Z=p.Z), opt)
    assert reduce_dense(cs) is None
    raw = solve_frobenius(cs)
    assert raw.status == "infeasible" and raw.W is None


def test_fast_dense_path_equals_the_general_route():
    """The small dense route (reduce_dense) and the general one (reduce + reduced constraint set)
    give the same W and λ."""
    from attsvm.svm.frobenius import FrobeniusOptions, _solve_reduced
    from attsvm.svm.reduction import reduce

    p = paper_instance(6, 8, 10, seed=3)
    cs = att_svm_constraints(p, p.optimal_tokens())
    fast = solve_frobenius(cs)
    red = reduce(cs, subspace=False)
    slow = _solve_reduced(red.problem, FrobeniusOptions(tol=1e-10))
    assert fast.status == slow.status == "optimal"
    np.testing.assert_allclose(fast.W, red.lift_W(slow.W), rtol=PATH_TOL, atol=PATH_TOL)
    np.testing.assert_allclose(fast.dual, red.lift_dual(slow.dual, degree=2), rtol=1e-6, atol=PATH_TOL)


# (n, T, d, seed) of svm-rank's grid where the dense Newton iteration stalled and the LDP answer missed
# the 1e-9 certificate (relative gap 1e-9 to 9e-9): ‖W‖ ≈ 10³–10⁴, more rows than dimensions
ILL_CONDITIONED = [(5, 15, 2, 156), (5, 15, 2, 181), (5, 15, 2, 272), (5, 5, 3, 97), (10, 5, 4, 78), (15, 5, 4, 333)]


@pytest.mark.parametrize("n,T,d,seed", ILL_CONDITIONED)
def test_rank_deficient_ill_conditioned_instances_are_certified(n, T, d, seed):
    """K > r_a·r_z goes to the LDP route first, and its support polish (least-norm solve on the
    support, by SVD) brings the relative gap to round-off: status "optimal" at the default tolerance,
    the same optimum as cvxpy."""
    p = paper_instance(n, T, d, seed=seed)
    svm = AttentionSVM().fit(p, p.optimal_tokens())
    assert svm.status_ == "optimal", (svm.relative_violation_, svm.relative_gap_)
    assert svm.info_["path"] == "ldp-nnls" and svm.info_.get("support_polish")
    assert svm.relative_gap_ <= 1e-11
    ref = solve_cvxpy(svm.constraints_, "fro")
    assert svm.objective_ == pytest.approx(float(np.linalg.norm(ref.W)), rel=OBJ_RTOL)


STALL_TOL = 1e-10


def test_the_working_set_does_not_stall_at_round_off_on_a_large_instance():
    """K = 39,900 (matrix-free sub-problems): once the decrease of the dual objective q falls below q's own
    round-off, Armijo's test on q(new) − q(old) rejected every step and the sub-problem ended at max_iter with
    a relative violation of ~1e-9 (so did benchmarks/bench_svm.py's large case). The test now uses the change
    gᵀΔ + ½ΔᵀGΔ itself: certified optimal in a few working-set rounds."""
    p = paper_instance(100, 400, 256, seed=0)
    cs = att_svm_constraints(p, p.optimal_tokens(ties="first"))
    # (the Newton route itself: cholesky_min=0 leaves out the Cholesky active set that takes such instances first)
    raw = solve_frobenius(cs, tol=STALL_TOL, cholesky_min=0)  # (at the old code: max_iter, violation 7e-3, 30 s)
    assert raw.status == "optimal", (raw.info.get("violation"), raw.info.get("rounds"))
    assert raw.info["path"] == "working_set+matrix_free"
    cert = optimality_certificate(cs, raw.W, raw.dual, "fro")
    assert cert.relative_violation <= STALL_TOL and abs(cert.relative_gap) <= STALL_TOL
