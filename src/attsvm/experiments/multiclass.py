"""``multiclass`` (docs/spec.md §5–6): with a linear multiclass head and cross-entropy, GD on W selects a set
of tokens per sequence and its direction follows the SVM-equivalence W^eq of those sets; the sets are
predicted before training by the optimal attention mixture (a convex program over the simplex).

Instances from :func:`attsvm.datasets.random_instance` (unit-norm Gaussian tokens and queries,
Gaussian V (d × C) with ‖V‖_F = 1, uniform labels), seed = run; normalized GD (η = 0.1) on W.
Runs are classified by the svm-eq acceptance rule (ambiguous: some s_it ∈ (1e-6, 1e-3];
finite: no s_it ≤ 1e-6); correlations are reported on the clean runs. A run whose final W or softmax is
non-finite is "non-finite", not one of those: it is counted in a checked headline (a diverged run is no
evidence), and the medians and means over clean runs do not skip a NaN correlation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .._linalg import correlation
from ..datasets import random_instance
from ..svm.equivalence import equivalence_constraints, optimal_mixture
from ._base import Experiment, Headline, Trial, chunks, diverged_headline, headline
from ._common import fit_svm, num, train_batch
from ._plotting import FLOOR, W_EQ, W_MM, band, figure_legend, one_minus_corr, save, subplots

__all__ = ["Multiclass", "EXPERIMENT"]


@dataclass
class Multiclass(Experiment):
    name = "multiclass"
    title = "Multiclass (cross-entropy) head: GD follows W^eq of the selected token sets"
    claims = {
        "M1": "corr(W(k), W^eq) → 1 for the SVM-equivalence of the selected sets O_i",
        "M2": "W^eq predicts the direction better than the single-token Att-SVM of the top tokens",
        "M3": "the optimal attention mixture (convex program over the simplex) predicts O_i before training",
    }
    defaults = {
        "n": 4,
        "T": 6,
        "d": 10,
        "C": 3,
        "runs": 100,
        "steps": 2000,
        "lr": 0.1,
        "chunk": 50,
        "record_every": 100,
        "thred_low": 1e-6,
        "thred_high": 1e-3,
        "mixture_tol": 1e-3,
    }
    quick = {"runs": 12, "chunk": 12, "steps": 2000}

    def validate(self, s: dict[str, Any]) -> None:
        super().validate(s)
        if s["C"] < 2:
            raise ValueError(f"setting 'C' is the number of classes: it must be >= 2, got {s['C']}")

    def trials(self, s: dict[str, Any]) -> list[Trial]:
        return [{"key": f"s{a:05d}-{b:05d}", "start": a, "stop": b} for a, b in chunks(s["runs"], s["chunk"])]

    def run_trial(self, s: dict[str, Any], trial: Trial) -> pd.DataFrame:
        seeds = list(range(trial["start"], trial["stop"]))
        probs = [random_instance(s["n"], s["T"], s["d"], seed=sd, head="multiclass", n_classes=s["C"]) for sd in seeds]
        out = train_batch(probs, param="W", steps=s["steps"], lr=s["lr"], seeds=seeds, record_every=s["record_every"])
        steps = np.asarray(out.history["step"], dtype=np.int64)
        lo, hi = s["thred_low"], s["thred_high"]
        rows, traj = [], []
        for r, (seed, p) in enumerate(zip(seeds, probs)):
            S = out.probs[r]
            sel = S > hi
            mix = optimal_mixture(p).weights
            match = bool(np.array_equal(mix > s["mixture_tol"], sel))
            finite = bool(np.isfinite(out.W[r]).all() and np.isfinite(S).all())
            status = (
                "non-finite"
                if not finite
                else "ambiguous"
                if ((S > lo) & (S <= hi)).any()
                else "finite"
                if not (S <= lo).any()
                else "clean"
            )
            row = {
                "seed": seed,
                "status": status,
                "finite": finite,
                "mixture_match": match,
                "multi": bool((sel.sum(1) > 1).any()),
                "corr_eq": np.nan,
                "corr_single": np.nan,
            }
            if status == "clean":
                eq = fit_svm(equivalence_constraints(p, sel, S)[0], norm="fro")
                single = fit_svm(p, np.argmax(S, axis=1), "fro")
                if eq.W_ is not None:
                    Wh = out.history["W"][r]
                    c = np.asarray(correlation(Wh, eq.W_))
                    cs = np.asarray(correlation(Wh, single.W_)) if single.W_ is not None else np.full(len(c), np.nan)
                    traj.append(pd.DataFrame({"seed": seed, "step": steps, "corr_eq": c, "corr_single": cs}))
                    row.update(corr_eq=float(c[-1]), corr_single=float(cs[-1]), viol=num(eq.max_violation_, np.inf))
                else:
                    row["status"] = "svm infeasible"
            rows.append(row)
        return pd.concat(
            [pd.DataFrame(rows).assign(kind="run")] + [t.assign(kind="traj") for t in traj], ignore_index=True
        )

    def aggregate(self, s: dict[str, Any], df: pd.DataFrame) -> tuple[list[Headline], dict[str, Any]]:
        runs = df[df.kind == "run"]
        clean = runs[runs.status == "clean"]
        # skipna=False: a NaN correlation makes the median / mean NaN, and NaN passes no criterion below
        med = float(clean.corr_eq.median(skipna=False)) if len(clean) else float("nan")
        multi = clean[clean.multi.astype(bool)]  # only there do W^eq and the single-token SVM differ
        e_eq = float((1 - multi.corr_eq).mean(skipna=False)) if len(multi) else float("nan")
        e_single = float((1 - multi.corr_single).mean(skipna=False)) if len(multi) else float("nan")
        counts = runs.status.value_counts().to_dict()
        diverged = int((~runs.finite.astype(bool)).sum())
        hl = [
            headline("median final corr(W, W^eq) over clean runs", med, "M1", med >= 0.99, ">= 0.99"),
            headline(
                "multi-token clean runs: mean final 1 − corr, W^eq vs single-token W_mm",
                {"W^eq": e_eq, "single": e_single, "runs": len(multi)},
                "M2",
                (e_eq < e_single) if len(multi) else None,
                "W^eq smaller (untested without multi-token runs)",
            ),
            headline(
                "share of runs whose selected sets the optimal mixture predicts exactly",
                float(runs.mixture_match.mean()),
                "M3",
                float(runs.mixture_match.mean()) >= 0.5,
                ">= 0.5",
            ),
            headline(
                "share of clean runs with a multi-token selection",
                float(clean.multi.mean()) if len(clean) else 0.0,
                "M1",
                None,
                "reported",
            ),
            headline("runs by status (svm-eq acceptance rule)", counts, "M1", None, "reported"),
            diverged_headline(diverged, "M1"),
        ]
        notes = []
        if diverged:
            notes.append(
                f"W or its softmax became non-finite (NaN/inf) in {diverged} run(s) (lr = {s['lr']:g} overflows "
                "float64?): they are no evidence, so M1 FAILs rather than resting on the finite runs"
            )
        return hl, {"status_counts": counts, "notes": notes}

    def plot(self, s: dict[str, Any], df: pd.DataFrame, results: dict[str, Any], outdir: Path) -> list[Path]:
        tr = df[df.kind == "traj"]
        fig, ax = subplots(1, width=4.2, height=3.2)
        a = ax[0, 0]
        for col, lab, c, kw in (
            ("corr_single", f"corr with the single-token {W_MM}", "C0", {"lw": 2.6}),
            ("corr_eq", f"corr with {W_EQ}", "C1", {"ls": "--"}),  # (dashed: visible where the two coincide)
        ):
            piv = tr.pivot_table(index="seed", columns="step", values=col)
            if len(piv):
                band(a, piv.columns.to_numpy(), np.maximum(1 - piv.to_numpy(), FLOOR), lab, c, **kw)
        a.set(
            yscale="log",
            xlabel="iteration",
            ylabel=one_minus_corr(),
            title=f"multiclass head (C = {s['C']}), clean runs",
        )
        figure_legend(fig, ncol=1)
        return save(fig, outdir, "multiclass")


EXPERIMENT = Multiclass()
