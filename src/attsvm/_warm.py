"""Compile every numba kernel now: ``python -m attsvm._warm`` (``make install`` runs it).

The kernels — the batched solvers' (:mod:`attsvm.svm.batch`'s dual active set and
:mod:`attsvm.svm.batch_nuclear`'s interior point, about 40 s of one core each) and the span training
loop's (:mod:`attsvm.training.span`, about 7 s) — are compiled on first use and cached next to their
sources (``cache=True``). Compiling them once at install time keeps that cost out of the first experiment, whose
process-pool workers would otherwise each compile them at the same time. Without numba (or with
``ATTSVM_COMPILED=0``) there is nothing to compile and this does nothing.
"""

from __future__ import annotations

import time

import numpy as np

__all__ = ["compile_all", "compile_solvers"]


def compile_solvers() -> bool:
    """Solve a tiny stack with each compiled solver (the Frobenius batch's dual active set, the nuclear
    batch's interior point); whether numba is there."""
    from .problem import AttentionProblem
    from .svm import AttentionSVM, batch

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


def compile_all() -> bool:
    """Run each compiled kernel once on a tiny problem; whether numba is there."""
    from .problem import AttentionProblem, Head
    from .training import train
    from .training.span import compiled

    done = compile_solvers()
    if compiled() is None:
        return done
    rng = np.random.default_rng(0)
    X, V, Z = rng.normal(size=(2, 3, 4)), rng.normal(size=(4, 4)), rng.normal(size=(2, 4))
    train(AttentionProblem(X, np.array([1.0, -1.0]), Head.relu(V), Z=Z), steps=2, space="span", progress=False)
    return True


if __name__ == "__main__":
    t0 = time.perf_counter()
    done = compile_all()
    print(f"attsvm: numba kernels {'compiled' if done else 'not used (no numba)'} in {time.perf_counter() - t0:.1f} s")
