"""Prompt attention (docs/spec.md §8): the problem, the p-SVM and the head SVM, joint (v, p) training.

Independent references: the p-SVM and the head SVM written row by row in cvxpy, scikit-learn's
LinearSVC, the paper's published optimal values, a numpy risk differentiated by central differences,
and the textbook gradient evaluated in 60-digit arithmetic (mpmath) where float64 autograd returns 0.
"""

from __future__ import annotations

import cvxpy as cp
import mpmath
import numpy as np
import pytest
import torch

from attsvm.prompt import PromptProblem, paper_joint_problem, paper_loss_problem, random_prompt_problem
from attsvm.svm import HeadSVM, PromptSVM, joint_svm, p_svm_constraints
from attsvm.training.prompt import prompt_risk, prompt_risk_and_scaled_grads, train_prompt

TOL_CVXPY = 1e-6  # our vector SVMs vs cvxpy, relative
TOL_CERT = 1e-8  # certificate: max violation and relative gap of a certified solution
TOL_PAPER = 1e-9  # the published optimal values (½‖p‖² = 17/18 and 1/2)
TOL_FD = 1e-6  # analytic vs central-difference gradient, relative
FD_STEP = 1e-6
TOL_AUTOGRAD = 1e-12  # analytic vs autograd where autograd is exact (moderate logits)
TOL_DIRECTION = 1e-10  # 1 − cos between our saturated gradient and the 60-digit one
# batched vs looped training: equal up to the last-ulp differences of torch's vectorised vs scalar
# transcendental kernels (exp, log1p), which the batch size selects
TOL_BATCH = 1e-10
TOL_SVC = 1e-6  # 1 − cos between the head SVM and LinearSVC(C = 1e9)


def _cvx_vector_svm(G: np.ndarray, h: np.ndarray) -> np.ndarray:
    """min ‖w‖² s.t. G w ≥ h, in cvxpy (rows written one by one)."""
    w = cp.Variable(G.shape[1])
    cons = [G[k] @ w >= h[k] for k in range(len(h))]
    cp.Problem(cp.Minimize(cp.sum_squares(w)), cons).solve(solver=cp.CLARABEL)
    return np.asarray(w.value)


def _p_rows(q: PromptProblem, alpha: np.ndarray, relaxed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    G, h = [], []
    for i in range(q.n):
        for t in range(q.T):
            if t != alpha[i]:
                G.append(q.W.T @ (q.X[i, alpha[i]] - q.X[i, t]))
                h.append(0.0 if relaxed[i] else 1.0)
    return np.array(G), np.array(h)


# ---------------------------------------------------------------------- the problem
def test_problem_shapes_and_scores():
    q = random_prompt_problem(4, 5, 3, seed=0, fixed_head=True)
    assert (q.n, q.T, q.d, q.m) == (4, 5, 3, 3)
    p = np.array([0.3, -0.2, 0.5])
    assert np.allclose(q.logits(p), np.einsum("ntd,d->nt", q.X, p))
    assert np.allclose(q.softmax(p).sum(-1), 1.0)
    assert np.allclose(q.scores(), q.y[:, None] * (q.X @ q.v))
    f = q.output(p)
    assert np.allclose(f, np.einsum("nt,ntd,d->n", q.softmax(p), q.X, q.v))
    # batch of prompts
    assert q.logits(np.stack([p, 2 * p])).shape == (2, 4, 5)
    # a rectangular W: keys in R^m
    Wk = np.random.default_rng(1).standard_normal((3, 2))
    q2 = PromptProblem(q.X, q.y, W=Wk)
    assert q2.m == 2 and np.allclose(q2.keys, q.X @ Wk)


def test_huge_prompt_gives_finite_attention():
    q = random_prompt_problem(3, 4, 2, seed=2, fixed_head=True)
    s = q.softmax(np.array([1e200, -1e200]))
    assert np.all(np.isfinite(s)) and np.allclose(s.sum(-1), 1.0)


@pytest.mark.parametrize("scale", [1e160, 1e300])
def test_attention_whose_logits_overflow_is_the_limit_distribution(scale):
    # logits k_itᵀp beyond float64 (huge keys and prompt together): before, inf − inf gave NaN. The limit
    # of softmax(c·g) as c → ∞ puts all the mass on each sequence's maximiser, for one prompt or a batch
    q = random_prompt_problem(3, 4, 2, seed=2, fixed_head=True)
    big = PromptProblem(q.X * scale, q.y, v=q.v)
    p = np.array([0.3, -1.0]) * scale
    top = np.argmax(q.logits(p / scale), axis=-1)
    for s in (big.softmax(p), big.softmax(np.stack([p, p]))[1]):
        assert np.all(np.isfinite(s))
        np.testing.assert_array_equal(s, np.eye(4)[top])
    small = p / scale / scale  # (logits that do not overflow: the plain formula, bit for bit)
    g = big.logits(small)
    e = np.exp(g - g.max(axis=-1, keepdims=True))
    np.testing.assert_array_equal(big.softmax(small), e / e.sum(axis=-1, keepdims=True))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"X": np.zeros((2, 3))}, "X"),
        ({"X": np.zeros((2, 1, 3))}, "T >= 2"),
        ({"y": [1.0, 0.0]}, "y must hold labels"),
        ({"y": [1.0]}, "one label per sequence"),
        ({"W": np.zeros((4, 2))}, "W must have shape"),
        ({"v": np.zeros(2)}, "v"),
        ({"X": np.full((2, 3, 3), np.nan)}, "X"),
    ],
)
def test_problem_bad_input(kwargs, match):
    args = {"X": np.ones((2, 3, 3)), "y": [1.0, -1.0]}
    args.update(kwargs)
    X, y = args.pop("X"), args.pop("y")
    with pytest.raises(ValueError, match=match):
        PromptProblem(X, y, **args)


def test_prompt_of_wrong_dimension_is_a_clear_error():
    q = random_prompt_problem(3, 4, 3, seed=0, fixed_head=True)
    with pytest.raises(ValueError, match=r"p must have shape \(3,\)"):
        q.logits(np.zeros(2))
    with pytest.raises(ValueError, match="p0 must have shape"):
        train_prompt(q, steps=1, p0=np.zeros(5), train_v=False)
    with pytest.raises(ValueError, match="tokens"):
        PromptSVM().fit(q, [0, 1])
    with pytest.raises(ValueError, match="relaxed"):
        PromptSVM().fit(q, [0, 1, 2], relaxed=[7])
    with pytest.raises(TypeError, match="PromptProblem"):
        PromptSVM().fit("not a problem")  # type: ignore[arg-type]


def test_scores_need_a_head():
    q = random_prompt_problem(3, 4, 3, seed=0)  # trainable head: none fixed
    with pytest.raises(ValueError, match="no fixed head"):
        q.optimal_tokens()
    with pytest.raises(ValueError, match="train_v=False needs a fixed head"):
        train_prompt(q, steps=1, train_v=False)


# ---------------------------------------------------------------------- the SVMs
@pytest.mark.parametrize("seed", range(6))
def test_p_svm_matches_a_direct_vector_svm(seed):
    rng = np.random.default_rng(seed)
    q = PromptProblem(
        rng.standard_normal((5, 4, 6)),
        rng.choice([-1.0, 1.0], 5),
        W=rng.standard_normal((6, 4)),
        v=rng.standard_normal(6),
    )
    alpha = np.argmax(q.logits(rng.standard_normal(4)), axis=1)  # what some prompt selects: feasible
    relaxed = rng.random(5) < 0.4
    svm = PromptSVM().fit(q, alpha, relaxed=relaxed)
    assert svm.status_ == "optimal"
    assert svm.max_violation_ <= TOL_CERT and svm.relative_gap_ <= TOL_CERT
    ref = _cvx_vector_svm(*_p_rows(q, alpha, relaxed))
    assert np.linalg.norm(svm.p_ - ref) <= TOL_CVXPY * max(1.0, np.linalg.norm(ref))
    # the cvxpy backend of the same estimator agrees too
    svm_c = PromptSVM(backend="cvxpy").fit(q, alpha, relaxed=relaxed)
    assert np.linalg.norm(svm_c.p_ - ref) <= TOL_CVXPY * max(1.0, np.linalg.norm(ref))


def test_p_svm_layout():
    q = paper_joint_problem(False)
    cs = p_svm_constraints(q, [1, 1, 1], relaxed=[2])
    assert cs.A.shape == (3, 2, 2) and cs.Z.shape == (3, 1)
    assert cs.mask.tolist() == [[True, False]] * 3
    assert cs.rhs[:, 0].tolist() == [1.0, 1.0, 0.0]


def test_paper_instances_published_values():
    """The notebook's cvxopt prints ½‖p‖² = 0.94444 (all rows) and 0.5 (third row relaxed)."""
    tight = joint_svm(paper_joint_problem(True), [1, 1, 1])
    assert tight.tight and tight.status == "optimal"
    assert abs(0.5 * tight.p @ tight.p - 17 / 18) <= TOL_PAPER
    assert np.allclose(tight.p, [4 / 3, 1 / 3], atol=TOL_PAPER) and np.allclose(tight.p, tight.p_full)
    loose = joint_svm(paper_joint_problem(False), [1, 1, 1])
    assert not loose.tight and loose.support.tolist() == [True, True, False]
    assert abs(0.5 * loose.p @ loose.p - 0.5) <= TOL_PAPER
    assert np.allclose(loose.p_full, [1.25, 0.25], atol=TOL_PAPER)
    assert np.allclose(loose.v, [0.0, 1.0], atol=TOL_PAPER)
    assert np.allclose(PromptSVM().fit(paper_loss_problem(7.0)).p_, [1.0, 0.0, 0.0], atol=TOL_PAPER)


@pytest.mark.parametrize("seed", range(4))
def test_head_svm_matches_linear_svc_and_cvxpy(seed):
    from sklearn.svm import LinearSVC

    rng = np.random.default_rng(seed)
    q = PromptProblem(rng.standard_normal((8, 3, 5)), rng.choice([-1.0, 1.0], 8))
    alpha = rng.integers(0, 3, 8)
    h = HeadSVM().fit(q, alpha)
    assert h.status_ == "optimal" and h.max_violation_ <= TOL_CERT
    F = q.X[np.arange(8), alpha]
    ref = _cvx_vector_svm(q.y[:, None] * F, np.ones(8))
    assert np.linalg.norm(h.v_ - ref) <= TOL_CVXPY * np.linalg.norm(ref)
    w = LinearSVC(fit_intercept=False, C=1e9, max_iter=500_000, tol=1e-12).fit(F, q.y).coef_[0]
    assert 1 - w @ h.v_ / np.linalg.norm(w) / np.linalg.norm(h.v_) <= TOL_SVC
    assert np.allclose(h.margins_i_[h.support_vectors_], 1.0, atol=1e-6)
    assert np.all(h.margins_i_ >= 1.0 - 1e-8)


def test_infeasible_p_svm_has_a_farkas_certificate():
    X = np.array([[[0.0, 0.0], [1.0, 1.0]], [[0.0, 0.0], [1.0, 1.0]]])
    q = PromptProblem(X, [1.0, 1.0])
    svm = PromptSVM().fit(q, [0, 1])  # the same pair ranked both ways
    assert svm.status_ == "infeasible" and svm.p_ is None
    lam = np.asarray(svm.certificate_)
    cs = svm.constraints_
    assert np.all(lam >= 0) and lam.sum() > 0
    assert np.linalg.norm(np.einsum("nt,ntm->m", lam, cs.A)) <= 1e-9 * lam.sum()
    assert np.sum(lam * cs.rhs) > 0


# ---------------------------------------------------------------------- gradients
def _np_risk(q: PromptProblem, p: np.ndarray, v: np.ndarray, loss: str) -> float:
    f = q.output(p, v)
    u = q.y * f
    return float({"logistic": np.logaddexp(0, -u), "exponential": np.exp(-u), "correlation": -u}[loss].mean())


def _tensors(q: PromptProblem):
    return (torch.tensor(np.array(a))[None] for a in (q.X, q.keys, q.y))


@pytest.mark.parametrize("loss", ["logistic", "exponential", "correlation"])
def test_gradients_match_finite_differences(loss):
    rng = np.random.default_rng(3)
    q = PromptProblem(rng.standard_normal((5, 4, 3)), rng.choice([-1.0, 1.0], 5), W=rng.standard_normal((3, 2)))
    p, v = rng.standard_normal(2), rng.standard_normal(3)
    X, K, y = _tensors(q)
    L, gp, cp_, gv, cv = prompt_risk_and_scaled_grads(X, K, y, torch.tensor(p)[None], torch.tensor(v)[None], loss)
    gp = (gp * torch.exp(-cp_)[:, None]).numpy()[0]
    gv = (gv * torch.exp(-cv)[:, None]).numpy()[0]
    assert abs(float(L[0]) - _np_risk(q, p, v, loss)) <= 1e-14
    for vec, g, which in ((p, gp, "p"), (v, gv, "v")):
        fd = np.zeros_like(vec)
        for k in range(len(vec)):
            e = np.zeros_like(vec)
            e[k] = FD_STEP
            args_hi = (p + e, v) if which == "p" else (p, v + e)
            args_lo = (p - e, v) if which == "p" else (p, v - e)
            fd[k] = (_np_risk(q, *args_hi, loss) - _np_risk(q, *args_lo, loss)) / (2 * FD_STEP)
        assert np.linalg.norm(g - fd) <= TOL_FD * max(1.0, np.linalg.norm(fd)), which
    # autograd of the plain risk agrees where it is exact
    pt = torch.tensor(p)[None].requires_grad_(True)
    vt = torch.tensor(v)[None].requires_grad_(True)
    ga, gb = torch.autograd.grad(prompt_risk(X, K, y, pt, vt, loss).sum(), (pt, vt))
    assert np.abs(ga.numpy()[0] - gp).max() <= TOL_AUTOGRAD and np.abs(gb.numpy()[0] - gv).max() <= TOL_AUTOGRAD


def test_saturated_gradient_keeps_its_direction():
    """At p = (46, 9.17), v = (0, 99.8) on the paper's non-tight instance autograd returns ∇_p L = 0
    exactly; the analytic scaled gradient has the direction of the 60-digit textbook gradient."""
    q = paper_joint_problem(False)
    p, v = np.array([46.0, 9.17]), np.array([0.0, 99.81])
    X, K, y = _tensors(q)
    pt = torch.tensor(p)[None].requires_grad_(True)
    g_auto = torch.autograd.grad(prompt_risk(X, K, y, pt, torch.tensor(v)[None], "logistic").sum(), pt)[0]
    assert torch.all(g_auto == 0)  # the failure this gradient exists to avoid
    _, gp, _, _, _ = prompt_risk_and_scaled_grads(X, K, y, torch.tensor(p)[None], torch.tensor(v)[None], "logistic")
    gp = gp.numpy()[0]
    mpmath.mp.dps = 60
    ref = [mpmath.mpf(0)] * 2
    for i in range(q.n):
        lg = [sum(mpmath.mpf(float(q.keys[i, t, a])) * mpmath.mpf(float(p[a])) for a in range(2)) for t in range(q.T)]
        Z = sum(mpmath.e**g for g in lg)
        s = [mpmath.e**g / Z for g in lg]
        xv = [sum(mpmath.mpf(float(q.X[i, t, a])) * mpmath.mpf(float(v[a])) for a in range(2)) for t in range(q.T)]
        f = sum(s[t] * xv[t] for t in range(q.T))
        dl = -1 / (1 + mpmath.e ** (float(q.y[i]) * f))  # ℓ'(u) = −σ(−u)
        for t in range(q.T):
            coef = dl * float(q.y[i]) * s[t] * (xv[t] - f) / q.n
            for a in range(2):
                ref[a] += coef * float(q.keys[i, t, a])
    r = np.array([float(x) for x in ref])
    assert np.linalg.norm(r) > 0
    assert 1 - gp @ r / np.linalg.norm(gp) / np.linalg.norm(r) <= TOL_DIRECTION


def test_huge_norms_stay_finite():
    q = random_prompt_problem(4, 3, 3, seed=5)
    X, K, y = _tensors(q)
    for loss in ("logistic", "exponential", "correlation"):
        out = prompt_risk_and_scaled_grads(
            X,
            K,
            y,
            torch.tensor([[1e8, -1e8, 3e7]], dtype=torch.float64),
            torch.tensor([[1e9, 1e9, -1e9]], dtype=torch.float64),
            loss,
        )
        assert all(torch.all(torch.isfinite(t)) for t in out[1:]), loss
    r = train_prompt(q, steps=20, p0=[1e6, -1e6, 0.0], v0=[1e6, 1e6, 1e6], lr=1e5)
    assert np.all(np.isfinite(r.p)) and np.all(np.isfinite(r.v)) and np.all(np.isfinite(r.history["loss"]))


# ---------------------------------------------------------------------- training
@pytest.mark.parametrize("train_v", [True, False])
def test_batched_equals_looped(train_v):
    probs = [random_prompt_problem(4, 5, 3, seed=s, fixed_head=True) for s in range(4)]
    kw = {"steps": 30, "lr": 0.2, "train_v": train_v, "record_every": 7}
    batch = train_prompt(probs, seed=[10, 11, 12, 13], **kw)
    for r, q in enumerate(probs):
        one = train_prompt(q, seed=[10 + r], **kw)
        assert np.abs(batch.p[r] - one.p[0]).max() <= TOL_BATCH
        assert np.abs(batch.v[r] - one.v[0]).max() <= TOL_BATCH
        assert np.abs(batch.history["loss"][r] - one.history["loss"][0]).max() <= TOL_BATCH


def test_joint_training_reaches_the_joint_svm():
    """The paper's instances: tight → the full p-SVM; non-tight → the relaxed one, not the full."""
    probs = [paper_joint_problem(True), paper_joint_problem(False)]
    r = train_prompt(probs, steps=600, p0=[0.0, -1.0], v0=[-1.0, 0.0])
    cos = lambda a, b: a @ b / np.linalg.norm(a) / np.linalg.norm(b)  # noqa: E731
    for k, q in enumerate(probs):
        assert r.selected[k].tolist() == [1, 1, 1]
        js = joint_svm(q, r.selected[k])
        assert cos(r.v[k], js.v) >= 0.999 and cos(r.p[k], js.p) >= 0.999
    js = joint_svm(probs[1], [1, 1, 1])
    assert cos(r.p[1], js.p_full) < 0.99  # the relaxed target is the one that is reached


def test_p_alone_reaches_the_p_svm_of_its_selection():
    probs = [random_prompt_problem(5, 6, 8, seed=s, fixed_head=True) for s in range(6)]
    r = train_prompt(probs, steps=1500, train_v=False, seed=range(6))
    assert np.array_equal(r.v, np.stack([q.v for q in probs]))  # the head stayed fixed
    for k, q in enumerate(probs):
        svm = PromptSVM().fit(q, r.selected[k])
        assert svm.status_ == "optimal"
        assert r.p[k] @ svm.p_ / np.linalg.norm(r.p[k]) / np.linalg.norm(svm.p_) >= 0.99


def test_train_prompt_bad_input():
    q = random_prompt_problem(3, 4, 3, seed=0, fixed_head=True)
    q2 = random_prompt_problem(3, 5, 3, seed=0, fixed_head=True)
    with pytest.raises(ValueError, match="share"):
        train_prompt([q, q2], steps=1)
    with pytest.raises(ValueError, match="loss"):
        train_prompt(q, steps=1, loss="hinge")
    with pytest.raises(ValueError, match="v0 is only"):
        train_prompt(q, steps=1, train_v=False, v0=np.zeros(3))
    with pytest.raises(ValueError, match="lr"):
        train_prompt(q, steps=1, lr=-1.0)
