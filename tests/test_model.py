"""The attention model and its analytic gradient (docs/spec.md §1, §4): finite differences, stability, conventions."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch

from attsvm.datasets import paper_instance, random_instance
from attsvm.model import (
    AttentionModel,
    Batch,
    attention_logits,
    attention_probs,
    factor_grads,
    resolve_loss,
    risk,
    risk_and_grad,
    sequence_losses,
)
from attsvm.problem import AttentionProblem

# analytic gradient vs autograd of the plain forward, relative, at unsaturated points
AGREE_RTOL = 1e-12
# analytic gradient vs a 60-digit reference at a saturated point, relative
SATURATED_RTOL = 1e-10

CASES = [
    ("linear", "logistic"),
    ("linear", "exponential"),
    ("linear", "correlation"),
    ("relu", "logistic"),
    ("relu", "exponential"),
    ("relu", "correlation"),
    ("multiclass", "cross_entropy"),
]


def _batch(head: str, loss: str, P: int = 2, n: int = 3, T: int = 4, d: int = 5, self_attention: bool = False) -> Batch:
    probs = [random_instance(n, T, d, seed=10 + j, head=head, self_attention=self_attention) for j in range(P)]
    return Batch.from_problems(probs, loss=loss)


class _AnalyticW(torch.autograd.Function):
    """L(W) with the trainer's analytic gradient as its backward (so gradcheck tests that gradient)."""

    @staticmethod
    def forward(ctx, W, batch):  # type: ignore[override]
        L, g, _ = risk_and_grad(batch, W)
        ctx.save_for_backward(g)
        return L

    @staticmethod
    def backward(ctx, gout):  # type: ignore[override]
        (g,) = ctx.saved_tensors
        return gout[:, None, None] * g, None


class _AnalyticKQ(torch.autograd.Function):
    @staticmethod
    def forward(ctx, K, Q, batch):  # type: ignore[override]
        L, g, _ = risk_and_grad(batch, K @ Q.transpose(-1, -2))
        gK, gQ = factor_grads(g, K, Q)
        ctx.save_for_backward(gK, gQ)
        return L

    @staticmethod
    def backward(ctx, gout):  # type: ignore[override]
        gK, gQ = ctx.saved_tensors
        return gout[:, None, None] * gK, gout[:, None, None] * gQ, None


@pytest.mark.parametrize("head,loss", CASES)
@pytest.mark.parametrize("self_attention", [False, True])
def test_analytic_gradient_matches_finite_differences(head, loss, self_attention):
    b = _batch(head, loss, self_attention=self_attention)
    g = torch.Generator().manual_seed(0)
    W = torch.randn(2, 5, 5, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda W: _AnalyticW.apply(W, b), (W,), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("head,loss", CASES)
@pytest.mark.parametrize("m", [5, 2])
def test_analytic_kq_gradient_matches_finite_differences(head, loss, m):
    b = _batch(head, loss)
    g = torch.Generator().manual_seed(1)
    K = torch.randn(2, 5, m, generator=g, dtype=torch.float64, requires_grad=True)
    Q = torch.randn(2, 5, m, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda K, Q: _AnalyticKQ.apply(K, Q, b), (K, Q), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("head,loss", CASES)
@pytest.mark.parametrize("param", ["W", "KQ"])
def test_model_forward_gradcheck(head, loss, param):
    """The nn.Module's own autograd path (stable log-softmax / softplus forms) against finite differences."""
    b = _batch(head, loss)
    model = AttentionModel(5, param=param, m=3, runs=2)
    g = torch.Generator().manual_seed(2)
    for p in model.parameters():
        p.data = torch.randn(p.shape, generator=g, dtype=torch.float64)
    params = tuple(model.parameters())

    def f(*ps):
        for p, new in zip(params, ps):
            p.data = new.detach()
        if param == "W":
            return risk(b, ps[0])
        return risk(b, ps[0] @ ps[1].transpose(-1, -2))

    inputs = tuple(p.detach().clone().requires_grad_(True) for p in params)
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("head,loss", CASES)
def test_analytic_gradient_equals_autograd(head, loss):
    b = _batch(head, loss, P=3, n=4, T=6, d=7)
    W = torch.randn(3, 7, 7, generator=torch.Generator().manual_seed(3), dtype=torch.float64, requires_grad=True)
    L_auto = risk(b, W)
    L_auto.sum().backward()
    L, g, s = risk_and_grad(b, W.detach())
    torch.testing.assert_close(L, L_auto.detach(), rtol=AGREE_RTOL, atol=0)
    scale = W.grad.abs().max()
    assert (g - W.grad).abs().max() <= AGREE_RTOL * scale
    torch.testing.assert_close(s, attention_probs(b, W.detach()), rtol=0, atol=1e-15)


def _mp_gradient(problem: AttentionProblem, W: np.ndarray, dps: int = 60) -> np.ndarray:
    """Textbook gradient of the logistic risk (linear head) in ``dps``-digit arithmetic."""
    with mpmath.workdps(dps):
        X, Z, v, y = problem.X, problem.queries, problem.v, problem.y
        n, T, d = X.shape
        G = mpmath.zeros(d, d)
        for i in range(n):
            x = [[mpmath.mpf(float(X[i, t, k])) for k in range(d)] for t in range(T)]
            z = [mpmath.mpf(float(Z[i, k])) for k in range(d)]
            Wz = [mpmath.fsum(mpmath.mpf(float(W[a, b])) * z[b] for b in range(d)) for a in range(d)]
            g = [mpmath.fsum(x[t][a] * Wz[a] for a in range(d)) for t in range(T)]
            gm = max(g)
            e = [mpmath.exp(gt - gm) for gt in g]
            s = [et / mpmath.fsum(e) for et in e]
            o = [mpmath.fsum(s[t] * x[t][a] for t in range(T)) for a in range(d)]
            f = mpmath.fsum(mpmath.mpf(float(v[a])) * o[a] for a in range(d))
            dl = -1 / (1 + mpmath.exp(y[i] * f))  # ℓ'(u) for ℓ = log(1 + e^{-u})
            ev = [y[i] * dl * mpmath.mpf(float(v[a])) for a in range(d)]
            xe = [mpmath.fsum(x[t][a] * ev[a] for a in range(d)) for t in range(T)]
            oe = mpmath.fsum(o[a] * ev[a] for a in range(d))
            for t in range(T):
                dg = s[t] * (xe[t] - oe) / n
                for a in range(d):
                    for b in range(d):
                        G[a, b] += dg * x[t][a] * z[b]
        return np.array([[float(G[a, b]) for b in range(d)] for a in range(d)])


def test_gradient_keeps_full_precision_when_attention_saturates():
    """At logit gaps ~50 the textbook gradient (autograd) is round-off; the analytic form is exact."""
    p = paper_instance(2, 3, 3, seed=4)
    W0 = np.random.default_rng(0).standard_normal((3, 3))
    top2 = np.sort(p.logits(W0), axis=1)[:, -2:]
    W = W0 * (50.0 / (top2[:, 1] - top2[:, 0]).min())  # top-two logit gap ≥ 50: softmax tails ≤ 2e-22
    exact = _mp_gradient(p, W)
    b = Batch.from_problems(p)
    Wt = torch.as_tensor(W)[None].clone().requires_grad_(True)
    _, g, _ = risk_and_grad(b, Wt.detach())
    err = np.linalg.norm(g[0].numpy() - exact) / np.linalg.norm(exact)
    assert err <= SATURATED_RTOL
    risk(b, Wt).sum().backward()
    err_auto = np.linalg.norm(Wt.grad[0].numpy() - exact) / np.linalg.norm(exact)
    assert err_auto > 1e3 * max(err, 1e-16)  # the naive form is what normalized GD must not use


@pytest.mark.parametrize("head,loss", CASES)
def test_finite_at_huge_logits(head, loss):
    b = _batch(head, loss)
    W = 1e8 * torch.randn(2, 5, 5, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    L, g, s = risk_and_grad(b, W)
    assert torch.isfinite(L).all() and torch.isfinite(g).all() and torch.isfinite(s).all()
    Lm = risk(b, W)
    assert torch.isfinite(Lm).all()
    out = (
        1e300 * torch.ones(2, 3, 3 if head == "multiclass" else 1, dtype=torch.float64).squeeze(-1)
        if head != "multiclass"
        else torch.tensor([[[1e300, -1e300, 0.0]] * 3] * 2, dtype=torch.float64)
    )
    assert torch.isfinite(sequence_losses(b, out)).all()
    assert torch.isfinite(sequence_losses(b, -out)).all()


def test_published_conventions():
    """W = W_linᵀ for nn.Linear logits zᵀ W_lin x, and W = W_kᵀ W_q for (W_q z)ᵀ (W_k x)."""
    p = paper_instance(3, 4, 5, seed=0)
    b = Batch.from_problems(p)
    X = torch.tensor(p.X)
    Z = torch.tensor(p.queries)
    lin = torch.nn.Linear(5, 5, bias=False).double()
    ref = (Z[:, None, :] @ lin(X).transpose(-2, -1))[:, 0]  # (n, T)
    torch.testing.assert_close(attention_logits(b, lin.weight.detach().T[None])[0], ref.detach())
    q = torch.nn.Linear(5, 3, bias=False).double()
    k = torch.nn.Linear(5, 3, bias=False).double()
    ref = (q(Z)[:, None, :] @ k(X).transpose(-2, -1))[:, 0]
    model = AttentionModel(5, param="KQ", m=3)
    model.K.data = k.weight.detach().T[None].clone()
    model.Q.data = q.weight.detach().T[None].clone()
    _, s = model(b)
    torch.testing.assert_close(s[0], torch.softmax(ref.detach(), -1))
    torch.testing.assert_close(model.W[0], (k.weight.T @ q.weight).detach())


def test_model_shapes_broadcast_and_no_side_effects():
    probs = [random_instance(3, 4, 5, seed=j, head="multiclass", n_classes=4) for j in range(2)]
    shared = Batch.from_problems(probs[0])
    per_run = Batch.from_problems(probs, repeat=3)
    assert shared.X.shape == (1, 3, 4, 5) and per_run.X.shape == (6, 3, 4, 5)
    assert torch.equal(per_run.X[2], per_run.X[0]) and torch.equal(per_run.X[3], per_run.X[5])
    model = AttentionModel(5, runs=6)
    model.weight.data = torch.randn(6, 5, 5, dtype=torch.float64)
    before = set(vars(model)) | set(model.state_dict())
    out, s = model(per_run)
    assert out.shape == (6, 3, 4) and s.shape == (6, 3, 4)
    assert set(vars(model)) | set(model.state_dict()) == before
    torch.testing.assert_close(s.sum(-1), torch.ones(6, 3, dtype=torch.float64))
    out1, s1 = model(shared)
    assert out1.shape == (6, 3, 4)
    assert model.risk(per_run).shape == (6,)


def test_batch_and_model_errors():
    a = random_instance(3, 4, 5, seed=0)
    with pytest.raises(ValueError, match="share \\(n, T, d\\)"):
        Batch.from_problems([a, random_instance(3, 5, 5, seed=0)])
    with pytest.raises(ValueError, match="head kind and shape"):
        Batch.from_problems([a, random_instance(3, 4, 5, seed=0, head="relu")])
    with pytest.raises(ValueError, match="must not be empty"):
        Batch.from_problems([])
    with pytest.raises(TypeError, match="problems\\[1\\] must be an AttentionProblem"):
        Batch.from_problems([a, "x"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="disagree on the loss"):
        Batch.from_problems([a, AttentionProblem(a.X, a.y, a.v, Z=a.Z, loss="exponential")])
    with pytest.raises(ValueError, match="loss must be 'cross_entropy' for a multiclass head"):
        resolve_loss("logistic", "multiclass")
    with pytest.raises(ValueError, match="needs a multiclass head"):
        resolve_loss("cross_entropy", "linear")
    with pytest.raises(ValueError, match="loss must be one of"):
        resolve_loss("hinge", "linear")
    with pytest.raises(ValueError, match="param must be one of 'W', 'KQ'"):
        AttentionModel(5, param="QK")  # type: ignore[arg-type]
    model = AttentionModel(4, runs=2)
    with pytest.raises(ValueError, match="d=5 features but the model was built with d=4"):
        model(Batch.from_problems(a))
    with pytest.raises(ValueError, match="holds 3 runs but the model has runs=2"):
        AttentionModel(5, runs=2)(Batch.from_problems([a, a, a]))
