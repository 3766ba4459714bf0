"""Malformed arguments and extreme scales in the model, tokens, bounds and span helpers (stop-8 audit 9).

Each is a named error where it used to be a raw torch/numpy error, a silently wrong answer (a string
flag read as True, an init of the wrong size, a rescaled W changing the selected tokens) or NaN.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attsvm
from attsvm import model as M
from attsvm import tokens as tk
from attsvm.problem import AttentionProblem
from attsvm.training import bounds, span
from attsvm.training.optim import StepSize

HUGE = 1e200  # data scale at which x_itᵀ W z_i overflows for ‖W‖ ≈ 1e120


@pytest.fixture
def parts():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3, 4, 2))
    return X, np.array([1.0, -1.0, 1.0]), np.array([1.0, 0.5]), rng.standard_normal((3, 2))


@pytest.fixture
def P(parts):
    X, y, v, Z = parts
    return AttentionProblem(X, y, v, Z=Z)


@pytest.fixture
def P_huge(parts):
    X, y, v, Z = parts
    return AttentionProblem(X * HUGE, y, v, Z=Z)


W0 = np.array([[1.0, -2.0], [3.0, 0.5]])


# ------------------------------------------------------------------------------------------------- model
@pytest.mark.parametrize(
    "make, exc, named",
    [
        (lambda: M.FullW(0), ValueError, "d must be >= 1"),
        (lambda: M.FullW("2"), TypeError, "d must be an integer"),
        (lambda: M.FactoredKQ(2, -1), ValueError, "m must be >= 1"),
        (lambda: M.FactoredKQ(2, 1.5), TypeError, "m must be an integer"),
        (lambda: M.FullW(2).draw("bogus", torch.Generator(), 1.0), ValueError, "kind"),  # (was Gaussian)
        (lambda: M.FullW(2).draw("gaussian", torch.Generator(), float("nan")), ValueError, "scale"),
        (lambda: M.FullW(2).from_W(np.eye(3)), ValueError, r"W must have shape \(2, 2\)"),  # (a 3×3 init)
        (lambda: M.FactoredKQ(2, 2).from_W(np.full((2, 2), np.nan)), ValueError, "W must be finite"),
        (lambda: M.FullW(2).zeros(0), ValueError, "runs"),
        (lambda: M.resolve_loss("logistic", "bogus_head"), ValueError, "head_kind"),
        (lambda: M.AttentionModel(2, dtype=torch.int64), TypeError, "dtype"),
        (lambda: M.AttentionModel(2, device="nope"), ValueError, "device"),
        (lambda: M.AttentionModel(2).load([np.full((1, 2, 2), np.nan)]), ValueError, r"params\['weight'\]"),
        (lambda: M.AttentionModel(2).load([np.ones((1, 2, 2), dtype=complex)]), TypeError, r"params\['weight'\]"),
        (lambda: M.AttentionModel(2).load([np.ones((1, 2, 2), dtype=bool)]), TypeError, r"params\['weight'\]"),
        (lambda: M.AttentionModel(2).load(None), TypeError, "params"),
        (lambda: M.AttentionModel(2)("x"), TypeError, "batch must be a Batch"),
    ],
)
def test_model_arguments_are_named(make, exc, named):
    with pytest.raises(exc, match=named):
        make()


def test_numpy_sizes_are_plain_ints():
    assert type(M.FullW(np.int64(3)).d) is int and type(M.FactoredKQ(np.int64(3), np.int64(2)).m) is int


def test_batch_checks_dtype_device_and_its_fields(P):
    with pytest.raises(TypeError, match="dtype"):
        M.Batch.from_problems(P, dtype=torch.int64)  # (truncated the data to integers)
    with pytest.raises(TypeError, match="dtype"):
        M.Batch.from_problems(P, dtype="float64")
    with pytest.raises(ValueError, match="device"):
        M.Batch.from_problems(P, device="nope")
    b = M.Batch.from_problems(P)
    with pytest.raises(ValueError, match="loss"):
        M.Batch(X=b.X, Z=b.Z, y=b.y, V=b.V, head=b.head, loss="bogus")  # (risk used the correlation loss)
    with pytest.raises(TypeError, match=r"Batch\.X"):
        M.Batch(X=b.X.numpy(), Z=b.Z, y=b.y, V=b.V, head=b.head, loss=b.loss)


def test_forward_functions_check_W(P):
    b = M.Batch.from_problems(P)
    with pytest.raises(ValueError, match=r"W must have shape \(R, 2, 2\)"):
        M.risk_and_grad(b, torch.zeros(1, 5, 5, dtype=torch.float64))
    with pytest.raises(TypeError, match="W must be a torch tensor"):
        M.attention_logits(b, np.zeros((1, 2, 2)))
    with pytest.raises(ValueError, match="dtype and device"):
        M.attention_probs(b, torch.zeros(1, 2, 2, dtype=torch.float32))
    with pytest.raises(ValueError, match="W must be finite"):
        M.risk_and_grad(b, torch.full((1, 2, 2), float("inf"), dtype=torch.float64))
    with pytest.raises(TypeError, match="m must be an integer"):
        M.AttentionModel(2, param="W", m="abc")
    model32 = M.AttentionModel(2, dtype=torch.float32)  # (a float64 batch: a raw "expected scalar type")
    with pytest.raises(ValueError, match="dtype and device"):
        model32(b)


def test_attention_probs_at_overflowing_logits_is_the_limit_not_nan(P_huge):
    b = M.Batch.from_problems(P_huge)
    W = torch.tensor(W0 * 1e120)[None]
    s = M.attention_probs(b, W)
    assert torch.isfinite(s).all()
    assert torch.allclose(s.sum(-1), torch.ones(1, 3, dtype=torch.float64))
    want = tk.selected_tokens(P_huge, W0)  # (the maximisers of the logits, the scaling being positive)
    assert s[0].argmax(-1).tolist() == want.tolist() and bool(torch.isfinite(M.risk(b, W)).all())


def test_only_the_sequences_whose_logits_overflow_take_the_limit(parts):
    X, y, v, Z = parts
    X2 = X.copy()
    X2[0] *= HUGE  # at ‖W‖ ≈ 1e120 sequence 0 overflows; sequences 1 and 2, scaled by 1e-120, have O(1) logits
    X2[1:] *= 1e-120
    b = M.Batch.from_problems(AttentionProblem(X2, y, v, Z=Z))
    W = torch.tensor(W0 * 1e120)[None]
    s = M.attention_probs(b, W)
    assert torch.isfinite(s).all() and s[0, 0].max().item() == 1.0
    ref = torch.softmax(M.attention_logits(b, W)[:, 1:], dim=-1)  # (the limit for all was wrong for these)
    assert torch.equal(s[:, 1:], ref) and bool((ref < 0.99).all())  # (not saturated: a limit would differ)


def test_training_on_data_too_large_for_the_gradient_is_refused(parts):
    X, y, v, Z = parts
    with pytest.raises(ValueError, match=r"too large to train on in float64.*rescale X"):
        attsvm.train(AttentionProblem(X * HUGE, y, v, Z=Z), steps=5, init=W0)  # (ended with W all NaN)
    r = attsvm.train(AttentionProblem(X * 1e150, y, v, Z=Z), steps=5, init=W0)
    assert np.isfinite(r.W).all()


# ------------------------------------------------------------------------------------------------ tokens
def test_selected_tokens_do_not_change_when_W_is_scaled_past_overflow(P_huge):
    assert tk.selected_tokens(P_huge, W0 * 1e120).tolist() == tk.selected_tokens(P_huge, W0).tolist()


def test_margins_past_overflow_are_signed_infinities_not_nan(P_huge, P):
    m = tk.margins(P_huge, None, W0 * 1e120)
    assert not np.isnan(m).any()
    ref = tk.margins(P, None, W0)  # same signs: the scaling is positive
    assert (np.sign(m) == np.sign(ref)).all()


@pytest.mark.parametrize(
    "call, exc, named",
    [
        (lambda P: tk.local_optimality_report(P, [0, 0, 0], np.zeros((3, 4), bool), "no"), TypeError, "feasible"),
        (lambda P: tk.local_optimality_report(P, [0, 0, 0], None, True), ValueError, "support is required"),
        (lambda P: tk.local_optimality_report("P", [0, 0, 0], None, False), TypeError, "problem"),
        (lambda P: tk.local_optimality_report(P, [0, 0, 0], np.zeros((2, 2), bool), True), ValueError, "support"),
        (lambda P: tk.support_tokens(np.ones((2, 2)), tol=-1), ValueError, "tol"),
        (lambda P: tk.support_tokens(np.ones((2, 2)), tol=float("nan")), ValueError, "tol"),
        (lambda P: tk.support_tokens(np.ones((2, 2), dtype=complex)), TypeError, "margin"),
        (lambda P: tk.support_tokens(None), TypeError, "NoneType"),
        (lambda P: tk.constraint_mask(3, 4, np.array([0, 1, 9])), ValueError, "tokens"),
        (lambda P: tk.constraint_mask(3, 4, np.array([0, 1, -1])), ValueError, "tokens"),  # (wrapped silently)
        (lambda P: tk.differences(np.full((3, 2), np.nan), P.X), ValueError, "sel must be finite"),
        (lambda P: tk.differences(np.zeros((2, 2)), P.X), ValueError, "same n and d"),
    ],
)
def test_token_helpers_name_their_arguments(P, call, exc, named):
    with pytest.raises(exc, match=named):
        call(P)


# ------------------------------------------------------------------------------------------ bounds, span
@pytest.mark.parametrize("scale", [(1e155, 1, 1), (HUGE, 1, 1), (1, HUGE, 1), (1, 1, HUGE)])
@pytest.mark.parametrize("loss", ["logistic", "exponential", "correlation"])
def test_bounds_at_huge_scales_are_never_nan(parts, scale, loss):
    X, y, v, Z = parts
    p = AttentionProblem(X * scale[0], y, v * scale[1], Z=Z * scale[2])
    for f in (bounds.smoothness_bound, bounds.gradient_bound):
        assert not np.isnan(f(p, loss)), (f.__name__, scale, loss)


def test_bounds_on_ordinary_data_are_unchanged(P):
    # the log-space fallback agrees with the direct formula where both apply
    for loss in ("logistic", "exponential", "correlation"):
        lG, lB = bounds._log_head_constants(P, loss)
        lr, lz = bounds._log_radii(P)
        terms = 2 * lr + 2 * lz + np.logaddexp(lB + 2 * lr, np.log(2.0) + lG + lr)
        assert bounds._exp_mean(terms) == pytest.approx(bounds.smoothness_bound(P, loss), rel=1e-12)
        assert bounds._exp_mean(lG + 2 * lr + lz) == pytest.approx(bounds.gradient_bound(P, loss), rel=1e-12)


@pytest.mark.parametrize(
    "call, exc, named",
    [
        (lambda: span.span_well_conditioned(torch.eye(3)), ValueError, "K must be a stack"),
        (lambda: span.span_well_conditioned(torch.ones(0, 3, 3)), ValueError, "K must be a stack"),
        (lambda: span.span_well_conditioned(np.eye(3)[None]), TypeError, "K must be a torch tensor"),
        (lambda: span.span_is_cheaper(-3, 4, 2, 10), ValueError, "n must be >= 1"),
        (lambda: span.span_is_cheaper(3.5, 4, 2, 10), TypeError, "n must be an integer"),
        (lambda: span.span_kernel("x"), TypeError, "batch must be a Batch"),
        (lambda: span.span_plan(None, StepSize(0.1)), TypeError, "par must be a Parameterization"),
        (lambda: span.span_plan(M.FullW(2), "gd"), TypeError, "rule must be a Transform"),
    ],
)
def test_span_helpers_name_their_arguments(call, exc, named):
    with pytest.raises(exc, match=named):
        call()
