"""One fit of a constraint set as a chain of stages (docs/spec.md §3), from the data to the certified answer:

    prescale ─► solve ─► certify ─► unscale
                │          └─ "infeasible": the Farkas stage
                └─ the backend registered for the norm (:mod:`.backends`): reduce → solver → lift

1. **prescale** (:func:`~attsvm.svm.reduction.prescale`): data far from unit scale are rescaled exactly by
   powers of two (κ), so that no square or product over- or underflows;
2. **solve**: the registered backend reduces the set to solver units (:mod:`.reduction`), solves and lifts
   W and the multipliers λ back (a :class:`~attsvm.svm._base.RawSolution`);
3. **certify** (:func:`accept`): the optimality certificate of :mod:`.certificate` is recomputed from
   ``(constraints, W, λ)`` — "optimal" only when it passes ``tol`` — and an infeasibility claim is accepted
   only with a Farkas certificate that verifies (:func:`~attsvm.svm.certificate.find_farkas`), and never
   when a feasible point exists after all (:func:`~attsvm.svm.certificate.feasible_point`);
4. **unscale** (:func:`unscale`): the answer in the units of the user's data.

Every stage reads and returns a :class:`FitRecord`: the fitted attributes under the estimator's names, and
the warnings to issue. :class:`~attsvm.svm.estimator.AttentionSVM` copies a record onto itself and issues
its warnings at its caller; the batched routes (:mod:`._fitted`) end in the same :func:`accept`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from . import backends
from ._base import ConstraintSet, RawSolution
from .backends import SolveRequest
from .certificate import OptimalityCertificate, feasible_point, find_farkas, optimality_certificate
from .norms import Norm
from .reduction import prescale
from .status import ERROR, ILL_CONDITIONED, INFEASIBLE, MAX_ITER, OPTIMAL, OPTIMAL_INACCURATE

__all__ = ["FitRecord", "SOLUTION_FIELDS", "accept", "run", "unscale"]

_EPS = float(np.finfo(np.float64).eps)
# the attributes of a solution and its certificate (None when there is no solution), in this order
SOLUTION_FIELDS = (
    "W_",
    "objective_",
    "dual_coef_",
    "margins_",
    "support_",
    "max_violation_",
    "relative_violation_",
    "duality_gap_",
    "relative_gap_",
    "complementary_slackness_",
)


@dataclass
class FitRecord:
    """The answer of one fit: ``fields``, the fitted attributes by the estimator's names (``status_``, ``W_``,
    ``dual_coef_``, ``info_`` …, and ``_rank``, the numerical rank when the certificate computed it), and
    ``warnings``, the messages to issue (as RuntimeWarning) where the fit was called."""

    fields: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    def clear(self, status: str) -> None:
        """No solution: ``status`` and every solution and certificate field None."""
        f = self.fields
        f["status_"] = status
        for name in (*SOLUTION_FIELDS, "certificate_", "certificate_residual_"):
            f[name] = None
        f["_rank"] = None


def run(cs: ConstraintSet, alpha: NDArray[np.int64] | None, request: SolveRequest, norm: Norm) -> FitRecord:
    """Stages 1–4 (module doc) on ``cs``: the record of its fit, in the units of ``cs``."""
    if not isinstance(cs, ConstraintSet):
        raise TypeError(f"cs must be a ConstraintSet, got {type(cs).__name__}")
    if not isinstance(request, SolveRequest) or not isinstance(norm, Norm):
        got = f"{type(request).__name__} and {type(norm).__name__}"
        raise TypeError(f"request and norm must be a SolveRequest and a Norm, got {got}")
    t0 = time.perf_counter()
    pre = prescale(cs)
    target = cs if pre is None else pre[0]
    raw, backend = backends.solve(target, request)
    rec = accept(target, alpha, raw, backend, time.perf_counter() - t0, request, norm)
    return rec if pre is None else unscale(rec, cs, pre[1], norm.degree)


def accept(
    cs: ConstraintSet,
    alpha: NDArray[np.int64] | None,
    raw: RawSolution,
    backend: str,
    solve_time: float,
    request: SolveRequest,
    norm: Norm,
    certificate: OptimalityCertificate | None = None,
) -> FitRecord:
    """Stage 3: the record of a backend's raw solution of ``cs``. The status is "optimal" only with a certificate
    that passes ``request.tol``, "infeasible" only with a verified Farkas certificate; a backend that returned
    no W is reported ("max_iter" or "error", with a warning), never hidden. ``certificate``: the certificate of
    ``(raw.W, raw.dual)`` when the caller already computed it (the batched nuclear route), not computed again."""
    info = raw.info
    rec = FitRecord(
        {
            "solve_time_": solve_time,
            "backend_": backend,
            "n_iter_": int(raw.n_iter),
            "info_": {k: v for k, v in info.items() if k not in ("K", "Q")},
            "factors_": (info["K"], info["Q"]) if "K" in info and "Q" in info else None,
            "tokens_": alpha,
            "constraints_": cs,
            "reached_convex_optimum_": info.get("reached_convex_optimum") if request.rank is not None else None,
        }
    )
    if raw.status == INFEASIBLE:
        _farkas(rec, cs, raw, request, norm)
    elif raw.W is None:
        rec.clear(MAX_ITER if raw.status == MAX_ITER else ERROR)
        msg = info.get("message", info.get("cvxpy_status", raw.status))
        rec.warnings.append(f"AttentionSVM: backend {backend} returned no solution ({msg})")
    else:
        _certify(rec, cs, raw, request, norm, certificate)
    return rec


def _certify(
    rec: FitRecord,
    cs: ConstraintSet,
    raw: RawSolution,
    request: SolveRequest,
    norm: Norm,
    cert: OptimalityCertificate | None = None,
) -> None:
    """The optimality certificate of :mod:`.certificate` from ``(cs, W, λ)`` (``cert``, when given)."""
    assert raw.W is not None
    if cert is None:
        cert = optimality_certificate(cs, raw.W, raw.dual, norm)
    f = rec.fields
    f["W_"] = np.asarray(raw.W, dtype=np.float64)
    f["objective_"] = cert.objective
    f["dual_coef_"] = cert.lam
    f["margins_"] = np.where(cs.mask, cert.margins, np.inf)
    f["support_"] = cert.support
    f["max_violation_"] = cert.violation
    f["relative_violation_"] = cert.relative_violation
    f["duality_gap_"] = cert.gap
    f["relative_gap_"] = cert.relative_gap
    f["complementary_slackness_"] = cert.complementarity
    f["_rank"] = cert.rank  # (None: computed from W_ when rank_ is first read)
    f["certificate_"] = None
    f["certificate_residual_"] = None
    ok = cert.passes(request.tol)
    if request.rank is not None:
        # non-convex problem: the convex dual bound certifies only when the convex optimum is reached
        ok = cert.relative_violation <= request.tol and bool(f["reached_convex_optimum_"])
    if ok:
        f["status_"] = OPTIMAL
        return
    f["status_"] = MAX_ITER if raw.status == MAX_ITER else OPTIMAL_INACCURATE
    if raw.status == MAX_ITER:
        rec.warnings.append(
            f"AttentionSVM: the {f['backend_']} backend hit its iteration limit "
            f"(violation {cert.violation:.1e}, relative gap {cert.relative_gap:.1e})"
        )


def _farkas(rec: FitRecord, cs: ConstraintSet, raw: RawSolution, request: SolveRequest, norm: Norm) -> None:
    """The Farkas stage: accept an infeasibility claim only with a verified Farkas certificate (.certificate);
    where a W meets every constraint all the same (a huge norm), the status is "ill_conditioned"."""
    rec.clear(INFEASIBLE)
    f = rec.fields
    cert = find_farkas(cs, candidates=((f"{f['backend_']} certificate", raw.dual),))
    if cert is None:
        rec.clear(ERROR)
        rec.warnings.append(
            f"AttentionSVM: backend {f['backend_']} reported infeasible but no Farkas certificate "
            "verifies it (the feasibility LP finds none)"
        )
        return
    W = feasible_point(cs, cert.lam, request.tol)
    if W is not None:  # feasible after all, with a huge ‖W‖: say both (never a false "infeasible")
        point = RawSolution(W, np.zeros(cs.mask.shape), OPTIMAL_INACCURATE, 0, {})
        _certify(rec, cs, point, request, norm)
        f["status_"] = ILL_CONDITIONED
        f["info_"]["feasible_norm"] = f["objective_"]
        rec.warnings.append(
            f"AttentionSVM: ill-conditioned: a Farkas certificate passes the tolerance (residual "
            f"{cert.residual:.1e}), yet a W of norm {f['objective_']:.3g} meets every constraint; W_ is that "
            "point (not certified optimal), certificate_ the near-Farkas λ"
        )
    f["certificate_"] = cert.lam
    f["certificate_residual_"] = cert.residual
    f["info_"]["certificate_source"] = cert.source


def unscale(rec: FitRecord, cs: ConstraintSet, kappa: float, degree: int) -> FitRecord:
    """Stage 4: the record of the prescaled set (:func:`~attsvm.svm.reduction.prescale`, factor κ) in the units
    of ``cs``: W, its norm and rank-m factors times κ; multipliers, gap and complementarity times κ^degree;
    margins, violations, support, relative measures and a Farkas certificate unchanged. A W that float64
    cannot hold at these units is an "error"."""
    f = rec.fields
    f["constraints_"] = cs
    f["info_"]["prescale"] = kappa
    if f.get("certificate_residual_") is not None:  # ‖Σ λ_k a_k z_kᵀ‖_F of the (unchanged) Farkas λ
        with np.errstate(over="ignore"):
            f["certificate_residual_"] = float(f["certificate_residual_"] / np.float64(kappa))
    if f.get("W_") is None:
        return rec
    W0, lam0 = f["W_"], f["dual_coef_"]
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        power = np.float64(kappa) ** degree
        f["W_"] = W0 * kappa
        f["objective_"] = float(f["objective_"] * np.float64(kappa))
        if "feasible_norm" in f["info_"]:  # (an ill-conditioned instance's W: its norm in the user's units)
            f["info_"]["feasible_norm"] = f["objective_"]
        f["dual_coef_"] = lam0 * power
        f["duality_gap_"] = float(f["duality_gap_"] * power)
        f["complementary_slackness_"] = float(f["complementary_slackness_"] * power)
        if f["factors_"] is not None:
            f["factors_"] = (f["factors_"][0] * kappa, f["factors_"][1])

    def held(new: NDArray[np.float64], old: NDArray[np.float64]) -> bool:
        # no entry overflows, and none that matters flushes to 0 (entries below round-off of the
        # largest, ε·max|·|, may: they carry no information)
        big = np.abs(old) > _EPS * np.abs(old).max(initial=0.0)
        return bool(np.isfinite(new).all() and (new[big] != 0).all())

    w_held = held(f["W_"], W0) and bool(np.isfinite(f["objective_"]))
    if not (w_held and held(f["dual_coef_"], lam0)):
        rec.clear(ERROR)
        what = "W is κ" if not w_held else f"the multipliers λ are κ^{degree}"
        f["info_"]["message"] = (
            f"the solution is not representable in float64 at these units ({what} times those of the "
            f"rescaled data, κ = {kappa:.1e}): rescale X or Z"
        )
        rec.warnings.append(f"AttentionSVM: {f['info_']['message']}")
    return rec
