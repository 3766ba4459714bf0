"""``phase`` (docs/spec.md §6): where the attention SVM becomes feasible, and where every other token becomes a
support vector, over (n, T, d) — a million certified solves.

The theory gives sufficient conditions: for almost every input the Att-SVM of any selection is feasible once
d ≥ max(T − 1, n), and over-parameterisation makes every non-selected token a support vector. This experiment
maps where the two properties actually switch on. Instance ``i`` of a cell (n, T, d) draws its tokens
``X`` (n, T, d) and queries ``Z`` (n, d) i.i.d. standard normal from the seed sequence (seed, n, T, d, i) (so
a cell's instances do not depend on how the cell is chunked), and selects token 0 of every sequence (for
i.i.d. tokens every selection has the same law). Each instance is solved by ``fit_stack`` (the batched
Frobenius route): its answer is ``W_mm`` with its optimality certificate, or a verified Farkas certificate of
infeasibility, whose scale-free residual ``‖Σ λ_k a_k z_kᵀ‖ / Σ λ_k ‖a_k‖‖z_k‖`` is stored. On the first
``nuclear_runs`` instances of the cells with d in ``nuclear_ds`` and at most ``nuclear_max_rows`` constraints, the
nuclear-norm SVM ``W*_mm`` is solved too (the batched interior point) and its rank recorded.

Per cell: the share of feasible instances, the share (among the feasible) whose non-selected tokens are all
support vectors, the rank of ``W_mm`` against its generic value min(n, d), and the rank of ``W*_mm``, each
share with a Wilson 95 % interval. Per (n, T): the 50 % feasibility boundary ``d50`` from a logistic fit in
log d, against the sufficient condition max(T − 1, n) and against the count of generic linear constraints:
``K = n(T − 1)`` generic homogeneous constraints in ``d²`` unknowns are feasible with probability ½ at
``K = 2d²`` (Cover's counting theorem), so ``d = √(n(T − 1)/2)``.

Cells with more than ``max_rows`` constraints are not run (their solves leave the compiled batch, and the
full run would not fit its time budget); the report lists them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from .._linalg import matrix_rank
from ..svm import AttentionSVM
from ..svm.status import INFEASIBLE, OPTIMAL
from ._base import Experiment, Headline, Trial, chunks, headline
from ._plotting import W_MM, W_MM_NUC, figure_legend, panels, save

__all__ = ["Phase", "EXPERIMENT", "instances", "wilson_interval", "fit_boundary", "power_law"]

Z95 = 1.959963984540054  # the 97.5 % normal quantile


def instances(
    seed: int, n: int, T: int, d: int, start: int, stop: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Tokens ``X`` (B, n, T, d) and queries ``Z`` (B, n, d) of instances ``start … stop − 1`` of cell (n, T, d)."""
    B = stop - start
    X = np.empty((B, n, T, d))
    Z = np.empty((B, n, d))
    for b in range(B):
        rng = np.random.default_rng(np.random.SeedSequence([seed, n, T, d, start + b]))
        X[b] = rng.standard_normal((n, T, d))
        Z[b] = rng.standard_normal((n, d))
    return X, Z


def wilson_interval(k: Any, m: Any, z: float = Z95) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The Wilson score interval of a binomial share ``k / m`` (arrays; NaN where m = 0)."""
    k = np.asarray(k, dtype=float)
    m = np.asarray(m, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = k / m
        den = 1 + z * z / m
        mid = (p + z * z / (2 * m)) / den
        half = z * np.sqrt(p * (1 - p) / m + z * z / (4 * m * m)) / den
    return mid - half, mid + half


def fit_boundary(d: Any, k: Any, m: Any) -> float:
    """``d50`` of the logistic fit ``P(feasible) = σ(s (log d − log d50))`` to ``k`` of ``m`` feasible at each
    ``d`` (maximum likelihood); NaN when the data do not cross ½ (all shares on one side)."""
    from scipy.optimize import minimize

    x = np.log(np.asarray(d, dtype=float))
    k = np.asarray(k, dtype=float)
    m = np.asarray(m, dtype=float)
    p = k / m
    if not (p.max() > 0.5 and p.min() < 0.5):
        return float("nan")

    def nll(theta: NDArray[np.float64]) -> float:
        t = theta[1] * (x - theta[0])
        # −log σ(t) = log(1 + e^{−t}), −log(1 − σ(t)) = log(1 + e^{t}), both overflow-free
        return float(np.sum(k * np.logaddexp(0, -t) + (m - k) * np.logaddexp(0, t)))

    x0 = np.interp(0.5, p[::-1], x[::-1]) if p[0] > p[-1] else np.interp(0.5, p, x)
    res = minimize(nll, np.array([x0, 4.0]), method="Nelder-Mead", options={"xatol": 1e-6, "fatol": 1e-9})
    return float(np.exp(res.x[0]))


def power_law(n: Any, t: Any, d: Any) -> list[float] | None:
    """Least squares of ``log d = log c + a log n + b log t`` over the finite ``d``: ``[c, a, b]`` (None when
    fewer than four points)."""
    n, t, d = (np.asarray(v, dtype=float) for v in (n, t, d))
    ok = np.isfinite(d) & (d > 0)
    if ok.sum() < 4:
        return None
    A = np.column_stack([np.ones(ok.sum()), np.log(n[ok]), np.log(t[ok])])
    coef = np.linalg.lstsq(A, np.log(d[ok]), rcond=None)[0]
    return [float(np.exp(coef[0])), float(coef[1]), float(coef[2])]


def _fmt(v: list[float] | None) -> str:
    return "n/a" if v is None else "[" + ", ".join(f"{x:.3g}" for x in v) + "]"


@dataclass
class Phase(Experiment):
    name = "phase"
    cost_hint = 900.0
    dask_default = True
    title = "Phase diagram of Att-SVM feasibility and all-support-vector solutions over (n, T, d)"
    claims = {
        "P1": "for d ≥ max(T−1, n) the Att-SVM is feasible for almost every input",
        "P2": "the sufficient condition d ≥ max(T−1, n) is loose: feasibility switches on below it",
        "P3": "over-parameterisation (d ≥ max(T−1, n)) makes every non-selected token a support vector of W_mm",
        "P4": "every infeasible instance carries a verified Farkas certificate",
    }
    defaults = {
        "ns": [2, 3, 4, 6, 8, 12, 16, 24, 32],
        "Ts": [2, 3, 4, 6, 8, 12, 16, 24, 32],
        "ds": list(range(1, 65)),
        "runs": 200,
        "chunk": 200,
        "seed": 0,
        "max_rows": 400,
        "nuclear_runs": 16,
        "nuclear_ds": [2, 4, 8, 16, 32, 64],
        "nuclear_max_rows": 160,
        "rank_tol": 1e-7,
    }
    quick = {
        "ns": [2, 4, 8],
        "Ts": [2, 4, 8],
        "ds": [1, 2, 3, 4, 6, 8, 12, 16],
        "runs": 24,
        "chunk": 24,
        "nuclear_runs": 2,
        "nuclear_ds": [4, 16],
        "nuclear_max_rows": 32,
    }

    expected_disagreements = frozenset({"P3"})

    def describe(self) -> str:
        return (
            "i.i.d. Gaussian tokens and queries, token 0 selected; every instance solved by fit_stack (certified "
            "W_mm or a verified Farkas certificate), the nuclear SVM on a subsample; shares with Wilson intervals "
            "and a logistic 50 % boundary per (n, T)."
        )

    def validate(self, s: dict[str, Any]) -> None:
        super().validate(s)
        if min(s["Ts"]) < 2:
            raise ValueError(f"setting 'Ts' must hold T >= 2 (attention chooses among tokens), got {s['Ts']}")
        fewest = min(s["ns"]) * (min(s["Ts"]) - 1)
        if fewest > s["max_rows"]:
            raise ValueError(
                f"setting 'max_rows' = {s['max_rows']} leaves no (n, T) pair to run: the smallest has n(T − 1) = "
                f"{fewest} constraints"
            )

    def cells(self, s: dict[str, Any]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The (n, T) pairs run, and those left out for having more than ``max_rows`` constraints."""
        pairs = [(n, T) for n in s["ns"] for T in s["Ts"]]
        return [p for p in pairs if p[0] * (p[1] - 1) <= s["max_rows"]], [
            p for p in pairs if p[0] * (p[1] - 1) > s["max_rows"]
        ]

    def trials(self, s: dict[str, Any]) -> list[Trial]:
        run, _ = self.cells(s)
        return [
            {"key": f"n{n:02d}-T{T:02d}-d{d:03d}-{a:06d}", "n": n, "T": T, "d": d, "start": a, "stop": b}
            for n, T in run
            for d in s["ds"]
            for a, b in chunks(s["runs"], s["chunk"])
        ]

    def run_trial(self, s: dict[str, Any], trial: Trial) -> pd.DataFrame:
        n, T, d, a, b = (trial[k] for k in ("n", "T", "d", "start", "stop"))
        X, Z = instances(s["seed"], n, T, d, a, b)
        tokens = np.zeros((b - a, n), dtype=np.int64)
        st = AttentionSVM().fit_stack(X, Z, tokens)
        status = st.status.astype(str)
        feas = status == OPTIMAL
        others = np.ones((n, T), dtype=bool)
        others[:, 0] = False
        all_sv = feas & st.support[:, others].all(axis=1)
        rank_fro = np.full(b - a, -1, dtype=np.int64)
        if feas.any():
            rank_fro[feas] = matrix_rank(st.W[feas], s["rank_tol"])
        # the Farkas certificate's scale-free residual ‖Σ λ_k a_k z_kᵀ‖ / Σ λ_k ‖a_k‖‖z_k‖ (a_k = x_α − x_t)
        resid = np.full(b - a, np.nan)
        inf = status == INFEASIBLE
        if inf.any():
            lam = st.certificate[inf]  # (m, n, T)
            A = X[inf][:, :, :1, :] - X[inf]  # (m, n, T, d)
            Zi = Z[inf]
            M = np.einsum("bnt,bntd,bne->bde", lam, A, Zi)
            scale = np.einsum("bnt,bnt,bn->b", np.abs(lam), np.linalg.norm(A, axis=-1), np.linalg.norm(Zi, axis=-1))
            resid[inf] = np.sqrt(np.einsum("bde,bde->b", M, M)) / scale
        rank_nuc = np.full(b - a, -1, dtype=np.int64)
        status_nuc = np.full(b - a, "", dtype=object)
        m = min(b, s["nuclear_runs"]) - a
        if m > 0 and d in s["nuclear_ds"] and n * (T - 1) <= s["nuclear_max_rows"]:
            sel = np.flatnonzero(feas[:m])
            if sel.size:
                nuc = AttentionSVM(norm="nuc").fit_stack(X[sel], Z[sel], tokens[sel])
                ok = nuc.status.astype(str) == OPTIMAL
                status_nuc[sel] = nuc.status.astype(str)
                if ok.any():
                    rank_nuc[sel[ok]] = matrix_rank(nuc.W[ok], s["rank_tol"])
        return pd.DataFrame(
            {
                "n": np.full(b - a, n, dtype=np.int16),
                "T": np.full(b - a, T, dtype=np.int16),
                "d": np.full(b - a, d, dtype=np.int16),
                "instance": np.arange(a, b, dtype=np.int32),
                "status": status,
                "feasible": feas,
                "all_support": all_sv,
                "rank_fro": rank_fro.astype(np.int16),
                "norm": np.where(feas, st.objective, np.nan),
                "farkas_residual": resid,
                "rank_nuc": rank_nuc.astype(np.int16),
                "status_nuc": status_nuc.astype(str),
            }
        )

    # ---------------------------------------------------------------- results
    @staticmethod
    def table(df: pd.DataFrame) -> pd.DataFrame:
        """One row per cell (n, T, d): counts, shares and their Wilson intervals, ranks."""
        g = df.groupby(["n", "T", "d"], sort=True)
        tab = pd.DataFrame(
            {
                "runs": g.size(),
                "feasible": g.feasible.sum(),
                "infeasible": g.status.apply(lambda x: int((x == INFEASIBLE).sum())),
                "other": g.status.apply(lambda x: int((~x.isin([OPTIMAL, INFEASIBLE])).sum())),
                "all_support": g.all_support.sum(),
                "rank_fro": g.rank_fro.apply(lambda r: float(r[r >= 0].mean()) if (r >= 0).any() else np.nan),
                "rank_fro_full": g.apply(
                    lambda x: int((x.rank_fro[x.feasible] == min(x.name[0], x.name[2])).sum()), include_groups=False
                ),
                "nuclear_runs": g.rank_nuc.apply(lambda r: int((r >= 0).sum())),
                "rank_nuc": g.rank_nuc.apply(lambda r: float(r[r >= 0].mean()) if (r >= 0).any() else np.nan),
                "nuc_below_fro": g.apply(
                    lambda x: int(((x.rank_nuc >= 0) & (x.rank_nuc < x.rank_fro)).sum()), include_groups=False
                ),
                "max_farkas_residual": g.farkas_residual.max(),
            }
        ).reset_index()
        tab["p_feasible"] = tab.feasible / tab.runs
        tab["p_feasible_lo"], tab["p_feasible_hi"] = wilson_interval(tab.feasible, tab.runs)
        with np.errstate(invalid="ignore", divide="ignore"):
            tab["p_all_support"] = tab.all_support / tab.feasible
        tab["p_all_support_lo"], tab["p_all_support_hi"] = wilson_interval(tab.all_support, tab.feasible)
        with np.errstate(invalid="ignore", divide="ignore"):
            tab["p_rank_full"] = tab.rank_fro_full / tab.feasible
        tab["p_rank_full_lo"], tab["p_rank_full_hi"] = wilson_interval(tab.rank_fro_full, tab.feasible)
        tab["sufficient_d"] = np.maximum(tab["T"] - 1, tab["n"])
        return tab

    @staticmethod
    def boundaries(tab: pd.DataFrame) -> pd.DataFrame:
        """Per (n, T): the fitted 50 % boundary d50, the sufficient max(T − 1, n), the generic-count d's, the
        smallest d from which every cell's feasible share is at least 0.99 (d99), and the fitted 50 % boundary of
        the all-support-vector share among the feasible (d50_support)."""
        rows = []
        for (n, T), c in tab.groupby(["n", "T"], sort=True):
            c = c.sort_values("d")
            below = c.d[c.p_feasible < 0.99]
            later = c.d[c.d > below.max()] if len(below) else c.d
            fe = c[c.feasible > 0]
            K = n * (T - 1)
            rows.append(
                {
                    "n": n,
                    "T": T,
                    "K": K,
                    "sufficient_d": max(T - 1, n),
                    "d50": fit_boundary(c.d, c.feasible, c.runs),
                    "d99": float(later.min()) if len(later) else np.nan,
                    "d50_support": fit_boundary(fe.d, fe.all_support, fe.feasible) if len(fe) > 1 else np.nan,
                    "count_d": math.sqrt(K),
                    "cover_d50": math.sqrt(K / 2),
                }
            )
        out = pd.DataFrame(rows)
        out["sufficient_over_d50"] = out.sufficient_d / out.d50
        return out

    def aggregate(self, s: dict[str, Any], df: pd.DataFrame) -> tuple[list[Headline], dict[str, Any]]:
        tab = self.table(df)
        bnd = self.boundaries(tab)
        _, left_out = self.cells(s)
        over = tab[tab.d >= tab.sufficient_d]
        k_over, m_over = int(over.feasible.sum()), int(over.runs.sum())
        lo_over, _ = wilson_interval(k_over, m_over)
        worst = over.loc[over.p_feasible.idxmin()] if len(over) else None
        fitted = bnd.dropna(subset=["d50"])
        loose = fitted[fitted.d50 < fitted.sufficient_d]
        ratio = fitted.sufficient_over_d50
        top = tab[tab.d == tab.d.max()]
        k_sv, m_sv = int(top.all_support.sum()), int(top.feasible.sum())
        reach = tab.groupby(["n", "T"]).p_all_support.max() >= 0.9
        law_sv = power_law(bnd.n, bnd["T"] - 1, bnd.d50_support)
        n_inf = int((df.status == INFEASIBLE).sum())
        res = df.farkas_residual[df.status == INFEASIBLE]
        n_other = int((~df.status.isin([OPTIMAL, INFEASIBLE])).sum())
        hl = [
            headline("certified solves", len(df), "P4", None),
            headline(
                "share feasible over every cell with d ≥ max(T−1, n) (Wilson 95 % lower bound)",
                [k_over / max(m_over, 1), float(lo_over)],
                "P1",
                m_over > 0 and k_over / m_over >= 0.99,
                ">= 0.99",
            ),
            headline(
                "least feasible cell with d ≥ max(T−1, n): (n, T, d), share",
                None if worst is None else [int(worst.n), int(worst["T"]), int(worst.d), float(worst.p_feasible)],
                "P1",
                None,
            ),
            headline(
                "(n, T) pairs whose fitted 50 % boundary d50 lies below max(T−1, n)",
                [len(loose), len(fitted)],
                "P2",
                len(fitted) > 0 and len(loose) > len(fitted) / 2,
                "most pairs",
            ),
            headline(
                "max(T−1, n) / d50: median and largest over (n, T)",
                [float(ratio.median()), float(ratio.max())] if len(ratio) else None,
                "P2",
                None,
            ),
            headline(
                f"share of feasible instances at the largest d = {int(tab.d.max())} with every other token a "
                "support vector",
                k_sv / max(m_sv, 1),
                "P3",
                m_sv > 0 and k_sv / m_sv >= 0.9,
                ">= 0.9",
            ),
            headline(
                f"(n, T) pairs whose all-support-vector share reaches 0.9 at some d ≤ {int(tab.d.max())}",
                [int(reach.sum()), len(reach)],
                "P3",
                None,
            ),
            headline(
                "fitted law of the all-support-vector 50 % boundary: d50_support ≈ c · n^a · (T−1)^b: [c, a, b]",
                law_sv,
                "P3",
                None,
            ),
            headline(
                "infeasible instances, and the largest scale-free residual of their Farkas certificates",
                [n_inf, float(res.max()) if len(res) else 0.0],
                "P4",
                n_inf == 0 or bool(res.notna().all() and res.max() <= 1e-6),
                "every certificate verified (residual ≤ 1e-6)",
            ),
            headline(
                "instances neither certified optimal nor certified infeasible", n_other, "P4", n_other == 0, "= 0"
            ),
        ]
        notes = []
        if left_out:
            notes.append(
                f"{len(left_out)} (n, T) pairs with more than max_rows = {s['max_rows']} constraints not run: "
                + ", ".join(f"({n}, {T})" for n, T in left_out)
            )
        if len(fitted):
            c = np.corrcoef(np.log(fitted.d50), np.log(fitted.cover_d50))[0, 1] if len(fitted) > 2 else np.nan
            notes.append(
                "d50 against the generic count √(n(T−1)/2): median ratio "
                f"{float((fitted.d50 / fitted.cover_d50).median()):.2f}, "
                f"correlation of the logs {c:.3f}; against max(T−1, n): median ratio "
                f"{float((fitted.d50 / fitted.sufficient_d).median()):.2f}; fitted law d50 ≈ c · n^a · (T−1)^b with "
                "[c, a, b] = " + _fmt(power_law(fitted.n, fitted["T"] - 1, fitted.d50))
            )
        if law_sv is not None:
            notes.append(
                "every other token a support vector takes far more than d ≥ max(T−1, n): the 50 % boundary of that "
                f"share grows as n^{law_sv[1]:.2f} · (T−1)^{law_sv[2]:.2f} (fitted over the pairs that cross it "
                f"within d ≤ {int(tab.d.max())}), so long sequences need d well beyond n(T−1)"
            )
        return hl, {
            "table": tab.to_dict(orient="records"),
            "boundaries": bnd.to_dict(orient="records"),
            "left_out": [list(p) for p in left_out],
            "notes": notes,
        }

    # ---------------------------------------------------------------- figures
    def plot(self, s: dict[str, Any], df: pd.DataFrame, results: dict[str, Any], outdir: Path) -> list[Path]:
        tab = self.table(df)
        bnd = self.boundaries(tab)
        Ts = sorted(tab["T"].unique())
        shown = Ts if len(Ts) <= 5 else [Ts[i] for i in np.unique(np.linspace(0, len(Ts) - 1, 5).round().astype(int))]
        paths = []
        for what, label, name in (
            ("p_feasible", "P(Att-SVM feasible)", "phase_feasible"),
            ("p_all_support", "P(every other token a support vector | feasible)", "phase_support"),
        ):
            paths += self._maps(tab, bnd, shown, what, label, name, outdir, collapse=what == "p_feasible")
        paths += self._ranks(tab, outdir)
        return paths

    def _maps(
        self,
        tab: pd.DataFrame,
        bnd: pd.DataFrame,
        shown: list[int],
        what: str,
        label: str,
        name: str,
        outdir: Path,
        collapse: bool,
    ) -> list[Path]:
        import matplotlib.pyplot as plt

        fig, axes, host = panels(len(shown) + int(collapse), ncols=3)
        mesh = None
        for ax, T in zip(axes, shown):
            c = tab[tab["T"] == T]
            ns, ds = np.sort(c.n.unique()), np.sort(c.d.unique())
            grid = c.pivot(index="d", columns="n", values=what).reindex(index=ds, columns=ns).to_numpy()
            mesh = ax.pcolormesh(_edges(ns), _edges(ds), grid, vmin=0, vmax=1, cmap="viridis", shading="flat")
            ax.set(xscale="log", yscale="log", xlabel="n (sequences)", ylabel="d (token dimension)", title=f"T = {T}")
            ax.plot(ns, np.maximum(T - 1, ns), "--", color="C3", lw=1.6, label="d = max(T − 1, n) (sufficient)")
            b = bnd[bnd["T"] == T].sort_values("n")
            if what == "p_feasible":
                ax.plot(b.n, b.d50, "k-o", ms=3, lw=1.4, label="fitted 50 % boundary")
                ax.plot(b.n, b.cover_d50, ":", color="C1", lw=1.8, label="generic count: n(T − 1) = 2d²")
            else:
                ax.plot(b.n, b.d50_support, "k-o", ms=3, lw=1.4, label="fitted 50 % boundary")
                ax.plot(ns, ns * (T - 1), "-.", color="C1", lw=1.6, label="d = n(T − 1) (constraints)")
            ye = _edges(ds)
            ax.set_ylim(ye[0], ye[-1])  # (the reference curves leave the grid: the grid sets the frame)
            ax.set_xlim(_edges(ns)[0], _edges(ns)[-1])
        if collapse:
            ax = axes[-1]
            for T in shown:
                c = tab[tab["T"] == T]
                ax.scatter(c.d**2 / (c.n * (c["T"] - 1)), c.p_feasible, s=6, label=f"T = {T}")
            ax.axvline(0.5, color="0.5", ls=":", lw=1)
            ax.set(
                xscale="log",
                xlabel="d² / (n(T − 1))  (unknowns per constraint)",
                ylabel="P(feasible)",
                title="all cells against the generic count",
            )
        if mesh is not None:
            cb = fig.colorbar(mesh, ax=axes[: len(shown)], shrink=0.6, aspect=30)
            cb.set_label(label)
        figure_legend(fig, host=host, ncol=2 if host is None else 1, markerscale=2)
        out = save(fig, outdir, name)
        plt.close(fig)
        return out

    def _ranks(self, tab: pd.DataFrame, outdir: Path) -> list[Path]:
        fig, axes, host = panels(2, ncols=2)
        a, b = axes
        feas = tab[tab.feasible > 0]
        pairs = sorted({(int(n), int(T)) for n, T in zip(feas.n, feas["T"])})
        shown = pairs if len(pairs) <= 6 else [pairs[i] for i in np.linspace(0, len(pairs) - 1, 6).round().astype(int)]
        for j, (n, T) in enumerate(shown):
            c = feas[(feas.n == n) & (feas["T"] == T)].sort_values("d")
            a.plot(c.d, c.rank_fro / np.minimum(n, c.d), "-o", ms=3, color=f"C{j}", label=f"(n, T) = ({n}, {T})")
            cn = c[c.nuclear_runs > 0]
            if len(cn):
                b.plot(cn.d, cn.rank_nuc / cn.rank_fro, "-s", ms=3, color=f"C{j}")
        a.set(xscale="log", xlabel="d (token dimension)", ylabel=f"rank({W_MM}) / min(n, d)", title=f"(a) {W_MM}")
        b.set(
            xscale="log",
            xlabel="d (token dimension)",
            ylabel=f"rank({W_MM_NUC}) / rank({W_MM})",
            title=f"(b) {W_MM_NUC} (nuclear) on a subsample",
        )
        figure_legend(fig, host=host, ncol=3)
        return save(fig, outdir, "phase_rank")


def _edges(v: NDArray[Any]) -> NDArray[np.float64]:
    """Cell edges on a log axis around the sorted positive values ``v`` (geometric midpoints)."""
    v = np.asarray(v, dtype=float)
    if v.size == 1:
        return np.array([v[0] / 1.2, v[0] * 1.2])
    mid = np.sqrt(v[1:] * v[:-1])
    return np.concatenate([[v[0] ** 2 / mid[0]], mid, [v[-1] ** 2 / mid[-1]]])


EXPERIMENT = Phase()
