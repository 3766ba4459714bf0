"""Figure helpers shared by the experiments (they only ever read saved data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .._folders import save_figure

__all__ = ["save", "band", "subplots"]


def subplots(ncols: int, nrows: int = 1, width: float = 4.2, height: float = 3.4) -> tuple[Any, Any]:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return fig, axes


def save(fig: Any, outdir: Path, name: str) -> list[Path]:
    """Write ``name.png`` and ``name.pdf`` into ``outdir``; return both paths."""
    import matplotlib.pyplot as plt

    for ax in fig.axes:
        _linear_without_positive_data(ax)
    fig.tight_layout()
    paths = [outdir / f"{name}.png", outdir / f"{name}.pdf"]
    save_figure(fig, paths[0], dpi=130)
    save_figure(fig, paths[1])
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


def band(ax: Any, x: np.ndarray, Y: np.ndarray, label: str, color: str | None = None, log: bool = False) -> None:
    """Mean curve of the rows of ``Y`` (runs × points) with a 10–90% quantile band."""
    Y = np.asarray(Y, dtype=float)
    mean = np.nanmean(Y, axis=0)
    lo, hi = np.nanquantile(Y, 0.1, axis=0), np.nanquantile(Y, 0.9, axis=0)
    (line,) = ax.plot(x, mean, label=label, color=color)
    ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    if log:
        ax.set_yscale("log")
