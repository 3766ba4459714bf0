"""The solver backends of :class:`~attsvm.svm.AttentionSVM`, registered by name.

A backend takes a constraint set and a :class:`SolveRequest` (the fit's parameters as plain values) and
returns the solver's :class:`~attsvm.svm._base.RawSolution` with the name the estimator reports as
``backend_``; the estimator certifies whatever it returns (:mod:`.certificate`). :func:`route` says which
registered backend a request goes to: ``backend="cvxpy"`` to the cvxpy formulations, a norm without a
solver of its own to the generic one, every other request to its norm's solver. Each backend imports its
solver module when it is first called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import numpy as np

from ._base import ConstraintSet, RawSolution
from .norms import Norm
from .status import ERROR

__all__ = ["BACKENDS", "Backend", "SolveRequest", "route", "solve"]


class SolveRequest(NamedTuple):
    """A fit's parameters as a backend reads them: the norm's solver ``kind`` (a built-in norm's name, or
    "generic"), the :class:`~attsvm.svm.norms.Norm` object (read by the generic backend only; None
    elsewhere), the ℓp exponent (None unless the kind is
    "lp"), the rank constraint, the certificate tolerance, the explicit iteration limit (None: the
    solver's own), the seed, the cvxpy solver and whether cvxpy is asked for."""

    kind: str
    norm: Norm | None
    p: float | None
    rank: int | None
    tol: float
    max_iter: int | None
    seed: int
    solver: str | None
    cvxpy: bool


Backend = Callable[[ConstraintSet, SolveRequest], tuple[RawSolution, str]]


def _limit(req: SolveRequest) -> dict[str, Any]:
    return {} if req.max_iter is None else {"max_iter": int(req.max_iter)}


def _generic(cs: ConstraintSet, req: SolveRequest) -> tuple[RawSolution, str]:
    from .generic import solve_generic

    assert req.norm is not None
    return solve_generic(cs, req.norm, tol=float(req.tol), seed=int(req.seed), **_limit(req)), "generic"


def _cvxpy(cs: ConstraintSet, req: SolveRequest) -> tuple[RawSolution, str]:
    from .cvxpy_backend import solve_cvxpy

    try:
        if req.kind == "lp":
            from .cvxpy_backend import solve_cvxpy_lp

            assert req.p is not None
            raw = solve_cvxpy_lp(cs, req.p, solver=req.solver)
        else:
            which: Literal["fro", "nuc", "spectral"] = (
                "fro" if req.kind == "fro" else "spectral" if req.kind == "spectral" else "nuc"
            )
            raw = solve_cvxpy(cs, which, solver=req.solver)
    except Exception as exc:  # a solver failure is a status with info, never an escaping exception
        raw = RawSolution(
            None,
            np.zeros(cs.mask.shape),
            ERROR,
            0,
            {"solver": req.solver, "message": f"{type(exc).__name__}: {exc}"},
        )
    return raw, f"cvxpy:{raw.info.get('solver', '?')}"


def _lp(cs: ConstraintSet, req: SolveRequest) -> tuple[RawSolution, str]:
    from .lp import solve_lp

    assert req.p is not None
    return solve_lp(cs, req.p, tol=float(req.tol), **_limit(req)), "lp"


def _spectral(cs: ConstraintSet, req: SolveRequest) -> tuple[RawSolution, str]:
    from .spectral import solve_spectral

    # (the interior point stops at a quarter of tol, so the certificate recomputed by the estimator passes it)
    return solve_spectral(cs, tol=float(req.tol), **_limit(req)), "spectral"


def _l1(cs: ConstraintSet, req: SolveRequest) -> tuple[RawSolution, str]:
    from .lp import solve_lp_limit

    return solve_lp_limit(cs, "l1"), "highs"


def _linf(cs: ConstraintSet, req: SolveRequest) -> tuple[RawSolution, str]:
    from .lp import solve_lp_limit

    return solve_lp_limit(cs, "linf"), "highs"


def _frobenius(cs: ConstraintSet, req: SolveRequest) -> tuple[RawSolution, str]:
    from .frobenius import solve_frobenius

    # the Frobenius solver is exact: ask it for a margin below the certificate tolerance
    return solve_frobenius(cs, tol=min(float(req.tol), 1e-10), **_limit(req)), "frobenius"


def _nuclear(cs: ConstraintSet, req: SolveRequest) -> tuple[RawSolution, str]:
    from . import nuclear

    if req.rank is not None:
        raw = nuclear.solve_nuclear_rank(cs, rank=int(req.rank), tol=float(req.tol), seed=int(req.seed), **_limit(req))
        return raw, "nuclear-rank"
    return nuclear.solve_nuclear(cs, tol=float(req.tol), seed=int(req.seed), **_limit(req)), "nuclear"


# name → backend; route() picks the name
BACKENDS: dict[str, Backend] = {
    "generic": _generic,
    "cvxpy": _cvxpy,
    "lp": _lp,
    "spectral": _spectral,
    "l1": _l1,
    "linf": _linf,
    "fro": _frobenius,
    "nuc": _nuclear,
}


def route(req: SolveRequest) -> str:
    """The name in :data:`BACKENDS` of the backend that solves ``req``."""
    if req.kind == "generic":
        return "generic"
    if req.cvxpy:
        return "cvxpy"
    return req.kind


def solve(cs: ConstraintSet, req: SolveRequest) -> tuple[RawSolution, str]:
    """Solve ``cs`` by the backend :func:`route` names: its raw solution and its ``backend_`` name."""
    return BACKENDS[route(req)](cs, req)
