"""The parts of the trainer (docs/spec.md §4, §8): parameterisations, update-rule transforms, recording options,
and the package attribute ``attsvm.train``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import attsvm
from attsvm.datasets import paper_instance, random_instance
from attsvm.model import AttentionModel, Batch, FactoredKQ, FullW, parameterization, risk, risk_and_grad
from attsvm.training import Recording, optim, train
from attsvm.training.optim import (
    AddPenalty,
    MirrorMap,
    NormalizeByNorm,
    PolyakStep,
    StepSize,
    chain,
    mirror_descent,
    normalized_gd,
    polyak,
)

# analytic chain rule vs autograd, relative
GRAD_RTOL = 1e-12
# central finite differences of the risk along a random direction, relative
FD_RTOL = 1e-6
# mirror descent with p = 2 vs GD, and one MD / Polyak step vs its closed form, relative to ‖W‖
STEP_RTOL = 1e-12
# a run alone vs the same run inside a larger batch, and one rule built two ways (batched matmul kernels
# may round differently with the memory layout)
BATCH_ATOL = 1e-12


def _params(par, R=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn((R, *s), generator=g, dtype=torch.float64) for s in par.shapes)


# ----------------------------------------------------------------------------- parameterisations


@pytest.mark.parametrize("par", [FullW(5), FactoredKQ(5, 3), FactoredKQ(5, 5)])
def test_gradient_map_matches_autograd_and_finite_differences(par):
    b = Batch.from_problems([random_instance(3, 4, 5, seed=s) for s in range(2)])
    params = _params(par)
    leaves = tuple(p.clone().requires_grad_(True) for p in params)
    risk(b, par.weights(leaves)).sum().backward()
    _, gW, _ = risk_and_grad(b, par.weights(params))
    grads = par.grads(gW, params)
    assert len(grads) == len(par.groups)
    for g, leaf in zip(grads, leaves):
        assert (g - leaf.grad).abs().max() <= GRAD_RTOL * leaf.grad.abs().max()
    # directional derivative by central differences
    dirs = _params(par, seed=1)
    h = 1e-6
    Lp = risk(b, par.weights(tuple(p + h * v for p, v in zip(params, dirs))))
    Lm = risk(b, par.weights(tuple(p - h * v for p, v in zip(params, dirs))))
    fd = (Lp - Lm) / (2 * h)
    an = sum((g * v).sum((-2, -1)) for g, v in zip(grads, dirs))
    torch.testing.assert_close(an, fd, rtol=FD_RTOL, atol=0)


def test_parameterization_inits_and_weights():
    rng = np.random.default_rng(0)
    W = rng.standard_normal((2, 5, 5))
    kq = FactoredKQ(5, 5)
    K, Q = kq.from_W(W)
    np.testing.assert_allclose(K @ np.swapaxes(Q, -1, -2), W, atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(K, axis=(1, 2)), np.linalg.norm(Q, axis=(1, 2)))  # balanced
    (W0,) = FullW(5).from_W(W)
    np.testing.assert_array_equal(W0, W)
    # the published nn.Linear init, drawn per run from its own generator
    torch.manual_seed(3)
    lin = torch.nn.Linear(5, 5, bias=False)
    (Wd,) = FullW(5).draw("pytorch", torch.Generator().manual_seed(3), 1.0)
    np.testing.assert_array_equal(Wd, lin.weight.detach().double().T.numpy())
    Kg, Qg = kq.from_given((K[0], Q[0]), 3)
    assert Kg.shape == (3, 5, 5) and np.array_equal(Kg[2], K[0]) and np.array_equal(Qg[1], Q[0])
    with pytest.raises(ValueError, match="init as a tuple must be \\(W\\)"):
        FullW(5).from_given((W[0], W[0]), 1)
    with pytest.raises(ValueError, match="init Q must have shape \\(5, 5\\) or \\(3, 5, 5\\)"):
        kq.from_given((K[0], np.zeros((5, 4))), 3)
    with pytest.raises(ValueError, match="stationary point"):
        kq.zeros(1)
    assert parameterization("KQ", 5, 3) == FactoredKQ(5, 3) and parameterization("W", 5) == FullW(5)
    with pytest.raises(ValueError, match="m applies to param='KQ' only"):
        parameterization("W", 5, 3)
    with pytest.raises(ValueError, match="param has d=4 but the data has d=5"):
        parameterization(FullW(4), 5)


def test_attention_model_uses_the_parameterization_and_loads_a_result():
    p = random_instance(3, 4, 5, seed=0)
    res = train(p, param="KQ", m=3, steps=20, n_init=2)
    model = res.to_model()
    assert isinstance(model.parameterization, FactoredKQ) and model.m == 3
    torch.testing.assert_close(model.W.detach(), torch.as_tensor(res.W), rtol=0, atol=1e-14)
    _, s = model(Batch.from_problems(p))
    np.testing.assert_allclose(s.detach().numpy(), res.probs, atol=1e-14)
    m2 = AttentionModel(5, param=FullW(5), runs=2)
    assert [n for n, _ in m2.named_parameters()] == ["weight"]
    with pytest.raises(ValueError, match="params must hold 1 groups"):
        m2.load([np.zeros((2, 5, 5))] * 2)


# ----------------------------------------------------------------------------- transforms


def test_chain_composes_left_to_right_and_tracks_homogeneity():
    params = _params(FactoredKQ(4, 2), R=3)
    u = _params(FactoredKQ(4, 2), R=3, seed=5)
    L = torch.ones(3, dtype=torch.float64)
    a, b = AddPenalty(0.5), NormalizeByNorm(0.0)
    rule = chain(a, b, StepSize(0.2))
    out, _ = rule.update(u, rule.init(params), params, loss=L, step=0)
    mid, _ = a.update(u, None, params, loss=L, step=0)
    mid, _ = b.update(mid, None, params, loss=L, step=0)
    for o, x, p, g in zip(out, mid, params, u):
        torch.testing.assert_close(o, -0.2 * x, rtol=0, atol=0)
        # each group normalised on its own, per run
        torch.testing.assert_close(torch.linalg.vector_norm(x, dim=(-2, -1)), torch.ones(3, dtype=torch.float64))
        torch.testing.assert_close(x, (g + p) / torch.linalg.vector_norm(g + p, dim=(-2, -1))[:, None, None])
    assert chain(NormalizeByNorm(0.0), StepSize(0.1)).degree == 0.0
    assert chain(NormalizeByNorm(0.0), MirrorMap(3.0)).degree == 0.0
    assert chain(AddPenalty(1e-3), NormalizeByNorm(0.0)).degree is None
    assert chain(AddPenalty(0.0), NormalizeByNorm(0.0)).degree == 0.0
    assert chain(StepSize(0.1), MirrorMap(2.0)).degree == 1.0 and polyak().degree == -1.0
    nested = chain(chain(AddPenalty(1.0)), normalized_gd())
    assert [type(t) for t in nested.find(optim.Transform)] == [AddPenalty, NormalizeByNorm, StepSize]
    with pytest.raises(TypeError, match="argument 1 is function"):
        chain(StepSize(0.1), lambda u: u)  # type: ignore[arg-type]


@pytest.mark.parametrize("param", ["W", "KQ"])
def test_optimizer_argument_reproduces_the_keyword_rule(param):
    probs = [random_instance(3, 4, 5, seed=s) for s in range(2)]
    kw = dict(param=param, steps=50, n_init=2, seed=[1, 2, 3, 4], init="gaussian", init_scale=0.3, record_W=True)
    lam = 1e-3 if param == "KQ" else 0.0
    a = train(probs, lr=0.2, penalty=lam, **kw)
    b = train(probs, optimizer=normalized_gd(0.2, penalty=lam), **kw)
    np.testing.assert_allclose(a.history["W"], b.history["W"], rtol=0, atol=BATCH_ATOL)
    assert b.normalized and b.penalty == lam and np.all(b.lr == 0.2)
    c = train(probs, lr=0.3, normalized=False, **kw)
    d = train(probs, optimizer=optim.gd(0.3), **kw)
    np.testing.assert_allclose(c.history["W"], d.history["W"], rtol=0, atol=BATCH_ATOL)
    assert not d.normalized


def test_scale_free_rule_gets_the_rescaled_gradient():
    """A degree-0 rule (exact normalisation, no penalty) keeps moving at speed η after ∇L underflows, given
    as optimizer= exactly as through normalize_eps=0; with ε > 0 it freezes instead."""
    p = paper_instance(6, 8, 10, seed=0)
    rule = normalized_gd(1.0, eps=0.0)
    assert rule.degree == 0.0
    res = train(p, steps=3000, optimizer=rule, record_every=500, record_W=True)
    ref = train(p, steps=3000, lr=1.0, normalize_eps=0.0, record_every=500, record_W=True)
    np.testing.assert_allclose(res.history["W"], ref.history["W"], rtol=1e-12)
    assert res.history["grad_norm"][0, -1] == 0.0
    np.testing.assert_allclose(np.diff(res.history["W_norm"][0, 2:]), 500.0, rtol=1e-3)
    frozen = train(p, steps=3000, optimizer=normalized_gd(1.0), record_every=500)
    assert np.diff(frozen.history["W_norm"][0, -2:])[0] < 1.0


@pytest.mark.parametrize("param", ["W", "KQ"])
def test_mirror_descent_with_p2_is_gd(param):
    p = random_instance(3, 4, 5, seed=1)
    kw = dict(param=param, steps=200, n_init=2, init="gaussian", init_scale=0.5, record_W=True)
    gd_ = train(p, lr=0.3, normalized=False, penalty=0.0, **kw)
    md = train(p, optimizer=mirror_descent(2.0, 0.3), **kw)
    scale = np.abs(gd_.history["W"]).max()
    assert np.abs(md.history["W"] - gd_.history["W"]).max() <= STEP_RTOL * scale * 200


def test_mirror_descent_step_formula_and_huge_norms():
    """One ℓ3 step: W⁺ = sign(U)|U|^{1/2}, U = sign(W)|W|² − η∇L (docs/spec.md §8)."""
    p = random_instance(3, 4, 5, seed=2)
    W0 = np.random.default_rng(0).standard_normal((5, 5))
    res = train(p, steps=1, init=W0, optimizer=mirror_descent(3.0, 0.4))
    _, g, _ = risk_and_grad(Batch.from_problems(p), torch.as_tensor(W0)[None])
    U = np.sign(W0) * np.abs(W0) ** 2 - 0.4 * g[0].numpy()
    np.testing.assert_allclose(res.W[0], np.sign(U) * np.sqrt(np.abs(U)), rtol=0, atol=STEP_RTOL * 10)
    # at huge norms |W|^{p-1} overflows float64; the scaled maps stay finite and keep W where it is
    for p_ in (3.0, 1.5):
        W = 1e200 * torch.tensor(W0)[None]
        u = (torch.tensor(W0)[None] * 1e-3,)
        (dW,), _ = MirrorMap(p_).update(u, None, (W,), loss=torch.ones(1), step=0)
        assert torch.isfinite(dW).all() and (W + dW - W).abs().max() <= 1e-10 * W.abs().max()
    (z,), _ = MirrorMap(3.0).update((torch.zeros(1, 5, 5),), None, (torch.zeros(1, 5, 5),), loss=torch.ones(1), step=0)
    assert torch.equal(z, torch.zeros(1, 5, 5))


@pytest.mark.parametrize("param", ["W", "KQ"])
def test_polyak_step_size(param):
    """One Polyak step: θ⁺ = θ − L/‖∇L‖² ∇L, with ‖∇L‖² summed over the groups (docs/spec.md §8)."""
    p = random_instance(3, 4, 5, seed=3)
    res0 = train(p, param=param, steps=0, n_init=2, init="gaussian", init_scale=0.5)
    res = train(p, param=param, steps=1, n_init=2, init="gaussian", init_scale=0.5, optimizer=polyak())
    par = parameterization(param, 5)
    params = tuple(torch.as_tensor(getattr(res0, g)) for g in par.groups)
    L, gW, _ = risk_and_grad(Batch.from_problems(p), par.weights(params))
    grads = par.grads(gW, params)
    sq = sum((g**2).sum((-2, -1)) for g in grads)
    for name, th, g in zip(par.groups, params, grads):
        expect = th - (L / sq)[:, None, None] * g
        np.testing.assert_allclose(
            getattr(res, name), expect.numpy(), rtol=0, atol=STEP_RTOL * float(expect.abs().max())
        )
    assert res.lr == "adaptive" and not res.normalized
    # a cap on η, and no motion (and no NaN) where the update vanishes or the loss is at L*
    capped = train(p, param=param, steps=1, n_init=2, init="gaussian", init_scale=0.5, optimizer=polyak(max_lr=1e-3))
    assert np.abs(capped.W - res0.W).max() < np.abs(res.W - res0.W).max()
    out, _ = PolyakStep().update(
        (torch.zeros(1, 3, 3),), None, (torch.ones(1, 3, 3),), loss=torch.ones(1, dtype=torch.float64), step=0
    )
    assert torch.equal(out[0], torch.zeros(1, 3, 3))
    out, _ = PolyakStep(min_loss=2.0).update(
        (torch.ones(1, 3, 3),), None, (torch.ones(1, 3, 3),), loss=torch.ones(1, dtype=torch.float64), step=0
    )
    assert torch.equal(out[0], torch.zeros(1, 3, 3))


def test_polyak_run_stays_finite_and_decreases_the_risk():
    """With the head fixed the risk's infimum is above L* = 0, so uncapped Polyak steps are huge (the first
    jumps to ‖W‖ ~ 1e12 here) but finite; capped, the risk decreases at every record and ‖W‖ grows."""
    p = paper_instance(6, 8, 10, seed=0)
    wild = train(p, steps=50, optimizer=polyak(), record_every=10)
    assert np.all(np.isfinite(wild.history["loss"])) and np.all(np.isfinite(wild.W))
    res = train(p, steps=500, optimizer=polyak(max_lr=10.0), record_every=50)
    assert np.all(np.diff(res.history["loss"][0]) < 0) and np.all(np.diff(res.history["W_norm"][0]) > 0)


def test_optimizer_errors():
    p = random_instance(3, 4, 5, seed=0)
    with pytest.raises(ValueError, match=r"optimizer= replaces lr, normalized, penalty and normalize_eps.*lr, penalty"):
        train(p, steps=1, optimizer=polyak(), lr=0.1, penalty=0.0)
    with pytest.raises(TypeError, match="optimizer must be 'gd', 'md' or a Transform"):
        train(p, steps=1, optimizer=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="optimizer must be one of 'gd', 'md'"):
        train(p, steps=1, optimizer="lion")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lr must be a positive float, 2 positive floats"):
        train(p, steps=1, n_init=2, optimizer=optim.gd([0.1, 0.2, 0.3]))
    with pytest.raises(ValueError, match="p must be > 1"):
        MirrorMap(1.0)
    with pytest.raises(ValueError, match="penalty must be >= 0"):
        AddPenalty(-1.0)
    with pytest.raises(ValueError, match="max_lr must be > 0"):
        PolyakStep(max_lr=0.0)


@pytest.mark.parametrize("rule", ["keywords", "md3", "polyak", "schedule"])
def test_run_does_not_depend_on_its_batch(rule):
    """Run r trained alone equals run r trained beside other instances and initialisations."""
    probs = [paper_instance(6, 8, 10, seed=s) for s in range(3)]
    kw = {
        "keywords": dict(param="KQ"),
        "md3": dict(optimizer=mirror_descent(3.0, 0.05)),
        "polyak": dict(optimizer=polyak(max_lr=10.0)),
        "schedule": dict(lr=lambda k: 0.5 / (1 + k) ** 0.5, normalized=False),
    }[rule]
    big = train(probs, steps=100, n_init=2, seed=[10, 11, 12, 13, 14, 15], record_W=True, **kw)
    for r, (j, s) in enumerate([(0, 10), (1, 13), (2, 15)]):
        r_big = [0, 3, 5][r]
        alone = train(probs[j], steps=100, seed=s, record_W=True, **kw)
        np.testing.assert_allclose(big.history["W"][r_big], alone.history["W"][0], rtol=0, atol=BATCH_ATOL)


# ----------------------------------------------------------------------------- recording options


def test_recording_options():
    p = random_instance(3, 4, 5, seed=4)
    res = train(
        p,
        param="KQ",
        m=2,
        steps=10,
        n_init=2,
        record=Recording(every=4, quantities=("loss", "group_norms"), W=True, params=True, probs=True),
    )
    h = res.history
    assert set(h) == {"step", "loss", "K_norm", "Q_norm", "W", "K", "Q", "probs"}
    np.testing.assert_array_equal(h["step"], [0, 4, 8, 10])
    assert h["K"].shape == (2, 4, 5, 2) and h["probs"].shape == (2, 4, 3, 4)
    np.testing.assert_allclose(h["K"] @ np.swapaxes(h["Q"], -1, -2), h["W"], atol=1e-14)
    np.testing.assert_allclose(np.linalg.norm(h["K"], axis=(2, 3)), h["K_norm"])
    np.testing.assert_allclose(h["probs"][:, -1], res.probs)
    np.testing.assert_allclose(h["probs"][1], p.softmax(h["W"][1]), atol=1e-14)
    assert res.record.every == 4 and res.record_every == 4
    w = train(p, steps=3, record=Recording(quantities=(), params=True))
    assert set(w.history) == {"step", "W"} and w.history["W"].shape == (1, 4, 5, 5)
    np.testing.assert_allclose(w.history["W"][:, -1], w.W)
    assert set(train(p, steps=2).history) == {"step", "loss", "W_norm", "grad_norm", "max_prob", "selected"}
    with pytest.raises(ValueError, match="record= replaces record_every and record_W"):
        train(p, steps=1, record=Recording(), record_every=2)
    with pytest.raises(ValueError, match=r"record\.quantities must be among"):
        Recording(quantities=("loss", "margin"))
    with pytest.raises(TypeError, match="record must be a Recording"):
        train(p, steps=1, record={"every": 2})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="record_every must be >= 1"):
        train(p, steps=1, record_every=0)


# ----------------------------------------------------------------------------- attsvm.train


def test_attsvm_train_is_a_plain_function_in_any_import_order():
    """In a fresh interpreter: the import path first, then the attribute; and ``import attsvm`` loads no torch."""
    code = textwrap.dedent("""
        import sys, types
        import attsvm
        assert "torch" not in sys.modules
        from attsvm.train import TrainResult, cone_init
        import attsvm.train
        assert type(attsvm.train) is types.FunctionType, type(attsvm.train)
        assert type(sys.modules["attsvm.train"]) is types.ModuleType
        assert attsvm.train.__module__ == "attsvm.training.loop"
        print("ok")
    """)
    src = os.path.dirname(os.path.dirname(attsvm.__file__))
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
