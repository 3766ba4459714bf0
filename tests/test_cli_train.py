"""``attsvm train``: summary, saved trajectories and argument errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attsvm.cli import main
from attsvm.datasets import paper_instance
from attsvm.train import train


def test_train_command_summary_and_json(tmp_path, capsys):
    out = tmp_path / "traj.json"
    rc = main(["train", "--runs", "2", "--seed", "0", "--steps", "2000", "--record-every", "500", "--save", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "trained 2 run(s): param=W steps=2000 normalized GD" in text
    assert "convergence types (docs/spec.md §4, tau=0.99): global: 2" in text
    data = json.loads(out.read_text())
    assert data["settings"]["param"] == "W" and data["settings"]["seeds"] == [0, 1]
    np.testing.assert_array_equal(data["history"]["step"], [0, 500, 1000, 1500, 2000])
    assert np.array(data["history"]["W"]).shape == (2, 5, 10, 10)
    # the saved run is the library's run
    ref = train([paper_instance(6, 8, 10, seed=s) for s in (0, 1)], steps=2000, seed=[0, 1])
    np.testing.assert_allclose(np.array(data["W"]), ref.W, atol=1e-12)
    assert data["summary"][0]["selected"] == ref.selected[0].tolist()
    assert data["summary"][0]["kind"] == "global" and data["summary"][0]["corr_fro"] >= 0.99


def test_train_command_kq_relu_npz(tmp_path, capsys):
    out = tmp_path / "traj.npz"
    rc = main(
        [
            "train",
            "--param",
            "KQ",
            "--m",
            "4",
            "--head",
            "relu",
            "--n",
            "3",
            "--T",
            "4",
            "--d",
            "6",
            "--steps",
            "300",
            "--record-every",
            "100",
            "--plain",
            "--lr",
            "0.5",
            "--save",
            str(out),
        ]
    )
    assert rc == 0
    assert "param=KQ steps=300 plain GD" in capsys.readouterr().out
    with np.load(out) as f:
        assert f["K"].shape == (1, 6, 4) and f["history/loss"].shape == (1, 4)
        assert str(f["param"]) == "KQ"


def test_train_command_multiclass_reports_equivalence(capsys):
    rc = main(
        ["train", "--head", "multiclass", "--n", "4", "--T", "5", "--d", "6", "--steps", "500", "--init", "zeros"]
    )
    assert rc == 0
    assert "corr(W, W^eq)=" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["train", "--runs", "0"], "--runs must be >= 1"),
        (["train", "--steps", "-3", "--no-svm"], "steps must be >= 0"),
        (["train", "--param", "KQ", "--init", "zeros", "--no-svm"], "stationary point"),
    ],
)
def test_train_command_errors(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_train_command_bad_lr(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--lr", "fast"])
    assert "--lr must be 'auto' or a positive number" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [["--head", "relu"], ["--head", "multiclass", "--self-attention"]])
def test_train_command_before_attention_is_selective(capsys, extra):
    # 3 steps: every O_i is the whole sequence, so W^eq = 0 and corr(W, W^eq) is undefined
    rc = main(["train", "--steps", "3", *extra])
    assert rc == 0
    out = capsys.readouterr().out
    assert "|O_i|=[8, 8, 8, 8, 8, 8] corr(W, W^eq)=n/a (not selective yet)" in out
