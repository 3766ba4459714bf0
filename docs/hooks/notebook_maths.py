"""The maths of the notebook pages (mkdocs-jupyter) for the site's KaTeX.

nbconvert leaves the ``$...$`` and ``$$...$$`` of a notebook's markdown cells as text (for MathJax, which the
site does not load); this hook wraps each formula in the element pymdownx.arithmatex writes in generic mode,
``<span class="arithmatex">\\(...\\)</span>`` (``\\[...\\]`` for display maths), which assets/js/katex-init.js
typesets as it does on every other page. Code, outputs, scripts and styles are left alone.
"""

from __future__ import annotations

import re
from typing import Any

_KEEP = re.compile(r"(<(pre|code|script|style)\b.*?</\2>)", re.S)
_DISPLAY = re.compile(r"\$\$(.+?)\$\$", re.S)
_INLINE = re.compile(r"(?<![\\$])\$(?![\s$])([^$]+?)(?<![\s\\])\$(?!\$)")


def _wrap(text: str) -> str:
    text = _DISPLAY.sub(lambda m: f'<span class="arithmatex">\\[{m[1]}\\]</span>', text)
    return _INLINE.sub(lambda m: f'<span class="arithmatex">\\({m[1]}\\)</span>', text)


def on_page_content(html: str, page: Any, **kwargs: Any) -> str:
    if not page.file.src_uri.endswith(".ipynb"):
        return html
    parts = _KEEP.split(html)
    # re.split with two groups: text, whole kept element, its tag name, text, ...
    out = []
    for i in range(0, len(parts), 3):
        out.append(_wrap(parts[i]))
        if i + 1 < len(parts):
            out.append(parts[i + 1])
    return "".join(out)
