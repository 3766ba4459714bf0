"""Shared fixtures and settings for the attsvm test suite."""

from __future__ import annotations

import os
from collections.abc import Callable

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
