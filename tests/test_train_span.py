"""The span form of W training (docs/spec.md §4, attsvm.training.span) against the dense loop."""

from __future__ import annotations

import numpy as np
import pytest

from attsvm import AttentionProblem
from attsvm.datasets import paper_instance
from attsvm.experiments.svm_eq import relu_instance
from attsvm.problem import Head
from attsvm.training import train
from attsvm.training.optim import mirror_descent, polyak

# span against dense over a few hundred steps of a smooth (linear-head) problem: float64 round-off,
# relative to ‖W‖ (the two paths add the same steps in a different order)
SAME_RTOL = 1e-11
# recorded summaries (loss, norms, top probability), relative
HISTORY_RTOL = 1e-10
# ReLU heads are not smooth: a run that sits on a kink of ReLU(Vᵀo) may take the other branch after a
# round-off difference, so only most runs agree to round-off
RELU_SHARE_SAME = 0.95


def _rel(A, B):
    return np.linalg.norm(A - B, axis=(-2, -1)) / np.linalg.norm(A, axis=(-2, -1))


def _both(problems, **kw):
    kw = {"steps": 300, "record_every": 25, "record_W": True, "progress": False, **kw}
    return train(problems, space="dense", **kw), train(problems, space="span", **kw)


@pytest.fixture(scope="module")
def paper():
    return [paper_instance(4, 5, 8, seed=s) for s in range(12)]


@pytest.mark.parametrize(
    "kw",
    [
        {"lr": 0.1},  # the paper's normalized GD, ε = machine epsilon
        {"lr": 0.1, "normalize_eps": 0.0},  # exact normalisation
        {"normalized": False, "lr": "auto"},  # plain GD at 1/L per run
        {"lr": lambda k: 0.2 / np.sqrt(k + 1)},  # a schedule
        {"lr": np.linspace(0.05, 0.2, 12)},  # one step per run
    ],
)
def test_span_equals_dense(paper, kw):
    dense, span = _both(paper, **kw)
    assert dense.info["space"] == "dense" and span.info["space"] == "span"
    assert _rel(dense.W, span.W).max() < SAME_RTOL
    assert np.abs(dense.probs - span.probs).max() < HISTORY_RTOL
    np.testing.assert_array_equal(dense.history["step"], span.history["step"])
    for key in ("loss", "W_norm", "grad_norm", "max_prob"):
        np.testing.assert_allclose(span.history[key], dense.history[key], rtol=HISTORY_RTOL, atol=0)
    np.testing.assert_array_equal(dense.history["selected"], span.history["selected"])
    assert _rel(dense.history["W"], span.history["W"]).max() < SAME_RTOL


def test_span_shared_data_and_several_inits():
    """One problem, many initialisations: the kernel is shared (B = 1) and broadcast."""
    dense, span = _both(paper_instance(5, 6, 7, seed=3), n_init=9, seed=4)
    assert _rel(dense.W, span.W).max() < SAME_RTOL


def test_span_relu_head_mostly_round_off():
    probs = [relu_instance(3, 4, 8, s) for s in range(1, 201)]
    dense, span = _both(probs, steps=500, lr=0.1, record_every=100)
    rel = _rel(dense.W, span.W)
    assert np.mean(rel < SAME_RTOL * 100) >= RELU_SHARE_SAME
    assert np.isfinite(span.W).all()


def test_auto_picks_span_where_it_pays():
    relu = [relu_instance(3, 4, 10, s) for s in range(1, 6)]
    assert train(relu, steps=3, record_every=100, progress=False).info["space"] == "span"
    # recorded at every step: forming W each step costs more than it saves
    assert train(relu, steps=3, record_every=1, progress=False).info["space"] == "dense"
    # N = 48: the torch span loop loses to the dense one there, the compiled loop wins (bench_train --span)
    from attsvm.training import span

    big = [paper_instance(6, 8, 10, seed=s) for s in range(3)]
    fast = span.compiled() is not None
    assert train(big, steps=3, record_every=100, progress=False).info["space"] == ("span" if fast else "dense")
    assert span.span_is_cheaper(6, 8, 10, 100, compiled=True) and not span.span_is_cheaper(6, 8, 10, 100)
    assert not span.span_is_cheaper(20, 9, 10, 100, compiled=True)  # N = 180: beyond what was measured
    # a schedule runs the torch loop: its crossover applies
    sched = train(big, steps=3, lr=lambda k: 0.1, record_every=100, progress=False)
    assert sched.info["space"] == "dense"
    # other parameterisations and update rules keep the dense loop
    assert train(relu, param="KQ", steps=3, record_every=100, progress=False).info["space"] == "dense"
    md = mirror_descent(p=3, lr=0.1)
    assert train(relu, optimizer=md, steps=3, record_every=100, progress=False).info["space"] == "dense"


def test_auto_avoids_a_singular_kernel():
    """Two identical tokens make the kernel singular: β is not unique, so auto trains densely."""
    p = relu_instance(3, 4, 10, 5)
    X = p.X.copy()
    X[0, 1] = X[0, 0]
    X[0, 1, 0] += 1e-3  # not tied, but nearly parallel rank-one matrices
    X[0, 2] = X[0, 0]
    q = AttentionProblem(X, p.y, p.head, Z=p.Z)
    assert train([q], steps=3, record_every=100, progress=False).info["space"] == "dense"
    # forced, it still runs (the user's choice) and stays finite
    assert np.isfinite(train([q], steps=50, record_every=100, progress=False, space="span").W).all()


def test_span_huge_norms_stay_finite():
    """Normalized GD runs far into saturation (logit gaps past float64's exp range): no NaN/inf, and
    exact normalisation (ε = 0) keeps moving at speed η."""
    p = paper_instance(3, 4, 5, seed=1)
    r = train(p, steps=4000, lr=1.0, normalize_eps=0.0, record_every=1000, progress=False, space="span")
    assert np.isfinite(r.W).all() and np.isfinite(r.history["loss"]).all()
    assert np.linalg.norm(r.W) > 1000
    d = train(p, steps=4000, lr=1.0, normalize_eps=0.0, record_every=1000, progress=False, space="dense")
    assert _rel(d.W[None], r.W[None]).max() < 1e-8


def test_space_bad_input():
    p = paper_instance(3, 4, 5, seed=1)
    with pytest.raises(ValueError, match="space"):
        train(p, steps=2, space="sparse")
    with pytest.raises(ValueError, match="space='span'"):
        train(p, steps=2, param="KQ", space="span")
    with pytest.raises(ValueError, match="space='span'"):
        train(p, steps=2, optimizer=polyak(), space="span")


def test_auto_keeps_float32_dense():
    """In float32 the kernel products lose digits the dense step keeps: auto trains W itself."""
    import torch

    relu = [relu_instance(3, 4, 10, s) for s in range(1, 6)]
    r = train(relu, steps=3, record_every=100, progress=False, dtype=torch.float32)
    assert r.info["space"] == "dense"


def test_exact_normalisation_survives_a_tiny_loss_derivative():
    """ε = 0 with the exponential loss at a head margin of ~400: ∂L/∂g ~ e^{-400}, whose square underflows.
    The span step scales δ by its largest entry first, so it keeps moving at speed η as the dense one."""
    rng = np.random.default_rng(0)
    n, T, d = 3, 4, 5
    y = np.array([1.0, -1.0, 1.0])
    X = rng.normal(size=(n, T, d))
    X[:, :, 0] = y[:, None] * (1.0 + 0.02 * rng.normal(size=(n, T)))  # every y_i vᵀx_it ≈ 400
    v = np.zeros(d)
    v[0] = 400.0
    big = AttentionProblem(X, y, Head.linear(v), Z=rng.normal(size=(n, d)), loss="exponential")
    kw = {"steps": 50, "lr": 0.1, "normalize_eps": 0.0, "record_every": 50, "progress": False}
    d, s = train(big, space="dense", **kw), train(big, space="span", **kw)
    w0, w_end = d.history["W_norm"][0]
    assert w_end > w0 + 2.0  # it moved (50 steps of 0.1 along a nearly fixed direction)
    assert _rel(d.W[None], s.W[None]).max() < 1e-10


def test_auto_refuses_a_kernel_that_overflows():
    """Tokens near 1e80: the kernel overflows to inf; auto trains densely instead of failing."""
    p = paper_instance(3, 4, 5, seed=3)
    q = AttentionProblem(p.X * 1e80, p.y, p.head, Z=p.Z * 1e80)
    assert train(q, steps=2, record_every=100, progress=False).info["space"] == "dense"


@pytest.mark.parametrize("head", ["linear", "relu"])
@pytest.mark.parametrize("loss", ["logistic", "exponential", "correlation"])
def test_runs_last_step_matches_the_model(head, loss):
    """The runs-last arithmetic of the span loop (buffers reused from step to step) gives the model's
    risk, logit gradient, probabilities and scale at every call, not only the first."""
    import torch

    from attsvm.model import Batch, risk_and_scaled_logit_grad
    from attsvm.training.span import _runs_last, _RunsLast, span_kernel

    rng = np.random.default_rng(7)
    n, T, d, P = 3, 4, 6, 9
    probs = []
    for _ in range(P):
        h = Head.linear(rng.normal(size=d)) if head == "linear" else Head.relu(rng.normal(size=(d, d)) / d)
        y = np.array([1.0, -1.0, 1.0])
        probs.append(AttentionProblem(rng.normal(size=(n, T, d)), y, h, Z=rng.normal(size=(n, d)), loss=loss))
    batch = Batch.from_problems(probs)
    K = span_kernel(batch)[2]
    ws = _RunsLast(_runs_last(K, 2), _runs_last(batch.XV, 3), _runs_last(batch.y, 1), head, loss, P)
    for scale in (1.0, 30.0, 0.1):  # three calls on the same buffers
        g = torch.as_tensor(scale * rng.normal(size=(P, n, T)))
        losses, delta, s, c = risk_and_scaled_logit_grad(batch, g)
        L2, delta2, s2, c2 = ws.logit_grad(g.permute(1, 2, 0).contiguous())
        np.testing.assert_allclose(L2.numpy(), losses.mean(-1).numpy(), rtol=1e-12, atol=0)
        np.testing.assert_allclose(delta2.permute(2, 0, 1).numpy(), delta.numpy(), rtol=1e-9, atol=1e-15)
        np.testing.assert_allclose(s2.permute(2, 0, 1).numpy(), s.numpy(), rtol=1e-12, atol=1e-300)
        np.testing.assert_allclose(c2.numpy(), c.numpy(), rtol=1e-12, atol=0)
        # K v against the batched product
        v = torch.as_tensor(rng.normal(size=(P, n * T)))
        Kv = ws.kernel_times(v.t().contiguous())
        np.testing.assert_allclose(Kv.t().numpy(), (K @ v.unsqueeze(-1)).squeeze(-1).numpy(), rtol=1e-12, atol=1e-12)


# the compiled span loop (attsvm.training._span_compiled) against the torch loop it replaces when numba is
# installed: the same formulas in the same order, but other exponentials and the logits stepped with β
# (g += coef·Kδ) instead of recomputed as g₀ + Kβ, so round-off apart
COMPILED_RTOL = 1e-11
# probabilities, absolute: a logit's round-off is multiplied by the logits' size in e^{g}
COMPILED_PROBS_ATOL = 1e-9
# ReLU heads: steps near a kink amplify round-off (measured: up to ~3e-11 after 120 steps)
COMPILED_RELU_RTOL = 1e-9


def _loops(problems, monkeypatch, **kw):
    """The same training by the compiled loop and by the torch loop."""
    from attsvm.training import span

    pytest.importorskip("numba")
    kw = {"steps": 300, "record_every": 25, "record_W": True, "progress": False, "space": "span", **kw}
    monkeypatch.setattr(span, "_compiled_module", None)
    torch_loop = span._train_runs_last

    def not_here(*a, **k):
        raise AssertionError("the torch loop ran where the compiled one should")

    monkeypatch.setattr(span, "_train_runs_last", not_here)
    fast = train(problems, **kw)
    assert span.compiled() is not None
    monkeypatch.setattr(span, "_train_runs_last", torch_loop)
    monkeypatch.setattr(span, "_compiled_module", False)  # the torch loop
    slow = train(problems, **kw)
    return fast, slow


def _mixed_problems(head, loss, P=8, seed=5):
    rng = np.random.default_rng(seed)
    n, T, d = 3, 4, 6
    out = []
    for _ in range(P):
        h = Head.linear(rng.normal(size=d)) if head == "linear" else Head.relu(rng.normal(size=(d, d)) / d)
        X = rng.normal(size=(n, T, d))
        out.append(AttentionProblem(X, np.array([1.0, -1.0, 1.0]), h, Z=rng.normal(size=(n, d)), loss=loss))
    return out


@pytest.mark.parametrize("head", ["linear", "relu"])
@pytest.mark.parametrize("loss", ["logistic", "exponential", "correlation"])
@pytest.mark.parametrize(
    "kw",
    [{"lr": 0.1}, {"lr": 0.1, "normalize_eps": 0.0}, {"normalized": False, "lr": 0.05}],
    ids=["normalized", "exact-normalisation", "plain"],
)
def test_compiled_loop_equals_torch_loop(head, loss, kw, monkeypatch):
    probs = _mixed_problems(head, loss)
    fast, slow = _loops(probs, monkeypatch, steps=120, **kw)
    assert fast.info["space"] == slow.info["space"] == "span"
    tol = COMPILED_RTOL if head == "linear" else COMPILED_RELU_RTOL
    assert _rel(slow.W, fast.W).max() < tol
    assert _rel(slow.history["W"], fast.history["W"]).max() < tol
    assert np.abs(fast.probs - slow.probs).max() < COMPILED_PROBS_ATOL
    for key in ("loss", "W_norm", "grad_norm", "max_prob"):
        np.testing.assert_allclose(fast.history[key], slow.history[key], rtol=100 * tol, atol=0)
    np.testing.assert_array_equal(fast.history["selected"], slow.history["selected"])


def test_compiled_loop_svm_eq_workload(monkeypatch):
    """The svm-eq protocol's runs (ReLU head, normalized GD) over a few hundred steps, and one data set
    shared by several initialisations (the compiled loop indexes the data by run modulo B)."""
    probs = [relu_instance(3, 4, 10, s) for s in range(1, 41)]
    fast, slow = _loops(probs, monkeypatch, steps=400, record_every=100)
    assert (_rel(slow.W, fast.W) < 1e-10).mean() >= RELU_SHARE_SAME
    fast, slow = _loops(paper_instance(4, 5, 8, seed=3), monkeypatch, n_init=6, seed=2, lr=0.1)
    assert _rel(slow.W, fast.W).max() < COMPILED_RTOL


def test_compiled_loop_does_not_depend_on_record_steps_threads_or_calls(monkeypatch):
    """β and its logits are carried from call to call: where the records fall, how many updates one call
    takes and how many threads share the runs change no bit of the result."""
    from attsvm.training import span

    pytest.importorskip("numba")
    probs = [relu_instance(3, 4, 8, s) for s in range(1, 150)]
    kw = {"steps": 260, "lr": 0.1, "progress": False, "space": "span"}
    ref = train(probs, record_every=260, **kw)
    assert span.compiled() is not None
    for other in (
        train(probs, record_every=7, **kw),
        train(probs, record_every=260, threads=2, **kw),
    ):
        np.testing.assert_array_equal(other.W, ref.W)
        np.testing.assert_array_equal(other.probs, ref.probs)
    monkeypatch.setattr(span, "COMPILED_CHUNK", 3)
    np.testing.assert_array_equal(train(probs, record_every=260, **kw).W, ref.W)


def test_compiled_loop_is_switched_off_by_the_environment(monkeypatch):
    from attsvm.training import span

    monkeypatch.setattr(span, "_compiled_module", None)
    monkeypatch.setenv("ATTSVM_COMPILED", "0")
    assert span.compiled() is None
    monkeypatch.setattr(span, "_compiled_module", None)
    monkeypatch.delenv("ATTSVM_COMPILED")
    pytest.importorskip("numba")
    assert span.compiled() is not None


def test_install_compiles_the_span_kernel():
    """`make install` runs attsvm._warm, which compiles this kernel with the solvers'."""
    pytest.importorskip("numba")
    from attsvm._warm import compile_all
    from attsvm.training import _span_compiled

    assert compile_all() is True
    assert len(_span_compiled._advance_range.signatures) >= 1
