"""Where the arrays of the batched solvers become fitted estimators, and fitted estimators become rows of a stack.

The batched routes work on arrays and know nothing of the estimator: :mod:`.batch` (the Frobenius
stack) returns a :class:`~attsvm.svm.batch.Stacked`, :mod:`.batch_nuclear` one
:class:`~attsvm.svm.batch_nuclear.NuclearSolved` per instance, :mod:`.stack` holds the arrays of an
:class:`~attsvm.svm.stack.SVMStack`; each reads the fit's parameters as a
:class:`~attsvm.svm._base.FitSettings`. This module, imported by :mod:`.estimator` only, is the one place
that turns them into :class:`~attsvm.svm.AttentionSVM` objects (and back, for the rows of a stack that
``fit`` solved):

- :func:`shells` and :func:`fill`: estimators around per-instance views of a stack's arrays, built without
  ``__init__`` (a batch makes thousands: each is one dictionary copy and a few stores) and given their
  numbers once their instances are solved; :func:`estimators` does both.
- :func:`infeasible`: an instance the active set proved infeasible, through the estimator's own acceptance.
- :func:`batched`: ``fit_many``'s batches (the Frobenius stack by shape, the nuclear interior point);
  :func:`solve_group` overlaps building the estimators with the compiled kernel's solve.
- :func:`nuclear`: the nuclear batch's solutions accepted as ``fit`` accepts its own.
- :func:`fit_stack`: ``fit_stack`` — the stack's arrays, the leftovers fitted one at a time, their rows
  written into the stack.

The estimator is passed in (``est``: the one whose parameters are fitted), never imported: the estimator
sits above this module.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._threads import blas_threads
from . import batch, batch_nuclear
from ._base import ConstraintSet, FitSettings, RawSolution, _att_svm_constraints
from .frobenius import FrobeniusOptions
from .stack import SCALARS, SVMStack, check_stack, constraints
from .status import INFEASIBLE, LEAVE_INFEASIBLE, OPTIMAL

if TYPE_CHECKING:
    from ..problem import AttentionProblem

__all__ = [
    "FILL_FIELDS",
    "batched",
    "estimators",
    "fill",
    "fit_stack",
    "infeasible",
    "nuclear",
    "nuclear_batch",
    "proved_infeasible",
    "settings",
    "shells",
    "solve_group",
]

# the fitted numbers a batch sets per instance once it is solved (fill)
FILL_FIELDS = (
    "objective_",
    "max_violation_",
    "relative_violation_",
    "duality_gap_",
    "relative_gap_",
    "complementary_slackness_",
    "n_iter_",
    "info_",
    "solve_time_",
)


def settings(est: Any) -> FitSettings:
    """The parameters of ``est`` that the batched routes read."""
    return FitSettings(est.norm, est.rank, est.backend, est.tol, est.max_iter, est.on_infeasible)


def frobenius_options(fs: FitSettings) -> FrobeniusOptions:
    """The options of the Frobenius batch: a margin below the certificate tolerance (as ``fit`` asks its
    solver), and the explicit iteration limit."""
    opt = FrobeniusOptions(tol=min(float(fs.tol), 1e-10))
    if fs.max_iter is not None:
        opt = replace(opt, max_iter=int(fs.max_iter))
    return opt


# ---------------------------------------------------------------- a stack's arrays as estimators
def shells(cls: type, params: dict[str, Any], st: batch.Stacked, idx: list[int] | None = None) -> list[Any]:
    """New estimators of class ``cls`` with ``params`` for the instances ``idx`` of ``st`` (all: None), each
    around per-instance views of the stack's arrays, which need not be solved yet: the rows A, queries Z,
    mask and right-hand side of its constraint set (whose equality mask is one shared, read-only array),
    its tokens, W, multipliers, margins (inf off the mask) and support. Built without ``__init__``: each
    is a copy of one dictionary (that already holds every fitted attribute, so that setting them adds no
    entry) and a few stores. Each is fitted (as ``fit`` sets an optimal instance) once :func:`fill` gives
    it its numbers; a shell whose instance the batch does not certify is discarded."""
    _, n, T, _ = st.A.shape
    equality = np.zeros((n, T), dtype=bool)
    equality.flags.writeable = False  # (shared by every instance's constraint set)
    rhs_all = st.mask.astype(np.float64)
    arrays = (st.A, st.Zq, st.mask, rhs_all, st.alpha, st.W, st.lam, st.margins, st.support)
    # (the instances' views of each stacked array)
    views = [list(arr) for arr in arrays] if idx is None else [[arr[i] for i in idx] for arr in arrays]
    template = {
        **params,
        "backend_": "frobenius",
        "factors_": None,
        "reached_convex_optimum_": None,
        "_rank": None,
        "certificate_": None,
        "certificate_residual_": None,
        "status_": OPTIMAL,
        "constraints_": None,
        "tokens_": None,
        "W_": None,
        "dual_coef_": None,
        "margins_": None,
        "support_": None,
        **dict.fromkeys(FILL_FIELDS),
    }
    new = object.__new__
    cs_type = ConstraintSet
    out = []
    for A, Z, mask, rhs, tokens, W, lam, margins, support in zip(*views):
        cs = new(cs_type)
        c = cs.__dict__  # (frozen: no setattr; the arrays satisfy its invariants, as ConstraintSet._trusted)
        c["A"] = A
        c["Z"] = Z
        c["mask"] = mask
        c["rhs"] = rhs
        c["equality"] = equality
        e: Any = new(cls)
        d = e.__dict__ = template.copy()
        d["constraints_"] = cs
        d["tokens_"] = tokens
        d["W_"] = W
        d["dual_coef_"] = lam
        d["margins_"] = margins
        d["support_"] = support
        out.append(e)
    return out


def fill(shells: list[Any], idx: list[int], st: batch.Stacked, per: float | None) -> None:
    """Give the :func:`shells` of the instances ``idx`` of ``st`` (solved and certified: the others' arrays
    may not be) their numbers: the norm of W, the 6 columns of the stack's ``stats`` (violation, relative
    violation, gap, relative gap, complementarity, g), the iteration count, ``info_`` (with each one's
    ``global_scale`` g) and, when known, ``solve_time_`` (``per``)."""
    if not shells:
        return
    B, n, T, _ = st.A.shape
    W = st.W[idx]
    objective = np.sqrt(np.einsum("bde,bde->b", W, W)).tolist()
    info = {"backend": "frobenius", "path": st.path, "K": n * (T - 1), "batch_size": B}
    stats = st.stats[idx].T.tolist()
    for e, obj, viol, rviol, gap, rgap, compl, g, it in zip(shells, objective, *stats, st.code[idx].tolist()):
        d = e.__dict__
        d["objective_"] = obj
        d["max_violation_"] = viol
        d["relative_violation_"] = rviol
        d["duality_gap_"] = gap
        d["relative_gap_"] = rgap
        d["complementary_slackness_"] = compl
        d["n_iter_"] = it
        d["info_"] = {**info, "global_scale": g}
        if per is not None:
            d["solve_time_"] = per


def estimators(cls: type, params: dict[str, Any], st: batch.Stacked, keep: NDArray[np.int64]) -> list[Any]:
    """Fitted estimators of class ``cls`` with the parameters ``params`` (those the stack was solved
    with) for the instances ``keep`` of ``st`` that the batch certified (:meth:`Stacked.certified
    <attsvm.svm.batch.Stacked.certified>`), in that order. Their arrays are per-instance views of the
    stack, so an estimator costs a few attribute writes."""
    idx = keep.tolist()
    out = shells(cls, params, st, None if len(idx) == st.A.shape[0] else idx)  # (all: views by iteration)
    fill(out, idx, st, st.per)
    return out


def proved_infeasible(est: Any, st: batch.Stacked) -> dict[int, Any]:
    """The instances of ``st`` the batch proved infeasible with a certificate that verifies
    (:func:`infeasible`), fitted, by position; none with ``on_infeasible="raise"`` (``fit`` raises the
    named error for those)."""
    out: dict[int, Any] = {}
    if est.on_infeasible == "status":
        for i in np.flatnonzero(st.code == LEAVE_INFEASIBLE).tolist():
            e = infeasible(est, st, i)
            if e is not None:
                out[i] = e
    return out


def infeasible(est: Any, st: batch.Stacked, i: int) -> Any:
    """Instance ``i`` of ``st``, which the active set found infeasible (code LEAVE_INFEASIBLE): fitted with
    status "infeasible" through the estimator's own acceptance (``_accept``, as ``fit``) when its
    candidate verifies as a Farkas certificate (:func:`attsvm.svm.batch.farkas_of`); None otherwise
    (``fit``)."""
    proof = batch.farkas_of(st, i)
    if proof is None:
        return None
    cs, cert = proof
    e = type(est)(**est.get_params())
    raw = RawSolution(None, cert.lam, INFEASIBLE, 0, {"backend": "frobenius", "path": st.path})
    return e._accept(cs, st.alpha[i], raw, "frobenius", st.per)


# ---------------------------------------------------------------- fit_many's batches
def solve_group(
    est: Any, problems: list[AttentionProblem], alpha: NDArray[np.int64], opt: FrobeniusOptions
) -> list[Any]:
    """Fit the Frobenius SVMs of ``problems`` (one shape, :func:`attsvm.svm.batch.group_key`) at the
    selections ``alpha`` (B, n) as one program (:func:`attsvm.svm.batch.solve_problems`).

    Returns, per instance, a fitted estimator with ``est``'s parameters, or None where the instance must
    go through ``fit`` (a vanishing feature, an unsettled or singular face, a certificate that misses
    ``est.tol``). On the compiled route the estimators are built around the stack's arrays while the
    pool's threads solve, and given their numbers run by run; each comes back as :func:`estimators` makes
    it, bit for bit, except ``solve_time_``: the group's wall time per instance."""
    cls, params = type(est), est.get_params()
    out: list[Any] = [None] * len(problems)
    built: list[Any] = []

    def on_stack(st: batch.Stacked) -> None:
        built.extend(shells(cls, params, st))

    def on_solved(st: batch.Stacked, idx: list[int]) -> None:
        fill([built[i] for i in idx], idx, st, None)
        for i in idx:
            out[i] = built[i]

    st = batch.solve_problems(settings(est), problems, alpha, opt, on_stack, on_solved)
    if built:  # (the compiled route: its estimators have their numbers, the group's time per instance)
        for e in out:
            if e is not None:
                e.__dict__["solve_time_"] = st.per
    for i, e in proved_infeasible(est, st).items():
        out[i] = e
    if not built:
        keep = np.flatnonzero(st.certified(est.tol))
        with batch.gc_paused():
            for i, e in zip(keep.tolist(), estimators(cls, params, st, keep)):
                out[i] = e
    return out


def nuclear(est: Any, constraint_sets: list[ConstraintSet | None], alphas: list[Any]) -> list[Any]:
    """The nuclear batch (:func:`attsvm.svm.batch_nuclear.solve_many`) on ``constraint_sets`` (``alphas``:
    the selections they come from, recorded as ``tokens_``, or None): per instance, an estimator with
    ``est``'s parameters that accepted the batch's certified solution as ``fit`` accepts its own, or None
    where the instance must go through ``fit`` (all None where ``est``'s parameters do not take the
    nuclear batch)."""
    fs = settings(est)
    if not batch_nuclear.ready(fs):
        return [None] * len(constraint_sets)
    solved = batch_nuclear.solve_many(fs, constraint_sets)
    cls, params = type(est), est.get_params()
    out: list[Any] = [None] * len(constraint_sets)
    for i, sol in enumerate(solved):
        if sol is None:
            continue
        cs = constraint_sets[i]
        e = cls(**params)
        e._accept(cs, alphas[i], sol.raw, "nuclear", sol.time, certificate=sol.certificate)
        e.info_.update(
            time=e.solve_time_,
            objective=e.objective_,
            dual_objective=e.objective_ - e.duality_gap_,
            relative_gap=e.relative_gap_,
            violation=e.max_violation_,
        )
        out[i] = e
    return out


def _frobenius_groups(
    est: Any, fs: FitSettings, problems: list[AttentionProblem], alphas: Any, stacked: NDArray[np.int64] | None
) -> list[Any]:
    """:func:`batched`'s Frobenius part: each group of one shape within the batch's limits by
    :func:`solve_group`; None for every other problem."""
    out: list[Any] = [None] * len(problems)
    opt = frobenius_options(fs)
    limit = batch.max_k(fs)
    deficient_ok = batch.uses_compiled(fs)
    keys = [batch.group_key(p) for p in problems]
    groups: dict[tuple[int, ...], list[int]] = {}
    if keys and keys.count(keys[0]) == len(keys):  # (a sweep: one shape, one group of every problem)
        groups[keys[0]] = list(range(len(keys)))
    else:
        for i, key in enumerate(keys):
            groups.setdefault(key, []).append(i)
    for key, members in groups.items():
        if not (0 < key[0] * (key[1] - 1) <= limit and (deficient_ok or not batch.deficient_shape(key))):
            continue
        everyone = len(members) == len(problems)
        with blas_threads(1):  # (batched calls on small matrices: one thread, attsvm._threads)
            if stacked is None:
                alpha = np.stack([alphas[i] for i in members])
            else:  # (the checked copy itself where the group is every problem)
                alpha = stacked if everyone else stacked[members]
            fitted = solve_group(est, problems if everyone else [problems[i] for i in members], alpha, opt)
        if everyone:
            out = fitted
        else:
            for i, e in zip(members, fitted):
                out[i] = e
    return out


def batched(
    est: Any,
    problems: list[AttentionProblem],
    alphas: Any,
    stacked: NDArray[np.int64] | None,
) -> list[Any]:
    """``fit_many``'s batches: per problem, the estimator a batch fitted, or None (``fit``). Frobenius
    problems of one shape (:func:`attsvm.svm.batch.group_key`) within the batch's limits go to
    :func:`solve_group`; nuclear ones to :func:`nuclear`. ``alphas``: the checked selections; ``stacked``:
    the matrix whose rows they are, when there is one."""
    fs = settings(est)
    out: list[Any] = [None] * len(problems)
    if batch.ready(fs):
        with batch.gc_paused():  # (grouping allocates a key per problem, and each group builds its estimators)
            out = _frobenius_groups(est, fs, problems, alphas, stacked)
    if batch_nuclear.ready(fs):
        css = [
            _att_svm_constraints(p, a) if p.n * (p.T - 1) <= batch_nuclear.NUC_BATCH_MAX_ROWS else None
            for p, a in zip(problems, alphas)
        ]
        with blas_threads(1):
            out = nuclear(est, css, list(alphas))
    return out


def nuclear_batch(est: Any, constraint_sets: list[ConstraintSet]) -> list[Any]:
    """``fit_many_constraints``'s batch: :func:`nuclear` on ``constraint_sets`` (no selections) with one
    BLAS thread, where ``est``'s parameters take the nuclear batch; all None otherwise."""
    if not batch_nuclear.ready(settings(est)):
        return [None] * len(constraint_sets)
    with blas_threads(1):
        return nuclear(est, list(constraint_sets), [None] * len(constraint_sets))


# ---------------------------------------------------------------- fit_stack
def fit_stack(est: Any, X: ArrayLike, Z: ArrayLike, tokens: ArrayLike) -> SVMStack:
    """:meth:`AttentionSVM.fit_stack <attsvm.svm.AttentionSVM.fit_stack>` with ``est``'s (validated)
    parameters (:mod:`attsvm.svm.stack`): the Frobenius batch's arrays where it applies, every other
    instance fitted one at a time (or by the nuclear batch) and written into its row."""
    X, Z, alpha = check_stack(X, Z, tokens)
    B, n, T, d = X.shape
    shape = (B, n, T, d, Z.shape[2])
    t0 = time.perf_counter()
    key = (n, T, d, Z.shape[2])
    K = n * (T - 1)
    fs = settings(est)
    fitted: dict[int, Any] = {}
    batched_ok = batch.ready(fs) and K <= batch.max_k(fs)
    if B and batched_ok and (batch.uses_compiled(fs) or not batch.deficient_shape(key)):
        opt = frobenius_options(fs)  # (as fit_many)
        with blas_threads(1):  # (batched calls on small matrices: one thread, attsvm._threads)
            st = batch.solve_arrays(fs, X, Z, alpha, opt)
        fitted.update(proved_infeasible(est, st))
        rest = [i for i in np.flatnonzero(~st.certified(est.tol)).tolist() if i not in fitted]
        if rest:  # (fit one at a time, as fit_many's leftovers: one BLAS-thread limit around them all)
            fits = est._fit_rest(
                [None] * len(rest),
                [n * T * d] * len(rest),
                lambda e, j: e._fit(constraints(X[rest[j]], Z[rest[j]], alpha[rest[j]]), alpha[rest[j]]),
                lambda j: f"instance {rest[j]} (X[{rest[j]}], Z[{rest[j]}])",
            )
            fitted.update(zip(rest, fits))
        return _stack(est, shape, alpha, st, fitted, time.perf_counter() - t0)
    # every other norm or backend: fit_many's nuclear batch where it applies, then fit one at a time
    css: list[ConstraintSet | None] = [constraints(X[i], Z[i], alpha[i]) for i in range(B)]
    out: list[Any] = [None] * B
    if batch_nuclear.ready(fs):
        with blas_threads(1):
            out = nuclear(est, css, list(alpha))
    sizes = [n * T * d] * B
    fits = est._fit_rest(
        out,
        sizes,
        lambda e, i: e._fit(css[i], alpha[i]),
        lambda i: f"instance {i} (X[{i}], Z[{i}])",
    )
    return _stack(est, shape, alpha, None, dict(enumerate(fits)), time.perf_counter() - t0)


def _stack(
    est: Any,
    shape: tuple[int, int, int, int, int],
    alpha: NDArray[np.int64],
    st: batch.Stacked | None,
    fitted: dict[int, Any],
    solve_time: float,
) -> SVMStack:
    """The :class:`SVMStack` of the batch's arrays ``st`` (or None) with the rows of the estimators
    ``fitted`` (by instance) written in; ``stack[b]`` returns those, or builds instance b's estimator from
    the batch's arrays, once, with ``est``'s parameters as they are now."""
    cls, params = type(est), est.get_params()

    def build(b: int) -> Any:
        e = fitted.get(b)
        if e is None:  # certified by the batch: the estimator from its arrays, once
            assert st is not None
            e = fitted[b] = estimators(cls, params, st, np.array([b]))[0]
        return e

    out = SVMStack(shape, alpha, st, est.tol, solve_time, build)
    for i, e in fitted.items():  # the instances fit (or the batch's infeasibility proof) returned
        out.status[i] = e.status_
        out.n_iter[i] = e.n_iter_
        if e.status_ == INFEASIBLE:
            out.certificate[i] = e.certificate_
        if e.W_ is None:
            continue
        out.W[i] = e.W_
        out.objective[i] = e.objective_
        out.dual_coef[i] = e.dual_coef_
        out.margins[i] = e.margins_
        out.support[i] = e.support_
        for name, attr in SCALARS:
            getattr(out, name)[i] = getattr(e, attr)
    return out
