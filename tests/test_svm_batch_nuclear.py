"""AttentionSVM("nuc").fit_many: many nuclear SVMs by one batched interior point, instance by instance
equal to fit (docs/spec.md §3; attsvm.svm.batch_nuclear, attsvm.svm._sdp).

The interior point and fit's augmented Lagrangian are two independent implementations: they must
agree on the optimum, and the interior point alone must agree with cvxpy's Clarabel."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from attsvm.datasets import paper_instance, random_instance
from attsvm.problem import AttentionProblem
from attsvm.svm import AttentionSVM, batch
from attsvm.svm._base import ConstraintSet
from attsvm.svm._factored import _reduce
from attsvm.svm._sdp import ipm_many
from attsvm.svm.batch_nuclear import NUC_BATCH_MAX_K, NUC_BATCH_MAX_ROWS, _tighten
from attsvm.svm.reduction import reduce
from test_svm_batch import _duplicate_selected  # (a zero feature: an infeasible instance)
from test_svm_batch import _mixed as _mixed_instances

CERT_TOL = 1e-9  # the estimator's default tolerance: every "optimal" passes it
OBJ_RTOL = 1e-8  # ‖W‖_* of the batch against fit's (both certified to a relative gap of 1e-9)
# W of the batch against fit's, relative to max|W|: the nuclear optimum is unique on these generic
# instances but less well conditioned than the Frobenius one (a 1e-9 gap pins W to about its root)
W_RTOL = 1e-4
CVX_RTOL = 1e-6  # interior point against cvxpy's Clarabel (which stops at about 1e-8)
# the compiled interior point against the NumPy one: the same iterates but for round-off (Cholesky against
# LU for the Schur complement), which near a degenerate optimum is amplified to about 1e-6 in M and y
ITERATE_ATOL = 1e-10  # its first iterates (max_iter ≤ 5), relative to the largest entry
IPM_OBJ_RTOL = 1e-7  # its optimum: ‖M‖_* and bᵀy, both within the stall threshold 1e-7 of the optimum


@pytest.fixture(params=["compiled", "numpy"])
def compiled(request, monkeypatch):
    """Each test runs on both routes of the interior point: the compiled kernel (attsvm.svm._sdp_compiled,
    numba, the ``fast`` extra) and the NumPy one (without numba, or ATTSVM_COMPILED=0). Yields the
    ``compiled`` argument of ipm_many; fit_many chooses the same route through the environment."""
    if request.param == "compiled":
        pytest.importorskip("numba")
    monkeypatch.setenv("ATTSVM_COMPILED", "1" if request.param == "compiled" else "0")
    monkeypatch.setattr(batch, "_compiled_module", None)  # (chosen again under this environment)
    yield request.param == "compiled"
    monkeypatch.setattr(batch, "_compiled_module", None)


def _mixed() -> tuple[list[AttentionProblem], list[np.ndarray | None]]:
    # 40 of one shape (one group), degenerate K = 40 on 4 × 4, and (12, 16, 20): K = 180 > NUC_BATCH_MAX_K
    assert 12 * 15 > NUC_BATCH_MAX_K
    return _mixed_instances(40, 12, 3, (12, 16, 20), degenerate=True)


def _assert_same(a: AttentionSVM, b: AttentionSVM) -> None:
    assert a.status_ == b.status_
    np.testing.assert_array_equal(a.tokens_, b.tokens_)
    if b.status_ == "infeasible":
        assert a.W_ is None and a.certificate_ is not None
        np.testing.assert_allclose(a.certificate_, b.certificate_, atol=1e-12)
        return
    assert b.status_ == "optimal"
    assert a.relative_violation_ <= CERT_TOL and a.relative_gap_ <= CERT_TOL
    assert a.objective_ == pytest.approx(b.objective_, rel=OBJ_RTOL)
    np.testing.assert_allclose(a.W_, b.W_, rtol=0, atol=W_RTOL * np.abs(b.W_).max())
    assert a.rank_ == b.rank_


def test_fit_many_equals_fit_instance_by_instance(compiled):
    probs, toks = _mixed()
    many = AttentionSVM("nuc").fit_many(probs, toks)
    assert len(many) == len(probs)
    for p, t, a in zip(probs, toks, many):
        _assert_same(a, AttentionSVM("nuc").fit(p, t))
    batched = [m.info_.get("path") == "batched-ipm" for m in many]
    assert all(m.info_["route"] == ("compiled" if compiled else "numpy") for m, b in zip(many, batched) if b)
    small = [m.status_ == "optimal" and p.n * (p.T - 1) <= NUC_BATCH_MAX_K for p, m in zip(probs, many)]
    assert sum(small) >= 70
    assert batched == small  # every feasible small one went through the batch, nothing else did
    assert all(m.backend_ == "nuclear" and m.info_["solver"] == "ipm-hkm-batched" for m, b in zip(many, batched) if b)


def _small_vocabulary(n: int, seed: int) -> AttentionProblem:
    """n sequences of 4 distinct tokens from a vocabulary of 6, read with one of two queries: n·3 rows, at
    most 2·6·5 distinct ones (the same pair of tokens under the same query is the same row in every
    sequence). Every label +1, so every sequence ranks the vocabulary alike and the SVM is feasible."""
    rng = np.random.default_rng(seed)
    vocab = rng.normal(size=(6, 5))
    X = np.stack([vocab[rng.permutation(6)[:4]] for _ in range(n)])
    queries = rng.normal(size=(2, 5))
    return AttentionProblem(X, np.ones(n), rng.normal(size=5), Z=queries[np.arange(n) % 2])


def test_rows_repeated_across_sequences_are_solved_once(compiled):
    """Many rows, few distinct ones: the batch drops the repeats (across sequences too) before its limit
    decides, and certifies what fit certifies. (These programs are degenerate — 24 distinct rows on a
    5 × 2 block — and the NumPy route's interior point stalls on one of them, which then goes to fit.)"""
    probs = [_small_vocabulary(120, seed=s) for s in range(3)]
    assert NUC_BATCH_MAX_K < 120 * 3 <= NUC_BATCH_MAX_ROWS
    many = AttentionSVM("nuc").fit_many(probs)
    batched = [a.info_.get("path") == "batched-ipm" for a in many]
    assert sum(batched) >= 2
    for p, a in zip(probs, many):
        _assert_same(a, AttentionSVM("nuc").fit(p))


def test_a_failing_instance_does_not_change_the_others():
    good = [paper_instance(6, 8, 10, seed=s) for s in range(8)]
    toks = [p.optimal_tokens(ties="first") for p in good]
    bad = _duplicate_selected(good[3], toks[3])
    alone = AttentionSVM("nuc").fit_many(good, toks)
    mixed = AttentionSVM("nuc").fit_many([*good[:5], bad, *good[5:]], [*toks[:5], toks[3], *toks[5:]])
    assert mixed[5].status_ == "infeasible" and mixed[5].certificate_ is not None
    for a, b in zip(alone, [*mixed[:5], *mixed[6:]]):
        assert b.info_["path"] == "batched-ipm"
        np.testing.assert_array_equal(a.W_, b.W_)  # bit for bit: instances never mix


def _stacked(css: list[ConstraintSet]):
    """The reduced rows of instances of one shape, stacked as ipm_many takes them."""
    out = []
    for cs in css:
        red = _reduce(reduce(cs))
        idx = np.flatnonzero(red.mask.ravel())
        T = red.mask.shape[1]
        out.append((red.A.reshape(-1, red.A.shape[2])[idx], red.Z[idx // T], red.b.ravel()[idx], red.ineq.ravel()[idx]))
    return [np.stack(x) for x in zip(*out)], out


def _svm_eq_shaped(seed: int, eq_share: float = 0.3, rhs: str = "unit") -> ConstraintSet:
    """docs/spec.md §5's SVM-eq / W_fin shapes: equality rows mixed with inequalities."""
    p = random_instance(5, 6, 8, seed=seed)
    n, T = p.n, p.T
    rng = np.random.default_rng(seed)
    ref = np.zeros(n, dtype=np.int64)
    A = p.X[np.arange(n), ref][:, None, :] - p.X
    mask = np.ones((n, T), bool)
    mask[np.arange(n), ref] = False
    eq = mask & (rng.random((n, T)) < eq_share)
    b = np.where(eq, 0.0, 1.0) if rhs == "unit" else np.where(mask, rng.normal(size=(n, T)), 0.0)
    return ConstraintSet(A, p.queries.copy(), mask, b, eq)


def test_interior_point_matches_cvxpy_with_equality_rows(compiled):
    pytest.importorskip("cvxpy")
    from attsvm.svm.cvxpy_backend import solve_cvxpy

    css = [_svm_eq_shaped(20 + s) for s in range(3)]  # one shape: equalities b = 0, inequalities b = 1
    (Fs, Zs, b, ineq), rows = _stacked(css)
    assert (~ineq).any() and ineq.any()
    M, y, converged, _ = ipm_many(Fs, Zs, b, ineq, compiled=compiled)
    for j, cs in enumerate(css):
        Mt = _tighten(*rows[j], y[j], M[j])
        ours = np.linalg.svd(Mt, compute_uv=False).sum() * reduce(cs).global_scale
        ref = np.linalg.svd(solve_cvxpy(cs, "nuc", solver="CLARABEL").W, compute_uv=False).sum()
        assert ours == pytest.approx(ref, rel=CVX_RTOL)
        # the dual: y ≥ 0 on the inequality rows, ‖Σ y_k a_k z_kᵀ‖₂ ≤ 1, bᵀy = the optimum (reduced units)
        F, Z, bb, iq = rows[j]
        assert np.all(y[j][iq] >= 0)
        assert np.linalg.norm(F.T @ (y[j][:, None] * Z), 2) <= 1 + 1e-9
        assert bb @ y[j] == pytest.approx(np.linalg.svd(Mt, compute_uv=False).sum(), rel=1e-8)
    assert converged.all()


def test_a_singular_instance_leaves_the_interior_point_alone(compiled):
    # one instance whose rows are all ±(one row), with right-hand side 1 (aᵀMz ≥ 1 and −aᵀMz ≥ 1:
    # infeasible, a rank-one Schur complement) inside a stack of feasible ones: the others converge
    # exactly as without it
    css = [
        AttentionSVM("nuc").fit(paper_instance(3, 4, 5, seed=s)).constraints_ for s in range(4)
    ]  # (the constraint sets of feasible instances)
    (Fs, Zs, b, ineq), _ = _stacked(css)
    assert np.all(b > 0)
    Fs_bad, Zs_bad = Fs.copy(), Zs.copy()
    Fs_bad[1] = Fs[1][0]
    Zs_bad[1] = Zs[1][0]
    Fs_bad[1, ::2] *= -1
    M0, y0, c0, _ = ipm_many(Fs, Zs, b, ineq, compiled=compiled)
    M1, y1, c1, _ = ipm_many(Fs_bad, Zs_bad, b, ineq, compiled=compiled)  # (every b_k > 0)
    assert c0.all() and not c1[1] and (M1[1] == 0).all() and (y1[1] == 0).all()  # (no point: zeros)
    for j in (0, 2, 3):
        assert c1[j]
        np.testing.assert_array_equal(M0[j], M1[j])
        np.testing.assert_array_equal(y0[j], y1[j])


@pytest.mark.parametrize("cx,cz", [(1e8, 1.0), (1e-8, 1.0), (1.0, 1e-8), (1e6, 1e6)])
def test_fit_many_is_invariant_to_scale(cx, cz):
    probs = [paper_instance(6, 8, 10, seed=s) for s in range(6)]
    scaled = [AttentionProblem(p.X * cx, p.y, p.v, Z=p.Z * cz) for p in probs]
    base = AttentionSVM("nuc").fit_many(probs)
    many = AttentionSVM("nuc").fit_many(scaled, [p.optimal_tokens() for p in probs])
    for a, b in zip(many, base):
        assert a.status_ == b.status_ == "optimal" and a.info_["path"] == b.info_["path"] == "batched-ipm"
        np.testing.assert_allclose(a.W_ * (cx * cz), b.W_, rtol=0, atol=W_RTOL * np.abs(b.W_).max())


def _with_repeats(p: AttentionProblem, alpha: np.ndarray) -> AttentionProblem:
    """Every sequence repeats one of its non-selected tokens: two identical constraint rows each."""
    X = p.X.copy()
    for i in range(p.n):
        t = [u for u in range(p.T) if u != alpha[i]]
        X[i, t[1]] = X[i, t[0]]
    return AttentionProblem(X, p.y, p.v, Z=p.Z)


def _with_mirror(p: AttentionProblem, alpha: np.ndarray) -> AttentionProblem:
    """Sequence 0 gets the mirror x_s = 2x_α − x_t of a token: rows a and −a, infeasible."""
    X = p.X.copy()
    t = [u for u in range(p.T) if u != alpha[0]]
    X[0, t[1]] = 2 * X[0, alpha[0]] - X[0, t[0]]
    return AttentionProblem(X, p.y, p.v, Z=p.Z)


def test_repeated_rows_and_batches_of_only_singular_instances(compiled):
    base = [paper_instance(6, 8, 10, seed=s) for s in range(6)]
    toks = [p.optimal_tokens(ties="first") for p in base]
    repeats = [_with_repeats(p, a) for p, a in zip(base, toks)]
    mirrored = [_with_mirror(p, a) for p, a in zip(base, toks)]
    # repeated rows (a singular Schur complement as given) are solved once each, in the batch
    for p, a, m in zip(repeats, toks, AttentionSVM("nuc").fit_many(repeats, toks)):
        assert m.info_["path"] == "batched-ipm"
        _assert_same(m, AttentionSVM("nuc").fit(p, a))
    # a constraint set alone whose Schur complement LAPACK refuses (equality rows a and −a, b = 0:
    # feasible but dependent) leaves the batch and comes back as fit_constraints returns it
    cs = _svm_eq_shaped(5)
    A, eq = cs.A.copy(), cs.equality.copy()
    A[0, 2], eq[0, 1:3] = -A[0, 1], True
    dep = ConstraintSet(A, cs.Z, cs.mask, np.where(eq, 0.0, cs.rhs), eq & cs.mask)
    (m,) = AttentionSVM("nuc").fit_many_constraints([dep])
    _assert_same(m, AttentionSVM("nuc").fit_constraints(dep))
    # a batch whose every instance is infeasible (opposite rows): each comes back as fit returns it
    for group in (mirrored[:1], mirrored):
        for p, a, m in zip(group, toks, AttentionSVM("nuc").fit_many(group, toks[: len(group)])):
            assert m.status_ == "infeasible"
            _assert_same(m, AttentionSVM("nuc").fit(p, a))


def _svm_rank_stacks() -> list[tuple[np.ndarray, ...]]:
    """Stacks of svm-rank's shapes: K ≫ N ((5, 15, 2): 70 rows on 2 × 2), K ≈ N ((6, 8, 10)), and
    equality rows (docs/spec.md §5's shapes)."""
    stacks = []
    for n, T, d in ((5, 15, 2), (6, 8, 10)):
        fits = [AttentionSVM().fit(paper_instance(n, T, d, seed=s)) for s in range(60)]
        css = [f.constraints_ for f in fits if f.status_ == "optimal"]  # (the feasible ones)
        shapes = {}
        for cs in css:
            red = _reduce(reduce(cs))
            shapes.setdefault((red.A.shape[2], red.Z.shape[1]), []).append(cs)
        stacks.append(_stacked(max(shapes.values(), key=len))[0])
    stacks.append(_stacked([_svm_eq_shaped(200 + s) for s in range(12)])[0])
    return stacks


def test_compiled_interior_point_follows_the_numpy_one(monkeypatch):
    # the same method (attsvm.svm._sdp_compiled): the same iterates to round-off in the first iterations,
    # and the same optimum; the last iterates of a degenerate optimum amplify round-off (Cholesky against
    # LU, another BLAS) too much for a closer comparison of M and y there
    sdpc = pytest.importorskip("attsvm.svm._sdp_compiled")
    calls = []
    kernel = sdpc.solve_stack
    monkeypatch.setattr(sdpc, "solve_stack", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    for Fs, Zs, b, ineq in _svm_rank_stacks():
        assert len(Fs) >= 10
        for max_iter in (1, 2, 5):
            Mc, yc, _, ic = ipm_many(Fs, Zs, b, ineq, max_iter=max_iter, compiled=True)
            Mn, yn, _, i_n = ipm_many(Fs, Zs, b, ineq, max_iter=max_iter, compiled=False)
            np.testing.assert_array_equal(ic, i_n)
            np.testing.assert_allclose(Mc, Mn, rtol=0, atol=ITERATE_ATOL * np.abs(Mn).max())
            np.testing.assert_allclose(yc, yn, rtol=0, atol=ITERATE_ATOL * np.abs(yn).max())
        Mc, yc, cc, ic = ipm_many(Fs, Zs, b, ineq, compiled=True)
        Mn, yn, cn, i_n = ipm_many(Fs, Zs, b, ineq, compiled=False)
        assert len(calls) == 4  # (the compiled route took every compiled=True call, and no other)
        calls.clear()
        # every instance stops at an optimum on both routes (converged, or stalled below STALL_BELOW: on
        # the degenerate K ≫ N instances one route may converge where the other stalls an iteration later)
        assert (np.abs(Mc).max(axis=(1, 2)) > 0).all() and (np.abs(Mn).max(axis=(1, 2)) > 0).all()
        assert cc.sum() >= 0.8 * len(Fs) and cn.sum() >= 0.8 * len(Fs) and np.abs(ic - i_n).max() <= 3
        nuc_c = np.linalg.svd(Mc, compute_uv=False).sum(axis=1)
        nuc_n = np.linalg.svd(Mn, compute_uv=False).sum(axis=1)
        np.testing.assert_allclose(nuc_c, nuc_n, rtol=IPM_OBJ_RTOL)
        np.testing.assert_allclose((b * yc).sum(axis=1), (b * yn).sum(axis=1), rtol=IPM_OBJ_RTOL)


def test_the_interior_point_leaves_a_nan_instance_alone(compiled):
    Fs, Zs, b, ineq = (x[:6] for x in _svm_rank_stacks()[1])
    M0, y0, c0, _ = ipm_many(Fs, Zs, b, ineq, compiled=compiled)
    Fs_nan = Fs.copy()
    Fs_nan[2, 0, 0] = np.nan
    M1, y1, c1, _ = ipm_many(Fs_nan, Zs, b, ineq, compiled=compiled)
    assert c0.all() and not c1[2] and (M1[2] == 0).all() and (y1[2] == 0).all()  # (no point: zeros)
    keep = np.arange(6) != 2
    np.testing.assert_array_equal(M0[keep], M1[keep])
    np.testing.assert_array_equal(y0[keep], y1[keep])


def test_compile_kernels_runs_both_compiled_kernels(monkeypatch):
    # `make install` compiles the numba kernels through this (attsvm._warm)
    sdpc = pytest.importorskip("attsvm.svm._sdp_compiled")
    from attsvm._warm import compile_solvers
    from attsvm.svm import _active_set

    calls = []
    kernel = sdpc.solve_stack
    monkeypatch.setattr(sdpc, "solve_stack", lambda *a, **kw: calls.append(sdpc) or kernel(*a, **kw))
    job = _active_set.StackJob

    class Spy(job):
        def __init__(self, *a, **kw):
            calls.append(_active_set)
            super().__init__(*a, **kw)

    monkeypatch.setattr(_active_set, "StackJob", Spy)
    assert compile_solvers() is True
    assert set(calls) == {sdpc, _active_set}


def test_compiled_interior_point_on_threads_is_bit_identical(monkeypatch):
    sdpc = pytest.importorskip("attsvm.svm._sdp_compiled")
    from attsvm.svm import _sdp

    Fs, Zs, b, ineq = _svm_rank_stacks()[1]
    tols = (3e-10, 60, _sdp.STALL_BELOW, _sdp.STALL_ITERS, _sdp.DIVERGED_Y, _sdp.STEP_FRACTION)
    one = sdpc.solve_stack(Fs, Zs, b, ineq, *tols, threads=1)
    monkeypatch.setattr(sdpc, "MIN_PER_THREAD", 1)  # (2 threads over 8 ranges of a small stack)
    seen = set()
    kernel = sdpc._solve_one
    monkeypatch.setattr(sdpc, "_solve_one", lambda *a: seen.add(threading.get_ident()) or kernel(*a))
    for threads in (2, 3):
        for a, c in zip(one, sdpc.solve_stack(Fs, Zs, b, ineq, *tols, threads=threads)):
            np.testing.assert_array_equal(a, c)
    assert len(seen) >= 2  # (the instances did run on several threads)


def test_an_infeasible_instance_leaves_the_interior_point_early(monkeypatch, compiled):
    import attsvm.svm._sdp as sdp

    css = [AttentionSVM("nuc").fit(paper_instance(3, 4, 5, seed=s)).constraints_ for s in range(2)]
    (Fs, Zs, b, ineq), _ = _stacked(css)
    # instance 1: rows a₀, a₁ and −(a₀ + a₁) (unit) on one query, each ≥ b > 0: infeasible, while its
    # Schur complement stays regular, so only the divergence of its multipliers can stop it
    a2 = -(Fs[1, 0] + Fs[1, 1])
    Fs[1, 2], Zs[1, 1], Zs[1, 2] = a2 / np.linalg.norm(a2), Zs[1, 0], Zs[1, 0]
    assert np.all(b > 0)
    M, y, converged, iters = ipm_many(Fs, Zs, b, ineq, compiled=compiled)
    assert converged[0] and not converged[1] and iters[1] < 20
    assert (M[1] == 0).all() and (y[1] == 0).all()  # (diverged: no point)
    monkeypatch.setattr(sdp, "DIVERGED_Y", np.inf)  # without the test: all of max_iter, and its last point
    M, y, converged, iters = ipm_many(Fs, Zs, b, ineq, compiled=compiled)
    assert iters[1] == 60 and not converged[1] and np.abs(y[1]).max() > 1e3


def test_instances_of_different_length_in_one_group():
    # (3, 3, 2) and (2, 4, 2): both K = 6 rows on 2 × 2 reduced matrices, with T = 3 and T = 4
    probs = [paper_instance(3, 3, 2, seed=1), paper_instance(2, 4, 2, seed=2)]
    toks = [p.optimal_tokens(ties="first") for p in probs]
    for order in ((0, 1), (1, 0)):
        ps, ts = [probs[k] for k in order], [toks[k] for k in order]
        for p, t, m in zip(ps, ts, AttentionSVM("nuc").fit_many(ps, ts)):
            assert m.info_["path"] == "batched-ipm" and m.info_["batch_size"] == 2
            _assert_same(m, AttentionSVM("nuc").fit(p, t))


def test_an_iteration_limit_goes_one_at_a_time():
    # max_iter limits fit's augmented-Lagrangian iterations: the batch (an interior point) does not apply
    probs = [paper_instance(6, 8, 10, seed=s) for s in range(3)]
    many = AttentionSVM("nuc", max_iter=1).fit_many(probs)
    for p, m in zip(probs, many):
        one = AttentionSVM("nuc", max_iter=1).fit(p)
        assert m.info_.get("path") != "batched-ipm" and m.n_iter_ == one.n_iter_ == 1
        assert m.status_ == one.status_


def test_fit_many_constraints_equals_fit_constraints(compiled):
    css = [_svm_eq_shaped(s) for s in range(12)] + [_svm_eq_shaped(100 + s, 0.5, "normal") for s in range(6)]
    css.append(_svm_eq_shaped(7, eq_share=0.0))  # inequalities only, one more shape
    bad = _svm_eq_shaped(3)  # an infeasible one: a row and its opposite, both ≥ 1
    A = bad.A.copy()
    A[0, 2] = -A[0, 1]
    css.append(ConstraintSet(A, bad.Z, bad.mask, np.where(bad.mask, 1.0, 0.0), np.zeros_like(bad.mask)))
    many = AttentionSVM("nuc").fit_many_constraints(css)
    statuses = []
    for cs, m in zip(css, many):
        one = AttentionSVM("nuc").fit_constraints(cs)
        assert m.tokens_ is None and m.constraints_ is cs
        _assert_same(m, one)
        statuses.append(m.status_)
    assert statuses[-1] == "infeasible" and statuses.count("optimal") >= 15
    batched = [m.info_.get("path") == "batched-ipm" for m in many]
    assert batched == [s == "optimal" for s in statuses]  # every feasible one in the batch
    assert all(m.info_["route"] == ("compiled" if compiled else "numpy") for m, b in zip(many, batched) if b)
    # the Frobenius norm takes them one at a time, and agrees
    fro = AttentionSVM().fit_many_constraints(css[:3])
    for cs, m in zip(css[:3], fro):
        assert m.info_.get("path") != "batched-dense"
        np.testing.assert_array_equal(m.W_, AttentionSVM().fit_constraints(cs).W_)


@pytest.mark.parametrize(
    "arg,match",
    [
        ("x", "constraint_sets must be a sequence of ConstraintSet"),
        ([paper_instance(3, 4, 5, seed=0)], r"constraint_sets\[0\] must be a ConstraintSet"),
    ],
)
def test_fit_many_constraints_bad_input(arg, match):
    with pytest.raises(TypeError, match=match):
        AttentionSVM("nuc").fit_many_constraints(arg)
