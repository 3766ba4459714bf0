"""Per-run training loops written the way the published notebooks are, for the experiments whose authors'
code trains one configuration at a time (used by ``bench_experiments.py``).

Each loop builds a torch module per run, computes the loss, calls ``backward()``, rescales the gradient
as the rule asks (normalised GD: ``g/‖g‖``; Polyak: ``(L − L*)/‖g‖²``) and takes a
``torch.optim.SGD`` step, recording the iterate — the structure of ``joint_training.ipynb`` /
``diff_loss_function.ipynb`` (max-margin token selection), ``local_converge.ipynb`` (TFasSVM, the
template for the rates runs, whose authors released no code), the next-token-prediction notebooks and
``multi_token_converge.ipynb`` (svm-eq, for svm-eq-mlp and, layer by layer, hierarchy).
All loops run in float64 (as attsvm does), with one intra-op thread. Only training is timed: the SVMs
the experiments solve afterwards are not part of the loop, so the ratio printed against the whole
experiment understates the speed-up of the trainer itself.

Each function trains ``sample`` runs of every kind the experiment trains and returns
``(seconds, sample_runs, total_runs)``; the caller extrapolates linearly (a per-run loop's time is
proportional to its number of runs).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

DT = torch.float64


def _sgd_loop(params: list[torch.nn.Parameter], loss_fn, steps: int, lr: float, rule: str, lstar: float = 0.0):
    opt = torch.optim.SGD(params, lr=lr)
    hist = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        with torch.no_grad():
            if rule == "ngd":
                for p in params:
                    p.grad /= p.grad.norm() + 1e-300
            elif rule == "polyak":
                sq = sum(float((p.grad**2).sum()) for p in params)
                for p in params:
                    p.grad *= max(float(loss) - lstar, 0.0) / max(sq, 1e-300) / lr
        opt.step()
        hist.append([p.detach().clone() for p in params])
    return hist


class _PromptAttn(torch.nn.Module):
    """The notebook's PromptAttn: f(X) = vᵀ Xᵀ softmax(X W p) with W fixed."""

    def __init__(self, W: np.ndarray, v: np.ndarray, p: np.ndarray):
        super().__init__()
        self.W = torch.tensor(W, dtype=DT)
        self.w = torch.nn.Parameter(torch.tensor(v, dtype=DT))
        self.prompt = torch.nn.Parameter(torch.tensor(p, dtype=DT))

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        a = torch.softmax((X @ self.W) @ self.prompt, dim=-1)
        return (a.unsqueeze(-1) * X).sum(-2) @ self.w


def joint_training(s: dict[str, Any], sample: int) -> tuple[float, int, int]:
    from attsvm.prompt import paper_joint_problem, paper_loss_problem, random_prompt_problem

    def risk_of(name: str, m: _PromptAttn, X: torch.Tensor, y: torch.Tensor):
        def risk() -> torch.Tensor:
            u = y * m(X)
            return torch.nn.functional.softplus(-u).mean() if name == "logistic" else (-u).mean()

        return risk

    cs = [float(c) for c in s["Cs"]]
    t0 = time.perf_counter()
    for loss in ("logistic", "correlation"):
        for tight in (True, False):  # the joint runs: all of them
            q = paper_joint_problem(tight)
            m = _PromptAttn(q.W, [-1.0, 0.0], [0.0, -1.0])
            X, y = torch.tensor(q.X, dtype=DT), torch.tensor(q.y, dtype=DT)
            _sgd_loop([m.prompt, m.w], risk_of(loss, m, X, y), s["steps"], s["lr"], "ngd")
        for C in cs[:sample]:
            q = paper_loss_problem(C)
            m = _PromptAttn(q.W, q.v, np.zeros(3))
            X, y = torch.tensor(q.X, dtype=DT), torch.tensor(q.y, dtype=DT)
            _sgd_loop([m.prompt], risk_of(loss, m, X, y), s["loss_steps"], s["lr"], "ngd")
        for seed in range(sample):
            q = random_prompt_problem(s["n"], s["T"], s["d"], seed=seed, fixed_head=True)
            m = _PromptAttn(q.W, q.v, np.random.default_rng(seed).standard_normal(q.m) * 0.01)
            X, y = torch.tensor(q.X, dtype=DT), torch.tensor(q.y, dtype=DT)
            _sgd_loop([m.prompt], risk_of(loss, m, X, y), s["random_steps"], s["lr"], "ngd")
    dt = time.perf_counter() - t0
    # extrapolate the sampled C and random runs to all of them (the 4 joint runs were all run)
    joint = 2 * 2 * s["steps"]
    per_c = s["loss_steps"]
    per_rand = s["random_steps"]
    sampled = joint + 2 * min(sample, len(cs)) * per_c + 2 * sample * per_rand
    total = joint + 2 * len(cs) * per_c + 2 * s["runs"] * per_rand
    return dt, sampled, total  # (in step units: the runs have different lengths)


def rates(s: dict[str, Any], sample: int) -> tuple[float, int, int]:
    from attsvm.experiments._common import paper_problems
    from attsvm.problem import loss_fn

    t0 = time.perf_counter()
    for rule in ("gd", "ngd", "polyak"):
        for q in paper_problems(s["n"], s["T"], s["d"], list(range(sample))):
            X, Z = torch.tensor(q.X, dtype=DT), torch.tensor(q.queries, dtype=DT)
            y, v = torch.tensor(q.y, dtype=DT), torch.tensor(q.v, dtype=DT)
            W = torch.nn.Parameter(torch.nn.Linear(q.d, q.d, bias=False).weight.detach().to(DT).clone())
            lstar = float(loss_fn("logistic", q.scores.max(axis=1)).mean())

            def risk(W=W, X=X, Z=Z, y=y, v=v) -> torch.Tensor:
                s_ = torch.softmax(torch.einsum("ntd,de,ne->nt", X, W, Z), dim=-1)
                return torch.nn.functional.softplus(-y * ((s_.unsqueeze(-1) * X).sum(1) @ v)).mean()

            _sgd_loop([W], risk, s["steps"], s["lr"] if rule != "polyak" else 1.0, rule, lstar)
    return time.perf_counter() - t0, 3 * sample, 3 * s["runs"]


def ntp_convergence(s: dict[str, Any], sample: int) -> tuple[float, int, int]:
    from attsvm.ntp import random_ntp_problem

    t0 = time.perf_counter()
    for seed in range(sample):
        q = random_ntp_problem(s["n"], s["T"], s["V"], s["d"], seed=seed, cyclic=True)
        X, Z = torch.tensor(q.X, dtype=DT), torch.tensor(q.queries, dtype=DT)
        lab = torch.tensor(q.label_positions)
        W = torch.nn.Parameter(torch.nn.Linear(q.d, q.d, bias=False).weight.detach().to(DT).clone())

        def risk(W=W, X=X, Z=Z, lab=lab) -> torch.Tensor:
            g = torch.einsum("ntd,de,ne->nt", X, W, Z)
            lse_all = torch.logsumexp(g, dim=-1)
            lse_lab = torch.logsumexp(g.masked_fill(~lab, float("-inf")), dim=-1)
            return (lse_all - lse_lab).mean()

        _sgd_loop([W], risk, s["steps"], s["lr"], "ngd")
    return time.perf_counter() - t0, sample, s["runs"]


def _torch_head(head: Any):
    """A torch function of the attention output for a fixed problem head (linear or MLP)."""
    from attsvm.model import _activation

    V = torch.tensor(head.weights, dtype=DT)
    if head.kind == "linear":
        return lambda o: o @ V
    spec = head.mlp_spec
    hidden = [torch.tensor(H, dtype=DT) for H in spec.hidden]
    out = torch.tensor(spec.out, dtype=DT)
    act = "silu" if spec.activation == "swiglu" else spec.activation

    def f(o: torch.Tensor) -> torch.Tensor:
        a = o @ V
        if spec.activation == "swiglu":
            z = torch.nn.functional.silu(a[..., spec.width :]) * a[..., : spec.width]
        else:
            z = _activation(act, a)
        for H in hidden:
            z = _activation(act, z @ H)
        return z @ out

    return f


def svm_eq_mlp(s: dict[str, Any], sample: int) -> tuple[float, int, int]:
    """The published svm-eq code's loop (``multi_token_converge.ipynb``: one seed at a time, a module with
    ``nn.Linear`` attention weights, SGD on the normalised gradient, W recorded every 100 steps), run for
    ``sample`` seeds of every configuration with the MLP heads of svm-eq-mlp."""
    import itertools

    from attsvm.experiments.svm_eq_mlp import mlp_instance

    configs = list(itertools.product(s["params"], s["activations"], s["depths"]))
    t0 = time.perf_counter()
    for param, act, depth in configs:
        for seed in range(1, sample + 1):
            q = mlp_instance(s["n"], s["T"], s["d"], seed, act, depth)
            if not (q.y == -1).any():  # the protocol drops these before training, as the experiment does
                continue
            X, Z, y = (torch.tensor(a, dtype=DT) for a in (q.X, q.queries, q.y))
            head = _torch_head(q.head)
            lin = [torch.nn.Linear(q.d, q.d, bias=False).double() for _ in range(1 if param == "W" else 2)]
            ps = [m.weight for m in lin]

            def risk(ps=ps, X=X, Z=Z, y=y, head=head) -> torch.Tensor:
                W = ps[0] if len(ps) == 1 else ps[1].T @ ps[0]
                a = torch.softmax(torch.einsum("ntd,ed,ne->nt", X, W, Z), dim=-1)
                return torch.nn.functional.softplus(-y * head((a.unsqueeze(-1) * X).sum(1))).mean()

            _sgd_loop(ps, risk, s["steps"], s["lr"], "ngd")
    trained = len(configs) * sample
    total = len(configs) * int(s["seeds"]) + len(s.get("trained_heads", [])) * int(s["seeds"])
    return time.perf_counter() - t0, trained, total


def hierarchy(s: dict[str, Any], sample: int) -> tuple[float, int, int]:
    """A per-run loop over an L-layer module (one ``nn.Linear`` per layer, autograd, SGD on normalised
    gradients) for ``sample`` runs of every configuration of the hierarchy experiment."""
    from attsvm.datasets import hop_instance

    t0 = time.perf_counter()
    for param, L in s["configs"]:
        for seed in range(sample):
            q = hop_instance(s["n"], 2, s["d"], candidates=s["candidates"], codes=s["codes"], seed=seed).problem
            X, Z, y, v = (torch.tensor(a, dtype=DT) for a in (q.X, q.queries, q.y, q.v))
            per = 1 if param == "W" else 2
            lin = [torch.nn.Linear(q.d, q.d, bias=False).double() for _ in range(per * int(L))]
            ps = [m.weight for m in lin]

            def risk(ps=ps, X=X, Z=Z, y=y, v=v, L=int(L), per=per) -> torch.Tensor:
                z, o = Z, Z
                for ell in range(L):
                    W = ps[ell] if per == 1 else ps[2 * ell + 1].T @ ps[2 * ell]
                    a = torch.softmax(torch.einsum("ntd,ed,ne->nt", X, W, z), dim=-1)
                    o = (a.unsqueeze(-1) * X).sum(1)
                    z = z + o
                return torch.nn.functional.softplus(-y * (o @ v)).mean()

            _sgd_loop(ps, risk, s["steps"], s["lr"], "ngd")
    n_cfg = len(s["configs"])
    return time.perf_counter() - t0, n_cfg * sample, n_cfg * int(s["runs"])


LOOPS = {
    "joint-training": joint_training,
    "rates": rates,
    "ntp-convergence": ntp_convergence,
    "svm-eq-mlp": svm_eq_mlp,
    "hierarchy": hierarchy,
}
