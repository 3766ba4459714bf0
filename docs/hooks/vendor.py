"""Pages with diagrams load Mermaid from the site itself, not from a CDN.

mkdocs-material draws ``mermaid`` fences with the Mermaid library, which it fetches from a public CDN unless a
global ``mermaid`` is already defined. ``make docs`` unpacks Mermaid's npm package into docs/assets/vendor/mermaid/;
this hook adds its script, before the theme's own, to the pages that have a diagram (it is large, so the other pages
do without it).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from mkdocs.utils import get_relative_url

log = logging.getLogger("mkdocs.hooks.vendor")

MERMAID = "assets/vendor/mermaid/mermaid.min.js"
DIAGRAM = re.compile(r'<(?:pre|div) class="mermaid"')
THEME_BUNDLE = re.compile(r'<script src="[^"]*assets/javascripts/bundle\.[0-9a-f]+\.min\.js"')


def on_post_page(output: str, page: Any, config: Any, **kwargs: Any) -> str:
    if not DIAGRAM.search(output):
        return output
    bundle = THEME_BUNDLE.search(output)
    if bundle is None:
        log.warning(f"{page.file.src_uri}: no theme bundle found, Mermaid would be fetched from a CDN")
        return output
    script = f'<script src="{get_relative_url(MERMAID, page.url)}"></script>\n    '
    return output[: bundle.start()] + script + output[bundle.start() :]
