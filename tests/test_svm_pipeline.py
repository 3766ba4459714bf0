"""The fit pipeline (svm/pipeline.py): the estimator holds what the pipeline's record says, and the record's
warnings are issued where the user called the fit."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from attsvm.datasets import paper_instance
from attsvm.svm import AttentionSVM, att_svm_constraints, pipeline


@pytest.mark.parametrize("norm", ["fro", "nuc"])
def test_the_estimator_holds_the_records_fields(norm: str) -> None:
    p = paper_instance(6, 8, 10, seed=0)
    alpha = p.optimal_tokens()
    cs = att_svm_constraints(p, alpha)
    est = AttentionSVM(norm).fit_constraints(cs)
    rec = pipeline.run(cs, None, est._request(), est._norm_object())
    assert rec.warnings == []
    for name, value in rec.fields.items():
        if name in ("solve_time_", "info_"):
            continue
        held = est.__dict__[name]
        if isinstance(value, np.ndarray):
            assert np.array_equal(held, value), name
        else:
            assert held == value or (held is None and value is None), name


def test_warnings_point_at_the_callers_line() -> None:
    # a backend stopped at its iteration limit: the record carries the warning, the estimator issues it here
    p = paper_instance(15, 15, 20, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est = AttentionSVM(max_iter=1).fit(p)
    assert est.status_ == "max_iter"
    mine = [w for w in caught if issubclass(w.category, RuntimeWarning) and "iteration limit" in str(w.message)]
    assert mine and all(w.filename == __file__ for w in mine)


def test_run_names_a_wrong_argument() -> None:
    est = AttentionSVM()
    with pytest.raises(TypeError, match=r"^cs must be a ConstraintSet, got ndarray$"):
        pipeline.run(np.zeros((2, 3, 4)), None, est._request(), est._norm_object())  # type: ignore[arg-type]
    p = paper_instance(3, 4, 5, seed=0)
    cs = att_svm_constraints(p, p.optimal_tokens())
    with pytest.raises(TypeError, match=r"^request and norm must be a SolveRequest and a Norm, got dict and str$"):
        pipeline.run(cs, None, {}, "fro")  # type: ignore[arg-type]
