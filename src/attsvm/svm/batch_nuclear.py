"""Many certified nuclear-norm attention SVMs as one vectorised program (docs/spec.md §3).

:meth:`AttentionSVM.fit_many <attsvm.svm.AttentionSVM.fit_many>` and
:meth:`~attsvm.svm.AttentionSVM.fit_many_constraints` hand the nuclear instances (``norm="nuc"``, no
rank constraint, ``backend="auto"``, no explicit ``max_iter``) here:

1. **Reduction**, per instance, exactly as :func:`~attsvm.svm.nuclear.solve_nuclear` does it
   (:func:`~attsvm.svm.reduction.reduce`: unit rows, the subspaces of the features and queries, a
   global power-of-two scale), so that an instance is solved in the same units either way; a row
   repeated exactly (a duplicated token) is kept once.
2. **Interior point, batched**: instances whose reduced programs have the same shape
   (K rows, r_a, r_z) are stacked and solved together by :func:`attsvm.svm._sdp.ipm_many`, the
   primal–dual interior-point method on the semidefinite form of the nuclear SVM (with numba, the same
   method compiled per instance, :mod:`attsvm.svm._sdp_compiled`; ``info_["route"]`` says which ran).
3. **Lift and certify**, per instance, exactly as ``fit``: the primal made exactly feasible
   (:func:`~attsvm.svm._factored._make_feasible`), lifted to W, and the certificate of
   :mod:`.certificate` computed from (W, λ) in the user's units.

An instance goes to :meth:`AttentionSVM.fit` (or ``fit_constraints``) instead — the augmented
Lagrangian with its polish, its fallbacks and its Farkas certificates — when it is trivial or
infeasible by inspection, too large for the batch (:data:`NUC_BATCH_MAX_K` distinct rows after the
reduction, :data:`NUC_BATCH_MAX_N`, :data:`NUC_BATCH_MAX_ROWS` rows before it),
or when its interior point does not certify at ``tol`` (an infeasible instance never does). So every
instance comes back as ``fit`` would return it: optimal with a passing certificate, or whatever ``fit``
says; a failing instance never changes the others. The interior point is also an independent check of the
augmented Lagrangian: the two agree on every instance of the tests.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from . import batch
from ._base import ConstraintSet, FitSettings, RawSolution
from ._factored import _make_feasible, _nuclear, _reduce, _Reduced, distinct_rows
from ._sdp import _guarded, ipm_many
from .certificate import OptimalityCertificate, optimality_certificate
from .norms import NUCLEAR
from .nuclear import _lift_dual, _trivial
from .reduction import Reduction, prescale, reduce
from .status import OPTIMAL

__all__ = ["NUC_BATCH_MAX_K", "NUC_BATCH_MAX_N", "NUC_BATCH_MAX_ROWS", "NuclearSolved", "ready", "solve_many"]

# Reduced programs with more constraint rows, or a larger semidefinite block (r_a + r_z), go one at a
# time: the interior point's K × K Schur complement and its N × N eigenvalue problems grow as K³ and
# N³, while the augmented Lagrangian works on low-rank factors (benchmarks/bench_batch.py)
NUC_BATCH_MAX_K = 160
NUC_BATCH_MAX_N = 48
# Rows before the reduction: a set with up to this many rows is reduced and its repeated rows dropped (cheap
# next to a fit of that size) before NUC_BATCH_MAX_K decides; data with few distinct tokens and queries (a
# small vocabulary) give many rows but few distinct ones
NUC_BATCH_MAX_ROWS = 8 * NUC_BATCH_MAX_K
# instances per interior-point call (bounds the memory of the K × K and N × N stacks)
NUC_CHUNK = 256


# rows whose multiplier exceeds this fraction of the largest are taken as tight (or equality rows)
TIGHT_RTOL = 1e-6


def _tighten(
    Fs: NDArray[np.float64],
    Zs: NDArray[np.float64],
    b: NDArray[np.float64],
    ineq: NDArray[np.bool_],
    y: NDArray[np.float64],
    M: NDArray[np.float64],
) -> NDArray[np.float64]:
    """The least-norm correction of M that makes the rows with a positive multiplier hold with
    equality (and the equality rows): ``M + Σ_S δ_k a_k z_kᵀ`` with ``G_SS δ = b_S − 𝒜_S(M)``.

    On degenerate instances (many more rows than entries of M) the interior point's primal residual
    floors near 1e-9–1e-8 (its Schur complement is nearly singular); rescaling M onto the constraints
    would cost that much relative objective, while this correction costs only second order: at the
    optimum 𝒜*(y) is a subgradient of ‖·‖_* at M, so the first-order change Σ_S y_k (b_k − 𝒜_k(M)) is
    what the infeasible point had gained."""
    S = ~ineq | (y > TIGHT_RTOL * max(float(y.max(initial=0.0)), 1e-300))
    if not S.any():
        return M
    F, Z = Fs[S], Zs[S]
    r = b[S] - np.einsum("kr,kr->k", F @ M, Z)
    G = (F @ F.T) * (Z @ Z.T)
    delta = np.linalg.lstsq(G, r, rcond=1e-12)[0]
    return M + F.T @ (delta[:, None] * Z)


def _finish(
    red: _Reduced,
    Fs: NDArray[np.float64],
    Zs: NDArray[np.float64],
    b: NDArray[np.float64],
    ineq: NDArray[np.bool_],
    y: NDArray[np.float64],
    M: NDArray[np.float64],
) -> NDArray[np.float64]:
    """The exactly feasible primal of one instance: the interior point's M and its tightened version
    (:func:`_tighten`), each made exactly feasible (:func:`~attsvm.svm._factored._make_feasible`); the
    feasible one of smaller nuclear norm (the dual bound is the same for both)."""
    cands = [_make_feasible(red, M), _make_feasible(red, _tighten(Fs, Zs, b, ineq, y, M))]
    return min(cands, key=lambda C: (red.violation(red.apply(C)) > 1e-12, _nuclear(C)))


def _finish_many(
    Fs: NDArray[np.float64],
    Zs: NDArray[np.float64],
    b: NDArray[np.float64],
    scale: NDArray[np.float64],
    y: NDArray[np.float64],
    M: NDArray[np.float64],
) -> NDArray[np.float64]:
    """:func:`_finish` for a stack of instances with inequality rows only, vectorised: the tightening as
    a masked K × K solve (LU where _tighten takes least squares; the two agree to about 1e-11 on the
    converged instances, and a nearly singular block only makes that candidate lose the comparison),
    the rescaling of _make_feasible, batched SVDs."""
    B, K, _ = Fs.shape
    S = y > TIGHT_RTOL * np.maximum(y.max(axis=1, keepdims=True), 1e-300)
    G = (Fs @ Fs.transpose(0, 2, 1)) * (Zs @ Zs.transpose(0, 2, 1))
    r = np.where(S, b - _rows(Fs, Zs, M), 0.0)
    GS = np.where(S[:, :, None] & S[:, None, :], G, 0.0)
    GS[:, np.arange(K), np.arange(K)] += np.where(S, 0.0, 1.0)
    # (a singular tight block, more tight rows than entries of M, fails only its own instance, which
    # then takes the least-squares version of _tighten)
    sol, ok = _guarded(np.linalg.solve, GS, r[:, :, None])
    ok &= np.isfinite(sol).all(axis=(1, 2))
    delta = np.where(ok[:, None], sol[:, :, 0], 0.0)
    Mt = M + Fs.transpose(0, 2, 1) @ (delta[:, :, None] * Zs)
    for j in np.flatnonzero(~ok):
        Mt[j] = _tighten(Fs[j], Zs[j], b[j], np.ones(K, dtype=bool), y[j], M[j])
    C = np.concatenate([M, Mt])  # both candidates, rescaled onto the constraints as _make_feasible does
    bb, sc = np.concatenate([b, b]), np.concatenate([scale, scale])
    FF, ZZ = np.concatenate([Fs, Fs]), np.concatenate([Zs, Zs])
    m = _rows(FF, ZZ, C)
    pos = bb > 0
    can = np.where(pos, m > 0, True).all(axis=1) & pos.any(axis=1)
    t = np.where(can, np.max(np.where(pos, bb / np.where(m > 0, m, 1.0), -np.inf), axis=1), 1.0)

    def viol(mm: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.maximum((bb - mm) * sc, 0.0).max(axis=1)

    v0, vt = viol(m), viol(t[:, None] * m)
    bmax = np.maximum(1.0, np.abs(bb * sc).max(axis=1))
    use = can & ((vt <= v0) | (t >= 1.0)) & (vt <= 1e-12 * bmax)
    C = np.where(use[:, None, None], t[:, None, None] * C, C)
    v = np.where(use, vt, v0)
    nuc = np.linalg.svd(C, compute_uv=False).sum(axis=1)
    # the feasible one (violation ≤ 1e-12) of smaller nuclear norm, per instance (ties: the first)
    key0 = (v[:B] > 1e-12, nuc[:B])
    key1 = (v[B:] > 1e-12, nuc[B:])
    take1 = (key1[0] < key0[0]) | ((key1[0] == key0[0]) & (key1[1] < key0[1]))
    return np.where(take1[:, None, None], C[B:], C[:B])


def _rows(Fs: NDArray[np.float64], Zs: NDArray[np.float64], M: NDArray[np.float64]) -> NDArray[np.float64]:
    """``a_kᵀ M z_k`` for every row of a stack."""
    return np.einsum("bkr,bkr->bk", Fs @ M, Zs)


class NuclearSolved(NamedTuple):
    """An instance the batched interior point solved and certified: the raw solution (W and λ in the
    user's units, status "optimal", the route in ``info``), its optimality certificate
    (:func:`~attsvm.svm.certificate.optimality_certificate` of ``(W, λ)``, which passes ``tol``) and the
    seconds spent on it (its share of the batch, its reduction, lift and certificate)."""

    raw: RawSolution
    certificate: OptimalityCertificate
    time: float


def ready(settings: FitSettings) -> bool:
    """Whether a fit with these ``settings`` takes the batched nuclear route (an explicit ``max_iter`` is a
    limit on ``fit``'s augmented-Lagrangian iterations: those instances go one at a time)."""
    return settings.norm == "nuc" and settings.rank is None and settings.backend == "auto" and settings.max_iter is None


def solve_many(settings: FitSettings, constraint_sets: list[ConstraintSet | None]) -> list[NuclearSolved | None]:
    """Solve the nuclear SVMs of ``constraint_sets`` (module doc) and certify each at ``settings.tol``.

    Returns, per instance, its :class:`NuclearSolved`, or None where the instance must go through
    ``fit`` (and where its constraint set is None: too large for the batch)."""
    out: list[NuclearSolved | None] = [None] * len(constraint_sets)
    prepared: list[tuple[ConstraintSet, Reduction, _Reduced, NDArray[np.int64], float] | None] = []
    groups: dict[tuple[int, int, int], list[int]] = {}
    for i, cs in enumerate(constraint_sets):
        prepared.append(None)
        if cs is None or cs.n_constraints > NUC_BATCH_MAX_ROWS:
            continue  # (too many rows to look for repeats: fit, and its threads)
        if prescale(cs) is not None:
            continue  # (data far from unit scale: fit rescales them exactly first)
        t0 = time.perf_counter()
        reduction = reduce(cs)
        red = _reduce(reduction)
        idx = distinct_rows(red)
        r_a, r_z = red.A.shape[2], red.Z.shape[1]
        prepared[i] = (cs, reduction, red, idx, time.perf_counter() - t0)
        if _trivial(cs, reduction, red, t0, "") is not None:
            continue  # (fit returns these at once, or with their Farkas certificate)
        if idx.size > NUC_BATCH_MAX_K or r_a + r_z > NUC_BATCH_MAX_N:
            continue
        groups.setdefault((idx.size, r_a, r_z), []).append(i)
    tol = settings.tol
    compiled = batch.compiled() is not None  # (the interior point's route: attsvm.svm._sdp)

    def run(chunk: list[int], compiled: bool) -> list[int]:
        """Solve ``chunk`` (one group) on one route; the instances it does not certify optimal."""
        t0 = time.perf_counter()
        r_a = prepared[chunk[0]][2].A.shape[2]  # type: ignore[index]
        preps = [prepared[i] for i in chunk]  # (every grouped instance was prepared)
        reds = [prep[2] for prep in preps if prep is not None]
        idxs = [prep[3] for prep in preps if prep is not None]
        # (a group shares K, r_a and r_z, not T: each instance's rows map to its own sequences)
        Fs = np.stack([r.A.reshape(-1, r_a)[k] for r, k in zip(reds, idxs)])
        Zs = np.stack([r.Z[k // r.mask.shape[1]] for r, k in zip(reds, idxs)])
        b = np.stack([r.b.ravel()[k] for r, k in zip(reds, idxs)])
        ineq = np.stack([r.ineq.ravel()[k] for r, k in zip(reds, idxs)])
        M, y, _, iters = ipm_many(Fs, Zs, b, ineq, compiled=compiled)
        if ineq.all():
            scale = np.stack([r.scale.ravel()[k] for r, k in zip(reds, idxs)])
            Mfs = _finish_many(Fs, Zs, b, scale, y, M)
        else:  # (equality rows: the least-norm correction of _make_feasible, one instance at a time)
            Mfs = np.stack([_finish(r, Fs[j], Zs[j], b[j], ineq[j], y[j], M[j]) for j, r in enumerate(reds)])
        per = (time.perf_counter() - t0) / len(chunk)
        failed = []
        for j, i in enumerate(chunk):
            prep = prepared[i]
            assert prep is not None
            cs, reduction, red, idx, t_prep = prep
            t1 = time.perf_counter()
            lam_r = np.zeros(red.mask.size)
            lam_r[idx] = y[j]
            W = reduction.lift_W(Mfs[j])
            lam = reduction.lift_dual(_lift_dual(red, lam_r.reshape(red.mask.shape)))
            info = {
                "solver": "ipm-hkm-batched",
                "path": "batched-ipm",
                "rank_reduced": (red.A.shape[2], red.Z.shape[1]),
                "iterations": int(iters[j]),
                "batch_size": len(chunk),
                "route": "compiled" if compiled else "numpy",
            }
            raw = RawSolution(W, lam, OPTIMAL, int(iters[j]), info)
            cert = optimality_certificate(cs, W, lam, NUCLEAR)  # (as fit certifies its answer)
            if cert.passes(tol):
                out[i] = NuclearSolved(raw, cert, t_prep + per + time.perf_counter() - t1)
            else:
                failed.append(i)
        return failed

    for members in groups.values():
        for start in range(0, len(members), NUC_CHUNK):
            failed = run(members[start : start + NUC_CHUNK], compiled)
            if failed and compiled:
                # the compiled kernel's round-off differs from NumPy's in the last bits: on a nearly degenerate
                # instance one route may stall where the other certifies, so the NumPy route gets a second try
                run(failed, False)
    return out
