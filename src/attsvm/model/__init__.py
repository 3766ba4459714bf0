"""One-layer attention ``f(X_i) = h(X_iᵀ softmax(X_i W z_i))`` in PyTorch, batched over runs (docs/spec.md §1).

The model has four layers, one module each (a module imports only the layers listed before it); this
package re-exports their names:

* :mod:`attsvm.model.checks` — input checks: the accepted parameterisations and losses, and the
  functions that check a device, a dtype, a loss, a list of problems and the data's scale;
* :mod:`attsvm.model.batch` — :class:`Batch`, the data of R runs as tensors (tokens, queries, labels,
  head), built from one or several :class:`~attsvm.problem.AttentionProblem` (shared data broadcast
  over runs, so a batch of R initialisations of one instance stores its tokens once);
* :mod:`attsvm.model.attention` — the maths, pure functions of ``(batch, W)``:
  :func:`attention_logits`, :func:`attention_probs`, :func:`head_outputs`, :func:`sequence_losses`,
  :func:`risk`, and :func:`risk_and_grad`, the trainer's analytic gradient in a round-off-stable form
  (see its docstring);
* :mod:`attsvm.model.parameterizations` and :mod:`attsvm.model.module` — :class:`FullW` or
  :class:`FactoredKQ` (``W = K Qᵀ``): the trained tensors as groups, their weights, gradient map and
  initialisations (the trainer's and the model's); and :class:`AttentionModel`, a thin ``nn.Module``
  holding the groups of a parameterisation, whose forward returns outputs and attention probabilities
  and stores nothing.

Conventions. Logits are ``x_itᵀ W z_i``. The published code computes ``z_iᵀ W_lin x_it`` with an
``nn.Linear`` weight ``W_lin``, i.e. ``W = W_linᵀ``; for (K, Q) it computes ``(W_q z_i)ᵀ (W_k x_it)``,
i.e. ``K = W_kᵀ``, ``Q = W_qᵀ`` (both d × m) and ``W = K Qᵀ = W_kᵀ W_q``. The head is fixed (not
trained), as in the paper. Everything is float64 unless asked otherwise.
"""

from __future__ import annotations

from .attention import (
    EXP_CLIP,
    activation,
    attention_logits,
    attention_outputs,
    attention_probs,
    excess_risk_scaled,
    factor_grads,
    head_outputs,
    mlp_rest,
    risk,
    risk_and_grad,
    risk_and_scaled_grad,
    risk_and_scaled_logit_grad,
    sequence_losses,
)
from .batch import Batch
from .checks import (
    GRADIENT_LOG10_MAX,
    HEADS,
    PARAMS,
    SCALAR_LOSSES,
    TRAIN_LOSSES,
    Param,
    TrainLoss,
    as_problem_list,
    check_device,
    check_float_dtype,
    check_gradient_scale,
    resolve_loss,
)
from .module import AttentionModel
from .parameterizations import INIT_DRAWS, FactoredKQ, FullW, InitDraw, Parameterization, parameterization

__all__ = [
    "Batch",
    "AttentionModel",
    "Param",
    "TrainLoss",
    "PARAMS",
    "TRAIN_LOSSES",
    "SCALAR_LOSSES",
    "HEADS",
    "GRADIENT_LOG10_MAX",
    "check_float_dtype",
    "check_device",
    "as_problem_list",
    "check_gradient_scale",
    "attention_logits",
    "attention_probs",
    "attention_outputs",
    "head_outputs",
    "mlp_rest",
    "activation",
    "sequence_losses",
    "risk",
    "risk_and_grad",
    "risk_and_scaled_grad",
    "risk_and_scaled_logit_grad",
    "excess_risk_scaled",
    "factor_grads",
    "resolve_loss",
    "EXP_CLIP",
    "Parameterization",
    "FullW",
    "FactoredKQ",
    "parameterization",
    "InitDraw",
    "INIT_DRAWS",
]

# the name under which benchmarks/published_loops.py imports activation
_activation = activation
