"""fit, fit_many and fit_stack on one random sweep: a few dozen instances of several shapes, Frobenius and
nuclear, feasible and infeasible (random selections, duplicated selected tokens). fit_many and fit_stack
give each instance the very same estimator, bit for bit; both agree with fit as the equality tests of
the batch and the stack require (tests/test_svm_batch.py, tests/test_svm_stack.py)."""

from __future__ import annotations

import numpy as np
import pytest

from attsvm.datasets import paper_instance
from attsvm.svm import AttentionSVM
from test_svm_batch import ROUTES, _assert_same, _duplicate_selected, route  # noqa: F401  (route: the fixture)
from test_svm_stack import NUC_W_RTOL, _check_entry

SHAPES = ((4, 6, 8), (10, 5, 4), (3, 5, 3), (6, 8, 10))


def _sweep(shape: tuple[int, int, int], B: int, seed: int):
    rng = np.random.default_rng(seed)
    n, T, d = shape
    probs, toks = [], []
    for s in range(B):
        p = paper_instance(n, T, d, seed=1000 * seed + s)
        a = p.optimal_tokens(ties="first") if s % 3 else rng.integers(0, T, size=n)
        if s % 5 == 4:  # a duplicate of the selected token: a zero row, infeasible
            p = _duplicate_selected(p, a)
        probs.append(p)
        toks.append(np.asarray(a, dtype=np.int64))
    return probs, toks


def _same_estimator(a: AttentionSVM, b: AttentionSVM) -> None:
    """Two fitted estimators with every fitted attribute equal, bit for bit (the solve time aside; private
    entries are caches of values read on demand, such as the rank, compared through their properties)."""
    public = [k for k in a.__dict__ if not k.startswith("_")]
    assert public == [k for k in b.__dict__ if not k.startswith("_")]
    assert a.rank_ == b.rank_
    for key in public:
        va, vb = a.__dict__[key], b.__dict__[key]
        if key == "solve_time_":
            continue
        if key == "constraints_":
            for f in ("A", "Z", "mask", "rhs", "equality"):
                np.testing.assert_array_equal(getattr(va, f), getattr(vb, f), err_msg=f)
        elif key == "info_":
            assert {k: v for k, v in va.items() if k != "time"} == {k: v for k, v in vb.items() if k != "time"}
        elif isinstance(va, np.ndarray) or va is None:
            np.testing.assert_array_equal(va, vb, err_msg=key)
        else:
            assert va == vb, key


@pytest.mark.parametrize("shape", SHAPES)
def test_the_frobenius_routes_agree_on_a_random_sweep(shape, route):  # noqa: F811
    probs, toks = _sweep(shape, 10, seed=SHAPES.index(shape))
    many = AttentionSVM().fit_many(probs, toks)
    stack = AttentionSVM().fit_stack(
        np.stack([p.X for p in probs]), np.stack([p.queries for p in probs]), np.stack(toks)
    )
    statuses = set()
    for b, (p, t) in enumerate(zip(probs, toks)):
        ref = AttentionSVM().fit(p, t)
        statuses.add(ref.status_)
        _assert_same(many[b], ref)
        _check_entry(stack, b, ref)
        _same_estimator(stack[b], many[b])
    assert "infeasible" in statuses and "optimal" in statuses


@pytest.mark.parametrize("shape", [(4, 6, 8), (3, 5, 3)])
def test_the_nuclear_routes_agree_on_a_random_sweep(shape):
    probs, toks = _sweep(shape, 8, seed=10 + shape[0])
    est = AttentionSVM("nuc")
    many = est.fit_many(probs, toks)
    stack = est.fit_stack(np.stack([p.X for p in probs]), np.stack([p.queries for p in probs]), np.stack(toks))
    statuses = set()
    for b, (p, t) in enumerate(zip(probs, toks)):
        ref = AttentionSVM("nuc").fit(p, t)
        statuses.add(ref.status_)
        assert many[b].status_ == ref.status_ == stack.status[b]
        if ref.W_ is not None:  # (the batched interior point: W within what the certificate allows)
            scale = np.abs(ref.W_).max()
            np.testing.assert_allclose(many[b].W_, ref.W_, rtol=0, atol=NUC_W_RTOL * scale)
        _same_estimator(stack[b], many[b])
        np.testing.assert_array_equal(stack.W[b], many[b].W_ if many[b].W_ is not None else np.nan)
    assert statuses == {"optimal", "infeasible"}
