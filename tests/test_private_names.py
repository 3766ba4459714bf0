"""Private stays private: across the package, a ``_name`` is imported only by the modules of its own package
(the same folder), and a ``_module`` only by its own package and the packages below it. Tests may reach
anything; the library may not (a private name is free to change without notice to any other package)."""

from __future__ import annotations

import ast
from pathlib import Path

import attsvm

SRC = Path(attsvm.__file__).parent


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def _module_of(path: Path, root: Path) -> tuple[str, str]:
    """(module, package) of a file: ``attsvm.svm.batch`` in ``attsvm.svm``; a package's ``__init__`` is its
    package."""
    parts = ("attsvm", *path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def _is_package(module: str, root: Path) -> bool:
    return (root.parent / module.replace(".", "/") / "__init__.py").exists()


def violations(root: Path = SRC) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        _, package = _module_of(path, root)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
                continue
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if not source.startswith("attsvm"):
                continue
            parts = source.split(".")
            where = f"{path.relative_to(root.parent)}:{node.lineno}"
            private_parts = [i for i, p in enumerate(parts) if _private(p)]
            if private_parts:  # a private module: its own package and those below it
                owner = ".".join(parts[: private_parts[0]])
                if package != owner and not package.startswith(owner + "."):
                    found.append(f"{where} imports the private module {source}")
            home = source if _is_package(source, root) else ".".join(parts[:-1])
            for alias in node.names:
                if _private(alias.name) and package != home:
                    found.append(f"{where} imports the private name {alias.name} of {source}")
    return found


def test_no_private_name_or_module_is_imported_from_another_package():
    assert violations() == []


def test_the_check_finds_each_kind_of_crossing(tmp_path):
    # the check on a small tree of its own: each rule found, and what is allowed passes
    pkg = tmp_path / "attsvm"
    for d in ("svm", "cli"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "_helpers.py").write_text("")
    (pkg / "tokens.py").write_text("")
    (pkg / "svm" / "_kernels.py").write_text("")
    (pkg / "svm" / "batch.py").write_text(
        "from .._helpers import check\nfrom ._kernels import _fast\nfrom ..tokens import _rows_fast\n"
    )
    (pkg / "cli" / "main.py").write_text("from ..svm._kernels import solve\nfrom attsvm.svm.batch import _prep\n")
    found = violations(pkg)
    assert len(found) == 3, found
    assert any("private name _rows_fast of attsvm.tokens" in f for f in found)
    assert any("private module attsvm.svm._kernels" in f and "cli" in f for f in found)
    assert any("private name _prep of attsvm.svm.batch" in f for f in found)
