"""``attsvm solve`` end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attsvm.cli import main
from attsvm.datasets import paper_instance
from attsvm.svm import AttentionSVM


def test_solve_generated_instance_writes_json(tmp_path, capsys):
    out = tmp_path / "res" / "fro.json"
    rc = main(["solve", "--n", "6", "--T", "8", "--d", "10", "--seed", "2", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    for word in ("status optimal", "objective", "support", "violation", "duality gap", "time", "wrote"):
        assert word in text
    data = json.loads(out.read_text())
    assert data["instance"] == {
        "recipe": "paper_instance",
        "n": 6,
        "T": 8,
        "d": 10,
        "seed": 2,
        "self_attention": False,
        "query_index": None,
    }
    ref = AttentionSVM().fit(paper_instance(6, 8, 10, seed=2))
    res = data["result"]
    assert res["status"] == "optimal" and res["objective"] == pytest.approx(ref.objective_, rel=1e-12)
    np.testing.assert_allclose(np.array(res["W"]), ref.W_, atol=1e-12)
    assert res["n_support"] == int(ref.support_.sum())


def test_solve_npz_input_nuclear_self_attention(tmp_path, capsys):
    path = tmp_path / "inst.npz"
    p = paper_instance(5, 4, 8, seed=1, self_attention=True, query_index=0)
    p.to_npz(path)
    out = tmp_path / "nuc.json"
    rc = main(["solve", "--input", str(path), "--norm", "nuc", "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())["result"]
    assert res["params"]["norm"] == "nuc" and res["max_violation"] <= 1e-8
    assert "nuclear norm" in capsys.readouterr().out


def test_solve_infeasible_and_tokens(capsys, tmp_path):
    out = tmp_path / "inf.json"
    rc = main(["solve", "--d", "3", "--seed", "1", "--tokens", "5,6,7,6,3,7", "--json", str(out)])
    assert rc == 0
    assert "status infeasible" in capsys.readouterr().out
    res = json.loads(out.read_text())["result"]
    assert res["status"] == "infeasible" and res["W"] is None
    assert res["tokens"] == [5, 6, 7, 6, 3, 7] and np.sum(res["certificate"]) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "argv,match",
    [
        (["solve", "--norm", "fro", "--rank", "2"], "rank=2 is only defined for norm='nuc'"),
        (["solve", "--tokens", "1,x"], "--tokens must be comma-separated integers"),
        (["solve", "--tokens", "1,2"], "tokens must hold one token index per sequence"),
        (["solve", "--input", "/nonexistent/x.npz"], "does not exist"),
        (["solve", "--n", "0"], "n must be >= 1"),
    ],
)
def test_solve_bad_arguments(argv, match, capsys):
    assert main(argv) == 2
    assert match in capsys.readouterr().err
