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
further iteration is one step of iterative refinement. Two linear-algebra paths:

* dense (K ≤ ``dense_max``): the K × K Gram matrix and a Cholesky factorisation of ``G_FF``;
* matrix-free (large K): conjugate gradients on ``G_FF`` with a Jacobi preconditioner, every product
  being one adjoint ``𝒜*`` and one operator ``𝒜`` call, O(n·T·r_a + n·r_a·r_z) — the K × K Gram
  matrix is never formed.

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
                    method: str = "auto", dense_max: int = DENSE_MAX, cg_max_iter: int = 2000
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
        Projected-Newton iterations (each one linear solve); typically 5–30 are used.
    method : {"auto", "dense", "matrix_free"}
        Linear algebra of the Newton steps; "auto" is dense for K ≤ ``dense_max``.
    cg_max_iter : int
        Cap on conjugate-gradient iterations per Newton step (matrix-free path).

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
    t0 = time.perf_counter()
    n, T, d = cs.A.shape
    dz = cs.Z.shape[1]
    sub = cs.subspaces()
    red = cs.restrict(sub)
    op = _Operator(red)
    K = op.K
    info: dict = {"backend": "frobenius", "K": K, "r_a": sub.U.shape[1], "r_z": sub.V.shape[1]}
    if K == 0:
        info.update(path="trivial", time=time.perf_counter() - t0)
        return RawSolution(np.zeros((d, dz)), np.zeros((n, T)), "optimal", 0, info)

    b = red.rhs.ravel()[op.idx]
    ineq = ~red.equality.ravel()[op.idx]
    bscale = max(1.0, float(np.abs(b).max()))
    diag = op.gram_diag()
    feat_scale = float(np.sqrt(diag.max())) if diag.max() > 0 else 1.0
    ridge = RIDGE * max(float(diag.mean()), np.finfo(float).tiny)
    dense = method == "dense" or (method == "auto" and K <= dense_max)
    info["path"] = "dense" if dense else "matrix_free"
    G = op.gram() if dense else None
    precond = np.maximum(diag, ridge) + ridge

    def project(lam: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.where(ineq, np.maximum(lam, 0.0), lam)

    def evaluate(lam: NDArray[np.float64]):
        M = op.adjoint(lam)
        m = op.apply(M)
        g = m - b  # ∇q = Gλ − b = margins − b
        q = 0.5 * float(np.sum(M * M)) - float(b @ lam)
        return M, m, g, q

    lam = np.zeros(K)
    M, m, g, q = evaluate(lam)
    status = "max_iter"
    cg_total = 0
    it = 0
    viol = gap = np.inf
    for it in range(1, max_iter + 1):
        # certificate of the current iterate (W = 𝒜*(λ) is its own primal point)
        res = b - m
        viol = float(max(np.where(ineq, np.maximum(res, 0.0), np.abs(res)).max(initial=0.0), 0.0))
        wsq = float(np.sum(M * M))
        gap = wsq - float(b @ lam)
        if viol <= tol * bscale and abs(gap) <= tol * max(1.0, wsq):
            status = "optimal"
            break
        # infeasibility: λ/‖λ‖₁ with 𝒜*(·) ≈ 0 and bᵀ(·) > 0 (a ray of the unbounded dual)
        s = float(np.abs(lam).sum())
        if s > 0 and float(b @ lam) > 0:
            resid = float(np.linalg.norm(M)) / s
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
                GFF = G[np.ix_(free, free)]
                GFF[np.diag_indices_from(GFF)] += ridge
                try:
                    cf = sla.cho_factor(GFF, lower=True, check_finite=False)
                    dvec[free] = -sla.cho_solve(cf, gF, check_finite=False)
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
            Mc, mc, gc, qc = evaluate(cand)
            if qc <= q + ARMIJO * float(g @ (cand - lam)):
                accepted = True
                break
            alpha *= 0.5
        if not accepted:  # Newton direction useless here: a projected-gradient (Cauchy) step
            Gg = op.apply(op.adjoint(np.where(binding, 0.0, g)))
            gg = float(g[~binding] @ g[~binding])
            step = gg / max(float(np.where(binding, 0.0, g) @ Gg), np.finfo(float).tiny)
            cand = project(lam - step * np.where(binding, 0.0, g))
            Mc, mc, gc, qc = evaluate(cand)
            if qc > q:
                log.warning("frobenius: no descent at iteration %d (q=%.3e); stopping", it, q)
                break
        lam, M, m, g, q = cand, Mc, mc, gc, qc

    info.update(time=time.perf_counter() - t0, violation=viol, gap=gap, cg_iterations=cg_total)
    dual = op.to_nt(lam)
    if status == "infeasible":
        cert = dual / np.abs(dual).sum()
        info["certificate_residual"] = float(np.linalg.norm(op.adjoint(lam))) / float(np.abs(lam).sum())
        return RawSolution(None, cert, "infeasible", it, info)
    if status == "max_iter":
        log.warning("frobenius solver stopped after max_iter=%d iterations (violation %.2e, gap %.2e)",
                    max_iter, viol, gap)
    return RawSolution(sub.lift(M), dual, status, it, info)
