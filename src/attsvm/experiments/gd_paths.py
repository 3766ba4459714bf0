"""``gd-paths`` (docs/spec.md §6): the GD paths of W(k)z_i and of K(k)Q(k)ᵀz_i on the hand-built n = 2, d = 2
instances, against the directions of the Frobenius and nuclear attention SVMs.

Settings of the official ``visualization`` notebooks: n = 2, d = 2, T ∈ {3, 5}; W from 0; K from
0.1·N(0, 1) and Q from 0; normalized GD with step 0.1 for 2000 steps. The hand-built data is
:func:`attsvm.datasets.gd_paths_instance`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import pandas as pd

from .._linalg import correlation
from ..datasets import gd_paths_instance
from ._base import Experiment, Headline, Trial, headline
from ._common import fit_svm, train_batch
from ._plotting import W_MM, W_MM_NUC, figure_legend, save, subplots

__all__ = ["GDPaths", "EXPERIMENT"]


@dataclass
class GDPaths(Experiment):
    name = "gd-paths"
    title = "GD paths of W and (K,Q) follow the Frobenius / nuclear attention-SVM directions"
    claims = {
        "P1": "W-parametrised GD: W(k)/‖W(k)‖ → W_mm/‖W_mm‖ (Frobenius Att-SVM of the selected tokens)",
        "P2": "(K,Q)-parametrised GD: KQᵀ(k)/‖KQᵀ(k)‖ → W*_mm/‖W*_mm‖ (nuclear Att-SVM*)",
        "P3": "the selected tokens are the optimal ones on these instances",
    }
    defaults = {"Ts": [3, 5], "steps": 2000, "lr": 0.1, "record_every": 10, "threshold": 0.99, "init_seed": 0}
    quick = {"steps": 1000, "threshold": 0.98}
    runs_key = None

    def describe(self) -> str:
        return "W(k)z_i and K(k)Q(k)ᵀz_i in the plane, with the rays W_mm z_i and W*_mm z_i."

    def validate(self, s: dict[str, Any]) -> None:
        super().validate(s)
        for T in s["Ts"]:
            if T not in (3, 5):
                raise ValueError(f"setting 'Ts' holds 3 and/or 5 (the two GD-path figures), got {T!r}")

    def trials(self, s: dict[str, Any]) -> list[Trial]:
        return [{"key": f"T{T}-{p}", "T": T, "param": p} for T in s["Ts"] for p in ("W", "KQ")]

    def run_trial(self, s: dict[str, Any], trial: Trial) -> pd.DataFrame:
        import torch

        p = gd_paths_instance(trial["T"])
        d = p.d
        if trial["param"] == "W":
            init: Any = np.zeros((d, d))
        else:
            g = torch.Generator().manual_seed(int(s["init_seed"]))
            K0 = 0.1 * torch.randn((d, d), generator=g, dtype=torch.float64).numpy()
            init = (K0, np.zeros((d, d)))
        out = train_batch(
            [p],
            param=trial["param"],
            steps=s["steps"],
            lr=s["lr"],
            init=init,
            record_every=s["record_every"],
            seeds=[int(s["init_seed"])],
        )
        steps = np.asarray(out.history["step"], dtype=np.int64)
        sel = out.selected[0]
        fro, nuc = fit_svm(p, sel, "fro"), fit_svm(p, sel, "nuc")
        opt = p.optimal_tokens(ties="first")
        Wh = out.history["W"][0]  # (S, d, d)
        paths = np.einsum("sde,ne->snd", Wh, p.queries)  # W(k) z_i
        rows = {
            "step": np.repeat(steps, p.n),
            "seq": np.tile(np.arange(p.n), len(steps)),
            "x": paths[..., 0].ravel(),
            "y": paths[..., 1].ravel(),
        }
        df = pd.DataFrame(rows)
        cf = correlation(Wh, fro.W_) if fro.W_ is not None else np.full(len(Wh), np.nan)
        cn = correlation(Wh, nuc.W_) if nuc.W_ is not None else np.full(len(Wh), np.nan)
        df["corr_fro"] = np.repeat(cf, p.n)
        df["corr_nuc"] = np.repeat(cn, p.n)
        for nm, res in (("fro", fro), ("nuc", nuc)):
            u = res.W_ @ p.queries.T if res.W_ is not None else np.full((d, p.n), np.nan)
            df[f"{nm}_dir_x"] = np.tile(u[0], len(steps))
            df[f"{nm}_dir_y"] = np.tile(u[1], len(steps))
        df["is_opt"] = bool(np.array_equal(sel, opt))
        df["T"], df["param"] = trial["T"], trial["param"]
        return df

    def aggregate(self, s: dict[str, Any], df: pd.DataFrame) -> tuple[list[Headline], dict[str, Any]]:
        last = df[df.step == df.step.max()].drop_duplicates(["T", "param"])
        thr = s["threshold"]
        W = last[last.param == "W"].set_index("T")
        KQ = last[last.param == "KQ"].set_index("T")
        hl = [
            headline(
                "W: final corr(W, W_mm) per T", W.corr_fro.to_dict(), "P1", bool((W.corr_fro >= thr).all()), f">= {thr}"
            ),
            headline(
                "(K,Q): final corr(KQᵀ, W*_mm) per T",
                KQ.corr_nuc.to_dict(),
                "P2",
                bool((KQ.corr_nuc >= thr).all()),
                f">= {thr}",
            ),
            headline("W: final corr with the nuclear W*_mm (other norm)", W.corr_nuc.to_dict(), "P1", None, "reported"),
            headline(
                "(K,Q): final corr with the Frobenius W_mm (other norm)", KQ.corr_fro.to_dict(), "P2", None, "reported"
            ),
            headline(
                "selected tokens are optimal in every run",
                bool(last.is_opt.all()),
                "P3",
                bool(last.is_opt.all()),
                "true",
            ),
        ]
        return hl, {}

    def plot(self, s: dict[str, Any], df: pd.DataFrame, results: dict[str, Any], outdir: Path) -> list[Path]:
        from matplotlib.lines import Line2D

        Ts = sorted(df["T"].unique())
        fig, ax = subplots(2, len(Ts), width=3.3, height=3.3)
        for r, T in enumerate(Ts):
            X = gd_paths_instance(
                cast("Literal[3, 5]", int(T))
            ).X  # the fixed instance's tokens (data, not a recomputation)
            for c, param in enumerate(("W", "KQ")):
                a = ax[r, c]
                g = df[(df["T"] == T) & (df.param == param)]
                nm = "fro" if param == "W" else "nuc"
                for i, gi in g.groupby("seq"):
                    col = f"C{i}"
                    a.scatter(
                        X[i, :, 0],
                        X[i, :, 1],
                        color=col,
                        marker="o^"[i],
                        s=18,
                        alpha=0.8,
                        label=f"tokens of sequence {i + 1}",
                    )
                    v = np.stack([gi.x.to_numpy(), gi.y.to_numpy()], 1)
                    nv = np.linalg.norm(v, axis=1, keepdims=True)
                    u = (v / np.where(nv > 0, nv, 1.0) * 1.6)[nv[:, 0] > 0]  # W(0) = 0 has no direction
                    a.plot(u[:, 0], u[:, 1], "-", color=col, lw=1.2)
                    dv = np.array([gi[f"{nm}_dir_x"].iloc[-1], gi[f"{nm}_dir_y"].iloc[-1]])
                    dv = 1.6 * dv / max(float(np.linalg.norm(dv)), 1e-300)
                    a.annotate("", xy=dv, xytext=(0, 0), arrowprops={"arrowstyle": "->", "color": col, "ls": "--"})
                svm = f"Frobenius SVM {W_MM}" if nm == "fro" else f"nuclear SVM {W_MM_NUC}"
                a.set(
                    title=f"T = {T}: {'$W$' if param == 'W' else '$(K, Q)$'} vs {svm}",
                    xlim=(-2, 2),
                    ylim=(-2, 2),
                    aspect="equal",
                    xlabel="coordinate 1 (dimensionless)",
                    ylabel="coordinate 2 (dimensionless)",
                )
        paths = Line2D([], [], color="0.2", lw=1.2)
        arrow = Line2D([], [], color="0.2", ls="--", lw=1.2)
        figure_legend(
            fig,
            ncol=2,
            extra=(
                (paths, r"GD path of $W(k)z_i$ (left) / $K(k)Q(k)^{\mathsf{T}}z_i$ (right), rescaled to length 1.6"),
                (arrow, f"SVM direction {W_MM}$z_i$ (left) / {W_MM_NUC}$z_i$ (right)"),
            ),
        )
        return save(fig, outdir, "gd_paths")


EXPERIMENT = GDPaths()
