"""The documentation site: pages, API references, the spec and its citations, examples, the strict build."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SRC = ROOT / "src" / "attsvm"
MKDOCS_YML = ROOT / "mkdocs.yml"
SPEC = DOCS / "spec.md"
FIGURE_MAX_BYTES = 400_000  # committed figures stay small
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# "docs/spec.md §3", "docs/spec.md §2–3", "docs/spec.md §4, §5"
CITATION = re.compile(r"docs/spec\.md §(\d+)(?:[–-](\d+))?((?:,\s*§\d+)*)")
# older forms that pointed at a file outside the repository
STALE_CITATION = re.compile(r"\bSPEC §\d|SPEC\.md|\.\./shared|shared/SPEC|\bSTYLE\b")
ISSUE_REFERENCE = re.compile(r"\bissues?\s*#\s*\d+", re.I)


def _nav_pages() -> list[str]:
    # mkdocs.yml carries a !!python/name tag, so read the nav entries with a pattern, not a YAML loader
    text = MKDOCS_YML.read_text(encoding="utf-8")
    nav = text.split("\nnav:", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"([\w/.-]+\.md)\s*$", nav, flags=re.M)


def _spec_sections() -> set[int]:
    return {int(n) for n in re.findall(r"^## (\d+)\. ", SPEC.read_text(encoding="utf-8"), flags=re.M)}


def _python_files() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_page_is_in_the_nav_and_exists():
    pages = _nav_pages()
    assert len(pages) == len(set(pages)), "a page appears twice in the nav"
    for page in pages:
        assert (DOCS / page).is_file(), f"mkdocs.yml lists {page}, which does not exist"
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert on_disk == set(pages), f"pages not in the nav: {sorted(on_disk - set(pages))}"
    for required in (
        "index.md",
        "installation.md",
        "spec.md",
        "how-it-works.md",
        "guide/solvers.md",
        "guide/training.md",
        "guide/reproductions.md",
        "guide/transformers.md",
    ):
        assert required in pages


def test_api_reference_names_resolve():
    """Every ``::: name`` in docs/api is an importable public module or object with a docstring."""
    names = []
    for page in sorted((DOCS / "api").glob("*.md")):
        names += re.findall(r"^::: ([\w.]+)\s*$", page.read_text(encoding="utf-8"), flags=re.M)
    assert len(names) >= 10
    for name in names:
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
            break
        else:
            pytest.fail(f"{name} is not importable")
        assert (obj.__doc__ or "").strip(), f"{name} has no docstring for the API reference"


def test_the_how_it_works_page_has_its_diagrams():
    text = (DOCS / "how-it-works.md").read_text(encoding="utf-8")
    assert text.count("```mermaid") >= 2
    for module in ("problem", "tokens", "svm", "train", "diagnostics", "experiments", "analysis", "cli"):
        assert module in text
    assert "custom_fences" in MKDOCS_YML.read_text(encoding="utf-8")  # mermaid is rendered, not shown as code


def test_spec_stands_alone():
    text = SPEC.read_text(encoding="utf-8")
    assert _spec_sections() == set(range(1, 9))
    for outside in ("seeds/", "../", "shared/", "SPEC.md"):
        assert outside not in text, f"docs/spec.md points outside the repository: {outside!r}"
    assert not ISSUE_REFERENCE.search(text)
    assert "arXiv" in text and "2308.16898" in text  # the source it states precisely


def test_code_cites_sections_that_exist():
    sections = _spec_sections()
    cited = 0
    for path in _python_files():
        for m in CITATION.finditer(path.read_text(encoding="utf-8")):
            first, last = int(m.group(1)), int(m.group(2) or m.group(1))
            more = [int(n) for n in re.findall(r"§(\d+)", m.group(3) or "")]
            for n in [*range(first, last + 1), *more]:
                assert n in sections, f"{path.relative_to(ROOT)} cites docs/spec.md §{n}, which does not exist"
                cited += 1
    assert cited >= 50, "the docstrings should cite docs/spec.md"


def test_code_points_inside_the_repository_and_cites_no_issues():
    """Docstrings cite "docs/spec.md §N": no file outside the repository (nor its habits), no issue numbers; the
    same for the tests and benchmarks."""
    offenders = []
    others = [*(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]
    for path in [*_python_files(), *sorted(p for p in others if p != Path(__file__).resolve())]:
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if STALE_CITATION.search(line) or ISSUE_REFERENCE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()[:100]}")
    assert not offenders, "\n".join(offenders)


def test_figures_are_real_small_pngs():
    text = (DOCS / "guide" / "reproductions.md").read_text(encoding="utf-8")
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text)
    assert len(figures) >= 6, "the reproductions page shows the figures"
    for rel in figures:
        path = (DOCS / "guide" / rel).resolve()
        assert path.is_file(), rel
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC), rel
        assert len(data) <= FIGURE_MAX_BYTES, f"{rel} is {len(data)} bytes"


def _python_blocks(page: Path) -> list[str]:
    # ```python blocks run; ```py blocks are illustrations that need an extra or a model
    return re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.S | re.M)


@pytest.mark.parametrize("page", ["index.md", "guide/solvers.md", "guide/training.md"])
def test_docs_examples_run(page):
    blocks = _python_blocks(DOCS / page)
    assert blocks, f"{page} has no runnable example"
    for code in blocks:
        exec(compile(code, str(DOCS / page), "exec"), {"__name__": "__docs__"})


def test_site_builds_strict(tmp_path):
    """``mkdocs build --strict``: every warning (broken link, unresolved API name) is an error."""
    pytest.importorskip("mkdocs", reason="the [docs] extra (installed by `make install`) builds the site")
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    assert mkdocs, "mkdocs is importable but its command is not on PATH"
    site = tmp_path / "site"
    proc = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    html = (site / "api" / "svm" / "index.html").read_text(encoding="utf-8")
    assert 'id="attsvm.svm.AttentionSVM"' in html, "the API reference did not render AttentionSVM"
    assert (site / "spec" / "index.html").is_file()


def test_reproductions_page_is_written_from_the_runs_reports(tmp_path):
    """docs/scripts/reproductions.py copies a run's figures and measured table; it computes nothing."""
    run = tmp_path / "runs" / "local-convergence"
    (run / "figures").mkdir(parents=True)
    (run / "figures" / "local_convergence.png").write_bytes(PNG_MAGIC + b"not really an image")
    (run / "config.json").write_text('{"quick": true}', encoding="utf-8")
    (run / "report.md").write_text(
        "# local-convergence: GD converges\n\n## What we measured\n\n| claim | measured |\n|---|---|\n"
        "| C2 | 0.1234 |\n\n## Notes\n\n- a note\n\n## Figures\n\n![x](figures/local_convergence.png)\n",
        encoding="utf-8",
    )
    page, figures = tmp_path / "page.md", tmp_path / "figures"
    script = DOCS / "scripts" / "reproductions.py"
    args = ["--names", "local-convergence", "--page", str(page), "--figures", str(figures)]
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "runs"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    text = page.read_text(encoding="utf-8")
    assert "## local-convergence" in text and "| C2 | 0.1234 |" in text
    assert "`attsvm reproduce local-convergence --quick`" in text  # the page says how the run was made
    assert "**Notes**" in text and "## Notes" not in text and "## Figures" not in text
    assert "](../assets/figures/local_convergence.png)" in text
    assert (figures / "local_convergence.png").read_bytes().startswith(PNG_MAGIC)
