"""Several attention layers (docs/spec.md §8, "Depth"): the model, its gradient, the batched trainer, the
per-layer SVMs and the two-hop instances.

Independent references: the one-layer trainer (:func:`attsvm.train`) for L = 1; a numpy forward pass
differentiated by central differences; the one-layer Att-SVM on hand-built inputs for a frozen layer.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attsvm import AttentionProblem, AttentionSVM, train
from attsvm.datasets import hop_instance, mlp_head, paper_instance
from attsvm.hierarchy import layer_equivalence, layer_problem, layer_svms, layer_trajectories, settle_steps
from attsvm.model import Batch, risk_and_grad
from attsvm.training.depth import StableSoftmax, deep_forward, train_deep

TOL_FD = 1e-6  # autograd (stable softmax) vs central differences, relative
FD_STEP = 1e-6
TOL_ONE_LAYER = 1e-10  # L = 1 against the one-layer trainer
TOL_BATCH = 1e-10  # batched vs looped
TOL_DIRECTION = 1e-10  # 1 − cos of saturated gradients
TOL_SVM = 1e-7  # a frozen layer's SVM vs the one-layer SVM on the same inputs, relative


def _np_risk(X, Z, y, v, Ws) -> float:
    z, o = Z, None
    for W in Ws:
        g = np.einsum("ntd,de,ne->nt", X, W, z)
        g = g - g.max(-1, keepdims=True)
        s = np.exp(g) / np.exp(g).sum(-1, keepdims=True)
        o = np.einsum("nt,ntd->nd", s, X)
        z = z + o
    return float(np.logaddexp(0, -y * (o @ v)).mean())


def test_gradient_of_two_layers_matches_finite_differences():
    rng = np.random.default_rng(0)
    n, T, d = 4, 5, 3
    X, Z = rng.standard_normal((n, T, d)), rng.standard_normal((n, d))
    y, v = rng.choice([-1.0, 1.0], n), rng.standard_normal(d)
    Ws = [rng.standard_normal((d, d)) for _ in range(2)]
    Wt = [torch.tensor(W)[None].requires_grad_(True) for W in Ws]
    o, _, _ = deep_forward(torch.tensor(X)[None], torch.tensor(Z)[None], Wt)
    risk = torch.nn.functional.softplus(-torch.tensor(y) * (o[0] @ torch.tensor(v))).mean()
    grads = torch.autograd.grad(risk, Wt)
    for ell in range(2):
        fd = np.zeros((d, d))
        for a in range(d):
            for b in range(d):
                E = np.zeros((d, d))
                E[a, b] = FD_STEP
                hi = [W + E if j == ell else W for j, W in enumerate(Ws)]
                lo = [W - E if j == ell else W for j, W in enumerate(Ws)]
                fd[a, b] = (_np_risk(X, Z, y, v, hi) - _np_risk(X, Z, y, v, lo)) / (2 * FD_STEP)
        assert np.linalg.norm(grads[ell].numpy()[0] - fd) <= TOL_FD * max(1.0, np.linalg.norm(fd))


def test_stable_softmax_keeps_the_saturated_gradient():
    """At a saturated W the one-layer gradient through StableSoftmax has the direction of the trainer's
    analytic one (autograd's plain softmax loses it to cancellation)."""
    p = paper_instance(4, 6, 5, seed=1)
    alpha = np.argmax(p.logits(np.eye(5)), axis=1)
    svm = AttentionSVM().fit(p, alpha)
    W = torch.tensor(40.0 * svm.W_)[None]
    b = Batch.from_problems(p)
    _, G, _ = risk_and_grad(b, W)
    Wr = W.clone().requires_grad_(True)
    o, _, _ = deep_forward(b.X, b.Z, [Wr])
    risk = torch.nn.functional.softplus(-b.y * (o @ b.V[..., 0].unsqueeze(-1)).squeeze(-1)).mean()
    (g,) = torch.autograd.grad(risk, Wr)
    a, c = g.numpy().ravel(), G.numpy().ravel()
    assert np.linalg.norm(c) > 0
    assert 1 - a @ c / np.linalg.norm(a) / np.linalg.norm(c) <= TOL_DIRECTION


def test_stable_softmax_forward_and_moderate_backward_equal_torch():
    x = torch.randn(3, 4, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 4, 6, dtype=torch.float64)
    (a,) = torch.autograd.grad((StableSoftmax.apply(x) * w).sum(), x)
    (b,) = torch.autograd.grad((torch.softmax(x, -1) * w).sum(), x)
    assert torch.allclose(StableSoftmax.apply(x), torch.softmax(x, -1))
    assert torch.allclose(a, b, atol=1e-14)


def test_one_layer_equals_the_one_layer_trainer():
    probs = [paper_instance(5, 6, 4, seed=s) for s in range(3)]
    W0 = np.stack([np.random.default_rng(s).standard_normal((4, 4)) * 0.1 for s in range(3)])
    deep = train_deep(probs, layers=1, steps=150, lr=0.1, init={0: W0}, record_every=50)
    ref = train(probs, steps=150, lr=0.1, normalized=True, normalize_eps=0.0, init=W0, record_W=True, progress=False)
    assert np.abs(deep.W[:, 0] - ref.W).max() <= TOL_ONE_LAYER * max(1.0, np.abs(ref.W).max())


def test_batched_equals_looped():
    inst = [hop_instance(16, 2, 12, seed=s) for s in range(3)]
    kw = dict(layers=2, steps=40, lr=0.1, record_every=10)
    batched = train_deep([h.problem for h in inst], seed=[3, 4, 5], **kw)
    for r, h in enumerate(inst):
        alone = train_deep(h.problem, seed=[3 + r], **kw)
        assert np.abs(batched.W[r] - alone.W[0]).max() <= TOL_BATCH


def test_frozen_hard_first_layer_gives_the_one_layer_svm_on_its_outputs():
    h = hop_instance(24, 2, 12, seed=2)
    p = h.problem
    # a first layer that selects the bridge hard: W1 = c·f1 qᵀ-like direction from the data itself
    bridge = p.X[np.arange(p.n), h.targets[:, 0]]
    W1 = 60.0 * np.outer(bridge.mean(0), p.queries[0]) / np.linalg.norm(bridge.mean(0))
    res = train_deep(p, layers=2, steps=300, lr=0.1, frozen={0: W1}, seed=0, record_every=100)
    assert np.array_equal(res.selected[0, 0], h.targets[:, 0])
    assert res.frozen == (0,) and np.array_equal(res.W[0, 0], W1)
    z1 = p.queries + bridge  # the frozen layer's hard output on the residual stream
    assert np.abs(res.queries[0, 1] - z1).max() <= 1e-12
    one = AttentionSVM().fit(AttentionProblem(p.X, p.y, p.head, Z=z1), res.selected[0, 1])
    mine = layer_svms(res)[0][1]
    assert mine.status_ == "optimal" and one.status_ == "optimal"
    assert np.linalg.norm(mine.W_ - one.W_) <= TOL_SVM * np.linalg.norm(one.W_)
    assert np.allclose(layer_problem(res, 0, 1).queries, res.queries[0, 1])


def test_two_layers_solve_the_two_hop_task_and_follow_their_svms():
    inst = [hop_instance(96, 2, 16, seed=s) for s in range(2)]
    res = train_deep([h.problem for h in inst], layers=2, steps=800, lr=0.1, seed=[0, 1], record_every=100)
    tg = np.stack([h.targets for h in inst])
    assert (res.selected[:, -1] == tg[:, :, 1]).mean() >= 0.99
    tr = layer_trajectories(res, rolling=[800])
    last = tr[tr.step == 800]
    assert (last.corr_final >= 0.99).all() and (last.corr_rolling >= 0.99).all()
    st = settle_steps(tr)
    assert (st.selection_settled <= st.direction_settled).all()
    one = train_deep([h.problem for h in inst], layers=1, steps=400, lr=0.1, seed=[0, 1], record_every=100)
    assert (one.selected[:, 0] == tg[:, :, 1]).mean() < 0.9


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda p: train_deep(p, layers=0, steps=1), "layers"),
        (lambda p: train_deep(p, layers=2, steps=1, frozen={2: np.eye(12)}), "frozen"),
        (lambda p: train_deep(p, layers=2, steps=1, frozen={0: np.eye(3)}), r"frozen\[0\]"),
        (lambda p: train_deep(p, layers=1, steps=1, param="KQ", init={0: np.eye(12)}), "init"),
        (lambda p: train_deep(p, layers=1, steps=1, param="QK"), "param"),
        (lambda p: hop_instance(8, 3, 6), "d must be at least"),
        (lambda p: hop_instance(8, 0, 6), "hops"),
    ],
)
def test_bad_input(call, match):
    p = hop_instance(8, 2, 12, seed=0).problem
    with pytest.raises(ValueError, match=match):
        call(p)


def test_layer_diagnostics_reject_bad_indices():
    res = train_deep(hop_instance(8, 2, 12, seed=0).problem, layers=2, steps=2, record_every=1)
    with pytest.raises(ValueError, match="layer"):
        layer_problem(res, 0, 2)
    with pytest.raises(ValueError, match="run"):
        layer_problem(res, 3, 0)


def test_layer_equivalence_equals_the_single_token_svm_for_hard_selections():
    inst = [hop_instance(64, 2, 16, seed=s) for s in range(1)]
    res = train_deep([h.problem for h in inst], layers=2, steps=600, lr=0.1, seed=[0], record_every=100)
    for ell in range(2):
        eq, fin = layer_equivalence(res, 0, ell)
        single = layer_svms(res)[0][ell]
        assert eq.status_ == "optimal" and single.status_ == "optimal"
        assert np.linalg.norm(eq.W_ - single.W_) <= TOL_SVM * np.linalg.norm(single.W_)


def test_deep_model_with_an_mlp_head_trains_and_matches_finite_differences():
    h = hop_instance(12, 2, 12, seed=1).problem
    p = AttentionProblem(h.X, h.y, mlp_head(12, width=6, depth=2, activation="swiglu", seed=3), Z=h.queries)
    res = train_deep(p, layers=2, steps=30, lr=0.1, seed=[0], record_every=10)
    assert np.all(np.isfinite(res.W)) and res.history["loss"][0, -1] < res.history["loss"][0, 0]
    Ws = [np.random.default_rng(9).standard_normal((12, 12)) * 0.3 for _ in range(2)]

    def risk_np(Ws_):
        z, o = p.queries, None
        for W in Ws_:
            g = np.einsum("ntd,de,ne->nt", p.X, W, z)
            s_ = np.exp(g - g.max(-1, keepdims=True))
            s_ /= s_.sum(-1, keepdims=True)
            o = np.einsum("nt,ntd->nd", s_, p.X)
            z = z + o
        return float(np.logaddexp(0, -p.y * p.head(o)).mean())

    Wt = [torch.tensor(W)[None].requires_grad_(True) for W in Ws]
    b = Batch.from_problems(p)
    from attsvm.model import head_outputs, sequence_losses

    o, _, _ = deep_forward(b.X, b.Z, Wt)
    (g0, _) = torch.autograd.grad(sequence_losses(b, head_outputs(b, o)).mean(), Wt)
    E = np.zeros((12, 12))
    E[2, 5] = FD_STEP
    fd = (risk_np([Ws[0] + E, Ws[1]]) - risk_np([Ws[0] - E, Ws[1]])) / (2 * FD_STEP)
    assert abs(float(g0[0, 2, 5]) - fd) <= TOL_FD * max(1.0, abs(fd))
