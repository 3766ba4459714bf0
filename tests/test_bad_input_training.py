"""Extreme and malformed inputs to the trainers of attsvm.training (the stop-7 bad-input audit).

Two kinds of defect are pinned here: numbers that leave the float64 range in an intermediate but not in
the result (a Frobenius norm whose square overflows), and arguments that were silently misread (a string
flag read as True, a missing mask read as "no position") or that failed with a raw numpy/builtin error.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attsvm
from attsvm.datasets import paper_instance
from attsvm.metrics import correlation
from attsvm.ntp import NextTokenProblem, random_ntp_problem
from attsvm.training import Recording, cone_init, optim, regularization_path
from attsvm.training.depth import train_deep
from attsvm.training.joint import head_svm_constraints, train_joint
from attsvm.training.ntp import ntp_batch, ntp_loss_and_grad, train_ntp
from attsvm.training.prompt import train_prompt

# relative agreement of two float64 evaluations of the same norm or step
REL = 1e-12


@pytest.fixture(scope="module")
def problem():
    return paper_instance(3, 4, 5, seed=0)


@pytest.fixture(scope="module")
def ntp_problem():
    return random_ntp_problem(4, 3, 5, 4, seed=0)


# ---------------------------------------------------------------- norms beyond sqrt(float64 max)


@pytest.mark.parametrize("scale", [1e-200, 1e-150, 1.0, 1e150, 1e200, 1e300])
def test_fro_norm_is_exact_at_any_scale(scale):
    A = torch.as_tensor(np.random.default_rng(0).standard_normal((3, 4, 4)))
    want = torch.linalg.vector_norm(A, dim=(-2, -1)) * scale
    got = optim.fro_norm(A * scale)
    assert torch.allclose(got, want, rtol=REL, atol=0.0)


def test_fro_norm_keeps_inf_nan_and_zero():
    A = torch.zeros((3, 2, 2), dtype=torch.float64)
    A[1, 0, 0] = np.inf
    A[2, 1, 1] = np.nan
    got = optim.fro_norm(A)
    assert got[0] == 0.0 and got[1] == np.inf and torch.isnan(got[2])


@pytest.mark.parametrize("penalty", [1e160, 1e200])
def test_normalized_gd_with_a_huge_penalty_shrinks_W(problem, penalty):
    # the penalty gradient 2λW dominates: each normalized step moves W by lr along −W/‖W‖,
    # so ‖W‖ falls by lr per step (the old code divided by an overflowed norm and did not move)
    res = attsvm.train(problem, steps=5, penalty=penalty, normalized=True, lr=0.1)
    wn = res.history["W_norm"][0]
    assert np.allclose(np.diff(wn), -0.1, rtol=1e-9)


def test_normalize_by_norm_matches_the_plain_formula_where_both_are_finite():
    u = torch.as_tensor(np.random.default_rng(1).standard_normal((4, 3, 3)))
    (out,), _ = optim.NormalizeByNorm().update((u * 1e200,), None, (u,), loss=torch.zeros(4), step=0)
    want = u / torch.linalg.vector_norm(u, dim=(-2, -1), keepdim=True)
    assert torch.allclose(out, want, rtol=REL, atol=1e-300)


def test_huge_W_norm_is_recorded_finite(problem):
    res = attsvm.train(problem, steps=2, init=np.full((5, 5), 1e200))
    assert np.allclose(res.history["W_norm"], 5e200, rtol=REL)


@pytest.mark.parametrize("factor", [1e-200, 1e200, 1e300])
def test_cone_init_is_scale_free(factor):
    C = np.random.default_rng(0).standard_normal((4, 4))
    W0 = cone_init(C, runs=5, mu=0.1, seed=3)
    W = cone_init(C * factor, runs=5, mu=0.1, seed=3)
    assert np.allclose(W, W0, rtol=1e-12, atol=1e-15)
    corr = correlation(W, np.broadcast_to(C, W.shape))
    assert np.all(corr >= 0.9 - 1e-12)


def test_cone_init_of_a_1x1_center_is_its_sign():
    W = cone_init([[-3.0]], runs=2, scale=2.0)
    assert np.array_equal(W, np.full((2, 1, 1), -2.0))


@pytest.mark.parametrize("seed", [-1, 1.5, None, "0"])
def test_cone_init_checks_the_seed(seed):
    with pytest.raises((TypeError, ValueError), match="seed"):
        cone_init(np.eye(3), seed=seed)


# ---------------------------------------------------------------- trainers that diverge say so


def test_train_joint_near_p_1_warns_instead_of_returning_nan_silently(problem):
    with pytest.warns(RuntimeWarning, match="non-finite"):
        train_joint(problem, p=1.000001, steps=20)


def test_train_joint_names_the_problem_of_another_shape(problem):
    other = paper_instance(3, 5, 5, seed=1)
    with pytest.raises(ValueError, match=r"problems\[1\]"):
        train_joint([problem, other], p=2.0, steps=1)


# ---------------------------------------------------------------- next-token training


@pytest.mark.parametrize("eps", [float("nan"), -1.0, "0"])
def test_train_ntp_checks_eps(ntp_problem, eps):
    with pytest.raises((TypeError, ValueError), match="eps"):
        train_ntp(ntp_problem, steps=1, eps=eps)


def test_train_ntp_names_a_non_problem():
    with pytest.raises(TypeError, match="problems must be a NextTokenProblem"):
        train_ntp(None, steps=1)


def test_train_ntp_normalized_step_survives_a_huge_gradient(ntp_problem):
    # embeddings of 1e80 give a gradient of ~1e159 at W = 0, whose squared norm overflows: the normalized
    # step must still have norm lr (the old code divided by inf and did not move)
    big = NextTokenProblem(ntp_problem.tokens, ntp_problem.labels, ntp_problem.E * 1e80)
    res = train_ntp(big, steps=1, lr=1.0, W0=np.zeros((4, 4)))
    assert np.linalg.norm(res.W[0]) == pytest.approx(1.0, rel=1e-9)


@pytest.mark.parametrize(
    "valid, exc",
    [([None], ValueError), ([np.ones((4, 3), dtype=np.int64)], ValueError), ([], ValueError), ("x", TypeError)],
)
def test_ntp_batch_checks_valid(ntp_problem, valid, exc):
    with pytest.raises(exc, match="valid"):
        ntp_batch(ntp_problem, valid=valid)


def test_ntp_batch_refuses_a_bare_mask(ntp_problem):
    with pytest.raises(TypeError, match="valid must be a list"):
        ntp_batch(ntp_problem, valid=np.ones((ntp_problem.n, ntp_problem.T), dtype=bool))


@pytest.mark.parametrize("W", [np.zeros((4, 4)), np.zeros((2, 4, 4)), np.full((1, 4, 4), np.nan)])
def test_ntp_loss_and_grad_checks_W(ntp_problem, W):
    with pytest.raises(ValueError, match="W must"):
        ntp_loss_and_grad(ntp_batch(ntp_problem), W)


# ---------------------------------------------------------------- flags are bools, not truthy strings


def test_string_flags_are_refused(problem, ntp_problem):
    with pytest.raises(TypeError, match="normalized must be a bool"):
        train_ntp(ntp_problem, steps=1, normalized="no")
    with pytest.raises(TypeError, match="normalized must be a bool"):
        train_joint(problem, p=2.0, steps=1, normalized="no")
    with pytest.raises(TypeError, match="normalized must be a bool"):
        optim.mirror_descent(1.5, 0.1, normalized="yes")
    with pytest.raises(TypeError, match="excess must be a bool"):
        optim.PolyakStep(excess="no")


def test_train_prompt_flags_are_bools():
    from attsvm.prompt import random_prompt_problem

    pp = random_prompt_problem(4, 3, 3, seed=0)
    with pytest.raises(TypeError, match="train_v must be a bool"):
        train_prompt(pp, steps=1, train_v="no")
    with pytest.raises(TypeError, match="normalized must be a bool"):
        train_prompt(pp, steps=1, normalized="no")


@pytest.mark.parametrize("max_lr, exc", [(None, TypeError), ("1", TypeError), (0.0, ValueError), (-1, ValueError)])
def test_polyak_checks_max_lr(max_lr, exc):
    with pytest.raises(exc, match="max_lr"):
        optim.polyak(max_lr=max_lr)


# ---------------------------------------------------------------- several layers, the path, recording


def test_train_deep_checks_its_layer_maps(problem):
    with pytest.raises(ValueError, match=r"init must map layer indices in \[0, 2\)"):
        train_deep(problem, layers=2, steps=1, init={5: np.eye(5)})
    with pytest.raises(TypeError, match="frozen must be a dict"):
        train_deep(problem, layers=2, steps=1, frozen=[np.eye(5)])
    with pytest.raises(ValueError, match="both frozen and given an init"):
        train_deep(problem, layers=2, steps=1, frozen={0: np.eye(5)}, init={0: np.eye(5)})


def test_regularization_path_checks_its_references(problem):
    with pytest.raises(ValueError, match="W_mm must be nonzero"):
        regularization_path(problem, [1.0, 2.0], W_mm=np.zeros((5, 5)))
    with pytest.raises(ValueError, match="m is the rank"):
        regularization_path(problem, [1.0, 2.0], m=2)


def test_recording_without_loss_explains_final_loss(problem):
    res = attsvm.train(problem, steps=1, record=Recording(quantities=("W_norm",)))
    with pytest.raises(AttributeError, match="final_loss needs the recorded loss"):
        _ = res.final_loss


def test_recording_quantities_must_be_a_tuple():
    with pytest.raises(TypeError, match=r"record\.quantities"):
        Recording(quantities=None)


def test_head_svm_constraints_names_a_non_problem():
    with pytest.raises(TypeError, match="problem must be an AttentionProblem"):
        head_svm_constraints(None, [0, 1, 2])


def test_train_deep_warns_when_its_iterates_overflow(problem):
    with pytest.warns(RuntimeWarning, match="train_deep produced non-finite"):
        train_deep(problem, layers=1, steps=2, lr=1e308, init={0: np.full((5, 5), 1.7e308)})


def test_a_history_that_cannot_fit_in_memory_is_a_named_error(problem):
    # 1e13 records: numpy's MemoryError (72 TiB of step indices) used to surface as an internal error
    with pytest.raises(ValueError, match="raise record_every"):
        attsvm.train(problem, steps=10**13)


def test_history_buffers_too_large_for_memory_are_a_named_error(problem):
    # 1e12 floats per quantity: numpy holds the 1e7 step indices, torch's allocator refuses the buffers
    with pytest.raises(ValueError, match="does not fit in memory"):
        attsvm.train(problem, steps=10**7, n_init=10**5)
