"""Malformed arguments to the library's generators and diagnostics (bad-input audit): each is a named
ValueError/TypeError, not a numpy LinAlgError, a silent NaN/inf, a truthy string read as True, an option
silently ignored, or an AttributeError from deep inside."""

from __future__ import annotations

import numpy as np
import pytest

from attsvm import diagnostics, hierarchy, metrics
from attsvm.datasets import hop_instance, paper_instance, random_instance
from attsvm.ntp import random_ntp_problem
from attsvm.problem import AttentionProblem
from attsvm.prompt import paper_joint_problem, paper_loss_problem, random_prompt_problem
from attsvm.svm.equivalence import decomposition, selected_sets
from attsvm.training import train
from attsvm.training.depth import train_deep

ROW_SUM_OFF = 1e-3  # how far from 1 the bad probability rows sum (well past PROBS_SUM_TOL = 1e-6)
PREDICT_RTOL = 1e-12  # RateFit.predict at t = 0 of an exponential against its coefficient


@pytest.fixture(scope="module")
def deep():
    return train_deep(paper_instance(3, 4, 5, seed=0), layers=2, steps=3, record_every=1)


@pytest.fixture(scope="module")
def trained():
    return train(paper_instance(3, 4, 5, seed=0), steps=3)


# ------------------------------------------------------------------ 1. rate_fit / RateFit.predict
@pytest.mark.parametrize("model", ["power", "exp", "auto"])
def test_rate_fit_names_constant_t(model):
    """Every t equal left the slope undetermined: numpy's LinAlgError "Singular matrix"."""
    with pytest.raises(ValueError, match="t must take at least 2 distinct values"):
        diagnostics.rate_fit([2.0, 2.0, 2.0], [1.0, 0.5, 0.25], model=model)


def test_power_predict_refuses_t_outside_its_domain():
    """C·t^(−a) at t ≤ 0 came back as nan/inf with only a RuntimeWarning."""
    fit = diagnostics.rate_fit([1.0, 2.0, 3.0, 4.0], [1.0, 0.5, 0.3, 0.2], model="power")
    with pytest.raises(ValueError, match="t must be > 0"):
        fit.predict([-1.0, 0.0])
    with pytest.raises(TypeError, match="t must hold real numbers"):
        fit.predict(["a"])


def test_exp_predict_keeps_t_le_0():
    """C·e^(−bt) is defined for every t: t = 0 gives C."""
    fit = diagnostics.rate_fit([1.0, 2.0, 3.0, 4.0], [1.0, 0.5, 0.3, 0.2], model="exp")
    assert fit.predict([0.0])[0] == pytest.approx(fit.coef, rel=PREDICT_RTOL)


# ------------------------------------------------------------------ 2. prompt generators
@pytest.mark.parametrize(
    "kwargs, exc, name",
    [
        ({"seed": -1}, ValueError, "seed"),
        ({"seed": 0.5}, TypeError, "seed"),
        ({"margin": np.nan}, ValueError, "margin"),
        ({"margin": -1.0}, ValueError, "margin"),
        ({"margin": "1"}, TypeError, "margin"),
        ({"fixed_head": "no"}, TypeError, "fixed_head"),
    ],
)
def test_random_prompt_problem_checks_its_options(kwargs, exc, name):
    """seed=-1 was numpy's "expected non-negative integer", margin=nan/−1 planted nothing silently and
    fixed_head="no" drew a head."""
    with pytest.raises(exc, match=name):
        random_prompt_problem(3, 3, 3, **kwargs)


@pytest.mark.parametrize("C, exc", [("a", TypeError), ("2", TypeError), (np.nan, ValueError), (np.inf, ValueError)])
def test_paper_loss_problem_checks_C(C, exc):
    """ "a" was float()'s "could not convert string", nan an error about X, "2" accepted."""
    with pytest.raises(exc, match="C must be"):
        paper_loss_problem(C)


def test_paper_joint_problem_checks_tight():
    with pytest.raises(TypeError, match="tight must be a bool"):
        paper_joint_problem("no")


# ------------------------------------------------------------------ 3. ntp generator
@pytest.mark.parametrize(
    "args, kwargs, exc, name",
    [
        ((0, 3, 5, 4), {}, ValueError, "n must"),
        ((2, 3, 5, 0), {}, ValueError, "d must"),
        ((4, 3, 5, 4), {"cyclic": "yes"}, TypeError, "cyclic"),
        ((4, 3, 5, 4), {"cyclic": 1}, TypeError, "cyclic"),
        ((4, 3, 5, 4), {"seed": -1}, ValueError, "seed"),
        ((4, 3, 5, 4), {"max_tries": 0}, ValueError, "max_tries"),
    ],
)
def test_random_ntp_problem_checks_its_arguments(args, kwargs, exc, name):
    """n=0 was np.stack's "need at least one array to stack"; cyclic="yes" was read as True."""
    with pytest.raises(exc, match=name):
        random_ntp_problem(*args, **kwargs)


def test_random_ntp_problem_takes_numpy_bools_and_generators():
    p = random_ntp_problem(4, 3, 5, 4, seed=np.random.default_rng(0), cyclic=np.False_)
    assert not any(g.cyclic for g in p.graphs().values())


# ------------------------------------------------------------------ 4. datasets
def test_hop_instance_needs_two_hops():
    """hops=1 (documented as valid) failed in AttentionProblem: "X must have T >= 2 tokens"."""
    with pytest.raises(ValueError, match="hops must be >= 2"):
        hop_instance(3, 1, 4)


@pytest.mark.parametrize("make", [paper_instance, random_instance])
def test_instances_check_self_attention_and_query_index(make):
    """self_attention="no" built a self-attention problem; query_index=2 without it was ignored."""
    with pytest.raises(TypeError, match="self_attention must be a bool"):
        make(3, 3, 3, seed=0, self_attention="no")
    with pytest.raises(ValueError, match="query_index=2 needs self_attention=True"):
        make(3, 3, 3, seed=0, query_index=2)
    with pytest.raises(TypeError, match="query_index must be an integer"):
        make(3, 3, 3, seed=0, self_attention=True, query_index=1.5)
    assert make(3, 3, 3, seed=0, self_attention=True, query_index=2).query_index == 2


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"head_width": 4}, "head_width"),
        ({"head": "multiclass", "head_width": 4}, "head_width"),
        ({"n_classes": 4}, "n_classes"),
        ({"head": "relu", "n_classes": 4}, "n_classes"),
    ],
)
def test_random_instance_refuses_options_without_effect(kwargs, name):
    """head_width and n_classes were silently ignored by heads that have no such size."""
    with pytest.raises(ValueError, match=f"{name}=4 applies to head="):
        random_instance(3, 3, 3, seed=0, **kwargs)


# ------------------------------------------------------------------ 5. metrics
@pytest.mark.parametrize(
    "fn, name",
    [
        (metrics.singular_values, "W"),
        (metrics.matrix_rank, "W"),
        (metrics.effective_rank, "W"),
        (metrics.nuc_fro_ratio, "W"),
        (lambda W: metrics.correlation(W, np.eye(2)), "A"),
        (lambda W: metrics.correlation(np.eye(2), W), "B"),
    ],
)
def test_metrics_refuse_complex_matrices(fn, name):
    """The imaginary parts were dropped with only a ComplexWarning (corr(iI, I) came back 0)."""
    with pytest.raises(TypeError, match=f"{name} must be a real matrix, got complex"):
        fn(np.eye(2) * (1 + 1j))


# ------------------------------------------------------------------ 6. svm.equivalence
@pytest.mark.parametrize("shape", [(2, 3), (2, 2, 3)])
def test_selected_sets_refuses_unnormalised_rows(shape):
    """Rows summing to 1.4 or 0.2 (scores, not probabilities) were thresholded silently."""
    s = np.full(shape, 1.0 / shape[-1])
    s[..., -1, 0] += ROW_SUM_OFF
    with pytest.raises(ValueError, match="probs rows must sum to 1"):
        selected_sets(s)


def test_decomposition_names_a_zero_W():
    """W = 0 gave residual inf with no word of why."""
    with pytest.raises(ValueError, match="W must be non-zero"):
        decomposition(np.zeros((2, 2)), np.eye(2))


# ------------------------------------------------------------------ 7. hierarchy
@pytest.mark.parametrize("eps, exc", [(0.0, ValueError), (1.0, ValueError), (np.nan, ValueError), ("x", TypeError)])
def test_layer_equivalence_checks_eps(deep, eps, exc):
    """eps=0 put every token in every O_i (no margin row) without a word."""
    with pytest.raises(exc, match="eps"):
        hierarchy.layer_equivalence(deep, 0, 0, eps=eps)


@pytest.mark.parametrize("run, layer, name", [(0.0, 0, "run"), (0, 1.0, "layer"), (True, 0, "run")])
def test_layer_problem_checks_indices(deep, run, layer, name):
    """A float run index was accepted (and used to index the problems)."""
    with pytest.raises(TypeError, match=f"{name} must be an integer index"):
        hierarchy.layer_problem(deep, run, layer)


def test_layer_trajectories_refuses_unrecorded_steps(deep):
    """rolling=[1000] past the last recorded step gave an all-NaN corr_rolling column silently."""
    n_steps = len(deep.history["step"])
    with pytest.raises(ValueError, match=f"rolling must list recorded steps; \\[1000\\].*{n_steps} recorded steps"):
        hierarchy.layer_trajectories(deep, rolling=[1000])


@pytest.mark.parametrize(
    "call",
    [
        lambda: hierarchy.layer_svms("x"),
        lambda: hierarchy.layer_trajectories("x"),
    ],
)
def test_hierarchy_names_a_wrong_result(call):
    """layer_svms("x") was an AttributeError ('str' object has no attribute 'selected')."""
    with pytest.raises(TypeError, match="result must be a DeepResult"):
        call()


# ------------------------------------------------------------------ 8. diagnostics
@pytest.mark.parametrize(
    "fn",
    [
        diagnostics.convergence_types,
        diagnostics.correlation_trajectories,
        diagnostics.svm_equivalence,
        diagnostics.mixture_prediction,
    ],
)
def test_diagnostics_name_a_wrong_result(fn, deep):
    """A DeepResult (or any non-TrainResult) was an AttributeError from inside."""
    with pytest.raises(TypeError, match="result must be a TrainResult"):
        fn(deep)


@pytest.mark.parametrize("run, exc", [(0.5, TypeError), (True, TypeError), (-1, ValueError)])
def test_svm_equivalence_checks_run(trained, run, exc):
    with pytest.raises(exc, match="run"):
        diagnostics.svm_equivalence(trained, run)


def test_convergence_type_checks_both_norms(trained):
    """both_norms="no" was read as True."""
    with pytest.raises(TypeError, match="both_norms must be a bool"):
        diagnostics.convergence_type(trained.problem(0), trained.W[0], both_norms="no")


# ------------------------------------------------------------------ 9. from_npz
@pytest.mark.parametrize("bad", ["X", "head_kind"])
def test_from_npz_says_plainly_that_pickles_are_refused(tmp_path, bad):
    """The message was numpy's "Object arrays cannot be loaded when allow_pickle=False"."""
    arrays = {"X": np.ones((1, 2, 2)), "y": np.ones(1), "head_kind": np.array("linear"), "head_weights": np.ones(2)}
    arrays[bad] = np.array([{"a": 1}], dtype=object)
    path = tmp_path / "p.npz"
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=f"holds pickled Python objects \\(arrays \\['{bad}'\\]\\)") as err:
        AttentionProblem.from_npz(path)
    assert "allow_pickle" not in str(err.value)
