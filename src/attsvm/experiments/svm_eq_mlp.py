"""``svm-eq-mlp`` (docs/spec.md §5): the svm-eq protocol with MLP heads — GeLU, SiLU, SwiGLU and ReLU,
one and two hidden layers — on W (Frobenius) and on (K, Q) (nuclear).

The source texts say that with MLP heads (GeLU, SwiGLU, "across multi-layer networks") GD's directional
component keeps a correlation above 0.99 with the generalised SVM-equivalent solution W^eq of the
selected token sets. This experiment checks that sentence directly. For each activation × depth ×
parameterisation it draws the svm-eq instances (:func:`attsvm.experiments.svm_eq.relu_instance`'s
published draw, V, X, Y, Z from one seeded torch generator, then the SwiGLU gate and the later hidden
layers from the same generator; output weights 1), trains by normalised GD (2001 steps of 0.1),
applies the published acceptance rule, and compares W(k) (``KQᵀ`` for (K, Q)) with W^eq,
``W_fin + R·W^eq`` and the single-token SVM of the argmax tokens, in the parameterisation's norm
(:func:`attsvm.experiments.svm_eq.equivalence_runs`). ReLU at depth 1 is the svm-eq recipe itself.

Seeds 1..``seeds`` are tried for every configuration (no adaptive top-up), so the number of accepted
runs differs between configurations and is reported. A run whose iterate becomes non-finite is dropped
by the acceptance rule but counted in a checked headline (a diverged run is no evidence), and the
medians over accepted runs do not skip a NaN correlation.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..problem import ACTIVATIONS, AttentionProblem, Head
from ._base import Experiment, Headline, Trial, check_names, headline
from ._plotting import FLOOR, W_EQ, W_EQ_NUC, band, figure_legend, one_minus_corr, save, subplots
from .svm_eq import DROP_REASONS, equivalence_runs, svm_eq_draw

__all__ = ["SVMEqMLP", "EXPERIMENT", "mlp_instance"]

NORMS = {"W": "fro", "KQ": "nuc"}
SMOOTH = ("gelu", "silu", "swiglu")


def mlp_instance(n: int, T: int, d: int, seed: int, activation: str, depth: int) -> AttentionProblem:
    """The svm-eq draw (V, X, Y, Z from one seeded torch generator) with an MLP head: then the SwiGLU
    gate (‖·‖_F = 1) and ``depth − 1`` later layers N(0, 1/d) from the same generator."""
    import torch

    g, V, X, Y, Z = svm_eq_draw(n, T, d, seed)
    gate = None
    if activation == "swiglu":
        G = torch.randn((d, d), generator=g)
        gate = (G / torch.norm(G)).double().numpy()
    hidden = [(torch.randn((d, d), generator=g) / d**0.5).double().numpy() for _ in range(depth - 1)]
    head = Head.mlp(V.double().numpy(), activation=activation, hidden=hidden, gate=gate)
    return AttentionProblem(X.double().numpy(), Y.double().numpy(), head, Z=Z.double().numpy())


@dataclass
class SVMEqMLP(Experiment):
    name = "svm-eq-mlp"
    cost_hint = 44.0
    title = "MLP heads (GeLU, SiLU, SwiGLU, ReLU; 1–2 layers): GD follows the SVM-equivalence W^eq"
    claims = {
        "M1": "W with MLP heads of every activation and depth: GD's direction keeps corr > 0.99 with W^eq "
        "(median over accepted runs)",
        "M2": "(K, Q) with smooth MLP heads (GeLU, SiLU, SwiGLU): corr(KQᵀ, W*^eq) > 0.99 (median)",
        "M3": "(K, Q) with ReLU MLP heads: corr(KQᵀ, W*^eq) > 0.99 (median)",
        "M4": "where the selection has several tokens, W^eq predicts GD far better than the single-token SVM",
        "M5": "with the MLP head trained jointly with W, corr(W, W^eq) > 0.99 (median)",
    }
    expected_disagreements = frozenset({"M3", "M5"})
    defaults = {
        "n": 3,
        "T": 4,
        "d": 6,
        "activations": ["relu", "gelu", "silu", "swiglu"],
        "depths": [1, 2],
        "params": ["W", "KQ"],
        "trained_heads": ["relu", "gelu"],
        "seeds": 200,
        "steps": 2001,
        "lr": 0.1,
        "record_every": 100,
        "thred_low": 1e-6,
        "thred_high": 1e-3,
        "threshold": 0.99,
    }
    quick = {"activations": ["relu", "swiglu"], "seeds": 30}
    runs_key = "seeds"
    figure_names = ("svm_eq_mlp",)

    def describe(self) -> str:
        return (
            "The svm-eq protocol (published acceptance rule; selected set O_i = {t : s_it > 1e-3}) with MLP "
            "heads; W^eq, W_fin and the single-token SVM in the Frobenius norm for W and the nuclear norm "
            "for (K, Q). 'Directional component' is W − W_fin."
        )

    def validate(self, s: dict[str, Any]) -> None:
        super().validate(s)
        check_names("params", s["params"], tuple(NORMS))
        check_names("activations", s["activations"], ACTIVATIONS)
        check_names("trained_heads", s["trained_heads"], ACTIVATIONS)

    def trials(self, s: dict[str, Any]) -> list[Trial]:
        fixed = [
            {"key": f"{param}-{act}-L{depth}", "param": param, "activation": act, "depth": int(depth), "trained": False}
            for param, act, depth in itertools.product(s["params"], s["activations"], s["depths"])
        ]
        trained = [
            {"key": f"W-{act}-L1-trained", "param": "W", "activation": act, "depth": 1, "trained": True}
            for act in s["trained_heads"]
        ]
        return fixed + trained

    def run_trial(self, s: dict[str, Any], trial: Trial) -> pd.DataFrame:
        seeds = list(range(1, int(s["seeds"]) + 1))
        probs = [mlp_instance(s["n"], s["T"], s["d"], sd, trial["activation"], trial["depth"]) for sd in seeds]
        df = equivalence_runs(
            probs, seeds, s, param=trial["param"], norm=NORMS[trial["param"]], train_head=trial["trained"]
        )
        # a jointly trained head is a parameterisation of its own in the tables ("W+head")
        param = trial["param"] + ("+head" if trial["trained"] else "")
        return df.assign(param=param, activation=trial["activation"], depth=trial["depth"])

    # ------------------------------------------------------------------ results
    def _table(self, df: pd.DataFrame) -> pd.DataFrame:
        # skipna=False: a NaN correlation makes its configuration's median NaN, which passes no criterion
        def median(c: pd.Series) -> float:
            return float(c.median(skipna=False))

        def mean(c: pd.Series) -> float:
            return float(c.mean(skipna=False))

        runs = df[df.kind == "run"]
        tr = df[df.kind == "traj"]
        last = tr[tr.step == tr.step.max()]
        keys = ["param", "activation", "depth"]
        acc = runs[runs.accepted.astype(bool)]
        t = pd.DataFrame(
            {
                "seeds": runs.groupby(keys).seed.count(),
                "accepted": acc.groupby(keys).seed.count(),
                "multi_share": acc.groupby(keys).multi.mean(),
                "median_corr_eq": last.groupby(keys).corr_eq.agg(median),
                "median_corr_dir": last.groupby(keys).corr_dir.agg(median),
                "mean_1m_corr_eq": (1 - last.corr_eq).groupby([last[k] for k in keys]).agg(mean),
                "median_1m_corr_single": (1 - last.corr_single).groupby([last[k] for k in keys]).agg(median),
                "share_corr_eq_gt_threshold": last.assign(ok=last.corr_eq > 0.99).groupby(keys).ok.mean(),
                "non_finite": runs.assign(bad=~runs.finite.astype(bool)).groupby(keys).bad.sum(),
            }
        )
        for r in DROP_REASONS:
            t[f"dropped: {r}"] = runs[runs.reason == r].groupby(keys).seed.count()
        return t.fillna({"accepted": 0}).reset_index()

    def aggregate(self, s: dict[str, Any], df: pd.DataFrame) -> tuple[list[Headline], dict[str, Any]]:
        th = float(s["threshold"])
        t = self._table(df)
        have = t[t.accepted > 0]

        def cfg(r: pd.Series) -> str:
            return f"{r.activation}×{int(r.depth)}"

        def medians(sub: pd.DataFrame) -> dict[str, float]:
            return {cfg(r): float(r.median_corr_eq) for _, r in sub.iterrows()}

        def verdict(sub: pd.DataFrame) -> bool | None:
            return None if sub.empty else bool((sub.median_corr_eq > th).all())

        W = have[have.param == "W"]
        KQs = have[(have.param == "KQ") & have.activation.isin(SMOOTH)]
        KQr = have[(have.param == "KQ") & (have.activation == "relu")]
        hl = [
            headline("W: median corr(W, W^eq) per activation×depth", medians(W), "M1", verdict(W), f"all > {th:g}"),
            headline(
                "W: median corr(W − W_fin, W^eq) (directional component)",
                {cfg(r): float(r.median_corr_dir) for _, r in W.iterrows()},
                "M1",
                None,
                "reported",
            ),
            headline(
                "(K,Q) smooth: median corr(KQᵀ, W*^eq) per activation×depth",
                medians(KQs),
                "M2",
                verdict(KQs),
                f"all > {th:g}",
            ),
            headline(
                "(K,Q) ReLU: median corr(KQᵀ, W*^eq) per depth", medians(KQr), "M3", verdict(KQr), f"all > {th:g}"
            ),
        ]
        Th = t[t.param == "W+head"]
        Th_have = Th[Th.accepted > 0]
        hl.append(
            headline(
                "W trained jointly with its head: median corr(W, W^eq) per activation (accepted / tried)",
                {
                    r.activation: [None if r.accepted == 0 else float(r.median_corr_eq), int(r.accepted), int(r.seeds)]
                    for _, r in Th.iterrows()
                },
                "M5",
                None if Th_have.empty else bool((Th_have.median_corr_eq > th).all() and len(Th_have) == len(Th)),
                f"all > {th:g}, each with accepted runs",
            )
        )
        multi = have[(have.multi_share > 0.5) & (have.param != "W+head")]
        for param, judged in (("W", True), ("KQ", False)):
            sub = multi[multi.param == param]
            ratio = {
                cfg(r): float(r.median_1m_corr_single / max(1 - r.median_corr_eq, 1e-300)) for _, r in sub.iterrows()
            }
            hl.append(
                headline(
                    f"{param}: median ratio 1−corr(single-token SVM) / 1−corr(W^eq), configurations with mostly "
                    "multi-token selections",
                    ratio,
                    "M4",
                    (None if not ratio else all(v >= 3 for v in ratio.values())) if judged else None,
                    ">= 3" if judged else "reported (few accepted (K,Q) ReLU runs: a noisy ratio)",
                )
            )
        hl.append(
            headline(
                "share of accepted runs with a multi-token selection (param activation×depth)",
                {f"{r.param} {cfg(r)}": float(r.multi_share) for _, r in have.iterrows()},
                "M4",
                None,
                "reported",
            )
        )
        KQ = t[t.param == "KQ"]
        for label, sub, claim in (
            ("W", t[t.param == "W"], "M1"),
            ("(K,Q) smooth", KQ[KQ.activation.isin(SMOOTH)], "M2"),
            ("(K,Q) ReLU", KQ[KQ.activation == "relu"], "M3"),
            ("W trained jointly with its head", Th, "M5"),
        ):
            if len(sub):
                bad = int(sub.non_finite.sum())
                hl.append(
                    headline(
                        f"{label}: runs whose iterate became non-finite (NaN/inf)",
                        bad,
                        claim,
                        bad == 0,
                        "= 0 (a diverged run is no evidence)",
                    )
                )
        hl.append(
            headline(
                "accepted runs of the seeds tried (param activation×depth)",
                {f"{r.param} {cfg(r)}": [int(r.accepted), int(r.seeds)] for _, r in t.iterrows()},
                "M1",
                None,
                "reported",
            )
        )
        notes = [
            "With the head trained jointly (normalised GD on every head layer too), the published acceptance "
            "rule rejects most runs: the head lowers the loss without saturating the attention, leaving "
            "probabilities in (1e-6, 1e-3] or none below 1e-6; the accepted counts are in the M5 row.",
            "Smooth activations (GeLU, SiLU, SwiGLU) almost always end with one selected token per sequence, "
            "where W^eq is the single-token SVM; ReLU's kink is what makes multi-token selections common.",
            "For (K, Q) with ReLU heads, corr(KQᵀ, W*^eq) stays below 0.99 at 2001 steps; in a 6001-step run "
            "made while building this experiment it was lower still (median 1 − corr 0.04–0.07), and the "
            "Frobenius W^eq was further away (0.08–0.11): the texts' '> 0.99' is not supported there.",
        ]
        return hl, {"table": t.to_dict(orient="records"), "notes": notes}

    def plot(self, s: dict[str, Any], df: pd.DataFrame, results: dict[str, Any], outdir: Path) -> list[Path]:
        tr = df[df.kind == "traj"]
        params = [p for p in [*s["params"], "W+head"] if (tr.param == p).any()]
        fig, ax = subplots(max(1, len(params)), width=3.4)
        titles = {
            "W": f"$W$ vs Frobenius {W_EQ}",
            "KQ": f"$(K, Q)$ vs nuclear {W_EQ_NUC}",
            "W+head": f"$W$, head trained jointly, vs {W_EQ}",
        }
        for j, param in enumerate(params):
            a = ax[0, j]
            for k, (act, depth) in enumerate(
                itertools.product(sorted(set(s["activations"]) | set(s["trained_heads"])), s["depths"])
            ):
                g = tr[(tr.param == param) & (tr.activation == act) & (tr.depth == depth)]
                if g.empty:
                    continue
                piv = g.pivot_table(index="seed", columns="step", values="corr_eq")
                band(
                    a,
                    piv.columns.to_numpy(),
                    np.maximum(1 - piv.to_numpy(), FLOOR),
                    f"{act} head, {depth} layer{'s' if depth > 1 else ''}",
                    f"C{k % 10}",
                )
            a.axhline(
                1 - float(s["threshold"]), color="0.5", ls=":", lw=0.8, label=f"1 − threshold ({s['threshold']:g})"
            )
            a.set(title=titles[param], xlabel="iteration", ylabel=one_minus_corr(), yscale="log")
        figure_legend(fig, ncol=4)
        return save(fig, outdir, "svm_eq_mlp")


EXPERIMENT = SVMEqMLP()
