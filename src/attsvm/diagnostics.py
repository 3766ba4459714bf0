"""Diagnostics of trained attention against the SVM theory (docs/spec.md §4, §5).

From a :class:`~attsvm.training.TrainResult`:

* :func:`correlation_trajectories` — ``corr(W(k), W_mm)`` and ``corr(W(k), W*_mm)`` over the recorded
  iterations, for the Frobenius and nuclear Att-SVMs of the tokens each run finally selects;
* :func:`convergence_type` / :func:`convergence_types` — the classification of docs/spec.md §4 (global /
  local / not locally optimal, threshold τ = 0.99);
* :func:`svm_equivalence` — docs/spec.md §5 for nonlinear and multiclass heads: the selected sets
  ``O_i = {t : s_it ≥ ε}``, ``W^eq``, ``W_fin``, the fitted scale R in ``W ≈ R·W^eq + W_fin`` and the
  correlations, along the trajectory (solved by :mod:`attsvm.svm.equivalence`);
* :func:`bregman_alignment` / :func:`bregman_divergence` — the alignment of ℓp mirror descent
  (docs/spec.md §8): the Bregman divergence of ``ψ = ‖·‖_p^p/p`` between ℓp-normalised directions;
* :func:`rate_fit` — the rate at which a quantity decays (``1 − corr``, the non-selected attention
  mass): a power law ``C·t^{−a}`` or an exponential ``C·e^{−b t}``, with a confidence interval;
* :func:`mixture_prediction` — for convex heads, the sets ``O_i`` predicted before training by the
  convex program over the simplex (:func:`attsvm.svm.equivalence.optimal_mixture`), and how often
  training selects exactly them.

This module sits above :mod:`attsvm.svm` and :mod:`attsvm.training` and imports both.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._linalg import correlation
from ._validation import as_float_array, check_bool, check_choice, check_finite_scalar
from .problem import AttentionProblem, TieError
from .svm import AttentionSVM
from .svm.equivalence import SELECT_EPS, decomposition, optimal_mixture, selected_sets, svm_eq, w_fin
from .tokens import local_optimality_report
from .training import TrainResult

__all__ = [
    "TAU",
    "SELECT_EPS",
    "ConvergenceReport",
    "convergence_type",
    "convergence_types",
    "correlation_trajectories",
    "EquivalenceReport",
    "svm_equivalence",
    "MixturePrediction",
    "mixture_prediction",
    "svm_direction",
    "bregman_divergence",
    "bregman_alignment",
    "RateFit",
    "rate_fit",
]

logger = logging.getLogger(__name__)

# docs/spec.md §4: a run has converged in direction when corr ≥ τ.
TAU = 0.99
ConvergenceKind = Literal["global", "local", "not locally optimal"]
NORMS: tuple[str, ...] = ("fro", "nuc")


def _norm_for(param: str) -> str:
    return "fro" if param == "W" else "nuc"


def svm_direction(problem: AttentionProblem, tokens: ArrayLike, norm: str = "fro") -> AttentionSVM:
    """Fit Att-SVM(α) (``norm="fro"``) or Att-SVM*(α) (``"nuc"``) for the selection ``tokens``.

    Returns the fitted estimator (``W_``, ``status_`` and the certificate); ``status_`` may be
    "infeasible" — callers decide what that means for their diagnostic.
    """
    check_choice(norm, "norm", NORMS)
    return AttentionSVM(norm).fit(problem, problem.check_tokens(tokens))  # type: ignore[arg-type]


def _check_result(result: Any, name: str = "result") -> TrainResult:
    """``result`` if it is a :class:`~attsvm.training.TrainResult`, else a TypeError naming ``name``."""
    if not isinstance(result, TrainResult):
        raise TypeError(f"{name} must be a TrainResult from attsvm.training.train, got {type(result).__name__}")
    return result


def _solved(est: AttentionSVM) -> bool:
    return est.status_ in ("optimal", "optimal_inaccurate") and est.W_ is not None


# ---------------------------------------------------------------------------------------------
# convergence type (docs/spec.md §4)


@dataclass(frozen=True)
class ConvergenceReport:
    """The convergence type of one trained W (docs/spec.md §4).

    Attributes
    ----------
    kind : "global" | "local" | "not locally optimal"
    tokens : (n,) the selected tokens ``α̂_i = argmax_t s_it``.
    optimal : (n,) the optimal tokens ``opt`` (first maximiser on ties; see ``tie``).
    is_optimal : whether ``α̂ = opt``.
    locally_optimal : whether α̂ is locally optimal (docs/spec.md §2, with the support tokens of the SVM of
        ``norm``); None when not tested (α̂ = opt).
    feasible : whether Att-SVM(α̂) is feasible.
    corr : ``corr(W, W^α̂)`` with the SVM of ``norm`` (NaN when infeasible).
    corr_fro, corr_nuc : correlations with the Frobenius / nuclear SVMs of α̂ (NaN if not computed).
    norm : "fro" (W-parameterisation) or "nuc" ((K, Q)).
    tau : the threshold used.
    tie : whether some sequence has tied optimal tokens (the theory's assumption fails there).
    svm_status : status of the SVM of ``norm``.
    """

    kind: ConvergenceKind
    tokens: NDArray[np.int64]
    optimal: NDArray[np.int64]
    is_optimal: bool
    locally_optimal: bool | None
    feasible: bool
    corr: float
    corr_fro: float
    corr_nuc: float
    norm: str
    tau: float
    tie: bool
    svm_status: str

    def to_dict(self) -> dict[str, Any]:
        def f(x: float) -> float | None:
            return None if not np.isfinite(x) else float(x)

        return {
            "kind": self.kind,
            "tokens": self.tokens.tolist(),
            "optimal": self.optimal.tolist(),
            "is_optimal": self.is_optimal,
            "locally_optimal": self.locally_optimal,
            "feasible": self.feasible,
            "corr": f(self.corr),
            "corr_fro": f(self.corr_fro),
            "corr_nuc": f(self.corr_nuc),
            "norm": self.norm,
            "tau": self.tau,
            "tie": self.tie,
            "svm_status": self.svm_status,
        }


def convergence_type(
    problem: AttentionProblem, W: ArrayLike, *, norm: str = "fro", tau: float = TAU, both_norms: bool = True
) -> ConvergenceReport:
    """Classify a trained W as docs/spec.md §4 does.

    With ``α̂_i = argmax_t s_it``: *global* if ``α̂ = opt`` and ``corr(W, W_mm) ≥ τ``; *local* if
    ``α̂ ≠ opt`` is locally optimal and ``corr(W, W^α̂_mm) ≥ τ``; otherwise *not locally optimal*.
    ``norm="nuc"`` judges the direction against Att-SVM* instead (the limit of (K, Q) training), and
    local optimality with Att-SVM*'s support tokens; ``both_norms`` also reports the other norm's
    correlation.
    """
    if not isinstance(problem, AttentionProblem):
        raise TypeError(f"problem must be an AttentionProblem, got {type(problem).__name__}")
    check_choice(norm, "norm", NORMS)
    tau = check_finite_scalar(tau, "tau")
    if not -1.0 <= tau <= 1.0:
        raise ValueError(f"tau must be a correlation threshold in [-1, 1], got {tau}")
    W = as_float_array(W, "W", shape=(problem.d, problem.d))
    both_norms = check_bool(both_norms, "both_norms")
    alpha = np.argmax(problem.logits(W), axis=-1).astype(np.int64)
    try:
        opt, tie = problem.optimal_tokens(), False
    except TieError:
        opt, tie = problem.optimal_tokens(ties="first"), True
    is_opt = bool(np.array_equal(alpha, opt))
    corrs = {"fro": np.nan, "nuc": np.nan}
    ests = {nm: svm_direction(problem, alpha, nm) for nm in ((norm, _other(norm)) if both_norms else (norm,))}
    for nm, est in ests.items():
        if _solved(est):
            corrs[nm] = float(correlation(W, est.W_))
    main = ests[norm]
    status = main.status_
    feasible = status != "infeasible"
    corr = corrs[norm]
    loc: bool | None = None
    if is_opt:
        kind: ConvergenceKind = "global" if corr >= tau else "not locally optimal"
    else:
        # docs/spec.md §2 with the support tokens of the SVM of this norm (Att-SVM for W, Att-SVM* for (K, Q))
        loc = bool(_solved(main) and local_optimality_report(problem, alpha, main.support_, True).locally_optimal)
        kind = "local" if (loc and corr >= tau) else "not locally optimal"
    return ConvergenceReport(
        kind=kind,
        tokens=alpha,
        optimal=opt,
        is_optimal=is_opt,
        locally_optimal=loc,
        feasible=feasible,
        corr=corr,
        corr_fro=corrs["fro"],
        corr_nuc=corrs["nuc"],
        norm=norm,
        tau=tau,
        tie=tie,
        svm_status=status,
    )


def _other(norm: str) -> str:
    return "nuc" if norm == "fro" else "fro"


def _check_runs(runs: Sequence[int], n_runs: int) -> NDArray[np.int64]:
    """``runs`` as run indices in [0, n_runs), or an error naming ``runs``."""
    if isinstance(runs, (str, bytes)) or not hasattr(runs, "__len__"):
        raise TypeError(f"runs must be a sequence of run indices, got {type(runs).__name__}")
    idx = np.asarray(runs)
    if idx.ndim != 1 or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
        raise ValueError(f"runs must be a sequence of integer run indices, got {runs!r}")
    if idx.size and (idx.min() < 0 or idx.max() >= n_runs):
        raise ValueError(f"runs must be in [0, {n_runs}), got {idx.tolist()}")
    return idx.astype(np.int64)


def convergence_types(
    result: TrainResult, *, tau: float = TAU, norm: str | None = None, runs: Sequence[int] | None = None
) -> list[ConvergenceReport]:
    """:func:`convergence_type` of the final W of every run (or of ``runs``).

    ``norm`` defaults to the parameterisation's limit: "fro" for W, "nuc" for (K, Q).
    """
    _check_result(result)
    nm = _norm_for(result.param) if norm is None else check_choice(norm, "norm", NORMS)
    idx = range(result.n_runs) if runs is None else list(_check_runs(runs, result.n_runs))
    return [convergence_type(result.problem(r), result.W[r], norm=nm, tau=tau) for r in idx]


# ---------------------------------------------------------------------------------------------
# correlation trajectories (docs/spec.md §4, §6 local-convergence)


def correlation_trajectories(
    result: TrainResult, *, runs: Sequence[int] | None = None, tokens: ArrayLike | None = None
) -> dict[str, NDArray]:
    """``corr(W(k), W_mm)`` and ``corr(W(k), W*_mm)`` along the recorded trajectory of each run.

    The SVMs are those of the tokens each run selects at the end (as the published notebook does),
    or of ``tokens`` ((n,) shared or (R, n)). Needs ``train(..., record_W=True)``.

    Returns a dict: ``step`` (S,), ``corr_fro``, ``corr_nuc`` (R', S) (NaN rows where the SVM is
    infeasible or unsolved), ``W_mm``, ``W_star`` (R', d, d), ``tokens`` (R', n), ``runs`` (R',),
    ``status_fro``, ``status_nuc`` (R',) strings.
    """
    _check_result(result)
    if "W" not in result.history:
        raise ValueError("correlation_trajectories needs the recorded iterates: train with record_W=True")
    idx = np.arange(result.n_runs) if runs is None else _check_runs(runs, result.n_runs)
    Wh = result.history["W"][idx]  # (R', S, d, d)
    d, n = result.W.shape[-1], result.probs.shape[1]
    if tokens is None:
        toks = result.selected[idx]
    else:
        t = np.asarray(tokens)
        if t.shape == (n,):
            toks = np.broadcast_to(t, (len(idx), n))
        elif t.shape == (result.n_runs, n):
            toks = t[idx]
        else:
            raise ValueError(f"tokens must have shape ({n},) or ({result.n_runs}, {n}), got {t.shape}")
    out: dict[str, NDArray] = {"step": result.history["step"], "runs": idx, "tokens": np.asarray(toks)}
    for nm, key in (("fro", "W_mm"), ("nuc", "W_star")):
        refs = np.full((len(idx), d, d), np.nan)
        status = []
        for j, r in enumerate(idx):
            est = svm_direction(result.problem(int(r)), toks[j], nm)
            status.append(est.status_)
            if _solved(est):
                refs[j] = est.W_
        corr = np.full(Wh.shape[:2], np.nan)
        ok = np.isfinite(refs).all(axis=(1, 2))
        if ok.any():
            corr[ok] = correlation(Wh[ok], refs[ok][:, None])
        out[key] = refs
        out[f"corr_{nm}"] = corr
        out[f"status_{nm}"] = np.array(status)
    return out


# ---------------------------------------------------------------------------------------------
# SVM-equivalence for nonlinear / multiclass heads (docs/spec.md §5)


@dataclass
class EquivalenceReport:
    """docs/spec.md §5 for one run: ``W(k) ≈ R·W^eq + W_fin``.

    Attributes
    ----------
    O : (n, T) bool, the selected sets ``O_i = {t : s_it ≥ ε}`` of the final attention.
    eps : ε.
    W_eq, W_fin : (d, d) or None (None when that SVM is infeasible / unsolved; see the statuses).
    status_eq, status_fin : solver statuses.
    scale : the least-squares R in ``min_R ‖W − R·W^eq − W_fin‖_F``.
    residual : ``‖W − R·W^eq − W_fin‖_F / ‖W‖_F`` at the final W.
    corr_eq : corr(W, W^eq) at the final W; ``corr_eq_fin``: corr(W − W_fin, W^eq).
        ``scale``, ``residual``, ``corr_eq`` and ``corr_eq_fin`` (and ``corr_eq_traj``) are NaN when
        ``W_eq`` or ``W_fin`` is None, and when no token is outside any O_i (``selective`` is False):
        attention is not selective yet, so W^eq = 0 and the decomposition is undefined.
    top_tokens : (n,) ``argmax_t s_it`` and ``W_mm_top`` (d, d) its Frobenius SVM (None if infeasible).
    corr_mm_top : corr(W, W_mm of the top tokens).
    step : (S,) recorded steps and ``corr_eq_traj``, ``corr_mm_top_traj`` (S,) when W was recorded;
    ``max_masked_prob`` (S,): the largest softmax probability outside O_i (the paper's scatter axis).
    """

    O: NDArray[np.bool_]
    eps: float
    W_eq: NDArray[np.float64] | None
    W_fin: NDArray[np.float64] | None
    status_eq: str
    status_fin: str
    scale: float
    residual: float
    corr_eq: float
    corr_eq_fin: float
    top_tokens: NDArray[np.int64]
    W_mm_top: NDArray[np.float64] | None
    corr_mm_top: float
    step: NDArray[np.int64] | None = None
    corr_eq_traj: NDArray[np.float64] | None = None
    corr_mm_top_traj: NDArray[np.float64] | None = None
    max_masked_prob: NDArray[np.float64] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "O": [np.flatnonzero(r).tolist() for r in self.O],
            "eps": self.eps,
            "status_eq": self.status_eq,
            "status_fin": self.status_fin,
            "scale": self.scale,
            "residual": self.residual,
            "corr_eq": self.corr_eq,
            "corr_eq_fin": self.corr_eq_fin,
            "top_tokens": self.top_tokens.tolist(),
            "corr_mm_top": self.corr_mm_top,
        }

    @property
    def selective(self) -> bool:
        """Whether some token is outside some O_i (otherwise W^eq = 0 and the decomposition is undefined)."""
        return bool((~self.O).any())


def svm_equivalence(result: TrainResult, run: int = 0, *, eps: float = SELECT_EPS) -> EquivalenceReport:
    """The SVM-equivalence diagnostics of docs/spec.md §5 for run ``run`` of a training result.

    ``O_i`` comes from the final attention probabilities; ``W^eq`` (zero logit gaps inside O_i, margin
    ≥ 1 to the tokens outside) and ``W_fin`` (logit gaps inside O_i equal to the final log-probability
    ratios) are the minimum-Frobenius-norm solutions of :func:`attsvm.svm.equivalence.svm_eq` /
    :func:`~attsvm.svm.equivalence.w_fin` (certified like every solve); the scale R is the
    least-squares fit of ``W − W_fin`` on ``W^eq`` (:func:`~attsvm.svm.equivalence.decomposition`).
    With ``record_W=True`` the correlations are also given along the path. Before attention is
    selective (every O_i is the whole sequence, so ``W^eq = 0``) the decomposition numbers are NaN
    (see :class:`EquivalenceReport`); nothing is raised.
    """
    _check_result(result)
    eps = check_finite_scalar(eps, "eps", positive=True)
    if not 0 < eps < 1:
        raise ValueError(f"eps must be in (0, 1), got {eps}")
    if isinstance(run, (bool, np.bool_)) or not isinstance(run, (int, np.integer)):
        raise TypeError(f"run must be an integer run index, got {type(run).__name__} {run!r}")
    if not 0 <= run < result.n_runs:
        raise ValueError(f"run must be in [0, {result.n_runs}), got {run}")
    p = result.problem(run)
    W = result.W[run]
    s = result.probs[run]
    O = selected_sets(s, eps)
    est_eq = svm_eq(p, O, probs=s)
    W_eq = est_eq.W_ if _solved(est_eq) else None
    if (O.sum(axis=1) > 1).any():
        est_fin = w_fin(p, O, s)
        W_fin, status_fin = (est_fin.W_ if _solved(est_fin) else None), est_fin.status_
    else:  # every O_i is a single token: no finite component
        W_fin, status_fin = np.zeros_like(W), "optimal"
    top = np.argmax(s, axis=-1).astype(np.int64)
    est_top = svm_direction(p, top, "fro")
    W_top = est_top.W_ if _solved(est_top) else None
    scale = residual = corr_eq = corr_eq_fin = np.nan
    selective = bool((~O).any())  # otherwise SVM-eq has no margin row and W^eq = 0
    if W_eq is not None and W_fin is not None and selective:
        dec = decomposition(W, W_eq, W_fin)
        scale, residual, corr_eq, corr_eq_fin = dec.scale, dec.residual, dec.corr_eq, dec.corr_eq_fin
    rep = EquivalenceReport(
        O=O,
        eps=eps,
        W_eq=W_eq,
        W_fin=W_fin,
        status_eq=est_eq.status_,
        status_fin=status_fin,
        scale=scale,
        residual=residual,
        corr_eq=corr_eq,
        corr_eq_fin=corr_eq_fin,
        top_tokens=top,
        W_mm_top=W_top,
        corr_mm_top=float(correlation(W, W_top)) if W_top is not None else np.nan,
    )
    if "W" in result.history:
        Wh = result.history["W"][run]
        rep.step = result.history["step"]
        if W_eq is None:
            rep.corr_eq_traj = None
        elif selective:
            rep.corr_eq_traj = np.asarray(correlation(Wh, W_eq))
        else:  # corr with W^eq = 0 is undefined, not 0
            rep.corr_eq_traj = np.full(Wh.shape[0], np.nan)
        rep.corr_mm_top_traj = np.asarray(correlation(Wh, W_top)) if W_top is not None else None
        sh = p.softmax(Wh)  # (S, n, T)
        rep.max_masked_prob = np.where(O[None], 0.0, sh).max(axis=(1, 2))
    return rep


# ---------------------------------------------------------------------------------------------
# convex heads: predict O_i before training (docs/spec.md §5)


@dataclass
class MixturePrediction:
    """Predicted selected sets from the optimal attention mixture vs what training selected.

    Attributes
    ----------
    predicted : (n, T) bool, the support of the optimal mixture of each sequence.
    mixture : (n, T) the optimal mixture weights.
    selected : (R, n, T) bool, ``O_i`` of each run (``s_it ≥ ε``).
    match : (R, n) bool, per run and sequence, ``O_i`` equals the prediction.
    match_rate : float, the share of (run, sequence) pairs that match.
    exact_runs : float, the share of runs where every sequence matches.
    """

    predicted: NDArray[np.bool_]
    mixture: NDArray[np.float64]
    selected: NDArray[np.bool_]
    match: NDArray[np.bool_]
    match_rate: float
    exact_runs: float


def mixture_prediction(result: TrainResult, *, eps: float = SELECT_EPS, support_tol: float = 1e-6) -> MixturePrediction:
    """Predict ``O_i`` before training from the optimal attention mixture and compare with training.

    For the linear multiclass head with cross-entropy the per-sequence loss is convex in the
    attention weights, so ``min_{s_i ∈ Δ} ℓ(Vᵀ X_iᵀ s_i)`` is a convex program whose support
    (weights ≥ ``support_tol``) predicts ``O_i`` (docs/spec.md §5). Every run of ``result`` must share one
    instance (train several initialisations of it).
    """
    _check_result(result)
    if len(result.problems) != 1:
        raise ValueError(f"mixture_prediction compares runs of one instance; result has {len(result.problems)}")
    p = result.problems[0]
    if p.head.kind != "multiclass":
        raise ValueError(
            f"mixture_prediction needs a convex head (linear multiclass with cross-entropy); "
            f"this head is {p.head.kind!r}"
        )
    mix = optimal_mixture(p, support_tol=support_tol)
    predicted = mix.support
    selected = selected_sets(result.probs, eps)
    match = (selected == predicted[None]).all(axis=-1)
    return MixturePrediction(
        predicted=predicted,
        mixture=mix.weights,
        selected=selected,
        match=match,
        match_rate=float(match.mean()),
        exact_runs=float(match.all(axis=1).mean()),
    )


def _lp_unit(W: NDArray[np.float64], p: float) -> NDArray[np.float64]:
    """``W/‖W‖_p`` over the last two axes (entrywise ℓp, computed relative to ``max|W|``)."""
    a = np.abs(W)
    s = a.max(axis=(-2, -1), keepdims=True)
    s = np.where(s > 0, s, 1.0)
    nrm = s * (((a / s) ** p).sum(axis=(-2, -1), keepdims=True)) ** (1.0 / p)
    return W / np.where(nrm > 0, nrm, 1.0)


def bregman_divergence(W: ArrayLike, W_ref: ArrayLike, p: float) -> NDArray[np.float64] | float:
    """``D_ψ(Ŵ_ref, Ŵ)`` for ``ψ(W) = ‖W‖_p^p/p`` between the ℓp-normalised directions (docs/spec.md §8).

    ``D_ψ(x, y) = ψ(x) − ψ(y) − ⟨∇ψ(y), x − y⟩`` with ``∇ψ(y) = sign(y)|y|^{p−1}``; for unit-ℓp x, y
    it is ``1 − ⟨∇ψ(ŷ), x̂⟩ ∈ [0, 2]``, zero exactly when the directions agree (Hölder). This is the
    "Bregman correlation" of the mirror-descent analysis of attention (AttentionMD), with the
    iterate in the second slot. ``W`` may carry leading axes, e.g. (R, S, d, d); ``W_ref`` broadcasts.
    """
    p = check_finite_scalar(p, "p")
    if p <= 1:
        raise ValueError(f"p must be > 1 (ψ = ‖W‖_p^p/p), got {p}")
    Wa = as_float_array(W, "W")
    Wr = as_float_array(W_ref, "W_ref")
    if Wa.ndim < 2 or Wr.ndim < 2 or Wa.shape[-2:] != Wr.shape[-2:]:
        raise ValueError(f"W and W_ref must end in the same (d, d) shape, got {Wa.shape} and {Wr.shape}")
    y = _lp_unit(Wa, p)
    x = _lp_unit(Wr, p)
    grad = np.sign(y) * np.abs(y) ** (p - 1.0)
    D = 1.0 - (grad * x).sum(axis=(-2, -1))
    D = np.maximum(D, 0.0)
    return float(D) if D.ndim == 0 else D


def bregman_alignment(W: ArrayLike, W_ref: ArrayLike, p: float) -> NDArray[np.float64] | float:
    """``1 − D_ψ(Ŵ_ref, Ŵ)`` (:func:`bregman_divergence`): 1 when aligned, next to the cosine correlation."""
    D = bregman_divergence(W, W_ref, p)
    return 1.0 - D


# ------------------------------------------------------------------------------------------ rates
@dataclass(frozen=True)
class RateFit:
    """A fitted decay ``y ≈ C·t^{−rate}`` (``model="power"``) or ``y ≈ C·e^{−rate·t}`` (``"exp"``).

    ``ci`` is the ``level`` confidence interval of the rate (Student t on the least-squares slope of
    log y), ``r2`` the coefficient of determination of that fit in log space, ``aic`` its Akaike
    information criterion (Gaussian errors in log y), ``n`` the number of points used.
    """

    model: str
    rate: float
    ci: tuple[float, float]
    coef: float
    r2: float
    aic: float
    n: int
    level: float

    @property
    def decaying(self) -> bool:
        """Whether the whole interval lies above 0: y falls at this rate."""
        return bool(self.ci[0] > 0)

    def predict(self, t: ArrayLike) -> NDArray[np.float64]:
        """``C·t^{−rate}`` or ``C·e^{−rate·t}`` at ``t``. The power law is defined for ``t > 0`` only (as
        its fit is: ``t^{−rate}`` is inf or NaN at ``t ≤ 0``), so other ``t`` are refused."""
        tt = as_float_array(t, "t")
        if self.model == "power" and np.any(tt <= 0):
            raise ValueError(
                f"t must be > 0 for the power law C·t^(-rate) (it is fitted on log t), got min {tt.min():g}"
            )
        return self.coef * (tt ** (-self.rate) if self.model == "power" else np.exp(-self.rate * tt))


RATE_MODELS = ("power", "exp", "auto")


def rate_fit(t: ArrayLike, y: ArrayLike, *, model: str = "auto", level: float = 0.95) -> RateFit:
    """Fit how ``y`` decays with ``t`` (docs/spec.md §8 "Rates"): least squares on ``log y`` against
    ``log t`` (power law) or ``t`` (exponential); ``model="auto"`` keeps the one with the lower AIC.

    Parameters
    ----------
    t : (N,) increasing positive times (iterations, radii). y : (N,) positive values (e.g. 1 − corr).
    model : "power" | "exp" | "auto".  level : confidence level of ``RateFit.ci``, in (0, 1).
    """
    from scipy import stats

    check_choice(model, "model", RATE_MODELS)
    tt = as_float_array(t, "t", ndim=1)
    yy = as_float_array(y, "y", ndim=1)
    if tt.shape != yy.shape:
        raise ValueError(f"t and y must have the same length, got {tt.size} and {yy.size}")
    if tt.size < 3:
        raise ValueError(f"t and y need at least 3 points to fit a rate with an interval, got {tt.size}")
    if np.any(tt <= 0):
        raise ValueError(f"t must be positive (a power law needs log t), got min {tt.min():g}")
    if np.ptp(tt) == 0:
        raise ValueError(f"t must take at least 2 distinct values to fit a slope, got every t = {tt[0]:g}")
    if np.any(yy <= 0):
        raise ValueError(f"y must be positive (the fit is in log y), got min {yy.min():g}")
    lvl = check_finite_scalar(level, "level")
    if not 0 < lvl < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    ly = np.log(yy)
    fits = []
    for name in ("power", "exp") if model == "auto" else (model,):
        x = np.log(tt) if name == "power" else tt
        X = np.column_stack([np.ones_like(x), x])
        beta, *_ = np.linalg.lstsq(X, ly, rcond=None)
        resid = ly - X @ beta
        dof = tt.size - 2
        rss = float(resid @ resid)
        s2 = rss / dof if dof > 0 else np.nan
        cov = s2 * np.linalg.inv(X.T @ X)
        se = float(np.sqrt(max(cov[1, 1], 0.0)))
        q = float(stats.t.ppf(0.5 + lvl / 2, dof)) if dof > 0 else np.inf
        tss = float(((ly - ly.mean()) ** 2).sum())
        r2 = 1.0 - rss / tss if tss > 0 else 1.0
        aic = tt.size * np.log(max(rss / tt.size, 1e-300)) + 4.0
        rate = -float(beta[1])
        with np.errstate(over="ignore"):  # (C may exceed the float range: an exponential fit far from t = 0)
            coef = float(np.exp(beta[0]))
        fits.append(RateFit(name, rate, (rate - q * se, rate + q * se), coef, r2, aic, tt.size, lvl))
    return min(fits, key=lambda f: f.aic)
