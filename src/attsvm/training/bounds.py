"""Data-dependent bounds on the smoothness and gradient of ``L(W)`` (docs/spec.md §4)."""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from ..model import resolve_loss
from ..problem import AttentionProblem, check_problem

__all__ = ["smoothness_bound", "gradient_bound"]


def _head_constants(problem: AttentionProblem, loss: str) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Per-sequence bounds (n,) on ‖∇_o ψ_i‖ and ‖∇²_o ψ_i‖ over the convex hull of the tokens,
    where ψ_i(o) is the loss of sequence i as a function of the attention output o."""
    n = problem.n
    Wh = problem.head.weights.reshape(problem.d, -1)
    kind = problem.head.kind
    if kind == "mlp":
        raise ValueError(
            "no smoothness bound is derived for MLP heads (GeLU / SiLU / SwiGLU curvature): pass a float lr "
            "instead of lr='auto'"
        )
    if kind == "multiclass":
        s2 = float(np.linalg.norm(Wh, 2))
        return np.full(n, math.sqrt(2.0) * s2), np.full(n, 0.5 * s2**2)
    if kind == "linear":
        a = float(np.linalg.norm(Wh))  # ‖v‖
        b = a
        fx = problem.y[:, None] * problem.head(problem.X)  # (n, T) margins of single tokens
        umin = fx.min(axis=1)  # u = y vᵀo ≥ min_t y vᵀx_t on the hull
    else:  # relu: the smooth pieces (the kinks have no curvature bound)
        k = Wh.shape[1]
        s2 = float(np.linalg.norm(Wh, 2))
        a = s2 * math.sqrt(k)
        b = a
        f = problem.head(problem.X)  # (n, T) ≥ 0; f is convex so f(o) ≤ max_t f(x_t)
        umin = np.where(problem.y > 0, 0.0, -f.max(axis=1))
    if loss == "logistic":
        return np.full(n, a), np.full(n, 0.25 * b**2)
    if loss == "correlation":
        return np.full(n, a), np.zeros(n)
    M = np.exp(np.minimum(-umin, 700.0))  # exponential: |ℓ'| = ℓ'' = e^{−u} ≤ e^{−u_min}
    return a * M, b**2 * M


def _radii(problem: AttentionProblem) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    X = problem.X
    rho = np.linalg.norm(X - X.mean(axis=1, keepdims=True), axis=-1).max(axis=1)  # (n,)
    zn = np.linalg.norm(problem.queries, axis=-1)  # (n,)
    return rho, zn


def smoothness_bound(problem: AttentionProblem, loss: str | None = None) -> float:
    """An upper bound L_W on the smoothness constant of ``L(W)`` in Frobenius norm (docs/spec.md §4).

    With ρ_i = max_t ‖x_it − x̄_i‖ (x̄_i the mean token) the softmax mixture ``o_i(W) = X_iᵀ s_i``
    satisfies ``‖Do_i[H]‖ ≤ ρ_i h_i`` and ``‖D²o_i[H, H]‖ ≤ 2ρ_i h_i²`` with ``h_i = ρ_i ‖z_i‖ ‖H‖_F``
    (first and third centred moments of the attention distribution), so

        L_W ≤ (1/n) Σ_i ρ_i² ‖z_i‖² (B_i ρ_i² + 2 G_i ρ_i),

    where G_i, B_i bound the gradient and Hessian of the sequence loss as a function of o over the
    convex hull of its tokens (logistic: G = ‖v‖, B = ‖v‖²/4; correlation: B = 0; exponential: both
    scaled by ``e^{−min_t γ_it}``; cross-entropy: G = √2‖V‖₂, B = ‖V‖₂²/2). For the ReLU head the
    bound covers the smooth pieces only (the kinks have unbounded curvature).
    """
    check_problem(problem)
    loss = resolve_loss(problem.loss if loss is None and problem.head.kind != "multiclass" else loss, problem.head.kind)
    with np.errstate(over="ignore", invalid="ignore"):
        G, B = _head_constants(problem, loss)
        rho, zn = _radii(problem)
        value = float(np.mean(rho**2 * zn**2 * (B * rho**2 + 2.0 * G * rho)))
    if math.isfinite(value):
        return value
    lG, lB = _log_head_constants(problem, loss)
    lr, lz = _log_radii(problem)
    terms = 2 * lr + 2 * lz + np.logaddexp(lB + 2 * lr, math.log(2.0) + lG + lr)
    return _exp_mean(terms)


def gradient_bound(problem: AttentionProblem, loss: str | None = None) -> float:
    """An upper bound on ``‖∇_W L(W)‖_F`` over all W: ``(1/n) Σ_i G_i ρ_i² ‖z_i‖`` (see :func:`smoothness_bound`)."""
    check_problem(problem)
    loss = resolve_loss(problem.loss if loss is None and problem.head.kind != "multiclass" else loss, problem.head.kind)
    with np.errstate(over="ignore", invalid="ignore"):
        G, _ = _head_constants(problem, loss)
        rho, zn = _radii(problem)
        value = float(np.mean(G * rho**2 * zn))
    if math.isfinite(value):
        return value
    lG, _ = _log_head_constants(problem, loss)
    lr, lz = _log_radii(problem)
    return _exp_mean(lG + 2 * lr + lz)


# ---------------------------------------------------------------- the same bounds in logarithms
# (for data so large that a product overflows: the bound is then inf, never NaN — inf·0, inf − inf)


def _log_norm(a: NDArray[np.float64], axis: int | None = None, ord: int | None = None) -> NDArray[np.float64]:
    """log ‖a‖ along ``axis`` (or the matrix ``ord`` norm), from ``a`` scaled by its largest entry: no
    overflow, and −inf for a zero vector."""
    m = np.abs(a).max(axis=axis, keepdims=axis is not None) if a.size else np.zeros(())
    safe = np.where(m > 0, m, 1.0)
    scaled = np.linalg.norm(a / safe, ord=ord, axis=axis)
    with np.errstate(divide="ignore"):
        return np.log(scaled) + np.log(np.squeeze(safe, axis=axis) if axis is not None else safe)


def _log_head_constants(problem: AttentionProblem, loss: str) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """log of :func:`_head_constants` (n,), computed without overflow."""
    n = problem.n
    Wh = problem.head.weights.reshape(problem.d, -1)
    kind = problem.head.kind
    if kind == "multiclass":
        ls2 = float(_log_norm(Wh, ord=2))
        return np.full(n, 0.5 * math.log(2.0) + ls2), np.full(n, math.log(0.5) + 2 * ls2)
    if kind == "linear":
        la = float(_log_norm(Wh.ravel()))
    else:  # relu
        la = float(_log_norm(Wh, ord=2)) + 0.5 * math.log(Wh.shape[1])
    if loss == "logistic":
        return np.full(n, la), np.full(n, math.log(0.25) + 2 * la)
    if loss == "correlation":
        return np.full(n, la), np.full(n, -np.inf)
    with np.errstate(over="ignore", invalid="ignore"):
        f = problem.head(problem.X)  # (n, T)
        u = problem.y[:, None] * f if kind == "linear" else np.where(problem.y[:, None] > 0, 0.0, -f)
    u = np.where(np.isnan(u), -np.inf, u)  # (an overflowed head value: no lower bound but the clip)
    lM = np.minimum(-u.min(axis=1), 700.0)  # log e^{−u_min}, clipped as _head_constants
    return la + lM, 2 * la + lM


def _log_radii(problem: AttentionProblem) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """log of :func:`_radii` (n,), computed without overflow."""
    X = problem.X
    s = np.abs(X).max(axis=(1, 2), keepdims=True)  # (n, 1, 1): each sequence centred in units of its largest entry
    s = np.where(s > 0, s, 1.0)
    Xs = X / s
    log_rho = _log_norm(Xs - Xs.mean(axis=1, keepdims=True), axis=-1).max(axis=1) + np.log(s[:, 0, 0])
    return log_rho, _log_norm(problem.queries, axis=-1)


def _exp_mean(log_terms: NDArray[np.float64]) -> float:
    """mean_i e^{log_terms_i}: inf when it exceeds the float range."""
    top = float(np.max(log_terms))
    if top == -np.inf:
        return 0.0
    with np.errstate(over="ignore"):
        return float(np.exp(top + math.log(np.mean(np.exp(log_terms - top)))))
