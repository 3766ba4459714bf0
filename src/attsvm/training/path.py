"""The regularization path ``W̄_R = argmin_{‖W‖_F ≤ R} L(W)`` for growing R (docs/spec.md §4)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray
from torch import Tensor

from .._linalg import correlation
from .._validation import as_float_array, check_choice, check_finite_scalar, check_positive_int
from ..model import PARAMS, Batch, Param, check_gradient_scale, factor_grads, risk_and_scaled_grad
from ..problem import AttentionProblem
from .bounds import gradient_bound, smoothness_bound
from .loop import check_device, threads_context

__all__ = ["regularization_path", "RegularizationPath", "REG_PATH_TOL", "REG_PATH_MAX_ITER", "SADDLE_KICK"]

logger = logging.getLogger(__name__)

# Stop a radius when the stationarity measure (see RegularizationPath) falls below this.
REG_PATH_TOL = 1e-6
REG_PATH_MAX_ITER = 5000
# Relative size of the random perturbation added to each (K, Q) warm start: small radii favour rank-one
# factors, and a rank-one (K, Q) is a stationary point of the factored problem even where the optimum
# has higher rank (seen here: corr(K̄Q̄ᵀ, W*_mm) stuck at 0.927 up to R = 300 without it, 0.999 with it).
SADDLE_KICK = 1e-3


@dataclass
class RegularizationPath:
    """Solutions of ``min L(W) s.t. ‖W‖_F ≤ R`` (or ``‖K‖_F² + ‖Q‖_F² ≤ 2R`` with W = K Qᵀ) along radii.

    Attributes
    ----------
    radii : ndarray (M,)
    W : ndarray (M, d, d)
        ``W̄_R`` (or ``K̄ Q̄ᵀ``) for every radius.
    K, Q : ndarray (M, d, m) or None
        The factors, param ``"KQ"`` only.
    loss : ndarray (M,)
        ``L`` at each solution.
    n_iter : ndarray (M,) int
        Iterations spent on each radius.
    converged : ndarray (M,) bool
        Whether the stopping rule was met before ``max_iter``.
    stationarity : ndarray (M,)
        The stopping measure at the solution: on the boundary with the gradient pointing inward, the
        sine of the angle between ``−∇`` and the variable (0 exactly at a KKT point of the ball);
        in the interior, ``‖∇‖`` relative to its value at the start of the path.
    tokens : ndarray (n,)
        The selection whose SVMs the path is compared with.
    W_mm, W_star : ndarray (d, d) or None
        The Frobenius and nuclear Att-SVM solutions used for the correlations.
    corr_fro, corr_nuc : ndarray (M,) or None
        ``corr(W̄_R, W_mm)`` and ``corr(W̄_R, W*_mm)``.
    param : str
    """

    radii: NDArray[np.float64]
    W: NDArray[np.float64]
    K: NDArray[np.float64] | None
    Q: NDArray[np.float64] | None
    loss: NDArray[np.float64]
    n_iter: NDArray[np.int64]
    converged: NDArray[np.bool_]
    stationarity: NDArray[np.float64]
    tokens: NDArray[np.int64]
    W_mm: NDArray[np.float64] | None
    W_star: NDArray[np.float64] | None
    corr_fro: NDArray[np.float64] | None
    corr_nuc: NDArray[np.float64] | None
    param: str


def _svm_reference(
    problem: AttentionProblem, tokens: NDArray[np.int64], norm: Literal["fro", "nuc"]
) -> NDArray[np.float64] | None:
    """W_mm / W*_mm of ``tokens`` from the solvers (imported here: svm and training are siblings)."""
    from ..svm import AttentionSVM

    est = AttentionSVM(norm=norm).fit(problem, tokens)
    if est.status_ not in ("optimal", "optimal_inaccurate"):
        logger.warning("Att-SVM (%s) of the path's tokens is %s; no correlation reported", norm, est.status_)
        return None
    return np.asarray(est.W_, dtype=np.float64)


def _reference(W: ArrayLike, name: str, d: int) -> NDArray[np.float64]:
    """A given SVM direction: a finite nonzero (d, d) matrix (a zero one has no direction to correlate with)."""
    A = as_float_array(W, name, shape=(d, d))
    if not np.any(A):
        raise ValueError(f"{name} must be nonzero (the SVM direction the path's correlation is taken with)")
    return A


def regularization_path(
    problem: AttentionProblem,
    radii: ArrayLike,
    *,
    param: Param = "W",
    loss: str | None = None,
    m: int | None = None,
    tokens: ArrayLike | None = None,
    W_mm: ArrayLike | None = None,
    W_star: ArrayLike | None = None,
    tol: float = REG_PATH_TOL,
    max_iter: int = REG_PATH_MAX_ITER,
    seed: int = 0,
    device: torch.device | str | None = None,
) -> RegularizationPath:
    """The regularization path of docs/spec.md §4: ``W̄_R = argmin_{‖W‖_F ≤ R} L(W)`` for growing R.

    Each radius is solved by projected accelerated gradient (FISTA with a local-Lipschitz backtracking
    on the gradients and gradient-based restarts — both free of loss-value differences, which vanish
    below round-off at large radii), warm-started from the previous radius's solution rescaled to the new
    radius; it stops when the stationarity measure (see :class:`RegularizationPath`) is below ``tol``
    or after ``max_iter`` iterations (then ``converged`` is False and a warning is logged). For
    ``param="KQ"`` the variable is (K, Q) on the ball ``‖K‖_F² + ‖Q‖_F² ≤ 2R`` (so that a balanced
    pair has ``‖K Qᵀ‖_* ≤ R``), starting from a small Gaussian pair drawn with ``seed``, each warm start
    perturbed by a random ``SADDLE_KICK`` fraction of the radius (rank-one pairs are stationary). The objective
    is not convex (softmax attention), so the path follows the local minimiser reached from the
    previous radius.

    The correlations use ``W_mm`` / ``W_star`` when given, else the solvers of :mod:`attsvm.svm` on
    ``tokens`` (default: the tokens selected by the solution at the largest radius).
    """
    if not isinstance(problem, AttentionProblem):
        raise TypeError(f"problem must be an AttentionProblem, got {type(problem).__name__}")
    param = check_choice(param, "param", PARAMS)
    r_arr = as_float_array(radii, "radii", ndim=1)
    if r_arr.size == 0 or np.any(r_arr <= 0) or np.any(np.diff(r_arr) <= 0):
        raise ValueError(f"radii must be a non-empty increasing sequence of positive numbers, got {r_arr}")
    tol = check_finite_scalar(tol, "tol", positive=True)
    max_iter = check_positive_int(max_iter, "max_iter")
    dev = check_device(device)
    check_gradient_scale([problem])
    batch = Batch.from_problems(problem, loss=loss, device=dev)
    d = problem.d
    if m is not None and param == "W":
        raise ValueError("m is the rank of the (K, Q) factors: it needs param='KQ' (param='W' has no factors)")
    m_ = d if m is None else check_positive_int(m, "m")
    LW = smoothness_bound(problem, batch.loss)
    GW = gradient_bound(problem, batch.loss)

    # Each radius minimises e^{c0}·L, c0 the smallest logit gap at its warm start: the same minimiser,
    # and a gradient that stays representable once the attention saturates (∇L itself underflows to 0
    # when every non-selected logit trails by more than ~745, which R ≳ 10³ reaches), computed from
    # risk_and_scaled_grad as e^{c0 − c(W)} · e^{c(W)}∇L. The loss values are not used by the iteration.
    c0 = 0.0

    def fg(x: Tensor) -> tuple[float, Tensor]:
        W = x if param == "W" else x[0:1] @ x[1:2].transpose(-1, -2)
        L, g, _, c = risk_and_scaled_grad(batch, W)
        g = g * torch.exp(c0 - c)[:, None, None]
        if param == "W":
            return float(L[0]), g
        gK, gQ = factor_grads(g, x[0:1], x[1:2])
        return float(L[0]), torch.cat([gK, gQ])

    def log_scale(x: Tensor) -> float:
        W = x if param == "W" else x[0:1] @ x[1:2].transpose(-1, -2)
        return float(risk_and_scaled_grad(batch, W)[3][0])

    def ip(a: Tensor, b: Tensor) -> float:
        return float((a * b).sum())

    if param == "W":
        x = torch.zeros(1, d, d, dtype=torch.float64, device=dev)
    else:
        gen = torch.Generator().manual_seed(int(seed))
        x = (0.01 * torch.randn(2, d, m_, generator=gen, dtype=torch.float64)).to(dev)
    g_scale = max(float(torch.linalg.vector_norm(fg(x)[1])), 1e-300)

    def stationarity(x: Tensor, g: Tensor, rad: float) -> float:
        xn = float(torch.linalg.vector_norm(x))
        gn = float(torch.linalg.vector_norm(g))
        if gn == 0.0:
            return 0.0
        if xn >= rad * (1 - 1e-9) and ip(g, x) < 0:
            xh = x / xn
            return float(torch.linalg.vector_norm(g - ip(g, xh) * xh)) / gn
        return gn / g_scale

    M = r_arr.size
    Ws = np.zeros((M, d, d))
    Ks = np.zeros((M, d, m_)) if param == "KQ" else None
    Qs = np.zeros((M, d, m_)) if param == "KQ" else None
    losses = np.zeros(M)
    iters = np.zeros(M, dtype=np.int64)
    conv = np.zeros(M, dtype=bool)
    stat = np.zeros(M)
    prev_rad = None
    with threads_context(1 if dev.type == "cpu" else None), torch.no_grad():
        for j, Rj in enumerate(r_arr):
            rad = float(Rj) if param == "W" else math.sqrt(2.0 * float(Rj))
            if prev_rad is not None:
                x = x * (rad / prev_rad)  # warm start: previous direction at the new radius
                if param == "KQ":  # a small kick off the low-rank saddles the factored path can sit on
                    kick = torch.randn(x.shape, generator=gen, dtype=x.dtype).to(dev)
                    x = x + (SADDLE_KICK * rad / float(torch.linalg.vector_norm(kick))) * kick
            xn = float(torch.linalg.vector_norm(x))
            if xn > rad:
                x = x * (rad / xn)
            Lk = LW if param == "W" else LW * 2.0 * float(Rj) + GW
            c0 = log_scale(x)
            f_x, g_x = fg(x)
            y, f_y, g_y, t = x, f_x, g_x, 1.0
            it = 0
            s_meas = stationarity(x, g_x, rad)
            while s_meas > tol and it < max_iter:
                it += 1
                while True:
                    z = y - g_y / Lk
                    zn = float(torch.linalg.vector_norm(z))
                    if zn > rad:
                        z = z * (rad / zn)
                    dz = z - y
                    f_z, g_z = fg(z)
                    # local Lipschitz test on gradients (computed to full relative precision), not on
                    # loss values, whose differences vanish below round-off at large radii
                    dn = float(torch.linalg.vector_norm(dz))
                    if dn == 0.0 or float(torch.linalg.vector_norm(g_z - g_y)) <= Lk * dn:
                        break
                    Lk *= 2.0
                if ip(y - z, z - x) > 0:  # gradient-based restart (O'Donoghue & Candès)
                    t = 1.0
                t_new = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t))
                y = z + ((t - 1.0) / t_new) * (z - x)
                yn = float(torch.linalg.vector_norm(y))
                if yn > rad:
                    y = y * (rad / yn)
                x, f_x, g_x, t = z, f_z, g_z, t_new
                f_y, g_y = fg(y)
                s_meas = stationarity(x, g_x, rad)
                Lk *= 0.7  # let the step grow back where the landscape is flat
            prev_rad = rad
            iters[j], conv[j], stat[j], losses[j] = it, s_meas <= tol, s_meas, f_x
            if param == "W":
                Ws[j] = x[0].cpu().numpy()
            else:
                Ks[j], Qs[j] = x[0].cpu().numpy(), x[1].cpu().numpy()  # type: ignore[index]
                Ws[j] = Ks[j] @ Qs[j].T  # type: ignore[index]
            if not conv[j]:
                logger.warning(
                    "regularization path: radius %g stopped at max_iter=%d with stationarity %.2e > tol=%.1e",
                    Rj,
                    max_iter,
                    s_meas,
                    tol,
                )
    alpha = (
        problem.check_tokens(tokens)
        if tokens is not None
        else np.argmax(problem.logits(Ws[-1]), axis=-1).astype(np.int64)
    )
    Wf = _reference(W_mm, "W_mm", d) if W_mm is not None else _svm_reference(problem, alpha, "fro")
    Wn = _reference(W_star, "W_star", d) if W_star is not None else _svm_reference(problem, alpha, "nuc")
    return RegularizationPath(
        radii=r_arr,
        W=Ws,
        K=Ks,
        Q=Qs,
        loss=losses,
        n_iter=iters,
        converged=conv,
        stationarity=stat,
        tokens=alpha,
        W_mm=Wf,
        W_star=Wn,
        corr_fro=None if Wf is None else np.asarray(correlation(Ws, Wf)),
        corr_nuc=None if Wn is None else np.asarray(correlation(Ws, Wn)),
        param=param,
    )
