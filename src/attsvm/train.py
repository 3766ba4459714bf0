"""Gradient-descent training of one-layer attention, batched over runs (SPEC §4).

:func:`train` runs R independent trainings — several instances and/or several initialisations — as
one batched float64 tensor program on CPU or CUDA: plain GD (with a step from a data-dependent
smoothness bound), the paper's normalized GD (per run, per factor for (K, Q), with the published
machine-epsilon penalty), or a user schedule. Gradients are analytic and round-off stable
(:func:`attsvm.model.risk_and_grad`), so long normalized runs keep their direction after the loss
saturates. :func:`regularization_path` solves ``min L(W) s.t. ‖W‖_F ≤ R`` (or the (K, Q) analogue) for a
growing sequence of radii by warm-started projected accelerated gradient.

The history a run records is documented on :class:`TrainResult`.
"""

from __future__ import annotations

import logging
import math
import sys
import time
import types
import warnings
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray
from torch import Tensor

from ._linalg import correlation
from ._validation import as_float_array, check_choice, check_finite_scalar, check_positive_int
from .model import (PARAMS, Batch, Param, _as_problem_list, factor_grads, resolve_loss, risk_and_grad,
                    risk_and_scaled_grad)
from .problem import AttentionProblem

__all__ = ["train", "TrainResult", "smoothness_bound", "gradient_bound", "cone_init",
           "regularization_path", "RegularizationPath", "NORMALIZED_LR", "NORMALIZE_EPS", "INITS"]

logger = logging.getLogger(__name__)

# The paper's normalized-GD step (SPEC §4).
NORMALIZED_LR = 0.1
# float64 machine epsilon: the published code divides by (‖∇‖ + eps) and, for (K, Q), adds the
# penalty eps·(‖K‖² + ‖Q‖²) (SPEC §4).
NORMALIZE_EPS = float(torch.finfo(torch.float64).eps)
INITS: tuple[str, ...] = ("pytorch", "zeros", "gaussian", "cone")
# Below this many (R·n·T·d) elements one intra-op thread is faster than several (measured in issue #3:
# 0.6 s vs 34 s for one 6×8×10 run on a loaded 2-core machine).
SMALL_PROBLEM_ELEMENTS = 2_000_000
# Runs longer than this many (steps × runs) show a progress bar when progress=None and stderr is a tty.
PROGRESS_MIN_WORK = 200_000


# ---------------------------------------------------------------------------------------------
# smoothness bounds

def _head_constants(problem: AttentionProblem, loss: str) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Per-sequence bounds (n,) on ‖∇_o ψ_i‖ and ‖∇²_o ψ_i‖ over the convex hull of the tokens,
    where ψ_i(o) is the loss of sequence i as a function of the attention output o."""
    n = problem.n
    Wh = problem.head.weights.reshape(problem.d, -1)
    kind = problem.head.kind
    if kind == "multiclass":
        s2 = float(np.linalg.norm(Wh, 2))
        return np.full(n, math.sqrt(2.0) * s2), np.full(n, 0.5 * s2 ** 2)
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
        return np.full(n, a), np.full(n, 0.25 * b ** 2)
    if loss == "correlation":
        return np.full(n, a), np.zeros(n)
    M = np.exp(np.minimum(-umin, 700.0))  # exponential: |ℓ'| = ℓ'' = e^{−u} ≤ e^{−u_min}
    return a * M, b ** 2 * M


def _radii(problem: AttentionProblem) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    X = problem.X
    rho = np.linalg.norm(X - X.mean(axis=1, keepdims=True), axis=-1).max(axis=1)  # (n,)
    zn = np.linalg.norm(problem.queries, axis=-1)  # (n,)
    return rho, zn


def smoothness_bound(problem: AttentionProblem, loss: str | None = None) -> float:
    """An upper bound L_W on the smoothness constant of ``L(W)`` in Frobenius norm (SPEC §4).

    With ρ_i = max_t ‖x_it − x̄_i‖ (x̄_i the mean token) the softmax mixture ``o_i(W) = X_iᵀ s_i``
    satisfies ``‖Do_i[H]‖ ≤ ρ_i h_i`` and ``‖D²o_i[H, H]‖ ≤ 2ρ_i h_i²`` with ``h_i = ρ_i ‖z_i‖ ‖H‖_F``
    (first and third centred moments of the attention distribution), so

        L_W ≤ (1/n) Σ_i ρ_i² ‖z_i‖² (B_i ρ_i² + 2 G_i ρ_i),

    where G_i, B_i bound the gradient and Hessian of the sequence loss as a function of o over the
    convex hull of its tokens (logistic: G = ‖v‖, B = ‖v‖²/4; correlation: B = 0; exponential: both
    scaled by ``e^{−min_t γ_it}``; cross-entropy: G = √2‖V‖₂, B = ‖V‖₂²/2). For the ReLU head the
    bound covers the smooth pieces only (the kinks have unbounded curvature).
    """
    loss = resolve_loss(problem.loss if loss is None and problem.head.kind != "multiclass" else loss,
                        problem.head.kind)
    G, B = _head_constants(problem, loss)
    rho, zn = _radii(problem)
    return float(np.mean(rho ** 2 * zn ** 2 * (B * rho ** 2 + 2.0 * G * rho)))


def gradient_bound(problem: AttentionProblem, loss: str | None = None) -> float:
    """An upper bound on ``‖∇_W L(W)‖_F`` over all W: ``(1/n) Σ_i G_i ρ_i² ‖z_i‖`` (see :func:`smoothness_bound`)."""
    loss = resolve_loss(problem.loss if loss is None and problem.head.kind != "multiclass" else loss,
                        problem.head.kind)
    G, _ = _head_constants(problem, loss)
    rho, zn = _radii(problem)
    return float(np.mean(G * rho ** 2 * zn))


# ---------------------------------------------------------------------------------------------
# initialisation

def cone_init(center: ArrayLike, *, runs: int = 1, mu: float = 0.1, scale: float = 1.0,
              seed: int = 0) -> NDArray[np.float64]:
    """Random W (runs, d, d) inside the cone ``{W : corr(W, W̄) ≥ 1 − μ}`` around ``center`` with ‖W‖_F = scale.

    The cone of a locally optimal direction (SPEC §4, the paper's ``C_{μ,R}(W^α_mm)``): each draw has
    correlation with ``center`` uniform in [1 − μ, 1] and a uniformly random orthogonal component.
    """
    C = as_float_array(center, "center", ndim=2)
    if C.shape[0] != C.shape[1]:
        raise ValueError(f"center must be a square (d, d) matrix, got shape {C.shape}")
    cn = float(np.linalg.norm(C))
    if cn == 0:
        raise ValueError("center must be nonzero (it is the SVM direction the cone surrounds)")
    runs = check_positive_int(runs, "runs")
    mu = check_finite_scalar(mu, "mu")
    if not 0 <= mu <= 2:
        raise ValueError(f"mu must be in [0, 2] (correlations lie in [-1, 1]), got {mu}")
    scale = check_finite_scalar(scale, "scale", positive=True)
    rng = np.random.default_rng(seed)
    Chat = C / cn
    G = rng.standard_normal((runs,) + C.shape)
    for _ in range(2):  # Gram–Schmidt twice: orthogonal to round-off even for a draw close to ±center
        G -= np.einsum("rij,ij->r", G, Chat)[:, None, None] * Chat
        G /= np.linalg.norm(G, axis=(1, 2), keepdims=True)
    c = 1.0 - mu * rng.uniform(size=runs)
    return scale * (c[:, None, None] * Chat + np.sqrt(np.maximum(1.0 - c ** 2, 0.0))[:, None, None] * G)


def _balanced_factors(W: NDArray[np.float64], m: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """K, Q (R, d, m) with K Qᵀ the best rank-m approximation of W and ‖K‖ = ‖Q‖ (balanced)."""
    U, S, Vt = np.linalg.svd(W)
    r = min(m, S.shape[-1])
    lost = (S[..., r:] ** 2).sum(-1)
    if np.any(lost > 1e-20 * np.maximum((S ** 2).sum(-1), 1e-300)):
        logger.warning("init W has rank above m=%d: its balanced (K, Q) factorisation truncates it", m)
    K = np.zeros(W.shape[:-1] + (m,))
    Q = np.zeros(W.shape[:-1] + (m,))
    sq = np.sqrt(S[..., :r])
    K[..., :r] = U[..., :, :r] * sq[..., None, :]
    Q[..., :r] = np.swapaxes(Vt, -1, -2)[..., :, :r] * sq[..., None, :]
    return K, Q


def _seeds(seed: int | Sequence[int], R: int) -> NDArray[np.int64]:
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        return np.arange(R, dtype=np.int64) + int(seed)
    if isinstance(seed, (str, bytes, bool)) or not isinstance(seed, (Sequence, np.ndarray)):
        raise TypeError(f"seed must be an integer or a sequence of {R} integers, got {type(seed).__name__}")
    arr = np.asarray(seed)
    if arr.shape != (R,) or not np.issubdtype(arr.dtype, np.integer) or np.any(arr < 0):
        raise ValueError(f"seed must be an integer or {R} non-negative integers (one per run), got {arr!r}")
    return arr.astype(np.int64)


def _initial_params(init: Any, *, param: str, R: int, d: int, m: int, seeds: NDArray[np.int64],
                    init_scale: float | None, cone_center: ArrayLike | None, cone_mu: float
                    ) -> tuple[NDArray[np.float64], NDArray[np.float64] | None]:
    """(W, None) for param W or (K, Q) for param KQ, numpy float64 with leading axis R."""
    if isinstance(init, str):
        check_choice(init, "init", INITS)
        scale = 1.0 if init_scale is None else check_finite_scalar(init_scale, "init_scale", positive=True)
        if init == "zeros":
            if param == "KQ":
                raise ValueError("init='zeros' with param='KQ' starts at a stationary point (∇K = ∇Q = 0) and "
                                 "never moves; give (K, Q) explicitly, e.g. K small Gaussian and Q = 0")
            return np.zeros((R, d, d)), None
        if init == "cone":
            if cone_center is None:
                raise ValueError("init='cone' needs cone_center: the SVM direction W^α_mm (d, d), or one per "
                                 "run (R, d, d) (Frobenius for param='W', nuclear W*_mm for param='KQ')")
            Cc = as_float_array(cone_center, "cone_center")
            if Cc.shape not in ((d, d), (R, d, d)):
                raise ValueError(f"cone_center must have shape ({d}, {d}) or ({R}, {d}, {d}), got {Cc.shape}")
            Cs = np.broadcast_to(Cc, (R, d, d))
            W = np.stack([cone_init(Cs[r], mu=cone_mu, scale=scale, seed=int(seeds[r]))[0] for r in range(R)])
            return (W, None) if param == "W" else _balanced_factors(W, m)
        # random draws, one torch.Generator per run (seed for seed reproducible, batch-independent)
        W_list, K_list, Q_list = [], [], []
        for r in range(R):
            g = torch.Generator().manual_seed(int(seeds[r]))
            if init == "pytorch":
                # nn.Linear(d, ·) default init: kaiming_uniform(a=√5) = U(−1/√fan_in, 1/√fan_in), fan_in = d
                def linear_weight(rows: int) -> Tensor:
                    # drawn in float32 and then cast, as `SelfAttn(d).double()` does in the published code
                    w = torch.empty(rows, d, dtype=torch.float32)
                    return torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=g).double()

                if param == "W":
                    W_list.append(scale * linear_weight(d).T.numpy())
                else:  # the published module builds `query` before `key`
                    Wq = linear_weight(m)
                    Wk = linear_weight(m)
                    K_list.append(scale * Wk.T.numpy())
                    Q_list.append(scale * Wq.T.numpy())
            else:  # gaussian
                if param == "W":
                    W_list.append(scale * torch.randn(d, d, generator=g, dtype=torch.float64).numpy())
                else:
                    K_list.append(scale * torch.randn(d, m, generator=g, dtype=torch.float64).numpy())
                    Q_list.append(scale * torch.randn(d, m, generator=g, dtype=torch.float64).numpy())
        if param == "W":
            return np.stack(W_list), None
        return np.stack(K_list), np.stack(Q_list)
    if isinstance(init, tuple):
        if param != "KQ" or len(init) != 2:
            raise ValueError("init as a tuple must be (K, Q) and needs param='KQ'")
        K = as_float_array(init[0], "init K")
        Q = as_float_array(init[1], "init Q")
        for name, A in (("K", K), ("Q", Q)):
            if A.shape not in ((d, m), (R, d, m)):
                raise ValueError(f"init {name} must have shape ({d}, {m}) or ({R}, {d}, {m}), got {A.shape}")
        return np.broadcast_to(K, (R, d, m)).copy(), np.broadcast_to(Q, (R, d, m)).copy()
    if isinstance(init, (np.ndarray, torch.Tensor, list)):
        W = as_float_array(init, "init")
        if W.shape not in ((d, d), (R, d, d)):
            raise ValueError(f"init W must have shape ({d}, {d}) or ({R}, {d}, {d}), got {W.shape}")
        W = np.broadcast_to(W, (R, d, d)).copy()
        return (W, None) if param == "W" else _balanced_factors(W, m)
    raise TypeError(f"init must be one of {', '.join(repr(i) for i in INITS)}, an array W or a tuple (K, Q); "
                    f"got {type(init).__name__}")


# ---------------------------------------------------------------------------------------------
# result

@dataclass
class TrainResult:
    """The outcome of :func:`train` for R runs.

    Attributes
    ----------
    W : ndarray (R, d, d)
        Final attention matrix of every run (``K Qᵀ`` for param ``"KQ"``).
    K, Q : ndarray (R, d, m) or None
        Final factors (param ``"KQ"`` only).
    probs : ndarray (R, n, T)
        Final attention probabilities ``softmax(X_i W z_i)``.
    history : dict of ndarray
        Recorded at the states ``W(k)`` after k updates, for k in ``history["step"]`` (``0, e, 2e, …``
        with e = ``record_every``, plus the final step). S = number of records.

        * ``step`` (S,) int: the update count k of each record (k = 0 is the initialisation).
        * ``loss`` (R, S): the data risk ``L(W(k))`` (without the (K, Q) penalty).
        * ``W_norm`` (R, S): ``‖W(k)‖_F`` (of ``K Qᵀ`` for param ``"KQ"``).
        * ``grad_norm`` (R, S): norm of the gradient of the data risk w.r.t. the trained parameters:
          ``‖∇_W L‖_F``, or ``(‖∇_K L‖_F² + ‖∇_Q L‖_F²)^{1/2}`` for ``"KQ"``.
        * ``max_prob`` (R, S, n): ``max_t s_it`` per sequence.
        * ``selected`` (R, S, n) int: ``argmax_t s_it`` per sequence.
        * ``W`` (R, S, d, d): ``W(k)`` itself, only with ``record_W=True``.
        * ``K_norm``, ``Q_norm`` (R, S): factor norms, param ``"KQ"`` only.
    problems : list of AttentionProblem
        The instances; run r trained on ``problems[problem_index[r]]``.
    problem_index : ndarray (R,) int
    seeds : ndarray (R,) int
        The per-run initialisation seeds.
    lr : ndarray (R,) or str
        The step of every run (``"schedule"`` for a callable).
    param, steps, normalized, loss, init, penalty, m, record_every, device : the settings used.
    wall_time : float
        Seconds spent in the training loop.
    """

    W: NDArray[np.float64]
    K: NDArray[np.float64] | None
    Q: NDArray[np.float64] | None
    probs: NDArray[np.float64]
    history: dict[str, NDArray]
    problems: list[AttentionProblem]
    problem_index: NDArray[np.int64]
    seeds: NDArray[np.int64]
    lr: NDArray[np.float64] | str
    param: str
    steps: int
    normalized: bool
    loss: str
    init: str
    penalty: float
    m: int
    record_every: int
    device: str
    wall_time: float = 0.0
    info: dict = field(default_factory=dict)

    @property
    def n_runs(self) -> int:
        return int(self.W.shape[0])

    @property
    def selected(self) -> NDArray[np.int64]:
        """Final selected tokens ``argmax_t s_it``, shape (R, n)."""
        return np.argmax(self.probs, axis=-1).astype(np.int64)

    @property
    def final_loss(self) -> NDArray[np.float64]:
        """``L(W)`` at the last record, shape (R,)."""
        return self.history["loss"][:, -1]

    def problem(self, run: int) -> AttentionProblem:
        """The instance run ``run`` trained on."""
        return self.problems[int(self.problem_index[run])]

    def trajectory_arrays(self) -> dict[str, NDArray]:
        """Flat dict of arrays (final state, settings and ``history/…``) for ``np.savez``."""
        out: dict[str, NDArray] = {"W": self.W, "probs": self.probs, "problem_index": self.problem_index,
                                   "seeds": self.seeds, "param": np.array(self.param),
                                   "steps": np.array(self.steps), "normalized": np.array(self.normalized),
                                   "loss": np.array(self.loss), "init": np.array(self.init),
                                   "penalty": np.array(self.penalty), "m": np.array(self.m),
                                   "lr": np.asarray(self.lr) if not isinstance(self.lr, str) else np.array(self.lr)}
        if self.K is not None and self.Q is not None:
            out["K"], out["Q"] = self.K, self.Q
        for k, v in self.history.items():
            out[f"history/{k}"] = v
        return out


# ---------------------------------------------------------------------------------------------

@contextmanager
def _threads(n: int | None) -> Iterator[None]:
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _record_steps(steps: int, every: int) -> NDArray[np.int64]:
    ks = np.arange(0, steps + 1, every, dtype=np.int64)
    if ks[-1] != steps:
        ks = np.append(ks, steps)
    return ks


def _fro(A: Tensor) -> Tensor:
    return torch.linalg.vector_norm(A, dim=(-2, -1))


def _normalize(G: Tensor, eps: float, tiny: float) -> Tensor:
    """``G / (‖G‖_F + eps)`` per run. With eps = 0 the norm is taken after scaling by max|G| so that a
    gradient whose squares underflow (‖G‖ ~ 1e-160 and below, late in long runs) is still normalised
    exactly, and a zero gradient gives a zero step."""
    if eps > 0:
        return G / (_fro(G)[:, None, None] + eps)
    G = G / G.abs().amax(dim=(-2, -1), keepdim=True).clamp_min(tiny)
    return G / _fro(G)[:, None, None].clamp_min(tiny)


def train(problems: AttentionProblem | Sequence[AttentionProblem], *, param: Param = "W", steps: int,
          lr: Literal["auto"] | float | ArrayLike | Callable[[int], Any] = "auto", normalized: bool = True,
          loss: str | None = None, init: Any = "pytorch", init_scale: float | None = None,
          m: int | None = None, n_init: int = 1, seed: int | Sequence[int] = 0, record_every: int = 1,
          record_W: bool = False, device: torch.device | str | None = None, penalty: float | None = None,
          cone_center: ArrayLike | None = None, cone_mu: float = 0.1, normalize_eps: float = NORMALIZE_EPS,
          threads: int | None = None, progress: bool | None = None, dtype: torch.dtype = torch.float64
          ) -> TrainResult:
    """Train R one-layer attention models by (normalized) gradient descent, as one batched program (SPEC §4).

    Parameters
    ----------
    problems : AttentionProblem or list of P of them
        Instances sharing n, T, d and the head kind/shape. There are ``R = P · n_init`` runs; run r
        trains on ``problems[r // n_init]``.
    param : {"W", "KQ"}
        Train W directly, or K, Q (d, m) with W = K Qᵀ.
    steps : int
        Number of updates.
    lr : "auto", float, array (R,) or callable
        Step size η. ``"auto"``: 0.1 for normalized GD (the paper's); for plain GD on W, ``1/L_W`` per
        run from :func:`smoothness_bound`; for plain GD on (K, Q), ``1/(L_W·B + G_W)`` with
        ``B = max(1, ‖K₀‖_F² + ‖Q₀‖_F²)`` — a bound valid while ``‖K‖_F² + ‖Q‖_F² ≤ B`` (the (K, Q)
        objective is not globally smooth). A callable ``lr(k)`` gives the step of update k (a float or
        an (R,) array).
    normalized : bool
        ``W ← W − η ∇/(‖∇‖_F + eps)`` per run (eps = float64 machine epsilon, as the published code);
        for (K, Q) each factor's gradient is normalised separately. False: plain GD ``W ← W − η ∇``.
    loss : {"logistic", "exponential", "correlation", "cross_entropy"}, optional
        Default: the problems' loss (scalar heads) or cross-entropy (multiclass head).
    init : "pytorch", "zeros", "gaussian", "cone", array or (K, Q)
        ``"pytorch"`` (default): the published code's ``nn.Linear`` init, U(−1/√d, 1/√d) per entry of
        ``W_lin`` (W = W_linᵀ), or of ``W_q`` then ``W_k`` (K = W_kᵀ, Q = W_qᵀ), drawn from a
        ``torch.Generator`` seeded with the run's seed (so a run does not depend on the batch it is in).
        ``"gaussian"``: i.i.d. ``init_scale · N(0, 1)`` entries. ``"cone"``: ``‖W₀‖_F = init_scale`` and
        ``corr(W₀, cone_center) ∈ [1 − cone_mu, 1]`` (:func:`cone_init`); for (K, Q) its balanced
        factorisation. An array (d, d) or (R, d, d) is W₀ (balanced factors for KQ); a tuple (K, Q) of
        (d, m) or (R, d, m) arrays is used as given.
    init_scale : float, optional
        Scale of the ``"pytorch"`` / ``"gaussian"`` draws, or the norm of the ``"cone"`` init (default 1).
    m : int, optional
        Inner dimension of K, Q (default d).
    n_init : int
        Initialisations per problem.
    seed : int or sequence of R ints
        Per-run initialisation seeds; an int s gives runs the seeds ``s, s+1, …, s+R−1``.
    record_every : int
        Record stride e (see :class:`TrainResult`); the final state is always recorded.
    record_W : bool
        Also record ``W(k)`` (R·S·d² floats).
    device : torch device, optional
        "cpu" (default) or e.g. "cuda"; the code is the same.
    penalty : float, optional
        λ of the penalty ``λ(‖K‖_F² + ‖Q‖_F²)`` (KQ) or ``λ‖W‖_F²`` (W). Default: float64 machine
        epsilon for (K, Q), as the published code; 0 for W.
    cone_center, cone_mu : see ``init="cone"``.
    normalize_eps : float
        The ε of ``∇/(‖∇‖_F + ε)`` (default float64 machine epsilon, the published code's). Once
        ``‖∇‖_F`` falls below ε the steps shrink like ``η‖∇‖/ε`` and the run effectively stops. 0 gives
        exact normalisation; without a penalty the step direction then comes from the rescaled
        gradient ``e^{c}∇`` (:func:`attsvm.model.risk_and_scaled_grad`), so the run keeps moving at
        speed η in the exact normalized-GD direction even after ``∇`` underflows float64.
    threads : int, optional
        torch intra-op threads during training (restored afterwards). Default: 1 for small problems
        on CPU (R·n·T·d below 2·10⁶), where more threads only add synchronisation; otherwise unchanged.
    progress : bool, optional
        tqdm progress bar; default: shown for long runs when stderr is a terminal.
    dtype : torch dtype
        float64 by default.

    Returns
    -------
    TrainResult
    """
    plist = _as_problem_list(problems)
    param = check_choice(param, "param", PARAMS)
    steps = check_positive_int(steps, "steps", minimum=0)
    n_init = check_positive_int(n_init, "n_init")
    record_every = check_positive_int(record_every, "record_every")
    if not isinstance(normalized, (bool, np.bool_)):
        raise TypeError(f"normalized must be a bool, got {type(normalized).__name__}")
    if dtype not in (torch.float64, torch.float32):
        raise ValueError(f"dtype must be torch.float64 or torch.float32, got {dtype}")
    dev = torch.device("cpu" if device is None else device)
    P = len(plist)
    R = P * n_init
    batch = Batch.from_problems(plist, loss=loss, repeat=n_init, device=dev, dtype=dtype)
    p0 = plist[0]
    n, T, d = p0.n, p0.T, p0.d
    m_ = d if (m is None or param == "W") else check_positive_int(m, "m")
    if param == "W" and m is not None and m != d:
        raise ValueError(f"m applies to param='KQ' only (W is d × d); got m={m} with param='W'")
    seeds = _seeds(seed, R)
    if penalty is None:
        lam = NORMALIZE_EPS if param == "KQ" else 0.0
    else:
        lam = check_finite_scalar(penalty, "penalty")
        if lam < 0:
            raise ValueError(f"penalty must be >= 0, got {lam}")
    A0, B0 = _initial_params(init, param=param, R=R, d=d, m=m_, seeds=seeds, init_scale=init_scale,
                             cone_center=cone_center, cone_mu=check_finite_scalar(cone_mu, "cone_mu"))
    problem_index = np.repeat(np.arange(P, dtype=np.int64), n_init)

    # ---- step sizes
    schedule: Callable[[int], Any] | None = None
    if callable(lr):
        schedule = lr
        lr_value: NDArray[np.float64] | str = "schedule"
    elif isinstance(lr, str):
        check_choice(lr, "lr", ("auto",))
        if normalized:
            lr_value = np.full(R, NORMALIZED_LR)
        else:
            LW = np.array([smoothness_bound(p, batch.loss) for p in plist])[problem_index]
            if param == "W":
                lr_value = 1.0 / LW
            else:
                GW = np.array([gradient_bound(p, batch.loss) for p in plist])[problem_index]
                assert B0 is not None
                Bn = np.maximum(1.0, (A0 ** 2).sum((1, 2)) + (B0 ** 2).sum((1, 2)))
                lr_value = 1.0 / (LW * Bn + GW)
    else:
        arr = np.asarray(lr, dtype=np.float64) if not isinstance(lr, bool) else None
        if arr is None or arr.shape not in ((), (R,)) or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
            raise ValueError(f"lr must be 'auto', a positive float, {R} positive floats (one per run) or a "
                             f"callable step -> float; got {lr!r}")
        lr_value = np.broadcast_to(arr, (R,)).astype(np.float64).copy()

    def lr_tensor(k: int) -> Tensor:
        if schedule is None:
            return lr_t
        v = np.asarray(schedule(k), dtype=np.float64)
        if v.shape not in ((), (R,)) or not np.all(np.isfinite(v)):
            raise ValueError(f"lr schedule must return a finite float or {R} floats, got {v!r} at step {k}")
        return torch.as_tensor(np.broadcast_to(v, (R,)).copy(), dtype=dtype, device=dev)[:, None, None]

    lr_t = (torch.as_tensor(lr_value, dtype=dtype, device=dev)[:, None, None]
            if not isinstance(lr_value, str) else torch.empty(0))

    # ---- state and history buffers (on the device; copied to numpy once at the end)
    if param == "W":
        Wt = torch.as_tensor(A0, dtype=dtype, device=dev).clone()
        Kt = Qt = None
    else:
        Kt = torch.as_tensor(A0, dtype=dtype, device=dev).clone()
        Qt = torch.as_tensor(B0, dtype=dtype, device=dev).clone()
    ks = _record_steps(steps, record_every)
    S = len(ks)
    H: dict[str, Tensor] = {
        "loss": torch.empty(R, S, dtype=dtype, device=dev),
        "W_norm": torch.empty(R, S, dtype=dtype, device=dev),
        "grad_norm": torch.empty(R, S, dtype=dtype, device=dev),
        "max_prob": torch.empty(R, S, n, dtype=dtype, device=dev),
        "selected": torch.empty(R, S, n, dtype=torch.int64, device=dev),
    }
    if param == "KQ":
        H["K_norm"] = torch.empty(R, S, dtype=dtype, device=dev)
        H["Q_norm"] = torch.empty(R, S, dtype=dtype, device=dev)
    if record_W:
        H["W"] = torch.empty(R, S, d, d, dtype=dtype, device=dev)

    if threads is None:
        small = dev.type == "cpu" and R * n * T * d < SMALL_PROBLEM_ELEMENTS
        threads_used: int | None = 1 if small else None
    else:
        threads_used = check_positive_int(threads, "threads")
    show = progress if progress is not None else (None if steps * R >= PROGRESS_MIN_WORK else False)
    eps = check_finite_scalar(normalize_eps, "normalize_eps")
    if eps < 0:
        raise ValueError(f"normalize_eps must be >= 0, got {eps}")
    tiny = torch.finfo(dtype).tiny  # guards 0/0 when normalize_eps = 0 and the gradient vanishes
    exact_direction = bool(normalized) and eps == 0.0 and lam == 0.0
    t0 = time.perf_counter()
    with _threads(threads_used), torch.no_grad():
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, desc=f"train {param}", unit="step",
                   disable=(None if show is None else not show), leave=False)
        j = 0  # next record index
        next_k = int(ks[0])
        for k in range(steps + 1):
            W = Wt if Kt is None else Kt @ Qt.transpose(-1, -2)  # type: ignore[union-attr]
            L, gS, s, logc = risk_and_scaled_grad(batch, W)  # gS = e^{c} ∇_W L
            gW = gS * torch.exp(-logc)[:, None, None]
            if Kt is not None:
                gK, gQ = factor_grads(gW, Kt, Qt)  # type: ignore[arg-type]
            if k == next_k:
                H["loss"][:, j] = L
                H["W_norm"][:, j] = _fro(W)
                if Kt is None:
                    H["grad_norm"][:, j] = _fro(gW)
                else:
                    H["grad_norm"][:, j] = torch.sqrt(_fro(gK) ** 2 + _fro(gQ) ** 2)
                    H["K_norm"][:, j] = _fro(Kt)
                    H["Q_norm"][:, j] = _fro(Qt)  # type: ignore[arg-type]
                pm, sel = s.max(-1)
                H["max_prob"][:, j] = pm
                H["selected"][:, j] = sel
                if record_W:
                    H["W"][:, j] = W
                j += 1
                next_k = int(ks[j]) if j < S else -1
            if k == steps:
                break
            eta = lr_tensor(k)
            if exact_direction:  # normalisation is scale-free: use e^{c}∇, which never underflows
                if Kt is None:
                    Wt = Wt - eta * _normalize(gS, 0.0, tiny)
                else:
                    gKs, gQs = factor_grads(gS, Kt, Qt)  # type: ignore[arg-type]
                    Kt, Qt = Kt - eta * _normalize(gKs, 0.0, tiny), Qt - eta * _normalize(gQs, 0.0, tiny)
            elif Kt is None:
                if lam:
                    gW = gW + 2.0 * lam * Wt
                if normalized:
                    gW = _normalize(gW, eps, tiny)
                Wt = Wt - eta * gW
            else:
                if lam:
                    gK = gK + 2.0 * lam * Kt
                    gQ = gQ + 2.0 * lam * Qt
                if normalized:
                    gK, gQ = _normalize(gK, eps, tiny), _normalize(gQ, eps, tiny)
                Kt, Qt = Kt - eta * gK, Qt - eta * gQ  # type: ignore[operator]
            bar.update(1)
        bar.close()
        Wf = Wt if Kt is None else Kt @ Qt.transpose(-1, -2)  # type: ignore[union-attr]
    wall = time.perf_counter() - t0
    history: dict[str, NDArray] = {"step": ks}
    history.update({k_: v.cpu().numpy() for k_, v in H.items()})
    Wn = Wf.cpu().numpy().astype(np.float64)
    if not (np.all(np.isfinite(Wn)) and np.all(np.isfinite(history["loss"]))):
        warnings.warn("training produced non-finite values (NaN/inf); check lr and the data", RuntimeWarning,
                      stacklevel=2)
    init_name = init if isinstance(init, str) else ("given (K, Q)" if isinstance(init, tuple) else "given W")
    return TrainResult(
        W=Wn, K=None if Kt is None else Kt.cpu().numpy(), Q=None if Qt is None else Qt.cpu().numpy(),
        probs=s.cpu().numpy(), history=history, problems=plist, problem_index=problem_index, seeds=seeds,
        lr=lr_value, param=param, steps=steps, normalized=bool(normalized), loss=batch.loss, init=init_name,
        penalty=lam, m=m_, record_every=record_every, device=str(dev), wall_time=wall,
        info={"threads": threads_used if threads_used is not None else torch.get_num_threads(),
              "normalize_eps": eps})


# ---------------------------------------------------------------------------------------------
# regularization path (SPEC §4)

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


def _svm_reference(problem: AttentionProblem, tokens: NDArray[np.int64], norm: str) -> NDArray[np.float64] | None:
    """W_mm / W*_mm of ``tokens`` from the solvers (lazy import: svm and train are siblings)."""
    try:
        from .svm import AttentionSVM  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - solver package not built
        logger.warning("attsvm.svm.AttentionSVM is unavailable: pass W_mm / W_star to get correlations")
        return None
    est = AttentionSVM(norm=norm).fit(problem, tokens)
    if getattr(est, "status_", "optimal") not in ("optimal", "optimal_inaccurate"):
        logger.warning("Att-SVM (%s) of the path's tokens is %s; no correlation reported", norm, est.status_)
        return None
    return np.asarray(est.W_, dtype=np.float64)


def regularization_path(problem: AttentionProblem, radii: ArrayLike, *, param: Param = "W",
                        loss: str | None = None, m: int | None = None, tokens: ArrayLike | None = None,
                        W_mm: ArrayLike | None = None, W_star: ArrayLike | None = None,
                        tol: float = REG_PATH_TOL, max_iter: int = REG_PATH_MAX_ITER, seed: int = 0,
                        device: torch.device | str | None = None) -> RegularizationPath:
    """The regularization path of SPEC §4: ``W̄_R = argmin_{‖W‖_F ≤ R} L(W)`` for growing R.

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
    dev = torch.device("cpu" if device is None else device)
    batch = Batch.from_problems(problem, loss=loss, device=dev)
    d = problem.d
    m_ = d if (m is None or param == "W") else check_positive_int(m, "m")
    LW = smoothness_bound(problem, batch.loss)
    GW = gradient_bound(problem, batch.loss)

    def fg(x: Tensor) -> tuple[float, Tensor]:
        if param == "W":
            L, g, _ = risk_and_grad(batch, x)
            return float(L[0]), g
        L, g, _ = risk_and_grad(batch, x[0:1] @ x[1:2].transpose(-1, -2))
        gK, gQ = factor_grads(g, x[0:1], x[1:2])
        return float(L[0]), torch.cat([gK, gQ])

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
    with _threads(1 if dev.type == "cpu" else None), torch.no_grad():
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
                logger.warning("regularization path: radius %g stopped at max_iter=%d with stationarity %.2e "
                               "> tol=%.1e", Rj, max_iter, s_meas, tol)
    alpha = (problem.check_tokens(tokens) if tokens is not None
             else np.argmax(problem.logits(Ws[-1]), axis=-1).astype(np.int64))
    Wf = as_float_array(W_mm, "W_mm", shape=(d, d)) if W_mm is not None else _svm_reference(problem, alpha, "fro")
    Wn = (as_float_array(W_star, "W_star", shape=(d, d)) if W_star is not None
          else _svm_reference(problem, alpha, "nuc"))
    return RegularizationPath(
        radii=r_arr, W=Ws, K=Ks, Q=Qs, loss=losses, n_iter=iters, converged=conv, stationarity=stat,
        tokens=alpha, W_mm=Wf, W_star=Wn,
        corr_fro=None if Wf is None else np.asarray(correlation(Ws, Wf)),
        corr_nuc=None if Wn is None else np.asarray(correlation(Ws, Wn)), param=param)


class _CallableModule(types.ModuleType):
    """This module, callable as :func:`train`.

    The submodule ``attsvm.train`` and the function ``attsvm.train.train`` share a name, and importing
    the submodule binds ``attsvm.train`` to the module; making the module callable keeps the documented
    ``attsvm.train(problems, ...)`` working however the package was imported.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> TrainResult:
        return train(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
