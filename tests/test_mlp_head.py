"""MLP heads (docs/spec.md §5): the head, its gradients in the trainer, the reduction to the ReLU head,
batching, joint head training and bad input.

Independent references: a numpy risk (problem.head + a stable softmax) differentiated by central
differences; the existing ReLU head, which an MLP head with activation "relu" must reproduce bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attsvm import train
from attsvm.datasets import mlp_head
from attsvm.model import Batch, risk_and_grad
from attsvm.problem import AttentionProblem, Head, loss_fn
from attsvm.training.head import train_with_head

TOL_FD = 1e-6  # analytic vs central-difference gradient, relative
FD_STEP = 1e-6
TOL_BATCH = 1e-10  # batched vs looped training
ACTS = ["relu", "gelu", "silu", "swiglu"]


def _problem(activation: str, depth: int, seed: int = 0, d: int = 5) -> AttentionProblem:
    rng = np.random.default_rng(seed)
    h = mlp_head(d, width=4, depth=depth, activation=activation, seed=rng)
    X = rng.standard_normal((3, 4, d))
    return AttentionProblem(X, [1.0, -1.0, 1.0], h, Z=rng.standard_normal((3, d)))


def _np_risk(p: AttentionProblem, W: np.ndarray) -> float:
    s = p.softmax(W)
    o = np.einsum("nt,ntd->nd", s, p.X)
    return float(loss_fn(p.loss, p.y * p.head(o)).mean())


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("depth", [1, 2])
def test_mlp_head_gradient_matches_finite_differences(activation, depth):
    p = _problem(activation, depth, seed=depth)
    W = np.random.default_rng(7).standard_normal((p.d, p.d))
    _, G, _ = risk_and_grad(Batch.from_problems(p), torch.tensor(W)[None])
    G = G.numpy()[0]
    fd = np.zeros_like(W)
    for a in range(p.d):
        for b in range(p.d):
            E = np.zeros_like(W)
            E[a, b] = FD_STEP
            fd[a, b] = (_np_risk(p, W + E) - _np_risk(p, W - E)) / (2 * FD_STEP)
    assert np.linalg.norm(G - fd) <= TOL_FD * max(1.0, np.linalg.norm(fd))


@pytest.mark.parametrize("activation", ACTS)
def test_the_written_out_head_derivative_equals_autograd(activation):
    from attsvm.model import mlp_rest
    from attsvm.model.attention import mlp_rest_and_grad

    b = Batch.from_problems([_problem(activation, 3, seed=s) for s in range(3)])
    k = b.XV.shape[-1]
    a = 3 * torch.randn((3, 3, k), dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    a_ = a.clone().requires_grad_(True)
    f_ = mlp_rest(b, a_)
    (J_,) = torch.autograd.grad(f_.sum(), a_)
    f, J = mlp_rest_and_grad(b, a)
    assert torch.equal(f, f_.detach())  # (the same forward operations)
    assert torch.allclose(J, J_, rtol=1e-13, atol=1e-13 * float(J_.abs().max()))


def test_scores_use_the_mlp_head():
    p = _problem("gelu", 2)
    assert np.allclose(p.scores, -loss_fn("logistic", p.y[:, None] * p.head(p.X)))


@pytest.mark.parametrize("param", ["W", "KQ"])
def test_relu_mlp_head_reproduces_the_relu_head_exactly(param):
    rng = np.random.default_rng(3)
    V = rng.standard_normal((6, 6))
    X, Z = rng.standard_normal((3, 4, 6)), rng.standard_normal((3, 6))
    y = [1.0, -1.0, -1.0]
    old = AttentionProblem(X, y, Head.relu(V), Z=Z)
    new = AttentionProblem(X, y, Head.mlp(V, activation="relu"), Z=Z)
    kw = dict(param=param, steps=200, lr=0.1, normalized=True, seed=4, record_W=True, progress=False)
    a, b = train(old, **kw), train(new, **kw)
    assert np.array_equal(a.history["W"], b.history["W"])
    assert np.allclose(new.scores, old.scores, rtol=1e-14, atol=0)  # (ones-dot vs sum: last-ulp round-off)


@pytest.mark.parametrize("param", ["W", "KQ"])
def test_batched_equals_looped_with_mlp_heads(param):
    probs = [_problem("swiglu", 2, seed=s) for s in range(3)]
    kw = dict(param=param, steps=60, lr=0.1, normalized=True, record_W=True, progress=False)
    batched = train(probs, seed=[5, 6, 7], **kw)
    for r, p in enumerate(probs):
        alone = train(p, seed=[5 + r], **kw)
        assert np.abs(batched.W[r] - alone.W[0]).max() <= TOL_BATCH


def test_train_with_head_batched_equals_looped_and_moves_the_head():
    probs = [_problem("gelu", 2, seed=s) for s in range(3)]
    out = train_with_head(probs, steps=40, lr=0.1, seed=[1, 2, 3], record_every=10)
    for r, p in enumerate(probs):
        one = train_with_head(p, steps=40, lr=0.1, seed=[1 + r], record_every=10)
        assert np.abs(out.W[r] - one.W[0]).max() <= TOL_BATCH
        assert np.abs(out.heads[r].weights - one.heads[0].weights).max() <= TOL_BATCH
        assert not np.allclose(out.heads[r].weights, p.head.weights)  # the head trained
        assert out.heads[r].mlp_spec.activation == "gelu" and out.heads[r].mlp_spec.depth == 2
    assert np.all(out.history["loss"][:, -1] < out.history["loss"][:, 0])


def test_train_with_head_decreases_the_loss_below_fixed_head_training():
    p = _problem("gelu", 1, seed=11)
    fixed = train(p, steps=300, lr=0.1, normalized=True, seed=0, progress=False)
    joint = train_with_head(p, steps=300, lr=0.1, seed=0, record_every=300)
    assert joint.history["loss"][0, -1] < fixed.history["loss"][0, -1]


def test_train_with_head_refuses_other_heads():
    rng = np.random.default_rng(0)
    p = AttentionProblem(
        rng.standard_normal((2, 3, 4)), [1, -1], Head.relu(rng.standard_normal((4, 2))), Z=np.ones((2, 4))
    )
    with pytest.raises(ValueError, match=r"Head\.mlp"):
        train_with_head(p, steps=1)


def test_npz_round_trip(tmp_path):
    p = _problem("swiglu", 2)
    p.to_npz(tmp_path / "p.npz")
    q = AttentionProblem.from_npz(tmp_path / "p.npz")
    assert np.array_equal(q.head(p.X), p.head(p.X)) and q.head.mlp_spec.depth == 2


@pytest.mark.parametrize("activation", ["swiglu", "relu"])
def test_an_npz_whose_mlp_width_contradicts_its_weights_is_refused(tmp_path, activation):
    p = _problem(activation, 1)
    p.to_npz(tmp_path / "p.npz")
    arrays = dict(np.load(tmp_path / "p.npz"))
    arrays["mlp_width"] = np.array(int(arrays["mlp_width"]) - 1)  # (was read as a narrower head and accepted)
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=r"mlp_width .* contradicts head_weights"):
        AttentionProblem.from_npz(tmp_path / "bad.npz")


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: Head.mlp(np.ones((3, 2)), activation="tanh"), "activation"),
        (lambda: Head.mlp(np.ones((3, 0))), "hidden width"),
        (lambda: Head.mlp(np.ones((3, 2)), hidden=[np.ones((2, 0))]), r"hidden\[0\]"),
        (lambda: Head.mlp(np.ones((3, 2)), hidden=[np.ones((5, 2))]), r"hidden\[0\]"),
        (lambda: Head.mlp(np.ones((3, 2)), activation="swiglu"), "gate"),
        (lambda: Head.mlp(np.ones((3, 2)), gate=np.ones((3, 2))), "gate"),
        (lambda: Head.mlp(np.ones((3, 2)), out=np.ones(3)), "out"),
        (lambda: mlp_head(4, depth=0), "depth"),
        (lambda: mlp_head(4, width=0), "width"),
        (lambda: mlp_head(4, activation="sigmoid"), "activation"),
        (lambda: AttentionProblem(np.ones((2, 3, 4)), [1, -1], mlp_head(5), Z=np.ones((2, 4))), "d=5"),
    ],
)
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_auto_step_needs_a_bound_that_mlp_heads_do_not_have():
    with pytest.raises(ValueError, match="lr='auto'"):
        train(_problem("gelu", 1), steps=2, normalized=False, lr="auto", progress=False)
