"""One prefill for every press: the answers of many KV-cache compression methods from a single forward pass.

A prefill press compresses each layer's keys and values *after* the layer has run, so the hidden states the
layers see during the prefill do not depend on the press (kvpress's ``BasePress.forward_hook``: the layer
attends over the full context, then its cache is cut). One prefill of the context can therefore serve every
method and every ratio: hooks record, per attention layer, what a press's ``compress`` receives (the module,
its input hidden states, its keys and values, its attention weights under eager attention, the forward's
keyword arguments), and each method's compressed cache is assembled from that record by calling its own
``compress`` on the same tensors. Only the question and the answer are then decoded per method, exactly as
kvpress's pipeline decodes them (question in one step at its true positions, then greedy tokens).

The decoding is batched too: methods whose caches hold the same number of keys in every layer (every press at one
ratio, as a rule) answer one question together, one row each, so that a decoding step reads the model's weights
once for all of them (:func:`answers_from_caches`). Rows never see each other; a row's tokens are the ones it would
decode alone (the tests compare with kvpress's pipeline run press by press).

On hybrid local/global models (Gemma 2/3) the rule of :mod:`attsvm.integrations.kvpress` holds: sliding-window
layers keep their window, the global layers are compressed (:class:`~attsvm.integrations.kvpress.HybridPress`
gives the same caches press by press; the tests compare the answers with kvpress's pipeline run press by press).

Needs the ``[kvpress]`` extra (kvpress 0.5.5, transformers 5.2.x) for kvpress's presses; attsvm's own presses
come from :mod:`attsvm.integrations.kvpress`.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .._validation import check_positive_int, check_seed

__all__ = [
    "PrefillRecord",
    "record_prefill",
    "compressed_cache",
    "answer_from_cache",
    "answers_from_caches",
    "answers_one_prefill",
]


@dataclass
class PrefillRecord:
    """What each attention layer's prefill handed to the presses' hook, and the full cache it built. Sliding-window
    layers keep their window, so only the other layers' hidden states and attention weights are kept (an eager
    4,096-token map is 268 MB per layer)."""

    cache: Any
    modules: dict[int, Any]
    hidden: dict[int, torch.Tensor]
    attentions: dict[int, Any]
    kwargs: dict[int, dict[str, Any]]
    context_length: int
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def _language_model(model: Any) -> Any:
    inner = model.model
    return inner.language_model if hasattr(inner, "language_model") else inner


class _LayerRotary(torch.nn.Module):
    """A model's rotary embedding bound to one layer's type (Gemma 2/3 have a RoPE base per layer type, and
    kvpress's presses that recompute queries call ``module.rotary_emb(x, position_ids)`` without it)."""

    def __init__(self, rotary: Any, layer_type: str) -> None:
        super().__init__()
        self.rotary = rotary
        self.layer_type = layer_type

    def forward(self, x: Any, position_ids: Any, layer_type: Any = None, **kw: Any) -> Any:
        return self.rotary(x, position_ids, layer_type=layer_type or self.layer_type, **kw)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("rotary"), name)


def record_prefill(model: Any, context_ids: torch.Tensor, *, cache: Any = None) -> PrefillRecord:
    """Prefill ``context_ids`` (1, N) once through ``model.model`` (as kvpress's pipeline does, without the LM head)
    and record, per attention layer, the arguments a press's ``compress`` would receive."""
    from transformers import DynamicCache

    from ..integrations.kvpress import is_sliding_layer  # (no kvpress import)

    if not (isinstance(context_ids, torch.Tensor) and context_ids.dim() == 2 and context_ids.shape[0] == 1):
        raise ValueError(f"context_ids must be a (1, N) tensor of token ids, got {getattr(context_ids, 'shape', None)}")
    lm = _language_model(model)
    cache = DynamicCache() if cache is None else cache
    rec = PrefillRecord(cache, {}, {}, {}, {}, int(context_ids.shape[1]))
    hooks = []
    for layer in lm.layers:
        attn = layer.self_attn
        # (what kvpress's presses read; BasePress.__call__ sets the model's, here bound to the layer's type)
        layer_type = getattr(attn, "layer_type", None)
        attn.rotary_emb = lm.rotary_emb if layer_type is None else _LayerRotary(lm.rotary_emb, layer_type)

        def hook(module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
            i = module.layer_idx
            rec.modules[i] = module
            rec.kwargs[i] = {k: v for k, v in kwargs.items() if k not in ("past_key_values", "hidden_states")}
            if is_sliding_layer(module, kwargs):  # (kept as it is: no press reads its inputs)
                return
            rec.hidden[i] = rec.kwargs[i]["hidden_states"] = kwargs["hidden_states"]
            rec.attentions[i] = output[1] if isinstance(output, tuple) and len(output) > 1 else None

        hooks.append(attn.register_forward_hook(hook, with_kwargs=True))
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            model.model(input_ids=context_ids, past_key_values=cache)
    finally:
        for h in hooks:
            h.remove()
    rec.seconds = time.perf_counter() - t0
    return rec


def compressed_cache(rec: PrefillRecord, press: Any, model: Any, *, seed: int | None = None) -> Any:
    """The cache ``press`` would have left after the recorded prefill: sliding layers keep their window, every other
    layer holds what ``press.compress`` returns on the recorded tensors (``None``: the full cache). With ``seed``
    the press compresses under torch's generator seeded so (the caller's generator state is restored after):
    randomised presses (kvpress's LeverageScore and Compactor sketch with ``torch.randn``) then give the same
    cache whichever methods ran before (``None``: the generator as it is)."""
    if seed is None:
        return _compressed_cache(rec, press, model)
    seed = check_seed(seed, "seed")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _compressed_cache(rec, press, model)


def _compressed_cache(rec: PrefillRecord, press: Any, model: Any) -> Any:
    from transformers import DynamicCache

    from ..integrations.kvpress import is_sliding_layer, keep_window, track_positions  # (no kvpress import)

    cache = DynamicCache()
    cache.layers = [copy.copy(layer) for layer in rec.cache.layers]  # (tensors shared; layer objects per method)
    inner = press.press if type(press).__name__ == "HybridPress" else press  # (the rule is applied here)
    if inner is not None:
        inner.post_init_from_model(model)
    for i, module in rec.modules.items():
        kw = dict(rec.kwargs[i], past_key_values=cache)
        if is_sliding_layer(module, kw):
            keep_window(module, kw)
            continue
        if inner is None:
            continue
        layer: Any = cache.layers[i]
        with torch.no_grad():
            # each method gets its own copies: a press may write into its inputs (kvpress's ThinK zeroes key
            # channels in place), which would change every later method's cache
            keys, values = inner.compress(
                module, rec.hidden[i].clone(), layer.keys.clone(), layer.values.clone(), rec.attentions[i], kw
            )
        layer.keys, layer.values = keys, values
        track_positions(layer)
    return cache


def answer_from_cache(
    model: Any, cache: Any, question_ids: torch.Tensor, context_length: int, max_new_tokens: int
) -> list[int]:
    """Greedy answer token ids, decoded as kvpress's pipeline decodes (the question at its true positions in one
    step, then one token per step); the cache is extended in place."""
    return _greedy(model, cache, question_ids, context_length, max_new_tokens)[0]


def _signature(cache: Any) -> tuple:
    """What must agree for two caches to decode as rows of one batch: each layer's class, key and value shapes and,
    for a sliding-window layer, how many tokens it has seen."""
    return tuple(
        (type(layer), tuple(layer.keys.shape), tuple(layer.values.shape), getattr(layer, "cumulative_length", None))
        for layer in cache.layers
    )


def _stack(caches: Sequence[Any]) -> Any:
    """One cache whose batch rows are ``caches`` (which have one signature)."""
    from transformers import DynamicCache

    out = DynamicCache()
    out.layers = []
    for layers in zip(*(c.layers for c in caches), strict=True):
        layer = copy.copy(layers[0])
        layer.keys = torch.cat([x.keys for x in layers], 0)
        layer.values = torch.cat([x.values for x in layers], 0)
        out.layers.append(layer)
    return out


def _greedy(model: Any, cache: Any, question_ids: torch.Tensor, context_length: int, max_new_tokens: int) -> list:
    """Greedy token ids of every batch row of ``cache`` (question in one step, then one token per step; as in kvpress's
    pipeline, a row ends with the first stop token decoded after the question's step; the batch when every row has
    ended)."""
    eos = model.generation_config.eos_token_id
    stop = set(eos if isinstance(eos, list) else [eos])
    rows = int(cache.layers[0].keys.shape[0])
    q = question_ids.shape[1]
    pos = torch.arange(context_length, context_length + q).unsqueeze(0).expand(rows, q)
    with torch.no_grad():
        out = model(input_ids=question_ids.expand(rows, q), past_key_values=cache, position_ids=pos, logits_to_keep=1)
        ids = [[int(t)] for t in out.logits[:, -1].argmax(-1)]
        nxt = pos[:, -1:] + 1
        for i in range(max_new_tokens - 1):
            if all(any(t in stop for t in row[1:]) for row in ids):
                break
            last = torch.tensor([[row[-1]] for row in ids])
            out = model(input_ids=last, past_key_values=cache, position_ids=nxt + i)
            for row, t in zip(ids, out.logits[:, -1].argmax(-1), strict=True):
                row.append(int(t))
    cut = []
    for row in ids:
        end = next((j for j, t in enumerate(row) if j and t in stop), len(row) - 1)
        cut.append(row[: end + 1])
    return cut


def answers_from_caches(
    model: Any,
    caches: Sequence[Any],
    question_ids: torch.Tensor,
    context_length: int,
    max_new_tokens: int,
    *,
    batch: int = 32,
) -> list[list[int] | Exception]:
    """Greedy answer token ids of ``question_ids`` from each cache (as :func:`answer_from_cache` gives them), decoded
    in batches of at most ``batch`` caches of one signature (module doc). A cache that cannot be decoded gets its
    exception in place of its answer (a failing batch is retried row by row, so that only the culprit fails). The
    caches are left as they were."""
    batch = check_positive_int(batch, "batch")
    out: list[Any] = [None] * len(caches)
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(caches):
        groups.setdefault(_signature(c), []).append(i)
    for members in groups.values():
        for s in range(0, len(members), batch):
            part = members[s : s + batch]
            try:
                rows = _greedy(model, _stack([caches[i] for i in part]), question_ids, context_length, max_new_tokens)
            except Exception:
                rows = []
                for i in part:
                    try:
                        rows += _greedy(model, _stack([caches[i]]), question_ids, context_length, max_new_tokens)
                    except Exception as exc:  # (reported per cache: the caller names the method)
                        rows.append(exc)
            for i, r in zip(part, rows, strict=True):
                out[i] = r
    return out


def answers_one_prefill(
    model: Any,
    context_ids: torch.Tensor,
    question_ids: Sequence[torch.Tensor],
    presses: Mapping[str, Any],
    *,
    max_new_tokens: int = 8,
) -> dict[str, list[list[int]]]:
    """Answer token ids of every method (``{name: press or None}``) for every question, from one prefill; the
    methods' answers to a question are decoded in batches (:func:`answers_from_caches`)."""
    rec = record_prefill(model, context_ids)
    names = list(presses)
    caches = [compressed_cache(rec, presses[n], model) for n in names]
    out: dict[str, list[list[int]]] = {n: [] for n in names}
    for q in question_ids:
        for n, a in zip(names, answers_from_caches(model, caches, q, rec.context_length, max_new_tokens), strict=True):
            if isinstance(a, Exception):
                raise a
            out[n].append(a)
    return out
