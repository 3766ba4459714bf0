"""The span loop of :mod:`.span`, compiled: one run at a time, all its steps in registers and L1.

:func:`attsvm.training.span.train_span` sends the linear- and ReLU-head runs here (float64 on the CPU,
a constant step size per run) when numba is installed (the ``fast`` extra). The arithmetic is the one
of :meth:`attsvm.training.span._RunsLast.logit_grad` and its step — the logits ``g = g₀ + Kβ``, the
softmax from the gaps to the top logit, the scale ``e^{c}`` of the smallest gap, ``δ'`` with its top
entry set to minus the sum of the others, the step ``β ← β − η δ'/‖δ'‖_K`` (or ``−η e^{−c} δ'`` for
plain GD) — in the same order, with three rewritings that save exponentials: the logits follow β's step
(``g += a K δ'``, K δ' being the product the norm needs), ``e^{c − gap}`` is ``e^{c}·e^{−gap}`` wherever
neither factor can under- or overflow (gaps below 700), and the logistic loss's softplus and sigmoid
share one exponential. The two loops therefore agree to round-off, not bit for bit;
tests/test_train_span.py holds this kernel to the torch loop as its oracle.

The torch loop pays a few microseconds of dispatch per tensor operation and streams every
intermediate (N, N, R) product through memory; here a run's N = nT coefficients, its kernel and its
token table stay in cache for all its steps, and no call is paid per step. numba is imported only
when this module is; the kernel is compiled once and cached next to this file (``cache=True``).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np
from numpy.typing import NDArray

from .._threads import run_ranges

__all__ = ["advance", "LOSS_CODES", "EPS_PLAIN"]

_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}

LOSS_CODES = {"logistic": 0, "exponential": 1}  # any other loss is the correlation loss −y f
EPS_PLAIN = -1.0  # ``eps`` of plain GD (no normalisation)
# runs per thread at least (a run's step takes ~0.3 µs; a range of steps is ~100 steps), ranges per thread
MIN_PER_THREAD = 64
CHUNKS_PER_THREAD = 4


@nb.njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _state(XV, y, g, relu, loss, exp_clip, s, ezs, zs, delta, a, qk, Xe, ref):
    """Risk and c at the logits g (N,); the probabilities s and ``δ'`` (flattened (N,)) into the buffers,
    with the unnormalised ezs (N,), each sequence's softmax normaliser zs (n,) and top token ref (n,), and
    the head's work space a, qk, Xe."""
    n, T, k = XV.shape
    logc = math.inf
    for i in range(n):
        o = i * T
        r = 0
        gm = g[o]
        for t in range(1, T):
            v = g[o + t]
            if v > gm or (v != v and gm == gm):  # torch.max: the first NaN is the maximum
                gm = v
                r = t
        ref[i] = r
        z = 0.0
        for t in range(T):
            ez = math.exp(-(gm - g[o + t]))
            ezs[o + t] = ez
            z += ez
        for t in range(T):
            s[o + t] = ezs[o + t] / z
            if t != r:
                gap = gm - g[o + t]
                if gap < logc:
                    logc = gap
        zs[i] = z
    elc = math.exp(logc) if logc < 700.0 else 0.0
    L = 0.0
    for i in range(n):
        o = i * T
        r = ref[i]
        f = 0.0
        for kk in range(k):
            acc = 0.0
            for t in range(T):
                acc += s[o + t] * XV[i, t, kk]
            a[kk] = acc
        if relu:
            for kk in range(k):
                f += a[kk] if a[kk] > 0.0 else 0.0
        else:
            f = a[0]
        nuy = -y[i] * f
        if loss == 0:  # softplus (torch's, threshold 20) and the sigmoid from one exponential
            e = math.exp(nuy)
            L += nuy if nuy > 20.0 else math.log1p(e)
            q = -y[i] * (1.0 / (1.0 + 1.0 / e))
        elif loss == 1:
            e = math.exp(min(nuy, exp_clip))
            L += e
            q = -y[i] * e
        else:
            L += nuy
            q = -y[i]
        for kk in range(k):
            qk[kk] = q * (1.0 if a[kk] > 0.0 else 0.0) if relu else q
        for t in range(T):
            acc = 0.0
            for kk in range(k):
                acc += XV[i, t, kk] * qk[kk]
            Xe[t] = acc
        xr = Xe[r]
        cbar = 0.0
        for t in range(T):
            Xe[t] = Xe[t] - xr
            cbar += s[o + t] * Xe[t]
        tot = 0.0
        for t in range(T):
            if t == r:
                delta[o + t] = 0.0
            else:
                gap = g[o + r] - g[o + t]
                if gap < 700.0 and logc < 700.0:  # e^{c − gap} = e^{c}·e^{−gap}, neither factor under- or overflowing
                    sc = elc * ezs[o + t] / zs[i]
                else:
                    sc = math.exp(min(logc - gap, 0.0)) / zs[i]
                delta[o + t] = sc * (Xe[t] - cbar) / n
                tot += delta[o + t]
        delta[o + r] = -tot
    return L / n, logc


@nb.njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _advance_range(
    lo, hi, K, XV, y, g_all, beta, eta, eps, relu, loss, exp_clip, updates, s_out, delta_out, L_out, logc_out
):
    B, n, T, k = XV.shape
    N = n * T
    s = np.empty(N)
    ezs = np.empty(N)
    zs = np.empty(n)
    delta = np.empty(N)
    a = np.empty(k)
    qk = np.empty(k)
    Xe = np.empty(T)
    ref = np.empty(n, dtype=np.int64)
    unit = np.empty(N)
    Ku = np.empty(N)
    for r in range(lo, hi):
        b = r % B  # (one data set shared by every run: B = 1)
        Kr, XVr, yr, g, br = K[b], XV[b], y[b], g_all[r], beta[r]
        for u in range(updates + 1):
            L, logc = _state(XVr, yr, g, relu, loss, exp_clip, s, ezs, zs, delta, a, qk, Xe, ref)
            if u == updates:
                break
            if eps != 0.0:  # (plain GD, or ε > 0)
                big = 1.0
                for i in range(N):
                    unit[i] = delta[i]
            else:  # δ' scaled by its largest entry first, so that its square cannot underflow
                big = 0.0
                for i in range(N):
                    v = abs(delta[i])
                    if v > big:
                        big = v
                big = max(big, 2.2250738585072014e-308)
                for i in range(N):
                    unit[i] = delta[i] / big
            quad = 0.0
            for i in range(N):
                acc = 0.0
                for j in range(N):
                    acc += Kr[i, j] * unit[j]
                Ku[i] = acc
                quad += acc * unit[i]
            if eps == -1.0:  # plain GD: the true gradient is e^{−c} δ'
                coef = -eta[r] * math.exp(-logc)
            else:
                quad = math.sqrt(max(quad, 0.0))
                denom = quad + eps * math.exp(logc) if eps > 0.0 else big * quad
                coef = -eta[r] / denom if denom > 0.0 else 0.0
            # β += coef δ', and the logits g = g₀ + Kβ follow by the same step: g += coef K δ'
            cb = coef * big
            for i in range(N):
                br[i] += coef * delta[i]
                g[i] += cb * Ku[i]
        for i in range(N):
            s_out[r, i] = s[i]
            delta_out[r, i] = delta[i]
        L_out[r] = L
        logc_out[r] = logc


def advance(
    K: NDArray[np.float64],
    XV: NDArray[np.float64],
    y: NDArray[np.float64],
    g: NDArray[np.float64],
    beta: NDArray[np.float64],
    eta: NDArray[np.float64],
    *,
    eps: float,
    relu: bool,
    loss: int,
    exp_clip: float,
    updates: int,
    threads: int = 1,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Take ``updates`` steps of every run from β (R, N) and its logits g = g₀ + Kβ (R, N), both in place,
    and return the state after them: probabilities (R, N), ``δ'`` (R, N), risk (R,) and c (R,). K (B, N, N),
    XV (B, n, T, k) and y (B, n) hold B = R data sets or one shared by all runs; η (R,) as in
    :func:`attsvm.training.span.train_span`; ``eps`` is :data:`EPS_PLAIN` for plain GD. The runs are split
    over ``threads`` threads; the results depend neither on the split nor on how the steps are cut into
    calls."""
    R, N = beta.shape
    s = np.empty((R, N))
    delta = np.empty((R, N))
    L = np.empty(R)
    logc = np.empty(R)

    def solve(lo: int, hi: int) -> None:
        _advance_range(
            lo, hi, K, XV, y, g, beta, eta, float(eps), bool(relu), int(loss), float(exp_clip), int(updates),
            s, delta, L, logc,
        )  # fmt: skip

    run_ranges(solve, R, threads, MIN_PER_THREAD, CHUNKS_PER_THREAD)
    return s, delta, L, logc
