"""Compile the numba kernels of docs/spec.md §3's batched solvers now: ``python -m attsvm.svm._warm``
(``make install`` runs :mod:`attsvm._warm`, which calls this and compiles the training kernel too).

The compiled routes (:mod:`._active_set` for the Frobenius batch, :mod:`._sdp_compiled` for the
nuclear interior point) are compiled on first use and cached next to their sources (``cache=True``):
about 8 s and 15 s on 2 cores. Compiling them once at install time keeps that cost out of the first
experiment, whose process-pool workers would otherwise each compile them at the same time. Without
numba (or with ``ATTSVM_COMPILED=0``) there is nothing to compile and this does nothing.
"""

from __future__ import annotations

import time

import numpy as np

from ..problem import AttentionProblem
from . import batch
from .estimator import AttentionSVM

__all__ = ["compile_kernels"]


def compile_kernels() -> bool:
    """Solve a tiny stack with each compiled kernel (docstring of the module); whether numba is there."""
    if batch.compiled() is None:
        return False
    rng = np.random.default_rng(0)
    probs = [
        AttentionProblem(rng.normal(size=(3, 4, 5)), np.ones(3), rng.normal(size=5), Z=rng.normal(size=(3, 5)))
        for _ in range(2)
    ]
    for norm in ("fro", "nuc"):
        AttentionSVM(norm).fit_many(probs)
    return True


if __name__ == "__main__":
    t0 = time.perf_counter()
    done = compile_kernels()
    print(f"attsvm: numba kernels {'compiled' if done else 'not used (no numba)'} in {time.perf_counter() - t0:.1f} s")
