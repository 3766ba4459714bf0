"""The compiled dual active set behind fit_many's Frobenius batch (attsvm.svm._active_set,
docs/spec.md §3): its codes, its degenerate and infeasible instances, its threads."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("numba")

from attsvm.datasets import paper_instance
from attsvm.svm import AttentionSVM, batch
from attsvm.svm import _active_set as gi
from attsvm.svm.certificate import farkas_certificate

W_RTOL = 1e-8  # W against fit's, relative to max |W| (both exact to round-off)
CERT_TOL = 1e-9  # the estimator's default tolerance


def _stack(probs, toks):
    return (
        np.stack([p.X for p in probs]),
        np.stack([p.queries for p in probs]),
        np.stack([np.asarray(t, dtype=np.int64) for t in toks]),
    )


def _solve(probs, toks, **kw):
    X, Z, a = _stack(probs, toks)
    K = X.shape[1] * (X.shape[2] - 1)
    return gi.solve_stack(X, Z, a, kw.pop("tol", gi.GI_TOL), kw.pop("max_iter", gi.max_iterations(K)), **kw)


def test_degenerate_instances_certify_or_leave_as_infeasible_as_fit_says():
    # (10, 5, 4): K = 40 rows for W with 16 entries, so the rows are dependent (fit_many sends these
    # shapes to fit; the kernel is run on them here directly). Optimal selections are feasible, random ones
    # often are not: the kernel must certify the first kind as fit does and leave the second as infeasible.
    rng = np.random.default_rng(0)
    probs = [paper_instance(10, 5, 4, seed=s) for s in range(60)]
    toks = [p.optimal_tokens(ties="first") if s % 2 else rng.integers(0, 5, size=10) for s, p in enumerate(probs)]
    out = _solve(probs, toks)
    kinds = set()
    verified = 0
    for i, (p, t) in enumerate(zip(probs, toks)):
        ref = AttentionSVM().fit(p, t)
        code = int(out["code"][i])
        if ref.status_ == "infeasible":
            assert code == batch.LEAVE_INFEASIBLE, i
            # its candidate (y_p = 1, y_A = −r, in the user's rows) is a Farkas certificate
            cert = farkas_certificate(ref.constraints_, out["lam"][i])
            verified += cert.valid
            kinds.add("infeasible")
            continue
        assert ref.status_ == "optimal" and code >= 0, (i, code)
        kinds.add("optimal")
        assert out["stats"][i, 1] <= CERT_TOL and out["stats"][i, 3] <= CERT_TOL
        np.testing.assert_allclose(out["W"][i], ref.W_, rtol=0, atol=W_RTOL * np.abs(ref.W_).max())
    assert kinds == {"optimal", "infeasible"}
    assert verified == int((out["code"] == batch.LEAVE_INFEASIBLE).sum())


def test_tied_rows_and_zero_queries_leave_for_fit():
    probs = [paper_instance(6, 8, 10, seed=s) for s in range(4)]
    toks = [p.optimal_tokens(ties="first") for p in probs]
    X, Z, a = _stack(probs, toks)
    X[1, 2, (a[1, 2] + 1) % 8] = X[1, 2, a[1, 2]]  # a token equal to the selected one: a zero row
    X[2, 0, (a[2, 0] + 3) % 8] = X[2, 0, a[2, 0]] * (1 + 2e-16)  # equal up to round-off (the tie rule)
    Z[3, 4] = 0.0  # a zero query: every row of sequence 4 vanishes
    out = gi.solve_stack(X, Z, a, gi.GI_TOL, gi.max_iterations(42))
    assert out["code"][0] >= 0
    assert list(out["code"][1:]) == [batch.LEAVE_TIED] * 3


def test_the_iteration_budget_is_honoured():
    probs = [paper_instance(6, 8, 10, seed=s) for s in range(5)]
    out = _solve(probs, [p.optimal_tokens(ties="first") for p in probs], max_iter=3)
    assert (out["code"] == batch.LEAVE_MAX_ITER).all()  # (each needs more than 14 additions)


def test_threads_give_bit_identical_results():
    # 3 and 2 threads, each taking chunks of CHUNK instances from a shared counter as it becomes free
    probs = [paper_instance(6, 8, 10, seed=s) for s in range(10 * gi.MIN_PER_THREAD)]
    toks = [p.optimal_tokens(ties="first") for p in probs]
    one = _solve(probs, toks, threads=1)
    for threads, n_probs in ((3, 3 * gi.MIN_PER_THREAD), (2, len(probs))):
        many = _solve(probs[:n_probs], toks[:n_probs], threads=threads)
        for key in one:
            np.testing.assert_array_equal(one[key][:n_probs], many[key])


def test_scratch_arrays_carry_nothing_from_one_instance_to_the_next():
    # the scratch arrays are allocated once per range (gi._workspace): each instance must come out as if
    # solved alone, whatever the one before it left there (an infeasible exit, a tie, an iteration limit)
    rng = np.random.default_rng(1)
    probs = [paper_instance(10, 5, 4, seed=s) for s in range(12)]  # dependent rows: infeasible selections
    toks = [p.optimal_tokens(ties="first") if s % 3 else rng.integers(0, 5, size=10) for s, p in enumerate(probs)]
    X, Z, a = _stack(probs, toks)
    X[4, 2, (a[4, 2] + 1) % 5] = X[4, 2, a[4, 2]]  # a tied row: LEAVE_TIED

    def solve(sl, max_iter=None):
        return gi.solve_stack(X[sl], Z[sl], a[sl], gi.GI_TOL, gi.max_iterations(40) if max_iter is None else max_iter)

    stacked = solve(slice(None))
    codes = set(stacked["code"].tolist())
    assert {batch.LEAVE_INFEASIBLE, batch.LEAVE_TIED} <= codes and max(codes) > 0
    for b in range(len(probs)):
        alone = solve(slice(b, b + 1))
        code = stacked["code"][b]
        # (an instance that left has only its code, and the infeasible ones their Farkas candidate)
        keys = list(alone) if code >= 0 else ["code", "lam"] if code == batch.LEAVE_INFEASIBLE else ["code"]
        for key in keys:
            np.testing.assert_array_equal(stacked[key][b], alone[key][0], err_msg=f"instance {b}: {key}")
    short = solve(slice(None), max_iter=3)  # every instance stopped part way: the next starts afresh
    assert batch.LEAVE_MAX_ITER in short["code"].tolist()
    for b in range(len(probs)):
        assert short["code"][b] == solve(slice(b, b + 1), max_iter=3)["code"][0]


@pytest.mark.parametrize("K", [1, 2, 3, 7, 42, 81])
def test_select_is_the_sorted_entry(K):
    # the median of the global scale g (gi._select, quickselect) against np.sort, ties included
    rng = np.random.default_rng(K)
    for trial in range(300):
        v = rng.standard_normal(K)
        if trial % 3 == 0:
            v = np.round(v, 1)  # many ties
        if trial % 7 == 0:
            v[:] = 1.0
        for k in {0, K // 2, K - 1, int(rng.integers(0, K))}:
            assert gi._select(v.copy(), k) == np.sort(v)[k]


UNROLL_RTOL = 1e-13  # the unrolled column products against NumPy's (reassociated sums of a few terms)


@pytest.mark.parametrize("d", range(1, 10))
def test_unrolled_column_product_is_the_gram_column(d):
    # gi._column runs four rows of AT per pass with a prologue for d mod 4: every remainder against AᵀA
    rng = np.random.default_rng(d)
    AT = rng.standard_normal((d, 11))
    out = np.full(11, np.nan)
    for p in range(11):
        gi._column(AT, p, out)
        np.testing.assert_allclose(out, AT.T @ AT[:, p], rtol=UNROLL_RTOL, atol=UNROLL_RTOL * d)


@pytest.mark.parametrize("na", range(10))
def test_unrolled_margin_direction_is_the_column_minus_m_transpose_rho(na):
    # gi._minus_mt: Ĝ_:p − M[:na]ᵀρ, four rows of M per pass with a prologue for na mod 4
    rng = np.random.default_rng(na)
    colp, M, rho = rng.standard_normal(13), rng.standard_normal((na + 2, 13)), rng.standard_normal(na + 2)
    out = np.full(13, np.nan)
    gi._minus_mt(colp, M, rho, na, out)
    want = colp - M[:na].T @ rho[:na]
    np.testing.assert_allclose(out, want, rtol=UNROLL_RTOL, atol=UNROLL_RTOL * (na + 1))


@pytest.mark.parametrize("scale", [1e-8, 1e8])
def test_scale_invariance(scale):
    probs = [paper_instance(6, 8, 10, seed=s) for s in range(8)]
    toks = [p.optimal_tokens(ties="first") for p in probs]
    X, Z, a = _stack(probs, toks)
    base = gi.solve_stack(X, Z, a, gi.GI_TOL, gi.max_iterations(42))
    scaled = gi.solve_stack(X * scale, Z, a, gi.GI_TOL, gi.max_iterations(42))
    assert (scaled["code"] >= 0).all() and (scaled["stats"][:, 1] <= CERT_TOL).all()
    np.testing.assert_allclose(scaled["W"] * scale, base["W"], rtol=0, atol=W_RTOL * np.abs(base["W"]).max())
    np.testing.assert_array_equal(scaled["support"], base["support"])


def test_fit_many_with_an_iteration_limit_takes_the_numpy_route(monkeypatch):
    monkeypatch.setenv("ATTSVM_COMPILED", "1")
    monkeypatch.setattr(batch, "_compiled_module", None)
    probs = [paper_instance(6, 8, 10, seed=s) for s in range(4)]
    paths = {m.info_["path"] for m in AttentionSVM().fit_many(probs)}
    limited = {m.info_["path"] for m in AttentionSVM(max_iter=50).fit_many(probs)}
    assert paths == {"batched-active-set"} and limited == {"batched-dense"}


def test_batch_threads_reads_the_environment(monkeypatch):
    from attsvm._threads import batch_threads

    monkeypatch.setenv("ATTSVM_NUM_THREADS", "3")
    assert batch_threads() == 3
    for bad in ("two", "0", "-3"):
        monkeypatch.setenv("ATTSVM_NUM_THREADS", bad)
        with pytest.raises(ValueError, match=f"ATTSVM_NUM_THREADS must be a positive integer, got '{bad}'"):
            batch_threads()
    monkeypatch.delenv("ATTSVM_NUM_THREADS")
    assert batch_threads() == len(os.sched_getaffinity(0))


def test_fitted_tokens_do_not_alias_the_callers_selections(monkeypatch):
    # the int64 fast path copies the selections once: tokens_ never is (or follows) the caller's array
    probs = [paper_instance(4, 5, 6, seed=s) for s in range(3)]
    toks = [p.optimal_tokens(ties="first") for p in probs]
    for est in (AttentionSVM(), AttentionSVM("nuc")):
        mine = [t.copy() for t in toks]
        fits = est.fit_many(probs, mine)
        for t in mine:
            t[:] = 0
        for f, t in zip(fits, toks):
            np.testing.assert_array_equal(f.tokens_, t)


def test_concurrent_first_calls_all_take_the_compiled_route(monkeypatch):
    # the route is chosen once, under a lock: threads asking while numba loads wait for the choice
    monkeypatch.setenv("ATTSVM_COMPILED", "1")
    monkeypatch.setattr(batch, "_compiled_module", None)
    probs = [paper_instance(6, 8, 10, seed=s) for s in range(4)]
    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda _: AttentionSVM().fit_many(probs), range(4)))
    assert {m.info_["path"] for run in runs for m in run} == {"batched-active-set"}


_FORK_SCRIPT = """
import multiprocessing as mp, os
os.environ["ATTSVM_NUM_THREADS"] = "2"
from attsvm.datasets import paper_instance
from attsvm.svm import AttentionSVM
probs = [paper_instance(6, 8, 10, seed=s) for s in range(200)]

def child(_):
    return sum(m.status_ == "optimal" for m in AttentionSVM().fit_many(probs))

if __name__ == "__main__":
    print(child(0))  # the parent's pool of threads exists now
    with mp.get_context("fork").Pool(1) as pool:
        print(pool.map_async(child, [0]).get(timeout=120)[0])
"""


def test_a_forked_child_solves_after_its_parent_used_the_threads(tmp_path):
    # a child made by fork inherits the pool object but not its threads: it must start its own
    import subprocess
    import sys

    script = tmp_path / "fork_child.py"
    script.write_text(_FORK_SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["200", "200"]


_BOUNDS_SCRIPT = """
import numpy as np
from attsvm.datasets import paper_instance, random_instance
from attsvm.svm import _active_set as gi
rng = np.random.default_rng(1)
for shape, count in (((10, 5, 4), 40), ((3, 5, 6), 40), ((6, 8, 10), 20), ((4, 9, 2), 40)):
    probs = [(random_instance if s % 3 == 0 else paper_instance)(*shape, seed=s) for s in range(count)]
    toks = [rng.integers(0, p.T, size=p.n) if s % 2 else p.optimal_tokens(ties="first") for s, p in enumerate(probs)]
    X = np.stack([p.X for p in probs])
    Z = np.stack([p.queries for p in probs])
    a = np.stack([np.asarray(t, dtype=np.int64) for t in toks])
    K = shape[0] * (shape[1] - 1)
    out = gi.solve_stack(X, Z, a, gi.GI_TOL, gi.max_iterations(K))
    print(shape, sorted(set(out["code"].tolist()))[:3])
"""


@pytest.mark.slow
def test_no_out_of_bounds_access_on_degenerate_and_infeasible_stacks(tmp_path):
    # numba does not check indices: the kernel runs here compiled with NUMBA_BOUNDSCHECK=1 (its own cache)
    # on degenerate, infeasible and tiny shapes, where an IndexError would surface instead of corrupting memory.
    # A debug build: compiling it takes half a minute, so it runs with the slow tests
    import os
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", _BOUNDS_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("(") == 4


def test_on_infeasible_raise_still_raises_the_named_error(monkeypatch):
    # the active set proves these infeasible; with on_infeasible="raise" fit_many raises as fit does
    monkeypatch.setenv("ATTSVM_COMPILED", "1")
    monkeypatch.setattr(batch, "_compiled_module", None)
    from attsvm.svm import InfeasibleSVMError

    rng = np.random.default_rng(0)
    probs = [paper_instance(10, 5, 4, seed=s) for s in range(10)]
    toks = [rng.integers(0, 5, size=10) for _ in probs]
    status = AttentionSVM().fit_many(probs, toks)
    assert status[0].status_ == "infeasible" and status[0].info_["path"] == "batched-active-set"
    with pytest.raises(InfeasibleSVMError, match=r"infeasible for tokens \[4, 3, 2"):
        AttentionSVM(on_infeasible="raise").fit_many(probs, toks)


def test_rows_written_over_the_callers_stack_are_the_rows_of_a_separate_output():
    # overwrite_x (fit_many's own stack): the rows replace X in place, so each row must be read before its
    # sequence's selected token is zeroed; tied rows (the tie rule reads x_iα after writes) included
    probs = [paper_instance(6, 8, 10, seed=s) for s in range(40)]
    toks = [p.optimal_tokens(ties="first") for p in probs]
    X, Z, a = _stack(probs, toks)
    X[7, 1, (a[7, 1] + 2) % 8] = X[7, 1, a[7, 1]]  # a tied token: LEAVE_TIED either way
    given = X.copy()
    ref = gi.solve_stack(X, Z, a, gi.GI_TOL, gi.max_iterations(42), threads=2)
    np.testing.assert_array_equal(X, given)  # (without overwrite_x the caller's X is left alone)
    own = X.copy()
    out = gi.solve_stack(own, Z, a, gi.GI_TOL, gi.max_iterations(42), threads=2, overwrite_x=True)
    assert out["A"] is own
    ok = ref["code"] >= 0
    assert ok.sum() == 39 and not ok[7] and out["code"][7] == batch.LEAVE_TIED
    for key in ("A", "W", "lam", "margins", "support", "stats", "code"):
        np.testing.assert_array_equal(out[key][ok], ref[key][ok], err_msg=key)  # bit for bit
    assert not np.shares_memory(ref["A"], X)


def _exponent_by_selection(v):
    mant, ex = np.frexp(np.sort(v)[len(v) // 2])
    return int(ex - 1 if mant == 0.5 else ex)


def test_the_scale_exponent_is_that_of_the_upper_median():
    # g = 2^e with e = ⌈log₂⌉ of the upper median of 1/s, counted off the exponent bits; checked against the
    # sort on exact powers of two (where ⌈log₂⌉ is not the frexp exponent), ties, odd and even K, and the
    # cases that fall back to selection (exponents spanning more than the counts, subnormals)
    rng = np.random.default_rng(0)
    cnt = np.empty(gi._EXPONENT_SPAN, dtype=np.int64)
    cases = []
    for K in (1, 2, 3, 7, 42, 43, 210):
        cases.append(np.exp(rng.normal(0.0, 2.0, K)))
        cases.append(2.0 ** rng.integers(-5, 5, K).astype(float))  # exact powers of two, many tied
        cases.append(np.where(rng.random(K) < 0.5, 1.0, 2.0 ** rng.integers(-3, 3, K)))
        cases.append(np.exp(rng.normal(0.0, 200.0, K)).clip(1e-300, 1e300))  # a span beyond the counts
    cases.append(np.array([5e-324, 1.0, 3.0]))  # a subnormal
    cases.append(np.array([0.75, 1.0, 1.5, 2.0, 2.0000000000000004]))
    for v in cases:
        v = np.ascontiguousarray(v)
        scratch = np.empty(len(v))
        assert gi._scale_exponent(v, scratch, cnt) == _exponent_by_selection(v), v


@pytest.mark.timeout(120)
def test_a_stack_job_solves_each_chunk_once_and_reports_them_in_order():
    probs = [paper_instance(6, 8, 10, seed=s) for s in range(5 * gi.MIN_PER_THREAD + 3)]
    toks = [p.optimal_tokens(ties="first") for p in probs]
    X, Z, a = _stack(probs, toks)
    ref = gi.solve_stack(X, Z, a, gi.GI_TOL, gi.max_iterations(42), threads=1)
    B = len(probs)
    for threads in (1, 2, 3):
        job = gi.StackJob(X, Z, a, gi.GI_TOL, gi.max_iterations(42), threads)
        seen = []
        while True:
            upto = job.finished()
            assert 0 <= upto <= B and (not seen or upto >= seen[-1]) and (upto == B or upto % gi.CHUNK == 0)
            seen.append(upto)
            # every instance reported finished is solved: its code is what the single-threaded solve gave
            np.testing.assert_array_equal(job.out["code"][:upto], ref["code"][:upto])
            if upto == B or not job.step():
                break
        out = job.finish()
        assert job.finished() == B
        for key in ref:
            np.testing.assert_array_equal(out[key], ref[key], err_msg=key)  # bit for bit
        assert (job._sched[2:] == 1).all() and job._sched[0] >= B  # (each chunk solved exactly once)


@pytest.mark.timeout(120)
def test_a_stack_job_left_by_an_error_stops_its_threads_before_the_error_returns():
    probs = [paper_instance(6, 8, 10, seed=s) for s in range(8 * gi.MIN_PER_THREAD)]
    X, Z, a = _stack(probs, [p.optimal_tokens(ties="first") for p in probs])
    with pytest.raises(RuntimeError, match="boom"), gi.StackJob(X, Z, a, gi.GI_TOL, gi.max_iterations(42), 2) as job:
        raise RuntimeError("boom")
    assert not job._futures  # (waited for)
    snapshot = job.out["code"].copy()
    import time

    time.sleep(0.05)
    np.testing.assert_array_equal(job.out["code"], snapshot)  # nothing writes into the arrays any more


@pytest.mark.timeout(120)
def test_a_stack_job_solves_a_stack_published_as_it_is_written():
    # the caller writes the stack while the pool's thread solves the part published so far: the answer
    # is the one of the whole stack given at once, bit for bit; this thread solves only once all is published
    probs = [paper_instance(6, 8, 10, seed=s) for s in range(4 * gi.MIN_PER_THREAD + 9)]
    X, Z, a = _stack(probs, [p.optimal_tokens(ties="first") for p in probs])
    ref = gi.solve_stack(X, Z, a, gi.GI_TOL, gi.max_iterations(42), threads=1)
    B = len(probs)
    for threads in (1, 2):
        X2, Z2, a2 = np.zeros_like(X), np.zeros_like(Z), np.zeros_like(a)
        with gi.StackJob(X2, Z2, a2, gi.GI_TOL, gi.max_iterations(42), threads, overwrite_x=True, ready=0) as job:
            for lo in range(0, B, 48):
                hi = min(lo + 48, B)
                X2[lo:hi], Z2[lo:hi], a2[lo:hi] = X[lo:hi], Z[lo:hi], a[lo:hi]
                if hi < B:
                    with pytest.raises(RuntimeError, match="publish all"):
                        job.step()
                job.publish(hi)
            out = job.finish()
        assert out["A"] is X2
        for key in ("W", "lam", "margins", "support", "stats", "code"):
            np.testing.assert_array_equal(out[key], ref[key], err_msg=key)
    with pytest.raises(ValueError, match="X must be a writeable C-contiguous float64"):
        gi.StackJob(X[:, :, ::2], Z, a, gi.GI_TOL, 100, ready=0)


@pytest.mark.timeout(120)
def test_a_stack_job_left_by_an_error_before_all_is_published_stops_its_threads():
    # the pool's thread waits for data the caller never writes: leaving the block on an error stops the job,
    # and the chunk it waits for is left unsolved (its input was never written: here a selection far out of
    # range, which a solve would read past the stack with)
    import time

    probs = [paper_instance(6, 8, 10, seed=s) for s in range(4 * gi.MIN_PER_THREAD)]
    X, Z, a = _stack(probs, [p.optimal_tokens(ties="first") for p in probs])
    a[gi.CHUNK :] = 10**9  # (unwritten: never published)
    job = gi.StackJob(X, Z, a, gi.GI_TOL, 100, 2, ready=0)
    job.out["code"][gi.CHUNK :] = -(10**6)

    def fail() -> None:
        with job:
            job.publish(gi.CHUNK)
            deadline = time.monotonic() + 60
            while job.finished() < gi.CHUNK and time.monotonic() < deadline:
                time.sleep(0.001)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail()
    assert not job._futures and job.finished() == gi.CHUNK
    assert (job.out["code"][gi.CHUNK :] == -(10**6)).all()  # (nothing past what was published was solved)
    with pytest.raises(RuntimeError, match="stopped"):
        job.publish(len(probs))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("threads", [1, 2])
def test_a_stack_job_not_wholly_published_is_stopped_not_waited_for(threads):
    # finishing (or leaving the block normally) before everything is published would wait for ever for a
    # pool thread that waits for the rest: the job is stopped instead, and says so
    probs = [paper_instance(6, 8, 10, seed=s) for s in range(4 * gi.MIN_PER_THREAD)]
    X, Z, a = _stack(probs, [p.optimal_tokens(ties="first") for p in probs])
    job = gi.StackJob(X, Z, a, gi.GI_TOL, 100, threads, ready=0)
    job.publish(gi.CHUNK)
    with pytest.raises(RuntimeError, match=f"16 of {len(probs)} instances were published"):
        job.finish()
    assert not job._futures
    with (
        pytest.raises(RuntimeError, match="were published"),
        gi.StackJob(X, Z, a, gi.GI_TOL, 100, threads, ready=0) as j,
    ):
        j.publish(2 * gi.CHUNK)
    assert not j._futures and j.finished() <= 2 * gi.CHUNK


def test_instances_whose_active_set_drops_rows_match_fit():
    # a drop deletes the slot's row of L and restores the triangle by Givens rotations (M's rows too):
    # instances with one drop or several, at K = 42 and K = 210, against fit's independent solution
    cases = [(paper_instance(6, 8, 10, seed=s), 42) for s in range(300)]
    cases += [(paper_instance(15, 15, 20, seed=s), 210) for s in range(12)]
    checked = {1: 0, 2: 0}
    for K in (42, 210):
        probs = [p for p, k in cases if k == K]
        toks = [p.optimal_tokens(ties="first") for p in probs]
        out = _solve(probs, toks)
        active = (out["lam"] > 0).sum(axis=(1, 2))
        drops = (out["code"] - active) // 2  # (each drop is an iteration, and its row is added again or not)
        for b in np.flatnonzero(drops > 0).tolist():
            ref = AttentionSVM().fit(probs[b], toks[b])
            assert out["code"][b] > 0 and out["stats"][b, 1] <= CERT_TOL and out["stats"][b, 3] <= CERT_TOL
            np.testing.assert_allclose(out["W"][b], ref.W_, rtol=0, atol=W_RTOL * np.abs(ref.W_).max())
            checked[min(int(drops[b]), 2)] += 1
    assert checked[1] >= 20 and checked[2] >= 5, checked


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ready", [None, 0])
def test_a_stack_job_whose_pool_is_busy_solves_alone(ready):
    # another job holds every pool thread: this one must not wait for its own pool thread to start (it
    # would wait until the other is done), but solve alone and withdraw the queued thread
    import threading

    from attsvm import _threads

    probs = [paper_instance(6, 8, 10, seed=s) for s in range(3 * gi.MIN_PER_THREAD)]
    X, Z, a = _stack(probs, [p.optimal_tokens(ties="first") for p in probs])
    ref = gi.solve_stack(X, Z, a, gi.GI_TOL, gi.max_iterations(42), threads=1)
    gate = threading.Event()
    pool = _threads._pool(2)
    blockers = [pool.submit(gate.wait) for _ in range(pool._max_workers)]
    try:
        job = gi.StackJob(X, Z, a, gi.GI_TOL, gi.max_iterations(42), 2, ready=ready)
        if ready is not None:
            job.publish(len(probs))
        out = job.finish()
        assert not gate.is_set() and not job._futures  # (solved while the pool was still busy)
        for key in ref:
            np.testing.assert_array_equal(out[key], ref[key], err_msg=key)
    finally:
        gate.set()
        for b in blockers:
            b.result()


def test_a_stack_job_refuses_queries_or_selections_of_another_shape():
    # the kernel reads Z and α without bounds checks: a mismatched shape is refused up front, by name
    probs = [paper_instance(6, 8, 10, seed=s) for s in range(4)]
    X, Z, a = _stack(probs, [p.optimal_tokens(ties="first") for p in probs])
    for Zb, ab in ((Z[:3], a), (Z[:, :5], a), (Z, a[:, :5]), (Z, a[:3])):
        with pytest.raises(ValueError, match=r"StackJob: X of shape \(4, 6, 8, 10\) needs Z of shape"):
            gi.StackJob(X, Zb, ab, gi.GI_TOL, 100)
