"""A diverged (non-finite) run is no evidence for a claim (docs/spec.md §6): every experiment's verdicts
take their means, medians and minima over all runs (a NaN is not skipped), a claim over several groups
holds only if every group meets it, and a checked headline counts the non-finite runs.

Each test builds the trial data ``aggregate`` reads, without running the experiment: good runs that
pass every claim (the control), then the same data with one NaN run, whose claim must FAIL.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from attsvm.experiments import get_experiment
from attsvm.experiments._base import Headline

# correlations of the good runs: far above every experiment's quick threshold (0.9–0.999)
GOOD_CORR = 0.99999
# the correlation with a competing (other-norm / other-p / single-token) SVM: clearly below GOOD_CORR
OTHER_CORR = 0.5
RUNS = 3


def _headlines(name: str, df: pd.DataFrame) -> dict[str, Headline]:
    exp = get_experiment(name)
    hl, _ = exp.aggregate(exp.settings(quick=True), df)
    return {h.name: h for h in hl}


def _all_pass(name: str, df: pd.DataFrame) -> None:
    """The control: no headline of the good data fails (so the tests below can)."""
    failed = [(h.name, h.value) for h in _headlines(name, df).values() if h.passed is False]
    assert not failed, failed


# ---------------------------------------------------------------------------------- lp-convergence

LP_C1 = "ℓp-MD: mean final corr with own ℓp-AttSVM"
LP_C4 = "joint (W, v): mean corr of v with its ℓp max-margin classifier"
NON_FINITE = "runs whose final iterate is non-finite (NaN/inf)"


def _lp_frame(bad: tuple[str, int] | None = None) -> pd.DataFrame:
    """Final-step data of RUNS md and RUNS joint runs per p; ``bad = (kind, index of p)`` diverged."""
    ps = [float(p) for p in get_experiment("lp-convergence").settings(quick=True)["ps"]]
    rows = []
    for kind in ("md", "joint"):
        for j, p in enumerate(ps):
            for r in range(RUNS):
                nan = bad == (kind, j) and r == RUNS - 1
                row: dict[str, Any] = {
                    "kind": kind,
                    "p": p,
                    "run": r,
                    "step": 100,
                    "finite": not nan,
                    "corr_own": np.nan if nan else GOOD_CORR,
                    "bregman_own": np.nan if nan else GOOD_CORR,
                    "status_own": "optimal",
                    "viol_own": 0.0,
                    "gap_own": 0.0,
                }
                for q in ps:
                    row[f"corr_p{q:g}"] = np.nan if nan else GOOD_CORR if q == p else OTHER_CORR
                    if kind == "joint":
                        row[f"vcorr_p{q:g}"] = np.nan if nan else GOOD_CORR if q == p else OTHER_CORR
                rows.append(row)
    return pd.DataFrame(rows)


def test_lp_convergence_good_runs_pass() -> None:
    _all_pass("lp-convergence", _lp_frame())
    assert _headlines("lp-convergence", _lp_frame())[NON_FINITE].value == {"md": 0, "joint": 0}


@pytest.mark.parametrize("which", [0, -1])  # the NaN p first or last: the verdict must not depend on it
@pytest.mark.parametrize(("kind", "claim"), [("md", LP_C1), ("joint", LP_C4)])
def test_lp_convergence_one_nan_run_fails(kind: str, claim: str, which: int) -> None:
    j = range(len(get_experiment("lp-convergence").settings(quick=True)["ps"]))[which]
    hl = _headlines("lp-convergence", _lp_frame((kind, j)))
    assert hl[claim].passed is False
    assert hl[NON_FINITE].value == {"md": int(kind == "md"), "joint": int(kind == "joint")}
    assert hl[NON_FINITE].passed is False


# ---------------------------------------------------------------------------------------- low-rank

LR_L2 = "mean corr(K Qᵀ, rank-m W*) over m ≥ rank(W*_mm)"
RANK_CONVEX = 3  # rank(W*_mm) of every instance below: quick m = 1 is below it, 3 and 6 are not
MARGIN_LOST = 1.5  # ‖W_m‖_* / ‖W*_mm‖_* below the rank


def _low_rank_frame(nan: bool = False) -> pd.DataFrame:
    rows = []
    for m in get_experiment("low-rank").settings(quick=True)["ms"]:
        for seed in range(RUNS):
            bad = nan and m == RANK_CONVEX and seed == 0
            rows.append(
                {
                    "m": m,
                    "seed": seed,
                    "status_convex": "optimal",
                    "status_m": "optimal",
                    "obj_convex": 1.0,
                    "obj_m": 1.0 if m >= RANK_CONVEX else MARGIN_LOST,
                    "reached": m >= RANK_CONVEX,
                    "rank_convex": RANK_CONVEX,
                    "finite": not bad,
                    "rank_gd": -1 if bad else min(m, RANK_CONVEX),
                    "corr_m": np.nan if bad else GOOD_CORR,
                    "corr_convex": np.nan if bad else GOOD_CORR,
                }
            )
    return pd.DataFrame(rows)


def test_low_rank_good_runs_pass() -> None:
    _all_pass("low-rank", _low_rank_frame())


def test_low_rank_one_nan_run_fails() -> None:
    hl = _headlines("low-rank", _low_rank_frame(nan=True))
    assert hl[LR_L2].passed is False  # NaN, not None ("no run in range") and not a pass on the others
    assert hl[NON_FINITE].value == 1 and hl[NON_FINITE].passed is False


# ---------------------------------------------------------------------------------------- reg-path

RP_G1 = "W path: mean corr(W̄_R, W_mm) at the largest R"
RP_NON_FINITE = "runs whose path is non-finite (NaN/inf) at some radius"
GAP_SCALE = 0.5  # 1 − corr = GAP_SCALE / R on the own norm's SVM: a clean power law with a = 1


def _reg_path_frame(nan: bool = False) -> pd.DataFrame:
    s = get_experiment("reg-path").settings(quick=True)
    radii = np.geomspace(s["r_min"], s["r_max"], s["n_radii"])
    own = np.clip(1.0 - GAP_SCALE / radii, 0.0, 1.0)
    frames = []
    for param in ("W", "KQ"):
        for seed in range(RUNS):
            bad = nan and param == "W" and seed == RUNS - 1
            corr = np.full(len(radii), np.nan) if bad else own
            other = np.full(len(radii), np.nan) if bad else np.full(len(radii), OTHER_CORR)
            frames.append(
                pd.DataFrame(
                    {
                        "param": param,
                        "seed": seed,
                        "R": radii,
                        "finite": not bad,
                        "corr_fro": corr if param == "W" else other,
                        "corr_nuc": other if param == "W" else corr,
                        "converged": True,
                        "stationarity": 0.0,
                        "n_iter": 10,
                        "loss": 0.0,
                    }
                )
            )
    return pd.concat(frames, ignore_index=True)


def test_reg_path_good_runs_pass() -> None:
    _all_pass("reg-path", _reg_path_frame())


def test_reg_path_one_nan_run_fails() -> None:
    hl = _headlines("reg-path", _reg_path_frame(nan=True))
    assert hl[RP_G1].passed is False
    assert hl[RP_NON_FINITE].value == {"W": 1, "KQ": 0} and hl[RP_NON_FINITE].passed is False
    (fit,) = [h for h in hl.values() if h.name.startswith("W path: 1 − corr ≈ C·R^(−a)")]
    assert fit.passed is False  # the mean gap at each radius is NaN: nothing is fitted


# ---------------------------------------------------------------------------------- ntp-convergence

NTP_C1 = "mean final corr(W − Π_fin W, W_svm)"
NTP_C2 = "mean final softmax mass on the label's SCC"
NTP_STEPS = (0, 100, 200)  # first, middle, last recorded step
NTP_CORR = (OTHER_CORR, 0.9, GOOD_CORR)  # increasing
NTP_FIN = (1.0, 0.5, 0.01)  # ‖Π_fin W − W_fin‖ decreasing, ‖W_fin‖ = 1
SCC_PER_GRAPH = {2: 3.0, 8: 2.0, 32: 1.0, 256: 1.0}  # quick Ns: SCCs merge as N grows


def _ntp_frame(nan: bool = False) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for run in range(RUNS):
        for k, step in enumerate(NTP_STEPS):
            bad = nan and run == RUNS - 1 and step == NTP_STEPS[-1]
            rows.append(
                {
                    "kind": "gd",
                    "run": run,
                    "step": step,
                    "finite": not bad,
                    "loss": 0.1,
                    "scc_mass": np.nan if bad else NTP_CORR[k],
                    "scc_mass_min": np.nan if bad else NTP_CORR[k],
                    "status": "optimal",
                    "viol": 0.0,
                    "gap": 0.0,
                    "n_eq": 1,
                    "n_ineq": 1,
                    "wfin_norm": 1.0,
                    "wfin_grad": 0.0,
                    "corr_svm": np.nan if bad else NTP_CORR[k],
                    "corr_perp": np.nan if bad else NTP_CORR[k],
                    "fin_distance": np.nan if bad else NTP_FIN[k],
                    "fin_norm": 1.0,
                    "scale": 1.0,
                    "compose_err": np.nan if bad else 0.0,
                }
            )
    for N, scc in SCC_PER_GRAPH.items():
        rows.append({"kind": "scc", "N": N, "run": 0, "scc_per_graph": scc, "cyclic_share": 1.0, "n_graphs": 1})
    return pd.DataFrame(rows)


def test_ntp_convergence_good_runs_pass() -> None:
    _all_pass("ntp-convergence", _ntp_frame())


def test_ntp_convergence_one_nan_run_fails() -> None:
    hl = _headlines("ntp-convergence", _ntp_frame(nan=True))
    assert hl[NTP_C1].passed is False
    assert hl[NTP_C2].passed is False
    assert hl[NON_FINITE].value == 1 and hl[NON_FINITE].passed is False


# --------------------------------------------------------------------------------------- multiclass

MC_M1 = "median final corr(W, W^eq) over clean runs"


def _multiclass_frame(nan: str | None = None) -> pd.DataFrame:
    """RUNS clean runs; ``nan``: "corr" (a clean run's correlation is NaN) or "diverged" (one more run
    whose W became non-finite, classified "non-finite")."""
    rows = [
        {
            "seed": r,
            "status": "clean",
            "finite": True,
            "mixture_match": True,
            "multi": True,
            "corr_eq": np.nan if nan == "corr" and r == RUNS - 1 else GOOD_CORR,
            "corr_single": OTHER_CORR,
            "viol": 0.0,
        }
        for r in range(RUNS)
    ]
    if nan == "diverged":
        rows.append(
            {
                "seed": RUNS,
                "status": "non-finite",
                "finite": False,
                "mixture_match": True,
                "multi": False,
                "corr_eq": np.nan,
                "corr_single": np.nan,
            }
        )
    return pd.DataFrame(rows).assign(kind="run")


def test_multiclass_good_runs_pass() -> None:
    _all_pass("multiclass", _multiclass_frame())


def test_multiclass_a_nan_correlation_fails_m1() -> None:
    assert _headlines("multiclass", _multiclass_frame("corr"))[MC_M1].passed is False


def test_multiclass_a_diverged_run_is_counted_and_fails() -> None:
    hl = _headlines("multiclass", _multiclass_frame("diverged"))
    assert hl[NON_FINITE].value == 1 and hl[NON_FINITE].passed is False
    assert hl[NON_FINITE].claim == "M1"


# ------------------------------------------------------------------------------------------ svm-eq

EQ_E1 = "median final 1 − corr(W, W^eq)"
EQ_NON_FINITE = "runs whose iterate became non-finite (NaN/inf), of the seeds consumed"
EQ_STEPS = (0, 1000, 2000)
EQ_CORR = {"corr_eq": (0.5, 0.99, 0.9999), "corr_full": (0.5, 0.995, 0.99995), "corr_single": (0.5, 0.9, 0.99)}
ZERO_PROB = 1e-9  # the largest unselected softmax probability of an accepted run (≤ thred_low)


def _svm_eq_frame(nan: str | None = None) -> pd.DataFrame:
    """``runs`` accepted seeds per d; ``nan``: "corr" (an accepted run's final corr is NaN) or "diverged"
    (seed 2 of the first d diverged: dropped by the acceptance rule as "finite", inside the seeds consumed)."""
    s = get_experiment("svm-eq").settings(quick=True)
    runs, traj = [], []
    for d in s["ds"]:
        for seed in range(1, s["runs"] + 2):
            diverged = nan == "diverged" and d == s["ds"][0] and seed == 2
            if seed == s["runs"] + 1 and not (nan == "diverged" and d == s["ds"][0]):
                continue  # one seed more only where one is dropped
            if diverged:
                runs.append({"d": d, "seed": seed, "accepted": False, "reason": "finite", "finite": False})
                continue
            runs.append(
                {
                    "d": d,
                    "seed": seed,
                    "accepted": True,
                    "reason": "",
                    "finite": True,
                    "zero_max": ZERO_PROB,
                    "n_selected_mean": 2.0,
                    "multi": True,
                    "statuses": "optimal,optimal,optimal",
                }
            )
            for k, step in enumerate(EQ_STEPS):
                row = {"d": d, "seed": seed, "step": step, **{c: v[k] for c, v in EQ_CORR.items()}}
                if nan == "corr" and d == s["ds"][-1] and seed == 1 and step == EQ_STEPS[-1]:
                    row.update(corr_eq=np.nan, corr_full=np.nan, corr_single=np.nan)
                traj.append(row)
    return pd.concat([pd.DataFrame(runs).assign(kind="run"), pd.DataFrame(traj).assign(kind="traj")])


def test_svm_eq_good_runs_pass() -> None:
    _all_pass("svm-eq", _svm_eq_frame())


def test_svm_eq_a_nan_correlation_fails_e1() -> None:
    hl = _headlines("svm-eq", _svm_eq_frame("corr"))
    assert hl[EQ_E1].passed is False
    assert hl["median ratio 1−corr(single-token) / 1−corr(W^eq)"].passed is False


def test_svm_eq_a_diverged_run_is_counted_and_fails() -> None:
    hl = _headlines("svm-eq", _svm_eq_frame("diverged"))
    assert hl[EQ_NON_FINITE].value == 1 and hl[EQ_NON_FINITE].passed is False


# -------------------------------------------------------------------------------------- svm-eq-mlp

MLP_M1 = "W: median corr(W, W^eq) per activation×depth"
MLP_NON_FINITE = "W: runs whose iterate became non-finite (NaN/inf)"
MLP_CONFIGS = (("relu", 1), ("swiglu", 1))  # W only: the other claims are then untested (None)


def _mlp_frame(nan: str | None = None) -> pd.DataFrame:
    """RUNS accepted W runs per configuration; ``nan``: "corr" (the last configuration's first run has a
    NaN final corr) or "diverged" (one more run there, not accepted, whose iterate is non-finite)."""
    frames = []
    for act, depth in MLP_CONFIGS:
        last_cfg = (act, depth) == MLP_CONFIGS[-1]
        runs = [
            {"seed": r, "accepted": True, "reason": "", "finite": True, "multi": False, "zero_max": ZERO_PROB}
            for r in range(RUNS)
        ]
        if nan == "diverged" and last_cfg:
            runs.append({"seed": RUNS, "accepted": False, "reason": "finite", "finite": False})
        traj = [
            {"seed": r, "step": step, **{c: v[k] for c, v in EQ_CORR.items()}, "corr_dir": EQ_CORR["corr_eq"][k]}
            for r in range(RUNS)
            for k, step in enumerate(EQ_STEPS)
        ]
        if nan == "corr" and last_cfg:
            traj[len(EQ_STEPS) - 1].update(corr_eq=np.nan, corr_dir=np.nan, corr_full=np.nan, corr_single=np.nan)
        cfg = {"param": "W", "activation": act, "depth": depth}
        frames += [pd.DataFrame(runs).assign(kind="run", **cfg), pd.DataFrame(traj).assign(kind="traj", **cfg)]
    return pd.concat(frames, ignore_index=True)


def test_svm_eq_mlp_good_runs_pass() -> None:
    _all_pass("svm-eq-mlp", _mlp_frame())


def test_svm_eq_mlp_a_nan_correlation_fails_m1() -> None:
    assert _headlines("svm-eq-mlp", _mlp_frame("corr"))[MLP_M1].passed is False


def test_svm_eq_mlp_a_diverged_run_is_counted_and_fails() -> None:
    hl = _headlines("svm-eq-mlp", _mlp_frame("diverged"))
    assert hl[MLP_NON_FINITE].value == 1 and hl[MLP_NON_FINITE].passed is False
    assert hl[MLP_NON_FINITE].claim == "M1"


# --------------------------------------------------------------------------------------- hierarchy

HI_D1 = "median share of sequences whose last layer selects the answer (param×layers)"
HI_D2 = "median final corr(W_ℓ, SVM of layer ℓ's selection on its final inputs) (param×layers: layer)"
HI_NON_FINITE = "runs whose final weights are non-finite (NaN/inf) (param×layers)"
ONE_LAYER_ANSWER = 0.5  # one layer cannot solve the two-hop task (D1: < 0.9)
HI_STEPS = (50, 1000)
SETTLE = (100.0, 200.0)  # [selection, direction]: the selection first (D3)


def _hierarchy_frame(nan: str | None = None) -> pd.DataFrame:
    """RUNS runs of each quick configuration; ``nan``: "answer" (the deepest configuration's last run has
    a NaN answer share: last in the dict that D1 reads) or "diverged" (that run's weights are non-finite,
    its final correlations NaN)."""
    rows: list[dict[str, Any]] = []
    configs = get_experiment("hierarchy").settings(quick=True)["configs"]
    for param, L in configs:
        for run in range(RUNS):
            bad = run == RUNS - 1 and [param, L] == configs[-1]
            answer = ONE_LAYER_ANSWER if L == 1 else 1.0
            rows.append(
                {
                    "kind": "run",
                    "run": run,
                    "final_loss": 0.1,
                    "finite": not (bad and nan == "diverged"),
                    "answer_last": np.nan if bad and nan == "answer" else answer,
                }
            )
            for ell in range(1, L + 1):
                rows.append(
                    {
                        "kind": "layer",
                        "run": run,
                        "layer": ell,
                        "bridge": 1.0 if ell == 1 else 0.0,
                        "answer": 1.0 if ell == L else 0.0,
                        "bridge_pos": 1.0,
                        "bridge_neg": 1.0,
                        "top_prob": 1.0,
                        "selection_settled": SETTLE[0],
                        "direction_settled": SETTLE[1],
                    }
                )
                for step in HI_STEPS:
                    final = step == HI_STEPS[-1]
                    rows.append(
                        {
                            "kind": "traj",
                            "run": run,
                            "layer": ell,
                            "step": step,
                            "corr_final": np.nan if bad and nan == "diverged" and final else GOOD_CORR,
                            "corr_rolling": np.nan,
                        }
                    )
            for row in rows:
                row.setdefault("param", param)
                row.setdefault("layers", L)
    return pd.DataFrame(rows)


def test_hierarchy_good_runs_pass() -> None:
    hl = _headlines("hierarchy", _hierarchy_frame())
    assert all(h.passed is not False for h in hl.values())
    assert hl[HI_NON_FINITE].value == {"W×1": 0, "W×2": 0, "W×3": 0}


def test_hierarchy_a_nan_last_in_the_list_fails_d1() -> None:
    # the medians per configuration are [0.5, 1.0, nan]: min() of the deep ones, [1.0, nan], is 1.0 and
    # would pass; all() fails whatever the order
    assert _headlines("hierarchy", _hierarchy_frame("answer"))[HI_D1].passed is False


def test_hierarchy_a_diverged_run_is_counted_and_fails() -> None:
    hl = _headlines("hierarchy", _hierarchy_frame("diverged"))
    assert hl[HI_D2].passed is False
    assert hl[HI_NON_FINITE].value == {"W×1": 0, "W×2": 0, "W×3": 1} and hl[HI_NON_FINITE].passed is False


# ---------------------------------------------------------------------------------- joint-training

JT_SVC = "1 − cos(v_mm, LinearSVC(fit_intercept=False, C=1e9)), worst instance"
LOSS_STEPS = (200, 1000, 5000)  # the quick steps (1000) and loss_steps (5000) among them
# step at which corr(p, p_mm) first reaches the threshold, per (loss, C): −x at once, logistic slower with C
REACH = {("correlation", 1.0): 200, ("correlation", 5.0): 200, ("correlation", 100.0): 200}
REACH |= {("logistic", 1.0): 200, ("logistic", 5.0): 1000, ("logistic", 100.0): 5000}


def _joint_frame(nan: str | None = None) -> pd.DataFrame:
    """The three parts of joint-training, every claim met; ``nan``: "svc" (the non-tight logistic
    instance has no LinearSVC gap) or "loss" (the logistic run at C = 5 ends at NaN)."""
    rows: list[dict[str, Any]] = []
    for loss in ("logistic", "correlation"):
        for r, inst in enumerate(("tight", "non-tight")):
            rows.append(
                {
                    "part": "joint",
                    "loss": loss,
                    "instance": inst,
                    "run": r,
                    "step": 1000,
                    "corr_v": GOOD_CORR if loss == "logistic" else OTHER_CORR,
                    "corr_v_mean": GOOD_CORR,
                    "corr_p": GOOD_CORR,
                    "corr_p_full": GOOD_CORR if inst == "tight" else OTHER_CORR,
                    "tight": inst == "tight",
                    "svc_gap": np.nan if nan == "svc" and loss == "logistic" and inst == "non-tight" else 0.0,
                    "selected_ok": True,
                }
            )
        for r, C in enumerate(sorted({c for _, c in REACH})):
            for step in LOSS_STEPS:
                corr = GOOD_CORR if step >= REACH[(loss, C)] else OTHER_CORR
                if nan == "loss" and loss == "logistic" and C == 5.0 and step == LOSS_STEPS[-1]:
                    corr = np.nan
                rows.append(
                    {"part": "loss", "loss": loss, "C": C, "run": r, "step": step, "corr_p": corr, "corr_p_mm": corr}
                )
        for r in range(RUNS):
            rows.append({"part": "random", "loss": loss, "run": r, "step": 1000, "corr_p": GOOD_CORR})
            rows[-1]["selected_ok"] = True
    return pd.DataFrame(rows)


def test_joint_training_good_runs_pass() -> None:
    _all_pass("joint-training", _joint_frame())


def test_joint_training_a_missing_svc_check_fails_j1() -> None:
    assert _headlines("joint-training", _joint_frame("svc"))[JT_SVC].passed is False


def test_joint_training_a_nan_run_fails_l1() -> None:
    steps = get_experiment("joint-training").settings(quick=True)["loss_steps"]
    hl = _headlines("joint-training", _joint_frame("loss"))
    assert hl[f"v fixed: min over C of corr(p, p_mm) at step {steps} (−x, logistic)"].passed is False


# ---------------------------------------------------------------------------------- rates

RATES_SHARE = "share of runs reaching the target (GD, NGD, Polyak)"
RATES_STEPS = "median steps to 1 − corr < 0.01 (GD, NGD, Polyak)"


def _rates_frame(diverged: int) -> pd.DataFrame:
    """RUNS + 1 runs per rule recorded over steps 0 … 600: GD's 1 − corr stays at 0.5, NGD's falls below the
    target at step 300 and Polyak's at step 100; the last ``diverged`` Polyak runs became non-finite."""
    steps = np.arange(0, 601, 20)
    rows = []
    for rule, hit in (("gd", None), ("ngd", 300), ("polyak", 100)):
        for run in range(RUNS + 1):
            if rule == "polyak" and run >= RUNS + 1 - diverged:
                rows.append(pd.DataFrame({"rule": rule, "run": run, "step": steps, "diverged": True}))
                continue
            gap = np.where(steps >= hit, 1e-3 * (steps + 1.0) ** -1.0, 0.5) if hit else np.full(len(steps), 0.5)
            mass = 0.2 * (steps + 1.0) ** (-1.0 if hit else -0.01)
            rows.append(
                pd.DataFrame({"rule": rule, "run": run, "step": steps, "diverged": False, "gap": gap, "mass": mass})
            )
    return pd.concat(rows, ignore_index=True)


def test_rates_a_diverged_run_did_not_reach_the_target() -> None:
    # the control: every run finite, Polyak reaches the target on all of them
    hl = _headlines("rates", _rates_frame(0))
    assert hl[RATES_SHARE].value == [0.0, 1.0, 1.0]
    # half of Polyak's runs (RUNS + 1 = 4) diverged: they count in the share, not only the finite ones
    hl = _headlines("rates", _rates_frame((RUNS + 1) // 2))
    assert hl[RATES_SHARE].value == [0.0, 1.0, 0.5]
    # three of four diverged: the median run of Polyak never reached the target, so NGD alone beats GD on
    # steps and A1 (both adaptive rules beat GD) stays decided by the shares: Polyak 0.25 > GD 0
    hl = _headlines("rates", _rates_frame(RUNS))
    assert hl[RATES_SHARE].value == [0.0, 1.0, 0.25]
    assert hl[RATES_STEPS].value[2] == np.inf
    assert hl[RATES_STEPS].passed is True
    # all of them diverged: Polyak reaches it on no run, no more than GD, and A1 fails
    hl = _headlines("rates", _rates_frame(RUNS + 1))
    assert hl[RATES_SHARE].value == [0.0, 1.0, 0.0]
    assert hl[RATES_STEPS].passed is False
