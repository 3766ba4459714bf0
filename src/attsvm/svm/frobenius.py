"""Our exact Frobenius attention-SVM solver (SPEC §3): no modelling layer in the hot path.

Problem (any :class:`ConstraintSet`: inequalities ``≥ b`` and equality rows ``= b``)::

    min ½‖W‖_F²   s.t.  a_kᵀ W z_k ≥ b_k (k ∈ I),   a_kᵀ W z_k = b_k (k ∈ E).

It is solved through its dual, the bound-constrained QP

    min_λ  q(λ) = ½‖𝒜*(λ)‖_F² − bᵀλ = ½ λᵀGλ − bᵀλ,     λ_I ≥ 0, λ_E free,

with ``G_kl = (a_kᵀa_l)(z_kᵀz_l)`` and ``W = 𝒜*(λ) = Σ λ_k a_k z_kᵀ``. Everything runs on the reduced
problem ``W = U M Vᵀ`` of :meth:`ConstraintSet.subspaces` (d × d → r_a × r_z).

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

* dense (K ≤ ``dense_max``): the K × K Gram matrix and a Cholesky factorisation of ``G_FF``;
* matrix-free (large K): conjugate gradients on ``G_FF`` with a Jacobi preconditioner, every product
  being one adjoint ``𝒜*`` and one operator ``𝒜`` call, O(n·T·r_a + n·r_a·r_z) — the K × K Gram
  matrix is never formed.

Constraint generation (K > ``WORKING_SET_MIN``): the support is usually a small part of K, so the
method runs on a working set — the ``WORKING_SET_START`` hardest constraints of each sequence (smallest
``‖a_k‖‖z_k‖``) — then adds the most violated of the others and re-solves, warm-started, until no
constraint is violated. The last sub-problem's solution is then optimal for the full problem (its
multipliers, padded with zeros, satisfy every KKT condition), so the answer stays exact.

``G`` may be singular (more constraints than ``r_a·r_z``): the Newton systems get a ridge of relative
size ``RIDGE``, which makes each step a proximal-point step; W is unique even when λ is not.

Infeasibility (SPEC §3): the dual is then unbounded below along some ``λ ≥ 0`` with ``𝒜*(λ) = 0``,
``bᵀλ > 0``; the iterates run off along it, and as soon as ``λ/‖λ‖₁`` is such a direction to
round-off the solver stops with status ``"infeasible"`` and that certificate (``1ᵀ|λ| = 1``).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import scipy.linalg as sla
from numpy.typing import NDArray
from scipy.linalg.lapack import dposv as _dposv

from .._validation import check_finite_scalar, check_positive_int
from ._base import ConstraintSet, RawSolution

__all__ = ["solve_frobenius", "DENSE_MAX"]

log = logging.getLogger(__name__)

# Largest number of constraints K for which the dense path (K × K Gram + Cholesky) is used.
DENSE_MAX = 300
# Ridge added to Newton systems, relative to the mean Gram diagonal.
RIDGE = 1e-13
# A normalised dual direction whose adjoint is below this (relative to max ‖a_k‖‖z_k‖) certifies
# infeasibility.
INFEASIBLE_RTOL = 1e-9
# Armijo sufficient-decrease constant and maximal number of step halvings.
ARMIJO = 1e-4
MAX_HALVINGS = 40
# Constraint generation is used above this many constraints; it starts from the WORKING_SET_START
# hardest constraints (smallest ‖a_k‖‖z_k‖) of each sequence and adds at most max(WORKING_SET_CHUNK,
# current size) of the most violated constraints per round.
WORKING_SET_MIN = 4000
WORKING_SET_START = 8
WORKING_SET_CHUNK = 2000
# Dense problems with at most PDAS_MAX_K constraints start from a primal-dual active-set guess
# (:func:`_pdas`, at most PDAS_MAX_ITER Cholesky solves) instead of λ = 0.
PDAS_MAX_K = DENSE_MAX
PDAS_MAX_ITER = 10


class _Operator:
    """The reduced constraint operator on flat K-vectors of multipliers (row-major masked pairs)."""

    def __init__(self, cs: ConstraintSet) -> None:
        self.cs = cs
        self.n, self.T = cs.mask.shape
        self.idx = np.flatnonzero(cs.mask.ravel())
        self.A = cs.A  # (n, T, r_a)
        self.Z = cs.Z  # (n, r_z)
        self.K = self.idx.size

    def to_nt(self, lam: NDArray[np.float64]) -> NDArray[np.float64]:
        out = np.zeros(self.n * self.T)
        out[self.idx] = lam
        return out.reshape(self.n, self.T)

    def adjoint(self, lam: NDArray[np.float64]) -> NDArray[np.float64]:
        """``M = Σ_k λ_k a_k z_kᵀ`` (r_a, r_z)."""
        L = self.to_nt(lam)
        B = np.matmul(L[:, None, :], self.A)[:, 0, :]  # (n, r_a): Σ_t λ_it a_it
        return B.T @ self.Z

    def apply(self, M: NDArray[np.float64]) -> NDArray[np.float64]:
        """Margins ``a_kᵀ M z_k`` as a flat K-vector."""
        Uz = self.Z @ M.T  # (n, r_a): M z_i
        m = np.matmul(self.A, Uz[:, :, None])[:, :, 0]  # (n, T)
        return m.ravel()[self.idx]

    def gram(self) -> NDArray[np.float64]:
        Af = self.A.reshape(-1, self.A.shape[-1])[self.idx]
        Zf = self.Z[self.idx // self.T]
        G = Af @ Af.T
        G *= Zf @ Zf.T
        return G

    def gram_diag(self) -> NDArray[np.float64]:
        Af = self.A.reshape(-1, self.A.shape[-1])[self.idx]
        Zf = self.Z[self.idx // self.T]
        return (Af ** 2).sum(1) * (Zf ** 2).sum(1)


def _pcg(matvec, rhs: NDArray[np.float64], precond: NDArray[np.float64], rtol: float, maxiter: int
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


def solve_frobenius(cs: ConstraintSet, *, tol: float = 1e-10, max_iter: int = 200,
                    method: str = "auto", dense_max: int = DENSE_MAX, cg_max_iter: int = 2000,
                    working_set: bool | None = None
                    ) -> RawSolution:
    """Solve the Frobenius attention SVM ``min ½‖W‖_F² s.t. 𝒜(W) (≥ | =) b`` exactly (SPEC §3).

    Parameters
    ----------
    cs : ConstraintSet
        Constraints; equality rows get free-sign multipliers (SPEC §5's SVM-eq and W_fin).
    tol : float
        Stop when the max constraint violation ≤ ``tol·max(1, |b|_∞)`` and the duality gap
        ``‖W‖² − bᵀλ`` ≤ ``tol·max(1, ‖W‖²)``.
    max_iter : int
        Linear solves: those of the primal-dual active-set warm start (dense path, :func:`_pdas`)
        plus the projected-Newton iterations (each one linear solve); typically 2–30 are used.
    method : {"auto", "dense", "matrix_free"}
        Linear algebra of the Newton steps; "auto" is dense for K ≤ ``dense_max``.
    cg_max_iter : int
        Cap on conjugate-gradient iterations per Newton step (matrix-free path).
    working_set : bool, optional
        Constraint generation: solve on a working set of constraints (the hardest few per sequence),
        add the violated ones, repeat until none is violated — exact, and much faster when the
        support is a small part of K. None (default) uses it for K > ``WORKING_SET_MIN`` and when
        the matrix-free path would face a singular Gram matrix (K > d·min(d, n)).

    Returns
    -------
    RawSolution
        ``W`` (d, d) = ``𝒜*(λ)``, ``dual`` λ (n, T), status "optimal" (tolerances met),
        "max_iter" (not met within ``max_iter``) or "infeasible" (``dual`` is then the certificate).
        ``info`` holds the path used, the final violation and gap, and CG iteration counts.
    """
    if not isinstance(cs, ConstraintSet):
        raise TypeError(f"cs must be a ConstraintSet, got {type(cs).__name__}")
    tol = check_finite_scalar(tol, "tol", positive=True)
    max_iter = check_positive_int(max_iter, "max_iter")
    if method not in ("auto", "dense", "matrix_free"):
        raise ValueError(f"method must be one of 'auto', 'dense', 'matrix_free'; got {method!r}")
    K = cs.n_constraints
    # a Gram matrix of rank < K (more constraints than r_a·r_z) slows the Newton-CG steps down:
    # constraint generation keeps the sub-problems small and well posed
    rank_bound = min(cs.d, K) * min(cs.Z.shape[1], cs.n)
    auto_ws = K > WORKING_SET_MIN or (K > dense_max and K > rank_bound)
    use_ws = auto_ws if working_set is None else bool(working_set)
    kw = dict(tol=tol, max_iter=max_iter, method=method, dense_max=dense_max, cg_max_iter=cg_max_iter)
    raw = _working_set(cs, **kw) if (use_ws and K > 0) else _projected_newton(cs, None, **kw)
    if raw.status == "max_iter" and K <= LDP_MAX_K and max_iter >= LDP_MIN_ITER:
        # Ill-conditioned instances (a singular Gram matrix with near-degenerate faces) can stall
        # the Newton iteration; the finite active-set LDP/NNLS route is exact there.
        ldp = _ldp_nnls(cs, tol=tol)
        if ldp is not None:
            ldp.info["fallback_from"] = dict(raw.info, status=raw.status, n_iter=raw.n_iter)
            return ldp
    return raw


# Largest K (and reduced feature count) for the LDP/NNLS fallback: its dense (p+1) × K matrix.
LDP_MAX_K = 20_000
# The fallback runs only when Newton had a real budget: a caller capping ``max_iter`` below this
# asks for a cheap, possibly inexact answer and gets status "max_iter".
LDP_MIN_ITER = 20
LDP_MAX_FEATURES = 4_000


def _ldp_nnls(cs: ConstraintSet, *, tol: float) -> RawSolution | None:
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
    if ra * rz > LDP_MAX_FEATURES:
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
    if denom <= tol * max(1.0, float(np.abs(u).sum())):  # r ≈ 0: infeasible, u is the certificate
        lam_k = u[: idx.size].copy()
        lam_k[eq] -= u[idx.size:]
        cert = np.zeros(n * T)
        cert[idx] = lam_k / max(np.abs(lam_k).sum(), np.finfo(float).tiny)
        return RawSolution(None, cert.reshape(n, T), "infeasible", 1, info)
    lam_s = u / (denom * scale ** 2)  # multipliers of the unscaled constraints (w = w'/scale)
    lam_k = lam_s[: idx.size].copy()
    lam_k[eq] -= lam_s[idx.size:]
    M = (F.T @ lam_k).reshape(ra, rz)
    lam = np.zeros(n * T)
    lam[idx] = lam_k
    return RawSolution(sub.lift(M), lam.reshape(n, T), "optimal", 1, info)


def _pdas(G: NDArray[np.float64], b: NDArray[np.float64], ineq: NDArray[np.bool_], ridge: float,
          max_iter: int = PDAS_MAX_ITER) -> tuple[NDArray[np.float64] | None, int]:
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
    c = 1.0 / max(float(np.trace(G)) / K, np.finfo(float).tiny)  # λ and gradients in common units
    active = ineq & (b <= 0)  # λ = 0: the gradient is −b
    for it in range(1, max_iter + 1):
        free = (~active).nonzero()[0]
        lam = np.zeros(K)
        if free.size:
            _, x, info = _dposv(Gr.take(free, 0).take(free, 1), b[free], lower=1, overwrite_a=1)
            if info != 0:
                return None, it
            lam[free] = x
        new = ineq & (lam <= c * (G @ lam - b))
        if not (new ^ active).any():
            return lam, it
        active = new
    return None, max_iter


def _projected_newton(cs: ConstraintSet, lam0: NDArray[np.float64] | None, *, tol: float, max_iter: int,
                      method: str, dense_max: int, cg_max_iter: int) -> RawSolution:
    """The projected Newton method on the dual (module doc), warm-started from ``lam0`` (n, T)."""
    t0 = time.perf_counter()
    n, T, d = cs.A.shape
    dz = cs.Z.shape[1]
    K = cs.n_constraints
    dense = method == "dense" or (method == "auto" and K <= dense_max)
    # the dense path works on the full features (its cost is the K × K Gram, not d); the
    # matrix-free path on the reduced problem W = U M Vᵀ
    sub = None if dense else cs.subspaces()
    red = cs if sub is None else cs.restrict(sub)
    op = _Operator(red)
    info: dict = {"backend": "frobenius", "K": K, "path": "dense" if dense else "matrix_free"}
    if sub is not None:
        info.update(r_a=sub.U.shape[1], r_z=sub.V.shape[1])
    if K == 0:
        info.update(path="trivial", time=time.perf_counter() - t0)
        return RawSolution(np.zeros((d, dz)), np.zeros((n, T)), "optimal", 0, info)
    G = op.gram() if dense else None
    diag = op.gram_diag() if G is None else G.diagonal().copy()
    if diag.max() <= 0 or (sub is not None and (sub.U.shape[1] == 0 or sub.V.shape[1] == 0)):
        # every feature a_k z_kᵀ is zero: W = 0 is the only candidate; a constraint it violates is
        # itself the certificate (e_k, with 𝒜*(e_k) = 0 and b_k e_k > 0)
        info.update(path="trivial", time=time.perf_counter() - t0)
        bad = np.where(cs.inequality, cs.rhs > 0, cs.equality & (cs.rhs != 0))
        if not bad.any():
            return RawSolution(np.zeros((d, dz)), np.zeros((n, T)), "optimal", 0, info)
        k = np.unravel_index(int(np.argmax(bad)), bad.shape)
        cert = np.zeros((n, T))
        cert[k] = float(np.sign(cs.rhs[k]))
        return RawSolution(None, cert, "infeasible", 0, info)

    b = red.rhs.ravel()[op.idx]
    ineq = ~red.equality.ravel()[op.idx]
    bscale = max(1.0, float(np.abs(b).max()))
    feat_scale = float(np.sqrt(diag.max()))
    ridge = RIDGE * max(float(diag.sum()) / K, np.finfo(float).tiny)
    precond = None if dense else np.maximum(diag, ridge) + ridge

    def project(lam: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.where(ineq, np.maximum(lam, 0.0), lam)

    def evaluate(lam: NDArray[np.float64]):
        """(M or None, margins m = Gλ, gradient g = Gλ − b, q(λ), ‖𝒜*λ‖² = λᵀGλ)."""
        if G is not None:  # dense: everything from the Gram matrix, W only at the end
            m = G @ lam
            wsq = float(lam @ m)
            return None, m, m - b, 0.5 * wsq - float(b @ lam), wsq
        M = op.adjoint(lam)
        m = op.apply(M)
        wsq = float(np.sum(M * M))
        return M, m, m - b, 0.5 * wsq - float(b @ lam), wsq

    # the warm start's solves count towards max_iter, leaving at least one iteration to certify
    pdas_iter = 0
    pdas_budget = min(PDAS_MAX_ITER, max_iter - 1)
    if lam0 is None and G is not None and K <= PDAS_MAX_K and pdas_budget >= 1:
        lam0_flat, pdas_iter = _pdas(G, b, ineq, ridge, pdas_budget)
        info["pdas_iterations"] = pdas_iter
        lam = np.zeros(K) if lam0_flat is None else lam0_flat
    else:
        lam = np.zeros(K) if lam0 is None else project(lam0.ravel()[op.idx].astype(np.float64))
    M, m, g, q, wsq = evaluate(lam)
    status = "max_iter"
    cg_total = 0
    it = 0
    viol = gap = np.inf
    for it in range(1, max_iter - pdas_iter + 1):
        # certificate of the current iterate (W = 𝒜*(λ) is its own primal point)
        res = b - m
        viol = float(max(np.where(ineq, np.maximum(res, 0.0), np.abs(res)).max(initial=0.0), 0.0))
        gap = wsq - float(b @ lam)
        if viol <= tol * bscale and abs(gap) <= tol * max(1.0, wsq):
            status = "optimal"
            break
        # infeasibility: λ/‖λ‖₁ with 𝒜*(·) ≈ 0 and bᵀ(·) > 0 (a ray of the unbounded dual)
        s = float(np.abs(lam).sum())
        if s > 0 and float(b @ lam) > 0:
            resid = float(np.sqrt(max(wsq, 0.0))) / s
            if resid <= INFEASIBLE_RTOL * feat_scale:
                status = "infeasible"
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

                def mv(v: NDArray[np.float64]) -> NDArray[np.float64]:
                    full = np.zeros(K)
                    full[fidx] = v
                    return op.apply(op.adjoint(full))[fidx] + ridge * v

                rtol = min(1e-2, max(1e-14, 0.1 * float(np.linalg.norm(pg)) / max(1.0, float(np.linalg.norm(b)))))
                x, k_cg = _pcg(mv, -gF, precond[fidx], rtol, cg_max_iter)
                cg_total += k_cg
                dvec[fidx] = x
        # projected Armijo search along λ(α) = P(λ + α d)
        alpha = 1.0
        accepted = False
        for _ in range(MAX_HALVINGS):
            cand = project(lam + alpha * dvec)
            Mc, mc, gc, qc, wsqc = evaluate(cand)
            if qc <= q + ARMIJO * float(g @ (cand - lam)):
                accepted = True
                break
            alpha *= 0.5
        if not accepted:  # Newton direction useless here: a projected-gradient (Cauchy) step
            Gg = G @ np.where(binding, 0.0, g) if G is not None else op.apply(op.adjoint(np.where(binding, 0.0, g)))
            gg = float(g[~binding] @ g[~binding])
            step = gg / max(float(np.where(binding, 0.0, g) @ Gg), np.finfo(float).tiny)
            cand = project(lam - step * np.where(binding, 0.0, g))
            Mc, mc, gc, qc, wsqc = evaluate(cand)
            if qc > q:
                log.warning("frobenius: no descent at iteration %d (q=%.3e); stopping", it, q)
                break
        lam, M, m, g, q, wsq = cand, Mc, mc, gc, qc, wsqc

    info.update(time=time.perf_counter() - t0, violation=viol, gap=gap, cg_iterations=cg_total)
    dual = op.to_nt(lam)
    if status == "infeasible":
        cert = dual / np.abs(dual).sum()
        info["certificate_residual"] = float(np.linalg.norm(op.adjoint(lam))) / float(np.abs(lam).sum())
        return RawSolution(None, cert, "infeasible", pdas_iter + it, info)
    if status == "max_iter":
        log.warning("frobenius solver stopped after max_iter=%d iterations (violation %.2e, gap %.2e)",
                    max_iter, viol, gap)
    if M is None:
        M = op.adjoint(lam)
    return RawSolution(M if sub is None else sub.lift(M), dual, status, pdas_iter + it, info)


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


def _working_set(cs: ConstraintSet, *, tol: float, max_iter: int, method: str, dense_max: int,
                 cg_max_iter: int) -> RawSolution:
    """Constraint generation around :func:`_projected_newton` (exact: it stops only when the
    sub-problem's solution violates no constraint of the full set, so that solution and its
    multipliers, padded with zeros, are optimal for the full problem)."""
    t0 = time.perf_counter()
    n, T, _ = cs.A.shape
    bscale = max(1.0, float(np.abs(cs.rhs).max()))
    scale = np.sqrt(cs.gram_diag())  # ‖a_k‖‖z_k‖: violations are compared as distances
    hard = np.where(cs.inequality, scale, np.inf)
    k0 = min(T, WORKING_SET_START)
    S = cs.equality.copy()
    first = np.argsort(hard, axis=1, kind="stable")[:, :k0]
    np.put_along_axis(S, first, True, axis=1)
    S &= cs.mask
    lam = np.zeros((n, T))
    total_iter = 0
    rounds = 0
    raw: RawSolution | None = None
    while True:
        rounds += 1
        sub, order, valid = _compact(cs, S)
        lam0 = np.where(valid, np.take_along_axis(lam, order, axis=1), 0.0)
        raw = _projected_newton(sub, lam0, tol=tol, max_iter=max_iter, method=method, dense_max=dense_max,
                                cg_max_iter=cg_max_iter)
        total_iter += raw.n_iter
        lam = np.zeros((n, T))
        np.put_along_axis(lam, order, np.where(valid, raw.dual, 0.0), axis=1)
        # the full layout puts several invalid slots on the same column: re-zero outside S
        lam = np.where(S, lam, 0.0)
        if raw.status != "optimal" or raw.W is None:
            break
        m = cs.apply(raw.W)
        viol = np.where(cs.inequality & ~S, (cs.rhs - m) / np.maximum(scale, 1e-300), 0.0)
        bad = viol > 0
        if not np.any(np.where(cs.inequality & ~S, cs.rhs - m, 0.0) > tol * bscale):
            break
        chunk = max(WORKING_SET_CHUNK, int(S.sum()))
        flat = np.flatnonzero(bad.ravel())
        if flat.size > chunk:
            flat = flat[np.argpartition(-viol.ravel()[flat], chunk)[:chunk]]
        S.flat[flat] = True
        log.debug("frobenius working set: round %d, %d constraints, %d added", rounds, int(S.sum()), flat.size)
    info = dict(raw.info)
    info.update(path=f"working_set+{raw.info.get('path')}", rounds=rounds, working_set_size=int(S.sum()),
                time=time.perf_counter() - t0, K=cs.n_constraints)
    if raw.status == "infeasible":  # a subset is infeasible: so is the full set
        return RawSolution(None, lam / np.abs(lam).sum(), "infeasible", total_iter, info)
    if raw.W is not None:
        info["violation"] = cs.violation(raw.W)
    return RawSolution(raw.W, lam, raw.status, total_iter, info)
