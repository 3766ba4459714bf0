"""Our exact Frobenius attention-SVM solver (docs/spec.md §3): no modelling layer in the hot path.

Problem (any :class:`ConstraintSet`: inequalities ``≥ b`` and equality rows ``= b``)::

    min ½‖W‖_F²   s.t.  a_kᵀ W z_k ≥ b_k (k ∈ I),   a_kᵀ W z_k = b_k (k ∈ E).

It is solved through its dual, the bound-constrained QP

    min_λ  q(λ) = ½‖𝒜*(λ)‖_F² − bᵀλ = ½ λᵀGλ − bᵀλ,     λ_I ≥ 0, λ_E free,

with ``G_kl = (a_kᵀa_l)(z_kᵀz_l)`` and ``W = 𝒜*(λ) = Σ λ_k a_k z_kᵀ``. Everything runs on the reduced
problem of the one reduction, :func:`~attsvm.svm.reduction.reduce` (rows normalised, ``W = U M Vᵀ``,
d × d → r_a × r_z, right-hand sides O(1)), and the answer is lifted back.

Method: Bertsekas' projected Newton method with ε-active sets. Each iteration fixes the ε-binding
multipliers (``λ_k ≈ 0`` with positive gradient) at zero and takes a Newton step on the free face,
``G_FF d_F = −∇q_F``, followed by a projected Armijo search. Once the face of the optimum is found the
full Newton step solves the free block exactly, so the method terminates with the multipliers of the
exact least-norm solution on the support set (the "polish" happens by construction), and every
further iteration is one step of iterative refinement. On the dense path it starts from a
primal-dual active-set guess (Hintermüller, Ito & Kunisch, 2002: a few Cholesky solves on the
guessed face until the face repeats, :func:`_pdas`), which on the Att-SVM data is already the exact
optimum, so the Newton loop only certifies it; a wrong guess merely changes the starting point.
Two linear-algebra paths:

* dense (K ≤ ``FrobeniusOptions.dense_max``): the K × K Gram matrix and a Cholesky factorisation of ``G_FF``;
* matrix-free (large K): conjugate gradients on ``G_FF`` with a Jacobi preconditioner, every product
  being one adjoint ``𝒜*`` and one operator ``𝒜`` call, O(n·T·r_a + n·r_a·r_z) — the K × K Gram
  matrix is never formed.

Constraint generation (K > ``FrobeniusOptions.working_set_min``): the support is usually a small part
of K, so the method runs on a working set — the ``working_set_start`` hardest constraints of each
sequence (largest ``b_k/(‖a_k‖‖z_k‖)``) —
then adds the most violated of the others and re-solves, warm-started, until no
constraint is violated. The last sub-problem's solution is then optimal for the full problem (its
multipliers, padded with zeros, satisfy every KKT condition), so the answer stays exact.

``G`` may be singular (more constraints than ``r_a·r_z``): the Newton systems get a ridge of relative
size ``FrobeniusOptions.ridge``, which makes each step a proximal-point step; W is unique even when λ is not.

Infeasibility (docs/spec.md §3): the dual is then unbounded below along some ``λ ≥ 0`` with ``𝒜*(λ) = 0``,
``bᵀλ > 0``; the iterates run off along it, and as soon as ``λ/‖λ‖₁`` is such a direction to
round-off the solver stops with status ``"infeasible"`` and that certificate (``1ᵀ|λ| = 1``), once
:func:`~attsvm.svm.certificate.find_farkas` has verified it (else the exact LP decides).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import Any

import numpy as np
import scipy.linalg as sla
from numpy.typing import NDArray
from scipy.linalg.lapack import dposv as _dposv

from .._validation import check_choice, check_finite_scalar, check_positive_int
from ._base import ConstraintSet, Operator, RawSolution
from ._cholesky_active_set import solve_cholesky_active_set
from .certificate import ROW_FLOOR, farkas_certificate, find_farkas, relative_violation
from .reduction import VANISHED_ROW_MESSAGE, DenseReduction, reduce, reduce_dense
from .status import ERROR, INFEASIBLE, MAX_ITER, OPTIMAL

__all__ = ["solve_frobenius", "FrobeniusOptions", "DENSE_MAX"]

log = logging.getLogger(__name__)
_TINY = float(np.finfo(float).tiny)  # (np.finfo costs a microsecond or two per call)


@dataclass(frozen=True)
class FrobeniusOptions:
    """Options of :func:`solve_frobenius` (all tolerances in the normalised units of :mod:`.reduction`).

    tol : stop when every row's violation ≤ tol·max(|b_k|, ROW_FLOOR·‖W‖_F) and the duality gap
        ``‖W‖² − bᵀλ`` ≤ tol·‖W‖².
    max_iter : linear solves (the PDAS warm start's and the projected-Newton iterations').
    method : "auto" | "dense" | "matrix_free": the linear algebra of the Newton steps ("auto" is
        dense for K ≤ dense_max).
    cg_max_iter : conjugate-gradient iterations per Newton step (matrix-free path).
    working_set : constraint generation (None: for K > working_set_min, or when the matrix-free path
        would face a singular Gram matrix).
    ridge : ridge of the Newton systems, relative to the mean Gram diagonal.
    infeasible_rtol : a normalised dual direction whose adjoint is below this certifies infeasibility.
    armijo, max_halvings : the projected Armijo search.
    working_set_min, working_set_start, working_set_chunk : constraint generation above
        working_set_min constraints, from the working_set_start hardest rows of each sequence (largest
        normalised rhs), adding at most max(working_set_chunk, current size) violated rows per round.
    pdas_max_k, pdas_max_iter : dense problems with at most pdas_max_k rows start from a
        primal-dual active-set guess of at most pdas_max_iter Cholesky solves (0 disables it).
    ldp_max_k, ldp_min_iter, ldp_max_features : the LDP/NNLS fallback (after a stalled Newton run
        with a real budget, max_iter ≥ ldp_min_iter) on problems up to that size.
    cholesky_min, cholesky_max_rows : all-inequality instances with at least cholesky_min constraints
        (0 disables it) are first solved by the active set on one growing Cholesky factor
        (:mod:`._cholesky_active_set`), whose working set may hold up to cholesky_max_rows rows
        (its factor takes about 4·rows² bytes: 2 GB at the default); the Newton route takes over when it
        does not settle or needs more rows.
    """

    tol: float = 1e-10
    max_iter: int = 200
    method: str = "auto"
    dense_max: int = 300
    cg_max_iter: int = 2000
    working_set: bool | None = None
    ridge: float = 1e-13
    infeasible_rtol: float = 1e-9
    armijo: float = 1e-4
    max_halvings: int = 40
    working_set_min: int = 4000
    working_set_start: int = 8
    working_set_chunk: int = 2000
    pdas_max_k: int = 300
    pdas_max_iter: int = 10
    ldp_max_k: int = 20_000
    ldp_min_iter: int = 20
    ldp_max_features: int = 4_000
    cholesky_min: int = 20_000
    cholesky_max_rows: int = 22_600

    def __post_init__(self) -> None:
        check_finite_scalar(self.tol, "tol", positive=True)
        check_positive_int(self.max_iter, "max_iter")
        check_choice(self.method, "method", ("auto", "dense", "matrix_free"))
        check_positive_int(self.dense_max, "dense_max", minimum=0)
        check_positive_int(self.cg_max_iter, "cg_max_iter")
        check_positive_int(self.pdas_max_k, "pdas_max_k", minimum=0)
        check_positive_int(self.pdas_max_iter, "pdas_max_iter", minimum=0)
        check_positive_int(self.cholesky_min, "cholesky_min", minimum=0)
        check_positive_int(self.cholesky_max_rows, "cholesky_max_rows", minimum=0)


DENSE_MAX = FrobeniusOptions.dense_max
_OPTION_NAMES = frozenset(f.name for f in fields(FrobeniusOptions))


@lru_cache(maxsize=64)
def _cached_options(items: tuple[tuple[str, Any], ...]) -> FrobeniusOptions:
    # the options are frozen, so one validated instance per distinct set of overrides can be shared:
    # building (and validating) them costs about as much as a tiny solve
    return FrobeniusOptions(**dict(items))


def _pcg(
    matvec, rhs: NDArray[np.float64], precond: NDArray[np.float64], rtol: float, maxiter: int
) -> tuple[NDArray[np.float64], int]:
    """Preconditioned conjugate gradients for an SPD operator; returns (x, iterations)."""
    x = np.zeros_like(rhs)
    r = rhs.copy()
    bnorm = np.linalg.norm(rhs)
    if bnorm == 0:
        return x, 0
    z = r / precond
    p = z.copy()
    rz = r @ z
    for it in range(1, maxiter + 1):
        Ap = matvec(p)
        pAp = p @ Ap
        if pAp <= 0:
            break
        alpha = rz / pAp
        x += alpha * p
        r -= alpha * Ap
        if np.linalg.norm(r) <= rtol * bnorm:
            return x, it
        z = r / precond
        rz_new = r @ z
        p = z + (rz_new / rz) * p
        rz = rz_new
    return x, maxiter


def solve_frobenius(cs: ConstraintSet, options: FrobeniusOptions | None = None, **overrides: Any) -> RawSolution:
    """Solve the Frobenius attention SVM ``min ½‖W‖_F² s.t. 𝒜(W) (≥ | =) b`` exactly (docs/spec.md §3).

    Parameters
    ----------
    cs : ConstraintSet
        Constraints; equality rows get free-sign multipliers (docs/spec.md §5's SVM-eq and W_fin).
    options : FrobeniusOptions, optional
        Solver options (tolerance, iteration cap, linear-algebra path, ...); see
        :class:`FrobeniusOptions`.
    **overrides
        Fields of :class:`FrobeniusOptions` to replace (e.g. ``tol=1e-8, max_iter=50``).

    The instance goes through :func:`~attsvm.svm.reduction.reduce` (row normalisation, subspaces,
    global scale) and the answer is lifted back, so it does not depend on the units of X and Z.

    Returns
    -------
    RawSolution
        ``W`` (d, d) = ``𝒜*(λ)``, ``dual`` λ (n, T), status "optimal" (tolerances met),
        "max_iter" (not met within ``max_iter``) or "infeasible" (``dual`` is then a Farkas
        certificate verified by :func:`~attsvm.svm.certificate.farkas_certificate`).
        ``info`` holds the path used, the final violation and gap, and CG iteration counts.
    """
    if not isinstance(cs, ConstraintSet):
        raise TypeError(f"cs must be a ConstraintSet, got {type(cs).__name__}")
    if options is not None and not isinstance(options, FrobeniusOptions):
        raise TypeError(f"options must be a FrobeniusOptions, got {type(options).__name__}")
    if overrides:
        unknown = sorted(set(overrides) - _OPTION_NAMES)
        if unknown:
            raise TypeError(f"solve_frobenius got unknown option(s) {unknown}; see FrobeniusOptions")
    if options is not None:
        opt = replace(options, **overrides) if overrides else options
    else:
        try:
            opt = _cached_options(tuple(sorted(overrides.items())))
        except TypeError:  # an unhashable value: build (and validate) it directly
            opt = FrobeniusOptions(**overrides)
    t0 = time.perf_counter()
    fast = _solve_dense_small(cs, opt, t0)
    if fast is not None:
        return fast
    # (rows normalised and scaled here; the subspace step is taken inside, where it pays: the
    # matrix-free and LDP paths reduce, the dense path works on the K × K Gram matrix)
    red = reduce(cs, subspace=False)
    n, T = cs.mask.shape
    if red.zero.any() and red.unattainable.any():
        cert = find_farkas(cs, red=red, lp=False)
        if cert is None:  # (a row vanished in the reduction, yet its λ does not verify: its norm over- or
            # underflowed in float64, e.g. entries beyond 1e±154; a status that says so, never a crash)
            return RawSolution(
                None,
                np.zeros((n, T)),
                ERROR,
                0,
                {
                    "backend": "frobenius",
                    "path": "trivial",
                    "message": VANISHED_ROW_MESSAGE,
                },
            )
        return RawSolution(
            None,
            cert.lam,
            INFEASIBLE,
            0,
            {
                "backend": "frobenius",
                "path": "trivial",
                "reason": "zero feature, rhs unattainable",
                "time": time.perf_counter() - t0,
            },
        )
    raw = _solve_reduced(red.problem, opt)
    info = dict(raw.info, time=time.perf_counter() - t0, global_scale=red.global_scale)
    if raw.status == INFEASIBLE:
        cert = find_farkas(cs, candidates=(("frobenius dual ray", red.lift_farkas(raw.dual)),), red=red)
        if cert is None:  # the ray did not verify and the exact LP finds the constraints feasible
            info["reason"] = "dual ray failed the Farkas check; the LP finds no certificate"
            return RawSolution(None, np.zeros((n, T)), ERROR, raw.n_iter, info)
        info.update(certificate_source=cert.source, certificate_residual=cert.residual)
        return RawSolution(None, cert.lam, INFEASIBLE, raw.n_iter, info)
    # (``violation`` and ``gap`` stay in the solver's normalised units; the estimator's certificate
    # reports them in the user's)
    W = None if raw.W is None else red.lift_W(raw.W)
    return RawSolution(W, red.lift_dual(raw.dual, degree=2), raw.status, raw.n_iter, info)


def _solve_dense_small(cs: ConstraintSet, opt: FrobeniusOptions, t0: float) -> RawSolution | None:
    """The dense path of :func:`_solve_reduced` on :func:`~attsvm.svm.reduction.reduce_dense`'s Gram
    matrix, for the small instances where building a reduced constraint set costs as much as the
    solve; None (the caller takes the general route) when it does not apply or does not certify."""
    if opt.working_set or opt.method == "matrix_free":
        return None
    if cs.n_constraints > min(cs.d, cs.n_constraints) * min(cs.Z.shape[1], cs.n):
        return None  # a singular Gram matrix: the general route (LDP first) handles it
    dred = reduce_dense(cs, max_rows=min(opt.dense_max, opt.pdas_max_k, opt.working_set_min))
    if dred is None:
        return None
    raw = _projected_newton(dred, None, opt)
    if raw.status != OPTIMAL:  # the general route has the fallbacks (LDP, Farkas LP)
        return None
    info = dict(raw.info, time=time.perf_counter() - t0, global_scale=dred.global_scale)
    lam = dred.lift_dual(raw.dual, degree=2)
    return RawSolution(dred.adjoint(lam), dred.to_nt(lam), OPTIMAL, raw.n_iter, info)


def _solve_reduced(cs: ConstraintSet, opt: FrobeniusOptions) -> RawSolution:
    """The solver on an already reduced, normalised instance (see :func:`solve_frobenius`)."""
    K = cs.n_constraints
    # a Gram matrix of rank < K (more constraints than r_a·r_z) slows the Newton-CG steps down:
    # constraint generation keeps the sub-problems small and well posed
    rank_bound = min(cs.d, K) * min(cs.Z.shape[1], cs.n)
    auto_ws = K > opt.working_set_min or (K > opt.dense_max and K > rank_bound)
    use_ws = auto_ws if opt.working_set is None else bool(opt.working_set)
    if not use_ws and rank_bound < K <= opt.ldp_max_k and opt.max_iter >= opt.ldp_min_iter:
        # more rows than dimensions: a singular Gram matrix with degenerate faces, where the Newton
        # iteration can stall; the finite active-set LDP/NNLS route is exact there
        ldp = _ldp_nnls(cs, opt)
        if ldp is not None and ldp.status == OPTIMAL:
            return ldp
        if ldp is not None and ldp.status == INFEASIBLE and farkas_certificate(cs, ldp.dual).valid:
            # the NNLS residual vanished and its u verifies as a Farkas certificate: done (else the
            # Newton route below decides; on these shapes it is 20–30× slower to reach the same ray)
            return ldp
    if use_ws and 0 < opt.cholesky_min <= K and not cs.has_equality:
        chol = solve_cholesky_active_set(
            cs, tol=opt.tol, ridge=opt.ridge, start=opt.working_set_start, max_rows=opt.cholesky_max_rows
        )
        if chol is not None:
            return chol
    raw = _working_set(cs, opt) if (use_ws and K > 0) else _projected_newton(cs, None, opt)
    if raw.status == MAX_ITER and K <= opt.ldp_max_k and opt.max_iter >= opt.ldp_min_iter:
        # Ill-conditioned instances (a singular Gram matrix with near-degenerate faces) can stall
        # the Newton iteration; the finite active-set LDP/NNLS route is exact there.
        ldp = _ldp_nnls(cs, opt)
        if ldp is not None:
            ldp.info["fallback_from"] = dict(raw.info, status=raw.status, n_iter=raw.n_iter)
            return ldp
    return raw


def _ldp_nnls(cs: ConstraintSet, opt: FrobeniusOptions) -> RawSolution | None:
    """Least-distance programming by NNLS (Lawson & Hanson, 1974, ch. 23) on the reduced problem.

    ``min ½‖w‖² s.t. F w ≥ b`` (equalities as two opposite inequalities) is solved by
    ``u* = argmin_{u ≥ 0} ‖E u − f‖`` with ``E = [Fᵀ; bᵀ]``, ``f = (0, …, 0, 1)``: if the residual
    ``r = E u* − f`` vanishes, ``u*`` is a Farkas certificate (Fᵀu = 0, bᵀu = 1, u ≥ 0) and the
    constraints are infeasible; otherwise ``w = Fᵀu*/(1 − bᵀu*)`` and ``λ = u*/(1 − bᵀu*)``.
    Finite and exact (an active-set method); used when the projected Newton iteration stalls.
    Returns None when the problem is too large for the dense route.
    """
    from scipy.optimize import nnls

    t0 = time.perf_counter()
    sub = cs.subspaces()
    rc = cs.restrict(sub)
    ra, rz = rc.A.shape[-1], rc.Z.shape[-1]
    tol = opt.tol
    if ra * rz > opt.ldp_max_features:
        return None
    idx = np.flatnonzero(rc.mask.ravel())
    Af = rc.A.reshape(-1, ra)[idx]
    Zf = rc.Z[idx // rc.T]
    F = (Af[:, :, None] * Zf[:, None, :]).reshape(idx.size, ra * rz)  # (K, p): vec(a_k z_kᵀ)
    b = rc.rhs.ravel()[idx]
    eq = rc.equality.ravel()[idx]
    Fs = np.vstack([F, -F[eq]])
    bs = np.concatenate([b, -b[eq]])
    scale = max(1.0, float(np.abs(Fs).max(initial=0.0)))
    E = np.vstack([Fs.T / scale, bs[None, :]])
    f = np.zeros(E.shape[0])
    f[-1] = 1.0
    u, _ = nnls(E, f, maxiter=50 * E.shape[1])
    r = E @ u - f
    n, T = cs.mask.shape
    info = {"path": "ldp-nnls", "time": time.perf_counter() - t0, "residual_last": float(r[-1])}
    denom = 1.0 - float(bs @ u)
    if denom > 0:
        # (the denominator is 1/(1 + ‖w‖²)-sized: tiny for a large ‖W‖, and 1 − bᵀu then carries a
        # large relative error. w lies along Fᵀu: with homogeneous equalities its length is fixed
        # exactly by the tightest row, b_k / (F Fᵀu)_k, instead of by the denominator)
        u_k = u[: idx.size].copy()
        u_k[eq] -= u[idx.size :]
        D = F.T @ u_k
        m = F @ D
        pos = ~eq & (b > 0)
        if not np.any(eq & (b != 0)) and pos.any() and np.all(m[pos] > 0):
            t = float(np.max(b[pos] / m[pos]))
        else:
            t = 1.0 / (denom * scale**2)
        lam = np.zeros(n * T)
        lam[idx] = t * u_k
        M = (t * D).reshape(ra, rz)
        if np.all(np.isfinite(M)) and relative_violation(rc, M) <= max(tol, 1e-9):
            polished = _support_polish(rc, F, b, eq, idx, u_k > 0, tol)
            if polished is not None:
                M, lam = polished
                info["support_polish"] = True
            return RawSolution(sub.lift(M), lam.reshape(n, T), OPTIMAL, 1, info)
    # r ≈ 0: u is a candidate Farkas certificate (the caller verifies it)
    lam_k = u[: idx.size].copy()
    lam_k[eq] -= u[idx.size :]
    cert = np.zeros(n * T)
    cert[idx] = lam_k / max(np.abs(lam_k).sum(), _TINY)
    return RawSolution(None, cert.reshape(n, T), INFEASIBLE, 1, info)


def _support_polish(
    rc: ConstraintSet,
    F: NDArray[np.float64],
    b: NDArray[np.float64],
    eq: NDArray[np.bool_],
    idx: NDArray[np.intp],
    support: NDArray[np.bool_],
    tol: float,
) -> tuple[NDArray[np.float64], NDArray[np.float64]] | None:
    """The exact point of the face the LDP found, from the primal side (docs/spec.md §3).

    On an ill-conditioned instance (‖W‖ ≫ 1: nearly coincident tokens) the LDP's W carries errors of
    order ε·Σ_k λ_k‖F_k‖ in its margins, enough to leave a relative duality gap of ~1e-9. With the
    support S known, ``vec(W)`` is the least-norm solution of ``F_S vec(W) = b_S`` and λ_S that of
    ``F_Sᵀ λ_S = vec(W)``, both by SVD (conditioned as F_S, not as its Gram matrix F_S F_Sᵀ). Returns
    (M, λ (n·T,)) when λ_S is sign-feasible and M feasible, else None."""
    if not support.any():
        return None
    FS, bS = F[support], b[support]
    w: NDArray[np.float64] = np.asarray(np.linalg.lstsq(FS, bS, rcond=None)[0], dtype=np.float64)
    lamS: NDArray[np.float64] = np.asarray(np.linalg.lstsq(FS.T, w, rcond=None)[0], dtype=np.float64)
    ineqS = ~eq[support]
    if np.any(lamS[ineqS] < -1e-12 * max(float(np.abs(lamS).max()), _TINY)) or not np.all(np.isfinite(w)):
        return None
    M: NDArray[np.float64] = w.reshape(rc.A.shape[-1], rc.Z.shape[-1])
    if relative_violation(rc, M) > tol:
        return None
    lam = np.zeros(rc.mask.size)
    lam[idx[support]] = np.where(ineqS, np.maximum(lamS, 0.0), lamS)
    return M, lam


def _pdas(
    G: NDArray[np.float64],
    b: NDArray[np.float64],
    ineq: NDArray[np.bool_],
    ridge: float,
    max_iter: int = FrobeniusOptions.pdas_max_iter,
) -> tuple[NDArray[np.float64] | None, int]:
    """Primal-dual active-set warm start for the dense dual QP (Hintermüller, Ito & Kunisch, 2002).

    Iterates ``A = {k ∈ I : λ_k − c·(Gλ − b)_k ≤ 0}``, ``λ_A = 0``, ``(Gλ − b)_F = 0`` on the rest
    (one Cholesky solve of ``G_FF`` each) until the active set repeats — then λ is the exact KKT
    point of its face, usually after 3–7 solves on the Att-SVM data. It is only a *starting point*:
    the projected Newton iteration that follows re-checks the certificate (violation and duality
    gap) at λ before accepting it and continues from it otherwise, so a wrong or cycling guess can
    cost time, never exactness. Returns (None, iterations) when it does not settle within
    ``max_iter`` solves or a block is not numerically positive definite.
    """
    K = b.size
    Gr = G.copy()
    Gr.flat[:: K + 1] += ridge
    c = 1.0 / max(float(np.trace(G)) / K, _TINY)  # λ and gradients in common units
    all_ineq = bool(ineq.all())
    active = ineq & (b <= 0)  # λ = 0: the gradient is −b
    for it in range(1, max_iter + 1):
        free = np.flatnonzero(~active)
        lam = np.zeros(K)
        if free.size:
            _, x, info = _dposv(Gr.take(free, 0).take(free, 1), b[free], lower=1, overwrite_a=1)
            if info != 0:
                return None, it
            lam[free] = x
        new = lam <= c * (G @ lam - b)
        if not all_ineq:
            new &= ineq
        if not (new ^ active).any():
            return lam, it
        active = new
    return None, max_iter


def _projected_newton(
    cs: ConstraintSet | DenseReduction, lam0: NDArray[np.float64] | None, opt: FrobeniusOptions
) -> RawSolution:
    """The projected Newton method on the dual (module doc), warm-started from ``lam0`` (n, T).

    Given a :class:`~attsvm.svm.reduction.DenseReduction` instead of a constraint set, it runs the
    dense path on its ``G`` and ``b̂`` and returns the flat λ̂ (K,) as ``dual`` with ``W = None``;
    the caller lifts both.
    """
    t0 = time.perf_counter()
    if isinstance(cs, DenseReduction):
        info0: dict = {"backend": "frobenius", "K": cs.b.size, "path": "dense"}
        lam, _, status, n_iter = _newton_loop(cs.G, cs.b, cs.ineq, None, None, lam0, opt, info0)
        info0["time"] = time.perf_counter() - t0
        return RawSolution(None, lam, status, n_iter, info0)
    method, dense_max = opt.method, opt.dense_max
    n, T, d = cs.A.shape
    dz = cs.Z.shape[1]
    K = cs.n_constraints
    dense = method == "dense" or (method == "auto" and K <= dense_max)
    # the dense path works on the full features (its cost is the K × K Gram, not d); the
    # matrix-free path on the reduced problem W = U M Vᵀ
    sub = None if dense else cs.subspaces()
    red = cs if sub is None else cs.restrict(sub)
    op = red.operator
    info: dict = {"backend": "frobenius", "K": K, "path": "dense" if dense else "matrix_free"}
    if sub is not None:
        info.update(r_a=sub.U.shape[1], r_z=sub.V.shape[1])
    if K == 0:
        info.update(path="trivial", time=time.perf_counter() - t0)
        return RawSolution(np.zeros((d, dz)), np.zeros((n, T)), OPTIMAL, 0, info)
    G = op.gram() if dense else None
    diag = op.gram_diag_flat() if G is None else G.diagonal().copy()
    if diag.max() <= 0 or (sub is not None and (sub.U.shape[1] == 0 or sub.V.shape[1] == 0)):
        # every feature a_k z_kᵀ is zero: W = 0 is the only candidate; a constraint it violates is
        # itself the certificate (e_k, with 𝒜*(e_k) = 0 and b_k e_k > 0)
        info.update(path="trivial", time=time.perf_counter() - t0)
        bad = np.where(cs.inequality, cs.rhs > 0, cs.equality & (cs.rhs != 0))
        if not bad.any():
            return RawSolution(np.zeros((d, dz)), np.zeros((n, T)), OPTIMAL, 0, info)
        k = np.unravel_index(int(np.argmax(bad)), bad.shape)
        cert = np.zeros((n, T))
        cert[k] = float(np.sign(cs.rhs[k]))
        return RawSolution(None, cert, INFEASIBLE, 0, info)

    b = red.rhs.ravel()[op.idx]
    ineq = ~red.equality.ravel()[op.idx]
    lam0_flat = None if lam0 is None else lam0.ravel()[op.idx].astype(np.float64)
    lam, M, status, n_iter = _newton_loop(G, b, ineq, op, diag, lam0_flat, opt, info)
    info["time"] = time.perf_counter() - t0
    dual = op.to_nt(lam)
    if status == INFEASIBLE:
        cert = dual / np.abs(dual).sum()
        info["certificate_residual"] = float(np.linalg.norm(op.adjoint_flat(lam))) / float(np.abs(lam).sum())
        return RawSolution(None, cert, INFEASIBLE, n_iter, info)
    if M is None:
        M = op.adjoint_flat(lam)
    return RawSolution(M if sub is None else sub.lift(M), dual, status, n_iter, info)


def _newton_loop(
    G: NDArray[np.float64] | None,
    b: NDArray[np.float64],
    ineq: NDArray[np.bool_],
    op: Operator | None,
    diag: NDArray[np.float64] | None,
    lam0: NDArray[np.float64] | None,
    opt: FrobeniusOptions,
    info: dict,
) -> tuple[NDArray[np.float64], NDArray[np.float64] | None, str, int]:
    """The iteration of :func:`_projected_newton` on the flat dual: dense when the Gram matrix ``G``
    is given, matrix-free through ``op`` otherwise; ``diag`` is G's diagonal (None: read off G),
    ``lam0`` a flat warm start. Returns (λ (K,), M = 𝒜*(λ) when at hand, status, iterations) and
    records its counters in ``info``."""
    tol, max_iter, cg_max_iter = opt.tol, opt.max_iter, opt.cg_max_iter
    K = b.size
    dense = G is not None
    if diag is None:
        assert G is not None
        diag = G.diagonal()
    feat_scale = float(np.sqrt(diag.max()))
    ridge = opt.ridge * max(float(diag.sum()) / K, _TINY)
    precond = None if dense else np.maximum(diag, ridge) + ridge
    all_ineq = bool(ineq.all())

    def project(lam: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.where(ineq, np.maximum(lam, 0.0), lam)

    def evaluate(lam: NDArray[np.float64]):
        """(M or None, margins m = Gλ, gradient g = Gλ − b, q(λ), ‖𝒜*λ‖² = λᵀGλ)."""
        if G is not None:  # dense: everything from the Gram matrix, W only at the end
            m = G @ lam
            wsq = float(lam @ m)
            return None, m, m - b, 0.5 * wsq - float(b @ lam), wsq
        assert op is not None  # matrix-free: the operator is given
        M = op.adjoint_flat(lam)
        m = op.apply_flat(M)
        wsq = float(np.sum(M * M))
        return M, m, m - b, 0.5 * wsq - float(b @ lam), wsq

    # the warm start's solves count towards max_iter, leaving at least one iteration to certify
    pdas_iter = 0
    pdas_budget = min(opt.pdas_max_iter, max_iter - 1)
    if lam0 is None and G is not None and K <= opt.pdas_max_k and pdas_budget >= 1:
        lam0_flat, pdas_iter = _pdas(G, b, ineq, ridge, pdas_budget)
        info["pdas_iterations"] = pdas_iter
        lam = np.zeros(K) if lam0_flat is None else lam0_flat
    else:
        lam = np.zeros(K) if lam0 is None else project(lam0)
    M, m, g, q, wsq = evaluate(lam)
    status = MAX_ITER
    cg_total = 0
    it = 0
    viol = gap = np.inf
    for it in range(1, max_iter - pdas_iter + 1):
        # certificate of the current iterate (W = 𝒜*(λ) is its own primal point)
        # (rows are normalised, ‖a_k z_kᵀ‖ = 1: each row's violation relative to max(|b_k|, ROW_FLOOR·‖W‖))
        res = b - m
        rv = np.maximum(res, 0.0) if all_ineq else np.where(ineq, np.maximum(res, 0.0), np.abs(res))
        viol = float(max(rv.max(initial=0.0), 0.0))
        if viol > 0:  # (on the violated rows only: usually a few, by round-off)
            k = np.flatnonzero(rv > 0)
            sigma = np.maximum(np.abs(b[k]), ROW_FLOOR * np.sqrt(max(wsq, 0.0)))
            rel_viol = float((rv[k] / sigma).max()) if (sigma > 0).all() else np.inf
            if not np.isfinite(rel_viol):
                rel_viol = np.inf
        else:  # no row violated (or a NaN margin, which the next test rejects)
            rel_viol = 0.0 if viol == 0 else np.inf
        gap = wsq - float(b @ lam)
        if rel_viol <= tol and abs(gap) <= tol * max(wsq, _TINY):
            status = OPTIMAL
            break
        # infeasibility: λ/‖λ‖₁ with 𝒜*(·) ≈ 0 and bᵀ(·) > 0 (a ray of the unbounded dual)
        s = float(np.abs(lam).sum())
        if s > 0 and float(b @ lam) > 0:
            resid = float(np.sqrt(max(wsq, 0.0))) / s
            if resid <= opt.infeasible_rtol * feat_scale:
                status = INFEASIBLE
                break
        # ε-binding set (Bertsekas): λ_k ≤ ε with positive gradient
        pg = np.where(ineq, lam - np.maximum(lam - g, 0.0), g)
        eps = min(1e-3, float(np.linalg.norm(pg)))
        binding = ineq & (lam <= eps) & (g > 0)
        free = ~binding
        dvec = np.zeros(K)
        dvec[binding] = -lam[binding]
        if free.any():
            gF = g[free]
            if dense:
                assert G is not None
                GFF = G[np.ix_(free, free)] if not free.all() else G.copy()
                GFF.flat[:: GFF.shape[0] + 1] += ridge
                try:
                    if GFF.shape[0] > 64:
                        cf = sla.cho_factor(GFF, lower=True, check_finite=False)
                        dvec[free] = -sla.cho_solve(cf, gF, check_finite=False)
                    else:  # tiny blocks: LAPACK call overhead dominates; plain LU
                        dvec[free] = -np.linalg.solve(GFF, gF)
                except np.linalg.LinAlgError:  # numerically indefinite: larger ridge via eigh
                    w_, V_ = np.linalg.eigh(GFF)
                    w_ = np.maximum(w_, ridge * 1e3)
                    dvec[free] = -(V_ @ ((V_.T @ gF) / w_))
            else:
                fidx = np.flatnonzero(free)

                assert op is not None  # matrix-free: the operator is given

                def mv(
                    v: NDArray[np.float64], fidx: NDArray[np.intp] = fidx, opm: Operator = op
                ) -> NDArray[np.float64]:
                    full = np.zeros(K)
                    full[fidx] = v
                    return opm.apply_flat(opm.adjoint_flat(full))[fidx] + ridge * v

                rtol = min(1e-2, max(1e-14, 0.1 * float(np.linalg.norm(pg)) / max(1.0, float(np.linalg.norm(b)))))
                assert precond is not None  # set whenever the method is matrix-free
                x, k_cg = _pcg(mv, -gF, precond[fidx], rtol, cg_max_iter)
                cg_total += k_cg
                dvec[fidx] = x
        # projected Armijo search along λ(α) = P(λ + α d)
        alpha = 1.0
        accepted = False
        for _ in range(opt.max_halvings):
            cand = project(lam + alpha * dvec)
            Mc, mc, gc, qc, wsqc = evaluate(cand)
            dlam = cand - lam
            gd = float(g @ dlam)
            # q(cand) − q(λ) = gᵀΔ + ½ΔᵀGΔ with GΔ = m(cand) − m(λ): the change itself, not a difference of
            # two values of q, so that the test still decides once the decrease is below q's round-off
            # (near the optimum of a large instance, qc − q is noise and no step would be accepted)
            if gd + 0.5 * float(dlam @ (mc - m)) <= opt.armijo * gd:
                accepted = True
                break
            alpha *= 0.5
        if not accepted:  # Newton direction useless here: a projected-gradient (Cauchy) step
            gfree = np.where(binding, 0.0, g)
            if G is not None:
                Gg = G @ gfree
            else:
                assert op is not None  # matrix-free: the operator is given
                Gg = op.apply_flat(op.adjoint_flat(gfree))
            gg = float(g[~binding] @ g[~binding])
            step = gg / max(float(np.where(binding, 0.0, g) @ Gg), _TINY)
            cand = project(lam - step * np.where(binding, 0.0, g))
            Mc, mc, gc, qc, wsqc = evaluate(cand)
            if qc > q:
                log.debug("frobenius: no descent at iteration %d (q=%.3e); stopping", it, q)
                break
        lam, M, m, g, q, wsq = cand, Mc, mc, gc, qc, wsqc

    info.update(violation=viol, gap=gap, cg_iterations=cg_total)
    if status == MAX_ITER:  # (a fallback may still finish it; the estimator warns if the final status is not optimal)
        log.debug(
            "frobenius solver stopped after max_iter=%d iterations (violation %.2e, gap %.2e)", max_iter, viol, gap
        )
    return lam, M, status, pdas_iter + it


def _compact(cs: ConstraintSet, S: NDArray[np.bool_]) -> tuple[ConstraintSet, NDArray[np.int64], NDArray[np.bool_]]:
    """The sub-problem on the pairs ``S`` (n, T), packed to (n, T_S, d); returns it with the column
    map ``order`` (n, T_S) back to the full layout and its validity mask."""
    counts = S.sum(axis=1)
    Ts = max(int(counts.max()), 1)
    order = np.argsort(~S, axis=1, kind="stable")[:, :Ts]  # the S columns of each row first
    valid = np.arange(Ts)[None, :] < counts[:, None]
    A = np.take_along_axis(cs.A, order[:, :, None], axis=1)
    rhs = np.take_along_axis(cs.rhs, order, axis=1)
    eq = np.take_along_axis(cs.equality, order, axis=1)
    return ConstraintSet(A, cs.Z, valid, rhs, eq & valid), order, valid


def _working_set(cs: ConstraintSet, opt: FrobeniusOptions) -> RawSolution:
    """Constraint generation around :func:`_projected_newton` (exact: it stops only when the
    sub-problem's solution violates no constraint of the full set, so that solution and its
    multipliers, padded with zeros, are optimal for the full problem)."""
    t0 = time.perf_counter()
    n, T, _ = cs.A.shape
    scale = np.sqrt(cs.gram_diag())  # ‖a_k‖‖z_k‖: violations are compared as distances
    S = (cs.equality | cs.hardest_rows(opt.working_set_start)) & cs.mask
    lam = np.zeros((n, T))
    total_iter = 0
    rounds = 0
    raw: RawSolution | None = None
    while True:
        rounds += 1
        sub, order, valid = _compact(cs, S)
        lam0 = np.where(valid, np.take_along_axis(lam, order, axis=1), 0.0)
        raw = _projected_newton(sub, lam0, opt)
        total_iter += raw.n_iter
        lam = np.zeros((n, T))
        np.put_along_axis(lam, order, np.where(valid, raw.dual, 0.0), axis=1)
        # the full layout puts several invalid slots on the same column: re-zero outside S
        lam = np.where(S, lam, 0.0)
        if raw.status != OPTIMAL or raw.W is None:
            break
        m = cs.apply(raw.W)
        viol = np.where(cs.inequality & ~S, (cs.rhs - m) / np.maximum(scale, 1e-300), 0.0)
        bad = viol > 0
        wn = float(np.sqrt(np.sum(raw.W * raw.W)))
        sigma = np.maximum(np.abs(cs.rhs), ROW_FLOOR * scale * wn)
        if not np.any(np.where(cs.inequality & ~S, cs.rhs - m, 0.0) > opt.tol * sigma):
            break
        chunk = max(opt.working_set_chunk, int(S.sum()))
        flat = np.flatnonzero(bad.ravel())
        if flat.size > chunk:
            flat = flat[np.argpartition(-viol.ravel()[flat], chunk)[:chunk]]
        S.flat[flat] = True
        log.debug("frobenius working set: round %d, %d constraints, %d added", rounds, int(S.sum()), flat.size)
    info = dict(raw.info)
    info.update(
        path=f"working_set+{raw.info.get('path')}",
        rounds=rounds,
        working_set_size=int(S.sum()),
        time=time.perf_counter() - t0,
        K=cs.n_constraints,
    )
    if raw.status == INFEASIBLE:  # a subset is infeasible: so is the full set
        return RawSolution(None, lam / np.abs(lam).sum(), INFEASIBLE, total_iter, info)
    if raw.W is not None:
        info["violation"] = cs.violation(raw.W)
    return RawSolution(raw.W, lam, raw.status, total_iter, info)
