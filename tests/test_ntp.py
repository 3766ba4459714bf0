"""Next-token prediction (docs/spec.md §8): token-priority graphs and SCCs, the graph-SVM, W_fin, training.

Independent references: a Tarjan SCC written here, a cvxpy graph-SVM built row by row from the edges,
KKT / Farkas conditions checked by hand, central finite differences for the gradients.
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

from attsvm.ntp import NextTokenProblem, random_ntp_problem
from attsvm.svm import AttentionSVM
from attsvm.svm.graph import (
    GraphSVMConstraints,
    fin_basis,
    graph_svm,
    graph_svm_constraints,
    ntp_decomposition,
    project_fin,
)
from attsvm.training.ntp import ntp_batch, ntp_loss_and_grad, ntp_w_fin, train_ntp

TOL_CVXPY = 1e-6  # graph-SVM vs cvxpy: W (Frobenius) and the optimal value (both norms), relative
TOL_KKT = 1e-8  # stationarity / feasibility / complementarity of the Frobenius solution, relative
TOL_FD = 1e-6  # analytic vs central-difference gradient, relative
FD_STEP = 1e-6
TOL_BATCH = 1e-12  # batched vs looped training
TOL_FARKAS = 1e-9  # ‖Σ λ_k a_k z_kᵀ‖ relative to Σ|λ_k|‖a_k‖‖z_k‖
TOL_WFIN_GRAD = 1e-8
TOL_NUC = 1e-7  # certificate tolerance asked of the nuclear graph-SVM


def _unit(rng: np.random.Generator, V: int, d: int) -> np.ndarray:
    E = rng.standard_normal((V, d))
    return E / np.linalg.norm(E, axis=1, keepdims=True)


def _tarjan(V: int, edges: list[tuple[int, int]]) -> list[int]:
    """Textbook recursive Tarjan: SCC label of each node (independent of scipy)."""
    adj: list[list[int]] = [[] for _ in range(V)]
    for a, b in edges:
        adj[a].append(b)
    index = [-1] * V
    low = [0] * V
    on = [False] * V
    stack: list[int] = []
    comp = [-1] * V
    counter = [0, 0]

    def visit(u: int) -> None:
        index[u] = low[u] = counter[0]
        counter[0] += 1
        stack.append(u)
        on[u] = True
        for v in adj[u]:
            if index[v] < 0:
                visit(v)
                low[u] = min(low[u], low[v])
            elif on[v]:
                low[u] = min(low[u], index[v])
        if low[u] == index[u]:
            while True:
                w = stack.pop()
                on[w] = False
                comp[w] = counter[1]
                if w == u:
                    break
            counter[1] += 1

    for u in range(V):
        if index[u] < 0:
            visit(u)
    return comp


def _toy() -> NextTokenProblem:
    """Last token 2: [0,1,2]→0 and [1,0,2]→1 make the SCC {0,1} above {2}; last token 3: [0,3]→0."""
    rng = np.random.default_rng(0)
    return NextTokenProblem([[0, 1, 2], [1, 0, 2], [4, 0, 3]], [0, 1, 0], _unit(rng, 5, 6))


def _cvxpy_graph_svm(p: NextTokenProblem, norm: str) -> tuple[str, np.ndarray | None, float]:
    """The graph-SVM written from the edges directly (one row per edge, duplicates kept)."""
    W = cp.Variable((p.d, p.d))
    cons = []
    for k, g in p.graphs().items():
        for y, j in g.edges():
            a = p.E[y] - p.E[j]
            expr = a @ W @ p.E[k]
            cons.append(expr == 0 if g.scc[y] == g.scc[j] else expr >= 1)
    obj = cp.sum_squares(W) if norm == "fro" else cp.normNuc(W)  # (the smooth form is the accurate one)
    prob = cp.Problem(cp.Minimize(obj), cons)
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-9, tol_gap_rel=1e-9, tol_feas=1e-9)
    val = float(np.sqrt(prob.value)) if norm == "fro" and prob.value is not None else float(prob.value or np.inf)
    return prob.status, W.value, val


# ------------------------------------------------------------------------------------------ graphs
def test_toy_graph_sccs_and_rows() -> None:
    p = _toy()
    g = p.graph(2)
    assert g.scc[0] == g.scc[1] != g.scc[2]
    assert g.cyclic and g.n_scc == 2
    gc = graph_svm_constraints(p)
    rows = {
        (int(k), tuple(int(x) for x in pr), bool(e))
        for k, prs, eqs, m in zip(gc.last_tokens, gc.pairs, gc.equality, gc.constraints.mask)
        for pr, e, mm in zip(prs, eqs, m)
        if mm
    }
    assert rows == {(2, (0, 1), True), (2, (0, 2), False), (2, (1, 2), False), (3, (0, 4), False), (3, (0, 3), False)}
    assert p.scc_positions().tolist() == [[True, True, False], [True, True, False], [False, True, False]]


@pytest.mark.parametrize("seed", range(12))
def test_sccs_match_an_independent_tarjan(seed: int) -> None:
    rng = np.random.default_rng(seed)
    V = int(rng.integers(3, 9))
    n = int(rng.integers(2, 30))
    lengths = rng.integers(1, V + 1, n)
    seqs = [rng.choice(V, int(L), replace=bool(rng.integers(2))) for L in lengths]
    seqs = [np.r_[s, rng.integers(0, 2)] for s in seqs]  # few last tokens: dense, cyclic graphs
    labels = np.array([rng.choice(s) for s in seqs])
    p = NextTokenProblem(seqs, labels, _unit(rng, V, 4))
    for k, g in p.graphs().items():
        edges = sorted({(int(y), int(j)) for s, y in zip(seqs, labels) if s[-1] == k for j in s if j != y})
        assert [tuple(e) for e in g.edges().tolist()] == edges
        ref = _tarjan(V, edges)
        same = np.equal.outer(g.scc, g.scc)
        assert np.array_equal(same, np.equal.outer(ref, ref)), f"k={k}"


# ------------------------------------------------------------------------------------------ graph-SVM
def _check_frobenius_kkt(svm: AttentionSVM, gc: GraphSVMConstraints) -> None:
    cs = gc.constraints
    W, lam = svm.W_, svm.dual_coef_
    m = np.einsum("gra,ab,gb->gr", cs.A, W, cs.Z)
    scale = np.linalg.norm(W)
    assert np.all(np.abs(m - 0.0)[cs.equality] <= TOL_KKT * scale)
    assert np.all(m[cs.inequality] >= 1 - TOL_KKT)
    assert np.all(lam[cs.inequality] >= -TOL_KKT)
    assert np.all(np.abs(lam * (m - 1))[cs.inequality] <= TOL_KKT * max(1.0, lam.max()))
    W_dual = np.einsum("gr,gra,gb->ab", lam, cs.A, cs.Z)  # stationarity of ½‖W‖²: W = 𝒜*(λ)
    assert np.linalg.norm(W - W_dual) <= TOL_KKT * scale


@pytest.mark.parametrize("seed", range(4))
def test_graph_svm_matches_cvxpy_with_equality_and_inequality_rows(seed: int) -> None:
    p = random_ntp_problem(8, 4, 6, 8, seed=seed, cyclic=True)
    gc = graph_svm_constraints(p)
    assert gc.n_equality > 0 and gc.n_inequality > 0
    fro = graph_svm(gc, norm="fro")
    assert fro.status_ == "optimal"
    _check_frobenius_kkt(fro, gc)
    status, W_ref, val = _cvxpy_graph_svm(p, "fro")
    assert status == "optimal"
    assert np.linalg.norm(fro.W_ - W_ref) <= TOL_CVXPY * np.linalg.norm(W_ref)
    assert abs(fro.objective_ - val) <= TOL_CVXPY * val
    # W_svm ⊥ S_fin (its equality rows)
    B = fin_basis(gc)
    assert B.shape[0] > 0
    assert np.linalg.norm(project_fin(fro.W_, B)) <= TOL_KKT * np.linalg.norm(fro.W_)
    nuc = graph_svm(gc, norm="nuc", tol=TOL_NUC)  # the nuclear solver certifies a relative gap ≤ tol
    assert nuc.status_ == "optimal" and nuc.relative_gap_ <= TOL_NUC
    _, _, val_nuc = _cvxpy_graph_svm(p, "nuc")
    assert abs(nuc.objective_ - val_nuc) <= TOL_CVXPY * val_nuc


def test_infeasible_graph_svm_is_certified() -> None:
    """e_2 = (e_0 + e_1)/2: rows (e_0 − e_2)ᵀWe_3 ≥ 1 and (e_1 − e_2)ᵀWe_3 ≥ 1 sum to 0 ≥ 2."""
    rng = np.random.default_rng(1)
    E = _unit(rng, 4, 5)
    E[2] = 0.5 * (E[0] + E[1])
    p = NextTokenProblem([[0, 2, 3], [1, 2, 3]], [0, 1], E)
    gc = graph_svm_constraints(p)
    assert gc.n_equality == 0
    for norm in ("fro", "nuc"):
        svm = graph_svm(gc, norm=norm)
        assert svm.status_ == "infeasible" and svm.W_ is None
        lam = svm.certificate_
        cs = gc.constraints
        assert np.all(lam[cs.inequality] >= 0) and lam.sum() > 0
        combo = np.einsum("gr,gra,gb->ab", lam, cs.A, cs.Z)
        size = np.sum(np.abs(lam) * np.linalg.norm(cs.A, axis=-1) * np.linalg.norm(cs.Z, axis=-1)[:, None])
        assert np.linalg.norm(combo) <= TOL_FARKAS * size
        assert float(np.sum(lam * cs.rhs)) > 0
    assert _cvxpy_graph_svm(p, "fro")[0] == "infeasible"


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("seqs", "labels", "V", "match"),
    [
        ([[0, 1], []], [0, 0], 3, r"sequences\[1\] is empty"),
        ([[0, 5]], [0], 3, r"sequences\[0\] has vocabulary index 5 out of range"),
        ([[0, -1]], [0], 3, r"sequences\[0\] has vocabulary index -1"),
        ([[0, 1]], [7], 3, r"labels\[0\] = 7 is a vocabulary index out of range"),
        ([[0, 1]], [2], 3, r"labels must occur in their sequences"),
        ([[0, 1]], [0, 1], 3, r"labels must have shape"),
        ([], [], 3, r"sequences must hold at least one sequence"),
    ],
)
def test_bad_input_raises_naming_the_argument(seqs: list, labels: list, V: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        NextTokenProblem(seqs, labels, np.eye(V))


def test_bad_embedding_and_graph_without_edges() -> None:
    with pytest.raises(ValueError, match="E must have 2 dimensions"):
        NextTokenProblem([[0]], [0], np.ones(3))
    with pytest.raises(TypeError, match=r"sequences\[0\] must hold integer"):
        NextTokenProblem([[0.5, 1]], [0], np.eye(2))
    p = NextTokenProblem([[1, 1], [0]], [1, 0], np.eye(2))  # every sequence is its label only
    with pytest.raises(ValueError, match="problem: the token-priority graphs have no edges"):
        graph_svm_constraints(p)
    with pytest.raises(ValueError, match="corpus has no prefix"):
        NextTokenProblem.from_corpus([[0, 1, 2]], np.eye(3))


def test_from_corpus_keeps_realisable_prefixes() -> None:
    p = NextTokenProblem.from_corpus([[0, 1, 0, 2, 1]], np.eye(3))
    assert [list(r[v]) for r, v in zip(p.tokens, p.valid)] == [[0, 1], [0, 1, 0, 2]]
    assert p.labels.tolist() == [0, 1]


# ------------------------------------------------------------------------------------------ training
def _mixed_problems() -> list[NextTokenProblem]:
    rng = np.random.default_rng(5)
    out = []
    for n, T, V in [(5, 4, 6), (3, 6, 7), (7, 3, 5)]:
        seqs = [rng.choice(V, int(rng.integers(1, T + 1))) for _ in range(n)]
        labels = [int(rng.choice(s)) for s in seqs]
        out.append(NextTokenProblem(seqs, labels, _unit(rng, V, 4)))
    return out


@pytest.mark.parametrize("loss", ["log", "ce"])
def test_gradient_matches_finite_differences(loss: str) -> None:
    plist = _mixed_problems()
    batch = ntp_batch(plist)
    rng = np.random.default_rng(0)
    W = 2.0 * rng.standard_normal((len(plist), 4, 4))
    _, grad = ntp_loss_and_grad(batch, W, loss)
    fd = np.zeros_like(W)
    for idx in np.ndindex(*W.shape[1:]):
        D = np.zeros_like(W)
        D[(slice(None), *idx)] = FD_STEP
        lp, _ = ntp_loss_and_grad(batch, W + D, loss)
        lm, _ = ntp_loss_and_grad(batch, W - D, loss)
        fd[(slice(None), *idx)] = (lp - lm) / (2 * FD_STEP)
    assert np.linalg.norm(grad - fd) <= TOL_FD * max(1.0, np.linalg.norm(fd))


def test_loss_is_stable_at_huge_norm() -> None:
    p = _toy()
    risk, grad = ntp_loss_and_grad(ntp_batch(p), 1e6 * np.random.default_rng(0).standard_normal((1, 6, 6)))
    assert np.all(np.isfinite(risk)) and np.all(np.isfinite(grad))


@pytest.mark.parametrize("loss", ["log", "ce"])
def test_batched_training_equals_looped(loss: str) -> None:
    plist = _mixed_problems()
    kw = dict(steps=40, lr=0.1, loss=loss, record_every=10)
    batched = train_ntp(plist, seed=[3, 4, 5], **kw)
    for r, p in enumerate(plist):
        alone = train_ntp(p, seed=3 + r, **kw)
        assert np.abs(batched.W[r] - alone.W[0]).max() <= TOL_BATCH
        assert np.abs(batched.history["loss"][r] - alone.history["loss"][0]).max() <= TOL_BATCH


def test_w_fin_is_the_reduced_minimiser_and_gd_approaches_the_decomposition() -> None:
    p = random_ntp_problem(6, 4, 6, 8, seed=2, cyclic=True)
    gc = graph_svm_constraints(p)
    B = fin_basis(gc)
    wf = ntp_w_fin(p, B)
    assert wf.converged and wf.grad_norm <= TOL_WFIN_GRAD
    assert np.linalg.norm(project_fin(wf.W, B) - wf.W) <= 1e-12 * max(1.0, np.linalg.norm(wf.W))
    batch = ntp_batch(p, valid=[p.scc_positions()])
    rng = np.random.default_rng(0)
    for _ in range(5):  # a convex minimum over S_fin: every direction in S_fin goes up
        D = np.einsum("m,mij->ij", rng.standard_normal(len(B)), B)
        assert ntp_loss_and_grad(batch, (wf.W + 0.1 * D)[None])[0][0] > wf.loss
    svm = graph_svm(gc)
    res = train_ntp(p, steps=1500, lr=0.01, seed=0, record_every=500)
    dec = ntp_decomposition(res.history["W"][0], svm.W_, B, wf.W)
    assert np.all(np.diff(dec.corr_perp) > 0) and dec.corr_perp[-1] > 0.9
    assert dec.fin_distance[-1] < 0.1 * dec.fin_distance[0]
