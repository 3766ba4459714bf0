"""Bad input named, and results that do not depend on the units of the data (docs/spec.md §2–3).

Each case here came from an audit that fed the public API wrong types, shapes, non-finite entries,
huge and tiny scales and out-of-range seeds: the error must name the argument and what was expected,
and a finite input must give a finite, scale-free answer."""

from __future__ import annotations

import numpy as np
import pytest

from attsvm import AttentionProblem, AttentionSVM, ConstraintSet
from attsvm.datasets import paper_instance
from attsvm.svm import att_svm_constraints
from attsvm.tokens import margins, pair_differences, selected_tokens, support_tokens
from attsvm.training.bounds import gradient_bound, smoothness_bound

SCALES = (1e-200, 1e-12, 1.0, 1e12, 1e200)  # factors on X: none may change a verdict


@pytest.fixture(scope="module")
def problem():
    return paper_instance(6, 8, 10, seed=0)


def _scaled(p, c):
    return AttentionProblem(p.X * c, p.y, p.head, Z=p.Z)


# ---------------------------------------------------------------- scale
@pytest.mark.parametrize("c", SCALES)
def test_optimal_tokens_do_not_depend_on_the_scale_of_x(problem, c):
    # (the tie test used an absolute floor of 1e-12: at X·1e-12 every token of every sequence "tied")
    np.testing.assert_array_equal(_scaled(problem, c).optimal_tokens(), problem.optimal_tokens())


def test_a_true_tie_is_found_at_any_scale(problem):
    X = problem.X.copy()
    top = problem.optimal_tokens()[2]
    X[2, (top + 1) % 8] = X[2, top]
    for c in SCALES:
        with pytest.raises(ValueError, match="sequence 2: tokens"):
            AttentionProblem(X * c, problem.y, problem.head, Z=problem.Z).optimal_tokens()


def test_softmax_of_a_w_whose_logits_overflow_is_the_limit_distribution(problem):
    W = np.full((10, 10), 1e308)  # x_itᵀ W z_i is not a float: the limit puts all mass on the maximisers
    s = problem.softmax(W)
    limit = problem.softmax(np.ones((10, 10)) * 1e6)
    assert np.isfinite(s).all()
    np.testing.assert_array_equal(s.argmax(-1), limit.argmax(-1))
    np.testing.assert_allclose(s.max(-1), 1.0)
    batch = problem.softmax(np.stack([np.eye(10), W]))  # one factor per W of a stack
    np.testing.assert_allclose(batch[0], problem.softmax(np.eye(10)), rtol=1e-14)
    np.testing.assert_array_equal(batch[1], s)


# ---------------------------------------------------------------- ConstraintSet
@pytest.mark.parametrize(
    ("args", "exc", "match"),
    [
        (([[[1.0]]], [[1.0]], "x"), TypeError, "mask must be a boolean array"),
        ((np.ones((2, 3)), np.ones((2, 4)), np.ones((2, 3), bool)), ValueError, "A must have 3 dimensions"),
        ((np.ones((2, 3, 4)), np.ones((3, 4)), np.ones((2, 3), bool)), ValueError, r"Z must have shape \(2, \*\)"),
        ((np.ones((2, 3, 4)), np.ones((2, 4)), np.ones((3, 2), bool)), ValueError, r"mask must have shape \(2, 3\)"),
        ((np.full((2, 3, 4), np.nan), np.ones((2, 4)), np.ones((2, 3), bool)), ValueError, "A must be finite"),
        ((np.ones((2, 3, 4)), np.full((2, 4), np.inf), np.ones((2, 3), bool)), ValueError, "Z must be finite"),
        ((np.ones((2, 3, 4)), np.ones((2, 4)), np.ones((2, 3), bool), np.ones(5)), ValueError, r"rhs must have shape"),
        ((np.ones((2, 3, 4)), np.ones((2, 4)), np.ones((2, 3), bool), [[1, np.nan, 1]] * 2), ValueError, "rhs must be"),
        (
            (np.ones((2, 3, 4)), np.ones((2, 4)), np.ones((2, 3), bool), None, np.ones(3, bool)),
            ValueError,
            r"equality must have shape \(2, 3\)",
        ),
    ],
)
def test_constraint_set_names_its_bad_argument(args, exc, match):
    with pytest.raises(exc, match=match):
        ConstraintSet(*args)


def test_constraint_set_accepts_lists_and_01_masks(problem):
    cs = att_svm_constraints(problem)
    again = ConstraintSet(cs.A.tolist(), cs.Z.tolist(), cs.mask.astype(int), cs.rhs.tolist())
    a, b = AttentionSVM().fit_constraints(cs), AttentionSVM().fit_constraints(again)
    assert b.status_ == "optimal"
    np.testing.assert_allclose(b.W_, a.W_, rtol=1e-12)


# ---------------------------------------------------------------- problems where a problem is expected
@pytest.mark.parametrize(
    "call",
    [
        lambda: pair_differences(None),
        lambda: margins(None, None, np.eye(3)),
        lambda: selected_tokens(None, np.eye(3)),
        lambda: att_svm_constraints(None),
        lambda: smoothness_bound(None),
        lambda: gradient_bound(None),
    ],
)
def test_helpers_name_a_missing_problem(call):
    with pytest.raises(TypeError, match="problem must be an AttentionProblem, got NoneType"):
        call()


def test_support_tokens_names_bad_margins():
    with pytest.raises(ValueError, match=r"margin must be an \(n, T\) array"):
        support_tokens(np.ones(3))
    with pytest.raises(ValueError, match="no NaN"):
        support_tokens(np.array([[1.0, np.nan]]))
    with pytest.raises(TypeError, match="margin must be an array of real margins"):
        support_tokens([["a", 1.0]])
    assert support_tokens(np.array([[np.inf, 1.0, 2.0]])).tolist() == [[False, True, False]]


def test_fit_many_names_tokens_that_are_not_a_sequence(problem):
    with pytest.raises(TypeError, match="tokens must be None or a sequence of one selection"):
        AttentionSVM().fit_many([problem], tokens=3)


# ---------------------------------------------------------------- seeds
def test_seeds_beyond_64_bits_are_named(problem):
    with pytest.raises(ValueError, match="seed must be <= 9223372036854775807"):
        paper_instance(6, 8, 10, seed=2**70)
    with pytest.raises(ValueError, match="seed must be an integer >= 0 and <= 9223372036854775807"):
        AttentionSVM(seed=2**70).fit(problem)
    assert paper_instance(2, 3, 4, seed=2**63 - 1).X.shape == (2, 3, 4)


# ---------------------------------------------------------------- .npz files
@pytest.mark.parametrize(
    ("arrays", "match"),
    [
        ({"head_kind": np.array("foo"), "head_weights": np.ones(10)}, r"head_kind must be one of .* got 'foo'"),
        ({"head_kind": np.array("relu")}, r"missing \['head_weights'\]"),
        ({"head_kind": np.array("mlp"), "head_weights": np.ones((10, 4))}, r"missing \['mlp_activation'"),
        ({"v": np.ones(10), "query_index": np.array([1, 2])}, "query_index must be a scalar integer"),
        ({"v": np.ones(10), "query_index": np.array(0.7)}, "query_index must be a scalar integer, got float64"),
    ],
)
def test_from_npz_names_missing_and_malformed_arrays(tmp_path, problem, arrays, match):
    f = tmp_path / "p.npz"
    extra = {} if "query_index" in arrays else {"Z": problem.Z}
    np.savez(f, X=problem.X, y=problem.y, **extra, **arrays)
    with pytest.raises(ValueError, match=match):
        AttentionProblem.from_npz(f)


def test_from_npz_reads_an_integer_query_index(tmp_path, problem):
    f = tmp_path / "p.npz"
    np.savez(f, X=problem.X, y=problem.y, v=problem.head.weights, query_index=np.array(2))
    assert AttentionProblem.from_npz(f).query_index == 2
