"""The built documentation site as a reader gets it, and the citation metadata.

`make docs-check` builds the site into site/ and runs this file. The browser tests load pages in headless Chromium
(Debian's ``chromium`` and ``chromium-driver``, which the make target installs; selenium is handed the driver's path,
so it downloads nothing) from a local server, with every other host unreachable, and check what a reader sees:
maths typeset by KaTeX, images loaded, no console errors, no raw Sphinx roles, no broken internal links. Without
the browser or the built site they are skipped, with the reason. The other tests read the built HTML or the
repository only.
"""

from __future__ import annotations

import html
import re
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urldefrag

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "site"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
RAW_ROLE = re.compile(r":(func|class|meth|mod|attr|obj|data|exc):")

# page -> what it must show besides the common checks: "maths" (KaTeX output), "diagrams" (Mermaid's drawings),
# "images" (figures); "api/svm/" is the AttentionSVM reference
PAGES = {
    "": set(),
    "guide/solvers/": {"maths"},
    "guide/training/": {"maths"},
    "guide/lp/": {"maths"},
    "guide/transformers/": {"maths"},
    "spec/": {"maths"},
    "how-it-works/": {"maths", "diagrams"},
    "guide/reproductions/": {"images"},
    "api/svm/": set(),
    "tutorials/theory-in-five-minutes/": {"maths", "plot"},
    "tutorials/kv-eviction-by-margins/": {"maths"},
}

needs_site = pytest.mark.skipif(
    not (SITE / "index.html").is_file(),
    reason="no built site in site/ (`make docs` builds it; `make docs-check` builds it and runs these tests)",
)
needs_browser = pytest.mark.skipif(
    not (Path(CHROMIUM).is_file() and Path(CHROMEDRIVER).is_file()),
    reason="needs Debian's chromium and chromium-driver (`make docs-check` installs them)",
)


def _text(page_html: str) -> str:
    page_html = re.sub(r"<(script|style)\b.*?</\1>", " ", page_html, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", "", page_html))


# ---------------------------------------------------------------------------------------------------------------
# the built HTML, no browser


@needs_site
def test_no_raw_sphinx_roles_in_the_site():
    """The docstrings' roles (``:func:`train```) reach the reader as links or code, never as role markup."""
    offenders = []
    for path in sorted(SITE.rglob("*.html")):
        text = _text(path.read_text(encoding="utf-8"))
        if m := RAW_ROLE.search(text):
            offenders.append(f"{path.relative_to(SITE)}: ...{text[m.start() - 40 : m.end() + 40]!r}")
    assert not offenders, "\n".join(offenders)
    search = (SITE / "search" / "search_index.json").read_text(encoding="utf-8")
    assert not RAW_ROLE.search(search), "the search index shows raw roles"


@needs_site
def test_roles_become_cross_references():
    """A role whose target is documented is a link to it; one whose target is not is inline code."""
    svm = (SITE / "api" / "svm" / "index.html").read_text(encoding="utf-8")
    links = re.findall(r'<a class="autorefs autorefs-internal"[^>]*href="([^"]+)"[^>]*><code>([^<]+)</code></a>', svm)
    assert len(links) >= 50, "the solver reference cross-references its functions"
    targets = {title: href for href, title in links}
    assert targets.get("fit_many()", "").endswith("#attsvm.svm.AttentionSVM.fit_many")  # :meth:`fit_many`
    assert targets.get("SVMStack", "").endswith("#attsvm.svm.stack.SVMStack")  # :class:`SVMStack`
    assert targets.get("reduce_stack()", "").endswith("#attsvm.svm.reduction.reduce_stack")
    # a helper that the site does not document (:func:`~attsvm.svm.certificate.certify_stack`): code, no link
    assert re.search(
        r'<span title="attsvm\.svm\.certificate\.certify_stack"><code>certify_stack\(\)</code></span>', svm
    )


@needs_site
def test_qualified_numpy_sections_are_tables():
    """AttentionSVM's "Attributes (after fit)" is a table of the fitted attributes, not one block of text."""
    svm = (SITE / "api" / "svm" / "index.html").read_text(encoding="utf-8")
    start = svm.index('<span class="doc-section-title">Attributes (after fit)</span>')
    table = svm[start : svm.index("</table>", start)]
    names = re.findall(r'<tr class="doc-section-item">\s*<td><code>(?:<[^>]+>)*([\w, ]+)<', table)
    for name in ("W_", "dual_coef_", "support_", "status_", "certificate_, certificate_residual_", "tokens_"):
        assert name in names, f"{name} is not a row of the table"
    assert "<code>(n, T) bool</code>" in table  # a leading shape is the type


@needs_site
def test_internal_names_stay_out_of_the_table_of_contents():
    """The solver page documents attsvm.svm._active_set, but its table of contents lists the public API only."""
    svm = (SITE / "api" / "svm" / "index.html").read_text(encoding="utf-8")
    toc = re.findall(r'<a href="#([^"]+)" class="md-nav__link"', svm)
    assert "attsvm.svm.AttentionSVM.fit_many" in toc
    assert not [a for a in toc if re.search(r"\._(?!_)", a)], "internal names in the table of contents"
    assert 'id="attsvm.svm._active_set.StackJob"' in svm  # still documented on the page


@needs_site
def test_maths_and_diagrams_come_from_the_site():
    """Every page loads its scripts and styles from the site: KaTeX and Mermaid are vendored, no web fonts."""
    for path in sorted(SITE.rglob("*.html")):
        page = path.read_text(encoding="utf-8")
        for tag in re.findall(r"<(?:script|link)\b[^>]*>", page):
            src = re.search(r'\b(?:src|href)="([^"]+)"', tag)
            if src and ("<script" in tag or "stylesheet" in tag or "preconnect" in tag):
                assert not re.match(r"(https?:)?//", src[1]), f"{path.relative_to(SITE)} loads {src[1]}"
    for asset in ("assets/vendor/katex/katex.min.js", "assets/vendor/katex/katex.min.css", "assets/js/katex-init.js"):
        assert (SITE / asset).is_file(), f"{asset} is missing: `make docs` unpacks KaTeX"
    assert (SITE / "assets" / "vendor" / "mermaid" / "mermaid.min.js").is_file()
    spec = (SITE / "spec" / "index.html").read_text(encoding="utf-8")
    assert spec.count('class="arithmatex"') >= 100, "the specification's formulas are maths"


# ---------------------------------------------------------------------------------------------------------------
# the site in a browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def base_url():
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(SITE)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url, timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("the local server did not start")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (the [test] extra) drives the browser")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in a container
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,2000",
        # every host but the local server is unreachable: a page that needs the internet fails here
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(driver, script: str, timeout: float = 20.0):
    """Poll a JavaScript expression until it is truthy; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = driver.execute_script(f"return {script};")
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def _fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        return error.code, ""


@needs_site
@needs_browser
@pytest.mark.parametrize("page", list(PAGES))
def test_page_in_the_browser(browser, base_url, page):
    shows = PAGES[page]
    browser.get(base_url + page)
    assert _wait(browser, "document.readyState === 'complete'")
    if "maths" in shows:
        assert _wait(browser, "document.querySelectorAll('.arithmatex .katex').length"), "no maths was typeset"
        untyped = browser.execute_script(
            "return Array.from(document.querySelectorAll('.arithmatex'))"
            ".filter(e => !e.querySelector('.katex')).map(e => e.textContent).slice(0, 5);"
        )
        assert not untyped, f"maths left as source: {untyped}"
        assert not browser.execute_script("return document.querySelectorAll('.katex-error').length;")
    if "diagrams" in shows:
        # the theme replaces each <pre class="mermaid"> by a <div> holding the drawing (in a closed shadow root)
        drawn = "Array.from(document.querySelectorAll('div.mermaid')).filter(e => e.offsetHeight > 20).length"
        assert _wait(browser, f"!document.querySelector('pre.mermaid') && {drawn} >= 2"), "diagrams not drawn"
    assert _wait(browser, "Array.from(document.images).every(i => i.complete)"), "images still loading"
    if "images" in shows:
        assert browser.execute_script("return document.images.length;") >= 6, "the page shows no figures"
    if "plot" in shows:  # (an executed notebook's figure, inline)
        assert browser.execute_script("return document.images.length;") >= 1, "the notebook's plot is missing"
    broken = browser.execute_script(
        "return Array.from(document.images).filter(i => !(i.naturalWidth > 0)).map(i => i.src);"
    )
    assert not broken, f"images that did not load: {broken}"

    errors = [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert not errors, "console errors:\n" + "\n".join(errors)
    resources = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name);")
    assert all(r.startswith(base_url) for r in resources), [r for r in resources if not r.startswith(base_url)]

    text = browser.execute_script("return document.body.innerText;")
    assert not RAW_ROLE.search(text), f"raw Sphinx role: {RAW_ROLE.search(text)[0]}"

    hrefs = browser.execute_script("return Array.from(document.querySelectorAll('a[href]')).map(a => a.href);")
    targets: dict[str, set[str]] = {}
    for href in hrefs:
        url, fragment = urldefrag(href)
        if url.startswith(base_url):
            targets.setdefault(url, set()).add(unquote(fragment))
    assert targets, "no internal links"
    for url, fragments in sorted(targets.items()):
        status, body = _fetch(url)
        assert status == 200, f"{page or 'home'}: {url} answers {status}"
        missing = sorted(f for f in fragments if f and f'id="{html.escape(f)}"' not in body)
        assert not missing, f"{page or 'home'}: {url} has no anchors {missing[:5]}"


# ---------------------------------------------------------------------------------------------------------------
# CITATION.cff


def test_citation_file():
    """CITATION.cff (CFF 1.2.0) cites the software at its current version and the paper it implements."""
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert cff["cff-version"] == "1.2.0"
    assert cff["type"] == "software" and cff["title"] == "attsvm" and cff["message"]
    assert str(cff["version"]) == project["version"]
    assert cff["license"] == project["license"] == "MIT"
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    assert cff["authors"] and all("name" in a or "family-names" in a for a in cff["authors"])
    paper = cff["preferred-citation"]
    assert paper["type"] == "article" and paper["title"] == "Transformers as Support Vector Machines"
    assert [(a["given-names"], a["family-names"]) for a in paper["authors"]] == [
        ("Davoud Ataee", "Tarzanagh"),
        ("Yingcong", "Li"),
        ("Christos", "Thrampoulidis"),
        ("Samet", "Oymak"),
    ]
    assert paper["year"] == 2023
    assert paper["url"] == "https://arxiv.org/abs/2308.16898"
    assert paper["doi"] == "10.48550/arXiv.2308.16898"  # the DOI arXiv registers for every paper
    assert "arXiv:2308.16898" in [i["value"] for i in paper["identifiers"]]
