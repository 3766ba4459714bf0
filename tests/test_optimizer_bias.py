"""The ``optimizer-bias`` experiment: optimizers × norms, end to end at a small size, and its pieces."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from attsvm.datasets import paper_instance
from attsvm.experiments import EXPERIMENTS, get_experiment, plot_run, reproduce
from attsvm.experiments.optimizer_bias import NORMS, OWN, ROWS, norm_of
from attsvm.svm import AttentionSVM
from attsvm.svm._base import att_svm_constraints

# smaller than --quick: the outputs and the matrix, not the verdicts
SMALL = {"runs": 2, "chunk": 2, "steps": 300, "record_every": 50, "fit_from": 100}
# the spectral SVM's margins hold to this (an interior-point solution)
SPECTRAL_TOL = 1e-7


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("ob") / "run"
    return reproduce("optimizer-bias", quick=True, overrides=SMALL, out=out, progress=False, command=["test"])


def test_registered():
    assert EXPERIMENTS["optimizer-bias"] == "attsvm.experiments.optimizer_bias"
    exp = get_experiment("optimizer_bias")
    assert exp.name == "optimizer-bias" and exp.figure_names == ("optimizer_bias",)


def test_run_writes_report_figure_and_table(run):
    out = run.out
    assert (out / "figures" / "optimizer_bias.png").stat().st_size > 10_000
    assert (out / "figures" / "optimizer_bias.pdf").exists()
    report = (out / "report.md").read_text()
    exp = get_experiment("optimizer-bias")
    for text in exp.claims.values():
        assert text in report
    assert "optimizer_bias.png" in report
    head = "| optimizer ↓ / Att-SVM norm → | Frobenius | ℓ∞ (max) | spectral | nuclear | ℓ3 | peaks on |"
    assert head in report
    table = report[report.index(head) :].split("\n\n")[0].splitlines()
    assert len(table) == 2 + len(ROWS) + 3  # header, rule, the six claimed rows and three reported ones
    assert table[2].startswith("| normalised GD | **")  # (the own norm in bold)


def test_diagonal_cells_are_computed(run):
    res = json.loads((run.out / "results.json").read_text())
    corr = res["summary"]["corr"]
    assert set(corr) == {
        "normalised GD",
        "sign descent",
        "Adam (ε = 0)",
        "Muon",
        "nuclear SD",
        "ℓ3 mirror descent",
        "Adam (torch defaults)",
        "(K, Q) Adam",
        "(K, Q) Muon",
    }
    for row in corr.values():
        assert len(row) == len(NORMS)
        assert all(v is not None and -1.0 <= v <= 1.0 + 1e-12 for v in row.values())
    diag = next(h for h in res["headlines"] if h["name"].startswith("mean final corr with the own norm"))
    assert len(diag["value"]) == len(ROWS) and all(v is not None and v > 0.5 for v in diag["value"].values())
    verdicts = [h for h in res["headlines"] if h["claim"] == "B1" and h["criterion"].startswith("largest at")]
    assert len(verdicts) == len(ROWS) and all(h["passed"] in (True, False) for h in verdicts)
    rates = [h for h in res["headlines"] if h["claim"] == "B3"]
    assert len(rates) == len(ROWS) and all(h["value"][0] is not None for h in rates)
    data = pd.concat([pd.read_parquet(p) for p in (run.out / "trials").glob("*.parquet")])
    for norm in NORMS:
        assert np.isfinite(data[f"corr_{norm}"]).all() and np.isfinite(data[f"margin_{norm}"]).all()
    assert set(OWN) == set(ROWS)


def test_rerun_resumes_and_plot_redraws_from_saved_data(run, monkeypatch):
    exp = get_experiment("optimizer-bias")
    again = reproduce("optimizer-bias", quick=True, overrides=SMALL, out=run.out, progress=False, command=["test"])
    assert again.n_computed == 0

    def boom(*a, **k):
        raise AssertionError("plot must not recompute trials")

    monkeypatch.setattr(type(exp), "run_trial", boom)
    (run.out / "figures" / "optimizer_bias.png").unlink()
    redrawn = plot_run(run.out)
    assert any(p.name == "optimizer_bias.png" and p.exists() for p in redrawn.figures)


def test_spectral_svm_is_feasible_and_has_the_least_spectral_norm():
    prob = paper_instance(6, 8, 10, seed=3)
    tokens = prob.optimal_tokens()
    svm = AttentionSVM("spectral").fit(prob, tokens)  # (what the experiment's spectral column uses)
    W, status = svm.W_, svm.status_
    assert status == "optimal" and W is not None
    margins = att_svm_constraints(prob, tokens).apply(W)[att_svm_constraints(prob, tokens).mask]
    assert margins.min() >= 1.0 - SPECTRAL_TOL
    # every other feasible W has a spectral norm at least as large
    for norm in ("fro", "nuc", "linf"):
        other = AttentionSVM(norm).fit(prob, tokens).W_
        assert norm_of(W, "spec", 3.0) <= norm_of(other, "spec", 3.0) * (1 + 1e-7)


def test_norms_of_a_matrix():
    W = np.array([[3.0, 0.0], [0.0, -4.0]])
    assert norm_of(W, "fro", 3.0) == pytest.approx(5.0)
    assert norm_of(W, "linf", 3.0) == pytest.approx(4.0)
    assert norm_of(W, "spec", 3.0) == pytest.approx(4.0)
    assert norm_of(W, "nuc", 3.0) == pytest.approx(7.0)
    assert norm_of(W, "lp", 3.0) == pytest.approx(91.0 ** (1 / 3))


@pytest.mark.parametrize(
    "overrides, named",
    [
        ({"adam_beta2": 1.0}, "adam_beta2"),
        ({"md_p": 1.0}, "md_p"),
        ({"sign_lr": 0.0}, "sign_lr"),
        ({"adam_eps": -1.0}, "adam_eps"),
    ],
)
def test_bad_settings_name_the_setting(overrides, named):
    with pytest.raises(ValueError, match=named):
        get_experiment("optimizer-bias").settings(quick=True, overrides=overrides)
