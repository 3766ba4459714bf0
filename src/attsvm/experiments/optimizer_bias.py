"""``optimizer-bias``: each optimizer's attention converges in direction to the Att-SVM of its own norm.

Steepest descent with respect to a norm converges in direction to the max-margin solution in that norm
(Gunasekar et al. 2018, linear models): normalised GD → Frobenius; sign descent, and Adam with ε → 0,
→ the entrywise ℓ∞ norm (Xie & Li 2024; Fan, Schmidt & Thrampoulidis 2025); Muon (the orthogonalised
gradient ``U Vᵀ``) → the spectral norm; steepest descent in the nuclear norm (the rank-one step
``u₁v₁ᵀ``) → the nuclear norm; ℓp mirror descent → ℓp (docs/spec.md §8). Here the six rules train W on
the same runs of the published data recipe (cross-attention, n = 6, T = 8, d = 10, logistic loss,
PyTorch's ``nn.Linear`` initialisation, seed = run; :mod:`attsvm.training.optim`), and each run's final
W is correlated with the Att-SVM of every norm for the tokens that run selected (the argmax of its final
softmax): a matrix of optimizers × norms whose rows should peak on the diagonal. Two more measures of
the same limit: the normalised margin in each norm, ``γ_N(W) = min margin(W)/‖W‖_N`` over its maximum
``1/‖W^N_mm‖_N`` (1 exactly on the set of max-margin directions, which need not be one point for the
ℓ∞ and spectral norms), and the decay of 1 − corr with the own norm's SVM along training
(:func:`attsvm.diagnostics.rate_fit`). Adam with PyTorch's defaults (β₂ = 0.999, ε = 1e-8) and the
factorised (K, Q) training by Adam and Muon are reported beside the matrix: the theory does not settle
what (K, Q) converges to.

A trial trains one chunk of runs by every rule (each rule one batched program) and solves each run's
SVMs once per distinct selection, all five certified by :class:`attsvm.svm.AttentionSVM` (``norm="fro"``,
``"linf"``, ``"spectral"``, ``"nuc"``, ``"lp"``). A run whose iterate becomes non-finite
has NaN correlations, and the means it enters are NaN (they pass no criterion).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from .._linalg import correlation
from ..problem import AttentionProblem
from ..svm import AttentionSVM, att_svm_constraints
from ._base import MIN_FIT_POINTS, Experiment, Headline, Trial, chunks, diverged_headline, headline
from ._common import paper_problems
from ._plotting import FLOOR, band, figure_legend, one_minus_corr, save, subplots

__all__ = ["OptimizerBias", "EXPERIMENT", "NORMS", "ROWS", "OWN"]

# the norms of the SVMs (columns) and the optimizers whose limit the theory names (rows), with their own norm
NORMS = ("fro", "linf", "spec", "nuc", "lp")
ROWS = ("ngd", "sign", "adam", "muon", "nuclear", "md")
OWN = {"ngd": "fro", "sign": "linf", "adam": "linf", "muon": "spec", "nuclear": "nuc", "md": "lp"}
# reported beside them: Adam at PyTorch's defaults, and the factorised (K, Q) training
EXTRA_ROWS = ("adam-torch", "kq-adam", "kq-muon")
KQ_ROWS = ("kq-adam", "kq-muon")
# an SVM's margins hold to this (relative to 1); the spectral SVM comes from an interior-point solver
SVM_VIOLATION_TOL = 1e-6


def _norm_labels(p: float) -> dict[str, str]:
    return {"fro": "Frobenius", "linf": "ℓ∞ (max)", "spec": "spectral", "nuc": "nuclear", "lp": f"ℓ{p:g}"}


def _row_labels(p: float) -> dict[str, str]:
    return {
        "ngd": "normalised GD",
        "sign": "sign descent",
        "adam": "Adam (ε = 0)",
        "muon": "Muon",
        "nuclear": "nuclear SD",
        "md": f"ℓ{p:g} mirror descent",
        "adam-torch": "Adam (torch defaults)",
        "kq-adam": "(K, Q) Adam",
        "kq-muon": "(K, Q) Muon",
    }


def _svm(problem: AttentionProblem, tokens: NDArray[np.int64], norm: str, p: float) -> tuple[Any, str]:
    """``(W_mm or None, status)`` of one norm's Att-SVM at ``tokens``."""
    name = "spectral" if norm == "spec" else norm
    est = AttentionSVM("lp", p=p) if norm == "lp" else AttentionSVM(name)  # type: ignore[arg-type]
    est.fit(problem, tokens)
    return est.W_, str(est.status_)


def norm_of(W: NDArray[np.float64], norm: str, p: float) -> NDArray[np.float64]:
    """``‖W‖`` in ``norm`` over the last two axes (batched)."""
    if norm == "fro":
        return np.linalg.norm(W, axis=(-2, -1))
    if norm == "linf":
        return np.abs(W).max(axis=(-2, -1))
    if norm == "spec":
        return np.linalg.norm(W, ord=2, axis=(-2, -1))
    if norm == "nuc":
        return np.linalg.norm(W, ord="nuc", axis=(-2, -1))
    a = np.abs(W).max(axis=(-2, -1), keepdims=True)
    a = np.where(a > 0, a, 1.0)
    return a[..., 0, 0] * ((np.abs(W) / a) ** p).sum(axis=(-2, -1)) ** (1.0 / p)


def _min_margin(problem: AttentionProblem, tokens: NDArray[np.int64], W: NDArray[np.float64]) -> NDArray[np.float64]:
    """``min_{i, t ≠ α_i} (x_{iα_i} − x_it)ᵀ W z_i`` for each W of a stack (S, d, d)."""
    cs = att_svm_constraints(problem, tokens)
    m = np.einsum("ntd,sde,ne->snt", cs.A, W, cs.Z)
    return np.where(cs.mask[None], m, np.inf).min(axis=(-2, -1))


@dataclass
class OptimizerBias(Experiment):
    name = "optimizer-bias"
    cost_hint = 30.0
    title = "Each optimizer converges to the attention SVM of its own norm"
    claims = {
        "B1": (
            "each optimizer's final W is closest to the Att-SVM of its own norm: normalised GD → Frobenius, sign "
            "descent and Adam (ε = 0) → ℓ∞, Muon → spectral, nuclear steepest descent → nuclear, ℓp mirror "
            "descent → ℓp (each row of the correlation matrix peaks on its diagonal)"
        ),
        "B2": "corr(W(k), own-norm Att-SVM) → 1, and the margin in the own norm → its maximum",
        "B3": "1 − corr(W(k), own-norm Att-SVM) decays along training (a fitted rate)",
        "B4": (
            "(K, Q) trained by Adam and Muon: the theory does not settle the limit of W = KQᵀ; reported: its "
            "correlation with each norm's Att-SVM"
        ),
    }
    defaults = {
        "n": 6,
        "T": 8,
        "d": 10,
        "runs": 20,
        "chunk": 10,
        "steps": 2000,
        "record_every": 50,
        "fit_from": 200,
        "ngd_lr": 0.1,
        "sign_lr": 0.02,
        "adam_lr": 0.02,
        "adam_beta1": 0.9,
        "adam_beta2": 0.9,
        "adam_eps": 0.0,
        "muon_lr": 0.1,
        "nuclear_lr": 0.1,
        "md_lr": 1.0,
        "md_p": 3.0,
        "threshold": 0.95,
    }
    quick = {"runs": 3, "chunk": 3, "steps": 800, "threshold": 0.9}
    figure_names = ("optimizer_bias",)

    def describe(self) -> str:
        return (
            "Six update rules train W on the same runs (published recipe, seed = run); each run's final W is "
            "correlated with the Frobenius, ℓ∞, spectral, nuclear and ℓp Att-SVMs of the tokens it selects. "
            "Rows: normalised GD (ε = 0), sign descent, Adam (ε = 0), Muon (exact polar factor), nuclear "
            "steepest descent (top singular pair), normalised ℓp mirror descent; Adam at PyTorch's defaults "
            "and (K, Q) training by Adam and Muon are reported beside them. Every SVM is certified by "
            "AttentionSVM."
        )

    def validate(self, s: dict[str, Any]) -> None:
        super().validate(s)
        for key in ("ngd_lr", "sign_lr", "adam_lr", "muon_lr", "nuclear_lr", "md_lr"):
            if not s[key] > 0:
                raise ValueError(f"setting {key!r} must be > 0, got {s[key]}")
        for key in ("adam_beta1", "adam_beta2"):
            if not 0 <= s[key] < 1:
                raise ValueError(f"setting {key!r} must be in [0, 1), got {s[key]}")
        if s["adam_eps"] < 0:
            raise ValueError(f"setting 'adam_eps' must be >= 0, got {s['adam_eps']}")
        if not s["md_p"] > 1:
            raise ValueError(f"setting 'md_p' must be > 1 (ψ = ‖W‖_p^p/p strictly convex), got {s['md_p']}")
        recorded = s["steps"] // s["record_every"] - -(-s["fit_from"] // s["record_every"]) + 1
        if recorded < MIN_FIT_POINTS:
            raise ValueError(
                f"settings leave {max(recorded, 0)} recorded steps >= fit_from={s['fit_from']} (steps={s['steps']}, "
                f"record_every={s['record_every']}); the rate fit needs {MIN_FIT_POINTS}"
            )

    def trials(self, s: dict[str, Any]) -> list[Trial]:
        return [{"key": f"s{a:05d}-{b:05d}", "start": a, "stop": b} for a, b in chunks(s["runs"], s["chunk"])]

    def _rules(self, s: dict[str, Any]) -> dict[str, tuple[Literal["W", "KQ"], Any]]:
        """Row name → (param, update rule)."""
        from ..training import optim

        betas = (float(s["adam_beta1"]), float(s["adam_beta2"]))
        adam = optim.adam(s["adam_lr"], betas=betas, eps=s["adam_eps"])
        muon = optim.muon(s["muon_lr"])
        return {
            "ngd": ("W", optim.normalized_gd(s["ngd_lr"], eps=0.0)),
            "sign": ("W", optim.sign_descent(s["sign_lr"])),
            "adam": ("W", adam),
            "muon": ("W", muon),
            "nuclear": ("W", optim.nuclear_sd(s["nuclear_lr"])),
            "md": ("W", optim.mirror_descent(float(s["md_p"]), s["md_lr"], normalized=True, eps=0.0)),
            "adam-torch": ("W", optim.adam(s["adam_lr"])),
            "kq-adam": ("KQ", adam),
            "kq-muon": ("KQ", muon),
        }

    def run_trial(self, s: dict[str, Any], trial: Trial) -> pd.DataFrame:
        from ..training import train

        seeds = list(range(trial["start"], trial["stop"]))
        probs = paper_problems(s["n"], s["T"], s["d"], seeds)
        p = float(s["md_p"])
        svms: dict[tuple[int, tuple[int, ...]], dict[str, tuple[Any, str]]] = {}
        frames = []
        for row, (param, rule) in self._rules(s).items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # (a non-finite run is recorded below)
                out = train(
                    probs,
                    param=param,
                    optimizer=rule,
                    steps=s["steps"],
                    seed=seeds,
                    record_every=s["record_every"],
                    record_W=True,
                    progress=False,
                    threads=1,
                )
            steps = np.asarray(out.history["step"], dtype=np.int64)
            for r, (seed, prob) in enumerate(zip(seeds, probs)):
                Wh = out.history["W"][r]  # (S, d, d)
                finite = np.isfinite(Wh).all(axis=(-2, -1))
                sel = out.selected[r]
                key = (r, tuple(int(x) for x in sel))
                if key not in svms:
                    svms[key] = {norm: _svm(prob, sel, norm, p) for norm in NORMS}
                frame: dict[str, Any] = {"row": row, "param": param, "run": seed, "step": steps, "finite": finite}
                frame["optimal_tokens"] = bool(np.array_equal(sel, prob.optimal_tokens(ties="first")))
                Wf = np.where(finite[:, None, None], Wh, 0.0)
                with np.errstate(invalid="ignore", divide="ignore"):
                    margin = _min_margin(prob, sel, Wf)
                for norm in NORMS:
                    Wm, status = svms[key][norm]
                    frame[f"status_{norm}"] = status
                    if Wm is None:
                        frame[f"corr_{norm}"] = np.nan
                        frame[f"margin_{norm}"] = np.nan
                        frame[f"viol_{norm}"] = np.inf
                        continue
                    frame[f"corr_{norm}"] = correlation(Wh, Wm)
                    with np.errstate(invalid="ignore", divide="ignore"):
                        ratio = margin * norm_of(Wm, norm, p) / norm_of(Wf, norm, p)
                    frame[f"margin_{norm}"] = np.where(finite, ratio, np.nan)
                    frame[f"viol_{norm}"] = float(max(0.0, 1.0 - _min_margin(prob, sel, Wm[None])[0]))
                frames.append(pd.DataFrame(frame))
        return pd.concat(frames, ignore_index=True)

    # ------------------------------------------------------------------------------------------ results
    def _final(self, df: pd.DataFrame) -> pd.DataFrame:
        return df[df["step"] == df["step"].max()]

    def matrix(self, df: pd.DataFrame, what: str = "corr") -> dict[str, dict[str, float]]:
        """Mean final ``what`` ("corr" or "margin") per row and norm; NaN where a run's value is NaN."""
        last = self._final(df)
        out: dict[str, dict[str, float]] = {}
        for row in ROWS + EXTRA_ROWS:
            g = last[last.row == row]
            if len(g):
                out[row] = {norm: float(g[f"{what}_{norm}"].mean(skipna=False)) for norm in NORMS}
        return out

    def _rates(self, s: dict[str, Any], df: pd.DataFrame) -> dict[str, dict[str, Any]]:
        from ..diagnostics import rate_fit

        out: dict[str, dict[str, Any]] = {}
        for row in ROWS:
            d = df[(df.row == row) & df.finite.astype(bool) & (df.step >= s["fit_from"])]
            own = OWN[row]
            med = (1.0 - d[f"corr_{own}"]).groupby(d.step).median()
            y = med.to_numpy(dtype=float)
            keep = np.isfinite(y) & (y > 1e-300)
            info: dict[str, Any] = {"points": int(keep.sum())}
            if keep.sum() >= MIN_FIT_POINTS:
                f = rate_fit(med.index.to_numpy(dtype=float)[keep], y[keep], model="power")
                info.update(model=f.model, rate=f.rate, ci=list(f.ci), r2=f.r2)
            out[row] = info
        return out

    def aggregate(self, s: dict[str, Any], df: pd.DataFrame) -> tuple[list[Headline], dict[str, Any]]:
        p = float(s["md_p"])
        nl, rl = _norm_labels(p), _row_labels(p)
        thr = s["threshold"]
        corr, margin = self.matrix(df, "corr"), self.matrix(df, "margin")
        rates = self._rates(s, df)
        last = self._final(df)

        def labelled(values: dict[str, float]) -> dict[str, float]:
            return {nl[k]: v for k, v in values.items()}

        def peaks_on(row: str) -> str | None:
            vals = corr[row]
            if not all(np.isfinite(v) for v in vals.values()):
                return None
            return max(vals, key=lambda k: vals[k])

        hl: list[Headline] = []
        verdicts: dict[str, str] = {}
        for row in ROWS:
            top = peaks_on(row)
            own = OWN[row]
            ok = top == own and all(corr[row][own] > v for k, v in corr[row].items() if k != own)
            verdicts[row] = "own norm" if ok else ("n/a (non-finite)" if top is None else nl[top])
            hl.append(
                headline(
                    f"{rl[row]}: mean final corr with each norm's Att-SVM",
                    labelled(corr[row]),
                    "B1",
                    ok,
                    f"largest at {nl[own]}",
                    f"→ {nl[own]} Att-SVM",
                )
            )
        hl.append(
            headline(
                f"{rl['adam-torch']}: mean final corr with each norm's Att-SVM",
                labelled(corr["adam-torch"]),
                "B1",
                None,
                "reported (β₂ = 0.999, ε = 1e-8: outside the theory's ε → 0 at this horizon)",
            )
        )
        diag = {rl[row]: corr[row][OWN[row]] for row in ROWS}
        hl.append(
            headline(
                "mean final corr with the own norm's Att-SVM (the diagonal)",
                diag,
                "B2",
                all(v >= thr for v in diag.values()),
                f">= {thr}",
                "→ 1",
            )
        )
        mdiag = {rl[row]: margin[row][OWN[row]] for row in ROWS}
        hl.append(
            headline(
                "mean final margin in the own norm over its maximum, γ_N(W)/γ*_N (the diagonal)",
                mdiag,
                "B2",
                None,
                "reported (→ 1 on the max-margin set)",
            )
        )
        for row in ROWS:
            f = rates[row]
            hl.append(
                headline(
                    f"{rl[row]}: median 1 − corr(own) ≈ C·t^(−a) for t ≥ {s['fit_from']}: a [95% CI], R²",
                    [f.get("rate"), f.get("ci"), f.get("r2")],
                    "B3",
                    bool(f.get("ci") and f["ci"][0] > 0),
                    "a > 0 (CI above 0)",
                )
            )
        for row in KQ_ROWS:
            vals = corr[row]
            finite_vals = {k: v for k, v in vals.items() if np.isfinite(v)}
            closest = nl[max(finite_vals, key=lambda k: finite_vals[k])] if finite_vals else "n/a"
            hl.append(
                headline(
                    f"{rl[row]}: mean final corr of W = KQᵀ with each norm's Att-SVM (closest: {closest})",
                    labelled(vals),
                    "B4",
                    None,
                    "reported (not settled by the theory)",
                )
            )
        nonfinite = {rl[row]: int((~last[last.row == row].finite.astype(bool)).sum()) for row in ROWS + EXTRA_ROWS}
        hl.append(diverged_headline(nonfinite, "B1"))
        statuses = last[[f"status_{n}" for n in NORMS]].to_numpy()
        nonopt = int((statuses != "optimal").sum())
        hl.append(headline("SVMs without an optimal status (all norms, all runs)", nonopt, "B1", nonopt == 0, "0"))
        v = last[[f"viol_{n}" for n in NORMS]].to_numpy(dtype=float)
        viol = float(np.max(v)) if v.size else 0.0
        hl.append(
            headline("max margin violation of the SVMs (1 − min margin)", viol, "B1", viol <= SVM_VIOLATION_TOL,
                     f"<= {SVM_VIOLATION_TOL:g}")
        )  # fmt: skip

        cols = [nl[n] for n in NORMS]
        table = [
            "| optimizer ↓ / Att-SVM norm → | " + " | ".join(cols) + " | peaks on |",
            "|---|" + "---|" * (len(cols) + 1),
        ]
        for row in ROWS + EXTRA_ROWS:
            cells = [
                (f"**{corr[row][n]:.4f}**" if OWN.get(row) == n else f"{corr[row][n]:.4f}")
                if np.isfinite(corr[row][n])
                else "n/a"
                for n in NORMS
            ]
            top = peaks_on(row)
            table.append(f"| {rl[row]} | " + " | ".join(cells) + f" | {nl[top] if top else 'n/a'} |")
        runs = int(last[last.row == "ngd"].run.nunique())
        notes = [
            f"Mean final correlation over {runs} runs (rows: optimizer; columns: the norm of the Att-SVM of the "
            "run's selected tokens; bold: the row's own norm):\n\n" + "\n".join(table) + "\n",
            "Verdicts per row (which norm the row peaks on): "
            + "; ".join(f"{rl[row]}: {verdicts[row]}" for row in ROWS)
            + ".",
            "The margin ratio γ_N(W)/γ*_N = min margin(W)·‖W^N_mm‖_N/‖W‖_N is 1 exactly on the set of "
            "max-margin directions of the norm N; for the ℓ∞ and spectral norms that set need not be one point "
            "(the solvers return one of its members), so a correlation below 1 with a ratio near 1 is convergence "
            "to the set, not to the point.",
            "Steps: normalised GD η = {ngd_lr} (ε = 0); sign descent η = {sign_lr}; Adam η = {adam_lr}, betas "
            "({adam_beta1}, {adam_beta2}), ε = {adam_eps} (β₁ ≤ β₂ as the theory asks; the gradient's scale "
            "decays exponentially along the path, and a short β₂ memory lets v̂ follow it, so the step is close "
            "to sign descent's within the horizon. The 'torch defaults' row is β₂ = 0.999, ε = 1e-8: the step "
            "shrinks once |∇| ≪ ε, and v̂ remembers the larger gradients of the last ~1000 steps); "
            "Muon η = {muon_lr} (exact SVD polar factor, no momentum); nuclear SD η = {nuclear_lr}; ℓ{md_p:g} "
            "mirror descent η = {md_lr}, normalised by the dual norm. (K, Q) rows: the same Adam and Muon rules "
            "on each factor, no penalty.".format(**s),
            "The theory names the limit of steepest descent and of Adam on W; for the factorised (K, Q) model it "
            "does not settle the limit of Adam or Muon, so those rows are reported, not judged.",
        ]
        extra = {
            "runs": runs,
            "corr": {rl[r]: labelled(v) for r, v in corr.items()},
            "margin_ratio": {rl[r]: labelled(v) for r, v in margin.items()},
            "peaks_on": {rl[row]: verdicts[row] for row in ROWS},
            "rates": {rl[r]: v for r, v in rates.items()},
            "notes": notes,
        }
        return hl, extra

    def plot(self, s: dict[str, Any], df: pd.DataFrame, results: dict[str, Any], outdir: Path) -> list[Path]:
        p = float(s["md_p"])
        nl, rl = _norm_labels(p), _row_labels(p)
        rows = [r for r in ROWS + EXTRA_ROWS if (df.row == r).any()]
        fig, ax = subplots(3, width=4.0, height=3.7)
        for j, (what, title, label) in enumerate(
            (
                ("corr", "(a) mean final corr(W, $W^N_{\\mathrm{mm}}$)", "correlation (dimensionless)"),
                ("margin", "(b) mean final margin ratio $\\gamma_N(W)/\\gamma^*_N$", "margin ratio (dimensionless)"),
            )
        ):
            m = self.matrix(df, what)
            M = np.array([[m[r][n] for n in NORMS] for r in rows])
            finite = M[np.isfinite(M)]
            lo = float(np.clip(finite.min(), 0.0, 0.95)) if finite.size else 0.0
            a = ax[0, j]
            im = a.imshow(M, cmap="viridis", vmin=lo, vmax=1.0, aspect="auto")
            for i, r in enumerate(rows):
                for k, n in enumerate(NORMS):
                    v = M[i, k]
                    own = OWN.get(r) == n
                    a.text(
                        k,
                        i,
                        "n/a" if not np.isfinite(v) else f"{v:.3f}",
                        ha="center",
                        va="center",
                        fontsize=7,
                        fontweight="bold" if own else "normal",
                        color="white" if np.isfinite(v) and v < lo + 0.6 * (1.0 - lo) else "black",
                    )
                    if own:
                        a.add_patch(_box(k, i))
            a.axhline(len(ROWS) - 0.5, color="white", lw=2.0)
            a.set_xticks(range(len(NORMS)), [nl[n] for n in NORMS], rotation=30, ha="right")
            a.set_yticks(range(len(rows)), [rl[r] for r in rows])
            a.set(title=title, xlabel="norm N of the Att-SVM", ylabel="optimizer")
            a.spines[:].set_visible(False)
            fig.colorbar(im, ax=a, label=label, shrink=0.85)
        a = ax[0, 2]
        for k, row in enumerate(ROWS):
            d = df[(df.row == row) & df.finite.astype(bool)]
            if not len(d):
                continue
            piv = d.pivot_table(index="run", columns="step", values=f"corr_{OWN[row]}")
            x = piv.columns.to_numpy()
            keep = x > 0
            band(
                a,
                x[keep],
                np.maximum(1.0 - piv.to_numpy()[:, keep], FLOOR),
                f"{rl[row]} vs {nl[OWN[row]]}",
                f"C{k}",
            )
        a.set(
            title="(c) toward the own norm's Att-SVM",
            xlabel="iteration",
            ylabel=one_minus_corr("corr(W(k), own-norm $W_{\\mathrm{mm}}$)"),
            xscale="log",
            yscale="log",
        )
        figure_legend(
            fig,
            ncol=3,
            extra=[(_box_handle(), "boxed/bold: the row's own norm (the claimed limit); below the line: reported")],
        )
        return save(fig, outdir, "optimizer_bias")


def _box(x: float, y: float) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.5, y - 0.5), 1.0, 1.0, fill=False, edgecolor="red", lw=1.6)


def _box_handle() -> Any:
    from matplotlib.patches import Patch

    return Patch(fill=False, edgecolor="red", lw=1.6)


EXPERIMENT = OptimizerBias()
