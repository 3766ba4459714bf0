"""Per-layer diagnostics of a multi-layer attention model: the transformer as a hierarchy of SVMs
(docs/spec.md §8, "Depth").

Layer ℓ of :mod:`attsvm.training.depth` attends over the tokens X_i with the query ``z^{ℓ−1}_i`` that
the layers below produced. Its SVM is the Att-SVM of one-layer attention on those inputs, with the
tokens it selects (argmax of its attention): the problem ``(X_i, y_i, h, z^{ℓ−1}_i)`` of
:func:`layer_problem`. The inputs move while the layers below train, so two views are given:

* **final**: the inputs and the selection at the end of training; W_ℓ(k) is compared along training
  with that one SVM (:func:`layer_svms`, column ``corr_final`` of :func:`layer_trajectories`);
* **rolling**: at each recorded step k, the SVM of the inputs and selection *of step k* (a window of
  one checkpoint; column ``corr_rolling``), which tells whether the layer tracks its moving target.

A layer that keeps several tokens (soft selections) is compared with its SVM-equivalence instead
(:func:`layer_equivalence`, docs/spec.md §5).

:func:`settle_steps` reports, per layer, the step after which its selection no longer changes and the
step after which its direction stays within ``1 − τ`` of its final SVM: whether selections settle
before directions do, and in which order the layers settle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from numpy.typing import NDArray

from ._extras import require
from ._linalg import correlation
from ._validation import check_choice, check_finite_scalar
from .problem import AttentionProblem
from .svm import AttentionSVM
from .svm.equivalence import NORMS
from .training.depth import DeepResult, deep_forward

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["layer_problem", "layer_svms", "layer_equivalence", "layer_trajectories", "settle_steps"]


def _check_result(result: Any) -> DeepResult:
    if not isinstance(result, DeepResult):
        raise TypeError(f"result must be a DeepResult from train_deep, got {type(result).__name__}")
    return result


def _check(result: Any, run: int, layer: int) -> DeepResult:
    _check_result(result)
    for name, value in (("run", run), ("layer", layer)):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an integer index, got {type(value).__name__} {value!r}")
    R = result.W.shape[0]
    if not 0 <= run < R:
        raise ValueError(f"run must be in [0, {R}), got {run}")
    if not 0 <= layer < result.layers:
        raise ValueError(f"layer must be in [0, {result.layers}) (0-based), got {layer}")
    return result


def layer_problem(
    result: DeepResult, run: int, layer: int, queries: NDArray[np.float64] | None = None
) -> AttentionProblem:
    """The one-layer problem that layer ``layer`` (0-based) of run ``run`` solves: the run's tokens,
    labels and head, with the queries that layer read (final ones unless ``queries`` (n, d) is given)."""
    _check(result, run, layer)
    p = result.problems[min(run, len(result.problems) - 1)]
    Z = result.queries[run, layer] if queries is None else queries
    return AttentionProblem(p.X, p.y, p.head, Z=Z, loss=p.loss)  # type: ignore[arg-type]


def layer_svms(result: DeepResult, norm: str = "fro") -> list[list[AttentionSVM]]:
    """The final-view SVM of every run and layer (``[run][layer]``): ``norm`` ("fro" for W layers, "nuc"
    for (K, Q)) at the layer's final selection on its final inputs, fitted by one ``fit_many`` (so a nuclear
    W from its batch may differ from ``fit``'s within the certificate's tolerance). An infeasible one has
    status "infeasible" and its Farkas certificate."""
    _check_result(result)
    check_choice(norm, "norm", NORMS)
    fitted = _fit_layers(result, norm, result.selected, result.queries)
    L = result.layers
    return [fitted[r * L : (r + 1) * L] for r in range(result.W.shape[0])]


def _fit_layers(
    result: DeepResult, norm: str, selected: NDArray[np.int64], queries: NDArray[np.float64]
) -> list[AttentionSVM]:
    """The SVM of every (run, layer), run-major, at ``selected`` (R, L, n) on the queries (R, L, n, d), by one
    ``fit_many``: the batched routes where they apply, ``fit`` elsewhere."""
    pairs = [(r, ell) for r in range(result.W.shape[0]) for ell in range(result.layers)]
    problems = [layer_problem(result, r, ell, queries[r, ell]) for r, ell in pairs]
    return AttentionSVM(norm).fit_many(problems, [selected[r, ell] for r, ell in pairs])  # type: ignore[arg-type]


def layer_equivalence(
    result: DeepResult, run: int, layer: int, *, eps: float = 1e-3, norm: str = "fro"
) -> tuple[AttentionSVM, AttentionSVM]:
    """The SVM-equivalence of a layer (docs/spec.md §5) on its final inputs: the selected sets
    ``O_i = {t : s_it > eps}`` of the layer's final attention give ``(W^eq, W_fin)`` as fitted solvers
    (a layer that attends to several tokens is judged against W^eq rather than the single-token SVM)."""
    from .svm.equivalence import equivalence_constraints

    eps = check_finite_scalar(eps, "eps", positive=True)
    if not eps < 1:
        raise ValueError(f"eps must be in (0, 1) (a probability threshold), got {eps}")
    check_choice(norm, "norm", NORMS)
    p = layer_problem(result, run, layer)
    s = result.probs[run, layer]
    cs_eq, cs_fin = equivalence_constraints(p, s > eps, s)
    assert cs_fin is not None
    return AttentionSVM(norm).fit_constraints(cs_eq), AttentionSVM(norm).fit_constraints(cs_fin)  # type: ignore[arg-type]


def _queries_at(result: DeepResult, step_index: int) -> NDArray[np.float64]:
    """(R, L, n, d) the queries every layer read at recorded step ``step_index``."""
    probs = result.problems
    X = torch.as_tensor(np.stack([p.X for p in probs]))
    Z = torch.as_tensor(np.stack([p.queries for p in probs]))
    Ws = [torch.as_tensor(result.history["W"][:, step_index, ell]) for ell in range(result.layers)]
    with torch.no_grad():
        _, _, qs = deep_forward(X, Z, Ws)
    return np.stack([q.numpy() for q in qs], axis=1)


def layer_trajectories(result: DeepResult, norm: str = "fro", rolling: bool | Sequence[int] = True) -> pd.DataFrame:
    """Per run, layer and recorded step: ``corr_final`` (W_ℓ(k) against the final-view SVM),
    ``corr_rolling`` (against the SVM of step k's inputs and selection; NaN where that SVM has no
    solution, or at steps not in ``rolling``: True for every recorded step, False for none, or a list of
    recorded steps; a step that was not recorded is refused), ``changed`` (the selection differs from the
    final one), and the final SVM's status."""
    pd = require("pandas", feature="attsvm.hierarchy.layer_trajectories")
    _check_result(result)
    check_choice(norm, "norm", NORMS)
    R, L = result.W.shape[0], result.layers
    steps = result.history["step"]
    if isinstance(rolling, (bool, np.bool_)):
        roll = {int(k) for k in steps} if rolling else set()
    elif (
        isinstance(rolling, (Sequence, np.ndarray))
        and not isinstance(rolling, (str, bytes))
        and all(isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)) for k in rolling)
    ):
        roll = {int(k) for k in rolling}
        missing = sorted(roll - {int(k) for k in steps})
        if missing:
            raise ValueError(
                f"rolling must list recorded steps; {missing[:10]} were not recorded ({len(steps)} recorded steps: "
                + (f"{[int(k) for k in steps]})" if len(steps) <= 10 else f"{int(steps[0])} to {int(steps[-1])})")
            )
    else:
        raise TypeError(f"rolling must be True, False or a list of recorded steps (integers), got {rolling!r}")
    finals = layer_svms(result, norm)
    hist_sel = result.history["selected"]  # (R, S, L, n)
    rows = []
    for si, k in enumerate(steps):
        # the SVMs of this step's inputs and selections
        rolled = _fit_layers(result, norm, hist_sel[:, si], _queries_at(result, si)) if int(k) in roll else None
        for r in range(R):
            for ell in range(L):
                W = result.history["W"][r, si, ell]
                fin = finals[r][ell]
                row: dict[str, Any] = {
                    "run": r,
                    "layer": ell + 1,
                    "step": int(k),
                    "corr_final": float(correlation(W, fin.W_)) if fin.W_ is not None else np.nan,
                    "changed": bool(np.any(hist_sel[r, si, ell] != result.selected[r, ell])),
                    "final_status": str(fin.status_),
                    "corr_rolling": np.nan,
                }
                if rolled is not None:
                    svm = rolled[r * L + ell]
                    if svm.W_ is not None:
                        row["corr_rolling"] = float(correlation(W, svm.W_))
                rows.append(row)
    return pd.DataFrame(rows)


def settle_steps(traj: pd.DataFrame, tau: float = 0.99) -> pd.DataFrame:
    """Per run and layer: ``selection_settled`` (first recorded step from which the selection equals the
    final one) and ``direction_settled`` (first step from which corr_final ≥ τ stays; NaN if never)."""
    pd = require("pandas", feature="attsvm.hierarchy.settle_steps")
    need = ("run", "layer", "step", "changed", "corr_final")
    if not isinstance(traj, pd.DataFrame) or any(c not in traj.columns for c in need):
        raise TypeError(
            f"traj must be the DataFrame of layer_trajectories (columns {', '.join(need)}), got {traj!r:.80}"
        )
    tau = check_finite_scalar(tau, "tau")
    if not -1.0 <= tau <= 1.0:
        raise ValueError(f"tau must be in [-1, 1] (a correlation threshold), got {tau}")
    out = []
    for (r, ell), g in traj.sort_values("step").groupby(["run", "layer"]):
        steps = g.step.to_numpy()
        changed = g.changed.to_numpy()
        ok = (g.corr_final >= tau).to_numpy()
        idx = np.flatnonzero(changed)  # (never the last step: the final selection is the reference)
        sel = steps[idx[-1] + 1] if idx.size else steps[0]
        bad = np.flatnonzero(~ok)
        if ok.all():
            dirn = float(steps[0])
        elif bad[-1] + 1 < len(steps):
            dirn = float(steps[bad[-1] + 1])
        else:
            dirn = np.nan
        out.append({"run": r, "layer": ell, "selection_settled": float(sel), "direction_settled": dirn})
    return pd.DataFrame(out)
