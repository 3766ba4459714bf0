"""How the API reference renders the docstrings: Sphinx roles, qualified sections, a public table of contents.

The docstrings under ``src/attsvm`` are written for Sphinx and numpydoc readers: they cross-reference with roles
(``:func:`train```, ``:meth:`~AttentionSVM.fit```) and name some sections with a qualifier ("Attributes (after
fit)"). mkdocstrings shows neither as intended, so this file, without touching the sources, makes

- every role a cross-reference: a link where the target is documented on the site, else inline code. The
  ``SphinxRoles`` griffe extension (mkdocs.yml, mkdocstrings ``extensions``) rewrites each docstring once the package
  is loaded, when each role's scope is known: the target is resolved as Sphinx would (the object's members, its
  parents' scopes and imports, the enclosing modules; a leading ``.`` searches the enclosing packages) and written
  as an optional mkdocs-autorefs reference, which becomes a link if some page documents that object (under any of
  its paths) and plain inline code otherwise. ``~`` shows only the last component, ``title <target>`` the title,
  and functions and methods get ``()`` as in Sphinx;
- a numpy section with a qualified title, such as "Attributes (after fit)", a table like "Attributes" (numpydoc
  knows the plain titles only, so griffe turns the rest into one block of text) that keeps its title;
- the table of contents of an API page lists the public API: entries for names that start with ``_`` (internal
  modules such as ``attsvm.svm._active_set`` and everything in them), which the page still documents, are left
  out, unless the page documents nothing else.

As a mkdocs hook (mkdocs.yml, ``hooks``) the file prunes the tables of contents and, after every page is rendered
but before mkdocs-autorefs resolves the references, turns a role that is left anywhere into inline code with a
warning, which fails the strict build.
"""

from __future__ import annotations

import html
import logging
import re
from typing import Any

from griffe import (
    AliasResolutionError,
    CyclicAliasError,
    DocstringAttribute,
    DocstringSectionAdmonition,
    DocstringSectionAttributes,
    Extension,
    NameResolutionError,
    Object,
)

log = logging.getLogger("mkdocs.hooks.roles")

# the Python-domain roles of Sphinx, with an optional ``py:`` domain: :func:`name`, :py:meth:`~a.b`
ROLES = "func|class|meth|mod|attr|obj|data|exc|const|type"
ROLE = re.compile(rf"(?<![\w`:]):(?:py:)?(?P<role>{ROLES}):`(?P<body>[^`]+)`")
# a role in rendered HTML: the backticks became <code>
RENDERED_ROLE = re.compile(rf":(?:py:)?(?:{ROLES}):<code>(?P<body>.*?)</code>", re.S)
EXPLICIT_TITLE = re.compile(r"(?P<title>.+?)\s*<(?P<target>[^<>]+)>", re.S)
CALLABLE_ROLES = {"func", "meth"}
# numpy section titles griffe understands, followed by a qualifier: "Attributes (after fit)"
QUALIFIED_SECTION = re.compile(r"^(?P<kind>Attributes) \((?P<note>[^)\n]+)\)$")
# one entry of such a section: "name : text", "a_, b_ : text", or "name (text)"
NAMES = re.compile(r"(?P<names>[A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)")
SHAPE = re.compile(r"(?P<type>\([\w ]*(?:,[\w ]*)*\)(?: bool)?)(?=[,:]?\s)")
PACKAGE = "attsvm"


# ---------------------------------------------------------------------------------------------------------------
# griffe extension: rewrite the docstrings once the package is loaded


class SphinxRoles(Extension):
    """Rewrite Sphinx roles into optional cross-references and qualified numpy sections into tables."""

    def on_package(self, *, pkg: Object, **kwargs: Any) -> None:
        for obj in _walk(pkg):
            docstring = obj.docstring
            if docstring is None:
                continue
            docstring.value = ROLE.sub(lambda m, obj=obj: _cross_reference(m, obj), docstring.value)
            _qualified_sections(docstring)


def _walk(obj: Object):
    """The object and every object defined in it (not the names it imports)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)


def _cross_reference(match: re.Match[str], obj: Object) -> str:
    role, body = match["role"], " ".join(match["body"].split())
    title = None
    if explicit := EXPLICIT_TITLE.fullmatch(body):
        title, body = explicit["title"], explicit["target"]
    short = body.startswith("~")
    target = body.lstrip("~!")
    path = resolve(target, obj)
    if title is None:
        title = path if target.startswith(".") and path else target.lstrip(".")
        if short:
            title = title.rsplit(".", 1)[-1]
        if role in CALLABLE_ROLES:
            title += "()"
    code = f"``{title}``" if "`" not in title else html.escape(title)
    if path is None:
        return code
    # mkdocs-autorefs: a link if some page registered the identifier (or one of its aliases), else the title
    return f'<autoref optional identifier="{html.escape(path)}">{code}</autoref>'


def resolve(target: str, obj: Object) -> str | None:
    """The full path of ``target`` as named in the docstring of ``obj``, if the package defines it."""
    candidates = []
    if target.startswith("."):  # relative: the enclosing module, then its packages
        name = target.lstrip(".")
        scope: Object | None = obj.module
        while scope is not None:
            candidates.append(f"{scope.path}.{name}")
            scope = scope.parent
    else:
        head, _, rest = target.partition(".")
        try:  # the object's members, then its parents' scopes (members and imports)
            base = obj.resolve(head)
        except (NameResolutionError, AliasResolutionError, CyclicAliasError):
            pass
        else:
            candidates.append(f"{base}.{rest}" if rest else base)
        candidates.append(target)  # absolute
        scope = obj.module
        while scope is not None:
            candidates.append(f"{scope.path}.{target}")
            scope = scope.parent
    collection = obj.modules_collection
    for path in candidates:
        if not path.startswith(f"{PACKAGE}.") and path != PACKAGE:
            continue
        try:
            collection[path]
        except (KeyError, ValueError, AliasResolutionError, CyclicAliasError):
            continue
        return path
    return None


def _qualified_sections(docstring: Any) -> None:
    """Parse "Attributes (after fit)" as an attributes table that keeps its title."""
    if not any(QUALIFIED_SECTION.match(line) for line in docstring.lines):
        return
    sections = docstring.parse()
    changed = False
    for i, section in enumerate(sections):
        if not isinstance(section, DocstringSectionAdmonition) or not QUALIFIED_SECTION.match(section.title or ""):
            continue
        items = _items(section.value.contents)
        if items:
            sections[i] = DocstringSectionAttributes(items, title=section.title)
            changed = True
    if changed:  # Docstring.parsed is computed once and cached: the templates read this list
        docstring.__dict__["parsed"] = sections


def _items(text: str) -> list[DocstringAttribute]:
    """The entries of a compact numpy list: "name : text" (text may go on, indented), or "a_, b_ (text), c_"."""
    entries: list[list[str]] = []
    for line in text.splitlines():
        if line[:1].isspace() and entries:
            entries[-1].append(line.strip())
        elif line.strip():
            entries.append([line.strip()])
    items = []
    for first, *more in entries:
        head = NAMES.match(first)
        if head is None:
            return []  # not a list of names: leave the section as it is
        rest = first[head.end() :].strip()
        if rest.startswith(":") or not rest:
            description = " ".join([rest.removeprefix(":").strip(), *more]).strip()
            items.append(_attribute(head["names"], description))
        else:  # "a_, b_ (text), c_, d_." : names followed by their parenthesised description
            items += _parenthesised(first, more)
    return items


def _attribute(names: str, description: str) -> DocstringAttribute:
    # a leading shape, "(n, T) bool, the tight constraints", is the entry's type
    shape = SHAPE.match(description)
    if shape is None:
        return DocstringAttribute(name=_names(names), description=description)
    rest = description[shape.end() :].lstrip(",: ")
    return DocstringAttribute(name=_names(names), annotation=shape["type"], description=rest)


def _parenthesised(line: str, more: list[str]) -> list[DocstringAttribute]:
    items, names, i = [], "", 0
    text = " ".join([line, *more]).strip().rstrip(",.")
    while i < len(text):
        if text[i] == "(":
            depth, j = 0, i
            while j < len(text):
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                if depth == 0:
                    break
                j += 1
            items.append(_attribute(names, text[i + 1 : j].strip()))
            names, i = "", j + 1
        else:
            names += text[i]
            i += 1
    if names.strip(" ,."):
        items.append(_attribute(names, ""))
    return items


def _names(names: str) -> str:
    return ", ".join(n.strip() for n in names.split(",") if n.strip())


# ---------------------------------------------------------------------------------------------------------------
# mkdocs hook


def _is_private(anchor: str) -> bool:
    parts = anchor.split(".")
    return parts[0] == PACKAGE and any(p.startswith("_") and not p.startswith("__") for p in parts)


def _public_entries(items: list[Any]) -> int:
    return sum(
        (item.id.startswith(f"{PACKAGE}.") + _public_entries(item.children)) if not _is_private(item.id) else 0
        for item in items
    )


def _prune(items: list[Any]) -> None:
    items[:] = [item for item in items if not _is_private(item.id)]
    for item in items:
        _prune(item.children)


def on_page_content(html_: str, page: Any, **kwargs: Any) -> str:
    """Leave internal names out of an API page's table of contents (the page still documents them)."""
    # a page about an internal module only (the optional-dependencies page) keeps its entries
    if page.file.src_uri.startswith("api/") and page.toc is not None and _public_entries(page.toc.items):
        _prune(page.toc.items)
    return html_


def on_env(env: Any, *, config: Any, files: Any, **kwargs: Any) -> Any:
    """Runs before mkdocs-autorefs resolves references: no role may reach a reader as raw text."""
    for file in files:
        page = file.page
        if page is None or not page.content:
            continue
        found = RENDERED_ROLE.findall(page.content)
        if found:
            log.warning(f"{file.src_uri}: Sphinx roles left in the rendered page: {', '.join(sorted(set(found)))}")
            page.content = RENDERED_ROLE.sub(r"<code>\g<body></code>", page.content)
    return env
