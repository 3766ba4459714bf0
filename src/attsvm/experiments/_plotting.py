"""Figure helpers shared by the experiments (they only ever read saved data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["save", "band", "subplots"]


def subplots(ncols: int, nrows: int = 1, width: float = 4.2, height: float = 3.4) -> tuple[Any, Any]:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return fig, axes


def save(fig: Any, outdir: Path, name: str) -> list[Path]:
    """Write ``name.png`` and ``name.pdf`` into ``outdir``; return both paths."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    paths = [outdir / f"{name}.png", outdir / f"{name}.pdf"]
    fig.savefig(paths[0], dpi=130)
    fig.savefig(paths[1])
    plt.close(fig)
    return paths


def band(ax: Any, x: np.ndarray, Y: np.ndarray, label: str, color: str | None = None, log: bool = False) -> None:
    """Mean curve of the rows of ``Y`` (runs × points) with a 10–90% quantile band."""
    Y = np.asarray(Y, dtype=float)
    mean = np.nanmean(Y, axis=0)
    lo, hi = np.nanquantile(Y, 0.1, axis=0), np.nanquantile(Y, 0.9, axis=0)
    (line,) = ax.plot(x, mean, label=label, color=color)
    ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    if log:
        ax.set_yscale("log")
