"""Plugging a norm into the attention SVM (docs/spec.md §3, "Plugging in a norm").

A norm written here, from its value, dual norm and proximal map only, is passed to ``AttentionSVM`` as an instance
or by a name given to ``register_norm``; the generic solver (:mod:`attsvm.svm.generic`) must then reach what the
built-in solvers reach (Frobenius: the same W; ℓ∞: the same optimum), with the one certificate, and infeasible
instances must get the verified Farkas certificate. Bad norms are refused with one-line errors naming the argument.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from attsvm.datasets import paper_instance
from attsvm.problem import AttentionProblem
from attsvm.svm import AttentionSVM, InfeasibleSVMError
from attsvm.svm.equivalence import equivalence_constraints
from attsvm.svm.norms import FROBENIUS, L1, LINF, NUCLEAR, Norm, register_norm, registered_norms, unregister_norm

# the certificate tolerance (the estimator's default) and the agreement asked of the generic solver
CERT_TOL = 1e-9
MATCH_RTOL = 1e-6


class UserFrobenius(Norm):
    """‖W‖_F, self-dual, prox the block soft-threshold: written as a user would, from numpy only."""

    def value(self, W, svals=None):
        return float(np.sqrt((W * W).sum()))

    def dual_norm(self, Y):
        return float(np.sqrt((Y * Y).sum()))

    def prox(self, Y, t):
        nrm = float(np.sqrt((Y * Y).sum()))
        return Y * max(0.0, 1.0 - t / nrm) if nrm > 0 else np.zeros_like(Y)


class UserInvariantFrobenius(UserFrobenius):
    """The same norm declaring itself unitarily invariant (solved in the reduced coordinates W = U M Vᵀ)."""

    unitarily_invariant = True


def _project_l1_ball(y: np.ndarray, radius: float) -> np.ndarray:
    """Euclidean projection of the vector y onto {‖x‖₁ ≤ radius} (sort-based)."""
    a = np.abs(y)
    if a.sum() <= radius:
        return y.copy()
    u = np.sort(a)[::-1]
    css = np.cumsum(u)
    k = np.arange(1, u.size + 1)
    rho = np.flatnonzero(u - (css - radius) / k > 0)[-1]
    theta = (css[rho] - radius) / (rho + 1)
    return np.sign(y) * np.maximum(a - theta, 0.0)


class UserLinf(Norm):
    """Entrywise max|W_ij|; dual Σ|Y_ij|; prox by Moreau: Y − Proj_{‖·‖₁ ≤ t}(Y)."""

    def value(self, W, svals=None):
        return float(np.abs(W).max(initial=0.0))

    def dual_norm(self, Y):
        return float(np.abs(Y).sum())

    def prox(self, Y, t):
        return Y - _project_l1_ball(Y.ravel(), t).reshape(Y.shape)


class NoProx(Norm):
    """A norm that forgot its proximal map."""

    def value(self, W, svals=None):
        return float(np.abs(W).sum())

    def dual_norm(self, Y):
        return float(np.abs(Y).max())


@pytest.fixture(autouse=True)
def _clean_registry() -> Iterator[None]:
    """Names registered by a test are removed after it (the registry is process-wide)."""
    before = set(registered_norms())
    yield
    for name in set(registered_norms()) - before:
        unregister_norm(name)


def _certified(est: AttentionSVM) -> None:
    assert est.status_ == "optimal"
    assert est.backend_ == "generic"
    assert est.relative_gap_ <= CERT_TOL and est.relative_violation_ <= CERT_TOL
    assert np.all(est.dual_coef_[est.constraints_.inequality] >= 0)  # (equality rows: free sign)


# ---------------------------------------------------------------- (a) a user's Frobenius norm


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_user_frobenius_instance_matches_fro(seed: int) -> None:
    problem = paper_instance(6, 8, 10, seed=seed)
    ref = AttentionSVM("fro").fit(problem)
    est = AttentionSVM(norm=UserFrobenius()).fit(problem)
    _certified(est)
    np.testing.assert_array_equal(est.tokens_, ref.tokens_)
    assert est.objective_ == pytest.approx(ref.objective_, rel=MATCH_RTOL)
    assert np.linalg.norm(est.W_ - ref.W_) <= MATCH_RTOL * np.linalg.norm(ref.W_)
    # the certificate is the user's norm's: ‖W‖_F of the returned W, and the multipliers of ‖W‖ (not ½‖W‖²):
    # the fro multipliers divided by ‖W_mm‖ (𝒜*λ = W/‖W‖)
    assert est.objective_ == pytest.approx(np.linalg.norm(est.W_), rel=1e-12)
    np.testing.assert_allclose(est.dual_coef_, ref.dual_coef_ / ref.objective_, atol=1e-5 * ref.dual_coef_.max())


def test_invariant_user_norm_is_solved_in_reduced_coordinates() -> None:
    problem = paper_instance(6, 8, 10, seed=0)
    ref = AttentionSVM("fro").fit(problem)
    plain = AttentionSVM(UserFrobenius()).fit(problem)
    reduced = AttentionSVM(UserInvariantFrobenius()).fit(problem)
    _certified(reduced)
    assert plain.info_["reduced_shape"] == (10, 10)  # the user's coordinates: no subspace reduction
    assert reduced.info_["reduced_shape"] == (10, 6)  # W = U M Vᵀ, V spanning the n = 6 queries
    assert np.linalg.norm(reduced.W_ - ref.W_) <= MATCH_RTOL * np.linalg.norm(ref.W_)


def test_user_frobenius_with_equality_rows() -> None:
    """docs/spec.md §5's SVM-eq rows (equalities b = 0 and inequalities b = 1) through fit_constraints."""
    problem = paper_instance(4, 6, 8, seed=0)
    sets = np.zeros((4, 6), dtype=bool)
    sets[:, :2] = True
    cs_eq, _ = equivalence_constraints(problem, sets)
    ref = AttentionSVM("fro").fit_constraints(cs_eq)
    est = AttentionSVM(UserFrobenius()).fit_constraints(cs_eq)
    _certified(est)
    assert est.objective_ == pytest.approx(ref.objective_, rel=MATCH_RTOL)
    assert np.linalg.norm(est.W_ - ref.W_) <= MATCH_RTOL * np.linalg.norm(ref.W_)
    m = cs_eq.apply(est.W_)
    assert np.abs(m[cs_eq.equality]).max() <= 1e-9


# ---------------------------------------------------------------- (b) a user's entrywise ℓ∞ norm


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_user_linf_matches_linf(seed: int) -> None:
    problem = paper_instance(6, 8, 10, seed=seed)
    ref = AttentionSVM("linf").fit(problem)
    est = AttentionSVM(norm=UserLinf()).fit(problem)
    _certified(est)
    assert ref.status_ == "optimal"
    assert est.objective_ == pytest.approx(ref.objective_, rel=MATCH_RTOL)
    assert est.objective_ == pytest.approx(np.abs(est.W_).max(), rel=1e-12)
    # feasible in the user's units, recomputed here: every margin ≥ 1 up to round-off
    m = est.constraints_.apply(est.W_)[est.constraints_.mask]
    assert m.min() >= 1.0 - 1e-9
    # the dual bound, recomputed here: 1ᵀλ with Σ|𝒜*(λ)| ≤ 1
    Y = est.constraints_.adjoint(est.dual_coef_)
    assert np.abs(Y).sum() <= 1.0 + 1e-9
    assert est.dual_coef_.sum() >= est.objective_ * (1 - 2 * CERT_TOL)


def test_base_class_defaults_are_those_of_a_norm_objective() -> None:
    """objective/dual_objective of a norm that does not write them: ‖W‖ and bᵀλ / max(1, ‖Y‖°) (degree 1), or
    ½‖W‖² and bᵀλ − ½‖Y‖°² (degree 2); the subspace reduction only for a norm that declares invariance."""
    rng = np.random.default_rng(0)
    W = rng.standard_normal((4, 3))
    Y = 3.0 * rng.standard_normal((4, 3))
    u = UserLinf()
    assert u.degree == 1 and u.objective(W) == u.value(W)
    assert u.dual_objective(2.0, Y) == pytest.approx(2.0 / max(1.0, np.abs(Y).sum()))
    assert u.dual_objective(2.0, Y / (10 * np.abs(Y).sum())) == pytest.approx(2.0)
    sq = UserFrobenius(degree=2)
    assert sq.objective(W) == pytest.approx(0.5 * (W * W).sum())
    assert sq.dual_objective(2.0, Y) == pytest.approx(2.0 - 0.5 * (Y * Y).sum())
    assert sq.objective(W) == pytest.approx(FROBENIUS.objective(W))
    assert not u.unitarily_invariant and not L1.unitarily_invariant and not LINF.unitarily_invariant
    assert FROBENIUS.unitarily_invariant and NUCLEAR.unitarily_invariant
    with pytest.raises(ValueError, match="degree must be 1"):
        UserLinf(degree=3)


def test_degree_two_user_norm_is_certified() -> None:
    """A user's norm of degree 2 (objective ½‖W‖²): multipliers of ½‖W‖², the same W and certificate."""
    problem = paper_instance(6, 8, 10, seed=0)
    ref = AttentionSVM("fro").fit(problem)
    est = AttentionSVM(UserFrobenius(name="fro2", degree=2)).fit(problem)
    _certified(est)
    assert np.linalg.norm(est.W_ - ref.W_) <= MATCH_RTOL * np.linalg.norm(ref.W_)
    np.testing.assert_allclose(est.dual_coef_, ref.dual_coef_, atol=1e-5 * ref.dual_coef_.max())


# ---------------------------------------------------------------- (c) a registered name


def test_registered_name_through_fit_and_fit_many() -> None:
    register_norm("user-linf", UserLinf())
    problems = [paper_instance(6, 8, 10, seed=s) for s in range(2)]
    one = AttentionSVM(norm="user-linf").fit(problems[0])
    _certified(one)
    assert "user-linf norm" in one.summary() and "generic" in one.summary()
    assert one.to_dict()["params"]["norm"] == "user-linf"
    many = AttentionSVM("user-linf").fit_many(problems)
    assert len(many) == 2
    for problem, est in zip(problems, many):
        _certified(est)
        assert est.norm == "user-linf"
        assert est.objective_ == pytest.approx(AttentionSVM("linf").fit(problem).objective_, rel=MATCH_RTOL)
    assert AttentionSVM().set_params(norm="user-linf").norm == "user-linf"


def test_registered_builtin_instance_keeps_its_solver() -> None:
    register_norm("frobenius-again", FROBENIUS)
    problem = paper_instance(6, 8, 10, seed=0)
    est = AttentionSVM("frobenius-again").fit(problem)
    assert est.status_ == "optimal" and est.backend_ == "frobenius"
    assert AttentionSVM(FROBENIUS).fit(problem).backend_ == "frobenius"
    assert est.objective_ == pytest.approx(AttentionSVM("fro").fit(problem).objective_, rel=1e-12)


# ---------------------------------------------------------------- (d) infeasible instances


def test_duplicate_tokens_are_infeasible_with_a_certificate() -> None:
    p = paper_instance(6, 8, 10, seed=0)
    X = p.X.copy()
    X[:, 1] = X[:, 0]  # token 1 duplicates the selected token 0: the row a = x_0 − x_1 vanishes
    problem = AttentionProblem(X, p.y, p.head, Z=p.Z)
    tokens = np.zeros(6, dtype=np.int64)
    for norm in (UserFrobenius(), UserLinf()):
        est = AttentionSVM(norm).fit(problem, tokens)
        assert est.status_ == "infeasible"
        assert est.W_ is None
        lam = est.certificate_
        assert lam is not None and np.all(lam >= 0) and lam.sum() == pytest.approx(1.0)
        assert est.certificate_residual_ <= 1e-12
        with pytest.raises(InfeasibleSVMError):
            AttentionSVM(norm, on_infeasible="raise").fit(problem, tokens)


def test_too_few_dimensions_is_infeasible_with_a_certificate() -> None:
    problem = paper_instance(8, 3, 2, seed=0)  # d = 2 < n: 16 rows on a 2 × 2 W, no zero row
    est = AttentionSVM(UserLinf()).fit(problem)
    assert est.status_ == "infeasible"
    lam = est.certificate_
    assert np.all(lam >= 0) and lam.sum() == pytest.approx(1.0)
    cs = est.constraints_
    size = (lam * cs.feature_norms).sum()
    assert np.linalg.norm(cs.adjoint(lam)) <= 1e-9 * size
    assert AttentionSVM("linf").fit(problem).status_ == "infeasible"


# ---------------------------------------------------------------- (e) bad input


@pytest.mark.parametrize("bad", ["l3", 3.5, None, object(), True])
def test_unknown_norm_is_a_one_line_error_naming_norm(bad: object) -> None:
    problem = paper_instance(2, 3, 4, seed=0)
    with pytest.raises(ValueError, match=r"^norm must be one of 'fro', 'nuc', 'lp', 'l1', 'linf', 'spectral'") as exc:
        AttentionSVM(norm=bad).fit(problem)  # type: ignore[arg-type]
    assert "\n" not in str(exc.value) and "Norm instance" in str(exc.value)
    with pytest.raises(ValueError, match=r"^norm must be one of"):
        AttentionSVM().set_params(norm=bad)


def test_norm_without_prox_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^norm must implement value, dual_norm, prox; NoProx lacks prox$"):
        AttentionSVM(NoProx()).fit(paper_instance(2, 3, 4, seed=0))
    with pytest.raises(ValueError, match=r"^norm must implement"):
        register_norm("no-prox", NoProx())
    assert "no-prox" not in registered_norms()


@pytest.mark.parametrize("name", ["fro", "nuc", "lp", "l1", "linf", "spectral"])
def test_registering_a_builtin_name_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=rf"^name '{name}' is a built-in norm"):
        register_norm(name, UserFrobenius())
    assert name not in registered_norms()


def test_register_norm_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match=r"^norm must be an instance of attsvm.svm.norms.Norm"):
        register_norm("x", "fro")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^name must be a non-empty string"):
        register_norm("", UserFrobenius())
    register_norm("mine", UserFrobenius())
    with pytest.raises(ValueError, match=r"^name 'mine' is already registered"):
        register_norm("mine", UserLinf())
    register_norm("mine", UserLinf(), replace=True)
    assert isinstance(registered_norms()["mine"], UserLinf)
    with pytest.raises(ValueError, match=r"^backend='cvxpy' has no formulation of the norm"):
        AttentionSVM("mine", backend="cvxpy").fit(paper_instance(2, 3, 4, seed=0))
    unregister_norm("mine")
    with pytest.raises(ValueError, match=r"^norm must be one of"):
        AttentionSVM("mine").fit(paper_instance(2, 3, 4, seed=0))


def test_iteration_cap_reports_optimal_inaccurate_honestly() -> None:
    """Stopped early, the generic solver's answer is feasible but not certified: "optimal_inaccurate", never
    "optimal", with the certificate's own gap above tol."""
    problem = paper_instance(6, 8, 10, seed=1)
    est = AttentionSVM(UserLinf(), max_iter=40).fit(problem)
    assert est.status_ == "optimal_inaccurate"
    assert est.W_ is not None and est.relative_violation_ <= CERT_TOL
    assert est.relative_gap_ > CERT_TOL
    assert est.objective_ >= AttentionSVM("linf").fit(problem).objective_ * (1 - 1e-12)
