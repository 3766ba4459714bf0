"""The active set on one growing Cholesky factor (svm/_cholesky_active_set.py), the first route of large
all-inequality Frobenius instances: the same answer as the Newton route, certified, and a clean hand-over
to that route whenever it cannot settle."""

from __future__ import annotations

import numpy as np
import pytest

from attsvm.datasets import paper_instance
from attsvm.svm import AttentionSVM, att_svm_constraints, solve_frobenius
from attsvm.svm import _cholesky_active_set as cas
from attsvm.svm.certificate import optimality_certificate

# the two routes stop at the same certificate tolerance (1e-10): their W agree to a few times it
AGREE_RTOL = 1e-8


def _cs(n: int, T: int, d: int, seed: int = 0):
    p = paper_instance(n, T, d, seed=seed)
    return p, att_svm_constraints(p, p.optimal_tokens(ties="first"))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_it_matches_the_newton_route_and_certifies(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    _, cs = _cs(50, 100, 64, seed)  # K = 4,950: several rounds, rows frozen and cut on the way
    calls = {"freeze": 0, "cut": 0}
    for name in calls:
        orig = getattr(cas._Factor, name)

        def counted(self, *a, _orig=orig, _name=name):
            calls[_name] += 1
            return _orig(self, *a)

        monkeypatch.setattr(cas._Factor, name, counted)
    chol = solve_frobenius(cs, cholesky_min=1000)
    newton = solve_frobenius(cs, cholesky_min=0)
    assert chol.info["path"] == "cholesky_active_set" and newton.info["path"].startswith("working_set")
    assert chol.status == newton.status == "optimal"
    assert calls["freeze"] >= 1, calls  # (the instance exercises the frozen rows)
    scale = np.linalg.norm(newton.W)
    assert np.linalg.norm(chol.W - newton.W) <= AGREE_RTOL * scale
    cert = optimality_certificate(cs, chol.W, chol.dual, "fro")
    assert cert.relative_violation <= 1e-10 and abs(cert.relative_gap) <= 1e-10
    # dual feasibility and complementary slackness: multipliers only on tight rows
    assert (chol.dual >= 0).all() and (chol.dual[~cs.mask] == 0).all()
    assert np.abs(cs.apply(chol.W) - cs.rhs)[chol.dual > 0].max() <= 1e-9


def test_the_estimator_takes_it_for_large_instances() -> None:
    p, cs = _cs(100, 201, 64)  # K = 20,000: the default threshold
    assert cs.n_constraints >= 20_000
    svm = AttentionSVM("fro").fit(p, p.optimal_tokens(ties="first"))
    assert svm.status_ == "optimal" and svm.info_["path"] == "cholesky_active_set"
    assert svm.max_violation_ <= 1e-9 and abs(svm.relative_gap_) <= 1e-9


def _spy(monkeypatch: pytest.MonkeyPatch) -> list:
    """The answers of the Cholesky route during the next solves (None: it handed over)."""
    import attsvm.svm.frobenius as frob

    answers: list = []

    def spied(*a, **k):
        answers.append(cas.solve_cholesky_active_set(*a, **k))
        return answers[-1]

    monkeypatch.setattr(frob, "solve_cholesky_active_set", spied)
    return answers


def test_a_singular_gram_hands_over_to_the_newton_route(monkeypatch: pytest.MonkeyPatch) -> None:
    # d = 3: 9 dimensions for W, far fewer than the rows a working set takes, so the appended block is
    # not positive definite; the Newton/LDP route answers instead
    _, cs = _cs(60, 100, 3)
    answers = _spy(monkeypatch)
    raw = solve_frobenius(cs, cholesky_min=1000)
    assert answers == [None]  # (tried, and handed over)
    assert raw.info["path"] != "cholesky_active_set"
    ref = solve_frobenius(cs, cholesky_min=0)
    assert raw.status == ref.status
    if raw.status == "optimal":
        assert np.allclose(raw.W, ref.W, rtol=1e-8, atol=1e-10 * np.linalg.norm(ref.W))


def test_a_working_set_beyond_max_rows_hands_over(monkeypatch: pytest.MonkeyPatch) -> None:
    _, cs = _cs(50, 100, 64)
    answers = _spy(monkeypatch)
    raw = solve_frobenius(cs, cholesky_min=1000, cholesky_max_rows=300)
    assert answers == [None]
    assert raw.status == "optimal" and raw.info["path"].startswith("working_set")


def test_the_answer_does_not_depend_on_the_units_of_x_and_z() -> None:
    # the route runs on the reduced, row-normalised problem: X ×1e8 and Z ×1e-5 give W / 1e3, certified
    _, cs = _cs(50, 100, 64)
    ref = solve_frobenius(cs, cholesky_min=1000)
    big = type(cs)(cs.A * 1e8, cs.Z * 1e-5, cs.mask, cs.rhs, cs.equality)
    raw = solve_frobenius(big, cholesky_min=1000)
    assert raw.info["path"] == ref.info["path"] == "cholesky_active_set" and raw.status == "optimal"
    assert np.linalg.norm(raw.W * 1e3 - ref.W) <= AGREE_RTOL * np.linalg.norm(ref.W)
    cert = optimality_certificate(big, raw.W, raw.dual, "fro")
    assert cert.relative_violation <= 1e-10 and abs(cert.relative_gap) <= 1e-10


def test_equality_rows_take_the_newton_route(monkeypatch: pytest.MonkeyPatch) -> None:
    _, cs = _cs(50, 100, 64)
    eq = cs.equality.copy()
    eq[:, :] = False
    eq[0, np.flatnonzero(cs.mask[0])[0]] = True
    cs_eq = type(cs)(cs.A, cs.Z, cs.mask, cs.rhs, eq)
    answers = _spy(monkeypatch)
    raw = solve_frobenius(cs_eq, cholesky_min=1000)
    assert raw.info["path"] != "cholesky_active_set" and answers == []
    assert solve_frobenius(cs, cholesky_min=1000).info["path"] == "cholesky_active_set" and len(answers) == 1


@pytest.mark.parametrize(
    "name,value,error,message",
    [
        ("cholesky_min", -1, ValueError, "cholesky_min must be >= 0, got -1"),
        ("cholesky_max_rows", 1.5, TypeError, "cholesky_max_rows must be an integer, got float 1.5"),
    ],
)
def test_bad_options_are_named(name: str, value: object, error: type, message: str) -> None:
    _, cs = _cs(4, 5, 6)
    with pytest.raises(error, match=f"^{message}$"):
        solve_frobenius(cs, **{name: value})


def _dense_factor(F: cas._Factor) -> np.ndarray:
    """L as one square array, assembled from the block rows."""
    L = np.zeros((F.p, F.p))
    for s, L21, D in zip(F.starts, F.L21, F.D):
        e = s + D.shape[0]
        L[s:e, :s] = L21
        L[s:e, s:e] = np.tril(D)
    return L


def test_the_block_row_factor_appends_cuts_freezes_and_solves_as_a_dense_cholesky() -> None:
    # an independent check of the factor: after appends and a cut whose first removed row lies inside a
    # block (that block splits; the later kept rows keep their part of L left of it), L Lᵀ = G_PP + ρI to
    # round-off, and the free-set solve equals a dense solve on the free rows with the frozen ones at zero
    rng = np.random.default_rng(0)
    n, T, d = 12, 30, 40
    A2 = rng.standard_normal((n * T, d))
    Z = rng.standard_normal((n, d))
    F = cas._Factor(A2, Z @ Z.T, T, ridge=1e-3)

    def G(rows: np.ndarray) -> np.ndarray:
        return (A2[rows] @ A2[rows].T) * (Z[rows // T] @ Z[rows // T].T) + 1e-3 * np.eye(rows.size)

    order = rng.permutation(n * T)[:200]
    for lo, hi in [(0, 60), (60, 110), (110, 200)]:
        assert F.append(np.sort(order[lo:hi]))
    assert len(F.starts) == 3
    L = _dense_factor(F)
    assert np.allclose(L @ L.T, G(F.rows), rtol=0, atol=1e-9 * np.abs(G(F.rows)).max())
    keep = np.ones(F.p, bool)
    keep[[75, 80, 150, 199]] = False  # (the first removed row, 75, lies inside the second block)
    before = F.rows[keep]
    assert F.cut(keep)
    assert np.array_equal(F.rows, before) and F.starts == [0, 60, 75]
    L = _dense_factor(F)
    assert np.allclose(L @ L.T, G(F.rows), rtol=0, atol=1e-9 * np.abs(G(F.rows)).max())
    F.freeze(np.array([3, 70, 120]))
    assert F.append(np.sort(rng.permutation(np.setdiff1d(np.arange(n * T), F.rows))[:40]))  # (Y grows a tail)
    F.freeze(np.array([10]))
    F.thaw(np.array([70]))
    assert sorted(F.frozen.tolist()) == [3, 10, 120]
    assert np.allclose(F.YY, F.Y.T @ F.Y, rtol=1e-12, atol=1e-12)
    b = rng.standard_normal(F.p)
    x = F.solve(b)
    free = np.setdiff1d(np.arange(F.p), F.frozen)
    ref = np.zeros(F.p)
    ref[free] = np.linalg.solve(G(F.rows)[np.ix_(free, free)], b[free])
    assert np.allclose(x, ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max())
    assert (x[F.frozen] == 0).all()
