"""The regularization path ``W̄_R = argmin_{‖W‖_F ≤ R} L(W)`` for growing R (docs/spec.md §4)."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

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

__all__ = [
    "regularization_path",
    "regularization_paths",
    "RegularizationPath",
    "REG_PATH_TOL",
    "REG_PATH_MAX_ITER",
    "SADDLE_KICK",
]

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
    r_arr, par, tol, max_iter, dev, m_ = _check_path_options(problem, radii, param, m, tol, max_iter, device)
    if W_mm is not None:
        _reference(W_mm, "W_mm", problem.d)
    if W_star is not None:
        _reference(W_star, "W_star", problem.d)
    path = _paths([problem], r_arr, par, loss, m_, tol, max_iter, [seed], dev)[0]
    return _with_references(problem, path, par, tokens, W_mm, W_star)


def regularization_paths(
    problems: Sequence[AttentionProblem],
    radii: ArrayLike,
    *,
    param: Param = "W",
    loss: str | None = None,
    m: int | None = None,
    tol: float = REG_PATH_TOL,
    max_iter: int = REG_PATH_MAX_ITER,
    seeds: Sequence[int] | None = None,
    device: torch.device | str | None = None,
) -> list[RegularizationPath]:
    """:func:`regularization_path` of every problem (one shape), solved together: each path takes the
    iterations it would take alone (a finished radius waits for the others without moving) and gets the
    same numbers to round-off, while the tensor operations run once for all of them. ``seeds`` (default
    0, 1, …) seeds each (K, Q) path's draws; the correlations are with the SVMs of the tokens each path
    selects at its largest radius."""
    if isinstance(problems, (AttentionProblem, str, bytes)) or not hasattr(problems, "__len__") or not problems:
        raise TypeError(f"problems must be a non-empty sequence of AttentionProblem, got {type(problems).__name__}")
    probs = list(problems)
    for i, p in enumerate(probs):
        if not isinstance(p, AttentionProblem):
            raise TypeError(f"problems[{i}] must be an AttentionProblem, got {type(p).__name__}")
        if (p.n, p.T, p.d) != (probs[0].n, probs[0].T, probs[0].d):
            raise ValueError(
                f"problems must share one shape (n, T, d); problems[{i}] is {(p.n, p.T, p.d)}, "
                f"problems[0] is {(probs[0].n, probs[0].T, probs[0].d)}"
            )
    if seeds is not None and (isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__len__")):
        raise TypeError(f"seeds must be a sequence of one integer seed per problem, got {type(seeds).__name__}")
    sds = list(range(len(probs))) if seeds is None else [int(check_positive_int(s, "seeds", minimum=0)) for s in seeds]
    if len(sds) != len(probs):
        raise ValueError(f"seeds must hold one seed per problem ({len(probs)}), got {len(sds)}")
    r_arr, par, tol, max_iter, dev, m_ = _check_path_options(probs[0], radii, param, m, tol, max_iter, device)
    paths = _paths(probs, r_arr, par, loss, m_, tol, max_iter, sds, dev)
    return [_with_references(p, path, par, None, None, None) for p, path in zip(probs, paths)]


def _check_path_options(
    problem: AttentionProblem,
    radii: ArrayLike,
    param: str,
    m: int | None,
    tol: float,
    max_iter: int,
    device: torch.device | str | None,
) -> tuple[NDArray[np.float64], str, float, int, torch.device, int]:
    param = check_choice(param, "param", PARAMS)
    r_arr = as_float_array(radii, "radii", ndim=1)
    if r_arr.size == 0 or np.any(r_arr <= 0) or np.any(np.diff(r_arr) <= 0):
        raise ValueError(f"radii must be a non-empty increasing sequence of positive numbers, got {r_arr}")
    tol = check_finite_scalar(tol, "tol", positive=True)
    max_iter = check_positive_int(max_iter, "max_iter")
    dev = check_device(device)
    if m is not None and param == "W":
        raise ValueError("m is the rank of the (K, Q) factors: it needs param='KQ' (param='W' has no factors)")
    m_ = problem.d if m is None else check_positive_int(m, "m")
    return r_arr, param, tol, max_iter, dev, m_


def _with_references(
    problem: AttentionProblem,
    path: dict[str, Any],
    param: str,
    tokens: ArrayLike | None,
    W_mm: ArrayLike | None,
    W_star: ArrayLike | None,
) -> RegularizationPath:
    d, Ws = problem.d, path["W"]
    alpha = (
        problem.check_tokens(tokens)
        if tokens is not None
        else np.argmax(problem.logits(Ws[-1]), axis=-1).astype(np.int64)
    )
    Wf = _reference(W_mm, "W_mm", d) if W_mm is not None else _svm_reference(problem, alpha, "fro")
    Wn = _reference(W_star, "W_star", d) if W_star is not None else _svm_reference(problem, alpha, "nuc")
    return RegularizationPath(
        tokens=alpha,
        W_mm=Wf,
        W_star=Wn,
        corr_fro=None if Wf is None else np.asarray(correlation(Ws, Wf)),
        corr_nuc=None if Wn is None else np.asarray(correlation(Ws, Wn)),
        param=param,
        **path,
    )


def _norms(x: Tensor) -> Tensor:
    """The Frobenius norm of each run's variable (R, G, d, m) → (R,)."""
    return torch.linalg.vector_norm(x, dim=(1, 2, 3))


def _ips(a: Tensor, b: Tensor) -> Tensor:
    return (a * b).sum(dim=(1, 2, 3))


def _col(v: Tensor) -> Tensor:
    return v[:, None, None, None]


def _paths(
    problems: list[AttentionProblem],
    r_arr: NDArray[np.float64],
    param: str,
    loss: str | None,
    m_: int,
    tol: float,
    max_iter: int,
    seeds: list[int],
    dev: torch.device,
) -> list[dict[str, Any]]:
    """The iteration of :func:`regularization_path` for R problems at once (variables (R, G, d, m), G = 1
    for W, 2 for (K, Q)): every per-run quantity is a vector, and a run that has met its stopping rule at
    this radius keeps its iterate while the others go on."""
    check_gradient_scale(problems)
    batch = Batch.from_problems(problems, loss=loss, device=dev)
    R, d = len(problems), problems[0].d
    LW = torch.tensor([smoothness_bound(p, batch.loss) for p in problems], dtype=torch.float64, device=dev)
    GW = torch.tensor([gradient_bound(p, batch.loss) for p in problems], dtype=torch.float64, device=dev)
    fac = param == "KQ"

    # Each radius minimises e^{c0}·L, c0 the smallest logit gap at its warm start: the same minimiser,
    # and a gradient that stays representable once the attention saturates (∇L itself underflows to 0
    # when every non-selected logit trails by more than ~745, which R ≳ 10³ reaches), computed from
    # risk_and_scaled_grad as e^{c0 − c(W)} · e^{c(W)}∇L. The loss values are not used by the iteration.
    c0 = torch.zeros(R, dtype=torch.float64, device=dev)

    def weights(x: Tensor) -> Tensor:
        return x[:, 0] if not fac else x[:, 0] @ x[:, 1].transpose(-1, -2)

    def fg(x: Tensor) -> tuple[Tensor, Tensor]:
        L, g, _, c = risk_and_scaled_grad(batch, weights(x))
        g = g * torch.exp(c0 - c)[:, None, None]
        if not fac:
            return L, g[:, None]
        gK, gQ = factor_grads(g, x[:, 0], x[:, 1])
        return L, torch.stack([gK, gQ], dim=1)

    if not fac:
        x = torch.zeros(R, 1, d, d, dtype=torch.float64, device=dev)
        gens: list[torch.Generator] = []
    else:
        gens = [torch.Generator().manual_seed(int(sd)) for sd in seeds]
        x = torch.stack([0.01 * torch.randn(2, d, m_, generator=g, dtype=torch.float64) for g in gens]).to(dev)
    g_scale = _norms(fg(x)[1]).clamp_min(1e-300)

    def stationarity(x: Tensor, g: Tensor, rad: Tensor) -> Tensor:
        xn, gn = _norms(x), _norms(g)
        gxn = _ips(g, x)
        on_ball = (xn >= rad * (1 - 1e-9)) & (gxn < 0)
        xh = x / _col(torch.where(xn > 0, xn, 1.0))
        tang = _norms(g - _col(_ips(g, xh)) * xh) / torch.where(gn > 0, gn, 1.0)
        out = torch.where(on_ball, tang, gn / g_scale)
        return torch.where(gn == 0.0, 0.0, out)

    def project(v: Tensor, rad: Tensor) -> Tensor:
        vn = _norms(v)
        return torch.where(_col(vn > rad), v * _col(rad / torch.where(vn > 0, vn, 1.0)), v)

    M = r_arr.size
    Ws = np.zeros((R, M, d, d))
    Ks = np.zeros((R, M, d, m_)) if fac else None
    Qs = np.zeros((R, M, d, m_)) if fac else None
    losses = np.zeros((R, M))
    iters = np.zeros((R, M), dtype=np.int64)
    conv = np.zeros((R, M), dtype=bool)
    stat = np.zeros((R, M))
    prev_rad = None
    with threads_context(1 if dev.type == "cpu" else None), torch.no_grad():
        for j, Rj in enumerate(r_arr):
            rad_f = float(Rj) if not fac else math.sqrt(2.0 * float(Rj))
            rad = torch.full((R,), rad_f, dtype=torch.float64, device=dev)
            if prev_rad is not None:
                x = x * (rad_f / prev_rad)  # warm start: previous direction at the new radius
                if fac:  # a small kick off the low-rank saddles the factored path can sit on
                    kick = torch.stack([torch.randn(x.shape[1:], generator=g, dtype=x.dtype) for g in gens]).to(dev)
                    x = x + _col(SADDLE_KICK * rad_f / _norms(kick)) * kick
            x = project(x, rad)
            Lk = LW.clone() if not fac else LW * 2.0 * float(Rj) + GW
            c0 = risk_and_scaled_grad(batch, weights(x))[3]
            f_x, g_x = fg(x)
            y, g_y = x, g_x
            t = torch.ones(R, dtype=torch.float64, device=dev)
            it = torch.zeros(R, dtype=torch.int64, device=dev)
            s_meas = stationarity(x, g_x, rad)
            act = (s_meas > tol) & (it < max_iter)
            while bool(act.any()):
                it = it + act.to(torch.int64)
                todo = act.clone()  # runs whose step is not accepted yet
                z, f_z, g_z = x, f_x, g_x
                while bool(todo.any()):
                    zt = project(y - g_y / _col(Lk), rad)
                    ft, gt = fg(zt)
                    tc = _col(todo)
                    z, g_z = torch.where(tc, zt, z), torch.where(tc, gt, g_z)
                    f_z = torch.where(todo, ft, f_z)
                    # local Lipschitz test on gradients (computed to full relative precision), not on
                    # loss values, whose differences vanish below round-off at large radii
                    dn = _norms(zt - y)
                    ok = (dn == 0.0) | (_norms(gt - g_y) <= Lk * dn)
                    Lk = torch.where(todo & ~ok, Lk * 2.0, Lk)
                    todo = todo & ~ok
                restart = act & (_ips(y - z, z - x) > 0)  # gradient-based restart (O'Donoghue & Candès)
                t = torch.where(restart, 1.0, t)
                t_new = 0.5 * (1.0 + torch.sqrt(1.0 + 4.0 * t * t))
                y_new = project(z + _col((t - 1.0) / t_new) * (z - x), rad)
                a = _col(act)
                x, f_x, g_x = torch.where(a, z, x), torch.where(act, f_z, f_x), torch.where(a, g_z, g_x)
                t = torch.where(act, t_new, t)
                y = torch.where(a, y_new, y)
                g_y = torch.where(a, fg(y)[1], g_y)
                s_meas = torch.where(act, stationarity(x, g_x, rad), s_meas)
                Lk = torch.where(act, Lk * 0.7, Lk)  # let the step grow back where the landscape is flat
                act = act & (s_meas > tol) & (it < max_iter)
            prev_rad = rad_f
            iters[:, j], stat[:, j], losses[:, j] = it.cpu().numpy(), s_meas.cpu().numpy(), f_x.cpu().numpy()
            conv[:, j] = stat[:, j] <= tol
            xs = x.cpu().numpy()
            if not fac:
                Ws[:, j] = xs[:, 0]
            else:
                Ks[:, j], Qs[:, j] = xs[:, 0], xs[:, 1]  # type: ignore[index]
                Ws[:, j] = Ks[:, j] @ Qs[:, j].transpose(0, 2, 1)  # type: ignore[index]
            for r in np.flatnonzero(~conv[:, j]):
                logger.warning(
                    "regularization path: radius %g stopped at max_iter=%d with stationarity %.2e > tol=%.1e",
                    Rj,
                    max_iter,
                    stat[r, j],
                    tol,
                )
    return [
        {
            "radii": r_arr,
            "W": Ws[r],
            "K": None if Ks is None else Ks[r],
            "Q": None if Qs is None else Qs[r],
            "loss": losses[r],
            "n_iter": iters[r],
            "converged": conv[r],
            "stationarity": stat[r],
        }
        for r in range(R)
    ]
