"""Sign descent, Adam, Muon and nuclear-norm steepest descent in the trainer (attsvm.training.optim)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attsvm.datasets import paper_instance
from attsvm.svm import AttentionSVM
from attsvm.training import optim, train

# the trainer against torch.optim.Adam on the same loss, relative to max|W| (float64 round-off of the
# analytic gradient against autograd's, carried through the moments)
ADAM_RTOL = 1e-12
# the trainer against a hand-written per-run numpy loop, relative to max|W|
LOOP_RTOL = 1e-10
# a run alone against inside a batch, relative to max|W|
BATCH_RTOL = 1e-12
# Newton–Schulz (cubic, converged) against the SVD polar factor, absolute (its entries are at most 1)
NS_ATOL = 1e-12

STEPS = 25


def _problems(k: int = 3, n: int = 3, T: int = 4, d: int = 5) -> list:
    return [paper_instance(n, T, d, seed=s) for s in range(k)]


def _np_grad(problem, W: np.ndarray) -> np.ndarray:
    """∇_W of the logistic risk (1/n) Σ log(1 + exp(−y_i vᵀ Xᵢᵀ softmax(Xᵢ W zᵢ))), by hand in numpy."""
    X, Z, y, v = problem.X, problem.queries, problem.y, problem.v
    logits = np.einsum("ntd,de,ne->nt", X, W, Z)
    s = np.exp(logits - logits.max(axis=1, keepdims=True))
    s /= s.sum(axis=1, keepdims=True)
    gam = X @ v  # (n, T)
    out = (s * gam).sum(axis=1)
    dout = -y / (1.0 + np.exp(y * out)) / len(y)  # d loss / d out_i
    c = dout[:, None] * s * (gam - out[:, None])  # d loss / d logit_it
    return np.einsum("nt,ntd,ne->de", c, X, Z)


def _np_polar(G: np.ndarray) -> np.ndarray:
    U, S, Vt = np.linalg.svd(G, full_matrices=False)
    keep = S > S[0] * max(G.shape) * np.finfo(float).eps
    return U[:, keep] @ Vt[keep]


def _np_top(G: np.ndarray) -> np.ndarray:
    U, _, Vt = np.linalg.svd(G)
    return np.outer(U[:, 0], Vt[0])


DIRECTIONS = {"sign": np.sign, "muon": _np_polar, "nuclear": _np_top}
RULES = {"sign": optim.sign_descent, "muon": optim.muon, "nuclear": optim.nuclear_sd}


def _close(a: np.ndarray, b: np.ndarray, rtol: float) -> None:
    assert np.abs(a - b).max() <= rtol * np.abs(b).max(), np.abs(a - b).max() / np.abs(b).max()


# ----------------------------------------------------------------------------------------------- Adam
def _torch_risk(problem, W: torch.Tensor) -> torch.Tensor:
    X, Z, y, v = (torch.tensor(a) for a in (problem.X, problem.queries, problem.y, problem.v))
    s = torch.softmax(torch.einsum("ntd,de,ne->nt", X, W, Z), dim=1)
    out = torch.einsum("nt,ntd,d->n", s, X, v)
    return torch.nn.functional.softplus(-y * out).mean()


@pytest.mark.parametrize("eps", [1e-8, 0.0])
@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.5, 0.9)])
def test_adam_matches_torch_optim_adam_step_by_step(eps, betas):
    prob = paper_instance(3, 4, 5, seed=4)
    W0 = np.random.default_rng(1).uniform(-1, 1, (5, 5))
    lr = 0.05
    res = train(prob, init=W0, steps=STEPS, optimizer=optim.adam(lr, betas, eps), record_W=True, loss="logistic")
    W = torch.tensor(W0, requires_grad=True)
    opt = torch.optim.Adam([W], lr=lr, betas=betas, eps=eps)
    for k in range(STEPS):
        opt.zero_grad()
        _torch_risk(prob, W).backward()
        opt.step()
        _close(res.history["W"][0, k + 1], W.detach().numpy(), ADAM_RTOL)


def test_adam_string_matches_the_chain_and_takes_normalize_eps_as_its_eps():
    probs = _problems()
    a = train(probs, steps=10, optimizer="adam", lr=0.03, normalize_eps=0.0)
    b = train(probs, steps=10, optimizer=optim.adam(0.03, eps=0.0))
    np.testing.assert_array_equal(a.W, b.W)
    c = train(probs, steps=10, optimizer="adam")  # lr='auto': torch's 1e-3, ε = 1e-8
    d = train(probs, steps=10, optimizer=optim.adam(optim.ADAM_LR, eps=optim.ADAM_EPS))
    np.testing.assert_array_equal(c.W, d.W)
    assert not np.array_equal(a.W, c.W)


def test_adam_eps0_gives_zero_for_a_zero_entry_not_nan():
    g = torch.tensor([[[1.0, 0.0], [-2.0, 0.0]]], dtype=torch.float64)
    t = optim.ScaleByAdam(eps=0.0)
    state = t.init((g,))
    for _ in range(3):
        (u,), state = t.update((g,), state, (g,), loss=torch.zeros(1), step=0)
    assert torch.isfinite(u).all()
    np.testing.assert_array_equal(u[0, :, 1].numpy(), [0.0, 0.0])
    np.testing.assert_allclose(u[0, :, 0].numpy(), [1.0, -1.0], rtol=1e-15)  # a constant gradient: m̂/√v̂ = sign


def test_adam_eps0_is_scale_free_even_where_the_squares_underflow():
    """ε = 0 makes Adam invariant to a common scale of every gradient: at 1e-200, where u² underflows
    float64, the steps are those at scale 1 (the moments are stored relative to max|u|)."""
    rng = np.random.default_rng(3)
    gs = [torch.as_tensor(rng.standard_normal((2, 3, 4))) for _ in range(6)]
    outs = {}
    for scale in (1.0, 1e-200):
        t = optim.ScaleByAdam(eps=0.0)
        state = t.init((gs[0],))
        for g in gs:
            (u,), state = t.update((g * scale,), state, (g,), loss=torch.zeros(2), step=0)
        outs[scale] = u.numpy()
    np.testing.assert_allclose(outs[1e-200], outs[1.0], rtol=1e-13)
    assert np.abs(outs[1.0]).min() > 0


def test_adam_options_are_checked_naming_the_argument():
    with pytest.raises(ValueError, match="betas"):
        optim.ScaleByAdam(betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="eps"):
        optim.ScaleByAdam(eps=-1.0)
    with pytest.raises(ValueError, match="normalized does not apply to optimizer='adam'"):
        train(_problems(1), steps=1, optimizer="adam", normalized=True)


# -------------------------------------------------------------------- sign / Muon / nuclear: a hand loop
@pytest.mark.parametrize("name", ["sign", "muon", "nuclear"])
def test_steepest_descent_matches_a_hand_written_per_run_loop(name):
    probs = _problems()
    lr = 0.07
    res = train(probs, steps=STEPS, optimizer=RULES[name](lr), seed=[0, 1, 2], record_W=True, loss="logistic")
    for r, prob in enumerate(probs):
        W = res.history["W"][r, 0].copy()
        for k in range(STEPS):
            W = W - lr * DIRECTIONS[name](_np_grad(prob, W))
            _close(res.history["W"][r, k + 1], W, LOOP_RTOL)


@pytest.mark.parametrize("name", ["sign", "muon", "nuclear"])
def test_the_string_optimizers_are_the_chains(name):
    probs = _problems()
    a = train(probs, steps=8, optimizer=name, lr=0.05)
    b = train(probs, steps=8, optimizer=RULES[name](0.05))
    np.testing.assert_array_equal(a.W, b.W)
    c = train(probs, steps=8, optimizer=name)  # lr='auto': 0.1
    np.testing.assert_array_equal(c.W, train(probs, steps=8, optimizer=RULES[name](0.1)).W)
    assert c.lr[0] == 0.1


@pytest.mark.parametrize("name", ["sign", "muon", "nuclear"])
def test_the_factored_steps_act_on_each_factor(name):
    prob = paper_instance(3, 4, 5, seed=6)
    lr = 0.05
    res = train(prob, param="KQ", steps=1, optimizer=RULES[name](lr), record=None, loss="logistic", seed=2)
    from attsvm.training import Recording

    rec = train(prob, param="KQ", steps=0, record=Recording(params=True), loss="logistic", seed=2)
    K, Q = rec.K[0], rec.Q[0]
    G = _np_grad(prob, K @ Q.T)
    f = DIRECTIONS[name]
    _close(res.K[0], K - lr * f(G @ Q), LOOP_RTOL)
    _close(res.Q[0], Q - lr * f(G.T @ K), LOOP_RTOL)


def test_unnormalized_steps_are_scaled_by_the_dual_norm():
    rng = np.random.default_rng(5)
    G = rng.standard_normal((3, 4, 6))
    u = (torch.as_tensor(G),)
    z = torch.zeros(3)
    (s,), _ = optim.SignDirection(normalized=False).update(u, None, u, loss=z, step=0)
    (m,), _ = optim.Orthogonalize(normalized=False).update(u, None, u, loss=z, step=0)
    (t,), _ = optim.TopSingular(normalized=False).update(u, None, u, loss=z, step=0)
    for r in range(3):
        sv = np.linalg.svd(G[r], compute_uv=False)
        np.testing.assert_allclose(s[r].numpy(), np.abs(G[r]).sum() * np.sign(G[r]), rtol=1e-14)
        np.testing.assert_allclose(m[r].numpy(), sv.sum() * _np_polar(G[r]), rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(t[r].numpy(), sv[0] * _np_top(G[r]), rtol=1e-12, atol=1e-13)
    with pytest.raises(ValueError, match="lr='auto' needs normalized=True"):
        train(_problems(1), steps=1, optimizer="muon", normalized=False)
    res = train(_problems(1), steps=2, optimizer="sign", normalized=False, lr=0.1)
    assert np.isfinite(res.W).all()


def test_the_unit_steps_keep_moving_after_the_gradient_underflows():
    """The steepest-descent directions are scale-free (degree 0): the trainer feeds them e^{c}∇L, so they
    move at speed η even where ∇L itself is 0 in float64."""
    prob = paper_instance(3, 4, 5, seed=0)
    Wmm = AttentionSVM("fro").fit(prob).W_
    W0 = 1e4 * Wmm  # every non-selected logit trails by ~1e4: ∇L underflows
    for name in ("sign", "muon", "nuclear"):
        assert RULES[name](0.1).degree == 0.0
        res = train(prob, init=W0, steps=3, optimizer=RULES[name](0.1), loss="logistic")
        assert np.abs(res.W[0] - W0).max() > 0.01, name
    assert optim.adam(0.1).degree is None  # (Adam mixes steps: it gets ∇L itself)


# --------------------------------------------------------------------------------------- Newton–Schulz
@pytest.mark.parametrize("shape", [(4, 6, 4), (4, 4, 6), (3, 5, 5)])
def test_newton_schulz_converges_to_the_svd_polar_factor(shape):
    rng = np.random.default_rng(7)
    G = rng.standard_normal(shape) + 3.0 * np.eye(*shape[1:])  # well conditioned
    ref = optim.polar_factor(torch.as_tensor(G), "svd")
    for r in range(shape[0]):
        np.testing.assert_allclose(ref[r].numpy(), _np_polar(G[r]), atol=NS_ATOL)
    ns = optim.polar_factor(torch.as_tensor(G), "newton_schulz", steps=40)
    np.testing.assert_allclose(ns.numpy(), ref.numpy(), atol=NS_ATOL)


def test_newton_schulz_keeps_zero_singular_values_zero_and_the_quintic_is_approximate():
    rng = np.random.default_rng(8)
    U = np.linalg.qr(rng.standard_normal((2, 6, 2)))[0]
    V = np.linalg.qr(rng.standard_normal((2, 5, 2)))[0]
    G = U @ np.diag([1.0, 0.5]) @ V.transpose(0, 2, 1)  # rank 2
    ref = optim.polar_factor(torch.as_tensor(G), "svd").numpy()
    np.testing.assert_allclose(ref, U @ V.transpose(0, 2, 1), atol=NS_ATOL)  # (the round-off σ₃.. are dropped)
    # (cubic: a round-off singular value ~1e-16 grows by at most 1.5 per step, so 30 steps leave it ~1e-11)
    ns = optim.polar_factor(torch.as_tensor(G), "newton_schulz", steps=30).numpy()
    np.testing.assert_allclose(ns, ref, atol=1e-9)
    q = optim.polar_factor(torch.as_tensor(G), "newton_schulz", steps=5, coefficients=optim.NS_QUINTIC).numpy()
    sv = np.linalg.svd(q, compute_uv=False)
    assert np.all((sv[:, :2] > 0.6) & (sv[:, :2] < 1.25)) and not np.allclose(sv[:, :2], 1.0, atol=1e-3)
    assert np.all(sv[:, 2:] < 1e-12)
    zero = torch.zeros(1, 3, 3, dtype=torch.float64)
    assert torch.equal(optim.polar_factor(zero, "newton_schulz"), zero)
    assert torch.equal(optim.polar_factor(zero), zero)
    assert torch.isnan(optim.polar_factor(torch.full((1, 2, 2), torch.inf, dtype=torch.float64))).all()


def test_muon_by_newton_schulz_trains_like_muon_by_svd():
    probs = _problems()
    a = train(probs, steps=10, optimizer=optim.muon(0.05, method="svd"))
    b = train(probs, steps=10, optimizer=optim.muon(0.05, method="newton_schulz", steps=40))
    np.testing.assert_allclose(b.W, a.W, rtol=0, atol=1e-8 * np.abs(a.W).max())
    c = train(probs, steps=10, optimizer=optim.muon(0.05, method="newton_schulz", steps=2))
    assert np.abs(c.W - a.W).max() > 1e-4  # (too few steps: not the polar factor)
    with pytest.raises(ValueError, match="method"):
        optim.muon(0.1, method="qr")
    with pytest.raises(ValueError, match="coefficients"):
        optim.muon(0.1, coefficients=(1.0, 2.0))


# ------------------------------------------------------------------------------------------- batching
@pytest.mark.parametrize("param", ["W", "KQ"])
@pytest.mark.parametrize(
    "rule",
    [
        optim.sign_descent(0.05),
        optim.adam(0.05, eps=0.0),
        optim.adam(0.05),
        optim.muon(0.05),
        optim.muon(0.05, method="newton_schulz", steps=8, coefficients=optim.NS_QUINTIC),
        optim.nuclear_sd(0.05),
    ],
    ids=["sign", "adam-eps0", "adam", "muon-svd", "muon-ns", "nuclear"],
)
def test_a_batch_of_runs_equals_each_run_alone(param, rule):
    probs = _problems()
    seeds = [3, 4, 5]
    batch = train(probs, param=param, steps=STEPS, optimizer=rule, seed=seeds)
    for r, prob in enumerate(probs):
        alone = train(prob, param=param, steps=STEPS, optimizer=rule, seed=seeds[r])
        _close(batch.W[r], alone.W[0], BATCH_RTOL)


def test_string_optimizer_options_are_checked_naming_the_argument():
    probs = _problems(1)
    with pytest.raises(ValueError, match="normalize_eps applies to optimizer='gd', 'md' and 'adam'"):
        train(probs, steps=1, optimizer="sign", normalize_eps=0.0)
    with pytest.raises(ValueError, match=r"p=3\.0 applies to optimizer='md' only"):
        train(probs, steps=1, optimizer="muon", p=3.0)
    with pytest.raises(ValueError, match="lr='polyak' is a gradient step"):
        train(probs, steps=1, optimizer="nuclear", lr="polyak")
    with pytest.raises(ValueError, match="optimizer must be one of 'gd', 'md', 'sign', 'adam', 'muon', 'nuclear'"):
        train(probs, steps=1, optimizer="lion")
    with pytest.raises(ValueError, match="lr must be"):
        train(probs, steps=1, optimizer="sign", lr=-1.0)
