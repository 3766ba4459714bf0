"""Compile every numba kernel now: ``python -m attsvm._warm`` (``make install`` runs it).

The kernels — the batched solvers' (:mod:`attsvm.svm.batch`'s dual active set and
:mod:`attsvm.svm.batch_nuclear`'s interior point, 22–25 s of one core each) and the span training
loop's (:mod:`attsvm.training.span`, about 8 s; each with its imports) — are compiled on first use and
cached next to their sources (``cache=True``). Compiling them once at install time keeps that cost out of
the first experiment, whose process-pool workers would otherwise each compile them at the same time.
Without numba (or with ``ATTSVM_COMPILED=0``) there is nothing to compile and this does nothing.

Run as a module, it compiles the three groups in three processes at once (each group's kernels are their own
functions, cached in their own files), so that a machine with a free core spends the time of the longest group
only; ``--serial`` compiles them one after the other in this process.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Literal

import numpy as np

__all__ = ["compile_all", "compile_solvers", "compile_span", "PARTS"]


def _tiny_problems() -> list:
    from .problem import AttentionProblem

    rng = np.random.default_rng(0)
    return [
        AttentionProblem(rng.normal(size=(3, 4, 5)), np.ones(3), rng.normal(size=5), Z=rng.normal(size=(3, 5)))
        for _ in range(2)
    ]


def compile_solvers(norms: tuple[Literal["fro", "nuc"], ...] = ("fro", "nuc")) -> bool:
    """Solve a tiny stack with each compiled solver of ``norms`` (the Frobenius batch's dual active set, the
    nuclear batch's interior point); whether numba is there."""
    from .svm import AttentionSVM, batch

    if batch.compiled() is None:
        return False
    probs = _tiny_problems()
    for norm in norms:
        AttentionSVM(norm).fit_many(probs)
    return True


def compile_span() -> bool:
    """Train a tiny problem in the span form (the compiled span training loop); whether numba is there."""
    from .problem import AttentionProblem, Head
    from .training import train
    from .training.span import compiled

    if compiled() is None:
        return False
    rng = np.random.default_rng(0)
    X, V, Z = rng.normal(size=(2, 3, 4)), rng.normal(size=(4, 4)), rng.normal(size=(2, 4))
    train(AttentionProblem(X, np.array([1.0, -1.0]), Head.relu(V), Z=Z), steps=2, space="span", progress=False)
    return True


def compile_all() -> bool:
    """Run each compiled kernel once on a tiny problem, in this process; whether numba is there."""
    done = compile_solvers()
    return compile_span() or done


# the groups compiled by `python -m attsvm._warm`, one process each
PARTS = {
    "frobenius": lambda: compile_solvers(("fro",)),
    "nuclear": lambda: compile_solvers(("nuc",)),
    "span": compile_span,
}


def _compile_parallel() -> bool:
    """Each of :data:`PARTS` in a process of its own, all at once; whether numba is there. A part that fails
    ends this with a SystemExit naming it and its exit status (its error is on stderr already)."""
    # (no background preload in the parts: each would load, or compile, the Frobenius kernels too)
    env = dict(os.environ, ATTSVM_PRELOAD="0")
    procs = {name: subprocess.Popen([sys.executable, "-m", "attsvm._warm", "--part", name], env=env) for name in PARTS}
    codes = {name: proc.wait() for name, proc in procs.items()}
    for name, code in codes.items():
        if code not in (0, 3):
            raise SystemExit(f"attsvm: compiling the {name} kernels failed (exit status {code})")
    return any(code == 0 for code in codes.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attsvm._warm", description="compile every numba kernel now")
    parser.add_argument("--serial", action="store_true", help="one group after the other, in this process")
    parser.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.part:  # (exit status 3: numba is not there)
        return 0 if PARTS[args.part]() else 3
    t0 = time.perf_counter()
    done = compile_all() if args.serial or (os.cpu_count() or 1) < 2 else _compile_parallel()
    print(f"attsvm: numba kernels {'compiled' if done else 'not used (no numba)'} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
