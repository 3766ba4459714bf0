"""The layers of ``attsvm.model``: each module imports only the layers before it, and the package keeps
every public name importable from ``attsvm.model``."""

from __future__ import annotations

import ast
from pathlib import Path

import attsvm.model

LAYERS = ("checks", "batch", "attention", "parameterizations", "module")
PACKAGE = Path(attsvm.model.__file__).parent


def _model_imports(path: Path) -> set[str]:
    """The sibling modules of ``attsvm.model`` that the file at ``path`` imports."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_every_layer_imports_only_the_layers_before_it():
    assert sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__") == sorted(LAYERS)
    for j, name in enumerate(LAYERS):
        imported = _model_imports(PACKAGE / f"{name}.py")
        assert imported <= set(LAYERS[:j]), (name, imported)


def test_the_package_exports_the_names_of_its_layers():
    for name in attsvm.model.__all__:
        obj = getattr(attsvm.model, name)
        home = getattr(obj, "__module__", None)
        if isinstance(home, str) and home.startswith("attsvm.model."):
            assert home.rsplit(".", 1)[1] in LAYERS
    for name in ("Batch", "AttentionModel", "FullW", "FactoredKQ", "risk_and_grad", "check_device"):
        assert name in attsvm.model.__all__
