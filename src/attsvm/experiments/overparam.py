"""``overparam`` (docs/spec.md §6): as d passes max(T−1, n), the attention SVM of the optimal tokens becomes
feasible, GD converges to the *global* W_mm ever more often, and every non-optimal token becomes a
support vector.

For each d, ``runs`` instances of the published recipe (seed = run) are trained by normalized GD on W
(2000 steps, η = 0.1, W₀ ~ U(−1/√d, 1/√d) as PyTorch's default init) — exactly, in the span of the
data (:func:`attsvm.experiments._common.train_W_reduced`), so d = 200 costs what d = 25 does — and the
convergence type of docs/spec.md §4 is computed
(τ = 0.99): *global* (selected = optimal tokens and corr(W, W_mm) ≥ τ), *local* (another locally
optimal selection and corr(W, W^α̂_mm) ≥ τ), or *not locally optimal*. Independently of training,
the instance's Att-SVM(opt) feasibility and whether every non-optimal token is a support vector of
W_mm(opt) are recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..tokens import margins, support_tokens
from ._base import Experiment, Headline, Trial, chunks, headline
from ._common import fit_svms, optimal_or_none, paper_problems, train_W_reduced
from ._plotting import figure_legend, save, subplots

__all__ = ["Overparam", "EXPERIMENT"]

TYPES = ("global", "local", "not locally optimal")


@dataclass
class Overparam(Experiment):
    name = "overparam"
    cost_hint = 22.0
    title = "Overparameterization: global convergence, feasibility and all-support-vector share vs d"
    claims = {
        "O1": "for d ≥ max(T−1, n), Att-SVM(opt) is feasible for (almost) every instance",
        "O2": "as d grows past max(T−1, n), the share of runs converging to the global W_mm goes to ~100%",
        "O3": "in the overparameterized regime every non-optimal token becomes a support vector of W_mm",
        "O4": "below it, GD often converges locally (to a locally-optimal selection) or not to an SVM at all",
    }
    defaults = {
        "n": 5,
        "T": 5,
        "ds": [2, 3, 4, 5, 6, 8, 10, 20, 50, 100, 200],
        "runs": 200,
        "steps": 2000,
        "lr": 0.1,
        "chunk": 100,
        "tau": 0.99,
    }
    quick = {"n": 3, "T": 3, "ds": [1, 3, 40], "runs": 12, "chunk": 12, "steps": 1500, "tau": 0.95}

    def describe(self) -> str:
        return (
            "n = 5, T = 5 (so max(T−1, n) = 5); W-parametrised normalized GD; convergence type of docs/spec.md §4 "
            "from the final W."
        )

    def trials(self, s: dict[str, Any]) -> list[Trial]:
        return [
            {"key": f"d{d:03d}-s{a:05d}-{b:05d}", "d": d, "start": a, "stop": b}
            for d in s["ds"]
            for a, b in chunks(s["runs"], s["chunk"])
        ]

    def run_trial(self, s: dict[str, Any], trial: Trial) -> pd.DataFrame:
        from ..diagnostics import convergence_type  # (loads torch: not on listing the experiments)

        seeds = list(range(trial["start"], trial["stop"]))
        probs = paper_problems(s["n"], s["T"], trial["d"], seeds)
        W_final = train_W_reduced(probs, seeds, steps=s["steps"], lr=s["lr"])  # exact, cost independent of d
        opts = [optimal_or_none(p) for p in probs]
        solvable = [r for r, o in enumerate(opts) if o is not None]
        toks = [o for o in opts if o is not None]
        fits = dict(zip(solvable, fit_svms([probs[r] for r in solvable], toks, "fro")))
        rows = []
        for r, (seed, p) in enumerate(zip(seeds, probs)):
            opt = opts[r]
            feas, all_sv = False, False
            if opt is not None:
                res = fits[r]
                feas = res.W_ is not None
                if feas:
                    sup = support_tokens(margins(p, opt, res.W_))
                    mask = np.ones_like(sup)
                    mask[np.arange(p.n), opt] = False
                    all_sv = bool(sup[mask].all())
            ct = convergence_type(p, W_final[r], tau=s["tau"], both_norms=False)
            rows.append(
                {
                    "seed": seed,
                    "d": trial["d"],
                    "feasible": feas,
                    "all_support": all_sv,
                    "type": ct.kind,
                    "corr": ct.corr,
                    "selected_is_opt": ct.is_optimal,
                    "locally_optimal": ct.locally_optimal,
                    "svm_status": ct.svm_status,
                    "tie": opt is None,
                }
            )
        return pd.DataFrame(rows)

    def _table(self, df: pd.DataFrame) -> pd.DataFrame:
        g = df.groupby("d")
        tab = pd.DataFrame({t: g["type"].apply(lambda x, t=t: float((x == t).mean())) for t in TYPES})
        tab["feasible"] = g.feasible.mean()
        tab["all_support"] = g.all_support.mean()
        tab["runs"] = g.size()
        return tab.reset_index()

    def aggregate(self, s: dict[str, Any], df: pd.DataFrame) -> tuple[list[Headline], dict[str, Any]]:
        tab = self._table(df)
        thr_d = max(s["T"] - 1, s["n"])
        over = tab[tab.d >= thr_d]
        under = tab[tab.d < thr_d]
        top = tab[tab.d == tab.d.max()].iloc[0]
        feas_over = float(over.feasible.min()) if len(over) else float("nan")
        hl = [
            headline(f"min feasibility share for d ≥ {thr_d}", feas_over, "O1", feas_over >= 0.99, ">= 0.99"),
            headline(
                f"global-convergence share at the largest d = {int(top.d)}",
                float(top["global"]),
                "O2",
                top["global"] >= 0.9,
                ">= 0.9",
            ),
            headline(
                "global share grows from the smallest to the largest d",
                [float(tab["global"].iloc[0]), float(top["global"])],
                "O2",
                top["global"] > tab["global"].iloc[0],
                "increasing",
            ),
            headline(
                f"all-support-vector share at the largest d = {int(top.d)}",
                float(top["all_support"]),
                "O3",
                top["all_support"] >= 0.9,
                ">= 0.9",
            ),
            headline(
                "all-support-vector share grows from d = max(T−1, n) to the largest d",
                [float(over.all_support.iloc[0]) if len(over) else float("nan"), float(top["all_support"])],
                "O3",
                bool(len(over)) and top["all_support"] > over.all_support.iloc[0],
                "increasing",
            ),
            headline(
                f"share of non-global runs for d < {thr_d}",
                float(1 - under["global"].mean()) if len(under) else float("nan"),
                "O4",
                (len(under) == 0) or bool(1 - under["global"].mean() > 0),
                "> 0",
            ),
        ]
        notes = []
        if len(over) and over.all_support.iloc[0] < 0.5:
            notes.append(
                f"at d = {int(over.d.iloc[0])} = max(T−1, n) only {over.all_support.iloc[0]:.0%} of the instances "
                "have every non-optimal token as a support vector: with this data recipe that takes d of the "
                "order of n·T or more, not d just past max(T−1, n)"
            )
        return hl, {"table": tab.to_dict(orient="records"), "notes": notes}

    def plot(self, s: dict[str, Any], df: pd.DataFrame, results: dict[str, Any], outdir: Path) -> list[Path]:
        tab = self._table(df)
        fig, ax = subplots(2)
        a = ax[0, 0]
        for t, c in zip(TYPES, ("C0", "C1", "C3")):
            a.plot(tab.d, 100 * tab[t], "-o", color=c, label=f"GD limit: {t} (a)")
        a.set(title="(a) convergence type of GD", xlabel="d (token dimension)", ylabel="runs (%)", xscale="log")
        a2 = ax[0, 1]
        a2.plot(tab.d, 100 * tab.feasible, "-o", color="C2", label="Att-SVM(opt) feasible (b)")
        a2.plot(tab.d, 100 * tab.all_support, "-s", color="C4", label="every token a support vector (b)")
        a2.set(
            title="(b) SVM of the optimal tokens", xlabel="d (token dimension)", ylabel="instances (%)", xscale="log"
        )
        for x in (a, a2):
            x.axvline(max(s["T"] - 1, s["n"]), color="gray", ls=":", label="d = max(T − 1, n)")
        figure_legend(fig, ncol=3)
        return save(fig, outdir, "overparam")


EXPERIMENT = Overparam()
