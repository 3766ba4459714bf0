"""Write docs/guide/reproductions.md and its figures from real ``attsvm reproduce`` runs.

``make docs-figures`` runs every experiment into ``results/docs-figures/NAME`` and then this script,
which copies each run's PNGs into ``docs/assets/figures/`` and its measured-claims table (from the
run's ``report.md``) into the page. Nothing here computes a number: the page shows what the runs wrote.

    python docs/scripts/reproductions.py results/docs-figures
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

from attsvm.experiments import STUDIES

DOCS = Path(__file__).resolve().parents[1]
PAGE = DOCS / "guide" / "reproductions.md"
FIGURES = DOCS / "assets" / "figures"
ORDER = (
    "gd-paths",
    "local-convergence",
    "overparam",
    "svm-rank",
    "svm-eq",
    "reg-path",
    "multiclass",
    "nuclear-identity",
    "low-rank",
    "lp-convergence",
    "rates",
    "ntp-convergence",
    "joint-training",
    "svm-eq-mlp",
    "hierarchy",
    "optimizer-bias",
    "phase",
)


INTRO = """# Reproductions

`attsvm reproduce NAME` reruns one of the paper's experiments
([spec §6](../spec.md#6-experiments-to-reproduce-settings-of-the-official-code)) and writes its figures,
its data as Parquet, `results.json`, and a `report.md` that states each claim of the paper, the number
measured, the criterion and a verdict. Runs are resumable (every finished trial is stored) and run
in a process pool of one worker per usable core (`--workers auto`, the default for full runs;
`--quick` runs in-process), on N workers (`--workers N`, `1` in-process) or on Dask
(`--scheduler ADDR`). `reproduce all` on workers runs two experiments at once, so the next one's
trials fill the workers while one finishes. `phase`, a study of its own (960,000 certified solves), is not part
of `all` and runs on a Dask LocalCluster by default. `attsvm list` shows the
settings and their `--quick` variants; `attsvm plot DIR` redraws the figures from saved data.
This needs the `[experiments]` extra.

```bash
attsvm reproduce local-convergence --out results/local-convergence   # the paper's settings
attsvm reproduce all --quick                                         # every experiment, small settings
```

!!! note "Where these figures come from"
    Each figure and table below was produced by a real run of `attsvm reproduce` and is committed as
    a PNG; `make docs-figures` reruns every experiment at the paper's settings and rewrites this page
    (`docs/scripts/reproductions.py`). The tables are copied from each run's `report.md`; the line
    under each heading gives the command that produced it.

!!! info "Reading the figures"
    Every figure is drawn in one style (`attsvm._style`): PNGs at 200 dpi here, with a PDF of each in the
    run's `figures/` folder, and one legend per figure, under the panels. A curve is the mean over runs and
    its shaded band the 10–90 % quantile over runs. `1 − corr` and other gaps are drawn with a floor of
    1e-16 (float64 cannot tell smaller values from 0), which the axis label states. A legend entry ending
    in "(a)" or "(b, c)" belongs to those panels only.
"""


def _spec_rows() -> dict[str, tuple[str, str]]:
    rows = {}
    for line in (DOCS / "spec.md").read_text(encoding="utf-8").splitlines():
        m = re.match(r"\| (\S+) \| (.*) \| (.*) \|$", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def _section(name: str, run: Path, spec_rows: dict[str, tuple[str, str]], figures: Path) -> list[str]:
    report = (run / "report.md").read_text(encoding="utf-8")
    quick = bool(json.loads((run / "config.json").read_text(encoding="utf-8")).get("quick"))
    title = report.splitlines()[0].lstrip("# ").split(": ", 1)[-1]
    measured = report.split("## What we measured", 1)[1].split("## Figures", 1)[0].strip()
    # the report's own sub-headings become bold lines, so the page's outline stays one level per experiment
    measured = "\n".join(f"**{ln[3:].strip()}**" if ln.startswith("## ") else ln for ln in measured.splitlines())
    out = [f"## {name}", "", f"**{title}.**", ""]
    if name in spec_rows:
        settings, shows = spec_rows[name]
        lead = "Settings" if name in STUDIES else "Paper settings"  # (a study's settings are ours)
        out += [f"{lead}: {settings}. The figure shows {shows}.", ""]
    out += [f"*Run: `attsvm reproduce {name}{' --quick' if quick else ''}`.*", ""]
    pngs = sorted((run / "figures").glob("*.png"))
    if not pngs:
        raise SystemExit(f"{run} has no figures: run `attsvm plot {run}`")
    for png in pngs:
        shutil.copy2(png, figures / png.name)
        out += [f"![{name}: {png.stem}](../assets/figures/{png.name})", ""]
    return [*out, measured, ""]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("runs", type=Path, help="folder holding one `attsvm reproduce` output per experiment")
    parser.add_argument("--names", nargs="+", default=list(ORDER), help="experiments, in page order")
    parser.add_argument("--page", type=Path, default=PAGE, help="the page to write (default: %(default)s)")
    parser.add_argument("--figures", type=Path, default=FIGURES, help="where the PNGs go (default: %(default)s)")
    args = parser.parse_args(argv)
    args.figures.mkdir(parents=True, exist_ok=True)
    spec_rows = _spec_rows()
    lines = [INTRO]
    for name in args.names:
        lines += _section(name, args.runs / name, spec_rows, args.figures)
    args.page.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    print(f"wrote {args.page} and the figures of {len(args.names)} experiments to {args.figures}")


if __name__ == "__main__":
    main()
