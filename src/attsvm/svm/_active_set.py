"""A compiled dual active-set solver for stacks of small Frobenius attention SVMs (docs/spec.md §3).

:mod:`attsvm.svm.batch` hands a stack of instances of one shape (n, T, d, d_z) here when numba is
installed (the ``fast`` extra). Each instance is solved by the Goldfarb–Idnani dual method
(Goldfarb & Idnani 1983) on the reduced program of :mod:`.reduction`,

    min ½‖ŵ‖²  s.t.  ĉ_kᵀŵ ≥ b̂_k,   ĉ_k = (a_k ⊗ z_k)/s_k,  s_k = ‖a_k‖‖z_k‖,  b̂_k = 1/(s_k g),

with g the power of two at the upper median of 1/s (the same numbers as the batched active set).
The Hessian is the identity, so the method only needs the Gram matrix Ĝ_kl = ĉ_kᵀĉ_l of the rows in
its working set: Ĝ_kl = (a_k·a_l)(z_k·z_l)/(s_k s_l), one column per row that enters, never the whole
K × K matrix. Starting from ŵ = 0 it adds the most violated row, moving the multipliers of the active
rows along ``r = Ĝ_AA⁻¹ Ĝ_Ap`` (Cholesky factor L of Ĝ_AA and M = L⁻¹Ĝ_A,:, each extended by one row per
addition: ρ = L⁻¹Ĝ_Ap is a column of M, and the margins move by Ĝ_:p − Mᵀρ) and dropping
a row whose multiplier reaches 0 (its row of L deleted and the triangle restored by Givens rotations,
applied to M's rows too), until no row is violated by more than ``tol`` relative to b̂ — a
finite method, whose active rows stay linearly independent, so degenerate faces do not stall it.

The multipliers are lifted to the user's units (``λ_k = g λ̂_k / s_k``), W = Σ λ_k a_k z_kᵀ, and the
certificate of :mod:`.certificate` — relative violation, duality gap, complementarity, support — is
computed in the same compiled pass. An instance whose new row is dependent on the active rows with no
multiplier to release is infeasible: it returns LEAVE_INFEASIBLE with the candidate Farkas certificate
in ``lam``. One whose rows include a tied token (a zero row), or that exceeds its iteration budget,
returns another negative code and goes to ``AttentionSVM.fit``.

A stack is solved by :class:`StackJob`: chunks of ``CHUNK`` instances, each claimed by one thread from an
atomic counter, so the calling thread can build Python objects while the pool's threads solve, and join
in when it is free.

numba is imported only when this module is, and this module only when a stack is solved; the kernels
are compiled once and cached next to this file (``cache=True``).
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import Future

import numba as nb
import numpy as np
from numba.core import types
from numba.core.extending import intrinsic
from numpy.typing import NDArray

from .._threads import start_helpers, wait_started
from ..tokens import SUPPORT_TOL, TIE_ULPS
from .certificate import ROW_FLOOR
from .reduction import ZERO_ROW_RTOL
from .status import LEAVE_INFEASIBLE, LEAVE_MAX_ITER, LEAVE_SINGULAR, LEAVE_TIED

__all__ = ["CHUNK", "GI_TOL", "StackJob", "max_iterations", "solve_stack"]

# A new row whose component orthogonal to the active rows has squared norm at most this (its own is 1)
# is dependent on them: the step cannot satisfy it, only release an active row.
DEPENDENT_TOL = 1e-10
# Stop when no row is violated by more than this, relative to its b̂ (normalised units of .reduction):
# each addition makes its row active to round-off, so this only absorbs the round-off of the margins
GI_TOL = 1e-13
# instances per thread at least (below that, a thread costs more than it saves), and per chunk: the unit
# a thread claims (about 0.2 ms at (n, T, d) = (6, 8, 10); a thread ends at most one chunk after another)
MIN_PER_THREAD = 64
CHUNK = 16
# the longest a job waits for its pool threads to start (about 0.1 ms when the pool is free)
SETTLE_TIMEOUT = 0.01

_EPS = float(np.finfo(np.float64).eps)
_MANTISSA = (1 << 52) - 1  # the fraction bits of a float64
_EXPONENT_SPAN = 64  # exponents of 1/s counted (:func:`_scale_exponent`)
# reassociation and contraction (FMA) let the compiler vectorise the inner products; no "nnan"/"ninf":
# the kernels compare against inf
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}


@nb.njit(cache=True, nogil=True)
def _select(v, k):
    """The k-th smallest entry of v (0-based; the value ``np.sort(v)[k]``) by quickselect with a
    median-of-three pivot, reordering v in place: expected O(len v), where a sort of K = 42 values cost
    about a tenth of an instance's solve."""
    lo = 0
    hi = v.shape[0] - 1
    while lo < hi:
        a, b, c = v[lo], v[(lo + hi) // 2], v[hi]
        piv = b if (a <= b) == (b <= c) else (a if (b <= a) == (a <= c) else c)
        i = lo
        j = hi
        while i <= j:  # (Hoare partition: v[lo..j] ≤ piv ≤ v[i..hi])
            while v[i] < piv:
                i += 1
            while v[j] > piv:
                j -= 1
            if i <= j:
                v[i], v[j] = v[j], v[i]
                i += 1
                j -= 1
        if k <= j:
            hi = j
        elif k >= i:
            lo = i
        else:
            break  # (j < k < i: v[k] = piv)
    return v[k]


@nb.njit(cache=True, nogil=True)
def _scale_exponent(v, srt, cnt):
    """e = ⌈log₂ m⌉ for the upper median m of the positive entries of v (``np.sort(v)[K // 2]``): g = 2^e is
    the power of two with m/g ∈ (½, 1]. As ⌈log₂⌉ is monotone, e is the upper median of the ⌈log₂ v_k⌉,
    read off the float64 bits and counted (the exponents of an instance span a few units), where a
    selection of K = 42 values cost about 6% of a solve; by selection where v holds subnormals or the
    exponents span ``_EXPONENT_SPAN`` or more."""
    K = v.shape[0]
    bits = v.view(np.int64)
    lo = 1 << 20
    hi = -(1 << 20)
    for k in range(K):
        b = bits[k]
        ef = (b >> 52) & 0x7FF
        if ef == 0 or ef == 0x7FF:
            lo = 1 << 20
            break
        c = ef - 1023 + (1 if b & _MANTISSA else 0)
        lo = min(lo, c)
        hi = max(hi, c)
    if hi < lo or hi - lo >= cnt.shape[0]:
        srt[:] = v
        mant, ex = math.frexp(_select(srt, K // 2))
        return ex - 1 if mant == 0.5 else ex
    cnt[: hi - lo + 1] = 0
    for k in range(K):
        b = bits[k]
        cnt[((b >> 52) & 0x7FF) - 1023 + (1 if b & _MANTISSA else 0) - lo] += 1
    seen = 0
    for j in range(hi - lo + 1):
        seen += cnt[j]
        if seen > K // 2:
            return lo + j
    return hi


@nb.njit(cache=True, nogil=True)
def _workspace(n, T, d, dz):
    """The scratch arrays of :func:`_solve_one` for instances of shape (n, T, d, d_z), allocated once per
    range of instances (an allocation per array and instance cost about 5% of a solve at K = 42)."""
    K = n * (T - 1)
    cap = min(K, d * dz) + 1
    return (
        np.empty((d, K)),  # AT: the rows as columns (the column products run over k, contiguous)
        np.empty(K, np.int64),  # seq: the sequence i of row k
        np.empty(K, np.int64),  # tpos: its token t
        np.empty(K),  # inv_s: 1/s_k
        np.empty(K),  # bh: b̂ = 1/(s_k g)
        np.empty(n),  # zn: ‖z_i‖
        np.empty(K),  # srt: scratch of the median
        np.empty(_EXPONENT_SPAN, np.int64),  # cnt: counts of the exponents of 1/s
        np.empty((n, n)),  # Zg: the Gram matrix of the queries
        np.empty((n, K)),  # ZS[i, k] = (z_i·z_k)/s_k: row i_p scales the entering row's column
        np.empty((n, d)),  # V[i] = Σ_k λ_k a_k over the active rows of sequence i (W = Σ_i V_i z_iᵀ)
        np.empty(K),  # colp: Ĝ_:p of the entering row p
        np.empty(cap, np.int64),  # act: the active rows by slot
        np.empty(K),  # bout: b̂_k of an inactive row, −inf for an active one (the pivot search skips it)
        np.empty((cap, cap)),  # L: the lower Cholesky factor of Ĝ_AA
        np.empty(cap),  # Ld: 1/L_aa
        np.empty((cap, K)),  # M = L⁻¹ Ĝ_A,: (its column p is ρ = L⁻¹ Ĝ_Ap, and Mᵀρ = Ĝ_:A r)
        np.empty(cap),  # lamA: the active multipliers
        np.empty(K),  # mh = Ĝλ̂: the scaled margins
        np.empty(cap),  # rho
        np.empty(cap),  # r
        np.empty(K),  # work
        np.empty(d),  # u = W z_i
        np.empty(d),  # xa: x_iα (A may be X itself: its row α is zeroed before the others are read)
    )


@nb.njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _column(AT, p, out):
    """out[k] = a_k·a_p over the columns of AT (d, K), four rows of AT per pass over k (a pass per row
    loaded and stored ``out`` d times, most of the time of a column at d = 10)."""
    d, K = AT.shape
    j = d % 4
    if j == 0:
        for k in range(K):
            out[k] = 0.0
    elif j == 1:
        a0 = AT[0, p]
        for k in range(K):
            out[k] = AT[0, k] * a0
    elif j == 2:
        a0 = AT[0, p]
        a1 = AT[1, p]
        for k in range(K):
            out[k] = AT[0, k] * a0 + AT[1, k] * a1
    else:
        a0 = AT[0, p]
        a1 = AT[1, p]
        a2 = AT[2, p]
        for k in range(K):
            out[k] = AT[0, k] * a0 + AT[1, k] * a1 + AT[2, k] * a2
    while j < d:
        a0 = AT[j, p]
        a1 = AT[j + 1, p]
        a2 = AT[j + 2, p]
        a3 = AT[j + 3, p]
        for k in range(K):
            out[k] += AT[j, k] * a0 + AT[j + 1, k] * a1 + AT[j + 2, k] * a2 + AT[j + 3, k] * a3
        j += 4


@nb.njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _minus_mt(colp, M, rho, na, out):
    """out = colp − M[:na]ᵀ ρ, four rows of M per pass over k (as :func:`_column`)."""
    K = out.shape[0]
    a = na % 4
    if a == 0:
        for k in range(K):
            out[k] = colp[k]
    elif a == 1:
        r0 = rho[0]
        for k in range(K):
            out[k] = colp[k] - M[0, k] * r0
    elif a == 2:
        r0 = rho[0]
        r1 = rho[1]
        for k in range(K):
            out[k] = colp[k] - (M[0, k] * r0 + M[1, k] * r1)
    else:
        r0 = rho[0]
        r1 = rho[1]
        r2 = rho[2]
        for k in range(K):
            out[k] = colp[k] - (M[0, k] * r0 + M[1, k] * r1 + M[2, k] * r2)
    while a < na:
        r0 = rho[a]
        r1 = rho[a + 1]
        r2 = rho[a + 2]
        r3 = rho[a + 3]
        for k in range(K):
            out[k] -= M[a, k] * r0 + M[a + 1, k] * r1 + M[a + 2, k] * r2 + M[a + 3, k] * r3
        a += 4


@nb.njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _solve_one(X, Z, alpha, tol, max_iter, A, W, lam, marg, supp, stats, ws):
    """One instance (module doc), with the scratch arrays ``ws`` of :func:`_workspace`. Writes the rows
    A (n, T, d; 0 at α), W (d, d_z), λ (n, T), margins (n, T), support (n, T) and
    ``stats = (violation, relative violation, gap, relative gap, complementarity, g)``; returns the
    iteration count, or a negative LEAVE_* code. A may be X itself (each row is read before it is
    overwritten; X is not read after step 1)."""
    AT, seq, tpos, inv_s, bh, zn, srt, cnt, Zg, ZS, V, colp, act, bout, L, Ld, M, lamA, mh, rho, r, work, u, xa = ws
    n, T, d = X.shape
    dz = Z.shape[1]
    K = n * (T - 1)
    stats[:] = np.nan  # (an instance that leaves early has no certificate)
    # 1. rows a_k = x_iα − x_it (tie rule of attsvm.tokens.differences), their norms s_k = ‖a_k‖‖z_i‖
    for i in range(n):
        acc = 0.0
        for e in range(dz):
            acc += Z[i, e] * Z[i, e]
        zn[i] = math.sqrt(acc)
    k = 0
    smax = 0.0
    for i in range(n):
        ai = alpha[i]
        for j in range(d):
            xa[j] = X[i, ai, j]
        for t in range(T):
            if t == ai:
                A[i, t, :] = 0.0
                continue
            tied = True
            acc = 0.0
            for j in range(d):
                xt = X[i, t, j]
                v = xa[j] - xt
                AT[j, k] = v
                A[i, t, j] = v
                if abs(v) > TIE_ULPS * _EPS * max(abs(xa[j]), abs(xt)):
                    tied = False
                acc += v * v
            if tied:
                return LEAVE_TIED
            seq[k] = i
            tpos[k] = t
            s = math.sqrt(acc) * zn[i]
            if not s > 0.0:  # (a zero query)
                return LEAVE_TIED
            smax = max(smax, s)
            inv_s[k] = 1.0 / s
            k += 1
    for k in range(K):
        if not inv_s[k] * smax < 1.0 / ZERO_ROW_RTOL:
            return LEAVE_TIED
    # 2. global scale g: the power of two with (upper median of 1/s)/g ∈ (½, 1]
    g = math.ldexp(1.0, _scale_exponent(inv_s, srt, cnt))
    for k in range(K):
        bh[k] = inv_s[k] / g
    for i in range(n):
        for i2 in range(n):
            acc = 0.0
            for e in range(dz):
                acc += Z[i, e] * Z[i2, e]
            Zg[i, i2] = acc
    for i2 in range(n):  # (rows k of sequence i: i(T − 1) ≤ k < (i + 1)(T − 1))
        for i in range(n):
            z = Zg[i, i2]
            for k in range(i * (T - 1), (i + 1) * (T - 1)):
                ZS[i2, k] = z * inv_s[k]
    # 3. Goldfarb–Idnani
    cap = min(K, d * dz) + 1
    for k in range(K):
        bout[k] = bh[k]
    mh[:] = 0.0
    na = 0
    it = 0
    while True:
        p = -1
        best = 0.0
        for k in range(K):
            v = bout[k] - mh[k]
            if v > best:
                best = v
                p = k
        if p < 0 or best <= tol * bh[p]:
            break
        _column(AT, p, work)  # Ĝ_:p = (a_k·a_p)(z_k·z_p)/(s_k s_p)
        ip = seq[p]
        sp = inv_s[p]
        for k in range(K):
            colp[k] = work[k] * ZS[ip, k] * sp
        lam_p = 0.0
        while True:
            it += 1
            if it > max_iter:
                return LEAVE_MAX_ITER
            for a in range(na):  # ρ = L⁻¹ Ĝ_Ap (a column of M), r = L⁻ᵀ ρ
                rho[a] = M[a, p]
                r[a] = rho[a]
            for a in range(na - 1, -1, -1):  # (by rows of L: contiguous)
                r[a] *= Ld[a]
                ra = r[a]
                for b in range(a):
                    r[b] -= L[a, b] * ra
            dl = colp[p]  # ‖component of ĉ_p orthogonal to the active rows‖²
            for a in range(na):
                dl -= rho[a] * rho[a]
            t1 = np.inf  # partial step: an active multiplier reaches 0
            jdrop = -1
            for a in range(na):
                if r[a] > 0.0:
                    q = lamA[a] / r[a]
                    if q < t1:
                        t1 = q
                        jdrop = a
            t2 = (bh[p] - mh[p]) / dl if dl > DEPENDENT_TOL * colp[p] else np.inf  # full step
            if t1 == np.inf and t2 == np.inf:
                # ĉ_p = Σ_A r_a ĉ_a with r ≤ 0, and b̂_p > ĉ_pᵀŵ = rᵀb̂_A (the active rows are tight): so
                # y = (1 at p, −r on A) ≥ 0 has Σ y_k ĉ_k = 0 and b̂ᵀy > 0 (docs/spec.md §3); in the
                # user's rows, y_k/s_k
                lam[:, :] = 0.0
                lam[seq[p], tpos[p]] = inv_s[p]
                for a in range(na):
                    lam[seq[act[a]], tpos[act[a]]] = -r[a] * inv_s[act[a]]
                return LEAVE_INFEASIBLE
            step = min(t1, t2)
            for a in range(na):
                lamA[a] -= step * r[a]
            lam_p += step
            _minus_mt(colp, M, rho, na, work)  # Ĝ_:p − Ĝ_:A r = Ĝ_:p − Mᵀρ: the margins move by step times it
            if t2 <= t1:  # p joins the active set: one new row of the Cholesky factor and of M
                if na + 1 >= cap:  # more independent rows than W has entries: round-off, not a face
                    return LEAVE_SINGULAR
                for b in range(na):
                    L[na, b] = rho[b]
                dd = math.sqrt(dl)
                L[na, na] = dd
                ild = 1.0 / dd
                Ld[na] = ild
                for k in range(K):  # (one pass for both)
                    w = work[k]
                    mh[k] += step * w
                    M[na, k] = w * ild
                act[na] = p
                lamA[na] = lam_p
                bout[p] = -np.inf
                na += 1
                break
            for k in range(K):
                mh[k] += step * work[k]
            # drop slot jdrop: delete its row of L, whose rows below then reach one column past the
            # diagonal, and restore the triangle by Givens rotations of column pairs (a, a + 1), L_r Q =
            # [L' 0]; Ĝ_A',: = L_r M = [L' 0] QᵀM, so M' is QᵀM (the same rotations of M's rows) less its
            # last row. O(na (na + K)) where refactorising Ĝ_AA cost O(na² K).
            bout[act[jdrop]] = bh[act[jdrop]]
            for a in range(jdrop, na - 1):
                act[a] = act[a + 1]
                lamA[a] = lamA[a + 1]
                for b in range(a + 2):
                    L[a, b] = L[a + 1, b]
            na -= 1
            for a in range(jdrop, na):
                x = L[a, a]
                y = L[a, a + 1]
                h = math.hypot(x, y)
                if not h > 0.0:
                    return LEAVE_SINGULAR
                c = x / h
                sn = y / h
                L[a, a] = h
                Ld[a] = 1.0 / h
                for i in range(a + 1, na):
                    xi = L[i, a]
                    yi = L[i, a + 1]
                    L[i, a] = c * xi + sn * yi
                    L[i, a + 1] = c * yi - sn * xi
                for k in range(K):
                    m0 = M[a, k]
                    m1 = M[a + 1, k]
                    M[a, k] = c * m0 + sn * m1
                    M[a + 1, k] = c * m1 - sn * m0
    # 4. lift to the user's units and certify (attsvm.svm.certificate, as attsvm.svm.batch step 4)
    V[:, :] = 0.0
    lam[:, :] = 0.0
    neg = False
    for a in range(na):
        k = act[a]
        lk = g * lamA[a] * inv_s[k]
        i = seq[k]
        lam[i, tpos[k]] = max(lk, 0.0)
        neg = neg or lk < 0.0
        for e in range(d):
            V[i, e] += lk * AT[e, k]
    W[:, :] = 0.0  # W = Σ_i V_i z_iᵀ: n outer products where one per active row cost twice as much
    for e in range(d):
        for i in range(n):
            v = V[i, e]
            for f in range(dz):
                W[e, f] += v * Z[i, f]
    wsq = 0.0
    for e in range(d):
        for f in range(dz):
            wsq += W[e, f] * W[e, f]
    wn = math.sqrt(wsq)
    ysq = wsq
    if neg:  # 𝒜*(λ⁺) differs from W only when round-off left a multiplier below 0
        Y = np.zeros((d, dz))
        for a in range(na):
            k = act[a]
            lk = max(g * lamA[a] * inv_s[k], 0.0)
            for e in range(d):
                for f in range(dz):
                    Y[e, f] += lk * AT[e, k] * Z[seq[k], f]
        ysq = 0.0
        for e in range(d):
            for f in range(dz):
                ysq += Y[e, f] * Y[e, f]
    viol = 0.0
    rel_viol = 0.0
    compl = 0.0
    lsum = 0.0
    k = 0
    for i in range(n):
        for e in range(d):  # u = W z_i
            acc = 0.0
            for f in range(dz):
                acc += W[e, f] * Z[i, f]
            u[e] = acc
        ai = alpha[i]
        for t in range(T):
            if t == ai:
                marg[i, t] = np.inf
                supp[i, t] = False
                continue
            m = 0.0
            for e in range(d):  # (the row a_it as step 1 wrote it)
                m += A[i, t, e] * u[e]
            marg[i, t] = m
            res = m - 1.0
            vi = max(-res, 0.0)
            viol = max(viol, vi)
            rel_viol = max(rel_viol, vi / max(1.0, ROW_FLOOR * wn / inv_s[k]))  # (s_k = ‖a_k‖‖z_k‖)
            k += 1
            compl = max(compl, abs(lam[i, t] * res))
            lsum += lam[i, t]
            supp[i, t] = abs(res) <= SUPPORT_TOL * max(1.0, abs(m))
    primal = 0.5 * wsq
    dual = lsum - 0.5 * ysq
    gap = primal - dual
    den = abs(primal) + abs(dual)
    stats[0] = viol
    stats[1] = rel_viol
    stats[2] = gap
    stats[3] = abs(gap) / den if den > 0.0 else (0.0 if gap == 0.0 else np.inf)
    stats[4] = compl
    stats[5] = g
    return it


@intrinsic
def _fetch_add(typingctx, arr, i, val):
    """Atomically add ``val`` to ``arr[i]`` (an int64 array) and return its old value: a sequentially
    consistent read-modify-write, so that the stores before it are seen by any thread that sees it."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64 and arr.layout == "C"):
        return None
    sig = types.int64(arr, types.intp, types.int64)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.gep(ary.data, [args[1]])
        return builder.atomic_rmw("add", ptr, args[2], "seq_cst")

    return sig, codegen


@nb.njit(cache=True, nogil=True)
def _solve_claimed(X, Z, alpha, tol, max_iter, A, W, lam, marg, supp, stats, code, sched, chunk, max_chunks):
    """Solve chunks of ``chunk`` instances claimed from ``sched`` until none is left or ``max_chunks`` are
    done: ``sched[0]`` is the first instance no thread has claimed (claimed atomically, so threads running
    this at once never take the same chunk), ``sched[1]`` the number of instances whose X, Z and α are
    written (a claimed chunk waits until it covers the chunk: the caller may still be writing the
    stack, :meth:`StackJob.publish`; −1: the job is stopped, and a waiting chunk is left unsolved), and
    ``sched[2 + c]`` becomes 1 once chunk c is solved. Returns the chunks solved here."""
    ws = _workspace(X.shape[1], X.shape[2], X.shape[3], Z.shape[2])
    B = X.shape[0]
    taken = 0
    while taken < max_chunks:
        lo = _fetch_add(sched, 0, chunk)
        if lo >= B:
            break
        hi = min(lo + chunk, B)
        ready = _fetch_add(sched, 1, 0)
        while 0 <= ready < hi:  # (the caller writes the stack far faster than it is solved)
            ready = _fetch_add(sched, 1, 0)
        if ready < 0:
            break
        for b in range(lo, hi):
            code[b] = _solve_one(
                X[b], Z[b], alpha[b], tol, max_iter, A[b], W[b], lam[b], marg[b], supp[b], stats[b], ws
            )
        _fetch_add(sched, 2 + lo // chunk, 1)
        taken += 1
    return taken


@nb.njit(cache=True, nogil=True)
def _publish(sched, ready):
    """``sched[1] = ready`` (:func:`_solve_claimed`), after every store this thread made before it."""
    _fetch_add(sched, 1, ready - _fetch_add(sched, 1, 0))


@nb.njit(cache=True, nogil=True)
def _stop(sched, B):
    """Stop a job (:func:`_solve_claimed`): nothing more is claimed, and a chunk waiting for input stays
    unsolved (its input may never be written)."""
    _fetch_add(sched, 0, B)
    _fetch_add(sched, 1, -1 - _fetch_add(sched, 1, 0))


@nb.njit(cache=True, nogil=True)
def _chunks_done(sched, start):
    """The first chunk at or after ``start`` that is not solved yet (each flag read atomically, so that
    the answers of the chunks before it are seen)."""
    c = start
    while 2 + c < sched.shape[0] and _fetch_add(sched, 2 + c, 0) != 0:
        c += 1
    return c


def max_iterations(K: int) -> int:
    """The iteration budget of an instance with K rows: each iteration adds or drops one row, a row is
    added at most once per drop, and drops are rare (0.3 per instance at K = 42, 1.5 at K = 210)."""
    return 10 * K + 100


class StackJob:
    """A stack X (B, n, T, d), Z (B, n, d_z) at the selections ``alpha`` (B, n) being solved and certified
    (module doc). The arrays of the answer are allocated at once (:attr:`out`, as :func:`solve_stack`
    returns them) and filled chunk by chunk (``CHUNK`` instances) by up to ``threads`` threads: the
    caller's and ``threads − 1`` of the process's pool (:func:`attsvm._threads.start_helpers`), which
    start solving at once and take chunks in order, each from a shared counter, until none is left.

    So the caller may do other work while the pool solves (:mod:`attsvm.svm.batch` builds the estimators
    whose arrays are views of :attr:`out`), solve chunks itself with :meth:`step`, read which instances
    are finished with :meth:`finished`, and :meth:`finish` the stack. Used as a context manager, the job
    is finished on leaving the block, an error included, so no thread still writes into :attr:`out`
    afterwards. The instances are independent: the results do not depend on which thread solved which
    chunk, bit for bit. Jobs started at once from several threads share the pool: a later job's pool
    threads start once an earlier job's are free, its calling thread solves alone meanwhile, and a pool
    thread that has not started when the job finishes is withdrawn.

    With ``ready`` (< B) the caller is still writing X, Z and α: it gives the job the arrays it is filling
    and calls :meth:`publish` as each leading part is written; the pool's threads solve what is published
    (:mod:`attsvm.svm.batch` stacks the problems' arrays while the pool solves the first ones).

    With ``overwrite_x`` (for a caller that owns X: a stack it assembled) the rows are written over X (over
    its float64 C-contiguous copy where X is not one already), which then is the ``A`` of :attr:`out`: one
    array of the stack's size fewer to allocate and fault in."""

    def __init__(
        self,
        X: NDArray[np.float64],
        Z: NDArray[np.float64],
        alpha: NDArray[np.int64],
        tol: float,
        max_iter: int,
        threads: int = 1,
        overwrite_x: bool = False,
        ready: int | None = None,
    ) -> None:
        B, n, T, d = X.shape
        dz = Z.shape[2]
        if Z.shape[:2] != (B, n) or np.shape(alpha) != (B, n):  # (the kernel reads them unchecked)
            want = f"Z of shape ({B}, {n}, d_z) and alpha of shape ({B}, {n})"
            raise ValueError(f"StackJob: X of shape {X.shape} needs {want}; got {Z.shape} and {np.shape(alpha)}")
        if ready is not None:  # (the caller writes these arrays: they must be the ones the kernel reads)
            for name, arr, dtype in (("X", X, np.float64), ("Z", Z, np.float64), ("alpha", alpha, np.int64)):
                if not (arr.dtype == dtype and arr.flags.c_contiguous and arr.flags.writeable):
                    what = f"a writeable C-contiguous {dtype.__name__} array"
                    raise ValueError(f"StackJob with ready: {name} must be {what}")
        # (C-contiguous and writeable: a read-only array is another numba type, compiled again at first use)
        X = np.require(X, np.float64, ["C", "W"])
        Z = np.require(Z, np.float64, ["C", "W"])
        alpha = np.require(alpha, np.int64, ["C", "W"])
        self.B = B
        self.out: dict[str, NDArray] = {
            "A": X if overwrite_x else np.empty((B, n, T, d)),
            "W": np.empty((B, d, dz)),
            "lam": np.empty((B, n, T)),
            "margins": np.empty((B, n, T)),
            "support": np.empty((B, n, T), dtype=np.bool_),
            "stats": np.empty((B, 6)),
            "code": np.empty(B, dtype=np.int64),
        }
        o = self.out
        chunks = -(-B // CHUNK)
        # (the next instance to claim, the instances published, then 1 once chunk c is solved: _solve_claimed)
        self._sched = np.zeros(2 + chunks, dtype=np.int64)
        self._ready = B if ready is None else min(max(int(ready), 0), B)
        self._sched[1] = self._ready
        self._done = 0  # the chunks known to be finished, in order
        self._args = (
            X, Z, alpha, float(tol), int(max_iter), o["A"], o["W"], o["lam"], o["margins"], o["support"],
            o["stats"], o["code"], self._sched, CHUNK,
        )  # fmt: skip
        helpers = max(1, min(int(threads), B // MIN_PER_THREAD)) - 1
        self._futures: list[Future[object]] = []
        self._started: list[threading.Event] = []
        if helpers:
            self._futures, self._started = start_helpers(lambda: _solve_claimed(*self._args, chunks), helpers)
            if self._ready == B:
                self.step(1)  # (without the GIL while the helpers start: see start_helpers)
                self._settle()

    def _settle(self) -> None:
        """Let the pool's threads take the GIL they need to start (start_helpers), once; for at most
        ``SETTLE_TIMEOUT``: a helper queued behind another job's (a busy pool) starts later, and this thread
        goes on meanwhile (it solves the stack alone if it must)."""
        if self._started:
            wait_started(self._started, SETTLE_TIMEOUT)
            self._started = []

    def publish(self, ready: int) -> None:
        """The first ``ready`` instances of X, Z and α are written: the pool's threads may solve them. The
        first call also waits for the pool's threads to start (:func:`attsvm._threads.start_helpers`)."""
        if self._ready < 0:
            raise RuntimeError("StackJob.publish: the job is stopped")
        ready = min(max(int(ready), self._ready), self.B)
        _publish(self._sched, ready)
        self._ready = ready
        self._settle()

    def step(self, chunks: int = 1) -> int:
        """Solve up to ``chunks`` chunks of the stack on this thread; the number solved (0: none was left).
        Only once the whole stack is published (a chunk beyond it would wait for this thread)."""
        if self._ready < self.B:
            raise RuntimeError(f"StackJob.step: publish all {self.B} instances first ({max(self._ready, 0)} are)")
        return int(_solve_claimed(*self._args, int(chunks)))

    def finished(self) -> int:
        """How many of the first instances are solved: every instance before the value returned is."""
        self._done = int(_chunks_done(self._sched, self._done))
        return min(self._done * CHUNK, self.B)

    def finish(self) -> dict[str, NDArray]:
        """Solve what is left (on this thread too), wait for the pool's threads, and return :attr:`out`.
        A job not wholly published is stopped instead (its pool's threads could wait for ever) and raises
        RuntimeError."""
        if self._ready < self.B:
            published = max(self._ready, 0)
            self.stop()
            raise RuntimeError(f"StackJob.finish: {published} of {self.B} instances were published")
        try:
            while self.step(1 << 30):
                pass
        except BaseException:  # (an error here returns only once the pool's threads have stopped writing)
            self.stop()
            raise
        futures = self._join()
        for f in futures:
            f.result()
        return self.out

    def stop(self) -> None:
        """Stop the job and wait for the pool's threads: no chunk is claimed after this, a chunk waiting for
        input is left unsolved, and once this returns no thread writes into :attr:`out`. What was solved
        stays solved (:meth:`finished`)."""
        _stop(self._sched, self.B)
        self._ready = -1
        self._join()

    def _join(self) -> list[Future[object]]:
        """Wait for the pool's threads, even through a KeyboardInterrupt (which stops the job and is raised
        once they are done, so that none writes into :attr:`out` after this returns); those not started yet
        are withdrawn. Returns the futures of those that ran."""
        futures, self._futures = self._futures, []
        ran = []
        interrupted: BaseException | None = None
        for f in futures:
            if f.cancel():  # (still queued behind another job's: it never runs, and nothing is left for it)
                continue
            ran.append(f)
            while True:
                try:
                    f.exception()
                    break
                except KeyboardInterrupt as exc:
                    interrupted = exc
                    _stop(self._sched, self.B)
        if interrupted is not None:
            raise interrupted
        return ran

    def __enter__(self) -> StackJob:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self.stop()
        elif self._futures or self._ready < self.B:
            self.finish()  # (raises if not all was published)


def warm() -> None:
    """Load every kernel the batch calls (from numba's cache next to this file, else compile it) by solving
    one tiny stack on each of its two routes, :func:`solve_stack` and a :class:`StackJob` published in parts:
    :mod:`attsvm.svm.batch` runs this in the background when ``attsvm.svm`` is imported, so that the first
    real call finds the kernels loaded. The argument types are those of the batch's calls (float64 C arrays,
    int64 selections), so the machine code loaded is the code those calls run."""
    X = np.zeros((1, 2, 2, 1))
    X[0, :, 0, 0] = 1.0  # (every row x_α − x_t = 1: feasible, W = 1/2 … solved in a few iterations)
    Z = np.ones((1, 2, 1))
    alpha = np.zeros((1, 2), dtype=np.int64)
    K = 2
    solve_stack(X.copy(), Z, alpha, GI_TOL, max_iterations(K), 1)
    with StackJob(X.copy(), Z.copy(), alpha, GI_TOL, max_iterations(K), 1, True, ready=0) as job:
        job.publish(1)
        job.finished()


def solve_stack(
    X: NDArray[np.float64],
    Z: NDArray[np.float64],
    alpha: NDArray[np.int64],
    tol: float,
    max_iter: int,
    threads: int = 1,
    overwrite_x: bool = False,
) -> dict[str, NDArray]:
    """Solve and certify the stack X (B, n, T, d), Z (B, n, d_z) at the selections ``alpha`` (B, n).

    Returns arrays ``A`` (B, n, T, d: the rows, 0 at α; of an instance that leaves early, only up to the
    row where it left), ``W`` (B, d, d_z), ``lam`` (B, n, T; the multipliers λ⁺, 0 at α), ``margins``
    (B, n, T; inf at α), ``support`` (B, n, T), ``stats`` (B, 6: violation, relative violation, gap,
    relative gap, complementarity, g) and ``code`` (B: iteration count, or a negative LEAVE_* code).
    The instances are independent: with ``threads`` > 1 they are solved concurrently (the kernel releases
    the GIL; :class:`StackJob`), with bit-identical results. ``overwrite_x``: as :class:`StackJob`."""
    return StackJob(X, Z, alpha, tol, max_iter, threads, overwrite_x).finish()
