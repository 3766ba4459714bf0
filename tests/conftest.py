"""Shared fixtures and settings for the attsvm test suite."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# never read or write the user's model cache (~/.cache/attsvm) from tests
import atexit
import shutil
import tempfile

_CACHE = tempfile.mkdtemp(prefix="attsvm-test-cache-")
os.environ["ATTSVM_CACHE"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)

import numpy as np
import pytest

try:  # tiny tensors: one intra-op thread is far faster on a loaded 2-core machine
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover
    pass


# The longest files first: under `pytest -n 2 --dist loadfile --no-loadscope-reorder` (make test) the workers take
# whole files in collection order, and a long file taken last keeps one worker busy while the other has finished
_LONG_FILES = (
    "test_experiments.py",
    "test_sweep_integrity.py",
    "test_sweep.py",
    "test_phase.py",
    "test_figure_style.py",
    "test_gemma_analyze.py",
    "test_kv_compare.py",
    "test_cli_polish.py",
    "test_analysis_cli.py",
    "test_claims_gemma.py",
    "test_cli_options.py",
    "test_bad_input_experiments.py",
    "test_kv_layouts.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(_LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # (stable: the rest keep their order)


@pytest.fixture(scope="session")
def tiny_lm_folder(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The tiny test LM (``TINY_LM``, about 12 s to train), trained once per test session: under pytest-xdist
    the workers share it (their temporary folders have a common parent; a file lock lets one of them train).
    Tests read it and never write into it."""
    pytest.importorskip("transformers")
    from filelock import FileLock

    from attsvm.analysis.lm import TINY_LM, train_lm

    base = tmp_path_factory.getbasetemp()
    root = base if worker_id == "master" else base.parent  # (the parent: this session's, shared by its workers)
    with FileLock(str(root / "tiny-lm.lock")):
        return train_lm(root / "tiny-lm", TINY_LM)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


@pytest.fixture
def cli_exit() -> Callable[[list[str]], int]:
    """``main(argv)``'s exit code, whether returned or raised by argparse as SystemExit."""
    from attsvm.cli import main

    def run(argv: list[str]) -> int:
        try:
            return main(argv)
        except SystemExit as exc:
            return int(exc.code or 0)

    return run
