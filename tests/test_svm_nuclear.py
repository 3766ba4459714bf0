"""The nuclear-norm attention SVM (Att-SVM*, docs/spec.md §3) and its rank-constrained variant.

Checks: agreement with cvxpy (Clarabel, an interior-point SDP solve of the same problem), exact
feasibility, a tight duality gap recomputed here from the returned multipliers, the low-rank claim of
the svm-rank experiment, the variational identity, the rank-constrained solver, and infeasibility
certificates.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from attsvm import AttentionProblem
from attsvm.datasets import paper_instance, random_instance
from attsvm.metrics import matrix_rank
from attsvm.svm import (
    AttentionSVM,
    ConstraintSet,
    att_svm_constraints,
    feasible,
    reduce,
    solve_cvxpy,
)
from attsvm.svm.nuclear import (
    CONVEX_OPT_RTOL,
    NuclearOptions,
    balanced_factors,
    infeasibility_certificate,
    solve_nuclear,
    solve_nuclear_rank,
)

OBJ_RTOL = 1e-5  # objective agreement with cvxpy
VIOL_TOL = 1e-8  # max constraint violation
GAP_RTOL = 1e-8  # relative duality gap of our certificate
DEFAULT_SVM_TOL = 1e-9  # AttentionSVM's default certificate tolerance
DUAL_FEAS_TOL = 1e-8  # ‖𝒜*(λ)‖₂ ≤ 1 + this
IDENTITY_RTOL = 1e-12  # variational identity at balanced factors
CERT_TOL = 1e-8  # ‖𝒜*(λ)‖_F of an infeasibility certificate (relative)
NEWTON_GIVE_UP_STEPS = 10  # Newton steps allowed on a KKT system without a solution


def _nuc(W: np.ndarray) -> float:
    return float(np.linalg.svd(W, compute_uv=False).sum())


def _certify(cs: ConstraintSet, W: np.ndarray, lam: np.ndarray) -> tuple[float, float, float]:
    """Independent certificate: (violation, relative gap, ‖𝒜*λ‖₂) computed from scratch with numpy."""
    n, T, d = cs.A.shape
    margins = np.einsum("ntd,nd->nt", cs.A, cs.Z @ W.T)
    viol = np.where(cs.inequality, np.maximum(cs.rhs - margins, 0), np.abs(margins - cs.rhs) * cs.equality).max()
    lam = np.where(cs.inequality, np.maximum(lam, 0), lam) * cs.mask
    Y = np.einsum("nt,ntd,ne->de", lam, cs.A, cs.Z)
    spec = float(np.linalg.norm(Y, 2))
    dual = float((cs.rhs * lam).sum()) / max(1.0, spec)
    primal = _nuc(W)
    return float(viol), (primal - dual) / primal, spec


CASES = [  # (n, T, d, self_attention, seed)
    (4, 5, 6, False, 0),
    (6, 8, 10, False, 1),
    (5, 4, 7, True, 2),
    (3, 6, 2, False, 3),
    (8, 3, 5, True, 4),
    (10, 5, 12, False, 5),
]


@pytest.mark.parametrize("n,T,d,self_att,seed", CASES)
def test_matches_cvxpy_and_certifies(n: int, T: int, d: int, self_att: bool, seed: int) -> None:
    p = random_instance(n, T, d, seed=seed, self_attention=self_att)
    alpha = p.optimal_tokens(ties="first")
    if not feasible(p, alpha):
        pytest.skip("infeasible draw (covered by the infeasibility tests)")
    cs = att_svm_constraints(p, alpha)
    raw = solve_nuclear(cs)
    assert raw.status == "optimal"
    ref = solve_cvxpy(cs, "nuc", solver="CLARABEL")
    assert ref.status in ("optimal", "optimal_inaccurate")
    f_ours, f_ref = _nuc(raw.W), _nuc(ref.W)
    assert abs(f_ours - f_ref) <= OBJ_RTOL * f_ref
    viol, gap, spec = _certify(cs, raw.W, raw.dual)
    assert viol <= VIOL_TOL
    assert abs(gap) <= GAP_RTOL
    assert spec <= 1 + DUAL_FEAS_TOL
    # our optimum is never worse than the interior-point one (up to its own accuracy)
    assert f_ours <= f_ref * (1 + 1e-7)
    # some optimum lies in span{a} × span{z}: rank ≤ n (docs/spec.md §3)
    assert matrix_rank(raw.W) <= min(n, d)


def test_rows_repeated_across_sequences_are_solved_once() -> None:
    """A small vocabulary read with two queries: 300 rows, 24 distinct. fit solves the distinct ones (a
    repeated row only adds a singular direction to the polish) and certifies the whole set: the optimum of
    the independent interior point, and at most one nonzero multiplier per distinct row."""
    rng = np.random.default_rng(4)
    vocab, queries = rng.normal(size=(6, 5)), rng.normal(size=(2, 5))
    X = np.stack([vocab[rng.permutation(6)[:4]] for _ in range(100)])
    p = AttentionProblem(X, np.ones(100), rng.normal(size=5), Z=queries[np.arange(100) % 2])
    alpha = p.optimal_tokens()
    cs = att_svm_constraints(p, alpha)
    raw = solve_nuclear(cs)
    assert raw.status == "optimal"
    ref = solve_cvxpy(cs, "nuc", solver="CLARABEL")
    assert abs(_nuc(raw.W) - _nuc(ref.W)) <= OBJ_RTOL * _nuc(ref.W)
    viol, gap, spec = _certify(cs, raw.W, raw.dual)
    assert viol <= VIOL_TOL and abs(gap) <= GAP_RTOL and spec <= 1 + DUAL_FEAS_TOL
    # one key per (query, token pair): the nonzero multipliers name distinct rows
    i, t = np.nonzero(raw.dual)
    keys = [
        (
            i_ % 2,
            int(np.flatnonzero((vocab == X[i_, alpha[i_]]).all(1))[0]),
            int(np.flatnonzero((vocab == X[i_, t_]).all(1))[0]),
        )
        for i_, t_ in zip(i, t)
    ]
    assert len(keys) == len(set(keys)) >= 1


def test_estimator_nuclear_certificate_on_paper_instance() -> None:
    p = paper_instance(6, 8, 10, seed=0)
    est = AttentionSVM("nuc").fit(p)
    assert est.status_ == "optimal"
    assert est.max_violation_ <= VIOL_TOL
    assert est.relative_gap_ <= GAP_RTOL
    assert est.complementary_slackness_ <= 1e-7
    # the support (tight constraints) is exactly where the multipliers live
    assert np.all(est.dual_coef_[~est.support_] <= 1e-7 * est.dual_coef_.max())


def test_equality_rows_match_cvxpy() -> None:
    """General ConstraintSets (docs/spec.md §5's SVM-eq shape): equalities b = 0 plus inequalities b = 1."""
    p = random_instance(5, 6, 8, seed=11)
    n, T = p.n, p.T
    rng = np.random.default_rng(3)
    ref = np.zeros(n, dtype=np.int64)
    A = p.X[np.arange(n), ref][:, None, :] - p.X
    mask = np.ones((n, T), bool)
    mask[np.arange(n), ref] = False
    eq = mask & (rng.random((n, T)) < 0.3)
    cs = ConstraintSet(A, p.queries.copy(), mask, np.where(eq, 0.0, 1.0), eq)
    _assert_certified_and_matches_cvxpy(cs)


def _assert_certified_and_matches_cvxpy(cs: ConstraintSet) -> None:
    """Our nuclear solution is optimal, matches cvxpy's objective and carries a tight certificate."""
    raw = solve_nuclear(cs)
    assert raw.status == "optimal"
    cv = solve_cvxpy(cs, "nuc")
    assert abs(_nuc(raw.W) - _nuc(cv.W)) <= OBJ_RTOL * _nuc(cv.W)
    viol, gap, _ = _certify(cs, raw.W, raw.dual)
    assert viol <= VIOL_TOL and abs(gap) <= GAP_RTOL


def test_nonhomogeneous_equalities_wfin_shape() -> None:
    """Pure equality rows with arbitrary right-hand sides (the W_fin shape of docs/spec.md §5)."""
    p = random_instance(4, 5, 9, seed=5)
    n, T = p.n, p.T
    A = p.X[:, :1, :] - p.X
    mask = np.zeros((n, T), bool)
    mask[:, 1:3] = True
    rhs = np.random.default_rng(0).normal(size=(n, T)) * mask
    cs = ConstraintSet(A, p.queries.copy(), mask, rhs, mask.copy())
    _assert_certified_and_matches_cvxpy(cs)


def test_badly_scaled_instance_escapes_saddle() -> None:
    """A nearly infeasible draw (objective ≈ 30, d = 3) where a plain factorisation stalls at a saddle."""
    p = paper_instance(5, 15, 3, seed=2)
    cs = att_svm_constraints(p)
    raw = solve_nuclear(cs)
    assert raw.status == "optimal"
    cv = solve_cvxpy(cs, "nuc")
    assert abs(_nuc(raw.W) - _nuc(cv.W)) <= OBJ_RTOL * _nuc(cv.W)


# --------------------------------------------------------------------------- svm-rank (docs/spec.md §6)
def _rank_check(n: int, T: int, d: int, seeds: range, *, enough: int | None = None) -> int:
    checked = 0
    for seed in seeds:
        if enough is not None and checked >= enough:
            break
        p = paper_instance(n, T, d, seed=seed)
        alpha = p.optimal_tokens(ties="first")
        if not feasible(p, alpha):
            continue
        fro = AttentionSVM("fro").fit(p, alpha)
        if fro.status_ != "optimal":  # not this module's solver; its own tests cover it
            continue
        nuc = AttentionSVM("nuc").fit(p, alpha)
        assert nuc.status_ == "optimal", (n, T, d, seed, nuc.relative_gap_)
        r_fro, r_nuc = matrix_rank(fro.W_), matrix_rank(nuc.W_)
        assert r_nuc <= r_fro <= n, (n, T, d, seed, r_nuc, r_fro)
        checked += 1
    return checked


@pytest.mark.parametrize("n,T", [(5, 5), (10, 5), (5, 10)])
@pytest.mark.parametrize("d", [3, 10])
def test_svm_rank_nuclear_not_above_frobenius(n: int, T: int, d: int) -> None:
    assert _rank_check(n, T, d, range(30), enough=2) >= 1


@pytest.mark.slow
@pytest.mark.parametrize("n,T", [(5, 5), (10, 5), (15, 5), (5, 10), (5, 15)])
@pytest.mark.parametrize("d", [1, 2, 3, 4, 5, 10, 15, 20])
def test_svm_rank_all_settings(n: int, T: int, d: int) -> None:
    _rank_check(n, T, d, range(20))


# --------------------------------------------------------------------------- variational identity
def test_variational_identity_balanced_factors_attain_nuclear_norm(rng: np.random.Generator) -> None:
    for shape, rank in [((6, 6), 6), ((8, 5), 3), ((4, 9), 2)]:
        W = rng.normal(size=(shape[0], rank)) @ rng.normal(size=(rank, shape[1]))
        K, Q = balanced_factors(W)
        assert np.allclose(K @ Q.T, W, atol=1e-12)
        assert abs(0.5 * (np.sum(K**2) + np.sum(Q**2)) - _nuc(W)) <= IDENTITY_RTOL * _nuc(W) * 10
        # any other factorisation (K G, Q G^{-T}) is never below ‖W‖_*
        for _ in range(20):
            G = rng.normal(size=(K.shape[1], K.shape[1])) + 3 * np.eye(K.shape[1])
            K2, Q2 = K @ G, Q @ np.linalg.inv(G).T
            assert np.allclose(K2 @ Q2.T, W, atol=1e-9)
            assert 0.5 * (np.sum(K2**2) + np.sum(Q2**2)) >= _nuc(W) * (1 - 1e-12)


def test_variational_identity_on_the_svm_solution() -> None:
    p = paper_instance(6, 8, 10, seed=3)
    est = AttentionSVM("nuc").fit(p)
    K, Q = balanced_factors(est.W_, rank=est.rank_)
    assert np.allclose(K @ Q.T, est.W_, atol=1e-9)
    assert abs(0.5 * (np.sum(K**2) + np.sum(Q**2)) - est.objective_) <= 1e-9 * est.objective_


# --------------------------------------------------------------------------- rank-constrained
def test_rank_constrained_reaches_convex_optimum_when_rank_suffices() -> None:
    p = paper_instance(6, 8, 10, seed=0)
    cs = att_svm_constraints(p)
    convex = solve_nuclear(cs)
    r = int(matrix_rank(convex.W))
    for m in (r, r + 2, 10):
        raw = solve_nuclear_rank(cs, rank=m, seed=0, convex=convex)
        assert raw.info["reached_convex_optimum"], (m, raw.info["relative_excess"])
        # the random (non-convex-seeded) starts reach it too
        starts = np.array(raw.info["start_objectives"])
        assert np.all(np.abs(starts - raw.info["convex_objective"]) <= 1e-5 * raw.info["convex_objective"])
        assert abs(raw.info["objective"] - raw.info["convex_objective"]) <= CONVEX_OPT_RTOL * raw.info["objective"]
        assert raw.info["violation"] <= VIOL_TOL
        K, Q = raw.info["K"], raw.info["Q"]
        assert K.shape == (10, m) and Q.shape == (10, m)
        assert np.allclose(K @ Q.T, raw.W, atol=1e-9)


def test_rank_constrained_below_convex_rank_is_feasible_and_not_better() -> None:
    p = paper_instance(6, 8, 10, seed=0)
    cs = att_svm_constraints(p)
    convex = solve_nuclear(cs)
    r = int(matrix_rank(convex.W))
    assert r >= 2
    raw = solve_nuclear_rank(cs, rank=1, seed=0, convex=convex, restarts=3)
    assert raw.info["violation"] <= VIOL_TOL
    assert matrix_rank(raw.W) <= 1
    # a rank-1 point is feasible for the convex problem, so it cannot beat the convex optimum
    assert raw.info["objective"] >= raw.info["convex_objective"] * (1 - 1e-9)
    assert not raw.info["reached_convex_optimum"]


def test_estimator_rank_option() -> None:
    p = paper_instance(6, 8, 10, seed=1)
    est = AttentionSVM("nuc", rank=10).fit(p)
    assert est.reached_convex_optimum_ is True
    assert est.status_ == "optimal"


# --------------------------------------------------------------------------- infeasible instances
def _check_certificate(cs: ConstraintSet, lam: np.ndarray) -> None:
    assert np.all(lam[cs.inequality] >= 0)
    assert np.all(lam[~cs.mask] == 0)
    assert abs(float((cs.rhs * lam).sum()) - 1.0) <= 1e-9
    scale = float(np.sqrt(cs.gram_diag().max())) * float(np.abs(lam).sum())
    assert np.linalg.norm(cs.adjoint(lam)) <= CERT_TOL * max(1.0, scale)


def test_infeasible_duplicate_tokens() -> None:
    p = random_instance(3, 4, 5, seed=0)
    X = p.X.copy()
    X[1, 2] = X[1, 0]
    q = AttentionProblem(X, p.y, p.v, Z=p.Z)
    cs = att_svm_constraints(q, np.zeros(3, dtype=np.int64))
    raw = solve_nuclear(cs)
    assert raw.status == "infeasible" and raw.W is None
    _check_certificate(cs, raw.dual)


def test_infeasible_zero_query() -> None:
    p = random_instance(3, 4, 5, seed=1)
    Z = p.Z.copy()
    Z[2] = 0.0
    q = AttentionProblem(p.X, p.y, p.v, Z=Z)
    cs = att_svm_constraints(q, np.zeros(3, dtype=np.int64))
    raw = solve_nuclear(cs)
    assert raw.status == "infeasible"
    _check_certificate(cs, raw.dual)


def test_infeasible_dimension_too_small() -> None:
    # d = 1 with many tokens: one sequence cannot separate a middle token from both sides
    X = np.array([[[1.0], [2.0], [0.0]]])
    p = AttentionProblem(X, np.array([1.0]), np.array([1.0]), Z=np.array([[1.0]]))
    cs = att_svm_constraints(p, np.array([0]))  # token 0 sits between tokens 1 and 2
    raw = solve_nuclear(cs)
    assert raw.status == "infeasible"
    _check_certificate(cs, raw.dual)
    est = AttentionSVM("nuc").fit(p, np.array([0]))
    assert est.status_ == "infeasible"


def test_infeasibility_certificate_none_when_feasible() -> None:
    p = paper_instance(4, 4, 6, seed=0)
    assert infeasibility_certificate(att_svm_constraints(p)) is None


# --------------------------------------------------------------------------- errors
def test_bad_arguments() -> None:
    p = paper_instance(3, 4, 5, seed=0)
    cs = att_svm_constraints(p)
    with pytest.raises(TypeError, match="cs must be a ConstraintSet"):
        solve_nuclear(p)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tol must be > 0"):
        solve_nuclear(cs, tol=0.0)
    with pytest.raises(ValueError, match="max_iter must be >= 1"):
        solve_nuclear(cs, max_iter=0)
    with pytest.raises(TypeError, match="rank must be an integer"):
        solve_nuclear_rank(cs, rank=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rank must be >= 1"):
        solve_nuclear_rank(cs, rank=0)


def test_iteration_limit_is_reported_not_hidden() -> None:
    p = paper_instance(10, 6, 8, seed=0)
    cs = att_svm_constraints(p)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        raw = solve_nuclear(cs, max_iter=1, tol=1e-14)
    if raw.status != "optimal":
        assert raw.status == "optimal_inaccurate"
        assert any("relative gap" in str(x.message) for x in w)
        assert raw.info["violation"] <= VIOL_TOL  # still exactly feasible


# --------------------------------------------------------------------------- fast path and its fallback
FAST_PATH_CASES = [(6, 8, 10, 0), (15, 15, 20, 0), (12, 6, 9, 7), (20, 10, 16, 3)]


@pytest.mark.parametrize("n,T,d,seed", FAST_PATH_CASES)
def test_early_polish_matches_late_polish(n: int, T: int, d: int, seed: int) -> None:
    """The speculative early Newton polish (after a loose first ALM solve) gives the same certified
    optimum as the conservative schedule (polish only once the ALM gap is below 1e-2, patient Newton)."""

    p = paper_instance(n, T, d, seed=seed)
    cs = att_svm_constraints(p, p.optimal_tokens(ties="first"))
    fast = solve_nuclear(cs)
    slow = solve_nuclear(cs, NuclearOptions(polish_gap=1e-2, newton_patience=10**6, seed=1))
    for raw in (fast, slow):
        assert raw.status == "optimal"
        viol, gap, spec = _certify(cs, raw.W, raw.dual)
        assert viol <= VIOL_TOL and gap <= GAP_RTOL and spec <= 1 + DUAL_FEAS_TOL
    assert abs(_nuc(fast.W) - _nuc(slow.W)) <= GAP_RTOL * _nuc(slow.W)


def test_failed_polish_falls_back_to_more_alm(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the Newton polish fails (here: forced on its first two tries), the augmented Lagrangian
    continues and polishes again later; the answer is still certified optimal."""
    from attsvm.svm import _kkt

    p = paper_instance(15, 15, 20, seed=0)
    cs = att_svm_constraints(p, p.optimal_tokens(ties="first"))
    ref = solve_nuclear(cs)
    real = _kkt._polish
    calls: list[int] = []

    def flaky(*args, **kwargs):
        calls.append(1)
        return None if len(calls) <= 2 else real(*args, **kwargs)

    monkeypatch.setattr(_kkt, "_polish", flaky)
    raw = solve_nuclear(cs)
    assert len(calls) >= 3
    assert raw.status == "optimal"
    assert raw.info["outer_iterations"] > ref.info["outer_iterations"]
    viol, gap, spec = _certify(cs, raw.W, raw.dual)
    assert viol <= VIOL_TOL and gap <= GAP_RTOL and spec <= 1 + DUAL_FEAS_TOL
    assert abs(_nuc(raw.W) - _nuc(ref.W)) <= GAP_RTOL * _nuc(ref.W)


def _optimum_in_solver_units(p):  # type: ignore[no-untyped-def]
    """The reduced program of p at its optimal tokens, its optimum M, its rank r, the multipliers of the
    scaled rows and their support (the active set), for the Newton polish's tests."""
    from attsvm.svm import _factored

    cs = att_svm_constraints(p, p.optimal_tokens(ties="first"))
    reduction = reduce(cs)
    red = _factored._reduce(reduction)
    raw = solve_nuclear(cs)
    M = reduction.reduce_W(raw.W)
    lam = reduction.reduce_dual(raw.dual) * red.scale * red.mask  # multipliers of the scaled rows
    idx = np.flatnonzero((red.mask & (lam > 1e-9)).ravel())
    return red, M, int(matrix_rank(M)), lam, idx


def test_newton_gives_up_on_a_wrong_rank_guess(monkeypatch: pytest.MonkeyPatch) -> None:
    """A KKT system without a solution (the optimum's active set, one rank too few) makes Newton
    stagnate; it must stop after _NEWTON_PATIENCE steps instead of crawling on (the polish then
    corrects the guess)."""
    from attsvm.svm import _kkt

    red, M, r, lam, idx = _optimum_in_solver_units(paper_instance(15, 15, 20, seed=0))
    assert r >= 2
    K, Q = balanced_factors(M, rank=r - 1)
    steps: list[int] = []
    real = _kkt._newton_solver

    def counting(*args, **kwargs):
        step = real(*args, **kwargs)

        def counted(F: np.ndarray) -> np.ndarray:
            steps.append(1)
            return step(F)

        return counted

    monkeypatch.setattr(_kkt, "_newton_solver", counting)
    *_, res = _kkt._kkt_newton(red, idx, 1.1 * K, Q, lam.ravel()[idx], NuclearOptions(), max_newton=200)
    assert res > 1e-6  # no KKT point at this rank
    assert len(steps) <= NEWTON_GIVE_UP_STEPS  # without the stagnation test: 26 steps here
    # the guess with the right rank converges to round-off from the same start
    K, Q = balanced_factors(M, rank=r)
    *_, res = _kkt._kkt_newton(red, idx, 1.1 * K, Q, lam.ravel()[idx], NuclearOptions())
    assert res <= 1e-10


def test_failed_chord_steps_do_not_break_the_stagnation_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reused (chord) Jacobian whose step fails is refactorised without an accepted step; the
    stagnation test counts accepted steps, so a run of such failures cannot read past the residual
    history (it did: an IndexError in the hierarchy experiment, trial KQ-L2-s0000-0008)."""
    from attsvm.svm import _kkt

    red, M, r, lam, idx = _optimum_in_solver_units(paper_instance(15, 15, 20, seed=0))
    K, Q = balanced_factors(M, rank=r)
    failed: list[int] = []

    def failing_when_reused(factory):  # type: ignore[no-untyped-def]
        def make(*args, **kwargs):  # type: ignore[no-untyped-def]
            step = factory(*args, **kwargs)
            calls = [0]

            def solve(F: np.ndarray) -> np.ndarray:
                calls[0] += 1
                if calls[0] > 1:  # a chord step: no progress, so Newton refactorises
                    failed.append(1)
                    return np.zeros_like(step(F))
                return step(F)

            return solve

        return make

    monkeypatch.setattr(_kkt, "_newton_solver", failing_when_reused(_kkt._newton_solver))
    monkeypatch.setattr(_kkt, "_newton_solver_direct", failing_when_reused(_kkt._newton_solver_direct))
    # reuse the Jacobian after every full step (chord steps, as on large active sets); ftol = 0: Newton runs
    # until its steps stop helping, its iterations (accepted steps and failed chord steps) past the patience
    # while its accepted steps are fewer
    opt = NuclearOptions(chord_min_rows=0, chord_rate=1.0)
    *_, res = _kkt._kkt_newton(red, idx, 1.1 * K, Q, lam.ravel()[idx], opt, max_newton=40, ftol=0.0)
    assert len(failed) >= 2
    assert res <= 1e-10


# --------------------------------------------------------------------------- lean L-BFGS and the early Newton exit
LBFGS_GTOL = 1e-6  # round-off in f stops L-BFGS (ours and scipy's alike) near 1e-7 on this quadratic


@pytest.mark.parametrize("seed", range(3))
def test_lbfgs_reaches_the_minimiser_of_a_convex_quadratic_and_rosenbrock(seed: int) -> None:
    """Our compact-form L-BFGS (the ALM's inner solver) against closed-form minimisers."""
    from attsvm.svm._lbfgs import lbfgs as _lbfgs

    rng = np.random.default_rng(seed)
    B = rng.standard_normal((30, 30))
    H = B @ B.T + 0.1 * np.eye(30)  # condition number ~1e3-1e4
    c = rng.standard_normal(30)
    x, nit = _lbfgs(lambda x: (0.5 * x @ H @ x - c @ x, H @ x - c), np.zeros(30), gtol=LBFGS_GTOL, max_iter=5000)
    assert np.abs(H @ x - c).max() <= LBFGS_GTOL
    assert 0 < nit < 5000

    def rosen(x: np.ndarray) -> tuple[float, np.ndarray]:
        f = float(np.sum(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2))
        g = np.zeros_like(x)
        g[:-1] = -400 * x[:-1] * (x[1:] - x[:-1] ** 2) - 2 * (1 - x[:-1])
        g[1:] += 200 * (x[1:] - x[:-1] ** 2)
        return f, g

    x, _ = _lbfgs(rosen, rng.uniform(-1.5, 1.5, 6), gtol=1e-9, max_iter=5000)
    np.testing.assert_allclose(x, np.ones(6), atol=1e-6)


@pytest.mark.parametrize("n,T,d,seed", FAST_PATH_CASES)
def test_early_newton_exit_matches_full_rounds(
    monkeypatch: pytest.MonkeyPatch, n: int, T: int, d: int, seed: int
) -> None:
    """Stopping a Newton round early on a wrong-signed multiplier (then correcting the active set)
    gives the same certified optimum as converging every round to round-off."""
    from attsvm.svm import _kkt

    p = paper_instance(n, T, d, seed=seed)
    cs = att_svm_constraints(p, p.optimal_tokens(ties="first"))
    early_exits: list[int] = []
    real = _kkt._wrong_sign

    def spy(lam_s: np.ndarray, ineq_s: np.ndarray, rtol: float) -> bool:
        out = real(lam_s, ineq_s, rtol)
        early_exits.append(int(out))
        return out

    monkeypatch.setattr(_kkt, "_wrong_sign", spy)
    fast = solve_nuclear(cs)
    full = solve_nuclear(cs, NuclearOptions(early_exit_res=0.0))  # never exit early
    for raw in (fast, full):
        assert raw.status == "optimal"
        viol, gap, spec = _certify(cs, raw.W, raw.dual)
        assert viol <= VIOL_TOL and gap <= GAP_RTOL and spec <= 1 + DUAL_FEAS_TOL
    assert abs(_nuc(fast.W) - _nuc(full.W)) <= GAP_RTOL * _nuc(full.W)
    if (n, T, d, seed) in ((6, 8, 10, 0), (20, 10, 16, 3)):  # (paths depend on the reduced basis)
        assert sum(early_exits) >= 1  # the early exit is exercised on these instances


NEWTON_STEP_RTOL = 1e-8  # the two factorisations of the same KKT Jacobian (condition ~1/δ = 1e7)


@pytest.mark.parametrize("singular", [False, True])
@pytest.mark.parametrize("n,T,d,seed", [(6, 8, 10, 0), (15, 15, 20, 0), (12, 6, 9, 7)])
def test_direct_and_eliminated_newton_steps_agree(
    monkeypatch: pytest.MonkeyPatch, n: int, T: int, d: int, seed: int, singular: bool
) -> None:
    """The whole-Jacobian LU (small systems) and the elimination in the singular basis of Y (large
    ones) solve the same KKT system: their steps agree on a perturbed optimum, for any residual. With
    ``singular``, LAPACK's LDLᵀ reports a singular system and the eliminated solver takes its fallback
    (the pseudo-inverse of the rebuilt, unsymmetrised system)."""
    from attsvm.svm import _factored, _kkt

    if singular:
        monkeypatch.setattr(_kkt, "dsytrf", lambda a, **kw: (a, np.zeros(a.shape[0], dtype=np.int32), 1))

    p = paper_instance(n, T, d, seed=seed)
    cs = att_svm_constraints(p, p.optimal_tokens(ties="first"))
    reduction = reduce(cs)
    red = _factored._reduce(reduction)
    raw = solve_nuclear(cs)
    M = reduction.reduce_W(raw.W)
    lam = reduction.reduce_dual(raw.dual) * red.scale * red.mask
    idx = np.flatnonzero((red.mask & (lam > 1e-9 * lam.max())).ravel())
    K, Q = balanced_factors(M, rank=int(matrix_rank(M)))
    Fs = red.A.reshape(-1, red.A.shape[2])[idx]
    Zs = red.Z[idx // red.mask.shape[1]]
    rng = np.random.default_rng(seed)
    K = K + 1e-2 * rng.standard_normal(K.shape)
    lam_s = lam.ravel()[idx] * (1 + 1e-2 * rng.standard_normal(idx.size))
    for _ in range(3):
        F = rng.standard_normal(K.size + Q.size + idx.size)
        a = _kkt._newton_solver(Fs, Zs, K, Q, lam_s)(F)
        b = _kkt._newton_solver_direct(Fs, Zs, K, Q, lam_s)(F)
        assert np.abs(a - b).max() <= NEWTON_STEP_RTOL * np.abs(a).max()


def test_collapse_onto_the_zero_saddle_is_escaped() -> None:
    """paper_instance(15, 5, 10, seed=19): from the strictly feasible start the penalty is inactive,
    and the first quasi-Newton steps land exactly on K = Q = 0, where the gradient vanishes for every
    λ. The ALM must restart along 𝒜*(μ) (not report the infeasible zero matrix) and reach Clarabel's
    optimum."""
    from attsvm.svm import _alm, _factored

    p = paper_instance(15, 5, 10, seed=19)
    cs = att_svm_constraints(p, p.optimal_tokens(ties="first"))
    red = _factored._reduce(reduce(cs))
    K, Q = _alm._escape_origin(red, np.zeros_like(red.b), 1.0, 3)
    M = K @ Q.T
    assert np.any(M) and matrix_rank(M) == 3
    raw = solve_nuclear(cs)
    assert raw.status == "optimal"
    viol, gap, spec = _certify(cs, raw.W, raw.dual)
    assert viol <= VIOL_TOL and gap <= GAP_RTOL and spec <= 1 + DUAL_FEAS_TOL
    ref = solve_cvxpy(cs, "nuc")
    assert abs(_nuc(raw.W) - _nuc(ref.W)) <= OBJ_RTOL * _nuc(ref.W)


def test_infeasible_primal_is_never_reported_optimal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Weak duality makes the 'gap' of an infeasible primal negative: started on the saddle K = Q = 0
    with the saddle escape disabled, the solver ends at W = 0, which must not pass as optimal on its
    gap alone."""
    import attsvm.svm.nuclear as nuclear
    from attsvm.svm import _alm

    def zeros(red, p, *args, **kwargs):
        return np.zeros((red.A.shape[2], p)), np.zeros((red.Z.shape[1], p))

    monkeypatch.setattr(_alm, "_escape_origin", lambda red, lam, rho, p: zeros(red, p))
    # both paths (the lean one and scipy's, which solve_nuclear falls back to) start on the saddle
    monkeypatch.setattr(nuclear, "_initial_factors", zeros)
    p = paper_instance(15, 5, 10, seed=19)
    cs = att_svm_constraints(p, p.optimal_tokens(ties="first"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        raw = solve_nuclear(cs, max_iter=3)
    assert raw.info["violation"] > VIOL_TOL
    assert raw.status != "optimal"


def test_nearly_degenerate_infeasible_draw_is_certified() -> None:
    """random_instance(9, 13, 3, seed=2209) is infeasible (the feasibility LP agrees) with a nearly
    degenerate certificate, which an LP may miss at its tolerances; the one route (find_farkas: the
    LP, then the Frobenius dual ray, which does not depend on the norm) supplies a verified one, and
    it is checked here from scratch."""
    p = random_instance(9, 13, 3, seed=2209)
    alpha = p.optimal_tokens(ties="first")
    cs = att_svm_constraints(p, alpha)
    assert not feasible(p, alpha)
    raw = solve_nuclear(cs)
    assert raw.status == "infeasible" and raw.W is None
    lam = raw.dual
    assert np.all(lam[cs.inequality] >= 0) and float((cs.rhs * lam).sum()) > 0
    scale = float(np.sqrt(cs.gram_diag().max()))
    assert np.linalg.norm(cs.adjoint(lam)) <= CERT_TOL * scale * np.abs(lam).sum()


@pytest.mark.parametrize("norm", ["nuc", "fro"])
def test_homogeneous_rows_give_the_exact_zero_solution(norm: str) -> None:
    """b ≤ 0 on the inequalities and b = 0 on the equalities: W = 0 is feasible and has the least norm.
    The nuclear solver used to crawl towards it for 60 outer iterations and report optimal_inaccurate."""
    p = paper_instance(6, 5, 8, seed=1)
    c0 = att_svm_constraints(p, p.optimal_tokens(ties="first"))
    odd = np.arange(5) % 2 == 1
    cs = ConstraintSet(c0.A, c0.Z, c0.mask, np.where(odd, 0.0, -1.0) * np.ones((6, 1)), c0.mask & odd)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        svm = AttentionSVM(norm).fit_constraints(cs)
    assert svm.status_ == "optimal" and svm.max_violation_ <= VIOL_TOL
    assert np.abs(svm.W_).max() <= VIOL_TOL and svm.objective_ <= VIOL_TOL
    ref = AttentionSVM(norm, backend="cvxpy", tol=1e-6).fit_constraints(cs)
    assert ref.objective_ <= 1e-6


@pytest.mark.parametrize("n, T, d, seed", [(5, 10, 3, 56), (5, 15, 3, 40)])
def test_degenerate_svm_rank_instances_are_certified_by_the_subgradient_dual(n, T, d, seed):
    """Two degenerate svm-rank instances where Clarabel stops "inaccurate". The polish certifies both
    directly. On (5, 15, 3, 40), with the polish releasing every row of negative multiplier at once
    (``release_frac=0``, the rule before), the augmented Lagrangian stops "inaccurate", and the dual from the
    subgradient identity at the exactly feasible primal certifies it (nuclear.py, step 6). (5, 10, 3, 56)
    needed that route when small solves ran on two BLAS threads."""
    from attsvm.datasets import paper_instance
    from attsvm.svm import optimality_certificate
    from attsvm.svm.nuclear import solve_nuclear

    p = paper_instance(n, T, d, seed=seed)
    opt = p.optimal_tokens()
    f = AttentionSVM("nuc").fit(p, opt)
    assert f.status_ == "optimal" and f.info_.get("dual_polish") is None
    cert = optimality_certificate(f.constraints_, f.W_, f.dual_coef_, "nuc")  # recomputed independently
    assert cert.relative_gap <= DEFAULT_SVM_TOL and cert.relative_violation <= DEFAULT_SVM_TOL
    assert np.all(f.dual_coef_[f.constraints_.mask] >= 0)
    old = solve_nuclear(f.constraints_, release_frac=0.0)
    # (5, 10, 3, 56) takes either route depending on the rounding of the machine's BLAS kernels; both certify
    routes = ("subgradient",) if seed == 40 else (None, "subgradient")
    assert old.status == "optimal" and old.info.get("dual_polish") in routes
    cert = optimality_certificate(f.constraints_, old.W, old.dual, "nuc")
    assert cert.relative_gap <= DEFAULT_SVM_TOL and cert.relative_violation <= DEFAULT_SVM_TOL
    assert abs(cert.primal - f.objective_) <= OBJ_RTOL * f.objective_
    ref = AttentionSVM("nuc", backend="cvxpy").fit(p, opt)  # (Clarabel itself stops "inaccurate" here)
    assert abs(f.objective_ - ref.objective_) <= OBJ_RTOL * ref.objective_
