"""``AttentionSVM``: the sklearn-style estimator over every attention-SVM backend (docs/spec.md §2–3, §5).

``fit(problem, tokens)`` builds ``Att-SVM(α)`` (docs/spec.md §3) and hands it to
:meth:`fit_constraints`, which accepts any :class:`ConstraintSet` (docs/spec.md §5's SVM-eq and
W_fin too). The fit itself is :mod:`.pipeline` (prescale → solve → certify → unscale), whose record the
estimator copies onto itself: whatever backend solved the problem, its answer goes through the one certificate
module, :mod:`.certificate`: the optimality certificate is recomputed from ``(constraints, W, λ)``
and an infeasibility claim is accepted only with a verified Farkas certificate. ``status_`` is
"optimal" only when the relative violation and the relative duality gap (both defined there, both
independent of the units of X and Z) are at most ``tol``.

The estimator follows scikit-learn's protocol: ``__init__`` only stores, ``get_params`` /
``set_params`` / ``sklearn.base.clone`` work, parameters are checked against one declarative
table (:data:`_PARAMETERS`) with the shared validators, and reading a fitted attribute before
``fit`` raises :class:`NotFittedError`.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._threads import SMALL_NUCLEAR_ELEMENTS, SMALL_SOLVE_ELEMENTS, blas_threads
from .._validation import SEED_MAX, Choice, Integer, ParamSpec, Real, check_param
from ..problem import AttentionProblem, optimal_tokens_together
from . import pipeline
from ._base import ConstraintSet, RawSolution, _att_svm_constraints
from .backends import SolveRequest
from .certificate import (
    FARKAS_RTOL,
    OptimalityCertificate,
    numerical_rank,
)
from .norms import (
    BUILTIN_NAMES,
    BUILTIN_TYPES,
    LpNorm,
    Norm,
    check_methods,
    get_norm,
    lp_norm,
    missing_methods,
    registered_norms,
)
from .status import INFEASIBLE, OPTIMAL, OPTIMAL_INACCURATE

if TYPE_CHECKING:
    from .stack import SVMStack

__all__ = ["AttentionSVM", "InfeasibleSVMError", "NotFittedError", "CERTIFICATE_RTOL"]

log = logging.getLogger(__name__)

# A Farkas certificate is accepted when ‖𝒜*(λ)‖_F ≤ this × Σ|λ_k|‖a_k‖‖z_k‖ (see .certificate).
CERTIFICATE_RTOL = FARKAS_RTOL


class InfeasibleSVMError(ValueError):
    """Raised by ``AttentionSVM(on_infeasible="raise")`` when the SVM has no feasible point (docs/spec.md §3).

    Attributes: ``certificate`` (n, T) λ ≥ 0 with ``1ᵀλ = 1`` and ``Σ λ_k a_k z_kᵀ ≈ 0``,
    ``residual`` its ``‖𝒜*(λ)‖_F``, ``tokens`` the selection α (None for a raw ConstraintSet).
    """

    def __init__(
        self, message: str, certificate: NDArray[np.float64], residual: float, tokens: NDArray[np.int64] | None = None
    ) -> None:
        super().__init__(message)
        self.certificate = certificate
        self.residual = residual
        self.tokens = tokens


class NotFittedError(ValueError, AttributeError):
    """A fitted attribute (or :meth:`AttentionSVM.summary`) was read before ``fit``.

    Subclasses ValueError and AttributeError, as scikit-learn's ``NotFittedError`` does, so that
    ``hasattr(svm, "W_")`` is False on an unfitted estimator."""


# Declarative table of the parameters and their allowed values (checked in one place, with the
# shared validators of attsvm._validation).
@dataclass(frozen=True)
class _Exponent(ParamSpec):
    """None or a number p with 1 < p < ∞ (the ℓp norm's exponent; a ValueError naming p otherwise)."""

    expected: str = "None or a number with 1 < p < inf"

    def ok(self, value: Any) -> bool:
        if value is None:
            return True
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            return False
        return bool(1.0 < float(value) < np.inf)


@dataclass(frozen=True)
class _NormSpec(ParamSpec):
    """A built-in norm's name, a name given to :func:`~attsvm.svm.norms.register_norm`, or a
    :class:`~attsvm.svm.norms.Norm` instance (:func:`_check_norm` raises the message)."""

    @property
    def expected(self) -> str:  # type: ignore[override]
        return "one of " + ", ".join(repr(o) for o in (*BUILTIN_NAMES, *registered_norms()))

    def ok(self, value: Any) -> bool:
        if isinstance(value, Norm):
            return not missing_methods(value)
        return type(value) is str and (value in BUILTIN_NAMES or value in registered_norms())


def _check_norm(value: Any) -> None:
    """Raise the one-line ValueError naming ``norm`` unless it is a name :class:`_NormSpec` accepts or a
    :class:`~attsvm.svm.norms.Norm` that implements value, dual_norm and prox."""
    if _NormSpec().ok(value):
        return
    if isinstance(value, Norm):
        check_methods(value)
    raise ValueError(
        f"norm must be {_NormSpec().expected}; got {value!r} (or an attsvm.svm.norms.Norm instance, or a name "
        "given to register_norm)"
    )


_PARAMETERS: dict[str, ParamSpec] = {
    "norm": _NormSpec(),
    "p": _Exponent(),
    "rank": Integer(1, optional=True),
    "backend": Choice(("auto", "cvxpy")),
    "tol": Real(positive=True),
    "max_iter": Integer(1, optional=True),
    "on_infeasible": Choice(("status", "raise")),
    "seed": Integer(0, maximum=SEED_MAX),
    "solver": Choice((None, "CLARABEL", "SCS")),
}

# Names of the norms in summaries.
_NORM_NAMES = {
    "fro": "Frobenius",
    "nuc": "nuclear",
    "lp": "l{p:g}",
    "l1": "l1",
    "linf": "l-inf",
    "spectral": "spectral",
}
# the solvers of backend_ in words, for summary()
_BACKEND_NAMES = {
    "frobenius": "the Frobenius solver",
    "nuclear": "the nuclear-norm solver",
    "nuclear-rank": "the rank-constrained nuclear-norm solver",
    "lp": "the lp solver",
    "highs": "HiGHS",
    "spectral": "the spectral-norm solver",
    "generic": "the generic norm solver (PDHG)",
}


def _backend_words(backend: str) -> str:
    """``backend_`` in words: ``"frobenius"`` → "the Frobenius solver", ``"cvxpy:CLARABEL"`` → "cvxpy (CLARABEL)"."""
    if backend.startswith("cvxpy:"):
        return f"cvxpy ({backend.split(':', 1)[1]})"
    return _BACKEND_NAMES.get(backend, backend)


# Attributes set by fit (reading one before fit raises NotFittedError).
_FITTED = (
    "status_",
    *pipeline.SOLUTION_FIELDS,
    "dual_",
    "rank_",
    "certificate_",
    "certificate_residual_",
    "tokens_",
    "n_iter_",
    "solve_time_",
    "backend_",
    "reached_convex_optimum_",
    "constraints_",
    "info_",
    "factors_",
)


def _check_selections(
    probs: list[AttentionProblem], toks: list[ArrayLike | None]
) -> tuple[Sequence[NDArray[np.int64]] | NDArray[np.int64], NDArray[np.int64] | None]:
    """:meth:`AttentionProblem.check_tokens` for each (problem, selection) pair of
    :meth:`AttentionSVM.fit_many`, its error naming the pair's position. Selections that are already
    int64 vectors of the right length are range-checked together (a sweep passes thousands of them);
    if any is out of range, and for every other selection, ``check_tokens`` runs one by one and raises
    the named error. Missing selections (None: the optimal tokens) of linear-head problems are found
    together (:func:`attsvm.problem.optimal_tokens_together`); a tie leaves its problem to ``check_tokens``.

    Returns the checked selections and, when all of them were checked together and have one length,
    the matrix whose rows they are (None otherwise; when given, it is also the first value)."""
    alphas: list[NDArray[np.int64] | None] = [None] * len(probs)
    fast: list[int] = []
    for i, (p, t) in enumerate(zip(probs, toks)):
        if not isinstance(p, AttentionProblem):
            break  # (the loop below raises, in order of position)
        if type(t) is np.ndarray and t.dtype == np.int64 and t.ndim == 1 and t.shape[0] == p.X.shape[0]:
            fast.append(i)
    if fast:
        # one copy of them all (checked and used from here: the caller's arrays are neither aliased by the
        # fitted tokens_ nor read again after the check)
        flat = np.concatenate([toks[i] for i in fast])
        lengths = [probs[i].X.shape[0] for i in fast]
        bound = np.repeat([probs[i].X.shape[1] for i in fast], lengths)
        if ((flat >= 0) & (flat < bound)).all():
            n0 = lengths[0]
            same = all(m == n0 for m in lengths)  # (one n: rows of a matrix, cheaper than np.split)
            if same:
                if len(fast) == len(probs):  # (every pair passed the loop above: all are problems)
                    stacked = flat.reshape(-1, n0)
                    return stacked, stacked  # (its rows are the selections: no list of views)
                parts = list(flat.reshape(-1, n0))
            else:
                parts = np.split(flat, np.cumsum(lengths)[:-1])
            for i, t in zip(fast, parts):
                alphas[i] = t
    missing = [i for i, t in enumerate(toks) if t is None]
    if len(missing) > 1:  # the optimal tokens, of linear-head problems together
        for i, a in zip(missing, optimal_tokens_together([probs[i] for i in missing])):
            alphas[i] = a
    for i, (p, t) in enumerate(zip(probs, toks)):
        if not isinstance(p, AttentionProblem):
            raise TypeError(f"problems[{i}] must be an AttentionProblem, got {type(p).__name__}")
        if alphas[i] is None:
            try:
                alphas[i] = p.check_tokens(t)
            except TypeError as exc:
                raise TypeError(f"problems[{i}]: {exc}") from exc
            except ValueError as exc:
                raise ValueError(f"problems[{i}]: {exc}") from exc
    return alphas, None  # type: ignore[return-value]


class AttentionSVM:
    """Certified solver of the attention SVMs (docs/spec.md §3): ``min ‖W‖ s.t. (x_{iα_i} − x_it)ᵀ W z_i ≥ 1``.

    Parameters
    ----------
    norm : {"fro", "nuc", "lp", "l1", "linf", "spectral"}, a registered name, or a Norm
        Frobenius (GD on W), nuclear (GD on (K, Q)), entrywise ℓp (ℓp mirror descent,
        docs/spec.md §8; needs ``p``), its LP limits ℓ1 / ℓ∞ (ℓ∞: the entrywise max-norm margin of sign
        descent), or spectral ‖W‖₂ (the margin of Muon-type steepest descent, docs/spec.md §3). Or any norm:
        an instance of :class:`~attsvm.svm.norms.Norm` implementing ``value``, ``dual_norm`` and ``prox``, or the
        name it was given by :func:`~attsvm.svm.norms.register_norm`; it is solved by the generic solver
        (:mod:`.generic`) and certified as the others (an instance of a built-in norm keeps its own solver).
    p : float, optional
        The exponent of ``norm="lp"``, 1 < p < ∞ (p = 2 is the Frobenius problem).
        Frobenius (Att-SVM, the limit of GD on W) or nuclear (Att-SVM*, the limit of GD on (K, Q)).
    rank : int, optional
        ``norm="nuc"`` only: the rank-constrained Att-SVM* (``W = KQᵀ`` with K, Q of ``rank``
        columns); non-convex, ``reached_convex_optimum_`` says whether the convex optimum was hit.
    backend : {"auto", "cvxpy"}
        "auto": our solvers (Frobenius: projected Newton on the dual, :mod:`.frobenius`; nuclear:
        augmented Lagrangian on factors, :mod:`.nuclear`; spectral: interior point on the SDP form,
        :mod:`.spectral`). "cvxpy": the vectorised reference.
    tol : float
        Certificate tolerance: maximal relative constraint violation and relative duality gap for
        status "optimal" (both scale-free; defined in :mod:`attsvm.svm.certificate`).
    max_iter : int, optional
        Iteration cap passed to the backend (None: the backend's default).
    on_infeasible : {"status", "raise"}
        What an infeasible SVM does: set ``status_ = "infeasible"`` and ``certificate_``, or raise
        :class:`InfeasibleSVMError`.
    seed : int
        Randomness of the rank-constrained / factored nuclear solvers.
    solver : {None, "CLARABEL", "SCS"}
        The cvxpy solver for ``backend="cvxpy"`` (None: Clarabel).

    Attributes (after fit)
    ----------------------
    W_ : (d, d) solution (None when infeasible). ``objective_``: ‖W‖ in the chosen norm (``‖W‖_F``, ``‖W‖_*``,
        ``‖W‖_2``, ...).
    dual_coef_ : (n, T) multipliers λ (0 at α_i; ≥ 0 on inequalities).
    margins_ : (n, T) ``a_itᵀ W z_i``; ``+inf`` at α_i (where no constraint exists).
    support_ : (n, T) bool, the tight constraints (support tokens, docs/spec.md §2; equality rows included).
    max_violation_, relative_violation_, duality_gap_, relative_gap_, complementary_slackness_ :
        the certificate (:mod:`attsvm.svm.certificate`; ``max_violation_`` is in the user's units).
    dual_ : λ — ``dual_coef_`` after a solve, ``certificate_`` when infeasible.
    status_ : "optimal" | "optimal_inaccurate" | "max_iter" | "infeasible" | "ill_conditioned" | "error".
        "ill_conditioned": a Farkas certificate passes the tolerance yet ``W_`` meets every constraint (feasible
        only with a huge norm; docs/spec.md §3).
    certificate_, certificate_residual_ : λ and ‖𝒜*(λ)‖_F when infeasible (else None).
    tokens_ : (n,) the selection α (None after :meth:`fit_constraints`).
    n_iter_, solve_time_ (seconds; from :meth:`fit_many`'s batches, the batch's time per instance),
    backend_, rank_ (numerical rank at 1e-7 relative),
    reached_convex_optimum_ (rank-constrained problem; None otherwise), constraints_, info_.
    """

    def __init__(
        self,
        norm: Literal["fro", "nuc", "lp", "l1", "linf", "spectral"] | Norm = "fro",
        *,
        p: float | None = None,
        rank: int | None = None,
        backend: Literal["auto", "cvxpy"] = "auto",
        tol: float = 1e-9,
        max_iter: int | None = None,
        on_infeasible: Literal["status", "raise"] = "status",
        seed: int = 0,
        solver: str | None = None,
    ) -> None:
        self.norm = norm
        self.p = p
        self.rank = rank
        self.backend = backend
        self.tol = tol
        self.max_iter = max_iter
        self.on_infeasible = on_infeasible
        self.seed = seed
        self.solver = solver

    # ------------------------------------------------------------------ parameters
    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor parameters (``deep`` is accepted for scikit-learn; there are no
        nested estimators)."""
        return {k: getattr(self, k) for k in _PARAMETERS}

    def set_params(self, **params: Any) -> AttentionSVM:
        """Set constructor parameters (scikit-learn protocol); each value is checked against the
        parameter table, combinations of parameters are checked by ``fit``."""
        for name, value in params.items():
            if name not in _PARAMETERS:
                raise ValueError(
                    f"invalid parameter {name!r} for AttentionSVM; valid parameters are {', '.join(_PARAMETERS)}"
                )
            if name == "norm":
                _check_norm(value)
            check_param(value, name, _PARAMETERS[name])
        for name, value in params.items():
            setattr(self, name, value)
        return self

    def __getattr__(self, name: str) -> Any:
        # only reached when normal lookup fails: a fitted attribute read before fit
        if name in _FITTED:
            raise NotFittedError(
                f"this AttentionSVM is not fitted yet (no attribute {name!r}): call "
                "fit(problem) or fit_constraints(cs) first"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _validate_params(self) -> None:
        # (skipped when every parameter is the very object last validated: sweeps refit one estimator)
        values = tuple([getattr(self, name) for name in _PARAMETERS])
        last = self.__dict__.get("_validated_params")
        if last is not None and all(a is b for a, b in zip(values, last)):
            return
        _check_norm(self.norm)
        for name, spec in _PARAMETERS.items():
            check_param(getattr(self, name), name, spec)
        kind = self._norm_kind()
        if kind == "generic" and self.backend == "cvxpy":
            raise ValueError(
                f"backend='cvxpy' has no formulation of the norm {self._norm_words()!r}; use backend='auto' "
                "(the generic solver)"
            )
        if self.norm == "lp" and self.p is None:
            raise ValueError("p is required for norm='lp' (an exponent with 1 < p < inf), got p=None")
        if self.p is not None and self.norm != "lp":
            raise ValueError(f"p={self.p!r} applies to norm='lp' only; got norm={self.norm!r}")
        if kind in ("l1", "linf") and self.backend == "cvxpy":
            raise ValueError(f"backend='cvxpy' has no {kind!r} formulation; use backend='auto' (HiGHS)")
        if self.rank is not None and kind != "nuc":
            raise ValueError(
                f"rank={self.rank} is only defined for norm='nuc' (the rank-constrained "
                f"Att-SVM*); got norm={self.norm!r}"
            )
        if self.rank is not None and self.backend == "cvxpy":
            raise ValueError(f"rank={self.rank} needs backend='auto': cvxpy cannot express a rank constraint")
        if self.solver is not None and self.backend != "cvxpy":
            raise ValueError(f"solver={self.solver!r} applies to backend='cvxpy' only; got backend={self.backend!r}")
        self.__dict__["_validated_params"] = values

    def _norm_object(self) -> Norm:
        """The :class:`~attsvm.svm.norms.Norm` object of ``norm`` (and ``p``)."""
        return lp_norm(self._exponent()) if self.norm == "lp" else get_norm(self.norm)

    def _norm_kind(self) -> str:
        """Which solver ``norm`` goes to: a built-in name ("fro", "nuc", "lp", "l1", "linf", "spectral") for a
        built-in norm (named, or an instance of a built-in type), "generic" for any other norm (a registered
        name, or an instance of a user's :class:`~attsvm.svm.norms.Norm`). A registered name of a built-in
        norm's instance keeps that norm's solver."""
        norm = self.norm
        if isinstance(norm, str):
            if norm in BUILTIN_NAMES:
                return norm
            norm = get_norm(norm)
        if type(norm) in BUILTIN_TYPES:
            return "lp" if isinstance(norm, LpNorm) else str(norm.name)
        return "generic"

    def _norm_words(self) -> str:
        """The norm's name for messages and summaries."""
        if isinstance(self.norm, str):
            return _NORM_NAMES[self.norm].format(p=self.p) if self.norm in _NORM_NAMES else self.norm
        kind = self._norm_kind()
        if kind == "lp":
            return _NORM_NAMES["lp"].format(p=self._exponent())
        return _NORM_NAMES[kind] if kind != "generic" else f"{self.norm.name} ({type(self.norm).__name__})"

    def _exponent(self) -> float:
        """``p`` of ``norm="lp"`` (checked by ``_validate_params`` before any solve), or of an ℓp instance."""
        nm = self.norm if isinstance(self.norm, Norm) or self.norm == "lp" else get_norm(self.norm)
        if isinstance(nm, LpNorm):
            return float(nm.p)
        if self.p is None:
            raise ValueError("p is required for norm='lp' (an exponent with 1 < p < inf), got p=None")
        return float(self.p)

    # ------------------------------------------------------------------ fitting
    def fit(self, problem: AttentionProblem, tokens: ArrayLike | None = None) -> AttentionSVM:
        """Solve Att-SVM(α) for the selection ``tokens`` (default: the optimal tokens, docs/spec.md §2)."""
        self._validate_params()
        if not isinstance(problem, AttentionProblem):
            raise TypeError(f"problem must be an AttentionProblem, got {type(problem).__name__}")
        alpha = problem.check_tokens(tokens)
        cs = _att_svm_constraints(problem, alpha)
        return self._fit(cs, alpha)

    def fit_many(
        self, problems: Sequence[AttentionProblem], tokens: Sequence[ArrayLike | None] | None = None
    ) -> list[AttentionSVM]:
        """Fit one Att-SVM per problem (docs/spec.md §3): new estimators with these parameters, in
        order (this one is not changed), each with the status :meth:`fit` would give it and a
        certificate that passes ``tol``, or a verified Farkas certificate. The Frobenius batch returns
        fit's W to round-off; the nuclear batch is another method, so its W, multipliers, ``n_iter_`` and
        ``info_`` differ from fit's within what the certificate allows (W to about 1e-5 relative at
        the default ``tol``; a repeated row gets multiplier 0 where fit may split it).

        Frobenius instances (``backend="auto"``) of one shape are solved together (:mod:`attsvm.svm.batch`):
        with numba (the ``fast`` extra) and ``max_iter=None``, those with at most ``COMPILED_MAX_K``
        constraint rows by a compiled dual active set, which also proves infeasibility with its own Farkas
        certificate (verified and accepted as fit's; Farkas certificates are not unique, so it may differ
        from fit's); otherwise those of full rank with at most ``BATCH_MAX_K`` rows, as one vectorised
        NumPy program. Spectral instances go through :meth:`fit` one at a time. Nuclear instances (``rank=None``,
        ``backend="auto"``, ``max_iter=None``) whose
        reduced programs share a shape are solved together by a batched interior-point method
        (:mod:`attsvm.svm.batch_nuclear`) and certified one by one as :meth:`fit` certifies. Every other
        instance, and any that leaves a batch (a duplicate token, an unsettled active set, a certificate
        that misses ``tol``, an infeasibility the batch cannot certify), goes through :meth:`fit`.

        Parameters
        ----------
        problems : sequence of AttentionProblem
        tokens : None, or one selection (or None: the optimal tokens) per problem.

        A selection that :meth:`fit` would refuse (a tie, an index out of range) raises here,
        before anything is solved, naming the problem's position.
        """
        from . import _fitted

        self._validate_params()
        if isinstance(problems, (AttentionProblem, str, bytes)) or not hasattr(problems, "__len__"):
            raise TypeError(f"problems must be a sequence of AttentionProblem, got {type(problems).__name__}")
        probs = list(problems)
        if tokens is not None and (isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__len__")):
            raise TypeError(
                f"tokens must be None or a sequence of one selection (or None) per problem, got {type(tokens).__name__}"
            )
        toks: list[ArrayLike | None] = [None] * len(probs) if tokens is None else list(tokens)
        if len(toks) != len(probs):
            raise ValueError(
                f"tokens must hold one selection per problem (or be None); got {len(toks)} for {len(probs)} problems"
            )
        alphas, stacked = _check_selections(probs, toks)
        out: list[AttentionSVM | None] = _fitted.batched(self, probs, alphas, stacked)
        return self._fit_rest(
            out, [p.X.size for p in probs], lambda est, i: est.fit(probs[i], alphas[i]), lambda i: f"problems[{i}]"
        )

    def fit_stack(self, X: ArrayLike, Z: ArrayLike, tokens: ArrayLike) -> SVMStack:
        """Fit one Att-SVM per instance of a stack of one shape (docs/spec.md §3) and return the answers as
        arrays (:class:`~attsvm.svm.stack.SVMStack`): W (B, d, d_z), status, multipliers, margins, support
        and certificate per instance, and ``stack[b]``, the fitted estimator of instance b. Entry b is what
        :meth:`fit` returns on that instance, as with :meth:`fit_many`; without building B estimator
        objects, the Frobenius batch (:mod:`attsvm.svm.batch`) costs no Python per instance.

        Parameters
        ----------
        X : (B, n, T, d) the tokens of each instance.
        Z : (B, n, d_z) the query of each sequence (``X[:, :, q]`` for self-attention at position q).
        tokens : (B, n) the selection α of each instance (integer token indices in [0, T)).
        """
        from . import _fitted

        self._validate_params()
        return _fitted.fit_stack(self, X, Z, tokens)

    def fit_constraints(self, cs: ConstraintSet) -> AttentionSVM:
        """Solve ``min ‖W‖ s.t. cs`` for any constraint set (e.g. docs/spec.md §5's SVM-eq / W_fin)."""
        self._validate_params()
        if not isinstance(cs, ConstraintSet):
            raise TypeError(f"cs must be a ConstraintSet, got {type(cs).__name__}")
        return self._fit(cs, None)

    def fit_many_constraints(self, constraint_sets: Sequence[ConstraintSet]) -> list[AttentionSVM]:
        """:meth:`fit_constraints` for many constraint sets (e.g. the SVM-eq and W_fin programs of a sweep,
        docs/spec.md §5): new estimators with these parameters, in order, each with the status
        :meth:`fit_constraints` would give it and a certificate that passes ``tol`` (see :meth:`fit_many`
        for how the nuclear batch's W may differ within it).

        Nuclear programs (``rank=None``, ``backend="auto"``, ``max_iter=None``; equality rows and any
        right-hand sides included) are solved together by the batched interior point of
        :mod:`attsvm.svm.batch_nuclear` and certified one by one; every other program, and any that
        does not certify there, goes through :meth:`fit_constraints` (the Frobenius batch takes only the
        inequality rows b = 1 of :meth:`fit_many`'s problems)."""
        from . import _fitted

        self._validate_params()
        if isinstance(constraint_sets, (ConstraintSet, str, bytes)) or not hasattr(constraint_sets, "__len__"):
            raise TypeError(
                f"constraint_sets must be a sequence of ConstraintSet, got {type(constraint_sets).__name__}"
            )
        css = list(constraint_sets)
        for i, cs in enumerate(css):
            if not isinstance(cs, ConstraintSet):
                raise TypeError(f"constraint_sets[{i}] must be a ConstraintSet, got {type(cs).__name__}")
        out: list[AttentionSVM | None] = _fitted.nuclear_batch(self, css)
        return self._fit_rest(
            out,
            [cs.A.size for cs in css],
            lambda est, i: est.fit_constraints(css[i]),
            lambda i: f"constraint_sets[{i}]",
        )

    def _fit_rest(
        self,
        out: list[AttentionSVM | None],
        sizes: list[int],
        fit_one: Callable[[AttentionSVM, int], AttentionSVM],
        label: Callable[[int], str],
    ) -> list[AttentionSVM]:
        """Fill the entries of ``out`` that no batch fitted, one at a time (``fit_one(new estimator, i)``).
        When all of them are small (each fit would limit the BLAS pool to one thread, see :meth:`_fit`),
        the limit is set once around them rather than per fit: about 50 µs each, 20% of a small fit.
        A plain ValueError raised while fitting entry i (bad data a backend refuses) is raised again
        prefixed with ``label(i)``, which names its position."""
        params = self.get_params()
        rest = [i for i, e in enumerate(out) if e is None]
        small = SMALL_NUCLEAR_ELEMENTS if self._ours_nuc() else SMALL_SOLVE_ELEMENTS
        with blas_threads(1 if all(sizes[i] <= small for i in rest) else None):
            for i in rest:
                try:
                    out[i] = fit_one(type(self)(**params), i)
                except ValueError as exc:
                    if type(exc) is not ValueError:  # (InfeasibleSVMError and other subclasses as they are)
                        raise
                    raise ValueError(f"{label(i)}: {exc}") from exc
        return [e for e in out if e is not None]

    def _request(self) -> SolveRequest:
        """These parameters as a backend reads them (:class:`~attsvm.svm.backends.SolveRequest`)."""
        kind = self._norm_kind()
        return SolveRequest(
            kind,
            self._norm_object() if kind == "generic" else None,
            self._exponent() if kind == "lp" else None,
            self.rank,
            self.tol,
            self.max_iter,
            self.seed,
            self.solver,
            self.backend == "cvxpy",
        )

    def _ours_nuc(self) -> bool:
        """Whether this fit runs our convex nuclear solver (which has a BLAS-thread limit of its own)."""
        return self._norm_kind() == "nuc" and self.rank is None and self.backend != "cvxpy"

    def _fit(self, cs: ConstraintSet, alpha: NDArray[np.int64] | None) -> AttentionSVM:
        # small solves run with one BLAS thread (attsvm._threads: several only wait for each other)
        small = SMALL_NUCLEAR_ELEMENTS if self._ours_nuc() else SMALL_SOLVE_ELEMENTS
        with blas_threads(1 if cs.A.size <= small else None):
            return self._fit_here(cs, alpha)

    def _fit_here(self, cs: ConstraintSet, alpha: NDArray[np.int64] | None) -> AttentionSVM:
        self._take(pipeline.run(cs, alpha, self._request(), self._norm_object()), stacklevel=5)
        if self.status_ == OPTIMAL_INACCURATE and "prescale" not in self.info_:
            self._try_batched_nuclear(cs, alpha)
        return self

    def _try_batched_nuclear(self, cs: ConstraintSet, alpha: NDArray[np.int64] | None) -> None:
        """Where fit's nuclear route ends "optimal_inaccurate", the batched interior point of ``fit_many``
        (:mod:`attsvm.svm.batch_nuclear`) is tried too, and its answer taken when it certifies: fit and
        fit_many then give one status on one instance (fit_many already falls back to fit)."""
        from . import _fitted

        other = _fitted.nuclear(self, [cs], [alpha])[0]
        if other is not None and other.status_ == OPTIMAL:
            params = self.get_params()
            self.__dict__.update(other.__dict__)
            self.set_params(**params)
            self.info_["route"] = "batched interior point (fit's own route ended optimal_inaccurate)"

    def _accept(
        self,
        cs: ConstraintSet,
        alpha: NDArray[np.int64] | None,
        raw: RawSolution,
        backend: str,
        solve_time: float,
        stacklevel: int = 3,
        certificate: OptimalityCertificate | None = None,
    ) -> AttentionSVM:
        """The fitted attributes from a backend's raw solution by :func:`.pipeline.accept`, the certifying
        stage of ``fit``: also the end of the batched routes (:mod:`._fitted`), so that all certify alike
        (``certificate``: the one the batched nuclear route already computed)."""
        rec = pipeline.accept(cs, alpha, raw, backend, solve_time, self._request(), self._norm_object(), certificate)
        return self._take(rec, stacklevel + 1)

    def _take(self, rec: pipeline.FitRecord, stacklevel: int) -> AttentionSVM:
        """Copy a :class:`~.pipeline.FitRecord` onto this estimator and issue its warnings (``stacklevel`` counted
        from here); an infeasible fit raises :class:`InfeasibleSVMError` with ``on_infeasible="raise"``."""
        self.__dict__.update(rec.fields)
        for message in rec.warnings:
            warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)
        if self.status_ == INFEASIBLE and self.on_infeasible == "raise":
            where = "" if self.tokens_ is None else f" for tokens {self.tokens_.tolist()[:20]}"
            raise InfeasibleSVMError(
                f"the attention SVM is infeasible{where}: λ ≥ 0 with 1ᵀλ = 1 and ‖Σ λ_k a_k z_kᵀ‖_F = "
                f"{self.certificate_residual_:.1e} certifies it (docs/spec.md §3); see .certificate",
                self.certificate_,
                self.certificate_residual_,
                self.tokens_,
            )
        return self

    @property
    def sequence_violation_(self) -> NDArray[np.float64] | None:
        """Per sequence, how far its constraints miss their targets in the user's units: ``max_t (b_it − m_it)⁺``
        (equalities ``|m_it − b_it|``), shape (n,); None without a W. The status judges the *relative* violation
        (each row against ``‖a_k‖‖z_k‖``): with sequences of very different scales an "optimal" W may miss a
        margin of 1 by more in absolute terms, and this says which sequences and by how much."""
        if "status_" not in self.__dict__:
            raise NotFittedError(
                "this AttentionSVM is not fitted yet (no attribute 'sequence_violation_'): call fit first"
            )
        if self.W_ is None or self.margins_ is None or self.constraints_ is None:
            return None
        cs = self.constraints_
        with np.errstate(invalid="ignore"):
            gap = cs.rhs - self.margins_
        v = np.where(cs.equality, np.abs(gap), np.maximum(gap, 0.0))
        return np.asarray(np.where(cs.mask, v, 0.0).max(axis=1), dtype=np.float64)

    @property
    def rank_(self) -> int | None:
        """Numerical rank of ``W_`` (singular values above 1e-7 of the largest); None without a W."""
        if "status_" not in self.__dict__:
            raise NotFittedError("this AttentionSVM is not fitted yet (no attribute 'rank_'): call fit first")
        if self.W_ is None:
            return None
        r = self.__dict__.get("_rank")
        if r is None:
            r = self.__dict__["_rank"] = numerical_rank(self.W_)
        return r

    @property
    def dual_(self) -> NDArray[np.float64] | None:
        """The multipliers λ (n, T): ``dual_coef_`` after a solve, the Farkas certificate when infeasible."""
        if "status_" not in self.__dict__:
            raise NotFittedError("this AttentionSVM is not fitted yet (no attribute 'dual_'): call fit first")
        return self.certificate_ if self.status_ == INFEASIBLE else self.dual_coef_

    # ------------------------------------------------------------------ reporting
    def _check_fitted(self) -> None:
        if "status_" not in self.__dict__:
            raise NotFittedError("this AttentionSVM is not fitted yet: call fit(problem) or fit_constraints(cs) first")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready result: parameters, status, certificate, W, λ, margins (``None`` at α_i)."""
        self._check_fitted()

        def arr(a: NDArray | None) -> Any:
            if a is None:
                return None
            a = np.asarray(a, dtype=float)
            return [[None if not np.isfinite(v) else float(v) for v in row] for row in a] if a.ndim == 2 else a.tolist()

        def finite_or_none(x: Any) -> Any:
            return None if x is None or not np.isfinite(x) else float(x)

        margins = None
        if self.margins_ is not None:
            margins = [[None if not np.isfinite(v) else float(v) for v in row] for row in self.margins_]
        support = None if self.support_ is None else [np.flatnonzero(r).tolist() for r in self.support_]
        info = {
            k: (None if isinstance(v, float) and not np.isfinite(v) else v)
            for k, v in self.info_.items()
            if isinstance(v, (int, float, str, bool, type(None)))
        }
        params = self.get_params()
        if isinstance(params["norm"], Norm):  # (JSON-ready: a norm object by its name)
            params["norm"] = str(params["norm"].name)
        return {
            "params": params,
            "status": self.status_,
            "backend": self.backend_,
            "objective": finite_or_none(self.objective_),
            "max_violation": finite_or_none(self.max_violation_),
            "relative_violation": finite_or_none(self.relative_violation_),
            "duality_gap": finite_or_none(self.duality_gap_),
            "relative_gap": finite_or_none(self.relative_gap_),
            "complementary_slackness": finite_or_none(self.complementary_slackness_),
            "rank": self.rank_,
            "reached_convex_optimum": self.reached_convex_optimum_,
            "n_iter": self.n_iter_,
            "solve_time": self.solve_time_,
            "tokens": None if self.tokens_ is None else self.tokens_.tolist(),
            "n_support": None if self.support_ is None else int(self.support_.sum()),
            "support": support,
            "W": arr(self.W_),
            "dual_coef": arr(self.dual_coef_),
            "margins": margins,
            "certificate": arr(self.certificate_),
            "certificate_residual": finite_or_none(self.certificate_residual_),
            "info": info,
        }

    def summary(self) -> str:
        """A short human-readable report of the fit."""
        self._check_fitted()
        cs = self.constraints_
        head = (
            f"Att-SVM ({self._norm_words()} norm"
            f"{'' if self.rank is None else f', rank <= {self.rank}'}) via {_backend_words(self.backend_)}: "
            f"status {self.status_}"
        )
        lines = [head, f"  constraints   {cs.n_constraints} (n={cs.n}, T={cs.T}, d={cs.d})"]
        if self.status_ == INFEASIBLE:
            lines.append(f"  certificate   lambda >= 0, sum 1, ||A*(lambda)||_F = {self.certificate_residual_:.2e}")
        elif self.W_ is not None:
            per_seq = self.support_.sum(axis=1)
            lines += [
                f"  objective     {self.objective_:.10g}   (rank {self.rank_})",
                f"  support       {int(self.support_.sum())} tight constraints; per sequence "
                f"min {int(per_seq.min())} / mean {per_seq.mean():.2f} / max {int(per_seq.max())}",
                f"  violation     {self.max_violation_:.2e} (relative {self.relative_violation_:.2e})",
                f"  duality gap   {self.duality_gap_:.2e} (relative {self.relative_gap_:.2e})",
                f"  compl. slack. {self.complementary_slackness_:.2e}",
            ]
            if self.reached_convex_optimum_ is not None:
                lines.append(f"  reached convex optimum: {self.reached_convex_optimum_}")
            sv = self.sequence_violation_
            miss = np.flatnonzero(sv > 1e-8) if sv is not None else np.zeros(0, dtype=np.int64)
            if sv is not None and miss.size:
                worst = ", ".join(f"{i}: {sv[i]:.2e}" for i in miss[np.argsort(-sv[miss])][:5])
                lines.append(
                    f"  in data units {miss.size} sequence(s) miss a margin by more than 1e-8 (sequence: by how "
                    f"much) {worst}{' ...' if miss.size > 5 else ''}"
                )
        its = f"{self.n_iter_} iteration{'' if self.n_iter_ == 1 else 's'}"
        lines.append(f"  time          {self.solve_time_:.3f} s ({its})")
        return "\n".join(lines)

    def __repr__(self) -> str:
        defaults = AttentionSVM().get_params()
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items() if v != defaults[k])
        base = f"AttentionSVM({args})"
        if "status_" in self.__dict__:
            obj = "" if self.objective_ is None else f", objective={self.objective_:.6g}"
            base += f"  # fitted: {self.status_}{obj}"
        return base
