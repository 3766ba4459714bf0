"""reduce_stack: the dense reduction of many instances at once (svm/reduction.py). Checked per instance against
the general reduction (``reduce``, an independent implementation), as the case B = 1 of ``fit``'s
``reduce_dense``, and as the oracle of the compiled kernel's own in-pass reduction."""

from __future__ import annotations

import numpy as np
import pytest

from attsvm.datasets import paper_instance
from attsvm.svm import att_svm_constraints
from attsvm.svm._base import ConstraintSet
from attsvm.svm.reduction import reduce, reduce_dense, reduce_stack


def _sets(B: int, n: int, T: int, d: int) -> list[ConstraintSet]:
    """B constraint sets of one shape, far from unit scale and with varied right-hand sides (zeros included)."""
    rng = np.random.default_rng(1)
    out = []
    for i in range(B):
        p = paper_instance(n, T, d, seed=i)
        cs = att_svm_constraints(p, p.optimal_tokens(ties="first"))
        rhs = np.where(cs.mask, rng.choice([0.0, 0.5, 1.0, 3.0], size=cs.mask.shape), 0.0)
        rhs[0, np.flatnonzero(cs.mask[0])[0]] = 1.0  # (one nonzero at least)
        out.append(ConstraintSet(cs.A * 10.0 ** (i - 2), cs.Z * 2.0**i, cs.mask, rhs, cs.equality))
    return out


def _stack(sets: list[ConstraintSet]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]]:
    idx = [np.flatnonzero(cs.mask.ravel()) for cs in sets]
    T = sets[0].mask.shape[1]
    Af = np.stack([cs.A.reshape(-1, cs.A.shape[-1])[i] for cs, i in zip(sets, idx)])
    Zf = np.stack([cs.Z[i // T] for cs, i in zip(sets, idx)])
    b = np.stack([cs.rhs.ravel()[i] for cs, i in zip(sets, idx)])
    return Af, Zf, b, idx


@pytest.mark.parametrize("by_rows", [False, True])
def test_each_instance_is_the_general_reduction(by_rows: bool) -> None:
    sets = _sets(5, 4, 6, 8)
    Af, Zf, b, idx = _stack(sets)
    red = reduce_stack(Af, Zf, b, by_rows=by_rows)
    assert red.ok.all()
    for i, cs in enumerate(sets):
        ref = reduce(cs, subspace=False)
        assert red.global_scale[i] == ref.global_scale  # (a power of two: exactly the same)
        np.testing.assert_allclose(red.row_scale[i], ref.row_scale.ravel()[idx[i]], rtol=1e-14)
        np.testing.assert_allclose(red.b[i], ref.problem.rhs.ravel()[idx[i]], rtol=1e-14)
        rows = ref.problem.A.reshape(-1, ref.problem.A.shape[-1])[idx[i]]
        queries = ref.problem.Z[idx[i] // cs.mask.shape[1]]
        np.testing.assert_allclose(red.G[i], (rows @ rows.T) * (queries @ queries.T), rtol=0, atol=1e-14)


def test_reduce_dense_is_the_case_b_equals_1_bit_for_bit() -> None:
    sets = _sets(3, 4, 6, 8)  # K = 20 ≤ d + d_z: the Gram scaling
    Af, Zf, b, _ = _stack(sets)
    red = reduce_stack(Af, Zf, b)
    for i, cs in enumerate(sets):
        one = reduce_dense(cs)
        assert one is not None
        assert np.array_equal(one.G, red.G[i]) and np.array_equal(one.b, red.b[i])
        assert np.array_equal(one.row_scale, red.row_scale[i]) and one.global_scale == red.global_scale[i]


def test_a_vanishing_row_marks_only_its_instance() -> None:
    sets = _sets(3, 4, 6, 8)
    Af, Zf, b, _ = _stack(sets)
    Af[1, 3] = 0.0  # (a duplicate token of instance 1)
    red = reduce_stack(Af, Zf, b)
    assert red.ok.tolist() == [True, False, True]
    assert np.isfinite(red.G).all() and np.isfinite(red.b).all()
    assert np.array_equal(red.G[[0, 2]], reduce_stack(Af[[0, 2]], Zf[[0, 2]], b[[0, 2]]).G)


def test_the_compiled_kernel_scales_as_reduce_stack() -> None:
    pytest.importorskip("numba")
    from attsvm.svm import AttentionSVM

    rng = np.random.default_rng(0)
    B, n, T, d = 30, 5, 7, 9
    X = rng.standard_normal((B, n, T, d)) * 10.0 ** rng.integers(-3, 4, size=(B, 1, 1, 1))
    Z = rng.standard_normal((B, n, d))
    alpha = rng.integers(0, T, size=(B, n))
    stack = AttentionSVM("fro").fit_stack(X, Z, alpha)
    solved = stack.status == "optimal"
    assert solved.sum() >= B // 2
    assert {stack[b].info_["path"] for b in np.flatnonzero(solved)} == {"batched-active-set"}  # (the kernel's)
    g = np.array([stack[b].info_["global_scale"] for b in np.flatnonzero(solved)])
    sets = [stack[b].constraints_ for b in np.flatnonzero(solved)]
    Af, Zf, ones, _ = _stack(sets)
    assert np.array_equal(g, reduce_stack(Af, Zf, ones).global_scale)


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda Af, Zf, b: (Af[0], Zf, b), r"^Af must be a \(B, K, d\) array of rows, got shape \(4, 8\)$"),
        (lambda Af, Zf, b: (Af, Zf[:, :3], b), r"^Zf must be a \(B, K, d_z\) array with Af's B and K"),
        (lambda Af, Zf, b: (Af, Zf, b[:, :3]), r"^b must have shape \(B, K\) = \(2, 4\), got \(2, 3\)$"),
        (lambda Af, Zf, b: (Af, Zf, b * np.nan), r"^b must be finite$"),
    ],
)
def test_bad_arrays_are_named(change, message: str) -> None:
    rng = np.random.default_rng(0)
    Af, Zf, b = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 4, 5)), np.ones((2, 4))
    with pytest.raises(ValueError, match=message):
        reduce_stack(*change(Af, Zf, b))
