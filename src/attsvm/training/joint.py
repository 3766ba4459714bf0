"""Joint training of the attention weights W and the linear head v by ℓp mirror descent (docs/spec.md §8).

The model is the paper's ``f(X) = vᵀ Xᵀ softmax(X W z)`` (docs/spec.md §1) with *both* W (d, d) and
v (d,) trained on the logistic loss ``(1/n) Σ log(1 + e^{−y_i f(X_i)})``. Each group takes the ℓp
mirror step of :func:`attsvm.training.optim.mirror_descent` (``ψ = ‖·‖_p^p/p``), optionally normalised
by the dual norm of its gradient, as in the mirror-descent analysis of attention (AttentionMD): W
converges in direction to the ℓp-AttSVM of the tokens it selects, and v to the ℓp max-margin
classifier ``min ‖v‖_p s.t. y_i vᵀ x_{iα_i} ≥ 1`` of the selected tokens (:func:`head_svm_constraints`).

Runs are batched: R problems of equal shape train as one tensor program, each run from its own seeded
generator (a run never depends on its batch). The loss is written with ``softplus`` and ``log_softmax``
so that huge norms give no NaN or inf.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray

from .._validation import check_bool, check_finite_scalar, check_positive_int, warn_nonfinite
from ..model import as_problem_list
from ..problem import AttentionProblem
from ..svm import ConstraintSet
from .init import run_seeds
from .optim import NORMALIZE_EPS, MirrorMap, NormalizeByDualNorm, StepSize, chain
from .recording import Trajectory

__all__ = ["JointResult", "train_joint", "joint_risk", "head_svm_constraints"]


@dataclass
class JointResult:
    """The outcome of :func:`train_joint` for R runs.

    W (R, d, d), v (R, d): final parameters; selected (R, n): argmax of the final softmax;
    history: ``step`` (S,), ``loss`` (R, S), ``W`` (R, S, d, d), ``v`` (R, S, d);
    problems, seeds, p, lr, normalized, steps: the settings.
    """

    W: NDArray[np.float64]
    v: NDArray[np.float64]
    selected: NDArray[np.int64]
    history: dict[str, NDArray]
    problems: list[AttentionProblem]
    seeds: NDArray[np.int64]
    p: float
    lr: float
    normalized: bool
    steps: int


def head_svm_constraints(problem: AttentionProblem, tokens: Sequence[int] | NDArray[np.int64]) -> ConstraintSet:
    """The head's max-margin problem ``min ‖v‖ s.t. y_i vᵀ x_{iα_i} ≥ 1`` as a :class:`ConstraintSet`.

    Written as a (d, 1) matrix ``v`` with rows ``a_i = y_i x_{iα_i}`` and queries ``z_i = 1``, so any
    :class:`~attsvm.svm.AttentionSVM` norm solves it (``norm="lp"`` gives v's ℓp SVM, docs/spec.md §8).
    """
    if not isinstance(problem, AttentionProblem):
        raise TypeError(f"problem must be an AttentionProblem, got {type(problem).__name__}")
    alpha = problem.check_tokens(tokens)
    n = problem.n
    A = (problem.y[:, None] * problem.X[np.arange(n), alpha])[:, None, :]  # (n, 1, d)
    return ConstraintSet(A, np.ones((n, 1)), np.ones((n, 1), dtype=bool))


def joint_risk(X: torch.Tensor, Z: torch.Tensor, y: torch.Tensor, W: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The logistic risks (R,) of batched tokens X (R, n, T, d), queries Z (R, n, d), labels y (R, n),
    attention weights W (R, d, d) and heads v (R, d) (module doc), differentiable by autograd."""
    logits = torch.einsum("rntd,rde,rne->rnt", X, W, Z)
    s = torch.softmax(logits, dim=-1)
    out = torch.einsum("rnt,rntd,rd->rn", s, X, v)
    return torch.nn.functional.softplus(-y * out).mean(dim=-1)


def train_joint(
    problems: AttentionProblem | Sequence[AttentionProblem],
    *,
    p: float,
    steps: int,
    lr: float = 0.1,
    normalized: bool = True,
    seed: int | Sequence[int] = 0,
    init_scale: float = 1.0,
    record_every: int = 10,
    eps: float = NORMALIZE_EPS,
) -> JointResult:
    """Train (W, v) jointly by ℓp mirror descent on R problems as one batched program (module doc).

    Parameters
    ----------
    problems : AttentionProblem or list of R of them (equal n, T, d); their heads give only the
        initial scale: v starts from ``init_scale``·U(−1/√d, 1/√d) like W.
    p : the mirror-descent exponent, 1 < p < ∞ (p = 2 is GD).
    steps, lr : number and size of the steps.
    normalized : divide each group's gradient by its dual norm ``‖g‖_q + eps`` first.
    seed : per-run generator seeds (an int s gives s, s+1, …).
    record_every : stride of the recorded trajectory (the final step is always recorded).
    """
    plist = as_problem_list(problems)
    p = check_finite_scalar(p, "p")
    if p <= 1:
        raise ValueError(f"p must be > 1 (ψ = ‖θ‖_p^p/p), got {p}")
    steps = check_positive_int(steps, "steps", minimum=0)
    lr = check_finite_scalar(lr, "lr", positive=True)
    record_every = check_positive_int(record_every, "record_every")
    init_scale = check_finite_scalar(init_scale, "init_scale", positive=True)
    normalized = check_bool(normalized, "normalized")
    R = len(plist)
    d = plist[0].d
    for i, q in enumerate(plist[1:], start=1):
        if (q.n, q.T, q.d) != (plist[0].n, plist[0].T, d):
            raise ValueError(
                f"problems must share (n, T, d): problems[0] has {(plist[0].n, plist[0].T, d)}, "
                f"problems[{i}] has {(q.n, q.T, q.d)}"
            )
    seeds = run_seeds(seed, R)
    dt = torch.float64
    X = torch.as_tensor(np.stack([q.X for q in plist]), dtype=dt)
    Z = torch.as_tensor(np.stack([q.queries for q in plist]), dtype=dt)
    y = torch.as_tensor(np.stack([q.y for q in plist]), dtype=dt)
    W0, v0 = [], []
    for s in seeds:
        g = torch.Generator().manual_seed(int(s))
        b = init_scale / np.sqrt(d)
        W0.append((torch.rand((d, d), generator=g, dtype=dt) * 2 - 1) * b)
        v0.append((torch.rand((d, 1), generator=g, dtype=dt) * 2 - 1) * b)
    params: tuple[torch.Tensor, ...] = (torch.stack(W0), torch.stack(v0))
    parts = [NormalizeByDualNorm(p, eps)] if normalized else []
    rule = chain(*parts, StepSize(np.full(R, lr)), MirrorMap(p))
    state = rule.init(params)
    recorder = Trajectory(steps, record_every, R)
    for k in range(steps + 1):
        W, v = (t.detach().requires_grad_(True) for t in params)
        loss = joint_risk(X, Z, y, W, v[..., 0])
        if k == recorder.next_step:
            recorder.record(loss=loss.detach().numpy(), W=W.detach().numpy(), v=v.detach().numpy()[..., 0])
        if k == steps:
            break
        gW, gv = torch.autograd.grad(loss.sum(), (W, v))
        with torch.no_grad():
            upd, state = rule.update((gW, gv), state, params, loss=loss.detach(), step=k)
            params = tuple(t + u for t, u in zip(params, upd))
    Wf, vf = (t.detach() for t in params)
    history = recorder.history()
    # (p close to 1: the mirror map's exponent 1/(p − 1) sends the iterate past the float64 range)
    warn_nonfinite(f"train_joint(p={p})", Wf.numpy(), vf.numpy(), history["loss"])
    logits = torch.einsum("rntd,rde,rne->rnt", X, Wf, Z)
    return JointResult(
        W=Wf.numpy(),
        v=vf.numpy()[..., 0],
        selected=logits.argmax(dim=-1).numpy().astype(np.int64),
        history=history,
        problems=plist,
        seeds=np.asarray(seeds, dtype=np.int64),
        p=p,
        lr=lr,
        normalized=bool(normalized),
        steps=steps,
    )
