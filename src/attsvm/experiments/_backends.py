"""Solvers and trainer the experiments call, behind one small interface.

The experiments need (i) the Frobenius and nuclear attention SVMs of SPEC §3 and the equality-
constrained SVM-eq / W_fin problems of SPEC §5, all phrased as a :class:`~attsvm.svm.ConstraintSet`,
and (ii) batched normalized gradient descent of SPEC §4 over many runs at once.

* Solvers: :func:`solve_constraints` is a thin wrapper over the project's certified
  :class:`attsvm.svm.AttentionSVM` (``fit_constraints``) — the only solver path. Its status and
  certificate (max violation, duality gap) are kept in the :class:`SVMResult`; an infeasible
  program is reported as ``status == "infeasible"`` with ``W is None``; solver errors propagate.
* Training: :func:`train_runs`, the paper's normalized GD batched over runs, via :func:`attsvm.train.train`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from .._validation import check_choice
from ..problem import AttentionProblem
from ..svm._base import ConstraintSet, att_svm_constraints

__all__ = ["SVMResult", "solve_constraints", "svm_solve", "train_runs", "TrainOutput"]

Norm = Literal["fro", "nuc"]
NORMS: tuple[str, ...] = ("fro", "nuc")


@dataclass
class SVMResult:
    """A solved attention SVM: ``W`` (None when infeasible), the solver's status and its certificate."""

    W: NDArray[np.float64] | None
    status: str
    max_violation: float
    objective: float
    duality_gap: float
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.W is not None and self.status == "optimal"


def solve_constraints(cs: ConstraintSet, norm: Norm = "fro") -> SVMResult:
    """Minimum-norm W under the constraints of ``cs`` (SPEC §3, §5), by :class:`attsvm.svm.AttentionSVM`.

    The estimator's status is kept as reported ("optimal", "optimal_inaccurate", "max_iter",
    "infeasible"); ``W`` is None exactly when the program is infeasible.
    """
    from ..svm import AttentionSVM

    check_choice(norm, "norm", NORMS)
    est = AttentionSVM(norm=norm).fit_constraints(cs)
    if est.status_ == "infeasible" or est.W_ is None:
        return SVMResult(None, str(est.status_), np.inf, np.nan, np.nan)
    return SVMResult(np.asarray(est.W_), str(est.status_), float(est.max_violation_), float(est.objective_),
                     float(est.duality_gap_), {"relative_gap": float(est.relative_gap_)})


def svm_solve(problem: AttentionProblem, tokens: NDArray[np.int64] | None, norm: Norm = "fro") -> SVMResult:
    """Att-SVM(α) (``norm="fro"``, W_mm) or Att-SVM* (``norm="nuc"``, W*_mm) of SPEC §3."""
    return solve_constraints(att_svm_constraints(problem, tokens), norm)


# ---------------------------------------------------------------------------- batched training
@dataclass
class TrainOutput:
    """Batched training record: final W (R, d, d), W at the recorded states (R, S, d, d), their update
    counts (S,), the mean-over-sequences top softmax probability (R, S), the final softmax (R, n, T)
    and the risk (R, S)."""

    W: NDArray[np.float64]
    W_hist: NDArray[np.float64]
    steps: NDArray[np.int64]
    sfx_max_mean: NDArray[np.float64]
    softmax: NDArray[np.float64]
    loss: NDArray[np.float64]


def train_runs(problems: list[AttentionProblem], *, param: Literal["W", "KQ"] = "W", steps: int = 2000,
               lr: float = 0.1, m: int | None = None, seeds: list[int] | None = None, init: Any = "pytorch",
               record_every: int = 10, init_scale: float | None = None) -> TrainOutput:
    """Normalized GD of SPEC §4 on R problems at once, through :func:`attsvm.train.train`.

    One batched float64 tensor program; ``W ← W − η ∇L/(‖∇L‖_F + ε)`` per run, per factor for
    (K, Q) with the published ε(‖K‖² + ‖Q‖²) penalty. Run r starts from its own generator seeded
    with ``seeds[r]`` (default 0..R−1), so a run never depends on the batch it is in. W is recorded
    after every ``record_every``-th update (k = 0 is the initialisation).
    """
    from ..train import train

    R = len(problems)
    seeds = list(range(R)) if seeds is None else [int(x) for x in seeds]
    res = train(problems, param=param, steps=steps, lr=lr, normalized=True, init=init, init_scale=init_scale,
                m=m, seed=seeds, record_every=record_every, record_W=True, progress=False, threads=1)
    h = res.history
    return TrainOutput(W=res.W, W_hist=h["W"], steps=np.asarray(h["step"], dtype=np.int64),
                       sfx_max_mean=h["max_prob"].mean(-1), softmax=res.probs, loss=h["loss"])
