"""docs/spec.md §5: selected sets, the SVM-equivalence W^eq, the finite component W_fin, the decomposition
fit, and the optimal attention mixture of convex heads — each against an independent cvxpy
formulation written here from the SPEC's pairwise definitions (all pairs t, τ), not from the
reference-token reduction the module uses."""

from __future__ import annotations

import itertools

import cvxpy as cp
import numpy as np
import pytest

from attsvm import AttentionProblem
from attsvm.datasets import paper_instance, random_instance
from attsvm.svm.equivalence import (
    SELECT_EPS,
    decomposition,
    equivalence_constraints,
    optimal_mixture,
    selected_sets,
    svm_eq,
    w_fin,
)

VIOL_TOL = 1e-8  # constraint violations of the certified solutions
GAP_RTOL = 1e-8  # relative duality gap
REF_RTOL = 1e-6  # objective agreement with the cvxpy formulation (Clarabel)
W_ATOL = 1e-4  # solution agreement with cvxpy (Frobenius: unique optimum)
CVX_SDP_RTOL = 1e-4  # accuracy of Clarabel on the nuclear-norm SDPs (it warns "inaccurate" on some)
MIX_LOSS_ATOL = 1e-8  # optimal mixture losses against cvxpy
MIX_ATOL = 2e-3  # optimal mixture weights against cvxpy (near one-hot optima are flat)


def _instance(seed: int, d: int = 8) -> tuple[AttentionProblem, np.ndarray, np.ndarray]:
    """A small problem with attention probabilities from a random W and their selected sets."""
    p = paper_instance(4, 5, d, seed=seed)
    W = np.random.default_rng(seed).normal(size=(d, d)) * 2.5
    s = p.softmax(W)
    return p, s, selected_sets(s, 0.02)


def _pairwise_cvxpy(p: AttentionProblem, O: np.ndarray, norm: str, probs: np.ndarray | None) -> np.ndarray:
    """min ‖W‖ with the pairs of docs/spec.md §5 as separate constraints (W^eq if probs is None, else W_fin).

    Equalities are written along a chain of consecutive members of O_i (linearly independent, so the
    interior-point solver stays well posed); inequalities for every (t ∈ O_i, τ ∉ O_i)."""
    d = p.d
    W = cp.Variable((d, d))
    cons = []
    for i in range(p.n):
        u = W @ p.queries[i]
        ins, outs = np.flatnonzero(O[i]), np.flatnonzero(~O[i])
        for a, b in itertools.pairwise(ins):  # a chain of pairs implies every pair inside O_i
            gap = (p.X[i, a] - p.X[i, b]) @ u
            rhs = 0.0 if probs is None else np.log(probs[i, a] / probs[i, b])
            cons.append(gap == rhs)
        for a in ins:
            if probs is None:
                for b in outs:
                    cons.append((p.X[i, a] - p.X[i, b]) @ u >= 1)
    obj = cp.norm(W, "fro") if norm == "fro" else cp.normNuc(W)
    cp.Problem(cp.Minimize(obj), cons).solve(solver="CLARABEL")
    return W.value


# --------------------------------------------------------------------------- selected sets
def test_selected_sets_threshold_and_top_token() -> None:
    s = np.array([[0.7, 0.2995, 0.0005], [0.4, 0.3, 0.3]])
    O = selected_sets(s, 1e-3)
    assert O.tolist() == [[True, True, False], [True, True, True]]
    # a threshold above every probability still keeps the most probable token
    assert selected_sets(s, 0.9).tolist() == [[True, False, False], [True, False, False]]
    assert SELECT_EPS == 1e-3
    assert selected_sets(np.stack([s, s]), 1e-3).shape == (2, 2, 3)


def test_selected_sets_errors() -> None:
    with pytest.raises(ValueError, match="eps must be in"):
        selected_sets(np.array([[0.5, 0.5]]), 1.5)
    with pytest.raises(ValueError, match="eps must be > 0"):
        selected_sets(np.array([[0.5, 0.5]]), 0.0)
    with pytest.raises(ValueError, match="probs must be probabilities"):
        selected_sets(np.array([[1.5, -0.5]]))
    with pytest.raises(ValueError, match=r"probs must have shape \(n, T\)"):
        selected_sets(np.array([0.5, 0.5]))


# --------------------------------------------------------------------------- W^eq
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("norm", ["fro", "nuc"])
def test_svm_eq_certified_and_matches_pairwise_cvxpy(seed: int, norm: str) -> None:
    p, s, O = _instance(seed)
    assert (O.sum(axis=1) > 1).any() and (~O).any()  # the instance has both kinds of constraints
    est = svm_eq(p, O, norm=norm, probs=s)
    assert est.status_ == "optimal"
    assert est.max_violation_ <= VIOL_TOL
    assert est.relative_gap_ <= GAP_RTOL
    logits = p.logits(est.W_)
    for i in range(p.n):  # every pair of docs/spec.md §5 holds, not just the reference-token rows
        inside, outside = logits[i, O[i]], logits[i, ~O[i]]
        assert np.ptp(inside) <= 1e-8 * max(1.0, np.abs(inside).max())
        if outside.size:
            assert inside.min() - outside.max() >= 1 - VIOL_TOL
    W_ref = _pairwise_cvxpy(p, O, norm, None)
    f = (lambda M: np.linalg.norm(M)) if norm == "fro" else (lambda M: np.linalg.svd(M, compute_uv=False).sum())
    # never worse than the interior-point reference; and not better than its (few 1e-5) accuracy
    # on these SDPs — our own duality gap above certifies the optimum to 1e-8
    assert f(est.W_) <= f(W_ref) * (1 + REF_RTOL)
    assert f(W_ref) - f(est.W_) <= CVX_SDP_RTOL * f(W_ref)
    if norm == "fro":  # strictly convex: the solution itself is unique
        assert np.abs(est.W_ - W_ref).max() <= W_ATOL


def test_svm_eq_does_not_depend_on_reference_token() -> None:
    p, s, O = _instance(3)
    i = int(np.argmax(O.sum(axis=1)))
    assert O[i].sum() >= 2
    ref_a = np.argmax(np.where(O, s, -1), axis=1)
    ref_b = ref_a.copy()
    ref_b[i] = np.flatnonzero(O[i] & (np.arange(p.T) != ref_a[i]))[0]
    Wa = svm_eq(p, O, reference=ref_a).W_
    Wb = svm_eq(p, O, reference=ref_b).W_
    assert np.abs(Wa - Wb).max() <= 1e-7


def test_single_token_sets_reduce_to_att_svm() -> None:
    from attsvm.svm import AttentionSVM

    p = paper_instance(5, 6, 10, seed=4)
    opt = p.optimal_tokens()
    O = np.zeros((p.n, p.T), bool)
    O[np.arange(p.n), opt] = True
    W_eq = svm_eq(p, O).W_
    W_mm = AttentionSVM("fro").fit(p, opt).W_
    assert np.abs(W_eq - W_mm).max() <= 1e-7


# --------------------------------------------------------------------------- W_fin
@pytest.mark.parametrize("norm", ["fro", "nuc"])
def test_w_fin_reproduces_log_probability_ratios(norm: str) -> None:
    p, s, O = _instance(5)
    est = w_fin(p, O, s, norm=norm)
    assert est.status_ == "optimal"
    assert est.max_violation_ <= VIOL_TOL and est.relative_gap_ <= GAP_RTOL
    logits = p.logits(est.W_)
    for i in range(p.n):
        idx = np.flatnonzero(O[i])
        gaps = logits[i, idx][:, None] - logits[i, idx][None, :]
        ratios = np.log(s[i, idx])[:, None] - np.log(s[i, idx])[None, :]
        assert np.abs(gaps - ratios).max() <= 1e-8
    W_ref = _pairwise_cvxpy(p, O, norm, s)
    f = (lambda M: np.linalg.norm(M)) if norm == "fro" else (lambda M: np.linalg.svd(M, compute_uv=False).sum())
    assert abs(f(est.W_) - f(W_ref)) <= REF_RTOL * f(W_ref)


def test_w_fin_of_a_trained_like_w_reproduces_softmax_inside_sets() -> None:
    """W = R·W^eq + W_fin has, for large R, exactly the probabilities s inside O (renormalised)."""
    p, s, O = _instance(6)
    W_eq, W_f = svm_eq(p, O, probs=s).W_, w_fin(p, O, s).W_
    probs = p.softmax(40.0 * W_eq + W_f)
    target = np.where(O, s, 0.0)
    target /= target.sum(axis=1, keepdims=True)
    assert np.abs(probs - target).max() <= 1e-9 + np.exp(-40.0 + 20)


# --------------------------------------------------------------------------- decomposition
def test_decomposition_recovers_scale(rng: np.random.Generator) -> None:
    p, s, O = _instance(7)
    W_eq, W_f = svm_eq(p, O, probs=s).W_, w_fin(p, O, s).W_
    dec = decomposition(7.5 * W_eq + W_f, W_eq, W_f)
    assert abs(dec.scale - 7.5) <= 1e-10
    assert dec.residual <= 1e-12
    assert dec.corr_eq_fin == pytest.approx(1.0, abs=1e-12)
    noise = rng.normal(size=W_eq.shape)
    dec2 = decomposition(7.5 * W_eq + W_f + noise, W_eq, W_f)
    assert dec2.residual > 0.01 and dec2.corr_eq < 1.0
    assert decomposition(3 * W_eq, W_eq).scale == pytest.approx(3.0)


def test_decomposition_errors() -> None:
    with pytest.raises(ValueError, match="W_eq must be non-zero"):
        decomposition(np.eye(3), np.zeros((3, 3)))
    with pytest.raises(ValueError, match=r"W_eq must have shape \(3, 3\)"):
        decomposition(np.eye(3), np.eye(2))


# --------------------------------------------------------------------------- constraint errors
def test_equivalence_constraint_errors() -> None:
    p, s, O = _instance(0)
    with pytest.raises(ValueError, match="sets must be a boolean array of shape"):
        equivalence_constraints(p, O[:2])
    bad = O.copy()
    bad[1] = False
    with pytest.raises(ValueError, match=r"O_i must be non-empty; sequences \[1\]"):
        equivalence_constraints(p, bad)
    with pytest.raises(TypeError, match="sets must be boolean"):
        equivalence_constraints(p, O * 0.5)
    with pytest.raises(ValueError, match="probs rows must sum to 1"):
        equivalence_constraints(p, O, s * 0.5)
    with pytest.raises(ValueError, match="reference must pick a token inside"):
        equivalence_constraints(p, O, reference=np.argmin(np.where(O, 1, 0), axis=1))
    with pytest.raises(TypeError, match="probs must be the"):
        w_fin(p, O, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="norm must be one of"):
        svm_eq(p, O, norm="l1")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- optimal mixture
def _mixture_cvxpy(p: AttentionProblem) -> np.ndarray:
    B = p.X @ p.head.weights  # (n, T, C)
    out = []
    for i in range(p.n):
        s = cp.Variable(p.T)
        logits = B[i].T @ s
        obj = cp.log_sum_exp(logits) - logits[int(p.y[i])]
        cp.Problem(cp.Minimize(obj), [s >= 0, cp.sum(s) == 1]).solve(solver="CLARABEL")
        out.append(s.value)
    return np.array(out)


@pytest.mark.parametrize("seed,token_norm", [(0, 1.0), (1, 2.0), (2, 4.0)])
def test_optimal_mixture_matches_cvxpy(seed: int, token_norm: float) -> None:
    # C ≥ T ≤ d: s ↦ Vᵀ X_iᵀ s is injective, so the optimal mixture is unique and comparable
    p = random_instance(8, 4, 6, seed=seed, head="multiclass", n_classes=5, token_norm=token_norm)
    mix = optimal_mixture(p)
    ref = _mixture_cvxpy(p)
    assert np.all(mix.kkt_residual <= 1e-8)  # our own optimality certificate (convex problem)
    B = p.X @ p.head.weights
    ref_logits = np.einsum("nt,ntc->nc", ref, B)
    ref_loss = np.log(np.exp(ref_logits).sum(1)) - ref_logits[np.arange(p.n), p.y.astype(int)]
    assert np.all(mix.loss <= ref_loss + MIX_LOSS_ATOL)
    assert np.abs(mix.weights - ref).max() <= MIX_ATOL
    assert np.array_equal(mix.weights > 1e-2, ref > 1e-2)  # the same predicted sets
    assert np.allclose(mix.weights.sum(axis=1), 1.0) and np.all(mix.weights >= 0)
    # optimal losses are no worse than any single token or the uniform mixture
    tok = -p.scores  # per-token cross-entropy (docs/spec.md §2)
    assert np.all(mix.loss <= tok.min(axis=1) + 1e-10)
    assert np.array_equal(mix.support, mix.weights >= 1e-6)
    assert mix.support.any(axis=1).all()
    if token_norm == 1.0:  # small logits: the best mixtures use several tokens (|O_i| > 1, docs/spec.md §5)
        assert (mix.support.sum(axis=1) > 1).any()


def test_optimal_mixture_errors() -> None:
    p = paper_instance(3, 4, 5, seed=0)
    with pytest.raises(ValueError, match="optimal_mixture needs a convex head"):
        optimal_mixture(p)
    q = random_instance(3, 4, 5, seed=0, head="multiclass")
    with pytest.raises(ValueError, match="tol must be > 0"):
        optimal_mixture(q, tol=-1.0)


# decomposition at extreme norms agrees with the unit-scale one to this (relative)
DECOMP_SCALE_RTOL = 1e-12


@pytest.mark.parametrize("c", [1e-300, 1e300, 1e308])
def test_decomposition_is_finite_at_extreme_norms(rng: np.random.Generator, c: float) -> None:
    # GD diverges in norm: R, the residual ratio and the correlations must not overflow or underflow
    W_eq, W_f = rng.standard_normal((2, 5, 5))
    W = 7.5 * W_eq + W_f + 0.1 * rng.standard_normal((5, 5))
    m = max(np.abs(W).max(), np.abs(W_f).max())
    W, W_f = W / m, W_f / m  # entries in [-1, 1], so c·W is finite
    W_eq = W_eq / np.abs(W_eq).max()  # and c·W_eq
    ref = decomposition(W, W_eq, W_f)
    big = decomposition(c * W, W_eq, c * W_f)  # R scales with W − W_fin
    assert big.scale == pytest.approx(c * ref.scale, rel=DECOMP_SCALE_RTOL)
    for name in ("residual", "corr_eq", "corr_eq_fin"):
        assert getattr(big, name) == pytest.approx(getattr(ref, name), rel=DECOMP_SCALE_RTOL), name
    small = decomposition(W, c * W_eq, W_f)  # R scales inversely with W^eq
    assert small.scale == pytest.approx(ref.scale / c, rel=DECOMP_SCALE_RTOL)
    assert small.residual == pytest.approx(ref.residual, rel=DECOMP_SCALE_RTOL)


def test_decomposition_of_float64_extremes() -> None:
    dec = decomposition(np.full((10, 10), 1e308), np.eye(10))
    assert dec.scale == pytest.approx(1e308, rel=DECOMP_SCALE_RTOL)
    assert dec.residual == pytest.approx(np.sqrt(90.0) / 10.0, rel=DECOMP_SCALE_RTOL)
    assert dec.corr_eq == pytest.approx(np.sqrt(10.0) / 10.0, rel=DECOMP_SCALE_RTOL)
    # W − W_fin = 2e308 entries overflows float64 though R = 5e307 does not
    dec = decomposition(np.full((3, 3), 1e308), np.full((3, 3), 4.0), np.full((3, 3), -1e308))
    assert dec.scale == pytest.approx(5e307, rel=DECOMP_SCALE_RTOL)
    assert dec.residual == pytest.approx(0.0, abs=DECOMP_SCALE_RTOL)
    assert dec.corr_eq_fin == pytest.approx(1.0, rel=DECOMP_SCALE_RTOL)
