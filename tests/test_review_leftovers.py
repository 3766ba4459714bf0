"""Review leftovers: the relative tie rule in prompt attention, softmax of huge self-attention data,
matrix_rank's 0-d tol, stacked support tokens, a (1,) query_index in .npz files, the auto step's
message for (K, Q), an integer device, and Dask's logger level after reproduce (docs/spec.md §2, §4).
Each test fails on the code before its fix."""

from __future__ import annotations

import argparse
import logging
import sys

import numpy as np
import pytest

from attsvm import AttentionProblem, matrix_rank
from attsvm.cli._reproduce import _dask_logging
from attsvm.datasets import paper_instance
from attsvm.prompt import PromptProblem
from attsvm.tokens import margins, support_tokens
from attsvm.training import train

TINY = 1e-20  # a scale far below the old absolute tie floor TIE_RTOL·(1 + 2|top|) = 1e-12


# ---------------------------------------------------------------- ties relative to the largest |score|
def _two_token_prompt(a: float, b: float) -> PromptProblem:
    # one sequence, scores y·vᵀx = (a, b) with v = e_1
    return PromptProblem(np.array([[[a, 0.0], [b, 0.0]]]), [1.0], v=[1.0, 0.0])


def test_prompt_ties_are_relative_to_the_largest_score():
    assert _two_token_prompt(TINY, 2 * TINY).optimal_tokens().tolist() == [1]  # distinct: no tie
    with pytest.raises(ValueError, match=r"v: the optimal token is not unique in sequences \[0\]"):
        _two_token_prompt(2 * TINY, 2 * TINY).optimal_tokens()
    with pytest.raises(ValueError, match="not unique"):  # within TIE_RTOL of the top, relative
        _two_token_prompt(1e20, 1e20 * (1 - 1e-13)).optimal_tokens()


def test_problem_ties_are_relative_to_the_largest_score():
    X = np.zeros((1, 3, 2))
    X[0, 1, 0], X[0, 2, 0] = TINY, 2 * TINY
    assert AttentionProblem(X, [1.0], [1.0, 0.0], query_index=0).optimal_tokens().tolist() == [2]
    X[0, 1, 0] = 2 * TINY
    with pytest.raises(ValueError, match=r"sequence 0: tokens \[1, 2\]"):
        AttentionProblem(X, [1.0], [1.0, 0.0], query_index=0).optimal_tokens()


# ---------------------------------------------------------------- softmax when X overflows the logits
def test_softmax_of_huge_self_attention_data_is_the_limit_distribution():
    p = paper_instance(5, 6, 4, seed=0)
    W = np.eye(4) + 0.1 * np.ones((4, 4))
    selfatt = AttentionProblem(p.X, p.y, p.head, query_index=0)
    huge = AttentionProblem(p.X * 1e200, p.y, p.head, query_index=0)  # x_itᵀ W x_i0 ~ 1e400
    s = huge.softmax(W)
    assert np.isfinite(s).all()
    np.testing.assert_allclose(s.sum(-1), 1.0)
    np.testing.assert_array_equal(s.argmax(-1), selfatt.logits(W).argmax(-1))  # all mass on the maximiser
    np.testing.assert_allclose(s.max(-1), 1.0)
    # a stack: 1e10·W overflows through X·1e150 (logits ~1e310), 1e-300·W gives logits of order 1 again
    big = AttentionProblem(p.X * 1e150, p.y, p.head, query_index=0)
    batch = big.softmax(np.stack([1e10 * W, 1e-300 * W]))
    np.testing.assert_allclose(batch[0].max(-1), 1.0)
    np.testing.assert_array_equal(batch[0].argmax(-1), s.argmax(-1))
    np.testing.assert_allclose(batch[1], selfatt.softmax(W), rtol=1e-12)


def test_softmax_at_a_normal_scale_is_unchanged():
    p = paper_instance(5, 6, 4, seed=0)
    W = np.random.default_rng(0).standard_normal((3, 4, 4))
    g = p.logits(W)
    e = np.exp(g - g.max(-1, keepdims=True))
    np.testing.assert_array_equal(p.softmax(W), e / e.sum(-1, keepdims=True))


# ---------------------------------------------------------------- matrix_rank's tol
@pytest.mark.parametrize("tol", [np.float64(0.01), np.array(0.01), np.array(0.01, dtype=np.float32)])
def test_matrix_rank_takes_a_numpy_scalar_tol(tol):
    assert matrix_rank(np.diag([1.0, 1e-3]), tol=tol) == 1


@pytest.mark.parametrize(
    ("tol", "exc", "match"),
    [
        (np.array([0.01]), TypeError, r"tol must be a real number in \[0, 1\).*got ndarray of shape \(1,\)"),
        (np.array(True), TypeError, r"tol must be a real number.*got ndarray of shape \(\)"),
        (np.array(np.nan), ValueError, r"tol must be a finite real in \[0, 1\)"),
        (np.array(-0.5), ValueError, r"tol must be a finite real in \[0, 1\)"),
    ],
)
def test_matrix_rank_refuses_a_non_scalar_or_out_of_range_tol(tol, exc, match):
    with pytest.raises(exc, match=match):
        matrix_rank(np.eye(2), tol=tol)


# ---------------------------------------------------------------- stacked support tokens
def test_support_tokens_of_stacked_margins_are_per_solution():
    p = paper_instance(4, 5, 6, seed=0)
    Ws = np.random.default_rng(1).standard_normal((3, 6, 6))
    m = margins(p, None, Ws)  # (3, n, T)
    m[1, 2, 3] = 1.0  # one pair made tight
    out = support_tokens(m)
    assert out.shape == (3, 4, 5)
    for r in range(3):
        np.testing.assert_array_equal(out[r], support_tokens(m[r]))
    assert out[1, 2, 3]
    with pytest.raises(ValueError, match=r"margin must be an \(n, T\) array .* got shape \(5,\)"):
        support_tokens(np.ones(5))


# ---------------------------------------------------------------- .npz query_index of shape (1,)
def test_from_npz_reads_a_query_index_of_shape_1(tmp_path):
    p = paper_instance(3, 4, 5, seed=0)
    f = tmp_path / "p.npz"
    np.savez(f, X=p.X, y=p.y, v=p.head.weights, query_index=np.array([2]))
    assert AttentionProblem.from_npz(f).query_index == 2
    np.savez(f, X=p.X, y=p.y, v=p.head.weights, query_index=np.array([[2]]))
    with pytest.raises(ValueError, match=r"query_index must be a scalar integer, got int64 of shape \(1, 1\)"):
        AttentionProblem.from_npz(f)


# ---------------------------------------------------------------- training: auto step, device
def test_the_auto_step_message_says_which_step_kq_uses():
    p = paper_instance(3, 4, 5, seed=0)
    huge = AttentionProblem(p.X * 1e100, p.y, p.head, Z=p.Z)
    with (
        pytest.raises(ValueError, match=r"lr='auto' for plain GD is 1/\(L_W·B \+ G_W\) with B = max\(1,.*G_W"),
        np.errstate(over="ignore", invalid="ignore"),
    ):
        train(huge, param="KQ", steps=1, normalized=False)
    with (
        pytest.raises(ValueError, match=r"lr='auto' for plain GD is 1/L_W from the smoothness bound L_W, which"),
        np.errstate(over="ignore", invalid="ignore"),
    ):
        train(huge, steps=1, normalized=False)


@pytest.mark.parametrize("device", [0, np.int64(1), True])
def test_an_integer_device_is_refused_naming_the_forms(device):
    p = paper_instance(3, 4, 5, seed=0)
    with pytest.raises(TypeError, match=r"device must be a torch device or its name \(.*'cuda:N' for the CUDA"):
        train(p, steps=1, device=device)


# ---------------------------------------------------------------- Dask's logger level
def test_dask_logging_restores_the_level_distributed_set_on_import(tmp_path, monkeypatch):
    pytest.importorskip("distributed")  # (the real one stays in sys.modules: monkeypatch puts it back)
    # a stand-in for a first import of distributed, which sets its logger's level from the dask config
    (tmp_path / "distributed.py").write_text("import logging\nlogging.getLogger('distributed').setLevel(15)\n")
    monkeypatch.delitem(sys.modules, "distributed")
    monkeypatch.syspath_prepend(str(tmp_path))
    logger = logging.getLogger("distributed")
    level = logger.level
    logger.setLevel(logging.NOTSET)
    try:
        with _dask_logging(argparse.Namespace(scheduler="local:2", verbose=0)):
            assert logger.level == logging.WARNING
        assert logger.level == 15  # what the import set; the old code put back NOTSET, saved before it
    finally:
        logger.setLevel(level)
