"""``lp-convergence`` (docs/spec.md §6): a claim over several p holds only if every p meets it; a NaN
measurement for one p is no evidence (``min`` of a list holding NaN depends on where the NaN is)."""

from __future__ import annotations

import numpy as np
import pytest

from attsvm.experiments import TrialStore, get_experiment, reproduce


@pytest.fixture(scope="module")
def lp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("lp") / "run"
    run = reproduce("lp-convergence", quick=True, out=out, progress=False, command=["test"])
    exp = get_experiment("lp-convergence")
    s = exp.settings(quick=True)
    df = TrialStore(out / "trials").load()
    return exp, s, df, run


def _c1(exp, s, df) -> bool:
    hl, _ = exp.aggregate(s, df)
    (c1,) = [h for h in hl if h.name == "ℓp-MD: mean final corr with own ℓp-AttSVM"]
    return bool(c1.passed)


@pytest.mark.parametrize("which", [0, -1])  # the NaN p first or last: the verdict must not depend on it
def test_a_nan_correlation_for_one_p_fails_c1_wherever_it_is(lp_run, which) -> None:
    exp, s, df, run = lp_run
    assert _c1(exp, s, df), "the quick run itself passes C1 (the baseline of this test)"
    p = sorted(float(x) for x in s["ps"])[which]
    bad = df.copy()
    bad.loc[(bad.kind == "md") & (bad.p == p), "corr_own"] = np.nan
    assert not _c1(exp, s, bad)
