"""Many certified Frobenius attention SVMs as one program (docs/spec.md §3), arrays in and arrays out.

:meth:`AttentionSVM.fit_many <attsvm.svm.AttentionSVM.fit_many>` and ``fit_stack`` hand the Frobenius
instances here (through :mod:`attsvm.svm._fitted`, which turns the answer, a :class:`Stacked`, into
estimators); the fit's parameters come as a :class:`~attsvm.svm._base.FitSettings`.
Instances of one shape (n, T, d, d_z) are stacked and solved together, by one of two routes
(:func:`uses_compiled`):

- **compiled** (numba installed, ``max_iter`` None; up to ``COMPILED_MAX_K`` rows, rank-deficient shapes
  included): the Goldfarb–Idnani dual active set of :mod:`._active_set` solves and certifies each instance
  in one compiled pass, with the same reduction and certificate as below; an instance it proves
  infeasible comes back with its Farkas certificate once :func:`~attsvm.svm.certificate.farkas_certificate`
  verifies it. :func:`solve_problems` lets its caller overlap its Python with the kernel
  (:func:`_solve_problems_compiled`): the pool's threads start solving while this one runs the caller's
  callbacks (``fit_many`` builds the estimators around views of the answer's arrays, then gives them
  their numbers run by run as they are solved).
- **NumPy** (up to ``BATCH_MAX_K`` rows of full rank), each step a batched NumPy/LAPACK call over the stack:

1. **Constraints** ``a_it = x_{iα_i} − x_it`` and their K = n(T − 1) flat rows, for the whole stack.
2. **Reduction** (:func:`~attsvm.svm.reduction.reduce_stack`, steps 1 and 3 of :mod:`.reduction`): the Gram
   matrix of the unit rows ``Ĝ_kl = G_kl / (s_k s_l)``, ``b̂ = b / (s g)`` with ``s_k = ‖a_k‖‖z_k‖`` and g the
   power of two at the median of b/s — the function whose case B = 1 is ``fit``'s
   :func:`~attsvm.svm.reduction.reduce_dense`.
3. **Primal-dual active set** (Hintermüller–Ito–Kunisch, as :func:`attsvm.svm.frobenius._pdas`): each
   round gathers every pending instance's free rows and solves the blocks with one batched LU per
   block size — each far smaller than K × K after the first round, and never depending on the other
   instances of the batch — until each instance's active set repeats.
4. **Lift and certify** in the user's units: ``λ_k = g λ̂_k / s_k``, ``W = Σ_k λ_k a_k z_kᵀ``, and the
   certificate of :mod:`.certificate` (relative violation, duality gap, complementarity, support)
   computed for the whole stack (:func:`~attsvm.svm.certificate.certify_stack`).

An instance leaves the batch for :meth:`AttentionSVM.fit` — the one-at-a-time route with all its
fallbacks (constraint generation, LDP, the Farkas LP) — when a feature vanishes (a duplicate token:
possibly infeasible), its active set does not settle, its face system is singular, its infeasibility
certificate does not verify, or its certificate misses the tolerance. So every instance comes back as
``fit`` would return it: the same status, a certificate that passes, or a verified infeasibility
certificate; a failing instance never changes the others.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib.util
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from numpy.typing import NDArray

from .._rows import differences as _differences
from .._threads import batch_threads, compiled_wanted
from ._base import ConstraintSet, FitSettings
from .certificate import FarkasCertificate, certify_stack, farkas_certificate
from .frobenius import FrobeniusOptions
from .reduction import reduce_stack
from .status import LEAVE_INFEASIBLE, LEAVE_MAX_ITER, LEAVE_SINGULAR, LEAVE_TIED

if TYPE_CHECKING:
    from ..problem import AttentionProblem

__all__ = [
    "BATCH_MAX_K",
    "COMPILED_MAX_K",
    "compiled",
    "deficient_shape",
    "group_key",
    "max_k",
    "rank_deficient",
    "ready",
    "Stacked",
    "LEAVE_TIED",
    "LEAVE_MAX_ITER",
    "LEAVE_INFEASIBLE",
    "LEAVE_SINGULAR",
    "gc_paused",
    "farkas_of",
    "solve_arrays",
    "solve_problems",
    "uses_compiled",
]

# Instances with more constraint rows than this go one at a time: the batched rounds carry the full
# K × K Gram matrices (products and gathers), the one-at-a-time route builds only what its working set
# needs, and the two cross between K = 90 and K = 126 (benchmarks/bench_batch.py; at K = 210 batched
# is 0.6× of one at a time).
BATCH_MAX_K = 80
# The compiled route (numba) keeps no Gram matrix: it builds one column per row that enters its working
# set, so it stays ahead of one-at-a-time fits further: one thread, per instance, 0.27 against 1.05 ms at
# K = 210 and 1.4 against 6.9 ms at K = 380, (20, 20, 30) (benchmarks/bench_batch.py); larger K untested
COMPILED_MAX_K = 400
# (the codes of a stack's instances, LEAVE_*, are those of attsvm.svm.status: the compiled kernel sets them too)
# Gram entries per chunk of the stack (16 MiB of float64): large enough that the per-round NumPy calls
# are few per instance, small enough to bound memory (benchmarks/bench_batch.py)
CHUNK_FLOATS = 2_097_152


def _pdas_many(
    G: NDArray[np.float64], b: NDArray[np.float64], ridge: NDArray[np.float64], max_iter: int
) -> tuple[NDArray[np.float64], NDArray[np.bool_], NDArray[np.int64]]:
    """Batched primal-dual active set on ``min ½λᵀĜλ − b̂ᵀλ, λ ≥ 0`` (module doc, step 3).

    Each round solves every pending instance's free block ``Ĝ_FF λ_F = b̂_F``: the free rows of each
    instance are gathered, and the instances with free sets of one size share one batched LU (the
    supports are small: the blocks are far smaller than K × K after the first round).

    Returns λ (B, K), whether each instance settled, and its number of face solves."""
    B, K = b.shape
    c = 1.0 / np.maximum(np.trace(G, axis1=1, axis2=2) / K, 1e-300)
    active = b <= 0  # λ = 0 where the gradient −b is ≥ 0
    lam = np.zeros((B, K))
    done = np.zeros(B, dtype=bool)
    iters = np.zeros(B, dtype=np.int64)
    pending = np.arange(B)
    for _ in range(max_iter):
        if pending.size == 0:
            break
        P = pending.size
        every = P == B  # (no gathers of G while every instance is pending)
        act = active if every else active[pending]
        nf = K - act.sum(axis=1)
        x = np.zeros((P, K))
        order = np.argsort(act, axis=1, kind="stable")  # (P, K): each instance's free rows first
        try:
            # one batched LU per free-set size: an instance's block never depends on the others' sizes,
            # so its result is bit for bit the same in any batch
            for size in np.unique(nf[nf > 0]):
                grp = np.flatnonzero(nf == size)
                rows = order[grp, :size]  # (g, size)
                inst = pending[grp]
                Gff = G[inst[:, None, None], rows[:, :, None], rows[:, None, :]]
                Gff[:, np.arange(size), np.arange(size)] += ridge[inst, None]
                y = np.linalg.solve(Gff, b[inst[:, None], rows][:, :, None])[:, :, 0]
                x[grp[:, None], rows] = y
        except np.linalg.LinAlgError:  # a singular face somewhere: those instances go one at a time
            break
        iters[pending] += 1
        grad = np.matmul(G if every else G[pending], x[:, :, None])[:, :, 0] - (b if every else b[pending])
        new = x <= c[pending, None] * grad
        settled = (new == act).all(axis=1)
        lam[pending] = x
        done[pending[settled]] = True
        active[pending] = new
        pending = pending[~settled]
    return lam, done, iters


def compiled() -> ModuleType | None:
    """The compiled solver :mod:`attsvm.svm._active_set`, or None where numba is not installed (the
    ``fast`` extra) or ``ATTSVM_COMPILED=0`` turns it off. Waits for the background load of the kernels
    (:func:`start_preload`) if it is still running: the route never depends on how far it got."""
    global _compiled_module
    wait_preload()
    if _compiled_module is None:
        with _compiled_lock:  # (threads that ask while numba loads wait for the choice, never see half of it)
            if _compiled_module is None:
                chosen: ModuleType | bool = False
                if compiled_wanted():
                    try:
                        from . import _active_set

                        chosen = _active_set
                    except ImportError:  # numba not installed: the NumPy route
                        pass
                _compiled_module = chosen
    return _compiled_module if isinstance(_compiled_module, ModuleType) else None


_compiled_module: ModuleType | bool | None = None  # None: not chosen yet; False: the NumPy route
_compiled_lock = threading.Lock()
_preload_thread: threading.Thread | None = None
_first_use: Callable[[], object] | None = None


def start_preload(first_use: Callable[[], object] | None = None) -> None:
    """Load the compiled kernels in a background thread (:func:`attsvm.svm._active_set.warm`): importing
    numba and loading the kernels' machine code from its cache takes about 0.4 s on 2 cores, which the first
    ``fit_many`` or ``fit_stack`` of a process would otherwise pay; started once, at the end of ``import
    attsvm.svm``, it overlaps whatever the caller does next (building its problems). Every use of the batch
    waits for it (:func:`compiled`), and so do a fork (the child must not inherit a half-held lock) and the
    interpreter's exit. Nothing happens without numba, with ``ATTSVM_COMPILED=0``, or with
    ``ATTSVM_PRELOAD=0``. ``first_use``: the rest of a first call's one-time work, run in that thread after the
    kernels (the package passes what its estimator imports on first use)."""
    global _preload_thread, _first_use
    if _preload_thread is not None or not compiled_wanted() or os.environ.get("ATTSVM_PRELOAD", "1") == "0":
        return
    if importlib.util.find_spec("numba") is None:
        return
    _first_use = first_use
    thread = threading.Thread(target=_preload, name="attsvm-preload", daemon=True)
    _preload_thread = thread
    os.register_at_fork(before=wait_preload)
    atexit.register(wait_preload)
    thread.start()


def _preload() -> None:
    with contextlib.suppress(Exception):  # (an error here reappears, with its traceback, at the first real call)
        kernel = compiled()
        if kernel is not None:
            kernel.warm()
        if _first_use is not None:
            _first_use()


def wait_preload() -> None:
    """Wait for the background load of :func:`start_preload`, if one runs (from any other thread)."""
    thread = _preload_thread
    if thread is not None and thread is not threading.current_thread():
        thread.join()


def uses_compiled(settings: FitSettings) -> bool:
    """Whether the instances of a fit with these ``settings`` (an :class:`~attsvm.svm._base.FitSettings`, or
    any object with its attributes) take the compiled route: numba is there and ``max_iter`` is None (an
    explicit iteration limit is honoured by the NumPy route and ``fit``). On it, instances of up to
    ``COMPILED_MAX_K`` rows enter the batch, rank-deficient shapes (:func:`rank_deficient`) included: its
    active set keeps its rows independent and proves infeasibility with a Farkas certificate. The NumPy
    route takes up to ``BATCH_MAX_K`` rows of full rank."""
    return settings.max_iter is None and compiled() is not None


def max_k(settings: FitSettings) -> int:
    """The most constraint rows an instance may have to enter the batch of a fit with these ``settings``
    (:func:`uses_compiled`)."""
    return COMPILED_MAX_K if uses_compiled(settings) else BATCH_MAX_K


class Stacked(NamedTuple):
    """A stack of B instances of one shape as the batch leaves it (arrays over the first axis b): the rows
    ``A`` (B, n, T, d; 0 at α), queries ``Zq`` (B, n, d_z), constraint ``mask`` (B, n, T), selections
    ``alpha`` (B, n), ``W`` (B, d, d_z), multipliers ``lam`` (B, n, T; the candidate Farkas certificate
    where ``code`` is LEAVE_INFEASIBLE), ``margins`` (B, n, T; inf off the mask), ``support`` (B, n, T),
    the certificate ``stats`` (B, 6: violation, relative violation, gap, relative gap, complementarity,
    g), ``code`` (B: the iteration count, or a negative LEAVE_* code), the ``path`` that solved it and
    the solve time ``per`` instance (seconds). Only the entries of the instances that
    :meth:`certified` accepts are meaningful (and ``lam`` of the LEAVE_INFEASIBLE ones): an instance that
    leaves early may leave the others uninitialised, NaN or partial."""

    A: NDArray[np.float64]
    Zq: NDArray[np.float64]
    mask: NDArray[np.bool_]
    alpha: NDArray[np.int64]
    W: NDArray[np.float64]
    lam: NDArray[np.float64]
    margins: NDArray[np.float64]
    support: NDArray[np.bool_]
    stats: NDArray[np.float64]
    code: NDArray[np.int64]
    path: str
    per: float

    def certified(self, tol: float) -> NDArray[np.bool_]:
        """The instances the batch solved whose certificate passes ``tol`` (the others go to ``fit``,
        except the infeasible ones whose candidate verifies, :func:`infeasible`)."""
        return _certified(self.code, self.stats, self.W, tol)


def _certified(
    code: NDArray[np.int64], stats: NDArray[np.float64], W: NDArray[np.float64], tol: float
) -> NDArray[np.bool_]:
    """:meth:`Stacked.certified` of these instances' arrays."""
    return (code >= 0) & (stats[:, 1] <= tol) & (stats[:, 3] <= tol) & np.isfinite(W).all(axis=(1, 2))


def solve_problems(
    settings: FitSettings,
    problems: list[AttentionProblem],
    alpha: NDArray[np.int64],
    opt: FrobeniusOptions,
    on_stack: Callable[[Stacked], None] | None = None,
    on_solved: Callable[[Stacked, list[int]], None] | None = None,
) -> Stacked:
    """Solve the Frobenius SVMs of ``problems`` (one shape, :func:`group_key`) at the selections ``alpha``
    (B, n) as one program (module doc): :func:`solve_arrays` of their stacked tokens and queries.

    On the compiled route the caller may work while the pool's threads solve
    (:func:`_solve_problems_compiled`): ``on_stack(st)`` is called once the stack's arrays exist (not yet
    solved), then ``on_solved(st, idx)`` with the instances ``idx`` that the batch certified at
    ``settings.tol``, run of solved instances by run, in order; the returned stack's ``per`` is then the
    group's wall time per instance, the callbacks included. The NumPy route calls neither."""
    B = len(problems)
    n, T, d, dz = group_key(problems[0])
    kernel = compiled()
    if kernel is not None and uses_compiled(settings):
        return _solve_problems_compiled(float(settings.tol), problems, alpha, kernel, on_stack, on_solved)
    X = np.empty((B, n, T, d))  # (ours: the compiled route writes A over it)
    Zq = np.empty((B, n, dz))
    _stack_into(problems, X, Zq, 0, B)
    return solve_arrays(settings, X, Zq, alpha, opt, overwrite_x=True)


def _stack_into(
    problems: list[AttentionProblem], X: NDArray[np.float64], Zq: NDArray[np.float64], lo: int, hi: int
) -> None:
    """Write the tokens and queries of ``problems[lo:hi]`` (one shape) into ``X[lo:hi]`` and ``Zq[lo:hi]``."""
    part = problems[lo:hi]
    _, n, T, d = X.shape
    # (one shape: concatenating into the stack costs half of np.stack, which reshapes every array first)
    np.concatenate([p.X for p in part], out=X[lo:hi].reshape(-1, T, d))
    q = [p.query_index for p in part]
    if None in q:  # (cross-attention somewhere: its queries as given)
        np.concatenate([p.queries for p in part], out=Zq[lo:hi].reshape(-1, Zq.shape[2]))
    else:  # self-attention: z_i = x_{i,q} of each instance's query position, read off the stack at once
        Zq[lo:hi] = X[lo:hi][np.arange(hi - lo), :, np.asarray(q, dtype=np.int64)]


def _solve_problems_compiled(
    tol: float,
    problems: list[AttentionProblem],
    alpha: NDArray[np.int64],
    kernel: ModuleType,
    on_stack: Callable[[Stacked], None] | None,
    on_solved: Callable[[Stacked, list[int]], None] | None,
) -> Stacked:
    """:func:`solve_problems` by the compiled dual active set, on this thread and the pool's at once
    (:class:`~attsvm.svm._active_set.StackJob`). This thread stacks the problems' arrays in parts
    (``STACK_FIRST`` instances, then ``STACK_PART`` at a time), and the pool's threads solve each part as
    it is published; then, while they solve, this thread runs ``on_stack`` and hands the certified
    instances of the solved runs to ``on_solved``, in order, solving a run itself whenever too few are
    waiting (``FILL_MIN``). The stack is, bit for bit, the one :func:`solve_arrays` returns, except ``per``:
    the group's wall time per instance, stacking and the callbacks included (they overlap the solve)."""
    t0 = time.perf_counter()
    B = len(problems)
    n, T, d, dz = group_key(problems[0])
    X = np.empty((B, n, T, d))  # (the kernel writes the rows A over it)
    Zq = np.empty((B, n, dz))
    alpha = np.require(alpha, np.int64, ["C", "W"])
    mask = np.ones((B, n, T), dtype=bool)
    np.put_along_axis(mask, alpha[:, :, None], False, axis=2)
    with (
        gc_paused(),
        kernel.StackJob(
            X, Zq, alpha, kernel.GI_TOL, kernel.max_iterations(n * (T - 1)), batch_threads(), True, ready=0
        ) as job,
    ):
        for lo, hi in itertools.pairwise([0, *range(STACK_FIRST, B, STACK_PART), B]):
            if hi > lo:
                _stack_into(problems, X, Zq, lo, hi)
                job.publish(hi)
        o = job.out
        st = Stacked(
            o["A"], Zq, mask, alpha, o["W"], o["lam"], o["margins"], o["support"], o["stats"], o["code"],
            path="batched-active-set", per=0.0,
        )  # fmt: skip
        if on_stack is not None:
            on_stack(st)
        done = 0
        while done < B:
            upto = job.finished()
            if upto - done < FILL_MIN and upto < B:  # (a few at a time cost more NumPy calls than they save)
                if not job.step():
                    job.finish()
                continue
            if on_solved is not None:
                ok = _certified(st.code[done:upto], st.stats[done:upto], st.W[done:upto], tol)
                on_solved(st, (np.flatnonzero(ok) + done).tolist())
            done = upto
    return st._replace(per=(time.perf_counter() - t0) / B)


# _solve_problems_compiled hands on the solved instances once this many more are solved (or all are)
FILL_MIN = 64
# ... and stacks the problems' arrays in parts: the first small, so that the pool's threads start soon
STACK_FIRST = 64
STACK_PART = 256

_gc_lock = threading.Lock()
_gc_depth = 0  # gc_paused blocks open now, in any thread
_gc_was_enabled = False  # the collector's state when the outermost of them opened


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside the block. A batch makes thousands of estimators, each a few
    containers, and none of them in a cycle: without the pause the collector runs every few hundred of
    them, and now and then a full collection walks every object of the process (a process that imported
    torch holds hundreds of thousands: about 0.12 s each). On 2 cores, 200 back-to-back calls on 1,000
    instances at (6, 8, 10) took 12.3 µs per instance on average with the pause (2 full collections) and
    15.7 µs without it (8), 1.28× (benchmarks/bench_gc.py, 2026-12-05).

    The collector's state is process-wide: overlapping blocks (in any thread) pause it once, and the last
    one to close restores the state the first one found."""
    global _gc_depth, _gc_was_enabled
    with _gc_lock:
        if _gc_depth == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_depth += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_depth = max(0, _gc_depth - 1)  # (0 already in a child forked inside this block)
            if _gc_depth == 0 and _gc_was_enabled:
                gc.enable()


def _gc_pause_after_fork() -> None:
    """In a child made by fork: the blocks open in the parent's other threads never close here, so the
    child starts with none open and the collector as the outermost of them found it."""
    global _gc_lock, _gc_depth
    _gc_lock = threading.Lock()
    if _gc_depth:
        _gc_depth = 0
        if _gc_was_enabled:
            gc.enable()


os.register_at_fork(after_in_child=_gc_pause_after_fork)


def solve_arrays(
    settings: FitSettings,
    X: NDArray[np.float64],
    Zq: NDArray[np.float64],
    alpha: NDArray[np.int64],
    opt: FrobeniusOptions,
    overwrite_x: bool = False,
) -> Stacked:
    """Solve the Frobenius SVMs of the stack X (B, n, T, d), Zq (B, n, d_z) at the selections ``alpha``
    (B, n) as one program (module doc). With numba installed (and ``settings.max_iter`` None; ``settings``
    an :class:`~attsvm.svm._base.FitSettings` or any object with its attributes) the stack goes to the
    compiled dual active set of :mod:`._active_set`, spread over :func:`attsvm._threads.batch_threads`
    threads; otherwise it is processed in chunks of about
    ``CHUNK_FLOATS`` Gram entries, which bounds the memory of a step while keeping the NumPy calls per
    instance few. ``overwrite_x``: X is the caller's own stack, which the compiled route may overwrite
    with the rows A (the returned ``A`` is then X)."""
    kernel = compiled()
    if kernel is not None and uses_compiled(settings):
        return _solve_compiled(X, Zq, alpha, kernel, overwrite_x)
    B, n, T, _ = X.shape
    if B == 0:
        return _empty(X, Zq, alpha)
    K = n * (T - 1)
    size = max(1, CHUNK_FLOATS // (K * K))
    t0 = time.perf_counter()
    # (an instance far from unit scale over- or underflows here: its certificate fails and fit rescales it)
    with np.errstate(all="ignore"):
        parts = [
            _solve_chunk(float(settings.tol), X[lo : lo + size], Zq[lo : lo + size], alpha[lo : lo + size], opt)
            for lo in range(0, B, size)
        ]
    if len(parts) == 1:
        return parts[0]._replace(per=(time.perf_counter() - t0) / max(B, 1))
    cat = [np.concatenate(arrays) for arrays in zip(*(p[:10] for p in parts))]  # (the 10 arrays)
    return Stacked._make([*cat, parts[0].path, (time.perf_counter() - t0) / B])


def _empty(X: NDArray[np.float64], Zq: NDArray[np.float64], alpha: NDArray[np.int64]) -> Stacked:
    """:func:`solve_arrays` of a stack of no instances."""
    _, n, T, d = X.shape
    nt = np.zeros((0, n, T))
    return Stacked(
        np.zeros((0, n, T, d)),
        Zq,
        nt.astype(bool),
        alpha,
        np.zeros((0, d, Zq.shape[2])),
        nt,
        nt.copy(),
        nt.astype(bool),
        np.zeros((0, 6)),
        np.zeros(0, dtype=np.int64),
        path="batched-dense",
        per=0.0,
    )


def _solve_compiled(
    X: NDArray[np.float64],
    Zq: NDArray[np.float64],
    alpha: NDArray[np.int64],
    kernel: ModuleType,
    overwrite_x: bool = False,
) -> Stacked:
    """:func:`solve_arrays` by the compiled dual active set (:mod:`._active_set`), which solves and
    certifies each instance in one pass."""
    t0 = time.perf_counter()
    B, n, T, _ = X.shape
    res = kernel.solve_stack(
        X, Zq, alpha, kernel.GI_TOL, kernel.max_iterations(n * (T - 1)), batch_threads(), overwrite_x=overwrite_x
    )
    # res["A"]: the constraint rows a_it = x_iα − x_it (exactly 0 at t = α_i). An instance kept by the kernel
    # has no tied row, so these are the rows attsvm.tokens.differences builds.
    mask = np.ones((B, n, T), dtype=bool)
    np.put_along_axis(mask, alpha[:, :, None], False, axis=2)
    return Stacked(
        res["A"],
        Zq,
        mask,
        alpha,
        res["W"],
        res["lam"],
        res["margins"],
        res["support"],
        res["stats"],
        res["code"],
        path="batched-active-set",
        per=(time.perf_counter() - t0) / max(B, 1),
    )


def _solve_chunk(
    tol: float,
    X: NDArray[np.float64],
    Zq: NDArray[np.float64],
    alpha: NDArray[np.int64],
    opt: FrobeniusOptions,
) -> Stacked:
    """:func:`solve_arrays` on one chunk by NumPy (steps 1–4 of the module doc)."""
    B, n, T, d = X.shape
    # 1. constraints (A is exactly 0 at t = α_i) and their flat rows, K = n(T − 1) per instance
    A = _differences(np.take_along_axis(X, alpha[:, :, None, None], axis=2)[:, :, 0], X)  # (ties: 0 rows)
    mask = np.ones((B, n, T), dtype=bool)
    np.put_along_axis(mask, alpha[:, :, None], False, axis=2)
    K = n * (T - 1)
    idx = np.nonzero(mask.reshape(B, n * T))[1].reshape(B, K)  # row-major, as ConstraintSet's
    rows = np.arange(B)[:, None]
    Af = A.reshape(B, n * T, d)[rows, idx]  # (B, K, d)
    Zf = Zq[rows, idx // T]  # (B, K, d_z)
    # 2. the reduction (reduction.reduce_stack): Gram matrix of the unit rows, b̂ = b/(s g)
    G, bh, s, g, ok = reduce_stack(Af, Zf, np.ones((B, K)), by_rows=False)
    # 3. the active-set iteration (the ridge as the one-at-a-time path: opt.ridge · mean diagonal)
    ridge = opt.ridge * np.maximum(np.trace(G, axis1=1, axis2=2) / K, 1e-300)
    lam_hat, settled, iters = _pdas_many(G, bh, ridge, max(1, min(opt.pdas_max_iter, opt.max_iter - 1)))
    ok &= settled
    # 4. lift and certify (docs/spec.md §3; the certificate of attsvm.svm.certificate.certify_stack)
    lam = lam_hat * g[:, None] / s  # multipliers of the user's rows (degree 2)
    W = (Af * lam[:, :, None]).transpose(0, 2, 1) @ Zf  # (B, d, d_z)
    cert = certify_stack(A, Zq, mask, W, lam, rows=(Af, Zf, idx))
    ok &= (cert.relative_violation <= tol) & (cert.relative_gap <= tol) & np.isfinite(cert.primal)
    stats = np.stack(
        [cert.violation, cert.relative_violation, cert.gap, cert.relative_gap, cert.complementarity, g], axis=1
    )
    return Stacked(
        A,
        Zq,
        mask,
        alpha,
        W,
        cert.lam,
        cert.margins,
        cert.support,
        stats,
        np.where(ok, iters, LEAVE_TIED),
        path="batched-dense",
        per=0.0,  # (set by solve_arrays)
    )


def farkas_of(st: Stacked, i: int) -> tuple[ConstraintSet, FarkasCertificate] | None:
    """Instance ``i`` of ``st``, which the active set found infeasible (code LEAVE_INFEASIBLE): its constraint
    set and its candidate as a verified Farkas certificate
    (:func:`~attsvm.svm.certificate.farkas_certificate`), or None where the candidate does not verify (the
    instance then goes through ``fit``)."""
    n, T = st.mask.shape[1:]
    eq = np.zeros((n, T), dtype=bool)
    cs = ConstraintSet._trusted(st.A[i], st.Zq[i], st.mask[i], st.mask[i].astype(np.float64), eq)
    cert = farkas_certificate(cs, st.lam[i], "active set")
    return (cs, cert) if cert.valid else None


def group_key(problem: AttentionProblem) -> tuple[int, ...]:
    """Instances with equal keys are stacked together."""
    n, T, d = problem.X.shape
    return (n, T, d, d if problem.Z is None else problem.Z.shape[1])  # (queries: a view per call)


def rank_deficient(problem: AttentionProblem) -> bool:
    """More constraint rows than the reduced W can have entries, K > min(d, K)·min(d_z, n) (a bound on
    r_a·r_z read off the shapes, before any reduction; instances whose data are rank-deficient below
    it still enter the batch): a singular Gram matrix, whose degenerate faces the active-set rounds
    rarely settle and where the instance is often infeasible. ``fit`` solves these by the finite
    LDP/NNLS route (attsvm.svm.frobenius), which also returns the Farkas certificate at once, so they
    skip the batch."""
    return deficient_shape(group_key(problem))


def deficient_shape(key: tuple[int, ...]) -> bool:
    """:func:`rank_deficient` read off a :func:`group_key` (n, T, d, d_z)."""
    n, T, d, dz = key
    K = n * (T - 1)
    return K > min(d, K) * min(dz, n)


def ready(settings: FitSettings) -> bool:
    """Whether a fit with these ``settings`` takes the batched route (Frobenius, our backend)."""
    return settings.norm == "fro" and settings.backend == "auto"
