"""Malformed arguments to the S_fin basis and the several-layer diagnostics (stop-7 audit): each is a named
error, not a silent empty basis, a threshold that can never be met, or a raw builtin error."""

from __future__ import annotations

import numpy as np
import pytest

from attsvm import hierarchy
from attsvm.datasets import paper_instance
from attsvm.ntp import random_ntp_problem
from attsvm.svm.graph import fin_basis
from attsvm.training.depth import train_deep


@pytest.fixture(scope="module")
def deep():
    return train_deep(paper_instance(3, 4, 5, seed=0), layers=2, steps=3, record_every=1)


@pytest.mark.parametrize(
    "rtol, exc", [(-1.0, ValueError), (1.0, ValueError), (np.nan, ValueError), ("1e-10", TypeError)]
)
def test_fin_basis_checks_rtol(rtol, exc):
    with pytest.raises(exc, match="rtol"):
        fin_basis(random_ntp_problem(4, 3, 5, 4, seed=0), rtol)


@pytest.mark.parametrize("rolling", ["yes", [0.5], [True], 3])
def test_layer_trajectories_checks_rolling(deep, rolling):
    with pytest.raises(TypeError, match="rolling must be True, False or a list of recorded steps"):
        hierarchy.layer_trajectories(deep, rolling=rolling)


def test_layer_trajectories_takes_numpy_steps_and_bools(deep):
    steps = np.asarray(deep.history["step"][:2])
    traj = hierarchy.layer_trajectories(deep, rolling=steps)
    rolled = traj.dropna(subset=["corr_rolling"]).step.unique()
    assert set(rolled) <= set(steps.tolist()) and len(rolled) > 0
    assert hierarchy.layer_trajectories(deep, rolling=np.False_).corr_rolling.isna().all()


@pytest.mark.parametrize("tau", [5.0, -2.0, np.inf])
def test_settle_steps_checks_tau(deep, tau):
    traj = hierarchy.layer_trajectories(deep, rolling=False)
    with pytest.raises(ValueError, match="tau"):
        hierarchy.settle_steps(traj, tau=tau)


def test_settle_steps_names_a_missing_table():
    with pytest.raises(TypeError, match="traj must be the DataFrame of layer_trajectories"):
        hierarchy.settle_steps(None)
