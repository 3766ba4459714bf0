"""Training causal self-attention on next-token prediction, batched over runs (docs/spec.md §8,
"Next-token graph-SVM"; Li, Huang, Ildiz, Rawat, Oymak, AISTATS 2024).

Sequence i of a :class:`~attsvm.ntp.NextTokenProblem` is read by its last position: the query is the
last token's embedding ``z_i = e_{k_i}``, attention ``s_i = softmax(X_i W z_i)`` runs over all its
tokens (a causal mask, for the last position), and the next token is predicted from ``s_i``:

* ``loss="log"`` (the paper's log-loss, identity classifier): the probability of token v is the
  attention mass on the positions holding v, ``p_iv = Σ_{t: x_it = e_v} s_it``, and
  ``ℓ_i = −log p_{i,y_i} = LSE_t γ_it − LSE_{t: token y_i} γ_it``;
* ``loss="ce"`` (the paper's "general" classifier): logits ``E Xᵀ s_i`` over the vocabulary and the
  cross-entropy ``LSE_v (E Xᵀ s_i)_v − (E Xᵀ s_i)_{y_i}``.

Both are written with log-sum-exp, so huge ``‖W‖`` gives no NaN or inf, and their gradients are in
closed form (``∂L/∂W = Σ_i w_i Σ_t g_it x_it z_iᵀ`` with ``g = ∂ℓ/∂γ``), checked against finite
differences in the tests. R problems (any n, T, V; equal d) train as one float64 numpy program: the
sequences are padded and weighted ``1/n_r``, and each run's gradient only touches its own data, so a
run never depends on its batch.

Not on the update-rule chain (:mod:`.optim`): its numpy step ``v/(‖v‖_F + ε/a)``, v = ∇/max|∇|, rounds
differently from the chain's torch ``∇/(‖∇‖_F + ε)``.

:func:`ntp_w_fin` computes the finite component ``W_fin`` of docs/spec.md §8 (see
:mod:`attsvm.svm.graph`): the minimiser over ``S_fin`` of the log-loss on the reduced sequences (the
tokens in the label's SCC), a strictly convex problem on ``S_fin`` solved by damped Newton.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._validation import (
    as_float_array,
    check_bool,
    check_choice,
    check_finite_scalar,
    check_positive_int,
    warn_nonfinite,
)
from ..ntp import NextTokenProblem
from .init import run_seeds
from .optim import NORMALIZE_EPS
from .recording import Trajectory

__all__ = [
    "NTPBatch",
    "NTPTrainResult",
    "WFinResult",
    "ntp_batch",
    "ntp_loss_and_grad",
    "train_ntp",
    "ntp_w_fin",
    "NTP_LOSSES",
    "W_FIN_TOL",
]

NTP_LOSSES: tuple[str, ...] = ("log", "ce")
# Newton on W_fin stops when the gradient norm (in S_fin coordinates) is at most this.
W_FIN_TOL = 1e-10


@dataclass(frozen=True)
class NTPBatch:
    """R problems padded to common (n, T, V) (module doc).

    X (R, n, T, d), Z (R, n, d), valid (R, n, T), label_pos (R, n, T), labels (R, n), weight (R, n)
    (``1/n_r`` on real sequences, 0 on padding), E (R, V, d) and vocab (R, V) (False on padding).
    """

    X: NDArray[np.float64]
    Z: NDArray[np.float64]
    valid: NDArray[np.bool_]
    label_pos: NDArray[np.bool_]
    labels: NDArray[np.int64]
    weight: NDArray[np.float64]
    E: NDArray[np.float64]
    vocab: NDArray[np.bool_]


def _as_ntp_list(problems: NextTokenProblem | Sequence[NextTokenProblem]) -> list[NextTokenProblem]:
    if isinstance(problems, NextTokenProblem):
        plist = [problems]
    elif isinstance(problems, (Sequence, np.ndarray)) and not isinstance(problems, (str, bytes)):
        plist = list(problems)
    else:
        raise TypeError(f"problems must be a NextTokenProblem or a list of them, got {type(problems).__name__}")
    if not plist:
        raise ValueError("problems must hold at least one NextTokenProblem, got none")
    for i, p in enumerate(plist):
        if not isinstance(p, NextTokenProblem):
            raise TypeError(f"problems[{i}] must be a NextTokenProblem, got {type(p).__name__}")
    ds = {p.d for p in plist}
    if len(ds) > 1:
        raise ValueError(f"problems must share the embedding dimension d, got {sorted(ds)}")
    return plist


def ntp_batch(
    problems: NextTokenProblem | Sequence[NextTokenProblem], valid: Sequence[NDArray[np.bool_]] | None = None
) -> NTPBatch:
    """Stack R problems into one padded :class:`NTPBatch`; ``valid`` optionally restricts each
    problem's positions (e.g. to the label's SCC, for ``W_fin``)."""
    plist = _as_ntp_list(problems)
    R, d = len(plist), plist[0].d
    n = max(p.n for p in plist)
    T = max(p.T for p in plist)
    V = max(p.V for p in plist)
    if valid is not None:
        want = f"a list of {R} boolean arrays (one (n, T) mask per problem)"
        if isinstance(valid, (str, bytes, np.ndarray)) or not isinstance(valid, Sequence):
            raise TypeError(f"valid must be {want}, got {type(valid).__name__}")
        if len(valid) != R:
            raise ValueError(f"valid must be {want}, got {len(valid)} masks")
        masks = []
        for r, (p, m) in enumerate(zip(plist, valid)):
            arr = np.asarray(m) if m is not None else None
            if arr is None or arr.dtype != np.bool_ or arr.shape != (p.n, p.T):
                got = "None" if arr is None else f"dtype {arr.dtype}, shape {arr.shape}"
                raise ValueError(f"valid[{r}] must be a boolean array of shape (n, T) = ({p.n}, {p.T}), got {got}")
            masks.append(arr)
    X = np.zeros((R, n, T, d))
    Z = np.zeros((R, n, d))
    val = np.zeros((R, n, T), dtype=bool)
    lab = np.zeros((R, n, T), dtype=bool)
    y = np.zeros((R, n), dtype=np.int64)
    w = np.zeros((R, n))
    E = np.zeros((R, V, d))
    vocab = np.zeros((R, V), dtype=bool)
    for r, p in enumerate(plist):
        v = p.valid if valid is None else masks[r] & p.valid
        X[r, : p.n, : p.T] = np.where(v[..., None], p.X, 0.0)
        Z[r, : p.n] = p.queries
        val[r, : p.n, : p.T] = v
        lab[r, : p.n, : p.T] = p.label_positions & v
        y[r, : p.n] = p.labels
        w[r, : p.n] = 1.0 / p.n
        E[r, : p.V] = p.E
        vocab[r, : p.V] = True
    # padded sequences: one valid label position and weight 0, so their loss and gradient are exactly 0
    pad = ~val.any(axis=-1)
    val[..., 0] |= pad
    lab[..., 0] |= pad
    if np.any(~lab.any(axis=-1)):
        raise ValueError("valid must keep every sequence's label positions (the log-loss needs the label)")
    return NTPBatch(X, Z, val, lab, y, w, E, vocab)


def _lse(g: NDArray[np.float64], mask: NDArray[np.bool_]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Masked log-sum-exp over the last axis and the softmax (0 off the mask)."""
    gm = np.where(mask, g, -np.inf)
    mx = gm.max(axis=-1, keepdims=True)
    e = np.exp(gm - mx)
    tot = e.sum(axis=-1, keepdims=True)
    return (mx + np.log(tot))[..., 0], e / tot


def ntp_loss_and_grad(
    batch: NTPBatch, W: ArrayLike, loss: Literal["log", "ce"] = "log"
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Per-run risk ``L_r(W_r) = Σ_i w_ri ℓ_ri`` (R,) and its gradient (R, d, d) (module doc)."""
    check_choice(loss, "loss", NTP_LOSSES)
    if not isinstance(batch, NTPBatch):
        raise TypeError(f"batch must be an NTPBatch (from ntp_batch), got {type(batch).__name__}")
    R, d = batch.Z.shape[0], batch.Z.shape[-1]
    Wm = as_float_array(W, "W", copy=False)
    if Wm.shape != (R, d, d):
        raise ValueError(f"W must have shape (R, d, d) = ({R}, {d}, {d}) (one matrix per run), got {Wm.shape}")
    g = np.einsum("rntd,rde,rne->rnt", batch.X, Wm, batch.Z)  # (R, n, T) logits γ
    lse_all, s = _lse(g, batch.valid)
    if loss == "log":
        lse_lab, q = _lse(g, batch.label_pos)
        ell = lse_all - lse_lab  # (R, n)
        G = s - q  # ∂ℓ/∂γ
    else:
        o = np.einsum("rnt,rntd->rnd", s, batch.X)  # (R, n, d) attention output
        u = np.einsum("rvd,rnd->rnv", batch.E, o)  # (R, n, V) vocabulary logits
        lse_u, p = _lse(u, np.broadcast_to(batch.vocab[:, None, :], u.shape))
        ell = lse_u - np.take_along_axis(u, batch.labels[..., None], axis=-1)[..., 0]
        np.put_along_axis(p, batch.labels[..., None], np.take_along_axis(p, batch.labels[..., None], -1) - 1.0, -1)
        h = np.einsum("rnv,rvd->rnd", p, batch.E)  # ∂ℓ/∂o
        c = np.einsum("rntd,rnd->rnt", batch.X, h)
        G = s * (c - (s * c).sum(axis=-1, keepdims=True))
    risk = (batch.weight * ell).sum(axis=-1)
    grad = np.einsum("rnt,rntd,rne->rde", batch.weight[..., None] * G, batch.X, batch.Z)
    return risk, grad


@dataclass
class NTPTrainResult:
    """Outcome of :func:`train_ntp` for R runs.

    W (R, d, d) final weights; history: ``step`` (S,), ``loss`` (R, S), ``W`` (R, S, d, d);
    seeds (R,) and the settings.
    """

    W: NDArray[np.float64]
    history: dict[str, NDArray]
    seeds: NDArray[np.int64]
    loss: str
    lr: float
    normalized: bool
    steps: int


def train_ntp(
    problems: NextTokenProblem | Sequence[NextTokenProblem],
    *,
    steps: int,
    lr: float = 0.1,
    normalized: bool = True,
    loss: Literal["log", "ce"] = "log",
    W0: ArrayLike | None = None,
    seed: int | Sequence[int] = 0,
    init_scale: float = 1.0,
    record_every: int = 10,
    eps: float = NORMALIZE_EPS,
) -> NTPTrainResult:
    """GD (``normalized=True``: the paper's normalised GD ``W ← W − η ∇L/‖∇L‖_F``) on R problems at once.

    Parameters
    ----------
    problems : one NextTokenProblem or R of them (equal d).
    steps, lr : number and size of the steps.
    loss : "log" (the paper's, module doc) or "ce".
    W0 : (d, d) or (R, d, d) initial weights; default ``init_scale``·U(−1/√d, 1/√d) per entry (the
        published ``nn.Linear`` draw) from ``numpy.random.default_rng(seed_r)``.
    seed : per-run seeds (an int s gives s, s+1, …).
    record_every : stride of the recorded trajectory (the final step is always recorded).
    """
    plist = _as_ntp_list(problems)
    steps = check_positive_int(steps, "steps", minimum=0)
    lr = check_finite_scalar(lr, "lr", positive=True)
    record_every = check_positive_int(record_every, "record_every")
    init_scale = check_finite_scalar(init_scale, "init_scale", positive=True)
    check_choice(loss, "loss", NTP_LOSSES)
    normalized = check_bool(normalized, "normalized")
    eps = check_finite_scalar(eps, "eps")
    if eps < 0:
        raise ValueError(f"eps must be >= 0 (normalised GD divides by ‖∇L‖_F + eps), got {eps}")
    R, d = len(plist), plist[0].d
    seeds = run_seeds(seed, R)
    if W0 is None:
        b = init_scale / np.sqrt(d)
        W = np.stack([np.random.default_rng(int(s)).uniform(-b, b, (d, d)) for s in seeds])
    else:
        W = as_float_array(W0, "W0")
        if W.shape == (d, d):
            W = np.broadcast_to(W, (R, d, d)).copy()
        elif W.shape != (R, d, d):
            raise ValueError(f"W0 must have shape (d, d) = ({d}, {d}) or (R, d, d) = ({R}, {d}, {d}), got {W.shape}")
    batch = ntp_batch(plist)
    recorder = Trajectory(steps, record_every, R)
    for k in range(steps + 1):
        risk, grad = ntp_loss_and_grad(batch, W, loss)
        if k == recorder.next_step:
            recorder.record(loss=risk, W=W)
        if k == steps:
            break
        if normalized:  # ∇/(‖∇‖ + ε) = v/(‖v‖ + ε/a), v = ∇/a, a = max|∇|: no overflow of ‖∇‖²
            a = np.maximum(np.abs(grad).max(axis=(1, 2), keepdims=True), np.finfo(np.float64).tiny)
            v = grad / a
            grad = v / (np.linalg.norm(v, axis=(1, 2), keepdims=True) + eps / a)
        W = W - lr * grad
    history = recorder.history()
    warn_nonfinite("train_ntp", W, history["loss"])
    return NTPTrainResult(
        W=W,
        history=history,
        seeds=np.asarray(seeds, dtype=np.int64),
        loss=str(loss),
        lr=lr,
        normalized=bool(normalized),
        steps=steps,
    )


@dataclass(frozen=True)
class WFinResult:
    """The finite component (module doc): ``W`` (d, d) in ``S_fin``, the reduced ``loss`` there, the
    gradient norm on ``S_fin`` (the first-order certificate of this convex problem), iterations, and
    ``converged`` (gradient norm ≤ tol)."""

    W: NDArray[np.float64]
    loss: float
    grad_norm: float
    n_iter: int
    converged: bool


def ntp_w_fin(
    problem: NextTokenProblem, basis: ArrayLike, *, tol: float = W_FIN_TOL, max_iter: int = 100
) -> WFinResult:
    """``W_fin = argmin_{W ∈ S_fin} L_red(W)`` (module doc), ``basis`` (m, d, d) orthonormal in S_fin
    (:func:`attsvm.svm.graph.fin_basis`). ``W_fin = 0`` when m = 0 (every SCC is one token)."""
    if not isinstance(problem, NextTokenProblem):
        raise TypeError(f"problem must be a NextTokenProblem, got {type(problem).__name__}")
    B = as_float_array(basis, "basis", ndim=3)
    d = problem.d
    if B.shape[1:] != (d, d):
        raise ValueError(f"basis must have shape (m, d, d) = (m, {d}, {d}), got {B.shape}")
    tol = check_finite_scalar(tol, "tol", positive=True)
    max_iter = check_positive_int(max_iter, "max_iter")
    batch = ntp_batch(problem, valid=[problem.scc_positions()])
    m = B.shape[0]
    if m == 0:
        risk, _ = ntp_loss_and_grad(batch, np.zeros((1, d, d)))
        return WFinResult(np.zeros((d, d)), float(risk[0]), 0.0, 0, True)
    J = np.einsum("ntd,mde,ne->ntm", batch.X[0], B, batch.Z[0])  # (n, T, m) ∂γ/∂c
    w = batch.weight[0]

    def fg(c: NDArray[np.float64]) -> tuple[float, NDArray[np.float64], NDArray[np.float64]]:
        risk, grad = ntp_loss_and_grad(batch, np.einsum("m,mij->ij", c, B)[None])
        return float(risk[0]), np.einsum("ij,mij->m", grad[0], B), grad[0]

    c = np.zeros(m)
    f, gc, _ = fg(c)
    it = 0
    for it in range(1, max_iter + 1):
        if np.linalg.norm(gc) <= tol:
            it -= 1
            break
        g = J @ c  # (n, T) logits γ on S_fin
        _, s = _lse(g, batch.valid[0])
        Js = np.einsum("nt,ntm->nm", s, J)
        H = np.einsum("n,nt,nta,ntb->ab", w, s, J, J) - np.einsum("n,na,nb->ab", w, Js, Js)
        try:
            step = np.linalg.solve(H + 1e-14 * np.trace(H) * np.eye(m), gc)
        except np.linalg.LinAlgError:
            step = np.linalg.lstsq(H, gc, rcond=None)[0]
        t = 1.0
        while True:  # backtracking (Armijo)
            f_new, g_new, _ = fg(c - t * step)
            if f_new <= f - 1e-4 * t * float(gc @ step) or t < 1e-12:
                break
            t *= 0.5
        c, f, gc = c - t * step, f_new, g_new
    Wf = np.einsum("m,mij->ij", c, B)
    gn = float(np.linalg.norm(gc))
    return WFinResult(Wf, f, gn, it, gn <= tol)
