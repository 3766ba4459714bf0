"""Gradient-based training of one-layer attention, batched over runs (docs/spec.md §4).

:func:`train` runs R independent trainings — several instances and/or several initialisations — as one
batched float64 tensor program on CPU or CUDA. Its three parts are values passed in:

* the parameterisation (:class:`~attsvm.model.FullW` or :class:`~attsvm.model.FactoredKQ`): the trained
  groups, their weights ``W``, the chain rule from ``∇_W L`` and the initialisations;
* the update rule (:mod:`attsvm.training.optim`): a chain of transforms — penalty, normalisation, step
  size, mirror map, Polyak step — applied to the groups' gradients;
* the recording options (:class:`~attsvm.training.recording.Recording`).

Gradients are analytic and round-off stable (:func:`attsvm.model.risk_and_scaled_grad`), so long
normalized runs keep their direction after the loss saturates. The history a run records is documented
on :class:`TrainResult`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray

from .._validation import check_choice, check_finite_scalar, check_positive_int
from ..model import (
    AttentionModel,
    Batch,
    Param,
    Parameterization,
    as_problem_list,
    check_device,
    check_gradient_scale,
    excess_risk_scaled,
    parameterization,
    risk_and_scaled_grad,
)
from ..problem import AttentionProblem, loss_fn
from .bounds import gradient_bound, smoothness_bound
from .init import initial_params, run_seeds
from .optim import (
    ADAM_EPS,
    ADAM_LR,
    NORMALIZE_EPS,
    NORMALIZED_LR,
    AddPenalty,
    Chain,
    MirrorMap,
    NormalizeByDualNorm,
    NormalizeByNorm,
    Orthogonalize,
    PolyakStep,
    ScaleByAdam,
    SignDirection,
    StepSize,
    TopSingular,
    Transform,
    chain,
)
from .recording import Recorder, Recording
from .span import compiled_loop_applies, span_is_cheaper, span_kernel, span_plan, span_well_conditioned, train_span

__all__ = ["train", "TrainResult", "threads_context", "SMALL_PROBLEM_ELEMENTS", "PROGRESS_MIN_WORK"]

# Below this many (R·n·T·d) elements one intra-op thread is faster than several on CPU (tiny tensors
# spend their time synchronising threads).
SMALL_PROBLEM_ELEMENTS = 2_000_000
# Runs longer than this many (steps × runs) show a progress bar when progress=None and stderr is a tty.
PROGRESS_MIN_WORK = 200_000


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
        with e = ``record.every``, plus the final step). S = number of records. Which entries exist is
        set by :class:`~attsvm.training.Recording` (default: all summaries, no trajectories).

        * ``step`` (S,) int: the update count k of each record (k = 0 is the initialisation).
        * ``loss`` (R, S): the data risk ``L(W(k))`` (without the (K, Q) penalty).
        * ``W_norm`` (R, S): ``‖W(k)‖_F`` (of ``K Qᵀ`` for param ``"KQ"``).
        * ``grad_norm`` (R, S): norm of the gradient of the data risk w.r.t. the trained parameters:
          ``‖∇_W L‖_F``, or ``(‖∇_K L‖_F² + ‖∇_Q L‖_F²)^{1/2}`` for ``"KQ"``.
        * ``max_prob`` (R, S, n): ``max_t s_it`` per sequence.
        * ``selected`` (R, S, n) int: ``argmax_t s_it`` per sequence.
        * ``K_norm``, ``Q_norm`` (R, S): factor norms, param ``"KQ"`` only.
        * ``W`` (R, S, d, d): ``W(k)`` itself, only with ``record_W=True`` / ``Recording(W=True)``.
        * ``K``, ``Q`` (R, S, d, m): the factors, only with ``Recording(params=True)``.
        * ``probs`` (R, S, n, T): the attention, only with ``Recording(probs=True)``.
    problems : list of AttentionProblem
        The instances; run r trained on ``problems[problem_index[r]]``.
    problem_index : ndarray (R,) int
    seeds : ndarray (R,) int
        The per-run initialisation seeds.
    lr : ndarray (R,) or str
        The step of every run (``"schedule"`` for a callable, ``"adaptive"`` for an update rule without
        a :class:`~attsvm.training.optim.StepSize`).
    param, steps, normalized, loss, init, penalty, m, record_every, device : the settings used.
    wall_time : float
        Seconds spent in the training loop.
    optimizer : Transform
        The update rule (:mod:`attsvm.training.optim`).
    record : Recording
        The recording options.
    parameterization : Parameterization
        :class:`~attsvm.model.FullW` or :class:`~attsvm.model.FactoredKQ`.
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
    optimizer: Transform | None = None
    record: Recording | None = None
    parameterization: Parameterization | None = None

    @property
    def n_runs(self) -> int:
        return int(self.W.shape[0])

    @property
    def selected(self) -> NDArray[np.int64]:
        """Final selected tokens ``argmax_t s_it``, shape (R, n)."""
        return np.argmax(self.probs, axis=-1).astype(np.int64)

    @property
    def final_loss(self) -> NDArray[np.float64]:
        """``L(W)`` at the last record, shape (R,) (needs ``"loss"`` among the recorded quantities)."""
        if "loss" not in self.history:
            raise AttributeError(
                "final_loss needs the recorded loss: train with Recording(quantities=...) including 'loss'"
            )
        return self.history["loss"][:, -1]

    def problem(self, run: int) -> AttentionProblem:
        """The instance run ``run`` trained on."""
        run = check_positive_int(run, "run", minimum=0)
        if run >= self.n_runs:
            raise ValueError(f"run must be in [0, {self.n_runs}), got {run}")
        return self.problems[int(self.problem_index[run])]

    def to_model(self) -> AttentionModel:
        """The final state as an :class:`~attsvm.model.AttentionModel` (R runs, float64, CPU)."""
        par = self.parameterization or parameterization(
            cast(Literal["W", "KQ"], self.param),
            self.W.shape[-1],
            self.m if self.param == "KQ" else None,
        )
        model = AttentionModel(par.d, param=par, runs=self.n_runs)
        return model.load([getattr(self, g) for g in par.groups])

    def trajectory_arrays(self) -> dict[str, NDArray]:
        """Flat dict of arrays (final state, settings and ``history/…``) for ``np.savez``."""
        out: dict[str, NDArray] = {
            "W": self.W,
            "probs": self.probs,
            "problem_index": self.problem_index,
            "seeds": self.seeds,
            "param": np.array(self.param),
            "steps": np.array(self.steps),
            "normalized": np.array(self.normalized),
            "loss": np.array(self.loss),
            "init": np.array(self.init),
            "penalty": np.array(self.penalty),
            "m": np.array(self.m),
            "lr": np.asarray(self.lr) if not isinstance(self.lr, str) else np.array(self.lr),
        }
        if self.K is not None and self.Q is not None:
            out["K"], out["Q"] = self.K, self.Q
        for k, v in self.history.items():
            out[f"history/{k}"] = v
        return out


@contextmanager
def threads_context(n: int | None) -> Iterator[None]:
    """torch intra-op threads set to n inside the block (restored after); None leaves them."""
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


LrSpec = Literal["auto"] | float | ArrayLike | Callable[[int], Any]


def _min_risk(problems: list[AttentionProblem], loss: str) -> NDArray[np.float64]:
    """The infimum over W of each problem's risk, for Polyak's step (docs/spec.md §8): with a linear
    head, ``y_i vᵀo_i`` over the simplex is largest at the best token, so L* = mean_i ℓ(max_t γ_it)."""
    out = []
    for p in problems:
        if p.head.kind != "linear":
            raise ValueError(
                "lr='polyak' needs the infimum of the risk, known in closed form for the linear head only; "
                f"got a {p.head.kind} head (pass optimizer=attsvm.training.optim.polyak(min_loss=...))"
            )
        out.append(float(np.mean(loss_fn(loss, p.scores.max(axis=1)))))
    return np.asarray(out)


def _keyword_rule(
    par: Parameterization,
    *,
    lr: LrSpec,
    normalized: bool | None,
    penalty: float | None,
    normalize_eps: float | None,
    runs: int,
    LW: Callable[[], NDArray[np.float64]],
    GW: Callable[[], NDArray[np.float64]],
    params0: tuple[NDArray[np.float64], ...],
    mirror_p: float | None = None,
    min_risk: Callable[[], NDArray[np.float64]] | None = None,
) -> Chain:
    """The update rule of the keyword arguments ``lr``, ``normalized``, ``penalty``, ``normalize_eps``
    (and, for ``optimizer="md"``, ``p``: ℓp mirror descent, normalised by the dual norm).
    ``lr="polyak"``: Polyak's step with L* = ``min_risk()`` (R,), the infimum of each run's risk."""
    if isinstance(lr, str) and lr == "polyak":
        if mirror_p is not None:
            raise ValueError("lr='polyak' is a gradient step; optimizer='md' takes a float, R floats or a schedule")
        if normalized:
            raise ValueError("lr='polyak' sets the step from the loss and the gradient: it is not normalized "
                             "(leave normalized unset or pass normalized=False)")  # fmt: skip
        if min_risk is None:
            raise ValueError("lr='polyak' needs the infimum of the risk")
        lam0 = 0.0 if penalty is None else check_finite_scalar(penalty, "penalty")
        if lam0:
            raise ValueError("lr='polyak' takes no penalty: L* is the infimum of the unpenalised risk")
        min_risk()  # (checks that every head is linear)
        return chain(PolyakStep(excess=True))
    normalized = True if normalized is None else normalized
    if not isinstance(normalized, (bool, np.bool_)):
        raise TypeError(f"normalized must be a bool, got {type(normalized).__name__}")
    lam = _penalty(par, penalty)
    eps = NORMALIZE_EPS if normalize_eps is None else check_finite_scalar(normalize_eps, "normalize_eps")
    if eps < 0:
        raise ValueError(f"normalize_eps must be >= 0, got {eps}")
    step: Any
    if callable(lr):
        step = lr
    elif isinstance(lr, str):
        check_choice(lr, "lr", ("auto", "polyak"))
        step = np.full(runs, NORMALIZED_LR) if normalized else par.auto_step(LW(), GW(), params0)
        if not (np.all(np.isfinite(step)) and np.all(step > 0)):
            rule, uses_GW = _AUTO_STEP_RULES.get(par.name, (f"{type(par).__name__}.auto_step(L_W, G_W)", True))
            values = f"L_W {np.asarray(LW())!r}" + (f", G_W {np.asarray(GW())!r}" if uses_GW else "")
            raise ValueError(
                f"lr='auto' for plain GD is {rule}, which gives no positive finite step for these data "
                f"(steps {np.asarray(step)!r}; {values}): pass lr= explicitly, or normalized=True"
            )
    else:
        step = _explicit_lr(lr, runs)
    parts: list[Transform] = [AddPenalty(lam)] if lam else []
    if normalized:
        parts.append(NormalizeByNorm(eps) if mirror_p is None else NormalizeByDualNorm(mirror_p, eps))
    if mirror_p is None:
        return chain(*parts, StepSize(step))
    return chain(*parts, StepSize(step), MirrorMap(mirror_p))


def _penalty(par: Parameterization, penalty: float | None) -> float:
    """The ridge coefficient: the parameterisation's published one when ``penalty`` is None, else a float >= 0."""
    if penalty is None:
        return par.published_penalty
    lam = check_finite_scalar(penalty, "penalty")
    if lam < 0:
        raise ValueError(f"penalty must be >= 0, got {lam}")
    return lam


def _explicit_lr(lr: Any, runs: int) -> NDArray[np.float64]:
    """A positive float or R positive floats as the (R,) steps (ValueError naming lr otherwise)."""
    arr = np.asarray(lr, dtype=np.float64) if not isinstance(lr, (bool, str)) else None
    if arr is None or arr.shape not in ((), (runs,)) or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(
            f"lr must be 'auto', 'polyak', a positive float, {runs} positive floats (one per run) or a "
            f"callable step -> float; got {lr!r}"
        )
    return np.broadcast_to(arr, (runs,)).copy()


# optimizer= names: the trainer's own rules, and the steepest descents of other norms and Adam
OPTIMIZERS = ("gd", "md", "sign", "adam", "muon", "nuclear")


def _named_rule(
    name: str,
    par: Parameterization,
    *,
    lr: LrSpec,
    normalized: bool | None,
    penalty: float | None,
    normalize_eps: float | None,
    runs: int,
) -> Chain:
    """The update rule of ``optimizer="sign" | "adam" | "muon" | "nuclear"`` from ``lr``, ``normalized``,
    ``penalty`` and ``normalize_eps`` (Adam's ε); see :func:`train`."""
    if name == "adam":
        if normalized is not None:
            raise ValueError("normalized does not apply to optimizer='adam' (its step is m̂/(√v̂ + ε)); leave it unset")
    elif normalize_eps is not None:
        raise ValueError(f"normalize_eps applies to optimizer='gd', 'md' and 'adam', not {name!r}; leave it unset")
    lam = _penalty(par, penalty)
    unit = True if normalized is None else normalized
    if not isinstance(unit, (bool, np.bool_)):
        raise TypeError(f"normalized must be a bool, got {type(unit).__name__}")
    step: Any
    if callable(lr):
        step = lr
    elif isinstance(lr, str):
        if lr == "polyak":
            raise ValueError(f"lr='polyak' is a gradient step; optimizer={name!r} takes 'auto', a float or a schedule")
        check_choice(lr, "lr", ("auto",))
        if not unit:
            raise ValueError(
                f"lr='auto' needs normalized=True for optimizer={name!r}: pass lr= for the dual-norm-scaled steps"
            )
        step = np.full(runs, ADAM_LR if name == "adam" else NORMALIZED_LR)
    else:
        step = _explicit_lr(lr, runs)
    core: Transform
    if name == "adam":
        eps = ADAM_EPS if normalize_eps is None else check_finite_scalar(normalize_eps, "normalize_eps")
        if eps < 0:
            raise ValueError(f"normalize_eps must be >= 0, got {eps}")
        core = ScaleByAdam(eps=eps)
    elif name == "sign":
        core = SignDirection(normalized=bool(unit))
    elif name == "muon":
        core = Orthogonalize(normalized=bool(unit))
    else:
        core = TopSingular(normalized=bool(unit))
    parts: list[Transform] = [AddPenalty(lam)] if lam else []
    return chain(*parts, core, StepSize(step))


# What lr='auto' is for plain GD per parameterisation (Parameterization.auto_step) and whether it uses
# the gradient bound G_W besides L_W, for its error message
_AUTO_STEP_RULES = {
    "W": ("1/L_W from the smoothness bound L_W", False),
    "KQ": (
        "1/(L_W·B + G_W) with B = max(1, ‖K₀‖_F² + ‖Q₀‖_F²) from the smoothness and gradient bounds L_W, G_W",
        True,
    ),
}


def _recording(record: Recording | None, record_every: int | None, record_W: bool | None) -> Recording:
    if record is None:
        every = 1 if record_every is None else check_positive_int(record_every, "record_every")
        if record_W is not None and not isinstance(record_W, (bool, np.bool_)):
            raise TypeError(f"record_W must be True, False or None, got {type(record_W).__name__} {record_W!r}")
        return Recording(every=every, W=bool(record_W))
    if not isinstance(record, Recording):
        raise TypeError(f"record must be a Recording, got {type(record).__name__}")
    if record_every is not None or record_W is not None:
        raise ValueError(
            "record= replaces record_every and record_W; set them on the Recording "
            f"(got record_every={record_every!r}, record_W={record_W!r})"
        )
    return record


def _transforms(rule: Transform) -> list[Transform]:
    return rule.find(Transform) if isinstance(rule, Chain) else [rule]


def train(
    problems: AttentionProblem | Sequence[AttentionProblem],
    *,
    param: Param | Parameterization = "W",
    steps: int,
    lr: LrSpec = "auto",
    normalized: bool | None = None,
    loss: str | None = None,
    init: Any = "pytorch",
    init_scale: float | None = None,
    m: int | None = None,
    n_init: int = 1,
    seed: int | Sequence[int] = 0,
    record_every: int | None = None,
    record_W: bool | None = None,
    device: torch.device | str | None = None,
    penalty: float | None = None,
    cone_center: ArrayLike | None = None,
    cone_mu: float = 0.1,
    normalize_eps: float | None = None,
    threads: int | None = None,
    progress: bool | None = None,
    dtype: torch.dtype = torch.float64,
    optimizer: Transform | Literal["gd", "md", "sign", "adam", "muon", "nuclear"] | None = None,
    record: Recording | None = None,
    p: float | None = None,
    space: Literal["auto", "dense", "span"] = "auto",
) -> TrainResult:
    """Train R one-layer attention models by (normalized) gradient descent, as one batched program (docs/spec.md §4).

    Parameters
    ----------
    problems : AttentionProblem or list of P of them
        Instances sharing n, T, d and the head kind/shape. There are ``R = P · n_init`` runs; run r
        trains on ``problems[r // n_init]``.
    param : {"W", "KQ"} or Parameterization
        Train W directly, or K, Q (d, m) with W = K Qᵀ (:func:`attsvm.model.parameterization`).
    steps : int
        Number of updates.
    lr : "auto", float, array (R,) or callable
        Step size η. ``"auto"``: 0.1 for normalized GD (the paper's); for plain GD the
        parameterisation's :meth:`~attsvm.model.Parameterization.auto_step`: ``1/L_W`` per run from
        :func:`smoothness_bound` for W, ``1/(L_W·B + G_W)`` with ``B = max(1, ‖K₀‖_F² + ‖Q₀‖_F²)`` for
        (K, Q) — a bound valid while ``‖K‖_F² + ‖Q‖_F² ≤ B`` (the (K, Q) objective is not globally
        smooth). A callable ``lr(k)`` gives the step of update k (a float or an (R,) array).
    normalized : bool
        Default True: ``W ← W − η ∇/(‖∇‖_F + eps)`` per run (eps = float64 machine epsilon, as the
        published code); for (K, Q) each factor's gradient is normalised separately. False: plain GD
        ``W ← W − η ∇``.
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
        Record stride e (default 1; see :class:`TrainResult`); the final state is always recorded.
        Shorthand for ``record=Recording(every=e)``.
    record_W : bool
        Also record ``W(k)`` (R·S·d² floats); shorthand for ``Recording(W=True)``.
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
    optimizer : Transform, optional
        The update rule (:mod:`attsvm.training.optim`), e.g. ``optim.mirror_descent(p=3, lr=0.1)`` or
        ``optim.polyak()``; it replaces ``lr``, ``normalized``, ``penalty`` and ``normalize_eps``, which
        otherwise build ``chain(AddPenalty(λ), NormalizeByNorm(ε), StepSize(η))``. A rule of degree 0
        (scale-free in the gradient) is fed ``e^{c}∇L`` instead of ``∇L`` (same direction, never
        underflows).
        ``"gd"`` is the default rule; ``"md"`` is ℓp mirror descent (docs/spec.md §8) with exponent ``p``,
        built from ``lr``, ``normalized`` (by the dual norm ``‖∇L‖_q``), ``penalty`` and ``normalize_eps``
        like the default; it is applied to W, or to each of K and Q.
        The steepest descents of other norms and Adam, each applied to W or to each of K and Q, built from
        ``lr`` (``"auto"``: 0.1, or Adam's 1e-3), ``penalty`` (default as above) and:

        * ``"sign"``: sign descent ``−η sign(∇)`` (ℓ∞), :func:`~attsvm.training.optim.sign_descent`;
        * ``"muon"``: ``−η U Vᵀ``, the exact polar factor of ``∇ = U Σ Vᵀ`` (spectral norm),
          :func:`~attsvm.training.optim.muon`;
        * ``"nuclear"``: ``−η u₁v₁ᵀ``, the top singular pair of ∇ (nuclear norm),
          :func:`~attsvm.training.optim.nuclear_sd`;
        * ``"adam"``: ``torch.optim.Adam`` with betas (0.9, 0.999) and ``ε = normalize_eps``
          (default 1e-8; 0 is the ℓ∞-bias variant), :func:`~attsvm.training.optim.adam`.

        For ``"sign"``, ``"muon"`` and ``"nuclear"``, ``normalized=False`` multiplies the step by the
        dual norm of ∇ (``‖∇‖₁``, ``‖∇‖_*``, ``‖∇‖₂``: Gunasekar et al.'s un-normalised steepest descent,
        with an explicit ``lr``). Other hyper-parameters (Adam's betas, Newton–Schulz for Muon) are
        options of those functions, whose chains are passed as ``optimizer=`` directly.
    record : Recording, optional
        What to record and how often; replaces ``record_every`` and ``record_W``.
    p : float, optional
        The exponent of ``optimizer="md"`` (1 < p < ∞); p = 2 is gradient descent.
    space : {"auto", "dense", "span"}
        Where the iterates live. ``"dense"``: W (R, d, d) itself. ``"span"``: the N = nT coefficients of
        ``W = W₀ + Σ_it β_it x_it z_iᵀ`` (:mod:`attsvm.training.span`, docs/spec.md §4), for W trained
        by plain or normalized GD; the same iterates up to round-off, at O(N²) instead of O(n d²) per
        step. ``"auto"`` (default) takes the span form where it applies, in float64, where it is cheaper
        and every instance's data kernel is finite and well-conditioned. ``result.info["space"]`` says
        which ran.

    Returns
    -------
    TrainResult
    """
    plist = as_problem_list(problems)
    if isinstance(param, str):
        check_choice(param, "param", ("W", "KQ"))
    check_choice(space, "space", ("auto", "dense", "span"))
    steps = check_positive_int(steps, "steps", minimum=0)
    n_init = check_positive_int(n_init, "n_init")
    rec = _recording(record, record_every, record_W)
    if dtype not in (torch.float64, torch.float32):
        raise ValueError(f"dtype must be torch.float64 or torch.float32, got {dtype}")
    dev = check_device(device)
    P = len(plist)
    R = P * n_init
    check_gradient_scale(plist)
    batch = Batch.from_problems(plist, loss=loss, repeat=n_init, device=dev, dtype=dtype)
    n, T, d = plist[0].n, plist[0].T, plist[0].d
    par = parameterization(param, d, m)
    seeds = run_seeds(seed, R)
    problem_index = np.repeat(np.arange(P, dtype=np.int64), n_init)
    params0 = initial_params(
        par, init, runs=R, seeds=seeds, init_scale=init_scale, cone_center=cone_center, cone_mu=cone_mu
    )
    mirror_p: float | None = None
    named: Chain | None = None
    if isinstance(optimizer, str):
        check_choice(optimizer, "optimizer", OPTIMIZERS)
        if p is not None and optimizer != "md":
            raise ValueError(f"p={p!r} applies to optimizer='md' only")
        if optimizer not in ("gd", "md"):
            named = _named_rule(
                optimizer,
                par,
                lr=lr,
                normalized=normalized,
                penalty=penalty,
                normalize_eps=normalize_eps,
                runs=R,
            )
        if optimizer == "md":
            if p is None:
                raise ValueError("optimizer='md' needs p, the exponent of ψ(W) = ‖W‖_p^p/p (1 < p < inf)")
            mirror_p = check_finite_scalar(p, "p")
            if mirror_p <= 1:
                raise ValueError(f"p must be > 1 for optimizer='md' (ψ = ‖W‖_p^p/p strictly convex), got {p!r}")
        optimizer = None
    elif p is not None:
        raise ValueError(f"p={p!r} applies to optimizer='md' only")
    if named is not None:
        rule: Transform = named
    elif optimizer is None:
        rule = _keyword_rule(
            par,
            lr=lr,
            normalized=normalized,
            penalty=penalty,
            normalize_eps=normalize_eps,
            runs=R,
            LW=lambda: np.array([smoothness_bound(p, batch.loss) for p in plist])[problem_index],
            GW=lambda: np.array([gradient_bound(p, batch.loss) for p in plist])[problem_index],
            params0=params0,
            mirror_p=mirror_p,
            min_risk=lambda: _min_risk(plist, batch.loss)[problem_index],
        )
    else:
        if not isinstance(optimizer, Transform):
            raise TypeError(
                f"optimizer must be 'gd', 'md' or a Transform (attsvm.training.optim), or one of 'sign', 'adam', "
                f"'muon', 'nuclear'; got {type(optimizer).__name__}"
            )
        given = [
            name
            for name, was_given in (
                ("lr", not (isinstance(lr, str) and lr == "auto")),
                ("normalized", normalized is not None),
                ("penalty", penalty is not None),
                ("normalize_eps", normalize_eps is not None),
            )
            if was_given
        ]
        if given:
            raise ValueError(
                f"optimizer= replaces lr, normalized, penalty and normalize_eps; set them in the "
                f"update rule instead (got {', '.join(given)})"
            )
        rule = optimizer
    parts = _transforms(rule)
    steps_ = [t for t in parts if isinstance(t, StepSize)]
    lr_value: NDArray[np.float64] | str = steps_[0].values(R) if steps_ else "adaptive"
    norms_ = [t for t in parts if isinstance(t, NormalizeByNorm)]
    lam_ = float(sum(t.lam for t in parts if isinstance(t, AddPenalty)))

    params = tuple(torch.as_tensor(a, dtype=dtype, device=dev).clone() for a in params0)
    recorder = Recorder(rec, par, steps=steps, runs=R, n=n, T=T, dtype=dtype, device=dev)
    if threads is None:
        small = dev.type == "cpu" and R * n * T * d < SMALL_PROBLEM_ELEMENTS
        threads_used: int | None = 1 if small else None
    else:
        threads_used = check_positive_int(threads, "threads")
    show = progress if progress is not None else (None if steps * R >= PROGRESS_MIN_WORK else False)
    scale_free = rule.degree == 0.0
    wants_excess = any(isinstance(t, PolyakStep) and t.excess for t in parts)
    span = None
    if space != "dense" and not wants_excess:
        plan = span_plan(par, rule)
        # (auto: float64 only; in float32 the kernel products lose digits the dense step keeps)
        fast = plan is not None and compiled_loop_applies(batch, plan, params[0])
        auto_ok = dtype == torch.float64 and span_is_cheaper(n, T, d, rec.every, compiled=fast)
        if plan is not None and (space == "span" or auto_ok):
            with torch.no_grad():
                kern = span_kernel(batch)
            if space == "span" or span_well_conditioned(kern[2]):
                span = (plan, kern)
    if space == "span" and span is None:
        raise ValueError(
            "space='span' needs param='W' and an update rule that is plain or normalized GD with a step size "
            "(no penalty, mirror map or Polyak step)"
        )
    t0 = time.perf_counter()
    with threads_context(threads_used), torch.no_grad():
        from tqdm.auto import tqdm

        state = rule.init(params)
        bar = tqdm(
            total=steps,
            desc=f"train {par.name}",
            unit="step",
            disable=(None if show is None else not show),
            leave=False,
        )
        if span is not None:
            W, s = train_span(batch, params[0], span[0], steps=steps, recorder=recorder, kernel=span[1], bar=bar)
            params = (W,)
        for k in range(steps + 1 if span is None else 0):
            W = par.weights(params)
            L, gS, s, logc = risk_and_scaled_grad(batch, W)  # gS = e^{c} ∇_W L
            record_now = k == recorder.next_step
            if record_now or not scale_free:
                grads = par.grads(gS * torch.exp(-logc)[:, None, None], params)
                if record_now:
                    recorder.record(L, W, grads, params, s)
            if k == steps:
                break
            loss_in = excess_risk_scaled(batch, W) if wants_excess else L
            updates, state = rule.update(
                par.grads(gS, params) if scale_free else grads, state, params, loss=loss_in, step=k
            )
            params = tuple(p + u for p, u in zip(params, updates))
            bar.update(1)
        bar.close()
    wall = time.perf_counter() - t0
    history = recorder.history()
    final = {g: p.cpu().numpy() for g, p in zip(par.groups, params)}
    Wn = W.cpu().numpy().astype(np.float64)
    if not (np.all(np.isfinite(Wn)) and np.all(np.isfinite(history.get("loss", 0.0)))):
        warnings.warn(
            "training produced non-finite values (NaN/inf); check lr and the data", RuntimeWarning, stacklevel=2
        )
    init_name = init if isinstance(init, str) else ("given (K, Q)" if isinstance(init, tuple) else "given W")
    return TrainResult(
        W=Wn,
        K=final.get("K"),
        Q=final.get("Q"),
        probs=s.cpu().numpy(),
        history=history,
        problems=plist,
        problem_index=problem_index,
        seeds=seeds,
        lr=lr_value,
        param=par.name,
        steps=steps,
        normalized=bool(norms_),
        loss=batch.loss,
        init=init_name,
        penalty=lam_,
        m=getattr(par, "m", d),
        record_every=rec.every,
        device=str(dev),
        wall_time=wall,
        info={
            "threads": threads_used if threads_used is not None else torch.get_num_threads(),
            "normalize_eps": norms_[0].eps if norms_ else None,
            "space": "dense" if span is None else "span",
        },
        optimizer=rule,
        record=rec,
        parameterization=par,
    )
