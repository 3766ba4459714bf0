"""Large Frobenius instances near the dense floor: an active set on one growing Cholesky factor.

For tens of thousands of constraints and more, the work no exact method avoids is the *dense floor*:
the Gram matrix of the support and one Cholesky factorisation of it. This solver of the dual
(``min ½λᵀGλ − bᵀλ``, ``λ ≥ 0``, all rows inequalities) spends little more than that. It keeps a
working set P of rows in the order they entered and the lower Cholesky factor L of ``G_PP + ρI``
(a (p, p) array; only its lower triangle is read). Each round

1. **appends** a block of rows N: its Gram rows ``C = G_NP`` and ``D = G_NN``, then
   ``L21 = C L⁻ᵀ`` (one triangular solve with many right-hand sides) and ``L22 = chol(D − L21 L21ᵀ)``.
   Over the rounds this is the work of a single factorisation of the final P;
2. **solves** ``G_FF λ_F = b_F`` on the free rows F ⊆ P and drops every row whose multiplier is not
   positive, all at once (primal-dual active set, Hintermüller, Ito & Kunisch 2002), until all free
   multipliers are positive. A dropped row is *frozen*: it stays in the factor with ``λ = 0`` and the
   solve on F uses the factor of P with a k × k capacitance system, ``Y = L⁻¹E_D`` (k frozen rows),
   so that a drop costs one triangular solve, not a new factorisation. Past p/16 frozen rows they
   are cut for good (the factor is rebuilt from the first of them on);
3. **prices** every row: ``W = 𝒜*(λ)`` and all margins in O(n·T·d + n·d²). Violated frozen rows are
   freed at no cost; the most violated rows outside P form the next block.

It stops when no row is violated: the free multipliers are positive and solve their block, every
other row holds, so λ and W satisfy the KKT conditions of the full problem, tested by the same
relative violation and duality gap as the Newton method's. A round that does not settle (active-set
guesses cycling, a block not numerically positive definite, a working set too large for memory)
returns None and the caller takes the Newton route.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import scipy.linalg as sla
from numpy.typing import NDArray
from scipy.linalg.lapack import dpotrf

from ._base import ConstraintSet, RawSolution
from .certificate import ROW_FLOOR
from .status import OPTIMAL

__all__ = ["solve_cholesky_active_set"]

log = logging.getLogger(__name__)

_MAX_INNER = 60  # free-set solves per round before the guesses count as cycling
_MAX_ROUNDS = 200
# a block adds at most max(_MIN_BLOCK, p·_GROWTH) rows: larger blocks drop more of their rows again, smaller ones
# take more rounds (measured on the n·T = 10⁵, d = 256 instance: 0.25 beat 0.15, 0.5 and 1)
_GROWTH = 0.25
_MIN_BLOCK = 1000
# frozen rows cost every later solve and append a little: past p/_FROZEN_SHARE of them they are cut for good
_FROZEN_SHARE = 16


def _lower_solve(L: NDArray[np.float64], B: NDArray[np.float64], trans: int = 0) -> NDArray[np.float64]:
    # (LAPACK's trtrs reads only the lower triangle: what lies above it is never touched)
    return sla.solve_triangular(L, B, lower=True, trans=trans, check_finite=False)


def _chol_inplace(S: NDArray[np.float64]) -> bool:
    """Overwrite the lower triangle of the C-ordered S with its Cholesky factor (no copy: LAPACK sees Sᵀ,
    whose upper triangle it is); False when S is not numerically positive definite."""
    _, info = dpotrf(S.T, lower=0, clean=0, overwrite_a=1)
    return info == 0


class _Factor:
    """The working set: flat row indices ``rows`` (entry order) and ``M`` (p, p), whose lower triangle is L."""

    def __init__(self, A2: NDArray[np.float64], ZZ: NDArray[np.float64], T: int, ridge: float) -> None:
        self.A2, self.ZZ, self.T, self.ridge = A2, ZZ, T, ridge
        self.M = np.zeros((0, 0))
        self.rows = np.zeros(0, np.int64)
        self.frozen = np.zeros(0, np.int64)  # positions of the frozen rows
        self.Y = np.zeros((0, 0))  # L⁻¹ E_frozen (p, k)

    @property
    def p(self) -> int:
        return int(self.rows.size)

    def gram(self, r: NDArray[np.int64], c: NDArray[np.int64]) -> NDArray[np.float64]:
        G = self.A2[r] @ self.A2[c].T
        G *= self.ZZ[np.ix_(r // self.T, c // self.T)]
        return G

    def rebuild(self, j0: int, R: NDArray[np.int64]) -> bool:
        """Positions ≥ j0 become the rows ``R`` (flat indices): ``L21 = G_{R,:j0} L11⁻ᵀ``,
        ``L22 = chol(G_RR + ρI − L21 L21ᵀ)``; positions < j0 keep their factor."""
        q = R.size
        m = j0 + q
        if j0 == 0:
            self.M = np.zeros((0, 0))  # (free the old factor before the new one is built)
        old, rows = self.M, self.rows[:j0]
        M = np.zeros((m, m))
        if j0:
            M[:j0, :j0] = old[:j0, :j0]
            # G_{R,:j0} L11⁻ᵀ, one triangular solve with q right-hand sides
            M[j0:, :j0] = _lower_solve(old if old.shape[0] == j0 else M[:j0, :j0], self.gram(R, rows).T).T
        del old
        self.M = None  # type: ignore[assignment]
        B = M[j0:, j0:]
        B[...] = self.gram(R, R)
        B[np.diag_indices(q)] += self.ridge
        if j0:
            B -= M[j0:, :j0] @ M[j0:, :j0].T
        S = np.ascontiguousarray(B) if j0 else B
        if not _chol_inplace(S):
            return False
        if j0:
            B[...] = S
        Ytop = self.Y[:j0]
        self.M, self.rows = M, np.concatenate([rows, R])
        if Ytop.shape[1]:  # the frozen rows all lie before j0: their columns of L⁻¹E continue as −L22⁻¹ L21 Y_top
            tail = _lower_solve(S, -(M[j0:, :j0] @ Ytop))
            self.Y = np.vstack([Ytop, tail])
        else:
            self.Y = np.zeros((m, 0))
        return True

    def append(self, new: NDArray[np.int64]) -> bool:
        return self.rebuild(self.p, new)

    def cut(self, keep: NDArray[np.bool_]) -> bool:
        """Remove the rows at positions where ``keep`` is False, refactorising from the first of them."""
        j0 = int(np.argmax(~keep))
        if j0 < self.p // 4:  # most of the factor changes: build it afresh from the kept rows
            j0 = 0
        R = self.rows[j0:][keep[j0:]]
        if self.frozen.size and self.frozen.max() >= j0:
            raise AssertionError("frozen rows must be cut together with the rows after them")
        return self.rebuild(j0, R)

    def freeze(self, pos: NDArray[np.int64]) -> None:
        j0 = int(pos.min())
        E = np.zeros((self.p - j0, pos.size))
        E[pos - j0, np.arange(pos.size)] = 1.0
        Ynew = np.zeros((self.p, pos.size))
        Ynew[j0:] = _lower_solve(np.ascontiguousarray(self.M[j0:, j0:]), E)
        self.frozen = np.concatenate([self.frozen, pos])
        self.Y = np.hstack([self.Y, Ynew])

    def thaw(self, pos: NDArray[np.int64]) -> None:
        keep = ~np.isin(self.frozen, pos)
        self.frozen, self.Y = self.frozen[keep], self.Y[:, keep]

    def solve(self, b: NDArray[np.float64]) -> NDArray[np.float64]:
        """λ_P with ``(G + ρI)_FF λ_F = b_F`` on the free rows and ``λ = 0`` on the frozen ones."""
        bt = b.copy()
        bt[self.frozen] = 0.0
        c = _lower_solve(self.M, bt)
        if self.frozen.size:  # (YᵀY) u = −Yᵀc makes the solution vanish on the frozen rows
            u = np.linalg.solve(self.Y.T @ self.Y, -(self.Y.T @ c))
            c += self.Y @ u
        x = _lower_solve(self.M, c, trans=1)
        x[self.frozen] = 0.0
        return x


def solve_cholesky_active_set(
    cs: ConstraintSet, *, tol: float, ridge: float, start: int, max_rows: int
) -> RawSolution | None:
    """Solve the reduced, row-normalised, all-inequality instance ``cs`` (module doc).

    ``start`` hardest rows per sequence form the first block; later blocks hold at most
    ``max(1000, p/4)`` rows. Returns None (take another route) when a round does not settle or the
    working set would exceed ``max_rows``.
    """
    t0 = time.perf_counter()
    n, T, d = cs.A.shape
    A2 = cs.A.reshape(n * T, d)
    Z = cs.Z
    b = cs.rhs.ravel()
    mask = cs.mask.ravel()
    F = _Factor(A2, Z @ Z.T, T, ridge * max(float(np.mean(cs.gram_diag()[cs.mask])), 1e-300))
    new = np.flatnonzero(cs.hardest_rows(start).ravel() & mask)
    solves = rounds = 0
    x = np.zeros(0)
    while True:
        rounds += 1
        if rounds > _MAX_ROUNDS or F.p + new.size > max_rows:
            log.debug("cholesky active set: %d rounds, %d rows: giving up", rounds, F.p + new.size)
            return None
        if new.size and not F.append(new):
            log.debug("cholesky active set: appended block not positive definite")
            return None
        for _ in range(_MAX_INNER):
            x = F.solve(b[F.rows])
            solves += 1
            neg = x <= 0
            neg[F.frozen] = False
            if not neg.any():
                break
            F.freeze(np.flatnonzero(neg))
            if F.frozen.size > max(16, F.p // _FROZEN_SHARE):  # many frozen rows: cut them for good
                keep = np.ones(F.p, bool)
                keep[F.frozen] = False
                F.frozen, F.Y = np.zeros(0, np.int64), np.zeros((F.p, 0))
                if not F.cut(keep):
                    return None
        else:
            log.debug("cholesky active set: free set did not settle in %d solves", _MAX_INNER)
            return None
        # price every row
        lam = np.zeros(n * T)
        lam[F.rows] = x
        W = cs.adjoint(lam.reshape(n, T))
        m = cs.apply(W).ravel()
        wsq = float(np.sum(W * W))
        # (rows normalised, ‖a_k‖‖z_k‖ = 1: the certificate's σ_k = max(|b_k|, ROW_FLOOR·‖W‖))
        sigma = np.maximum(np.abs(b), ROW_FLOOR * np.sqrt(wsq))
        rel = np.where(mask, (b - m) / sigma, -np.inf)
        bad = rel > tol
        in_p = np.zeros(n * T, bool)
        in_p[F.rows] = True
        free_p = in_p.copy()
        free_p[F.rows[F.frozen]] = False
        if bad[free_p].any():  # a free row's own equation does not hold: numerically unreliable
            log.debug("cholesky active set: free rows violated (%.2e)", float(rel[free_p].max()))
            return None
        thaw = np.flatnonzero(bad[F.rows[F.frozen]]) if F.frozen.size else np.zeros(0, np.int64)
        out = np.flatnonzero(bad & ~in_p)
        log.debug(
            "cholesky active set: round %d, %d rows, %d frozen, %d violated", rounds, F.p, F.frozen.size, out.size
        )
        if out.size == 0 and thaw.size == 0:
            gap = wsq - float(b @ lam)
            if abs(gap) > tol * max(wsq, 1e-300):
                return None
            info = dict(
                backend="frobenius",
                path="cholesky_active_set",
                rounds=rounds,
                working_set_size=F.p,
                frozen=int(F.frozen.size),
                solves=solves,
                violation=float(max(rel.max(), 0.0)),
                gap=gap,
                K=int(mask.sum()),
                time=time.perf_counter() - t0,
            )
            return RawSolution(W, lam.reshape(n, T), OPTIMAL, solves, info)
        if thaw.size:
            F.thaw(F.frozen[thaw])
        cap = max(_MIN_BLOCK, int(F.p * _GROWTH))
        if out.size > cap:
            out = out[np.argpartition(-rel[out], cap)[:cap]]
        new = np.sort(out)
