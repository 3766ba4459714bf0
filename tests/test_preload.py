"""The compiled kernels load in the background from ``import attsvm.svm``: a process's first ``fit_many`` finds them
loaded, and its answers are the ones later calls give."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("numba")

CHILD = r"""
import json, sys, time
import numpy as np
from attsvm.svm import batch
from attsvm.datasets import paper_instance
preloading = batch._preload_thread is not None
batch.wait_preload()
loaded = {}
if "attsvm.svm._active_set" in sys.modules:
    k = sys.modules["attsvm.svm._active_set"]
    loaded = {f: len(getattr(k, f).overloads) for f in ("_solve_claimed", "_publish", "_chunks_done")}
from attsvm.svm import AttentionSVM
probs = [paper_instance(4, 5, 6, seed=s) for s in range(40)]
first = AttentionSVM().fit_many(probs)
again = AttentionSVM().fit_many(probs)
same = all(np.array_equal(a.W_, b.W_) and np.array_equal(a.dual_coef_, b.dual_coef_) for a, b in zip(first, again))
print(json.dumps({"preloading": preloading, "loaded": loaded, "same": same,
                  "path": first[0].info_.get("path")}))
"""


def _child(**env: str) -> dict:
    e = dict(os.environ, OMP_NUM_THREADS="1", **env)
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=e, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_solvers_loads_every_kernel_the_batch_calls_before_any_fit() -> None:
    r = _child()
    assert r["preloading"] and r["loaded"] == {"_solve_claimed": 1, "_publish": 1, "_chunks_done": 1}
    assert r["same"] and r["path"] == "batched-active-set"


def test_attsvm_preload_0_leaves_the_kernels_to_the_first_call() -> None:
    r = _child(ATTSVM_PRELOAD="0")
    assert not r["preloading"] and r["loaded"] == {}
    assert r["same"] and r["path"] == "batched-active-set"


def test_a_fork_right_after_the_import_waits_for_the_load() -> None:
    """The child of a fork made at once inherits the loaded kernels (the fork waited), never half a load."""
    code = (
        "import os, sys\nfrom attsvm.svm import batch\npid = os.fork()\n"
        "if pid == 0:\n    k = sys.modules.get('attsvm.svm._active_set')\n"
        "    os._exit(0 if k is not None and len(k._solve_claimed.overloads) == 1 else 3)\n"
        "_, status = os.waitpid(pid, 0)\nsys.exit(os.waitstatus_to_exitcode(status))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, OMP_NUM_THREADS="1"), check=False)
    assert out.returncode == 0
