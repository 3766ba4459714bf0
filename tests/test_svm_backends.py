"""The solver backends, registered by name (attsvm.svm.backends): which one a fit goes to, and that the
registry is what the estimator calls."""

from __future__ import annotations

import numpy as np
import pytest

from attsvm.datasets import paper_instance
from attsvm.svm import AttentionSVM, backends
from attsvm.svm.backends import BACKENDS, SolveRequest, route


def _request(kind: str, cvxpy: bool = False) -> SolveRequest:
    return SolveRequest(kind, None, 1.5 if kind == "lp" else None, None, 1e-9, None, 0, None, cvxpy)


@pytest.mark.parametrize("kind", ["fro", "nuc", "lp", "l1", "linf", "spectral"])
def test_a_built_in_norm_goes_to_its_own_backend_or_to_cvxpy(kind):
    assert route(_request(kind)) == kind
    assert route(_request(kind, cvxpy=True)) == "cvxpy"
    assert kind in BACKENDS


def test_a_norm_without_a_solver_goes_to_the_generic_backend_even_with_cvxpy():
    assert route(_request("generic")) == "generic"
    assert route(_request("generic", cvxpy=True)) == "generic"


@pytest.mark.parametrize(
    ("params", "name"),
    [
        ({}, "frobenius"),
        ({"norm": "nuc"}, "nuclear"),
        ({"norm": "nuc", "rank": 2}, "nuclear-rank"),
        ({"norm": "lp", "p": 1.5}, "lp"),
        ({"norm": "l1"}, "highs"),
        ({"norm": "spectral"}, "spectral"),
    ],
)
def test_fit_reports_the_backend_the_registry_ran(params, name, monkeypatch):
    calls: list[str] = []
    key = route(AttentionSVM(**params)._request())
    real = BACKENDS[key]
    monkeypatch.setitem(BACKENDS, key, lambda cs, req: calls.append(req.kind) or real(cs, req))
    est = AttentionSVM(**params).fit(paper_instance(3, 4, 5, seed=0))
    assert calls == [AttentionSVM(**params)._norm_kind()]
    assert est.backend_ == name


def test_a_backend_registered_under_a_name_replaces_it(monkeypatch):
    # the registry is what the estimator calls: a replacement's answer is what fit certifies
    p = paper_instance(3, 4, 5, seed=1)
    ref = AttentionSVM().fit(p)
    seen: list[SolveRequest] = []

    def mine(cs, req):
        seen.append(req)
        raw, _ = BACKENDS["nuc"](cs, req._replace(kind="nuc"))  # (a different solver of the same program)
        return raw, "mine"

    monkeypatch.setitem(backends.BACKENDS, "fro", mine)
    est = AttentionSVM().fit(p)
    assert len(seen) == 1 and seen[0].kind == "fro" and seen[0].tol == 1e-9
    assert est.backend_ == "mine"
    assert not np.array_equal(est.W_, ref.W_)  # (the nuclear optimum, not the Frobenius one)
