"""Large Frobenius instances near the dense floor: an active set on one growing Cholesky factor.

For tens of thousands of constraints and more, the work no exact method avoids is the *dense floor*:
the Gram matrix of the support and one Cholesky factorisation of it. This solver of the dual
(``min ½λᵀGλ − bᵀλ``, ``λ ≥ 0``, all rows inequalities) spends little more than that. It keeps a
working set P of rows in the order they entered and the lower Cholesky factor L of ``G_PP + ρI``,
stored as one block row per appended block (so an append copies none of it, and it takes half the memory
of a square array). Each round

1. **appends** a block of rows N: its Gram rows ``C = G_NP`` and ``D = G_NN`` (the lower triangle only),
   then ``L21 = C L⁻ᵀ`` (blocked forward substitution with many right-hand sides) and
   ``L22 = chol(D − L21 L21ᵀ)``. Over the rounds this is the work of a single factorisation of the final P;
2. **solves** ``G_FF λ_F = b_F`` on the free rows F ⊆ P and drops every row whose multiplier is not
   positive, all at once (primal-dual active set, Hintermüller, Ito & Kunisch 2002), until all free
   multipliers are positive. A dropped row is *frozen*: it stays in the factor with ``λ = 0`` and the
   solve on F uses the factor of P with a k × k capacitance system, ``Y = L⁻¹E_D`` (k frozen rows),
   so that a drop costs one triangular solve, not a new factorisation. Past p/8 frozen rows they
   are cut for good: the rows after the first of them keep their part of L left of it and only their
   block right of it is factorised again;
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
from scipy.linalg import blas
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
# (a cut refactorises most of L; of 8, 12 and 16, 8 was fastest or tied on n·T = 10⁵, d = 256 and two other
# large instances, and 4 was slower than 8 on the first)
_FROZEN_SHARE = 8
_CHUNK = 16  # rows of a Gram block scaled at a time


def _lower_solve(L: NDArray[np.float64], B: NDArray[np.float64], trans: int = 0) -> NDArray[np.float64]:
    # (LAPACK's trtrs reads only the lower triangle: what lies above it is never touched)
    return sla.solve_triangular(L, B, lower=True, trans=trans, check_finite=False)


def _chol_inplace(S: NDArray[np.float64]) -> bool:
    """Overwrite the lower triangle of the C-ordered S with its Cholesky factor (no copy: LAPACK sees Sᵀ,
    whose upper triangle it is); False when S is not numerically positive definite."""
    _, info = dpotrf(S.T, lower=0, clean=0, overwrite_a=1)
    return info == 0


class _Factor:
    """The working set: flat row indices ``rows`` (entry order) and the lower Cholesky factor L of
    ``G_PP + ρI``, kept as *block rows*, one per appended block: block b (rows s_b … s_b + q_b) holds its
    rows' part left of the diagonal ``L21[b]`` (q_b, s_b) and its diagonal block ``D[b]`` (q_b, q_b; only
    the lower triangle is read). A solve with L is blocked substitution: one matrix product and one
    triangular solve per block."""

    def __init__(self, A2: NDArray[np.float64], ZZ: NDArray[np.float64], T: int, ridge: float) -> None:
        self.A2, self.ZZ, self.T, self.ridge = A2, ZZ, T, ridge
        self.L21: list[NDArray[np.float64]] = []
        self.D: list[NDArray[np.float64]] = []
        self.starts: list[int] = []
        self.rows = np.zeros(0, np.int64)
        self.frozen = np.zeros(0, np.int64)  # positions of the frozen rows
        self.Y = np.zeros((0, 0))  # L⁻¹ E_frozen (p, k)
        self.YY = np.zeros((0, 0))  # YᵀY, kept up to date

    @property
    def p(self) -> int:
        return int(self.rows.size)

    def gram(self, r: NDArray[np.int64], c: NDArray[np.int64] | None = None) -> NDArray[np.float64]:
        """``G_rc``; with ``c`` None, ``G_rr`` with only its lower triangle computed (the upper one is 0)."""
        if c is None:  # (C-ordered: the upper triangle of its transpose, by BLAS syrk at half the work)
            G = blas.dsyrk(1.0, self.A2[r].T, trans=1, lower=0).T
            c = r
        else:
            G = self.A2[r] @ self.A2[c].T
        Zc = self.ZZ[:, c // self.T]  # (then its rows: G_kl has the factor z_{i(k)}ᵀ z_{i(l)})
        ri = r // self.T
        for a in range(0, r.size, _CHUNK):  # (in chunks that stay in cache)
            G[a : a + _CHUNK] *= Zc[ri[a : a + _CHUNK]]
        return G

    def forward(self, B: NDArray[np.float64], first: int = 0) -> NDArray[np.float64]:
        """``L⁻¹B`` for B (p, r) whose rows before position ``first`` are 0 (so are the answer's)."""
        X = np.zeros((self.p, B.shape[1]))
        for s, L21, D in zip(self.starts, self.L21, self.D):
            e = s + D.shape[0]
            if e <= first:
                continue
            rhs = B[s:e] - L21[:, first:] @ X[first:s] if s > first else B[s:e]
            X[s:e] = _lower_solve(D, rhs)
        return X

    def backward(self, C: NDArray[np.float64]) -> NDArray[np.float64]:
        """``L⁻ᵀC`` for C (p,) or (p, r)."""
        C = C.copy()
        for s, L21, D in zip(reversed(self.starts), reversed(self.L21), reversed(self.D)):
            e = s + D.shape[0]
            C[s:e] = _lower_solve(D, C[s:e], trans=1)
            if s:
                C[:s] -= L21.T @ C[s:e]
        return C

    def _add(self, R: NDArray[np.int64], L21: NDArray[np.float64]) -> bool:
        """Rows ``R`` (flat indices) after the current ones, their part of L left of the diagonal given:
        ``D = chol(G_RR + ρI − L21 L21ᵀ)``; the frozen rows' columns of L⁻¹E continue as −D⁻¹ L21 Y."""
        S = self.gram(R)  # (only lower triangles are computed and read from here on)
        S[np.diag_indices(R.size)] += self.ridge
        if L21.shape[1]:  # S −= L21 L21ᵀ by syrk on the transposes (Fortran order: no copies)
            blas.dsyrk(-1.0, L21.T, beta=1.0, c=S.T, trans=1, lower=0, overwrite_c=1)
        if not _chol_inplace(S):
            return False
        if self.Y.shape[1]:
            tail = _lower_solve(S, -(L21 @ self.Y))
            self.Y = np.vstack([self.Y, tail])
            self.YY += tail.T @ tail
        else:
            self.Y = np.zeros((self.p + R.size, 0))
        self.starts.append(self.p)
        self.L21.append(L21)
        self.D.append(S)
        self.rows = np.concatenate([self.rows, R])
        return True

    def append(self, new: NDArray[np.int64]) -> bool:
        """Add the rows ``new`` (flat indices): ``L21 = G_{new,P} L⁻ᵀ`` by forward substitution."""
        L21 = self.forward(self.gram(self.rows, new)).T if self.p else np.zeros((new.size, 0))
        return self._add(new, np.ascontiguousarray(L21))

    def cut(self, keep: NDArray[np.bool_]) -> bool:
        """Remove the rows at positions where ``keep`` is False (every frozen row among them). Positions
        before the first removed one, j0, keep their factor; a kept row after it keeps its part of L left
        of column j0 (that part depends only on its own Gram row), so only the kept rows' block right of
        j0 is factorised again."""
        j0 = int(np.argmax(~keep))
        if self.frozen.size and self.frozen.max() >= j0:
            raise AssertionError("frozen rows must be cut together with the rows after them")
        kept = np.flatnonzero(keep[j0:]) + j0
        parts = []
        starts, L21s, Ds = [], [], []
        for s, L21, D in zip(self.starts, self.L21, self.D):
            e = s + D.shape[0]
            if e <= j0:
                starts.append(s)
                L21s.append(L21)
                Ds.append(D)
                continue
            if s < j0:  # the block that holds j0: its rows before j0 stay a block of their own
                starts.append(s)
                L21s.append(L21[: j0 - s].copy())
                Ds.append(np.ascontiguousarray(D[: j0 - s, : j0 - s]))
            local = kept[(kept >= s) & (kept < e)] - s
            if local.size:
                parts.append(np.hstack([L21[local], D[local, : j0 - s]]) if s < j0 else L21[local, :j0])
        R = self.rows[kept]
        self.starts, self.L21, self.D = starts, L21s, Ds
        self.rows = self.rows[:j0]
        self.Y, self.YY = self.Y[:j0], self.YY[:0, :0]
        left = np.vstack(parts) if parts else np.zeros((0, j0))
        return self._add(R, np.ascontiguousarray(left)) if R.size else True

    def freeze(self, pos: NDArray[np.int64]) -> None:
        E = np.zeros((self.p, pos.size))
        E[pos, np.arange(pos.size)] = 1.0
        Ynew = self.forward(E, int(pos.min()))
        cross = self.Y.T @ Ynew
        self.YY = np.block([[self.YY, cross], [cross.T, Ynew.T @ Ynew]])
        self.frozen = np.concatenate([self.frozen, pos])
        self.Y = np.hstack([self.Y, Ynew])

    def thaw(self, pos: NDArray[np.int64]) -> None:
        keep = ~np.isin(self.frozen, pos)
        self.frozen, self.Y, self.YY = self.frozen[keep], self.Y[:, keep], self.YY[np.ix_(keep, keep)]

    def solve(self, b: NDArray[np.float64]) -> NDArray[np.float64]:
        """λ_P with ``(G + ρI)_FF λ_F = b_F`` on the free rows and ``λ = 0`` on the frozen ones."""
        bt = b.copy()
        bt[self.frozen] = 0.0
        c = self.forward(bt[:, None])[:, 0]
        if self.frozen.size:  # (YᵀY) u = −Yᵀc makes the solution vanish on the frozen rows
            u = np.linalg.solve(self.YY, -(self.Y.T @ c))
            c += self.Y @ u
        x = self.backward(c)
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
