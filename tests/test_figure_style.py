"""One figure style for every figure (attsvm._style): a 200 dpi PNG with a PDF beside it, every panel labelled,
one legend per figure, one notation for W_mm, constrained layout, plain ticks on sub-decade log axes and log
ranges set by the data above numerical floors.

The figures are caught as matplotlib saves them: from ``attsvm plot`` redrawing a run from its saved data and from
the ``analyze`` / ``claims`` plotting code on synthetic results here, from every reproduction's quick run in
test_experiments.py (its shared quick runs catch their figures with :class:`Caught`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg", force=True)

from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.text import Text
from PIL import Image

from attsvm._folders import save_figure
from attsvm._style import PNG_DPI, above_floor, style
from attsvm.experiments import plot_run, reproduce

PLAIN_WMM = re.compile(r"W\*?_mm|W_\{mm\}|W\^\*_\{mm\}")  # W_mm typeset any other way than $W_{\mathrm{mm}}$


_SAVEFIG = Figure.savefig


class Caught:
    """The figures saved while it is installed: (figure, format, dpi) per savefig call."""

    def __init__(self) -> None:
        self.saves: list[tuple[Figure, str, float]] = []

    def figures(self) -> list[Figure]:
        return list({id(f): f for f, _, _ in self.saves}.values())

    def install(self, monkeypatch: pytest.MonkeyPatch) -> Caught:
        """Catch every figure saved from now on (until ``monkeypatch`` undoes it)."""

        def spy(fig: Figure, fname: Any, *args: Any, **kwargs: Any) -> Any:
            self.saves.append((fig, str(kwargs.get("format")), float(kwargs.get("dpi") or 0)))
            return _SAVEFIG(fig, fname, *args, **kwargs)

        monkeypatch.setattr(Figure, "savefig", spy)
        return self


@pytest.fixture
def caught(monkeypatch: pytest.MonkeyPatch) -> Caught:
    return Caught().install(monkeypatch)


def _is_colorbar(ax: Any) -> bool:
    return getattr(ax, "_colorbar", None) is not None


def style_problems(fig: Figure) -> list[str]:
    """What breaks the style in ``fig`` (empty: none)."""
    problems = []
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison:
            continue  # (a spare grid cell holding the legend)
        name = ax.get_title() or "untitled panel"
        if _is_colorbar(ax):
            if not (ax.get_ylabel() or ax.get_xlabel()):
                problems.append(f"{name}: colorbar without a label")
            continue
        if not ax.get_xlabel().strip():
            problems.append(f"{name}: no x label")
        if not ax.get_ylabel().strip():
            problems.append(f"{name}: no y label")
    legends = len(fig.legends) + sum(ax.get_legend() is not None for ax in fig.axes)
    if legends > 1:
        problems.append(f"{legends} legends (one per figure)")
    for t in fig.findobj(Text):
        if PLAIN_WMM.search(t.get_text()):
            problems.append(f"W_mm not typeset as $W_{{\\mathrm{{mm}}}}$: {t.get_text()!r}")
    return problems


def check_files(png: Path) -> None:
    """A PNG at PNG_DPI or more, and a PDF beside it."""
    assert png.is_file(), png
    with Image.open(png) as im:
        dpi = im.info.get("dpi", (0, 0))
    assert min(dpi) >= PNG_DPI - 0.5, f"{png.name}: {dpi} dpi"
    pdf = png.with_suffix(".pdf")
    assert pdf.is_file() and pdf.read_bytes().startswith(b"%PDF"), f"no PDF beside {png.name}"


def check_run_figures(caught: Caught, out: Path) -> None:
    figs = caught.figures()
    assert figs, "no figure was saved"
    pngs = sorted((out / "figures").glob("*.png"))
    assert pngs
    for png in pngs:
        check_files(png)
    assert all(dpi >= PNG_DPI for _, fmt, dpi in caught.saves if fmt == "png")
    for fig in figs:
        assert isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine), "figures use constrained layout"
        assert not style_problems(fig), style_problems(fig)


def test_redrawn_figures_follow_the_style(tmp_path: Path, caught: Caught) -> None:
    """`attsvm plot` redraws from the saved data through the same style."""
    run = reproduce("local-convergence", quick=True, out=tmp_path / "lc", progress=False, command=["test"])
    for f in (run.out / "figures").iterdir():
        f.unlink()
    caught.saves.clear()
    redrawn = plot_run(run.out)
    assert {p.suffix for p in redrawn.figures} == {".png", ".pdf"}
    check_run_figures(caught, run.out)
    (legend,) = caught.figures()[0].legends
    assert any("10–90 %" in t.get_text() for t in legend.get_texts()), "the shaded band is explained in the legend"


def test_save_figure_writes_a_200_dpi_png_and_a_pdf_with_plain_ticks_on_short_log_axes(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    with style():
        fig, (a, b, c, d) = plt.subplots(1, 4)
    a.plot([1, 2, 3], [120.0, 150.0, 180.0])  # perplexities: less than a decade
    b.plot([1, 2, 3], [2.0, 10.0, 32.0])  # counts over a decade and a bit
    c.plot([1, 2, 3], [1e-6, 1e-3, 1.0])  # six decades: matplotlib's own log ticks stay
    d.plot([1, 2, 3], [196.0, 196.1, 196.27])  # a narrow range: as many decimals as the ticks need
    for ax in (a, b, c, d):
        ax.set_yscale("log")
    path = save_figure(fig, tmp_path / "f.png", dpi=100)  # (a lower dpi is raised to the floor)
    check_files(path)

    def shown(ax: Any) -> list[str]:
        lo, hi = ax.get_ylim()
        return [t.get_text() for t in ax.get_yticklabels() if t.get_text() and lo <= t.get_position()[1] <= hi]

    for ax, data in ((a, (120, 180)), (b, (2, 32))):
        labels = shown(ax)
        assert labels and all(re.fullmatch(r"[0-9.]+", s) for s in labels), labels  # "150", not "1.5×10²"
        assert sum(data[0] <= float(s) <= data[1] for s in labels) >= 2, labels
    assert any("10^" in s for s in shown(c))
    narrow = shown(d)
    assert len(narrow) >= 2 and len(set(narrow)) == len(narrow), narrow  # no "196.1" twice
    plt.close(fig)


def test_save_figure_lays_out_once_for_both_files_and_keeps_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.pyplot as plt

    runs = []
    execute = ConstrainedLayoutEngine.execute
    monkeypatch.setattr(ConstrainedLayoutEngine, "execute", lambda self, fig: runs.append(1) or execute(self, fig))
    with style():
        fig, axes = plt.subplots(1, 2, layout="constrained")
    for ax in axes:
        ax.plot([1, 2, 3], [3.0, 1.0, 2.0])
        ax.set_title("a title", loc="left")
    engine = fig.get_layout_engine()
    save_figure(fig, tmp_path / "f.png")
    assert len(runs) == 1  # (matplotlib's bbox_inches="tight" alone: once per file)
    assert fig.get_layout_engine() is engine
    assert (tmp_path / "f.png").stat().st_size > 0 and (tmp_path / "f.pdf").stat().st_size > 0
    plt.close(fig)


def test_save_figure_can_leave_out_the_pdf(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = plt.figure()
    save_figure(fig, tmp_path / "g.png", pdf=False)
    plt.close(fig)
    assert (tmp_path / "g.png").is_file() and not (tmp_path / "g.pdf").exists()


def test_above_floor_drops_round_off_so_the_log_range_is_the_data() -> None:
    s = np.array([3.0, 1.0, 1e-3, 1e-13, 0.0, -1e-20])
    v = above_floor(s / s[0], 1e-12)
    assert np.allclose(v[:3], [1.0, 1 / 3, 1e-3 / 3])
    assert np.isnan(v[3:]).all()
    assert np.isnan(above_floor(np.zeros(3))).all()


def _anatomy_folder(out: Path, L: int = 3, H: int = 4, dh: int = 8) -> None:
    rng = np.random.default_rng(0)
    heads = [
        {
            "layer": layer,
            "head": h,
            "top1_95": float(rng.uniform()),
            "top3_95": float(rng.uniform()),
            "special_mass": float(rng.uniform()),
            "mean_support_keys": float(rng.uniform(1, 9)),
            "effective_rank": float(rng.uniform(1, dh)),
            "nuc_fro_ratio": float(rng.uniform(1, np.sqrt(dh))),
        }
        for layer in range(L)
        for h in range(H)
    ]
    summary = {"n_layers": L, "n_heads": H, "d_head": dh, "delta": 2.0, "model": "synthetic"}
    summary |= {"n_windows": 3, "n_queries": 90}
    (out / "heads.json").write_text(json.dumps(heads))
    (out / "summary.json").write_text(json.dumps(summary))
    sv = np.sort(rng.uniform(0.1, 2.0, (L, H, 2 * dh)), axis=-1)[..., ::-1].copy()
    sv[..., dh:] = 1e-17  # rank d_head: round-off beyond, which must not set the log range
    edges = np.concatenate([np.arange(0.0, 20.0 + 1e-9, 0.5), [np.inf]])
    ranks = np.array([1, 2, 4, 8])
    np.savez(
        out / "anatomy.npz",
        singular_values=sv,
        margin_edges=edges,
        margin_hist=rng.uniform(size=(L, H, len(edges) - 1)),
        ranks=ranks,
        top1_agreement=np.sort(rng.uniform(size=(L, H, len(ranks))), axis=-1),
    )


def test_analyze_figures_follow_the_style(tmp_path: Path, caught: Caught) -> None:
    from attsvm.analysis._anatomy_report import SPECTRUM_FLOOR, plot_anatomy

    _anatomy_folder(tmp_path)
    paths = plot_anatomy(tmp_path)
    assert [p.name for p in paths] == ["heatmaps.png", "spectra.png", "margins_compression.png"]
    for png in paths:
        check_files(png)
    figs = caught.figures()
    assert len(figs) == 3
    for fig in figs:
        assert not style_problems(fig), style_problems(fig)
    spectra = figs[1]
    for ax in spectra.axes:
        if ax.axison and ax.get_yscale() == "log":
            assert ax.get_ylim()[0] >= SPECTRUM_FLOOR * 0.1, "the spectra's range is the data above the floor"


def test_claims_figure_follows_the_style(tmp_path: Path, caught: Caught) -> None:
    from attsvm.analysis.claims import SERVING_MODES, ClaimRecord, _plot

    def rec(claim: str, model: str, **details: Any) -> ClaimRecord:
        return ClaimRecord(claim, model, "t", "m", "d", "c", 0.5, (0.4, 0.6), "k", "supported", details)

    records = []
    for model in ("model-a", "model-b"):
        records += [
            rec("concentration", model, head_confidence=[[0.2, 0.9], [0.5, 0.7]]),
            rec("sinks", model, per_layer_sink_share=[0.0, 0.5, 0.25]),
            rec("support", model, deltas=[0.5, 1.0, 2.0], mean_support_keys_per_delta=[1.2, 1.6, 2.1]),
            rec("low-rank", model, ranks=[1, 2, 4], d_head=4, top1_agreement=[0.6, 0.9, 1.0]),
            rec("serving", model, **{f"perplexity_ratio_{m}_at_half": [1.02, 1.0, 1.1] for m in SERVING_MODES}),
        ]
    paths = _plot(records, tmp_path)
    assert {p.name for p in paths} == {"claims.png", "claims.pdf"}
    check_files(tmp_path / "claims.png")
    (fig,) = caught.figures()
    assert not style_problems(fig), style_problems(fig)
    assert isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine), "no clipped title: constrained layout"


def test_a_saved_png_is_a_palette_image_at_200_dpi(tmp_path):
    """save_figure writes an opaque figure as a 256-colour palette PNG (a quarter of the bytes) with its dpi."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    from attsvm._folders import save_figure

    fig, ax = plt.subplots()
    ax.imshow(np.random.default_rng(0).random((40, 40)))
    ax.set(xlabel="x", ylabel="y")
    save_figure(fig, tmp_path / "f.png")
    plt.close(fig)
    im = Image.open(tmp_path / "f.png")
    assert im.mode == "P" and round(im.info["dpi"][0]) >= 200
