"""The import graph of attsvm.svm: no circle, and the estimator on top of the array-level modules.

Every import of a sibling module counts, wherever it is written: at the top of the file, inside a
function (a lazy import still makes the module depend on the other) and under ``if TYPE_CHECKING:``
(an annotation still makes a reader follow it). ``from . import name`` of a name that is not a module
counts as an import of the package's ``__init__``."""

from __future__ import annotations

import ast
from pathlib import Path

import attsvm.svm

SVM = Path(attsvm.svm.__file__).parent
# the modules above the estimator: they build AttentionSVM objects for their own users
ABOVE_THE_ESTIMATOR = {"__init__", "equivalence", "graph", "local", "prompt"}


def _modules() -> set[str]:
    return {p.stem for p in SVM.glob("*.py")}


def _imports(name: str, modules: set[str]) -> set[str]:
    """The sibling modules that svm/<name>.py imports, anywhere in the file."""
    tree = ast.parse((SVM / f"{name}.py").read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[:2] == ["attsvm", "svm"]:
                    out.add(parts[2] if len(parts) > 2 else "__init__")
        elif isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".") if node.module else []
            if node.level == 1:  # from . / from .x
                base = parts
            elif node.level == 2 and parts[:1] == ["svm"]:  # from ..svm / from ..svm.x
                base = parts[1:]
            elif node.level == 0 and parts[:2] == ["attsvm", "svm"]:
                base = parts[2:]
            else:
                continue
            if base:
                out.add(base[0])
            else:  # from . import a, b: modules, or names of the package
                out.update(a.name if a.name in modules else "__init__" for a in node.names)
    return (out & modules) - {name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(m, modules) for m in sorted(modules)}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle of imports, or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return [*path[path.index(n) :], n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return None

    for m in graph:
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_the_parser_sees_every_kind_of_import():
    graph = _graph()
    assert "_fitted" in graph["estimator"]  # a function-level `from . import _fitted`
    assert "batch" in graph["_sdp"]  # a function-level `from . import batch`
    assert {"batch", "_base", "_factored", "_sdp", "certificate", "nuclear"} <= graph["batch_nuclear"]
    assert "estimator" in graph["__init__"]


def test_svm_has_no_import_circle():
    cycle = _cycle(_graph())
    assert cycle is None, "import circle in attsvm.svm: " + " -> ".join(cycle or [])


def test_only_the_estimator_builds_estimators_from_arrays():
    graph = _graph()
    assert {m for m, deps in graph.items() if "_fitted" in deps} == {"estimator"}


def test_only_the_modules_above_it_import_the_estimator():
    graph = _graph()
    users = {m for m, deps in graph.items() if "estimator" in deps}
    assert users <= ABOVE_THE_ESTIMATOR, sorted(users - ABOVE_THE_ESTIMATOR)
    # and nothing the estimator stands on reaches back up to it
    below: set[str] = set()
    todo = ["estimator"]
    while todo:
        for n in graph[todo.pop()]:
            if n not in below:
                below.add(n)
                todo.append(n)
    assert "estimator" not in below
    assert not below & ABOVE_THE_ESTIMATOR, sorted(below & ABOVE_THE_ESTIMATOR)


def test_the_array_level_routes_take_no_estimator():
    # batch, batch_nuclear and stack read FitSettings and return arrays: neither module above them is imported
    graph = _graph()
    for m in ("batch", "batch_nuclear", "stack", "_active_set", "_sdp"):
        assert not graph[m] & {"estimator", "_fitted"}, m
