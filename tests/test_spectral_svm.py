"""The spectral-norm attention SVM (docs/spec.md §3): ``min ‖W‖₂ s.t. (x_{iα_i} − x_it)ᵀ W z_i ≥ 1``.

Checked against cvxpy's ``sigma_max`` (an independent SDP solve, Clarabel), by its own certificate recomputed here
from (W, λ) without the library (σ_max, the nuclear norm of Σ λ_k a_k z_kᵀ, the margins), on infeasible and
rescaled instances, through ``fit_many``; the norm's pieces (value, dual norm, prox, subgradient) numerically; and
``norm="linf"`` against cvxpy's entrywise ``max(abs(W))``.
"""

from __future__ import annotations

import numpy as np
import pytest

from attsvm.datasets import paper_instance, random_instance
from attsvm.problem import AttentionProblem
from attsvm.svm import AttentionSVM, InfeasibleSVMError, att_svm_constraints, get_norm
from attsvm.svm.equivalence import equivalence_constraints
from attsvm.svm.norms import NORMS, SPECTRAL
from attsvm.svm.spectral import SpectralOptions, solve_spectral

# relative objective agreement with cvxpy (Clarabel, interior point)
CVXPY_RTOL = 1e-6
# the certificate tolerance the estimator is asked for (its default)
CERT_TOL = 1e-9

CASES = [
    ("paper", 6, 8, 10, 0),
    ("paper", 5, 4, 3, 1),  # d < T: many more rows than M has entries
    ("paper", 1, 5, 4, 0),  # one sequence: ‖W‖₂ = ‖W z‖ / ‖z‖, a vector SVM
    ("random", 4, 6, 8, 2),
    ("random-unnormalised", 6, 5, 7, 3),
    ("random-self-attention", 5, 6, 9, 4),
]


def _instance(kind: str, n: int, T: int, d: int, seed: int) -> AttentionProblem:
    if kind == "paper":
        return paper_instance(n, T, d, seed=seed)
    if kind == "random":
        return random_instance(n, T, d, seed=seed)
    if kind == "random-unnormalised":
        return random_instance(n, T, d, seed=seed, token_norm=None, query_norm=None)
    return random_instance(n, T, d, seed=seed, self_attention=True, query_index=0)


def _queries(problem: AttentionProblem) -> np.ndarray:
    """z_i: the given queries, or the query token x_{i,q} of self-attention."""
    return problem.Z if problem.Z is not None else problem.X[:, problem.query_index]


def _margins(problem: AttentionProblem, tokens: np.ndarray, W: np.ndarray) -> np.ndarray:
    """``(x_{iα_i} − x_it)ᵀ W z_i`` for t ≠ α_i (flat), computed here from the tokens."""
    X, Z = problem.X, _queries(problem)
    out = []
    for i, a in enumerate(tokens):
        for t in range(X.shape[1]):
            if t != a:
                out.append((X[i, a] - X[i, t]) @ W @ Z[i])
    return np.array(out)


def _dual_matrix(problem: AttentionProblem, tokens: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """``Σ_k λ_k a_k z_kᵀ`` computed here from the tokens."""
    X, Z = problem.X, _queries(problem)
    Y = np.zeros((X.shape[2], Z.shape[1]))
    for i, a in enumerate(tokens):
        for t in range(X.shape[1]):
            if t != a:
                Y += lam[i, t] * np.outer(X[i, a] - X[i, t], Z[i])
    return Y


def _assert_certified(problem: AttentionProblem, est: AttentionSVM) -> None:
    """The fit is optimal and its (W, λ) certify it, recomputed without the library: every margin ≥ 1 (to the
    tolerance), ‖Σ λ_k a_k z_kᵀ‖_* ≤ 1, λ ≥ 0, and 1ᵀλ = σ_max(W) within the reported gap."""
    assert est.status_ == "optimal"
    W, lam, tokens = est.W_, est.dual_coef_, est.tokens_
    sigma = np.linalg.svd(W, compute_uv=False)
    assert est.objective_ == pytest.approx(sigma[0], rel=1e-12)
    m = _margins(problem, tokens, W)
    assert m.min() >= 1.0 - 1e-8
    assert np.all(lam >= 0)
    nuc = np.linalg.svd(_dual_matrix(problem, tokens, lam), compute_uv=False).sum()
    assert nuc <= 1.0 + 1e-9
    assert abs(sigma[0] - lam.sum()) <= 2 * CERT_TOL * sigma[0]
    assert est.relative_gap_ <= CERT_TOL
    assert est.relative_violation_ <= CERT_TOL


@pytest.mark.parametrize("kind,n,T,d,seed", CASES)
def test_matches_cvxpy_and_certifies(kind: str, n: int, T: int, d: int, seed: int) -> None:
    problem = _instance(kind, n, T, d, seed)
    ours = AttentionSVM("spectral").fit(problem)
    ref = AttentionSVM("spectral", backend="cvxpy").fit(problem, ours.tokens_)
    assert ours.backend_ == "spectral"
    assert ref.backend_.startswith("cvxpy")
    _assert_certified(problem, ours)
    assert ref.W_ is not None
    assert abs(ours.objective_ - ref.objective_) <= CVXPY_RTOL * ref.objective_
    # cvxpy's own W is feasible and has (about) the same spectral norm: the problems are the same
    assert _margins(problem, ours.tokens_, ref.W_).min() >= 1.0 - 1e-6
    assert np.linalg.norm(ref.W_, 2) == pytest.approx(ours.objective_, rel=CVXPY_RTOL)


def test_paper_instance_matches_cvxpy() -> None:
    problem = paper_instance(15, 15, 20, seed=0)
    ours = AttentionSVM("spectral").fit(problem)
    ref = AttentionSVM("spectral", backend="cvxpy", solver="CLARABEL").fit(problem)
    _assert_certified(problem, ours)
    assert abs(ours.objective_ - ref.objective_) <= CVXPY_RTOL * ref.objective_
    # the spectral margin lies between the Frobenius and the nuclear ones: ‖W‖₂ ≤ ‖W‖_F ≤ ‖W‖_*
    fro = AttentionSVM("fro").fit(problem).objective_
    assert ours.objective_ <= fro * (1 + 1e-9)


def test_equality_rows_match_cvxpy() -> None:
    """A constraint set with equality rows (docs/spec.md §5's SVM-eq) through fit_constraints."""
    problem = paper_instance(4, 6, 8, seed=0)
    sets = np.zeros((4, 6), dtype=bool)
    sets[:, :2] = True
    cs_eq, _ = equivalence_constraints(problem, sets)
    ours = AttentionSVM("spectral").fit_constraints(cs_eq)
    ref = AttentionSVM("spectral", backend="cvxpy").fit_constraints(cs_eq)
    assert ours.status_ == "optimal"
    assert ours.relative_violation_ <= CERT_TOL and ours.relative_gap_ <= CERT_TOL
    assert abs(ours.objective_ - ref.objective_) <= CVXPY_RTOL * ref.objective_
    m = cs_eq.apply(ours.W_)
    assert np.abs(m[cs_eq.equality] - cs_eq.rhs[cs_eq.equality]).max() <= 1e-9


def test_infeasible_gets_a_farkas_certificate() -> None:
    problem = paper_instance(8, 3, 2, seed=0)  # d = 2 < n: 16 rows on a 2 × 2 W
    est = AttentionSVM("spectral").fit(problem)
    assert est.status_ == "infeasible"
    assert est.W_ is None
    lam = est.certificate_
    assert np.all(lam >= 0) and lam.sum() == pytest.approx(1.0)
    Y = _dual_matrix(problem, est.tokens_, lam)
    scale = sum(
        lam[i, t] * np.linalg.norm(problem.X[i, a] - problem.X[i, t]) * np.linalg.norm(problem.Z[i])
        for i, a in enumerate(est.tokens_)
        for t in range(problem.T)
        if t != a
    )
    assert np.linalg.norm(Y) <= 1e-9 * scale
    assert AttentionSVM("spectral", backend="cvxpy").fit(problem).status_ == "infeasible"
    with pytest.raises(InfeasibleSVMError):
        AttentionSVM("spectral", on_infeasible="raise").fit(problem)


@pytest.mark.parametrize("cx,cz", [(1e8, 1.0), (1.0, 1e8), (1e-8, 1.0), (1.0, 1e-8), (1e8, 1e-8), (1e-8, 1e-8)])
def test_scale_invariance(cx: float, cz: float) -> None:
    """X·c and Z·c' scale W by 1/(c c') and leave the status and the certificate unchanged."""
    problem = paper_instance(6, 8, 10, seed=1)
    base = AttentionSVM("spectral").fit(problem)
    scaled = AttentionProblem(problem.X * cx, problem.y, problem.head, Z=problem.Z * cz)
    est = AttentionSVM("spectral").fit(scaled, base.tokens_)
    assert est.status_ == base.status_ == "optimal"
    assert est.objective_ * cx * cz == pytest.approx(base.objective_, rel=1e-9)
    assert est.relative_gap_ <= CERT_TOL and est.relative_violation_ <= CERT_TOL


def test_fit_many_equals_fit() -> None:
    problems = [paper_instance(6, 8, 10, seed=s) for s in range(3)] + [paper_instance(8, 3, 2, seed=0)]
    many = AttentionSVM("spectral").fit_many(problems)
    assert len(many) == len(problems)
    for problem, est in zip(problems, many):
        one = AttentionSVM("spectral").fit(problem)
        assert est.status_ == one.status_
        assert est.norm == "spectral"
        if one.W_ is None:
            assert est.W_ is None and est.status_ == "infeasible"
            continue
        assert est.objective_ == pytest.approx(one.objective_, rel=1e-12)
        np.testing.assert_allclose(est.W_, one.W_, rtol=0, atol=1e-10 * np.abs(one.W_).max())
        _assert_certified(problem, est)


def test_summary_and_errors() -> None:
    est = AttentionSVM("spectral").fit(paper_instance(6, 8, 10, seed=0))
    assert "spectral norm" in est.summary() and "spectral-norm solver" in est.summary()
    assert est.to_dict()["params"]["norm"] == "spectral"
    with pytest.raises(ValueError, match="rank=2 is only defined for norm='nuc'"):
        AttentionSVM("spectral", rank=2).fit(paper_instance(6, 8, 10, seed=0))
    with pytest.raises(ValueError, match="tol must be"):
        SpectralOptions(tol=0.0)
    with pytest.raises(ValueError, match="max_iter must be"):
        solve_spectral(att_svm_constraints(paper_instance(2, 3, 4, seed=0)), max_iter=0)
    with pytest.raises(TypeError, match="cs must be a ConstraintSet"):
        solve_spectral("rows")  # type: ignore[arg-type]


# ---------------------------------------------------------------- the norm's pieces


def test_norm_registry_and_values(rng: np.random.Generator) -> None:
    assert get_norm("spectral") is SPECTRAL and NORMS["spectral"] is SPECTRAL
    assert SPECTRAL.degree == 1
    W = rng.standard_normal((5, 3))
    s = np.linalg.svd(W, compute_uv=False)
    assert SPECTRAL.value(W) == pytest.approx(s[0], rel=1e-14)
    assert SPECTRAL.objective(W) == pytest.approx(s[0], rel=1e-14)
    assert SPECTRAL.dual_norm(W) == pytest.approx(s.sum(), rel=1e-14)
    assert SPECTRAL.value(np.zeros((0, 3))) == 0.0
    # the dual objective of a norm objective: bᵀλ / max(1, ‖𝒜*(λ)‖_*)
    assert SPECTRAL.dual_objective(2.0, W) == pytest.approx(2.0 / max(1.0, s.sum()))


def test_dual_pair_holder(rng: np.random.Generator) -> None:
    """⟨Y, W⟩ ≤ ‖W‖₂‖Y‖_* for random pairs, with equality at W = U Vᵀ (Y = U Σ Vᵀ): the nuclear norm is the dual."""
    for _ in range(50):
        W = rng.standard_normal((4, 6))
        Y = rng.standard_normal((4, 6))
        assert np.vdot(Y, W) <= SPECTRAL.value(W) * SPECTRAL.dual_norm(Y) * (1 + 1e-12)
    U, _, Vt = np.linalg.svd(Y, full_matrices=False)
    Q = U @ Vt
    assert SPECTRAL.value(Q) == pytest.approx(1.0)
    assert np.vdot(Y, Q) == pytest.approx(SPECTRAL.dual_norm(Y), rel=1e-12)


@pytest.mark.parametrize("t", [0.1, 1.0, 3.0, 100.0])
def test_prox_optimality(rng: np.random.Generator, t: float) -> None:
    """P = prox_{t‖·‖₂}(Y) iff (Y − P)/t ∈ ∂‖P‖₂: ‖Y − P‖_* ≤ t and ⟨Y − P, P⟩ = t‖P‖₂; and P minimises
    t‖W‖₂ + ½‖W − Y‖_F² against random perturbations."""
    Y = 2.0 * rng.standard_normal((5, 4))
    P = SPECTRAL.prox(Y, t)
    G = Y - P
    assert SPECTRAL.dual_norm(G) <= t * (1 + 1e-10)
    assert np.vdot(G, P) == pytest.approx(t * SPECTRAL.value(P), rel=1e-10, abs=1e-12)

    def f(W: np.ndarray) -> float:
        return t * SPECTRAL.value(W) + 0.5 * float(np.sum((W - Y) ** 2))

    f0 = f(P)
    for _ in range(200):
        assert f(P + 1e-3 * rng.standard_normal(P.shape)) >= f0 - 1e-12
    if SPECTRAL.dual_norm(Y) <= t:
        assert np.all(P == 0)


def test_prox_matches_cvxpy(rng: np.random.Generator) -> None:
    cp = pytest.importorskip("cvxpy")
    Y = rng.standard_normal((4, 3))
    t = 0.7
    W = cp.Variable((4, 3))
    cp.Problem(cp.Minimize(t * cp.sigma_max(W) + 0.5 * cp.sum_squares(W - Y))).solve(solver="CLARABEL")
    P = SPECTRAL.prox(Y, t)

    def f(V: np.ndarray) -> float:
        return t * SPECTRAL.value(V) + 0.5 * float(np.sum((V - Y) ** 2))

    # ours is at least as good as the solver's (to its accuracy, about 1e-5 here) and close to it
    assert f(P) <= f(W.value) + 1e-12
    np.testing.assert_allclose(P, W.value, atol=1e-4)


def test_subgradient(rng: np.random.Generator) -> None:
    W = rng.standard_normal((5, 3))
    g = SPECTRAL.subgradient(W)
    assert np.vdot(g, W) == pytest.approx(SPECTRAL.value(W), rel=1e-12)
    assert SPECTRAL.dual_norm(g) == pytest.approx(1.0, rel=1e-12)
    # the subgradient inequality ‖V‖₂ ≥ ‖W‖₂ + ⟨g, V − W⟩
    for _ in range(50):
        V = W + rng.standard_normal(W.shape)
        assert SPECTRAL.value(V) >= SPECTRAL.value(W) + np.vdot(g, V - W) - 1e-12
    assert np.all(SPECTRAL.subgradient(np.zeros((2, 2))) == 0)


# ---------------------------------------------------------------- ℓ∞ is the entrywise max-norm margin


@pytest.mark.parametrize("n,T,d,seed", [(4, 5, 6, 0), (6, 8, 10, 1)])
def test_linf_is_the_entrywise_max_norm(n: int, T: int, d: int, seed: int) -> None:
    """``AttentionSVM("linf")`` solves ``min max_ij |W_ij|`` s.t. the constraints: cvxpy's ``max(abs(W))`` on the
    same rows has the same optimum, and the objective reported is max|W_ij|, not ‖W‖₂ (which differs here)."""
    cp = pytest.importorskip("cvxpy")
    problem = paper_instance(n, T, d, seed=seed)
    est = AttentionSVM("linf").fit(problem)
    assert est.status_ == "optimal"
    assert est.objective_ == pytest.approx(np.abs(est.W_).max(), rel=1e-12)
    cs = att_svm_constraints(problem, est.tokens_)
    ii, tt = np.nonzero(cs.mask)
    F = np.einsum("kd,ke->kde", cs.A[ii, tt], cs.Z[ii]).reshape(ii.size, -1)
    W = cp.Variable((d, d))
    prob = cp.Problem(cp.Minimize(cp.max(cp.abs(W))), [F @ cp.vec(W, order="C") >= 1.0])
    prob.solve(solver="CLARABEL")
    assert est.objective_ == pytest.approx(prob.value, rel=CVXPY_RTOL)
    assert _margins(problem, est.tokens_, est.W_).min() >= 1.0 - 1e-8
    spectral = AttentionSVM("spectral").fit(problem, est.tokens_).objective_
    assert abs(spectral - est.objective_) > 1e-3 * est.objective_
