"""The interior point of :mod:`._sdp`, compiled: one instance at a time, the same iterates (docs/spec.md §3).

:func:`attsvm.svm._sdp.ipm_many` sends a stack here when numba is installed (the ``fast`` extra). The
method is the one of :mod:`._sdp` — the HKM direction, Mehrotra's predictor–corrector, the Schur
complement from K × K Gram matrices, exact step lengths from eigenvalues, the same start, centring,
stopping and stall tests — written for one instance, so that an instance runs its own iterations
only and no NumPy call is paid per iteration. Two factorisations differ from the NumPy route, where
numpy offers no batched alternative: the Schur complement is factorised once per iteration by
Cholesky and both directions reuse the factor (the NumPy route solves twice by LU; Cholesky falls
back to LU where round-off leaves it not positive definite), and L⁻¹ is computed by triangular
substitution instead of a general inverse. The iterates agree with the NumPy route's to round-off;
:mod:`.batch_nuclear` certifies every point either way.

numba is imported only when this module is, and this module only when a stack is solved; the kernel
is compiled once and cached next to this file (``cache=True``).
"""

from __future__ import annotations

import numba as nb
import numpy as np
from numpy.typing import NDArray

from .._threads import run_ranges

__all__ = ["solve_stack"]

# reassociation and contraction (FMA) let the compiler vectorise the factorisations' inner products (9% of
# the kernel's time on svm-rank's instances); no "nnan"/"ninf": the factorisations test for NaN
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}
# instances per thread at least (an instance takes about 0.1–2 ms), and ranges per thread at most
MIN_PER_THREAD = 8
CHUNKS_PER_THREAD = 4


@nb.njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _chol(A, L):
    """Lower Cholesky factor of A into L; False where A is not (numerically) positive definite."""
    n = A.shape[0]
    for j in range(n):
        d = A[j, j]
        for k in range(j):
            d -= L[j, k] * L[j, k]
        if not d > 0.0:  # (also NaN)
            return False
        d = np.sqrt(d)
        L[j, j] = d
        for i in range(j + 1, n):
            v = A[i, j]
            for k in range(j):
                v -= L[i, k] * L[j, k]
            L[i, j] = v / d
        for i in range(j):
            L[i, j] = 0.0
    return True


@nb.njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _tri_inv(L, Li):
    """Li = L⁻¹ for lower-triangular L (forward substitution, column by column)."""
    n = L.shape[0]
    Li[:, :] = 0.0
    for j in range(n):
        Li[j, j] = 1.0 / L[j, j]
        for i in range(j + 1, n):
            v = 0.0
            for k in range(j, i):
                v -= L[i, k] * Li[k, j]
            Li[i, j] = v / L[i, i]


@nb.njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _cho_solve(L, r, out):
    """out = (L Lᵀ)⁻¹ r."""
    n = L.shape[0]
    for i in range(n):
        v = r[i]
        for k in range(i):
            v -= L[i, k] * out[k]
        out[i] = v / L[i, i]
    for i in range(n - 1, -1, -1):
        v = out[i]
        for k in range(i + 1, n):
            v -= L[k, i] * out[k]
        out[i] = v / L[i, i]


@nb.njit(cache=True, nogil=True)
def _lu_solve(A, r, out):
    """out = A⁻¹ r by Gaussian elimination with partial pivoting; False where A is singular."""
    n = A.shape[0]
    U = A.copy()
    out[:] = r
    for j in range(n):
        p = j
        for i in range(j + 1, n):
            if abs(U[i, j]) > abs(U[p, j]):
                p = i
        piv = U[p, j]
        if piv == 0.0 or not np.isfinite(piv):
            return False
        if p != j:
            for c in range(j, n):
                t = U[j, c]
                U[j, c] = U[p, c]
                U[p, c] = t
            t = out[j]
            out[j] = out[p]
            out[p] = t
        for i in range(j + 1, n):
            f = U[i, j] / piv
            if f != 0.0:
                for c in range(j + 1, n):
                    U[i, c] -= f * U[j, c]
                out[i] -= f * out[j]
    for i in range(n - 1, -1, -1):
        v = out[i]
        for c in range(i + 1, n):
            v -= U[i, c] * out[c]
        out[i] = v / U[i, i]
        if not abs(out[i]) < np.inf:
            return False
    return True


@nb.njit(cache=True, nogil=True)
def _dot(A, B):
    """A @ B of C-contiguous matrices (one specialisation of numba's BLAS call)."""
    return np.dot(A, B)


@nb.njit(cache=True, nogil=True)
def _block(G, r0, r1, c0, c1):
    """A contiguous copy of G[r0:r1, c0:c1]."""
    out = np.empty((r1 - r0, c1 - c0))
    for i in range(r0, r1):
        for j in range(c0, c1):
            out[i - r0, j - c0] = G[i, j]
    return out


@nb.njit(cache=True, nogil=True)
def _trans(G):
    """A contiguous copy of Gᵀ."""
    out = np.empty((G.shape[1], G.shape[0]))
    for i in range(G.shape[0]):
        for j in range(G.shape[1]):
            out[j, i] = G[i, j]
    return out


@nb.njit(cache=True, nogil=True)
def _sym_comb(a, A, b, B, out):
    """out = sym(a A + b B)."""
    n = A.shape[0]
    for i in range(n):
        for j in range(i + 1):
            v = 0.5 * (a * (A[i, j] + A[j, i]) + b * (B[i, j] + B[j, i]))
            out[i, j] = v
            out[j, i] = v


@nb.njit(cache=True, nogil=True)
def _apply(F, Zq, G, ra, out):
    """``⟨F_k, G⟩ = a_kᵀ sym(G)₁₂ z_k`` for every row."""
    rz = Zq.shape[1]
    H = np.empty((ra, rz))
    for i in range(ra):
        for j in range(rz):
            H[i, j] = 0.5 * (G[i, ra + j] + G[ra + j, i])
    FH = _dot(F, H)
    for k in range(F.shape[0]):
        v = 0.0
        for j in range(rz):
            v += FH[k, j] * Zq[k, j]
        out[k] = v


@nb.njit(cache=True, nogil=True)
def _adjoint(FT, Zq, v, ra, out):
    """``Σ_k v_k F_k`` = ½[[0, Y], [Yᵀ, 0]] with ``Y = Σ_k v_k a_k z_kᵀ`` (FT: the rows a_k as columns)."""
    K, rz = Zq.shape
    VZ = np.empty((K, rz))
    for k in range(K):
        for j in range(rz):
            VZ[k, j] = 0.5 * v[k] * Zq[k, j]
    Y = _dot(FT, VZ)
    out[:, :] = 0.0
    for i in range(ra):
        for j in range(rz):
            out[i, ra + j] = Y[i, j]
            out[ra + j, i] = Y[i, j]


@nb.njit(cache=True, nogil=True)
def _max_step(Li, LiT, D):
    """Largest α (capped at 1e30) with ``LLᵀ + αD ⪰ 0`` given ``Li = L⁻¹``; NaN where D is not finite."""
    S = _dot(_dot(Li, D), LiT)
    n = S.shape[0]
    for i in range(n):
        for j in range(i):
            v = 0.5 * (S[i, j] + S[j, i])
            S[i, j] = v
            S[j, i] = v
    if not np.isfinite(S).all():
        return np.nan
    ev = np.linalg.eigvalsh(S)[0]
    if ev < 0.0:
        return -1.0 / min(ev, -1e-300)
    return 1e30


@nb.njit(cache=True, nogil=True)
def _max_step_vec(x, dx, iq):
    """Largest α with ``x + α dx ≥ 0`` on the rows ``iq`` (capped at 1e30)."""
    a = 1e30
    for k in range(x.shape[0]):
        if iq[k] and dx[k] < 0.0:
            a = min(a, -x[k] / dx[k])
    return a


@nb.njit(cache=True, nogil=True)
def _direction(F, FT, Zq, X, Zi, Rd, rp, XRdZi, LS, S, use_lu, s, ysafe, iq, Rc_Zi, rs, ra, dX, dy, dZ, ds):
    """The HKM direction for the complementarity right-hand sides ``R_c Z⁻¹`` and ``r_s``
    (:meth:`attsvm.svm._sdp._System.direction`); False where the Schur complement is singular."""
    K = F.shape[0]
    N = X.shape[0]
    T = np.empty((N, N))
    for i in range(N):
        for j in range(N):
            T[i, j] = Rc_Zi[i, j] - XRdZi[i, j]
    tmp = np.empty(K)
    _apply(F, Zq, T, ra, tmp)
    rhs = np.empty(K)
    for k in range(K):
        rhs[k] = rp[k] - tmp[k] + (rs[k] / ysafe[k] if iq[k] else 0.0)
    if use_lu:
        if not _lu_solve(S, rhs, dy):
            return False
    else:
        _cho_solve(LS, rhs, dy)
    _adjoint(FT, Zq, dy, ra, dZ)
    for i in range(N):
        for j in range(N):
            dZ[i, j] = Rd[i, j] - dZ[i, j]
    P = _dot(_dot(X, dZ), Zi)
    for i in range(N):
        for j in range(i + 1):
            v = 0.5 * (Rc_Zi[i, j] + Rc_Zi[j, i] - P[i, j] - P[j, i])
            dX[i, j] = v
            dX[j, i] = v
    for k in range(K):
        ds[k] = (rs[k] - s[k] * dy[k]) / ysafe[k] if iq[k] else 0.0
    return True


@nb.njit(cache=True, nogil=True)
def _solve_one(F, Zq, b, iq, tol, max_iter, stall_below, stall_iters, diverged_y, fraction, M_out, y_out):
    """One instance of :func:`attsvm.svm._sdp.ipm_many`. Writes M (r_a, r_z) and y (K) of its final
    point (0 where it left without one); returns (iterations, converged)."""
    K, ra = F.shape
    rz = Zq.shape[1]
    N = ra + rz
    m = 0
    for k in range(K):
        if iq[k]:
            m += 1
    X = np.eye(N)
    Zm = np.eye(N)
    y = np.zeros(K)
    s = np.zeros(K)
    for k in range(K):
        if iq[k]:
            y[k] = 0.1
            s[k] = 1.0
    bnorm = 1.0 + np.abs(b).max()
    best = np.inf
    since = 0
    iters = 0
    M_out[:, :] = 0.0
    y_out[:] = 0.0
    L2 = np.empty((2, N, N))  # factors of X and Z, their inverses and the transposes
    Li2 = np.empty((2, N, N))
    LiT2 = np.empty((2, N, N))
    steps = np.empty(2)
    dXZ = np.empty((2, 2, N, N))  # (predictor, corrector) × (ΔX, ΔZ)
    dys = np.empty((2, K))
    dss = np.empty((2, K))
    Ay = np.empty((N, N))
    Rd = np.empty((N, N))
    rp = np.empty(K)
    tmp = np.empty(K)
    S = np.empty((K, K))
    LS = np.empty((K, K))
    ysafe = np.empty(K)
    rs = np.empty(K)
    Rc_Zi = np.empty((N, N))
    FT = _trans(F)
    ZT = _trans(Zq)
    for _ in range(max_iter):
        if not (_chol(X, L2[0]) and _chol(Zm, L2[1])):
            return iters, False  # (a cone matrix that lost positive definiteness: leaves, unconverged)
        _adjoint(FT, Zq, y, ra, Ay)
        xz = 0.0
        dinf = 0.0
        tr = 0.0
        for i in range(N):
            tr += X[i, i]
            for j in range(N):
                Rd[i, j] = (0.5 if i == j else 0.0) - Ay[i, j] - Zm[i, j]
                dinf = max(dinf, abs(Rd[i, j]))
                xz += X[i, j] * Zm[i, j]
        _apply(F, Zq, X, ra, tmp)
        sy = 0.0
        dobj = 0.0
        pinf = 0.0
        ymax = 0.0
        for k in range(K):
            rp[k] = b[k] - tmp[k] + s[k]
            sy += s[k] * y[k]
            dobj += b[k] * y[k]
            pinf = max(pinf, abs(rp[k]))
            ymax = max(ymax, abs(y[k]))
        mu = (xz + sy) / (N + m)
        pobj = 0.5 * tr
        gap = abs(pobj - dobj) / (1.0 + abs(pobj) + abs(dobj))
        merit = max(max(gap, pinf / bnorm), dinf)
        conv = merit <= tol
        if merit < 0.5 * best:
            best = merit
            since = 0
        else:
            since += 1
        if conv or (since >= stall_iters and merit <= stall_below):
            M_out[:, :] = X[:ra, ra:]
            y_out[:] = y
            return iters, conv
        if ymax > diverged_y:
            return iters, False  # (an unbounded dual: infeasible; leaves at once)
        iters += 1
        for c in range(2):
            _tri_inv(L2[c], Li2[c])
            LiT2[c] = Li2[c].T
        Zi = _dot(LiT2[1], Li2[1])
        # the Schur complement from K × K Gram matrices (module doc of ._sdp)
        xuu = _dot(_dot(F, _block(X, 0, ra, 0, ra)), FT)
        xvv = _dot(_dot(Zq, _block(X, ra, N, ra, N)), ZT)
        xuv = _dot(_dot(F, _block(X, 0, ra, ra, N)), ZT)
        zuu = _dot(_dot(F, _block(Zi, 0, ra, 0, ra)), FT)
        zvv = _dot(_dot(Zq, _block(Zi, ra, N, ra, N)), ZT)
        zuv = _dot(_dot(F, _block(Zi, 0, ra, ra, N)), ZT)
        for k in range(K):
            for j in range(k + 1):
                v = xuv[j, k] * zuv[k, j] + xuv[k, j] * zuv[j, k] + xvv[k, j] * zuu[k, j] + xuu[k, j] * zvv[k, j]
                v *= 0.25
                S[k, j] = v
                S[j, k] = v
        for k in range(K):
            ysafe[k] = y[k] if iq[k] else 1.0
            if iq[k]:
                S[k, k] += s[k] / y[k]
        use_lu = not _chol(S, LS)
        XRdZi = _dot(_dot(X, Rd), Zi)
        # predictor (σ = 0: R_c Z⁻¹ = −X), then the corrector (R_c = σμI − XZ − ΔX_a ΔZ_a); one call
        # site for each kernel (numba links a callee into its caller once per call site)
        for i in range(N):
            for j in range(N):
                Rc_Zi[i, j] = -X[i, j]
        for k in range(K):
            rs[k] = -s[k] * y[k]
        ap = ad = 0.0
        for phase in range(2):
            D = dXZ[phase]
            dy, ds = dys[phase], dss[phase]
            system = (F, FT, Zq, X, Zi, Rd, rp, XRdZi, LS, S, use_lu, s, ysafe, iq)
            if not _direction(*system, Rc_Zi, rs, ra, D[0], dy, D[1], ds):
                return iters, False  # (a singular Schur complement: leaves, unconverged)
            for c in range(2):
                steps[c] = _max_step(Li2[c], LiT2[c], D[c])
            ap = min(1.0, min(steps[0], _max_step_vec(s, ds, iq)))
            ad = min(1.0, min(steps[1], _max_step_vec(y, dy, iq)))
            if phase == 1:
                break
            aX, aZ, ay, as_ = D[0], D[1], dy, ds
            xz = 0.0
            for i in range(N):
                for j in range(N):
                    xz += (X[i, j] + ap * aX[i, j]) * (Zm[i, j] + ad * aZ[i, j])
            for k in range(K):
                xz += (s[k] + ap * as_[k]) * (y[k] + ad * ay[k])
            mu_aff = xz / (N + m)
            smu = min(max(mu_aff / mu, 0.0), 1.0) ** 3 * mu
            P = _dot(_dot(aX, aZ), Zi)
            for i in range(N):
                for j in range(N):
                    Rc_Zi[i, j] = smu * Zi[i, j] - X[i, j] - P[i, j]
            for k in range(K):
                rs[k] = smu - s[k] * y[k] - as_[k] * ay[k] if iq[k] else 0.0
        ap, ad = min(1.0, fraction * ap), min(1.0, fraction * ad)
        dX, dZ, dy, ds = dXZ[1, 0], dXZ[1, 1], dys[1], dss[1]
        _sym_comb(1.0, X, ap, dX, X)
        _sym_comb(1.0, Zm, ad, dZ, Zm)
        for k in range(K):
            s[k] += ap * ds[k]
            y[k] += ad * dy[k]
    M_out[:, :] = X[:ra, ra:]  # out of iterations: the last point, for the caller to certify or refuse
    y_out[:] = y
    return iters, False


def solve_stack(
    Fs: NDArray[np.float64],
    Zs: NDArray[np.float64],
    b: NDArray[np.float64],
    ineq: NDArray[np.bool_],
    tol: float,
    max_iter: int,
    stall_below: float,
    stall_iters: int,
    diverged_y: float,
    fraction: float,
    threads: int = 1,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_], NDArray[np.int64]]:
    """:func:`attsvm.svm._sdp.ipm_many` on the stack (same arguments, results and tolerances), the
    instances split over ``threads`` threads (:func:`attsvm._threads.run_ranges`; the kernel releases
    the GIL, and the results do not depend on the split)."""
    B, K, r_a = Fs.shape
    r_z = Zs.shape[2]
    M = np.empty((B, r_a, r_z))
    y = np.empty((B, K))
    conv = np.empty(B, dtype=np.bool_)
    iters = np.empty(B, dtype=np.int64)
    # (C-contiguous and writeable: a read-only array is another numba type, compiled again at first use)
    Fs = np.require(Fs, np.float64, ["C", "W"])
    Zs = np.require(Zs, np.float64, ["C", "W"])
    b = np.require(b, np.float64, ["C", "W"])
    ineq = np.require(ineq, np.bool_, ["C", "W"])
    args = (float(tol), int(max_iter), float(stall_below), int(stall_iters), float(diverged_y), float(fraction))

    def solve(lo: int, hi: int) -> None:
        # (a loop here, not compiled: a compiled loop would link the whole kernel a second time, doubling
        # its compile time, and the call costs a few µs against an instance's ~1 ms)
        for i in range(lo, hi):
            iters[i], conv[i] = _solve_one(Fs[i], Zs[i], b[i], ineq[i], *args, M[i], y[i])

    run_ranges(solve, B, threads, MIN_PER_THREAD, CHUNKS_PER_THREAD)
    return M, y, conv, iters
