"""One figure style for every figure attsvm writes (the reproductions, ``analyze``, ``claims``).

What it fixes, in one place:

* fonts and sizes (:data:`RC`, applied by :func:`style` around the drawing code);
* the notation: :data:`W_MM` (``$W_{\\mathrm{mm}}$``), :data:`W_MM_NUC` (``$W^{*}_{\\mathrm{mm}}$``) and their
  relatives are the only spellings used in figure text;
* layout: figures are made with constrained layout (:func:`subplots`), so no title or label is clipped;
* one legend per figure: :func:`figure_legend` gathers the panels' entries into one figure-level legend and
  explains the shaded quantile bands drawn by :func:`band` there;
* log axes: a log axis whose view spans less than a decade (or two) gets plain decimal ticks (``150``, ``0.2``)
  in place of matplotlib's ``1.5×10²`` minor labels (:func:`finish`, run by :func:`attsvm._folders.save_figure`
  on every figure); :func:`above_floor` drops values below a numerical floor so that the axis range is set
  by the data above it;
* files: :func:`attsvm._folders.save_figure` writes the PNG at :data:`PNG_DPI` or more and a PDF beside it.

matplotlib is imported inside the functions only: importing this module costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

__all__ = [
    "RC",
    "PNG_DPI",
    "W_MM",
    "W_MM_NUC",
    "W_EQ",
    "W_EQ_NUC",
    "W_FIN",
    "W_SVM",
    "DIMENSIONLESS",
    "BAND_LABEL",
    "style",
    "subplots",
    "panels",
    "band",
    "figure_legend",
    "finish",
    "plain_log_ticks",
    "above_floor",
]

PNG_DPI = 200  # the least resolution of a PNG written by save_figure

# the notation of every figure (mathtext)
W_MM = r"$W_{\mathrm{mm}}$"
W_MM_NUC = r"$W^{*}_{\mathrm{mm}}$"
W_EQ = r"$W^{\mathrm{eq}}$"
W_EQ_NUC = r"$W^{*\mathrm{eq}}$"
W_FIN = r"$W_{\mathrm{fin}}$"
W_SVM = r"$W_{\mathrm{svm}}$"
DIMENSIONLESS = "(dimensionless)"
BAND_LABEL = "shaded: 10–90 % quantile over runs"

RC: dict[str, Any] = {
    "font.size": 9,
    "axes.titlesize": 9.5,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "legend.title_fontsize": 8,
    "legend.frameon": False,
    "figure.titlesize": 10.5,
    "figure.constrained_layout.use": True,
    "figure.dpi": 100,
    "savefig.dpi": PNG_DPI,
    "lines.linewidth": 1.4,
    "lines.markersize": 4.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlelocation": "center",
    "mathtext.fontset": "dejavusans",
    "pdf.fonttype": 42,  # TrueType in the PDF: text stays text
    "image.cmap": "viridis",
}

_BAND_ATTR = "_attsvm_band"


@contextmanager
def style() -> Iterator[None]:
    """``with style():`` — the figure style (:data:`RC`) for the figures drawn inside, rcParams restored after."""
    import matplotlib

    rc: Any = RC  # (matplotlib types the keys as literals)
    with matplotlib.rc_context(rc):
        yield


def subplots(
    ncols: int, nrows: int = 1, width: float = 3.4, height: float = 3.0, **kwargs: Any
) -> tuple[Any, np.ndarray]:
    """A constrained-layout figure of ``nrows × ncols`` panels of ``width × height`` inches, axes as a 2-D array."""
    import matplotlib.pyplot as plt

    with style():
        fig, axes = plt.subplots(
            nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False, layout="constrained", **kwargs
        )
    return fig, axes


def panels(
    n: int, ncols: int = 3, width: float = 3.4, height: float = 3.0, **kwargs: Any
) -> tuple[Any, list[Any], Any]:
    """``n`` panels on a grid at most ``ncols`` wide (figures stay readable at page width): returns the figure,
    the ``n`` axes in reading order, and the first spare cell of the grid (None when the grid is full) —
    hand it to :func:`figure_legend` as ``host`` to hold the legend."""
    ncols = max(1, min(ncols, n))
    nrows = -(-n // ncols)
    fig, axes = subplots(ncols, nrows, width=width, height=height, **kwargs)
    flat = list(axes.ravel())
    spare = flat[n:]
    for extra in spare[1:]:
        fig.delaxes(extra)
    return fig, flat[:n], (spare[0] if spare else None)


def band(
    ax: Any, x: np.ndarray, Y: np.ndarray, label: str | None, color: str | None = None, log: bool = False, **kw: Any
) -> Any:
    """Mean curve of the rows of ``Y`` (runs × points) with its 10–90 % quantile band (explained by
    :func:`figure_legend`); returns the line."""
    Y = np.asarray(Y, dtype=float)
    import warnings

    with warnings.catch_warnings():  # (a column of NaNs: nothing to draw there)
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(Y, axis=0)
        lo, hi = np.nanquantile(Y, 0.1, axis=0), np.nanquantile(Y, 0.9, axis=0)
    (line,) = ax.plot(x, mean, label=label, color=color, **kw)
    if Y.shape[0] > 1:
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        setattr(ax, _BAND_ATTR, True)
    if log:
        ax.set_yscale("log")
    return line


def figure_legend(
    fig: Any,
    *,
    ncol: int | None = None,
    loc: str = "outside lower center",
    extra: Sequence[tuple[Any, str]] = (),
    band_label: str = BAND_LABEL,
    title: str | None = None,
    host: Any = None,
    markerscale: float = 1.0,
) -> Any:
    """One legend for the whole figure: the entries of every panel (one per label, in order of appearance),
    ``extra`` (handle, label) pairs, and — when a panel has a quantile band — a grey patch saying what the
    shading is. The panels' own legends are removed. The legend goes outside the panels (``loc``), or into
    ``host``, a spare cell of the grid (see :func:`panels`), whose axes are hidden. Returns the legend (None when
    there is nothing to list)."""
    from matplotlib.patches import Patch

    entries: dict[str, Any] = {}
    bands = False
    for ax in fig.axes:
        if ax is host:
            continue
        handles, labels = ax.get_legend_handles_labels()
        for h, lab in zip(handles, labels):
            if lab and not lab.startswith("_") and lab not in entries:
                entries[lab] = h
        if ax.get_legend() is not None:
            ax.get_legend().remove()
        bands = bands or bool(getattr(ax, _BAND_ATTR, False))
    for h, lab in extra:
        entries.setdefault(lab, h)
    if bands:
        entries.setdefault(band_label, Patch(facecolor="0.5", alpha=0.3, linewidth=0))
    if not entries:
        return None
    n = len(entries)
    if host is not None:
        host.set_axis_off()
        return host.legend(
            list(entries.values()),
            list(entries.keys()),
            loc="center",
            ncol=ncol or 1,
            title=title,
            markerscale=markerscale,
        )
    if ncol is None:
        ncol = (n if n <= 4 else -(-n // 2)) if loc.startswith("outside lower") else 1
    return fig.legend(
        list(entries.values()), list(entries.keys()), loc=loc, ncol=ncol, title=title, markerscale=markerscale
    )


def plain_log_ticks(axis: Any) -> bool:
    """Plain decimal ticks (``120``, ``150``, ``0.25``) on a log ``axis`` (``ax.xaxis``/``ax.yaxis``) whose view
    spans less than two decades, where matplotlib would label minor ticks ``1.5×10²``: evenly spaced ticks under a
    decade, ticks at 1, 2 and 5 × 10^k between one and two. Returns whether it changed the axis."""
    from matplotlib import ticker

    if axis.get_scale() != "log":
        return False
    lo, hi = sorted(axis.get_view_interval())
    if not (np.isfinite(lo) and np.isfinite(hi) and lo > 0 and hi / lo < 100.0):
        return False
    if hi / lo < 10.0:
        axis.set_major_locator(ticker.MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]))
        axis.set_minor_locator(ticker.NullLocator())
        plain = ticker.ScalarFormatter(useOffset=False)  # (as many decimals as the tick spacing needs)
        plain.set_powerlimits((-4, 6))
        axis.set_major_formatter(plain)
    else:
        axis.set_major_locator(ticker.LogLocator(base=10.0, subs=(1.0, 2.0, 5.0)))
        axis.set_minor_formatter(ticker.NullFormatter())
        axis.set_major_formatter(ticker.FuncFormatter(lambda v, _pos: f"{v:.4g}"))
    return True


def finish(fig: Any) -> None:
    """The pass run on every figure before it is written: plain decimal ticks on log axes under two decades."""
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            plain_log_ticks(axis)


def above_floor(values: Any, rel: float = 1e-12) -> np.ndarray:
    """``values`` as floats with those below ``rel`` × the largest (and non-positive ones) set to NaN: a log axis
    then spans the data above the numerical floor, not the floor. Say so in the axis label."""
    v = np.array(values, dtype=float)
    top = np.nanmax(np.abs(v)) if v.size and np.isfinite(v).any() else np.nan
    if np.isfinite(top) and top > 0:
        v[~(v >= rel * top)] = np.nan
    else:
        v[:] = np.nan
    return v
