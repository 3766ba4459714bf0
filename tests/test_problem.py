"""AttentionProblem, heads, datasets, tokens and metrics (docs/spec.md §1–2, §6)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from attsvm import AttentionProblem, Head, TieError, correlation, effective_rank, matrix_rank, nuc_fro_ratio
from attsvm._validation import as_float_array
from attsvm.datasets import gd_paths_instance, paper_instance, random_instance
from attsvm.problem import loss_fn
from attsvm.tokens import (
    constraint_mask,
    local_optimality_report,
    margins,
    pair_differences,
    selected_tokens,
    support_tokens,
)

EXACT = 1e-12  # float64 identities computed two ways


def _tiny(rng, n=3, T=4, d=5):
    X = rng.standard_normal((n, T, d))
    y = np.array([1.0, -1.0, 1.0])[:n]
    v = rng.standard_normal(d)
    Z = rng.standard_normal((n, d))
    return X, y, v, Z


# ---------------------------------------------------------------- validation
def test_shapes_and_queries(rng):
    X, y, v, Z = _tiny(rng)
    p = AttentionProblem(X, y, v, Z=Z)
    assert (p.n, p.T, p.d) == (3, 4, 5) and not p.self_attention
    np.testing.assert_array_equal(p.queries, Z)
    s = AttentionProblem(X, y, v, query_index=2)
    np.testing.assert_array_equal(s.queries, X[:, 2])
    assert s.self_attention and s.Z is None and s.query_index == 2
    assert AttentionProblem(X, y, v, query_index=-1).query_index == 3


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(X=np.zeros((3, 4))), "X must have 3 dimensions"),
        (dict(X=np.zeros((3, 1, 5))), "T >= 2"),
        (dict(y=np.array([1.0, 0.0, 1.0])), r"labels in \{-1, \+1\}"),
        (dict(y=np.ones(4)), r"one label per sequence: expected shape \(3,\)"),
        (dict(v=np.ones(4)), "head expects d=4"),
        (dict(Z=np.ones((3, 4))), r"Z must have shape \(3, 5\)"),
        (dict(Z=None), "exactly one of Z"),
        (dict(query_index=0), "exactly one of Z"),
        (dict(Z=None, query_index=7), r"query_index must be in \[0, 4\)"),
        (dict(Z=None, query_index=1.5), "query_index must be an integer"),
        (dict(loss="hinge"), "loss must be one of"),
    ],
)
def test_bad_inputs_are_named(rng, kwargs, match):
    X, y, v, Z = _tiny(rng)
    args = dict(X=X, y=y, v=v, Z=Z)
    args.update(kwargs)
    extra = {k: args.pop(k) for k in ("query_index", "loss") if k in args}
    with pytest.raises((ValueError, TypeError), match=match):
        AttentionProblem(args["X"], args["y"], args["v"], Z=args["Z"], **extra)


def test_nan_and_dtype_rejected(rng):
    X, y, v, Z = _tiny(rng)
    X[0, 1, 2] = np.nan
    with pytest.raises(ValueError, match="X must be finite, got 1 NaN/inf"):
        AttentionProblem(X, y, v, Z=Z)
    with pytest.raises(TypeError, match="X must hold real numbers"):
        AttentionProblem(np.array([["a"]]), y, v, Z=Z)


def test_the_finiteness_check_counts_entries_not_their_sum():
    # (as_float_array tests the sum first: a NaN or inf always makes it non-finite, and finite entries
    # whose sum overflows are still finite)
    big = np.full((2, 3), 1e308)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (the overflowing sum is silent)
        np.testing.assert_array_equal(as_float_array(big, "X"), big)  # the sum is inf, every entry finite
    for bad, count in ((np.inf, 1), (-np.inf, 1), (np.nan, 1)):
        arr = big.copy()
        arr[1, 2] = bad
        with pytest.raises(ValueError, match=f"X must be finite, got {count} NaN/inf"):
            as_float_array(arr, "X")
    both = np.array([np.inf, -np.inf, 1.0])  # (inf − inf: a NaN sum)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="X must be finite, got 2 NaN/inf"):
            as_float_array(both, "X")


# ---------------------------------------------------------------- scores and optimal tokens
def test_linear_scores_and_optimal(rng):
    X, y, v, Z = _tiny(rng)
    p = AttentionProblem(X, y, v, Z=Z)
    np.testing.assert_allclose(p.scores, y[:, None] * (X @ v), rtol=EXACT)
    np.testing.assert_array_equal(p.optimal_tokens(), np.argmax(y[:, None] * (X @ v), axis=1))


def test_ties_are_reported(rng):
    X, y, v, Z = _tiny(rng)
    X[1, 3] = X[1, 0]
    top = np.argmax(y[1] * (X[1] @ v))
    X[1, [0, 3]] = X[1, top]  # tokens 0, 3 and `top` share the maximal score
    p = AttentionProblem(X, y, v, Z=Z)
    with pytest.raises(TieError, match="sequence 1: tokens") as info:
        p.optimal_tokens()
    assert info.value.sequences == [1]
    assert p.optimal_tokens(ties="first")[1] == min(0, top)
    with pytest.raises(ValueError, match="ties must be one of"):
        p.optimal_tokens(ties="last")


def test_nonlinear_scores(rng):
    X, y, v, Z = _tiny(rng)
    V = rng.standard_normal((5, 4))
    p = AttentionProblem(X, y, Head.relu(V), Z=Z)
    h = np.maximum(X @ V, 0).sum(-1)
    np.testing.assert_allclose(p.scores, -np.log1p(np.exp(-y[:, None] * h)), rtol=1e-10)
    C = rng.standard_normal((5, 3))
    labels = np.array([0, 2, 1])
    m = AttentionProblem(X, labels, Head.multiclass(C), Z=Z)
    logits = X @ C
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    np.testing.assert_allclose(m.scores, logp[np.arange(3), :, labels], rtol=1e-10)
    with pytest.raises(ValueError, match=r"class indices in 0\.\.2"):
        AttentionProblem(X, np.array([0, 3, 1]), Head.multiclass(C), Z=Z)


def test_losses_stay_finite_at_huge_margins():
    u = np.array([-1e6, -50.0, 0.0, 50.0, 1e6])
    for name in ("logistic", "exponential", "correlation"):
        val = loss_fn(name, u)
        assert np.all(np.isfinite(val)), name
    np.testing.assert_allclose(loss_fn("logistic", np.array([0.0])), [np.log(2)], rtol=EXACT)
    assert loss_fn("logistic", np.array([1e6]))[0] == 0.0


def test_logits_softmax_batched(rng):
    X, y, v, Z = _tiny(rng)
    p = AttentionProblem(X, y, v, Z=Z)
    W = rng.standard_normal((2, 5, 5))
    L = p.logits(W)
    ref = np.stack([np.einsum("ntd,de,ne->nt", X, Wr, Z) for Wr in W])
    np.testing.assert_allclose(L, ref, rtol=1e-12)
    S = p.softmax(1e4 * W)  # huge norms: still a distribution, no NaN
    assert np.all(np.isfinite(S)) and np.allclose(S.sum(-1), 1.0)
    with pytest.raises(ValueError, match=r"W must have shape \(5, 5\)"):
        p.logits(np.ones((4, 4)))


def test_npz_round_trip(tmp_path, rng):
    p = random_instance(4, 5, 6, seed=3, head="relu", self_attention=True, query_index=1)
    p.to_npz(tmp_path / "p.npz")
    q = AttentionProblem.from_npz(tmp_path / "p.npz")
    np.testing.assert_array_equal(p.X, q.X)
    assert q.head.kind == "relu" and q.query_index == 1
    with pytest.raises(FileNotFoundError, match="does not exist"):
        AttentionProblem.from_npz(tmp_path / "missing.npz")


# ---------------------------------------------------------------- datasets
def test_paper_recipe_matches_published_draws():
    """Re-derive the published generator inline (docs/spec.md §6) and compare draw for draw."""
    n, T, d, seed = 6, 8, 10, 7
    g = torch.Generator().manual_seed(seed)
    v = torch.randn((d,), generator=g)
    v /= torch.norm(v)
    Y = 2 * torch.ones(n) * (torch.randn(n, generator=g) > 0) - 1
    X = torch.randn((n, T, d), generator=g)
    X /= torch.norm(X, dim=-1, keepdim=True)
    Z = torch.randn((n, d), generator=g)
    Z /= torch.norm(Z, dim=-1, keepdim=True)
    p = paper_instance(n, T, d, seed=seed)
    np.testing.assert_array_equal(p.X, X.double().numpy())
    np.testing.assert_array_equal(p.Z, Z.double().numpy())
    np.testing.assert_array_equal(p.v, v.double().numpy())
    np.testing.assert_array_equal(p.y, Y.double().numpy())
    assert p.X.dtype == np.float64
    np.testing.assert_allclose(np.linalg.norm(p.X, axis=-1), 1.0, rtol=1e-6)
    best = ((X @ v) * Y.view(-1, 1)).argmax(dim=-1).numpy()
    np.testing.assert_array_equal(p.optimal_tokens(), best)
    s = paper_instance(n, T, d, seed=seed, self_attention=True, query_index=0)
    np.testing.assert_array_equal(s.queries, p.X[:, 0])
    assert not np.array_equal(paper_instance(n, T, d, seed=seed + 1).X, p.X)
    with pytest.raises(ValueError, match="T must be >= 2"):
        paper_instance(6, 1, 10, seed=0)
    with pytest.raises(TypeError, match="seed must be an integer"):
        paper_instance(6, 8, 10, seed=1.5)


def test_gd_paths_and_random_instances():
    p = gd_paths_instance(3)
    assert (p.n, p.T, p.d) == (2, 3, 2) and np.all(p.y == 1)
    assert p.X[0, :, 0].mean() < 0 < p.X[1, :, 0].mean()  # the two clusters of the figure
    assert gd_paths_instance(5).T == 5
    with pytest.raises(ValueError, match="T must be 3 or 5"):
        gd_paths_instance(4)
    r = random_instance(5, 6, 7, seed=0, token_norm=2.0)
    np.testing.assert_allclose(np.linalg.norm(r.X, axis=-1), 2.0, rtol=1e-12)
    a, b = random_instance(5, 6, 7, seed=1), random_instance(5, 6, 7, seed=1)
    np.testing.assert_array_equal(a.X, b.X)
    mc = random_instance(5, 6, 7, seed=0, head="multiclass", n_classes=4)
    assert mc.head.n_classes == 4 and set(mc.y) <= {0, 1, 2, 3}
    with pytest.raises(ValueError, match="head must be one of"):
        random_instance(5, 6, 7, seed=0, head="tanh")


# ---------------------------------------------------------------- tokens
def test_pair_differences_and_margins(rng):
    p = random_instance(4, 5, 6, seed=2)
    alpha = np.array([0, 1, 2, 3])
    A, mask = pair_differences(p, alpha)
    assert mask.sum() == 4 * 4 and not mask[np.arange(4), alpha].any()
    np.testing.assert_allclose(A[1, 3], p.X[1, 1] - p.X[1, 3], rtol=EXACT)
    W = rng.standard_normal((6, 6))
    m = margins(p, alpha, W)
    L = p.logits(W)
    np.testing.assert_allclose(m[2, 0], L[2, 2] - L[2, 0], rtol=1e-10)
    assert np.isinf(m[np.arange(4), alpha]).all()
    np.testing.assert_allclose(margins(p, alpha, np.stack([W, 2 * W]))[1], 2 * m, rtol=1e-12)
    np.testing.assert_array_equal(selected_tokens(p, W), np.argmax(L, axis=1))
    with pytest.raises(ValueError, match=r"tokens must hold one token index per sequence: shape \(4,\)"):
        margins(p, np.array([0, 1]), W)
    with pytest.raises(ValueError, match=r"token indices in \[0, 5\)"):
        margins(p, np.array([0, 1, 2, 9]), W)


def test_support_and_local_optimality_report():
    p = random_instance(2, 3, 4, seed=0)
    g = p.scores
    alpha = p.optimal_tokens()
    m = np.full((2, 3), 2.5)
    m[np.arange(2), alpha] = np.inf
    m[np.arange(2), (alpha + 1) % 3] = [1.0, 1.0 + 1e-9]  # tight up to SUPPORT_TOL
    sup = support_tokens(m)
    assert sup.sum() == 2
    rep = local_optimality_report(p, alpha, sup, feasible=True)
    assert rep.locally_optimal  # optimal tokens beat every other token
    worst = np.argmin(g, axis=1)
    bad = local_optimality_report(p, worst, constraint_mask(2, 3, worst), feasible=True)
    assert not bad.locally_optimal and bad.failed_sequences == [0, 1]
    assert all(len(o) > 0 for o in bad.offending)
    assert not local_optimality_report(p, alpha, None, feasible=False).locally_optimal


# ---------------------------------------------------------------- metrics
def test_correlation_and_spectra(rng):
    A = rng.standard_normal((4, 4))
    assert correlation(A, 3 * A) == pytest.approx(1.0, abs=EXACT)
    assert correlation(A, -A) == pytest.approx(-1.0, abs=EXACT)
    assert correlation(np.zeros((4, 4)), A) == 0.0
    huge = 1e300 * A
    assert correlation(huge, A) == pytest.approx(1.0, abs=1e-12)  # no overflow at huge norms
    traj = np.stack([A, -A, 2 * A])
    np.testing.assert_allclose(correlation(traj, A), [1, -1, 1], atol=EXACT)
    u, w = rng.standard_normal((4, 1)), rng.standard_normal((1, 4))
    R1 = u @ w
    assert matrix_rank(R1) == 1 and matrix_rank(A) == 4 and matrix_rank(np.zeros((3, 3))) == 0
    assert nuc_fro_ratio(R1) == pytest.approx(1.0, abs=1e-12)
    assert nuc_fro_ratio(np.eye(4)) == pytest.approx(2.0, abs=1e-12)
    assert effective_rank(np.eye(3)) == pytest.approx(3.0, abs=1e-12)
    assert effective_rank(R1) == pytest.approx(1.0, abs=1e-9)
    with pytest.raises(ValueError, match="same shape"):
        correlation(np.ones((2, 2)), np.ones((3, 3)))
