"""AttentionSVM.fit_many: many certified SVMs as one vectorised program, instance by instance equal
to fit (docs/spec.md §3; attsvm.svm.batch)."""

from __future__ import annotations

import numpy as np
import pytest

from attsvm.datasets import paper_instance, random_instance
from attsvm.problem import AttentionProblem
from attsvm.svm import AttentionSVM, _fitted, batch
from attsvm.svm.batch import BATCH_MAX_K, COMPILED_MAX_K
from attsvm.svm.certificate import FARKAS_RTOL, farkas_certificate

W_RTOL = 1e-8  # W of the batch against fit's, relative to ‖W‖ (both are exact to round-off)
DUAL_ATOL = 1e-6  # λ against fit's, relative to max λ (degenerate faces may split λ differently)
CERT_TOL = 1e-9  # the estimator's default tolerance: every "optimal" passes it


def _duplicate_selected(p: AttentionProblem, alpha: np.ndarray) -> AttentionProblem:
    """A copy of p where sequence 0 repeats its selected token: a zero feature, infeasible."""
    X = p.X.copy()
    X[0, (alpha[0] + 1) % p.T] = X[0, alpha[0]]
    return AttentionProblem(X, p.y, p.v, Z=p.Z)


def _mixed(
    n_one: int = 90,
    n_other: int = 30,
    n_infeasible: int = 4,
    big: tuple[int, int, int] = (20, 20, 30),
    degenerate: bool = False,
) -> tuple[list[AttentionProblem], list[np.ndarray | None]]:
    """Mixed instances for fit_many against fit (also used by the nuclear batch's tests): ``n_one`` of one
    shape (K = 42); ``n_other`` each of other shapes with non-optimal selections (some infeasible) and of
    self-attention (and, with ``degenerate``, of K = 40 rows on 4 × 4 matrices); ``n_infeasible`` with a
    zero feature; one of shape ``big``, beyond the batch (one at a time)."""
    rng = np.random.default_rng(0)
    probs: list[AttentionProblem] = []
    toks: list[np.ndarray | None] = []
    for s in range(n_one):
        probs.append(paper_instance(6, 8, 10, seed=s))
        toks.append(probs[-1].optimal_tokens(ties="first"))
    for s in range(n_other):
        p = random_instance(3, 5, 6, seed=s)
        probs.append(p)
        toks.append(rng.integers(0, p.T, size=p.n))
        q = paper_instance(4, 6, 8, seed=s, self_attention=True)
        probs.append(q)
        toks.append(q.optimal_tokens(ties="first"))
        if degenerate:
            r = paper_instance(10, 5, 4, seed=s)
            probs.append(r)
            toks.append(r.optimal_tokens(ties="first"))
    for s in range(n_infeasible):
        p = paper_instance(6, 8, 10, seed=100 + s)
        a = p.optimal_tokens()
        probs.append(_duplicate_selected(p, a))
        toks.append(a)
    probs.append(paper_instance(*big, seed=0))
    toks.append(probs[-1].optimal_tokens(ties="first"))
    return probs, toks


def _assert_same(a: AttentionSVM, b: AttentionSVM) -> None:
    assert a.status_ == b.status_
    np.testing.assert_array_equal(a.tokens_, b.tokens_)
    if b.status_ == "infeasible":
        assert a.W_ is None and a.certificate_ is not None
        if a.info_.get("path") == ROUTES["compiled"]:
            # the active set's own Farkas certificate (Farkas certificates are not unique): verified by
            # the same check as fit's, and normalised as fit's (1ᵀλ = 1)
            cert = farkas_certificate(a.constraints_, a.certificate_)
            assert cert.valid and cert.relative_residual <= FARKAS_RTOL
            assert a.certificate_.min() >= 0 and a.certificate_.sum() == pytest.approx(1.0, abs=1e-12)
            assert a.certificate_residual_ == pytest.approx(cert.residual, rel=1e-6, abs=1e-14)  # (round-off: ~1e-16)
        else:
            np.testing.assert_allclose(a.certificate_, b.certificate_, atol=1e-12)
        return
    assert b.status_ == "optimal"
    scale = np.abs(b.W_).max()
    np.testing.assert_allclose(a.W_, b.W_, rtol=0, atol=W_RTOL * scale)
    np.testing.assert_allclose(a.dual_coef_, b.dual_coef_, rtol=0, atol=DUAL_ATOL * np.abs(b.dual_coef_).max())
    np.testing.assert_array_equal(a.support_, b.support_)
    np.testing.assert_allclose(a.margins_, b.margins_, rtol=W_RTOL, atol=W_RTOL)
    assert a.relative_violation_ <= CERT_TOL and a.relative_gap_ <= CERT_TOL
    assert a.objective_ == pytest.approx(b.objective_, rel=W_RTOL)
    assert a.rank_ == b.rank_


ROUTES = {"compiled": "batched-active-set", "numpy": "batched-dense"}


@pytest.fixture(params=list(ROUTES))
def route(request, monkeypatch):
    """Each test runs on both routes of attsvm.svm.batch: the compiled dual active set (numba, the
    ``fast`` extra) and the NumPy active set (without numba, or ATTSVM_COMPILED=0)."""
    if request.param == "compiled":
        pytest.importorskip("numba")
    monkeypatch.setenv("ATTSVM_COMPILED", "1" if request.param == "compiled" else "0")
    monkeypatch.setattr(batch, "_compiled_module", None)  # (chosen again under this environment)
    yield request.param
    monkeypatch.setattr(batch, "_compiled_module", None)


def test_fit_many_equals_fit_instance_by_instance(route):
    # 90 of K = 42 (more than one chunk); (20, 20, 30): K = 380 > BATCH_MAX_K; (10, 5, 4): rank-deficient
    probs, toks = _mixed(degenerate=True)
    assert BATCH_MAX_K < 20 * 19 <= COMPILED_MAX_K
    many = AttentionSVM().fit_many(probs, toks)
    assert len(many) == len(probs)
    for p, t, a in zip(probs, toks, many):
        _assert_same(a, AttentionSVM().fit(p, t))
    paths = [m.info_.get("path") for m in many]
    feasible = [m.status_ == "optimal" for m in many]
    if route == "compiled":  # every feasible instance, and the infeasible ones the active set proves
        assert [p == ROUTES[route] for p, f in zip(paths, feasible) if f] == [True] * sum(feasible) == [True] * 177
        proved = [m for m in many if m.status_ == "infeasible" and m.info_.get("path") == ROUTES[route]]
        assert len(proved) == 3  # (the 4 with a duplicate token leave as tied, and one is left to fit)
    else:  # the feasible ones within 80 rows and of full rank; no infeasible one
        small = [f and p.n * (p.T - 1) <= BATCH_MAX_K and not batch.rank_deficient(p) for p, f in zip(probs, feasible)]
        assert [p == ROUTES[route] for p in paths] == small and sum(small) == 150


def test_a_failing_instance_does_not_change_the_others(route):
    good = [paper_instance(6, 8, 10, seed=s) for s in range(10)]
    toks = [p.optimal_tokens(ties="first") for p in good]
    bad = _duplicate_selected(good[3], toks[3])
    alone = AttentionSVM().fit_many(good, toks)
    mixed = AttentionSVM().fit_many([*good[:5], bad, *good[5:]], [*toks[:5], toks[3], *toks[5:]])
    assert mixed[5].status_ == "infeasible"
    for a, b in zip(alone, [*mixed[:5], *mixed[6:]]):
        np.testing.assert_array_equal(a.W_, b.W_)  # bit for bit: instances never mix


def test_other_norms_go_one_at_a_time_and_agree():
    # (nuclear without a rank constraint has its own batch: tests/test_svm_batch_nuclear.py)
    probs = [paper_instance(3, 4, 5, seed=s) for s in range(4)]
    for est in (AttentionSVM("nuc", rank=2), AttentionSVM("lp", p=3.0)):
        for p, a in zip(probs, est.fit_many(probs)):
            b = type(est)(**est.get_params()).fit(p)
            assert a.status_ == b.status_
            assert a.info_.get("path") not in ("batched-dense", "batched-ipm")
            np.testing.assert_allclose(a.W_, b.W_, atol=1e-9 * np.abs(b.W_).max())


@pytest.mark.parametrize("stack_elements", [None, 300])  # (300: two problems of 120 elements per stacked pass)
def test_optimal_tokens_found_together_are_each_problems_own(monkeypatch, stack_elements):
    import attsvm.problem
    from attsvm.problem import Head, TieError, optimal_tokens_together

    if stack_elements is not None:
        monkeypatch.setattr(attsvm.problem, "_STACK_ELEMENTS", stack_elements)

    rng = np.random.default_rng(5)
    probs: list = [paper_instance(4, 6, 5, seed=s) for s in range(6)] + [paper_instance(3, 7, 4, seed=9)]
    X = probs[2].X.copy()
    top = probs[2].optimal_tokens()[0]
    X[0, (top + 1) % 6] = X[0, top] * (1 - 1e-13)  # a tie within TIE_RTOL: left to optimal_tokens
    probs[2] = AttentionProblem(X, probs[2].y, probs[2].v, Z=probs[2].Z)
    relu = Head.relu(rng.normal(size=(5, 3)))
    probs.append(AttentionProblem(rng.normal(size=(4, 6, 5)), np.ones(4), relu, Z=rng.normal(size=(4, 5))))
    probs.append("not a problem")
    found = optimal_tokens_together(probs)
    for i, (p, a) in enumerate(zip(probs, found)):
        if i in (2, 7, 8):
            assert a is None
        else:
            assert a.dtype == np.int64 and np.array_equal(a, p.optimal_tokens())
    with pytest.raises(TieError):
        probs[2].optimal_tokens()
    good = [p for i, p in enumerate(probs) if i not in (2, 8)]
    est = AttentionSVM()
    for a, b in zip(est.fit_many(good), est.fit_many(good, [p.optimal_tokens() for p in good])):
        assert np.array_equal(a.tokens_, b.tokens_) and np.array_equal(a.W_, b.W_)


def test_tied_tokens_raise_the_named_error_with_the_position():
    p = paper_instance(3, 4, 5, seed=0)
    X = p.X.copy()
    X[1, 2] = X[1, p.optimal_tokens()[1]]  # two tokens share the top score in sequence 1
    tied = AttentionProblem(X, p.y, p.v, Z=p.Z)
    with pytest.raises(ValueError, match=r"problems\[1\].*not unique"):
        AttentionSVM().fit_many([p, tied])


@pytest.mark.parametrize(
    "problems,tokens,exc,match",
    [
        ("not a list", None, TypeError, "problems must be a sequence"),
        ([paper_instance(3, 4, 5, seed=0), "x"], None, TypeError, r"problems\[1\] must be an AttentionProblem"),
        ([paper_instance(3, 4, 5, seed=0)], [None, None], ValueError, "tokens must hold one selection per problem"),
        ([paper_instance(3, 4, 5, seed=0)], [[0, 1, 9]], ValueError, r"problems\[0\]: tokens must be token indices"),
        (  # int64 selections are range-checked together: the one out of range is still named
            [paper_instance(3, 4, 5, seed=0)] * 3,
            [np.array([0, 1, 2]), np.array([0, 4, 1]), np.array([1, 1, 1])],
            ValueError,
            r"problems\[1\]: tokens must be token indices in \[0, 4\)",
        ),
        (
            [paper_instance(3, 4, 5, seed=0)] * 2,
            [np.array([0, 1, 2]), np.array([0, -1, 1])],
            ValueError,
            r"problems\[1\]: tokens must be token indices",
        ),
        (
            [paper_instance(3, 4, 5, seed=0)],
            [np.array([0.5, 1, 2])],
            TypeError,
            r"problems\[0\]: tokens must be integer",
        ),
    ],
)
def test_bad_input(problems, tokens, exc, match):
    with pytest.raises(exc, match=match):
        AttentionSVM().fit_many(problems, tokens)


def test_fit_many_leaves_the_estimator_unfitted_and_keeps_its_parameters():
    est = AttentionSVM(tol=1e-8)
    out = est.fit_many([paper_instance(3, 4, 5, seed=0)])
    assert out[0].tol == 1e-8 and out[0] is not est
    assert "status_" not in est.__dict__


@pytest.mark.parametrize("cx,cz", [(1e8, 1.0), (1e-8, 1.0), (1.0, 1e-8), (1e6, 1e6)])
def test_fit_many_is_invariant_to_scale(route, cx, cz):
    probs = [paper_instance(6, 8, 10, seed=s) for s in range(6)]
    scaled = [AttentionProblem(p.X * cx, p.y, p.v, Z=p.Z * cz) for p in probs]
    toks = [p.optimal_tokens() for p in probs]
    base = AttentionSVM().fit_many(probs, toks)
    for a, b in zip(AttentionSVM().fit_many(scaled, toks), base):
        assert a.status_ == b.status_ == "optimal" and a.info_["path"] == b.info_["path"] == ROUTES[route]
        np.testing.assert_allclose(a.W_ * (cx * cz), b.W_, rtol=0, atol=W_RTOL * np.abs(b.W_).max())
        np.testing.assert_array_equal(a.support_, b.support_)


def test_self_attention_queries_are_read_at_each_instances_position(route):
    # one group (one shape) of self-attention instances with different query positions, then the same
    # group with a cross-attention instance among them: each instance's queries are its own z_i
    base = [paper_instance(5, 6, 7, seed=s, self_attention=True) for s in range(12)]
    probs = [AttentionProblem(p.X, p.y, p.v, query_index=s % p.T) for s, p in enumerate(base)]
    cross = paper_instance(5, 6, 7, seed=99)
    for group in (probs, [*probs[:6], cross, *probs[6:]]):
        toks = [p.optimal_tokens(ties="first") for p in group]
        many = AttentionSVM().fit_many(group, toks)
        assert len({p.query_index for p in group} - {None}) == 6
        for p, t, a in zip(group, toks, many):
            _assert_same(a, AttentionSVM().fit(p, t))
        if route == "compiled":
            assert all(m.info_["path"] == ROUTES[route] for m in many if m.status_ == "optimal")


def test_the_estimators_of_a_batch_are_built_without_cyclic_collections(monkeypatch):
    # thousands of estimators, none in a cycle: the collector is paused while they are built (a run of it
    # walks every object of the process) and left as it was
    import contextlib
    import gc

    probs = [paper_instance(6, 8, 10, seed=s) for s in range(300)]
    toks = [p.optimal_tokens(ties="first") for p in probs]
    runs: list[int] = []

    def count(phase, info):
        if phase == "start":
            runs.append(info["generation"])

    def collections() -> int:
        del runs[:]
        gc.callbacks.append(count)
        try:
            AttentionSVM().fit_many(probs, toks)
        finally:
            gc.callbacks.remove(count)
        return len(runs)

    AttentionSVM().fit_many(probs[:2], toks[:2])  # (the first batch of a process loads the compiled kernel)
    threshold = gc.get_threshold()
    gc.set_threshold(50, 10, 10)
    pause = batch.gc_paused
    try:
        paused = collections()
        assert gc.isenabled()
        gc.disable()
        with pause():
            pass
        assert not gc.isenabled()  # (left as it was)
        gc.enable()
        monkeypatch.setattr(batch, "gc_paused", contextlib.nullcontext)
        unpaused = collections()
    finally:
        gc.enable()
        gc.set_threshold(*threshold)
    assert unpaused >= 20 and paused <= unpaused // 4, (paused, unpaused)


def test_overlapping_collector_pauses_restore_the_state_once_the_last_one_closes():
    import gc
    import threading

    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []

    def other() -> None:
        first_in.wait()
        with batch.gc_paused():
            second_in.set()
            first_out.wait()
            seen.append(gc.isenabled())  # (the first block has closed: still paused for this one)

    assert gc.isenabled()
    t = threading.Thread(target=other)
    t.start()
    try:
        with batch.gc_paused():
            first_in.set()
            second_in.wait()
        first_out.set()
    finally:
        t.join()
    assert seen == [False] and gc.isenabled()


def test_the_compiled_batch_writes_its_rows_over_its_own_stack(monkeypatch):
    # fit_many assembles the stack itself, so the compiled kernel writes the rows A over it (one array of
    # the stack's size fewer); the problems' own X are left alone
    pytest.importorskip("numba")
    kernel = batch.compiled()
    assert kernel is not None
    calls: list[bool] = []
    job = kernel.StackJob

    class Spy(job):
        def __init__(self, X, Z, alpha, tol, max_iter, threads=1, overwrite_x=False, ready=None):
            calls.append(overwrite_x)
            super().__init__(X, Z, alpha, tol, max_iter, threads, overwrite_x, ready)
            assert (self.out["A"] is X) == overwrite_x

    monkeypatch.setattr(kernel, "StackJob", Spy)
    probs = [paper_instance(6, 8, 10, seed=s) for s in range(8)]
    before = [p.X.copy() for p in probs]
    many = AttentionSVM().fit_many(probs, [p.optimal_tokens(ties="first") for p in probs])
    assert calls == [True]
    for p, x, m in zip(probs, before, many):
        np.testing.assert_array_equal(p.X, x)
        assert m.status_ == "optimal" and not np.shares_memory(m.constraints_.A, p.X)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_a_child_forked_inside_a_pause_collects_again():
    # a fork while another thread is inside gc_paused: that block never closes in the child, whose
    # collector must not stay off for good
    import gc
    import os

    with batch.gc_paused():
        pid = os.fork()
        if pid == 0:  # (the child: report through the exit code only)
            ok = gc.isenabled() and batch._gc_depth == 0
            with batch.gc_paused():  # (and its own pauses work as before)
                ok = ok and not gc.isenabled()
            os._exit(0 if ok and gc.isenabled() else 1)
        assert not gc.isenabled()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert gc.isenabled()


def test_the_overlapped_compiled_group_returns_what_its_stack_and_estimators_give(monkeypatch):
    # the compiled group builds each estimator while the pool's thread solves, and gives it its numbers
    # chunk by chunk: every instance must come back as the stack (solve_arrays) and estimators() make
    # it, bit for bit, on one thread and on two; the tied ones None, the proved infeasible ones fitted
    pytest.importorskip("numba")
    from attsvm.svm import _active_set as gi
    from attsvm.svm.frobenius import FrobeniusOptions

    rng = np.random.default_rng(3)
    probs = [paper_instance(10, 5, 4, seed=s) for s in range(3 * gi.MIN_PER_THREAD + 5)]  # K = 40 on 4 × 4
    alpha = np.stack([rng.integers(0, 5, size=10) if s % 3 == 0 else p.optimal_tokens() for s, p in enumerate(probs)])
    for s in (7, 100, 150):
        probs[s] = _duplicate_selected(probs[s], alpha[s])
    est = AttentionSVM()
    opt = FrobeniusOptions(tol=1e-10)
    X = np.stack([p.X for p in probs])
    Zq = np.stack([p.queries for p in probs])
    st = batch.solve_arrays(est, X, Zq, alpha, opt)
    ref: list[AttentionSVM | None] = [None] * len(probs)
    keep = np.flatnonzero(st.certified(est.tol))
    for i, e in zip(keep.tolist(), _fitted.estimators(AttentionSVM, est.get_params(), st, keep)):
        ref[i] = e
    for i, e in _fitted.proved_infeasible(est, st).items():
        ref[i] = e
    kinds = {e.status_ if e is not None else None for e in ref}
    assert kinds == {"optimal", "infeasible", None}
    for threads in ("1", "2"):
        monkeypatch.setenv("ATTSVM_NUM_THREADS", threads)
        got = _fitted.solve_group(est, probs, alpha, opt)
        assert [e is None for e in got] == [e is None for e in ref]
        for a, b in zip(got, ref):
            if a is None:
                continue
            assert set(a.__dict__) == set(b.__dict__)
            for key, va in a.__dict__.items():
                vb = b.__dict__[key]
                if key == "solve_time_":
                    assert va > 0
                elif key == "constraints_":
                    for f in ("A", "Z", "mask", "rhs", "equality"):
                        np.testing.assert_array_equal(getattr(va, f), getattr(vb, f))
                elif isinstance(va, np.ndarray) or va is None:
                    np.testing.assert_array_equal(va, vb, err_msg=key)
                else:
                    assert va == vb, key


@pytest.mark.timeout(120)
def test_fit_many_from_two_threads_at_once_gives_each_its_own_answers(monkeypatch):
    # two callers share the process's pool: each gets its own answers, as alone, and neither waits for ever
    import threading

    pytest.importorskip("numba")
    monkeypatch.setenv("ATTSVM_NUM_THREADS", "2")
    sets = [[paper_instance(6, 8, 10, seed=1000 * j + s) for s in range(300)] for j in range(2)]
    toks = [[p.optimal_tokens(ties="first") for p in probs] for probs in sets]
    alone = [AttentionSVM().fit_many(probs, t) for probs, t in zip(sets, toks)]
    got: list = [None, None]

    def run(j: int) -> None:
        for _ in range(3):
            got[j] = AttentionSVM().fit_many(sets[j], toks[j])

    threads = [threading.Thread(target=run, args=(j,)) for j in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for j in range(2):
        assert len(got[j]) == len(sets[j])
        for a, b in zip(got[j], alone[j]):
            np.testing.assert_array_equal(a.W_, b.W_)
            assert a.status_ == b.status_ == "optimal"
