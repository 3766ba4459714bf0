"""The search for a huge-norm feasible point behind a Farkas certificate stops once its rows are inconsistent."""

from __future__ import annotations

import numpy as np

from attsvm.problem import AttentionProblem
from attsvm.svm import AttentionSVM, att_svm_constraints
from attsvm.svm import certificate as cert_mod


def _deep_infeasible() -> AttentionProblem:
    """56 constraints on one unknown (d = 1): infeasible, with an exact certificate."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((8, 8, 1))
    return AttentionProblem(X, np.ones(8), np.ones(1), Z=rng.standard_normal((8, 1)))


def test_an_exact_certificate_ends_the_search_at_its_first_step(monkeypatch) -> None:
    p = _deep_infeasible()
    tokens = np.zeros(8, dtype=np.int64)
    e = AttentionSVM().fit(p, tokens)
    assert e.status_ == "infeasible"
    calls = []
    lstsq = np.linalg.lstsq
    monkeypatch.setattr(cert_mod.np.linalg, "lstsq", lambda *a, **k: calls.append(1) or lstsq(*a, **k))
    cs = att_svm_constraints(p, tokens)
    assert cert_mod.feasible_point(cs, e.certificate_, e.tol) is None
    assert len(calls) == 1  # (the rows of λ's support, held as equalities, have no common solution)


def test_a_near_farkas_certificate_of_a_feasible_instance_still_finds_the_point() -> None:
    eps = 1e-10
    X = np.array([[[1.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [1.0, -eps]]])
    p = AttentionProblem(X, np.ones(2), np.zeros(2), Z=np.array([[1.0, 0.0], [1.0, 0.0]]))
    cs = att_svm_constraints(p, [0, 0])
    W = cert_mod.feasible_point(cs, np.array([[0.0, 0.5], [0.0, 0.5]]), 1e-8)
    assert W is not None and cert_mod.relative_violation(cs, W) <= 1e-8
    assert np.linalg.norm(W) > 1e9
