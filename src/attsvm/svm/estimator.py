"""``AttentionSVM``: the sklearn-style estimator over every attention-SVM backend (SPEC §2–3, §5).

``fit(problem, tokens)`` builds ``Att-SVM(α)`` (SPEC §3) and hands it to :meth:`fit_constraints`,
which accepts any :class:`ConstraintSet` (SPEC §5's SVM-eq and W_fin too). Whatever backend solved
the problem, the certificate is recomputed here, uniformly, from ``(constraints, W, λ)``:

* primal feasibility: ``max_violation_``;
* duality gap ``duality_gap_`` = primal − dual objective, where the dual objective is evaluated at
  the backend's multipliers made dual feasible (λ_I clipped at 0):
  Frobenius ``½‖W‖² − (bᵀλ − ½‖𝒜*λ‖²)``; nuclear ``‖W‖_* − bᵀλ / max(1, ‖𝒜*λ‖₂)``;
* ``complementary_slackness_`` ``max_k |λ_k (m_k − b_k)|`` and the support set.

``status_`` is "optimal" only when ``max_violation_ ≤ tol·max(1, |b|_∞)`` and
``relative_gap_ ≤ tol``; a solution that misses them is "optimal_inaccurate" (or "max_iter").
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._linalg import RANK_TOL
from .._validation import check_choice, check_finite_scalar, check_positive_int
from ..problem import AttentionProblem
from ..tokens import SUPPORT_TOL
from ._base import ConstraintSet, RawSolution, att_svm_constraints

__all__ = ["AttentionSVM", "InfeasibleSVMError", "CERTIFICATE_RTOL"]

log = logging.getLogger(__name__)

# A backend's infeasibility certificate is accepted when ‖𝒜*(λ)‖_F ≤ this × max_k ‖a_k‖‖z_k‖.
CERTIFICATE_RTOL = 1e-9


class InfeasibleSVMError(ValueError):
    """Raised by ``AttentionSVM(on_infeasible="raise")`` when the SVM has no feasible point (SPEC §3).

    Attributes: ``certificate`` (n, T) λ ≥ 0 with ``1ᵀλ = 1`` and ``Σ λ_k a_k z_kᵀ ≈ 0``,
    ``residual`` its ``‖𝒜*(λ)‖_F``, ``tokens`` the selection α (None for a raw ConstraintSet).
    """

    def __init__(self, message: str, certificate: NDArray[np.float64], residual: float,
                 tokens: NDArray[np.int64] | None = None) -> None:
        super().__init__(message)
        self.certificate = certificate
        self.residual = residual
        self.tokens = tokens


def _is_rank(value: Any) -> bool:
    return value is None or (isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1)


def _is_pos_float(value: Any) -> bool:
    return (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
            and np.isfinite(value) and value > 0)


def _is_pos_int_or_none(value: Any) -> bool:
    return value is None or _is_rank(value)


def _is_seed(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0


# Declarative table of the allowed parameter values (checked in one place, in fit).
_PARAMETERS: dict[str, tuple[tuple[Any, ...] | Any, str]] = {
    "norm": (("fro", "nuc"), "one of 'fro', 'nuc'"),
    "backend": (("auto", "cvxpy"), "one of 'auto', 'cvxpy'"),
    "on_infeasible": (("status", "raise"), "one of 'status', 'raise'"),
    "rank": (_is_rank, "None or an integer >= 1"),
    "tol": (_is_pos_float, "a finite number > 0"),
    "max_iter": (_is_pos_int_or_none, "None or an integer >= 1"),
    "seed": (_is_seed, "an integer >= 0"),
    "solver": ((None, "CLARABEL", "SCS"), "None, 'CLARABEL' or 'SCS' (backend='cvxpy' only)"),
}

_is_int = lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, bool)  # noqa: E731
_is_real = lambda v: isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)  # noqa: E731
# Values of the wrong type get a TypeError (a right type with a bad value gets a ValueError).
_WRONG_TYPE: dict[str, Any] = {
    "rank": lambda v: v is not None and not _is_int(v),
    "max_iter": lambda v: v is not None and not _is_int(v),
    "seed": lambda v: not _is_int(v),
    "tol": lambda v: not _is_real(v),
}


class AttentionSVM:
    """Certified solver of the attention SVMs (SPEC §3): ``min ‖W‖ s.t. (x_{iα_i} − x_it)ᵀ W z_i ≥ 1``.

    Parameters
    ----------
    norm : {"fro", "nuc"}
        Frobenius (Att-SVM, the limit of GD on W) or nuclear (Att-SVM*, the limit of GD on (K, Q)).
    rank : int, optional
        ``norm="nuc"`` only: the rank-constrained Att-SVM* (``W = KQᵀ`` with K, Q of ``rank``
        columns); non-convex, ``reached_convex_optimum_`` says whether the convex optimum was hit.
    backend : {"auto", "cvxpy"}
        "auto": our solvers (Frobenius: projected Newton on the dual, :mod:`.frobenius`; nuclear:
        augmented Lagrangian on factors, :mod:`.nuclear`). "cvxpy": the vectorised reference.
    tol : float
        Certificate tolerance: maximal constraint violation (relative to ``max(1, |b|)``) and
        relative duality gap for status "optimal".
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
    W_ : (d, d) solution (None when infeasible). ``objective_``: ‖W‖_F or ‖W‖_*.
    dual_coef_ : (n, T) multipliers λ (0 at α_i; ≥ 0 on inequalities).
    margins_ : (n, T) ``a_itᵀ W z_i``; ``+inf`` at α_i (where no constraint exists).
    support_ : (n, T) bool, the tight constraints (support tokens, SPEC §2; equality rows included).
    max_violation_, duality_gap_, relative_gap_, complementary_slackness_ : the certificate.
    status_ : "optimal" | "optimal_inaccurate" | "max_iter" | "infeasible" | "error".
    certificate_, certificate_residual_ : λ and ‖𝒜*(λ)‖_F when infeasible (else None).
    tokens_ : (n,) the selection α (None after :meth:`fit_constraints`).
    n_iter_, solve_time_, backend_, rank_ (numerical rank at 1e-7 relative),
    reached_convex_optimum_ (rank-constrained problem; None otherwise), constraints_, info_.
    """

    def __init__(self, norm: Literal["fro", "nuc"] = "fro", *, rank: int | None = None,
                 backend: Literal["auto", "cvxpy"] = "auto", tol: float = 1e-9, max_iter: int | None = None,
                 on_infeasible: Literal["status", "raise"] = "status", seed: int = 0,
                 solver: str | None = None) -> None:
        self.norm = norm
        self.rank = rank
        self.backend = backend
        self.tol = tol
        self.max_iter = max_iter
        self.on_infeasible = on_infeasible
        self.seed = seed
        self.solver = solver

    # ------------------------------------------------------------------ parameters
    def get_params(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _PARAMETERS}

    def _validate_params(self) -> None:
        for name, (allowed, expected) in _PARAMETERS.items():
            value = getattr(self, name)
            if callable(allowed):
                if not allowed(value):
                    wrong_type = _WRONG_TYPE[name](value) if name in _WRONG_TYPE else False
                    raise (TypeError if wrong_type else ValueError)(f"{name} must be {expected}; got {value!r}")
            else:
                check_choice(value, name, allowed)
        if self.rank is not None and self.norm != "nuc":
            raise ValueError(f"rank={self.rank} is only defined for norm='nuc' (the rank-constrained "
                             f"Att-SVM*); got norm={self.norm!r}")
        if self.rank is not None and self.backend == "cvxpy":
            raise ValueError(f"rank={self.rank} needs backend='auto': cvxpy cannot express a rank constraint")
        if self.solver is not None and self.backend != "cvxpy":
            raise ValueError(f"solver={self.solver!r} applies to backend='cvxpy' only; got backend={self.backend!r}")

    # ------------------------------------------------------------------ fitting
    def fit(self, problem: AttentionProblem, tokens: ArrayLike | None = None) -> AttentionSVM:
        """Solve Att-SVM(α) for the selection ``tokens`` (default: the optimal tokens, SPEC §2)."""
        self._validate_params()
        if not isinstance(problem, AttentionProblem):
            raise TypeError(f"problem must be an AttentionProblem, got {type(problem).__name__}")
        alpha = problem.check_tokens(tokens)
        cs = att_svm_constraints(problem, alpha)
        return self._fit(cs, alpha)

    def fit_constraints(self, cs: ConstraintSet) -> AttentionSVM:
        """Solve ``min ‖W‖ s.t. cs`` for any constraint set (e.g. SPEC §5's SVM-eq / W_fin)."""
        self._validate_params()
        if not isinstance(cs, ConstraintSet):
            raise TypeError(f"cs must be a ConstraintSet, got {type(cs).__name__}")
        return self._fit(cs, None)

    def _solve(self, cs: ConstraintSet) -> tuple[RawSolution, str]:
        kw: dict[str, Any] = {} if self.max_iter is None else {"max_iter": int(self.max_iter)}
        if self.backend == "cvxpy":
            from .cvxpy_backend import solve_cvxpy

            raw = solve_cvxpy(cs, self.norm, solver=self.solver)  # type: ignore[arg-type]
            return raw, f"cvxpy:{raw.info.get('solver', '?')}"
        if self.norm == "fro":
            from .frobenius import solve_frobenius

            # the Frobenius solver is exact: ask it for a margin below the certificate tolerance
            return solve_frobenius(cs, tol=min(float(self.tol), 1e-10), **kw), "frobenius"
        from . import nuclear

        if self.rank is not None:
            raw = nuclear.solve_nuclear_rank(cs, rank=int(self.rank), tol=float(self.tol), seed=int(self.seed), **kw)
            return raw, "nuclear-rank"
        return nuclear.solve_nuclear(cs, tol=float(self.tol), seed=int(self.seed), **kw), "nuclear"

    def _fit(self, cs: ConstraintSet, alpha: NDArray[np.int64] | None) -> AttentionSVM:
        t0 = time.perf_counter()
        raw, backend = self._solve(cs)
        self.solve_time_ = time.perf_counter() - t0
        self.backend_ = backend
        self.n_iter_ = int(raw.n_iter)
        self.info_ = {k: v for k, v in raw.info.items() if k not in ("K", "Q")}
        self.factors_ = (raw.info["K"], raw.info["Q"]) if "K" in raw.info and "Q" in raw.info else None
        self.tokens_ = alpha
        self.constraints_ = cs
        self.reached_convex_optimum_ = raw.info.get("reached_convex_optimum") if self.rank is not None else None
        if raw.status == "infeasible":
            return self._set_infeasible(cs, raw)
        if raw.W is None:  # the backend failed: report it, never hide it
            self._clear(status="error" if raw.status != "max_iter" else "max_iter")
            msg = raw.info.get("message", raw.info.get("cvxpy_status", raw.status))
            warnings.warn(f"AttentionSVM: backend {backend} returned no solution ({msg})", RuntimeWarning,
                          stacklevel=3)
            return self
        self._set_certificate(cs, raw)
        return self

    def _clear(self, status: str) -> None:
        self.status_ = status
        for name in ("W_", "objective_", "dual_coef_", "margins_", "support_", "max_violation_",
                     "duality_gap_", "relative_gap_", "complementary_slackness_", "rank_",
                     "certificate_", "certificate_residual_"):
            setattr(self, name, None)

    def _set_infeasible(self, cs: ConstraintSet, raw: RawSolution) -> AttentionSVM:
        self._clear("infeasible")
        lam = np.where(cs.inequality, np.maximum(raw.dual, 0.0), np.where(cs.mask, raw.dual, 0.0))
        s = float(np.abs(lam).sum())
        scale = float(np.sqrt(cs.gram_diag().max(initial=0.0))) or 1.0
        resid = float(np.linalg.norm(cs.adjoint(lam / s))) if s > 0 else np.inf
        if not (s > 0 and resid <= CERTIFICATE_RTOL * scale and float((cs.rhs * lam).sum()) > 0):
            from .feasibility import farkas_lp  # the backend's ray is not a valid certificate

            cert = farkas_lp(cs)
            if cert is None:
                self._clear("error")
                warnings.warn(f"AttentionSVM: backend {self.backend_} reported infeasible but the "
                              "feasibility LP finds the SVM feasible", RuntimeWarning, stacklevel=3)
                return self
            lam, s = cert, 1.0
            resid = float(np.linalg.norm(cs.adjoint(cert)))
        self.certificate_ = lam / s
        self.certificate_residual_ = resid
        if self.on_infeasible == "raise":
            where = "" if self.tokens_ is None else f" for tokens {self.tokens_.tolist()[:20]}"
            raise InfeasibleSVMError(
                f"the attention SVM is infeasible{where}: λ ≥ 0 with 1ᵀλ = 1 and ‖Σ λ_k a_k z_kᵀ‖_F = "
                f"{resid:.1e} certifies it (SPEC §3); see .certificate", self.certificate_, resid, self.tokens_)
        return self

    def _set_certificate(self, cs: ConstraintSet, raw: RawSolution) -> None:
        """The certificate of the module doc from ``(cs, W, λ)``; one operator call, one adjoint and
        one SVD of W (shared by the nuclear objective and the rank), so that the certificate costs
        little next to the solve even on tiny instances."""
        assert raw.W is not None
        W = np.asarray(raw.W, dtype=np.float64)
        ineq = cs.inequality
        lam = np.where(ineq, np.maximum(raw.dual, 0.0), np.where(cs.mask, raw.dual, 0.0))
        m = cs.apply(W)  # (n, T), 0 where masked
        b = cs.rhs
        AtL = cs.adjoint(lam)
        svals = np.linalg.svd(W, compute_uv=False) if W.size else np.zeros(0)
        bl = float((b * lam).sum())
        if self.norm == "fro":
            primal = 0.5 * float(np.sum(W * W))
            dual = bl - 0.5 * float(np.sum(AtL * AtL))
            objective = float(np.sqrt(2.0 * primal))
        else:
            primal = float(svals.sum())
            spec = float(np.linalg.norm(AtL, 2)) if AtL.size else 0.0
            dual = bl / max(1.0, spec)
            objective = primal
        gap = primal - dual
        bscale = max(1.0, float(np.abs(b).max(initial=0.0)))
        self.W_ = W
        self.objective_ = objective
        self.dual_coef_ = lam
        self.margins_ = np.where(cs.mask, m, np.inf)
        r = m - b
        has_eq = bool(cs.equality.any())
        if not has_eq and not np.any(cs.mask & (b != 1.0)):
            # = support_tokens(self.margins_) (SPEC §2), without re-reading the +inf entries
            self.support_ = cs.mask & np.isfinite(m) & (np.abs(r) <= SUPPORT_TOL * np.maximum(1.0, np.abs(m)))
        else:
            tight = np.abs(r) <= SUPPORT_TOL * np.maximum(1.0, np.abs(b))
            self.support_ = cs.mask & (tight | cs.equality)
        # = cs.violation(W), from the margins already at hand
        viol = float(np.where(ineq, -r, 0.0).max(initial=0.0)) + 0.0  # + 0.0: never print -0.0
        if has_eq:
            viol = max(viol, float(np.where(cs.equality, np.abs(r), 0.0).max(initial=0.0)))
        self.max_violation_ = viol
        self.duality_gap_ = float(gap)
        self.relative_gap_ = float(abs(gap) / max(1.0, abs(primal)))
        self.complementary_slackness_ = float(np.abs(lam * r).max(initial=0.0))  # λ = 0 where masked
        self.rank_ = int((svals > RANK_TOL * svals[0]).sum()) if svals.size and svals[0] > 0 else 0  # matrix_rank
        self.certificate_ = None
        self.certificate_residual_ = None
        ok = self.max_violation_ <= self.tol * bscale and self.relative_gap_ <= self.tol
        if self.rank is not None:
            # non-convex problem: the convex dual bound certifies only when the convex optimum is reached
            ok = self.max_violation_ <= self.tol * bscale and bool(self.reached_convex_optimum_)
        if ok:
            self.status_ = "optimal"
        else:
            self.status_ = "max_iter" if raw.status == "max_iter" else "optimal_inaccurate"
            if raw.status == "max_iter":
                warnings.warn(f"AttentionSVM: the {self.backend_} backend hit its iteration limit "
                              f"(violation {self.max_violation_:.1e}, relative gap {self.relative_gap_:.1e})",
                              RuntimeWarning, stacklevel=4)

    # ------------------------------------------------------------------ reporting
    def _check_fitted(self) -> None:
        if not hasattr(self, "status_"):
            raise RuntimeError("this AttentionSVM is not fitted yet: call fit(problem) or fit_constraints(cs) first")

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
        info = {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in self.info_.items()
                if isinstance(v, (int, float, str, bool, type(None)))}
        return {
            "params": self.get_params(),
            "status": self.status_,
            "backend": self.backend_,
            "objective": finite_or_none(self.objective_),
            "max_violation": finite_or_none(self.max_violation_),
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
        head = (f"Att-SVM ({'Frobenius' if self.norm == 'fro' else 'nuclear'} norm"
                f"{'' if self.rank is None else f', rank <= {self.rank}'}) via {self.backend_}: "
                f"status {self.status_}")
        lines = [head, f"  constraints   {cs.n_constraints} (n={cs.n}, T={cs.T}, d={cs.d})"]
        if self.status_ == "infeasible":
            lines.append(f"  certificate   lambda >= 0, sum 1, ||A*(lambda)||_F = {self.certificate_residual_:.2e}")
        elif self.W_ is not None:
            per_seq = self.support_.sum(axis=1)
            lines += [
                f"  objective     {self.objective_:.10g}   (rank {self.rank_})",
                f"  support       {int(self.support_.sum())} tight constraints; per sequence "
                f"min {int(per_seq.min())} / mean {per_seq.mean():.2f} / max {int(per_seq.max())}",
                f"  violation     {self.max_violation_:.2e}",
                f"  duality gap   {self.duality_gap_:.2e} (relative {self.relative_gap_:.2e})",
                f"  compl. slack. {self.complementary_slackness_:.2e}",
            ]
            if self.reached_convex_optimum_ is not None:
                lines.append(f"  reached convex optimum: {self.reached_convex_optimum_}")
        lines.append(f"  time          {self.solve_time_:.3f} s ({self.n_iter_} iterations)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        defaults = AttentionSVM().get_params()
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items() if v != defaults[k])
        base = f"AttentionSVM({args})"
        if hasattr(self, "status_"):
            obj = "" if self.objective_ is None else f", objective={self.objective_:.6g}"
            base += f"  # fitted: {self.status_}{obj}"
        return base
