"""Figure helpers shared by the experiments (they only ever read saved data).

The style itself — fonts, notation, constrained layout, the one figure-level legend, the quantile bands,
log ticks, 200 dpi PNG + PDF — lives in :mod:`attsvm._style`; this module re-exports what the experiments use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .._folders import save_figure
from .._style import (
    DIMENSIONLESS,
    W_EQ,
    W_EQ_NUC,
    W_FIN,
    W_MM,
    W_MM_NUC,
    W_SVM,
    band,
    figure_legend,
    panels,
    style,
    subplots,
)

__all__ = [
    "save",
    "band",
    "subplots",
    "panels",
    "figure_legend",
    "style",
    "one_minus_corr",
    "W_MM",
    "W_MM_NUC",
    "W_EQ",
    "W_EQ_NUC",
    "W_FIN",
    "W_SVM",
    "DIMENSIONLESS",
    "FLOOR",
]

FLOOR = 1e-16  # 1 − corr (and other gaps) below this are drawn at it: float64 cannot tell them from 0


def one_minus_corr(what: str = "corr") -> str:
    """The y label of a ``1 − corr`` panel: dimensionless, floored at :data:`FLOOR`."""
    return f"1 − {what}\n(dimensionless, floor 1e-16)"


def save(fig: Any, outdir: Path, name: str) -> list[Path]:
    """Write ``name.png`` (200 dpi) and ``name.pdf`` into ``outdir``; return both paths."""
    import matplotlib.pyplot as plt

    for ax in fig.axes:
        _linear_without_positive_data(ax)
    paths = [outdir / f"{name}.png", outdir / f"{name}.pdf"]
    save_figure(fig, paths[0])  # (the PDF beside it too)
    plt.close(fig)
    return paths


def _linear_without_positive_data(ax: Any) -> None:
    """A log axis with no positive value to show (1 − corr = 0, or NaN correlations of a degenerate
    instance) cannot be drawn (matplotlib raises): it is drawn linear instead, with a note on the panel."""
    lims = ax.dataLim
    for name, minpos in (("y", lims.minposy), ("x", lims.minposx)):
        if getattr(ax, f"get_{name}scale")() == "log" and not np.isfinite(minpos):
            getattr(ax, f"set_{name}scale")("linear")
            ax.text(
                0.5,
                0.5,
                f"no positive value to draw on a log {name} axis\n(all <= 0 or NaN): drawn linear",
                transform=ax.transAxes,
                ha="center",
                va="center",
                fontsize="small",
                color="0.4",
            )
