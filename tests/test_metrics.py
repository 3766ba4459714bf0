"""Spectral metrics and correlation (docs/spec.md §4, §6) at extreme scales and on bad input.

GD diverges in norm by design, so a metric of W must not depend on ‖W‖: the scale-free ones are
computed from the singular values of W / max|W_ij|.
"""

from __future__ import annotations

import numpy as np
import pytest

from attsvm.metrics import correlation, effective_rank, matrix_rank, nuc_fro_ratio, singular_values

# scale-free quantities agree with their unit-scale values to this (relative)
SCALE_TOL = 1e-12
SCALES = (1e-300, 1e-200, 1e200, 1e308)  # (unit scale: tests/test_problem.py)


@pytest.mark.parametrize("c", SCALES)
def test_scale_free_metrics_do_not_see_the_scale(c: float) -> None:
    eye = np.eye(3) * c
    assert nuc_fro_ratio(eye) == pytest.approx(np.sqrt(3.0), rel=SCALE_TOL)
    assert effective_rank(eye) == pytest.approx(3.0, rel=SCALE_TOL)
    assert matrix_rank(eye) == 3
    assert matrix_rank(np.full((3, 3), c)) == 1
    assert nuc_fro_ratio(np.full((3, 3), c)) == pytest.approx(1.0, rel=SCALE_TOL)
    # batched: each matrix scaled by its own largest entry
    stack = np.stack([np.eye(3) * c, np.diag([1.0, 1.0, 0.0])])
    np.testing.assert_array_equal(matrix_rank(stack), [3, 2])
    np.testing.assert_allclose(nuc_fro_ratio(stack), [np.sqrt(3.0), np.sqrt(2.0)], rtol=SCALE_TOL)


BAD_W = {
    "nan": np.array([[np.nan, 0.0], [0.0, 1.0]]),
    "inf": np.array([[np.inf, 0.0], [0.0, 1.0]]),
    "nan in one of a stack": np.stack([np.eye(2), np.full((2, 2), -np.inf)]),
}


@pytest.mark.parametrize("fn", [singular_values, matrix_rank, effective_rank, nuc_fro_ratio])
@pytest.mark.parametrize("bad", list(BAD_W))
def test_metrics_reject_non_finite_W(fn, bad: str) -> None:
    with pytest.raises(ValueError, match=r"W must have finite entries"):
        fn(BAD_W[bad])


@pytest.mark.parametrize("fn", [singular_values, matrix_rank, effective_rank, nuc_fro_ratio])
def test_metrics_reject_a_vector(fn) -> None:
    with pytest.raises(ValueError, match=r"W must be a matrix \(m, k\) or a stack of matrices .* got shape \(3,\)"):
        fn(np.ones(3))


def test_matrix_rank_validates_tol() -> None:
    with pytest.raises(TypeError, match=r"tol must be a real number in \[0, 1\).*got str"):
        matrix_rank(np.eye(2), tol="a")  # type: ignore[arg-type]
    for bad in (-1.0, 1.0, np.nan, np.inf):
        with pytest.raises(ValueError, match=r"tol must be a finite real in \[0, 1\)"):
            matrix_rank(np.eye(2), tol=bad)
    assert matrix_rank(np.diag([1.0, 1e-3]), tol=0.0) == 2 and matrix_rank(np.diag([1.0, 1e-3]), tol=0.01) == 1


def test_correlation_is_nan_for_non_finite_pairs() -> None:
    assert np.isnan(correlation(np.full((2, 2), np.nan), np.eye(2)))
    assert np.isnan(correlation(np.eye(2), np.array([[np.inf, 0.0], [0.0, 1.0]])))
    # per pair: a diverged matrix in a trajectory does not spoil the others
    traj = np.stack([np.eye(2), np.full((2, 2), np.nan), 1e300 * np.eye(2), np.zeros((2, 2))])
    out = correlation(traj, np.eye(2))
    np.testing.assert_array_equal(np.isnan(out), [False, True, False, False])
    np.testing.assert_allclose(out[[0, 2, 3]], [1.0, 1.0, 0.0], atol=SCALE_TOL)


def test_correlation_names_unbroadcastable_batches() -> None:
    with pytest.raises(ValueError, match=r"A and B .* A of shape \(3, 2, 2\) and B of shape \(4, 2, 2\)"):
        correlation(np.ones((3, 2, 2)), np.ones((4, 2, 2)))
