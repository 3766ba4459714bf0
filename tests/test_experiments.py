"""The reproduced experiments (docs/spec.md §6): every one end to end in --quick mode, plus the pieces.

Tolerances are named; each experiment's quick run must write every output and its claims must pass.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from attsvm.experiments import (
    EXPERIMENTS,
    TrialStore,
    apply_overrides,
    get_experiment,
    parse_overrides,
    plot_run,
    reproduce,
)
from test_figure_style import Caught, check_run_figures

# W^eq / W_fin constraints hold to this
CONSTRAINT_TOL = 1e-8


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Caught]]:
    """Every experiment once in --quick mode (shared by the tests below), and the figures each one saved."""
    root = tmp_path_factory.mktemp("quick")
    runs, figures = {}, {}
    with pytest.MonkeyPatch.context() as mp:
        for name in EXPERIMENTS:
            figures[name] = Caught().install(mp)
            runs[name] = reproduce(name, quick=True, out=root / name, progress=False, command=["test"])
    return runs, figures


@pytest.fixture(scope="module")
def quick_runs(quick: tuple[dict[str, Any], dict[str, Caught]]) -> dict[str, Any]:
    return quick[0]


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_quick_run_figures_follow_the_style(quick: tuple[dict[str, Any], dict[str, Caught]], name: str) -> None:
    runs, figures = quick
    check_run_figures(figures[name], runs[name].out)


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_quick_run_writes_everything_and_claims_pass(quick_runs: dict, name: str) -> None:
    run = quick_runs[name]
    out = run.out
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["experiment"] == name and cfg["quick"] is True
    assert set(cfg["versions"]) >= {"attsvm", "numpy", "torch", "cvxpy"}
    res = json.loads((out / "results.json").read_text())
    exp = get_experiment(name)
    assert res["headlines"], "an experiment must report headline numbers"
    for h in res["headlines"]:
        assert h["claim"] in exp.claims, h
    failed = [h for h in res["headlines"] if h["passed"] is False and h["claim"] not in exp.expected_disagreements]
    assert not failed, f"{name}: claims failed in --quick mode: {failed}"
    assert res["passed"] is True or exp.expected_disagreements
    assert exp.expected_disagreements <= set(exp.claims)
    trials = sorted((out / "trials").glob("*.parquet"))
    assert len(trials) == res["n_trials"] >= 1
    pngs = sorted((out / "figures").glob("*.png"))
    assert pngs and all(p.with_suffix(".pdf").exists() for p in pngs)
    report = (out / "report.md").read_text()
    for text in exp.claims.values():
        assert text in report
    for p in pngs:
        assert p.name in report


def test_rerun_resumes_without_recomputing(quick_runs: dict, tmp_path: Path) -> None:
    first = quick_runs["nuclear-identity"]
    again = reproduce("nuclear-identity", quick=True, out=first.out, progress=False, command=["test"])
    assert again.n_computed == 0 and again.n_trials == first.n_trials
    assert again.results["headlines"] == first.results["headlines"]


def test_plot_redraws_from_saved_data_only(quick_runs: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    run = quick_runs["local-convergence"]
    exp = get_experiment("local-convergence")

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("plot must not recompute trials")

    monkeypatch.setattr(type(exp), "run_trial", boom)
    for f in (run.out / "figures").iterdir():
        f.unlink()
    before = (run.out / "results.json").read_text()
    redrawn = plot_run(run.out)
    assert {p.name for p in redrawn.figures} == {"local_convergence.png", "local_convergence.pdf"}
    assert all(p.exists() and p.stat().st_size > 1000 for p in redrawn.figures)
    assert (run.out / "results.json").read_text() == before


def test_plot_on_a_folder_without_config_names_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"config\.json is missing"):
        plot_run(tmp_path)


# ----------------------------------------------------------------------------- settings and errors
def test_set_overrides_are_typed_by_the_default() -> None:
    exp = get_experiment("local-convergence")
    s = exp.settings(quick=True)
    ov = apply_overrides(s, parse_overrides(["runs=3", "lr=0.05", "self_attention=true"]))
    assert ov == {"runs": 3, "lr": 0.05, "self_attention": True}
    assert type(ov["runs"]) is int and type(ov["lr"]) is float
    ds = apply_overrides(get_experiment("svm-eq").settings(), parse_overrides(["ds=4,6"]))
    assert ds == {"ds": [4, 6]}


@pytest.mark.parametrize(
    "pairs, message",
    [
        (["runs"], "--set expects key=value"),
        (["=3"], "non-empty key"),
        (["nope=1"], r"unknown setting\(s\) \['nope'\]"),
        (["runs=abc"], r"--set runs='abc': expected a value of type int"),
        (["self_attention=maybe"], "expected a value of type bool"),
    ],
)
def test_bad_set_overrides_raise_naming_the_setting(pairs: list[str], message: str) -> None:
    s = get_experiment("local-convergence").settings(quick=True)
    with pytest.raises(ValueError, match=message):
        apply_overrides(s, parse_overrides(pairs))


@pytest.mark.parametrize(
    ("name", "pair"),
    [("gd-paths", "threshold=5"), ("overparam", "tau=0"), ("ntp-convergence", "mass_threshold=1.5")],
)
def test_a_threshold_outside_0_1_is_refused(tmp_path: Path, name: str, pair: str) -> None:
    s = get_experiment(name).settings(quick=True)
    key = pair.split("=")[0]
    with pytest.raises(ValueError, match=rf"setting '{key}' is a correlation or probability threshold: it must be in"):
        reproduce(name, quick=True, overrides=apply_overrides(s, parse_overrides([pair])), out=tmp_path, progress=False)
    assert not (tmp_path / "results.json").exists()


def test_unknown_experiment_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown experiment 'nope'; choose one of gd-paths, local-convergence"):
        get_experiment("nope")


def test_bad_runs_and_setting_values_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--runs must be a positive integer, got 0"):
        reproduce("local-convergence", quick=True, runs=0, out=tmp_path / "a", progress=False)
    with pytest.raises(ValueError, match="setting 'steps' must be >= 1, got 0"):
        reproduce("local-convergence", quick=True, overrides={"steps": 0}, out=tmp_path / "b", progress=False)
    with pytest.raises(ValueError, match="--runs: experiment 'gd-paths' has no run count"):
        reproduce("gd-paths", quick=True, runs=3, out=tmp_path / "c", progress=False)
    with pytest.raises(ValueError, match="--workers must be a positive integer"):
        reproduce("nuclear-identity", quick=True, workers=0, out=tmp_path / "d", progress=False)


def test_resuming_into_a_folder_with_other_settings_is_refused(quick_runs: dict) -> None:
    out = quick_runs["svm-rank"].out
    with pytest.raises(ValueError, match=r"holds a run of svm-rank with different settings \(runs\)"):
        reproduce("svm-rank", quick=True, runs=7, out=out, progress=False)
    with pytest.raises(ValueError, match="holds a run of experiment 'svm-rank', not 'gd-paths'"):
        reproduce("gd-paths", quick=True, out=out, progress=False)


def test_trial_store_is_atomic_and_rejects_bad_keys(tmp_path: Path) -> None:
    store = TrialStore(tmp_path)
    (tmp_path / ".k1.tmp999").write_bytes(b"half-written")  # a writer killed mid-write
    store = TrialStore(tmp_path)
    assert list(tmp_path.glob(".*")), "opening a store (e.g. by a reader) deletes nothing"
    store.remove_stale_temp_files()  # the folder's writer cleans it up
    assert not list(tmp_path.glob(".*"))
    store.save("k1", pd.DataFrame({"a": [1, 2]}))
    assert store.done() == {"k1"}
    assert store.load()["a"].tolist() == [1, 2]
    with pytest.raises(ValueError, match="trial key must match"):
        store.save("../evil", pd.DataFrame({"a": [1]}))
    with pytest.raises(TypeError, match="a trial must return a pandas DataFrame, got list"):
        store.save("k2", [1, 2])  # type: ignore[arg-type]


def test_cli_list_and_reproduce(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from attsvm.cli import main

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in EXPERIMENTS:
        assert f"{name}:" in out
    assert main(["list", "svm-eq"]) == 0
    assert "claim E2" in capsys.readouterr().out
    rc = main(
        [
            "reproduce",
            "nuclear-identity",
            "--quick",
            "--no-progress",
            "--out",
            str(tmp_path / "ni"),
            "--set",
            "runs=3",
            "--set",
            "ds=2,3",
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0
    assert f"figure:  {tmp_path / 'ni' / 'figures' / 'nuclear_identity.png'}" in text
    assert f"report:  {tmp_path / 'ni' / 'report.md'}" in text
    assert main(["reproduce", "nope"]) == 2
    assert "unknown experiment 'nope'" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "ni")]) == 0


# ----------------------------------------------------------------------------- the pieces
def test_solve_constraints_keeps_the_certificate_of_w_eq_and_w_fin() -> None:
    """The experiments' solver path is AttentionSVM.fit_constraints; its status and certificate are kept."""
    from attsvm.experiments._common import fit_svm
    from attsvm.experiments.svm_eq import relu_instance
    from attsvm.svm import AttentionSVM
    from attsvm.svm.equivalence import equivalence_constraints

    p = relu_instance(3, 4, 8, seed=5)
    sel = np.array([[1, 1, 0, 0], [0, 1, 0, 0], [1, 0, 1, 1]], dtype=bool)
    s = np.where(sel, np.array([0.5, 0.2, 0.25, 0.05]), 1e-9)
    s /= s.sum(1, keepdims=True)
    cs_eq, cs_fin = equivalence_constraints(p, sel, s)
    weq, wfin = fit_svm(cs_eq, norm="fro"), fit_svm(cs_fin, norm="fro")
    for res, cs in ((weq, cs_eq), (wfin, cs_fin)):
        est = AttentionSVM("fro").fit_constraints(cs)
        assert res.status_ == est.status_ == "optimal"
        assert res.max_violation_ == est.max_violation_ <= CONSTRAINT_TOL
        assert res.duality_gap_ == pytest.approx(est.duality_gap_)
        np.testing.assert_array_equal(res.W_, est.W_)
    assert np.linalg.norm(wfin.W_) > 0
    lg_eq, lg_fin = p.logits(weq.W_), p.logits(wfin.W_)
    for i in range(3):
        inside, outside = np.flatnonzero(sel[i]), np.flatnonzero(~sel[i])
        assert np.ptp(lg_eq[i, inside]) <= CONSTRAINT_TOL  # equal logits inside O_i
        assert lg_eq[i, inside].min() - lg_eq[i, outside].max() >= 1 - CONSTRAINT_TOL  # margin 1 outside
        r = inside[0]
        np.testing.assert_allclose(
            lg_fin[i, r] - lg_fin[i, inside], np.log(s[i, r] / s[i, inside]), atol=CONSTRAINT_TOL
        )


def test_solve_constraints_reports_infeasible() -> None:
    from attsvm.datasets import paper_instance
    from attsvm.experiments._common import fit_svm, num
    from attsvm.problem import AttentionProblem
    from attsvm.svm import feasible

    p = paper_instance(3, 4, 5, seed=0)
    opt = p.optimal_tokens()
    X = p.X.copy()
    t = (opt[0] + 1) % p.T
    X[0, t] = X[0, opt[0]]  # a duplicate of the selected token: a_it = 0, so a_itᵀ W z_i ≥ 1 is impossible
    q = AttentionProblem(X, p.y, p.v, Z=p.Z)
    assert not feasible(q, opt).feasible
    res = fit_svm(q, opt, "fro")
    assert res.status_ == "infeasible" and res.W_ is None
    assert num(res.max_violation_, np.inf) == np.inf  # recorded as inf in the trial data
    with pytest.raises(ValueError, match="norm"):
        fit_svm(q, opt, "l3")


def test_reproduce_all_writes_an_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from attsvm.experiments import reproduce_all

    seen: list[str] = []
    runs = reproduce_all(
        out=tmp_path,
        names=["nuclear-identity", "gd-paths"],
        quick=True,
        runs=2,
        progress=False,
        on_done=lambda r: seen.append(r.name),
    )
    assert seen == ["nuclear-identity", "gd-paths"]
    assert runs[0].results["n_trials"] >= 1 and (tmp_path / "gd-paths" / "report.md").exists()
    index = (tmp_path / "index.md").read_text()
    assert "[nuclear-identity/report.md](nuclear-identity/report.md)" in index
    entries = json.loads((tmp_path / "index.json").read_text())
    assert [e["experiment"] for e in entries] == ["nuclear-identity", "gd-paths"]
    cfg = json.loads((tmp_path / "nuclear-identity" / "config.json").read_text())
    assert cfg["settings"]["runs"] == 2  # --runs reaches experiments that have a run count


def test_reduced_training_is_the_full_gd_path() -> None:
    """overparam trains in the span of the data; it must be the same W as full d × d training."""
    from attsvm.experiments._common import paper_problems, train_batch, train_W_reduced

    d, seeds = 30, [0, 1, 2]
    probs = paper_problems(3, 3, d, seeds)
    W_red = train_W_reduced(probs, seeds, steps=200, lr=0.1)
    W0 = np.stack([np.random.default_rng(s).uniform(-1, 1, (d, d)) / np.sqrt(d) for s in seeds])
    full = train_batch(probs, param="W", steps=200, lr=0.1, init=W0, seeds=seeds, record_every=200)
    np.testing.assert_allclose(W_red, full.W, atol=1e-10 * np.abs(full.W).max())


def test_svm_eq_follow_up_trials_continue_the_seed_order() -> None:
    """Follow-up trials start right after the last seed tried, in blocks of at most `chunk` seeds, and
    stop once `runs` seeds are accepted: the acceptance rule consumes seeds 1, 2, … in order."""
    exp = get_experiment("svm-eq")
    s = exp.settings(
        overrides=apply_overrides(exp.settings(), parse_overrides(["ds=4,6", "runs=10", "first=100", "chunk=40"]))
    )
    first = exp.trials(s)
    blocks = [(1, 34), (34, 68), (68, 101)]  # `first` = 100 seeds in balanced blocks of <= `chunk` = 40
    assert [(t["d"], t["start"], t["stop"]) for t in first] == [(d, a, b) for d in (4, 6) for a, b in blocks]
    seeds = np.arange(1, 101)
    data = pd.concat(
        [
            pd.DataFrame({"kind": "run", "d": 4, "seed": seeds, "accepted": seeds % 10 == 0}),
            pd.DataFrame({"kind": "run", "d": 6, "seed": seeds, "accepted": seeds % 20 == 0}),
        ]
    )
    more = exp.more_trials(s, data)
    assert {t["d"] for t in more} == {6}  # d = 4 has its 10 accepted seeds
    assert more[0]["start"] == 101 and all(a["stop"] == b["start"] for a, b in itertools.pairwise(more))
    assert all(t["stop"] - t["start"] <= 40 for t in more)
    # 5 missing at rate 5/100 (× overshoot), but never more than the 100 seeds tried so far in one round
    assert more[-1]["stop"] - 101 == min(math.ceil(5 / (5 / 100) * s["overshoot"]), 100)
    data6 = data[data.d == 6].assign(accepted=seeds % 50 == 0)  # 2 of 100: the rate is uncertain
    assert exp.more_trials(s, data6)[-1]["stop"] == 201
    with pytest.raises(ValueError, match="overshoot"):
        exp.validate({**s, "overshoot": 0.5})


def test_reproduce_all_overlaps_experiments_on_workers(tmp_path: Path, quick_runs: dict) -> None:
    """With worker processes two experiments run at once; every one still completes, the index keeps
    the canonical order and the headline numbers equal the in-process runs'."""
    import threading

    from attsvm.experiments import _runner, reproduce_all

    names = ["nuclear-identity", "svm-rank", "multiclass"]
    seen: list[str] = []
    active, most = [0], [0]
    lock = threading.Lock()
    real = _runner.reproduce

    def counting(*a, **k):  # how many experiments are inside reproduce() at once
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        try:
            return real(*a, **k)
        finally:
            with lock:
                active[0] -= 1

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_runner, "reproduce", counting)
        par = reproduce_all(
            out=tmp_path / "par",
            names=names,
            quick=True,
            workers=2,
            progress=False,
            on_done=lambda r: seen.append(r.name),
        )
    assert most[0] == 2  # two experiments ran at once
    ser = [quick_runs[name] for name in names]  # (each run in this process by the shared fixture)
    assert sorted(seen) == sorted(names) and [r.name for r in par] == names
    entries = json.loads((tmp_path / "par" / "index.json").read_text())
    assert [e["experiment"] for e in entries] == names
    for a, b in zip(par, ser):
        assert [h["value"] for h in a.results["headlines"]] == [h["value"] for h in b.results["headlines"]]
        assert (a.out / "figures").is_dir() and any((a.out / "figures").iterdir())


def test_reproduce_all_runs_a_repeated_name_once(tmp_path: Path) -> None:
    from attsvm.experiments import reproduce_all

    runs = reproduce_all(out=tmp_path, names=["nuclear-identity", "nuclear-identity"], quick=True, progress=False)
    assert [r.name for r in runs] == ["nuclear-identity"]


def test_the_svm_experiments_load_no_torch_until_a_trial_draws_data():
    """In a fresh interpreter: the main process of ``attsvm reproduce svm-rank`` (registry, runner, the
    experiment, the datasets and the solvers) loads no torch: only the trials, which draw the published
    data with torch's generator, do (then once per worker). Nor does ``attsvm list``, which imports every
    experiment's module."""
    import os
    import subprocess
    import sys
    import textwrap

    import attsvm

    code = textwrap.dedent("""
        import sys
        import attsvm.cli, attsvm.datasets, attsvm.svm
        from attsvm.experiments import get_experiment
        from attsvm.experiments import _runner
        e = get_experiment("svm-rank")
        e.trials(dict(e.defaults))
        assert "torch" not in sys.modules, "loaded torch"
        import contextlib, io
        with contextlib.redirect_stdout(io.StringIO()) as listed:
            assert attsvm.cli.main(["list"]) == 0  # (every experiment's module)
        assert "lp-convergence" in listed.getvalue()
        assert "torch" not in sys.modules, "attsvm list loaded torch"
        attsvm.datasets.paper_instance(3, 4, 5, seed=0)
        assert "torch" in sys.modules
        print("ok")
    """)
    src = os.path.dirname(os.path.dirname(attsvm.__file__))
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
