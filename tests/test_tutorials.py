"""The tutorials of the documentation site (docs/tutorials/*.ipynb) run from top to bottom and show what they teach.

Each notebook is executed in a fresh kernel by nbclient, as mkdocs-jupyter executes it when the site is built. A probe
cell appended to the copy that runs prints the notebook's own results as JSON, so a test fails when the feature a
tutorial demonstrates breaks (a status that is no longer "optimal", a cache that no longer holds its budget), not only
when a cell raises. The notebooks are committed without outputs: the site's build runs them.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebooks run with nbclient (mkdocs-jupyter's dependencies)")
nbclient = pytest.importorskip("nbclient", reason="the notebooks run with nbclient (mkdocs-jupyter's dependencies)")
pytest.importorskip("ipykernel", reason="the notebooks need a Python kernel (ipykernel)")

# two kernels that import torch and transformers: about 20 s on an idle core, more on a loaded machine (the site's
# build executes the same notebooks, and fails on an error in them)
pytestmark = pytest.mark.slow

TUTORIALS = Path(__file__).resolve().parents[1] / "docs" / "tutorials"
PROBE = "TUTORIAL-PROBE "


def _execute(name: str, probe: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, str, dict[str, Any]]:
    """Run the notebook ``name`` with ``probe`` (a Python expression over its variables) appended; return the
    executed notebook, the text of all its stream outputs and the probe's value."""
    nb = nbformat.read(TUTORIALS / name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{name} has no code cells"
    assert not any(c.outputs or c.execution_count for c in code), (
        f"{name} is committed with outputs: clear them (the site's build executes the notebook)"
    )
    nb.cells.append(
        nbformat.v4.new_code_cell(f"import json as _json, sys as _sys\nprint({PROBE!r} + _json.dumps({probe}))")
    )
    monkeypatch.delenv("MPLBACKEND", raising=False)  # (the kernel's inline backend turns figures into PNG outputs)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(TUTORIALS)}}
    )
    client.execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    found = re.findall(rf"^{PROBE}(.*)$", text, flags=re.M)
    assert len(found) == 1, "the probe cell printed nothing"
    result = json.loads(found[0])
    assert result.pop("prefix") == sys.prefix, "the kernel runs another Python than the tests' (kernelspec python3)"
    return nb, text, result


def _outputs(nb: Any, output_type: str) -> list[Any]:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == output_type]


def test_theory_in_five_minutes(monkeypatch):
    """Both SVMs certified optimal, W → W_mm and (K, Q) → W*_mm for every run, and one labelled figure."""
    probe = """{
        "prefix": _sys.prefix,
        "status": [fro.status_, nuc.status_],
        "ranks": [int(fro.rank_), int(nuc.rank_)],
        "kinds": [
            convergence_type(problem, W, norm=n).kind for r, n in ((train_W, "fro"), (train_KQ, "nuc")) for W in r.W
        ],
        "final": {f"{p} {t}": c[:, -1].tolist() for (p, t), c in paths.items()},
        "labels": [ax.get_xlabel(), ax.get_ylabel()],
        "legends": [len(a.get_legend().get_texts()) for a in fig.axes if a.get_legend() is not None]
        + [len(fig.legends)],
    }"""
    nb, text, res = _execute("theory-in-five-minutes.ipynb", probe, monkeypatch)
    assert text.count("status optimal") == 2, "summary() of both SVMs reports status optimal"
    assert res["status"] == ["optimal", "optimal"]
    assert res["ranks"][1] <= res["ranks"][0] <= 6  # rank(W*_mm) ≤ rank(W_mm) ≤ n
    assert res["kinds"] == ["global"] * 8
    final = res["final"]
    assert min(final["W W_mm"]) > 0.99 and min(final["KQ W*_mm"]) > 0.99  # each follows its own SVM
    assert max(final["W W*_mm"]) < 0.95 and max(final["KQ W_mm"]) < 0.95  # and not the other one
    assert all(res["labels"]), "the figure's axes are labelled"
    assert res["legends"] == [4, 0], "one legend, with an entry per (parameterisation, SVM)"
    images = [o for o in _outputs(nb, "display_data") if "image/png" in o.data]
    assert len(images) == 1, "the notebook shows its figure"
    assert not _outputs(nb, "error")


def test_kv_eviction_by_margins(monkeypatch):
    """EvictionCache holds its budget in every layer during generate, the window's logits are the model's, and the
    kv_scores rules keep compute_n_kept keys with the protected ones; the kvpress snippet names real presses."""
    pytest.importorskip("transformers", reason="the tutorial builds a tiny random Llama with transformers")
    probe = """{
        "prefix": _sys.prefix,
        "policy": cache.policy.name,
        "budget": budget,
        "stored": stored,
        "per_head": [list(layer.keys.shape[1:3]) for layer in cache.layers],
        "margins_ok": all(bool((layer.stats >= 0).all()) for layer in cache.layers),
        "seen": cache.get_seq_length(),
        "prompt": prompt.shape[1],
        "generated": out.shape[1] - prompt.shape[1],
        "evicted": cache.n_evicted,
        "gap": gap,
        "unsolved": info["unsolved"],
        "n_kept": n_kept,
        "N": N,
        "w": w,
        "kept": {k: v[0].tolist() for k, v in kept.items()},
        "margin_max": float(margin.max()),
    }"""
    nb, text, res = _execute("kv-eviction-by-margins.ipynb", probe, monkeypatch)
    budget = res["budget"]
    assert res["policy"] == "svm_margin"
    assert res["stored"] == [budget] * len(res["stored"]) and len(res["stored"]) == 2
    assert f"keys stored per layer: {res['stored']}" in text
    assert all(shape == [2, budget] for shape in res["per_head"]), "every KV head keeps budget keys"
    assert res["margins_ok"]
    assert res["seen"] == res["prompt"] + res["generated"] - 1  # generate never computes the last token's key
    assert res["evicted"] == len(res["stored"]) * (res["seen"] - budget)
    assert res["gap"] < 1e-5, "the recomputed window logits are the model's attention"
    assert res["unsolved"] == 0
    assert res["margin_max"] <= 0.0  # the margin rule's keep-score is minus a margin
    assert res["n_kept"] == res["N"] // 2
    protected = {*range(4), *range(res["N"] - res["w"], res["N"])}
    for name, keys in res["kept"].items():
        for head in keys:
            assert len(head) == res["n_kept"] and protected <= set(head), name
    assert not _outputs(nb, "error")

    # the kvpress part is a markdown code block (kvpress lives in its own environment): valid Python naming real names
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    blocks = re.findall(r"```python\n(.*?)```", markdown, flags=re.S)
    assert len(blocks) == 1
    tree = ast.parse(blocks[0])
    imported = {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for a in node.names}
    from attsvm.integrations.kvpress import PRESSES

    assert {"HybridPress", "SVMarginPress", "SVMSupportPress"} <= imported & set(PRESSES)
    import attsvm.analysis

    assert callable(attsvm.analysis.load_model)
