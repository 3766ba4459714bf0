"""One record convention for every trainer, and the trainers that step by the update-rule chain."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attsvm import train
from attsvm.datasets import hop_instance, mlp_head, paper_instance
from attsvm.model import Batch, head_outputs, sequence_losses
from attsvm.ntp import random_ntp_problem
from attsvm.problem import AttentionProblem
from attsvm.prompt import random_prompt_problem
from attsvm.training import optim
from attsvm.training.depth import deep_forward, train_deep
from attsvm.training.head import train_with_head
from attsvm.training.joint import train_joint
from attsvm.training.ntp import train_ntp
from attsvm.training.prompt import train_prompt
from attsvm.training.recording import Trajectory, record_steps


def test_trajectory_stores_rows_at_the_record_steps():
    rec = Trajectory(7, 3, runs=2)
    np.testing.assert_array_equal(rec.steps, [0, 3, 6, 7])
    seen = []
    for k in range(8):
        if k == rec.next_step:
            seen.append(k)
            rec.record(loss=np.full(2, float(k)), sel=np.full((2, 3), k, dtype=np.int64))
    assert seen == [0, 3, 6, 7] and rec.next_step == -1
    h = rec.history()
    assert list(h) == ["step", "loss", "sel"]
    assert h["loss"].dtype == np.float64 and h["sel"].dtype == np.int64 and h["sel"].shape == (2, 4, 3)
    np.testing.assert_array_equal(h["loss"][1], [0.0, 3.0, 6.0, 7.0])
    np.testing.assert_array_equal(Trajectory(0, 5, runs=1).steps, [0])
    with pytest.raises(ValueError, match="every must be >= 1"):
        Trajectory(3, 0, runs=1)
    with pytest.raises(ValueError, match="runs must be >= 1"):
        Trajectory(3, 1, runs=0)


def _mlp_problem(seed: int) -> AttentionProblem:
    rng = np.random.default_rng(seed)
    h = mlp_head(5, width=4, depth=2, activation="gelu", seed=rng)
    return AttentionProblem(rng.standard_normal((3, 4, 5)), [1.0, -1.0, 1.0], h, Z=rng.standard_normal((3, 5)))


TRAINERS = {
    "train": lambda kw: train([paper_instance(3, 4, 5, seed=s) for s in (0, 1)], **kw),
    "deep": lambda kw: train_deep([paper_instance(3, 4, 5, seed=s) for s in (0, 1)], layers=2, seed=[0, 1], **kw),
    "head": lambda kw: train_with_head([_mlp_problem(s) for s in (0, 1)], seed=[0, 1], **kw),
    "joint": lambda kw: train_joint([paper_instance(3, 4, 5, seed=s) for s in (0, 1)], p=3.0, **kw),
    "prompt": lambda kw: train_prompt([random_prompt_problem(4, 5, 3, seed=s) for s in (0, 1)], **kw),
    "ntp": lambda kw: train_ntp([random_ntp_problem(6, 4, 5, 6, seed=s) for s in (0, 1)], **kw),
}


@pytest.mark.parametrize("name", list(TRAINERS))
def test_every_trainer_records_the_same_steps_with_one_row_per_run(name):
    res = TRAINERS[name]({"steps": 7, "record_every": 3})
    h = res.history
    assert next(iter(h)) == "step"
    np.testing.assert_array_equal(h["step"], record_steps(7, 3))
    for key, value in h.items():
        if key != "step":
            assert value.shape[:2] == (2, 4), (key, value.shape)


def test_train_deep_steps_by_normalized_gd_of_the_chain():
    """One step of train_deep is ``W + normalized_gd(lr, eps=0)`` on the autograd gradient of the risk."""
    p = hop_instance(8, 2, 8, seed=0).problem
    W0 = {0: 0.3 * np.eye(8), 1: np.ones((8, 8)) / 8}
    res = train_deep(p, layers=2, steps=1, lr=0.05, init=W0, record_every=1)
    batch = Batch.from_problems([p])
    Ws = [torch.tensor(W0[ell])[None].requires_grad_(True) for ell in (0, 1)]
    o, _, _ = deep_forward(batch.X, batch.Z, Ws)
    L = sequence_losses(batch, head_outputs(batch, o)).mean(-1)
    grads = tuple(g.contiguous() for g in torch.autograd.grad(L.sum(), Ws))
    rule = optim.normalized_gd(0.05, eps=0.0)
    params = tuple(W.detach() for W in Ws)
    upd, _ = rule.update(grads, rule.init(params), params, loss=L.detach(), step=0)
    want = np.stack([(W + u).numpy()[0] for W, u in zip(params, upd)])
    np.testing.assert_array_equal(res.W[0], want)
    assert not np.array_equal(want, np.stack([W0[0], W0[1]]))
