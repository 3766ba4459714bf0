"""``local-convergence`` (docs/spec.md §6): a diverged (non-finite) run is no evidence for a claim."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from attsvm.experiments import get_experiment, reproduce

THRESHOLD = 0.95


def _frame(kq_sfx: list[float], kq_corr: list[float], kq_finite: list[bool]) -> pd.DataFrame:
    """Final-step trial data of 3 perfectly converged W runs and 3 (K,Q) runs as given."""
    rows = []
    for param, sfx, corr, fin in (("W", [1.0] * 3, [1.0] * 3, [True] * 3), ("KQ", kq_sfx, kq_corr, kq_finite)):
        for r in range(3):
            c = corr[r]
            rows.append(
                {
                    "param": param,
                    "run": r,
                    "step": 100,
                    "sfx": sfx[r],
                    "finite": fin[r],
                    # own norm's SVM a bit closer than the other one (C4)
                    "corr_fro": c if param == "W" else c - 0.01,
                    "corr_nuc": c - 0.01 if param == "W" else c,
                    "status_fro": "optimal",
                    "status_nuc": "optimal",
                    "viol_fro": 0.0,
                    "viol_nuc": 0.0,
                    "gap_fro": 0.0,
                    "gap_nuc": 0.0,
                    "global": True,
                }
            )
    return pd.DataFrame(rows)


def _verdicts(df: pd.DataFrame) -> dict[str, list[bool | None]]:
    exp = get_experiment("local-convergence")
    hl, extra = exp.aggregate({**exp.settings(quick=True), "threshold": THRESHOLD}, df)
    out: dict[str, list[bool | None]] = {}
    for h in hl:
        out.setdefault(h.claim, []).append(h.passed)
    return out


@pytest.mark.parametrize(
    "kq",
    [
        ([np.nan] * 3, [np.nan] * 3, [False] * 3),  # every (K,Q) run diverged
        ([1.0, 1.0, np.nan], [1.0, 1.0, np.nan], [True, True, False]),  # one did: the others must not vouch
    ],
)
def test_a_diverged_run_fails_the_claims_it_enters(kq) -> None:
    v = _verdicts(_frame(*kq))
    assert all(p is False for p in v["C1"])  # mean top probability n/a, and a non-finite run counted
    assert v["C3"][0] is False  # (K,Q) corr with W*_mm n/a
    assert v["C4"][1] is False  # (K,Q) corr with W_mm n/a
    assert v["C2"][0] is True  # the W runs are finite and converged


def test_finite_runs_pass_and_none_is_counted_as_diverged() -> None:
    exp = get_experiment("local-convergence")
    hl, _ = exp.aggregate(
        {**exp.settings(quick=True), "threshold": THRESHOLD}, _frame([1.0] * 3, [1.0] * 3, [True] * 3)
    )
    assert all(h.passed is not False for h in hl)
    (div,) = [h for h in hl if h.name == "runs whose final iterate is non-finite (NaN/inf)"]
    assert div.value == {"W": 0, "KQ": 0} and div.passed is True


def test_lr_that_overflows_is_reported_not_passed(tmp_path) -> None:
    run = reproduce(
        "local-convergence",
        quick=True,
        out=tmp_path / "lc",
        progress=False,
        command=["test"],
        overrides={"lr": 1e300, "runs": 2, "chunk": 2, "steps": 40},
    )
    res = json.loads((run.out / "results.json").read_text())
    assert res["passed"] is False
    hl = {h["name"]: h for h in res["headlines"]}
    top = hl["mean final top softmax probability"]
    assert top["value"]["KQ"] is None and top["passed"] is False  # NaN: no evidence, not a PASS
    corr = hl["(K,Q): mean final corr with nuclear W*_mm"]
    assert corr["value"] is None and corr["passed"] is False  # NaN, not 0
    assert hl["runs whose final iterate is non-finite (NaN/inf)"]["value"] == {"W": 0, "KQ": 2}
    report = (run.out / "report.md").read_text()
    assert "non-finite (NaN/inf) in 0 W run(s) and 2 (K,Q) run(s)" in report
    # a NaN measurement (null in results.json) reads "n/a" in the report, never "None"
    assert "| (K,Q): mean final corr with nuclear W*_mm | n/a |" in report and "None" not in report
