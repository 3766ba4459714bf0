"""Quasi-Newton: a lean compact-form L-BFGS for the augmented Lagrangian's small subproblems."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from scipy.linalg.lapack import dtrtrs

__all__ = ["lbfgs"]


# ----------------------------------------------------------------------------- L-BFGS
def lbfgs(
    fg, x: NDArray[np.float64], *, gtol: float, max_iter: int, memory: int = 20, max_halvings: int = 40
) -> tuple[NDArray[np.float64], int]:
    """Minimise a smooth function by L-BFGS until ``max|∇f| ≤ gtol``; returns (x, iterations).

    ``fg(x) -> (f, ∇f)``. A lean replacement for scipy's L-BFGS-B on our small, unconstrained
    subproblems, where the wrapper's per-iteration overhead cost more than the evaluation itself.
    The inverse-Hessian product uses the compact representation of Byrd, Nocedal & Schnabel (1994)
    (Nocedal & Wright, eq. 7.24): ``H g = γg + S u − γ Y w`` with ``R w = Sᵀg`` and
    ``Rᵀ u = (D + γYᵀY) w − γYᵀg`` — two triangular solves of size ``memory`` and three products
    with the (memory, len x) history, instead of a Python loop over the pairs. The step is an Armijo
    backtracking search from 1 (from ``1/‖g‖`` on the first iteration); a pair is stored only when
    ``sᵀy > 0`` (so H stays positive definite). Stops early when no decrease is possible any more.
    """
    f, g = fg(x)
    nv = x.size
    H = np.empty((2, memory, nv))  # the stored pairs: H[0] = S (s_i rows), H[1] = Y (y_i rows)
    S, Y = H[0], H[1]
    SY = np.empty((memory, memory))  # SY[i, j] = s_iᵀ y_j (upper triangle: R; diagonal: D)
    YY = np.empty((memory, memory))
    k = 0
    gamma = 1.0
    it = 0
    for it in range(1, max_iter + 1):
        if np.abs(g).max(initial=0.0) <= gtol:
            return x, it - 1
        if k == 0:
            d = -g
            t = min(1.0, 1.0 / max(float(np.sqrt(g @ g)), 1e-300))
        else:
            a, c = H[:, :k] @ g  # Sᵀg, Yᵀg
            R = SY[:k, :k]
            w, _ = dtrtrs(R, a, lower=0, trans=0)
            u, _ = dtrtrs(R, R.diagonal() * w + gamma * (YY[:k, :k] @ w - c), lower=0, trans=1)
            d = gamma * (w @ Y[:k] - g) - u @ S[:k]
            t = 1.0
        slope = float(g @ d)
        if slope >= 0:  # not a descent direction (round-off): restart from the gradient
            k, d, slope = 0, -g, -float(g @ g)
            t = min(1.0, 1.0 / max(float(np.sqrt(-slope)), 1e-300))
        for _ in range(max_halvings):
            xn = x + t * d
            fn, gn = fg(xn)
            if fn <= f + 1e-4 * t * slope:
                break
            t *= 0.5
        else:
            return x, it  # no decrease along d: x is stationary to round-off
        s_new = xn - x
        y_new = gn - g
        sy = float(s_new @ y_new)
        yy_new = float(y_new @ y_new)
        if sy > 1e-12 * float(np.sqrt((s_new @ s_new) * yy_new)):
            if k == memory:  # drop the oldest pair (numpy copies overlapping slices safely)
                H[:, :-1] = H[:, 1:]
                SY[:-1, :-1] = SY[1:, 1:]
                YY[:-1, :-1] = YY[1:, 1:]
                k -= 1
            S[k] = s_new
            Y[k] = y_new
            SY[:k, k] = S[:k] @ y_new
            SY[k, :k] = Y[:k] @ s_new
            SY[k, k] = sy
            yy = Y[:k] @ y_new
            YY[:k, k] = yy
            YY[k, :k] = yy
            YY[k, k] = yy_new
            gamma = sy / yy_new
            k += 1
        stop = f - fn <= 1e-16 * max(abs(f), abs(fn), 1.0)
        x, f, g = xn, fn, gn
        if stop:
            return x, it
    return x, it
