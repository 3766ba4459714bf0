"""attsvm's KV-cache scores as NVIDIA kvpress presses (the ``attsvm[kvpress]`` extra: ``kvpress==0.5.5``).

kvpress compresses a Hugging Face model's KV cache with *presses*: forward hooks on the attention layers that keep,
per layer and KV head, the ``compute_n_kept(k_len, compression_ratio)`` keys a press scores highest. This module
offers attsvm's rules in that form (docs/spec.md §2, §7):

* :class:`SVMarginPress` — a ``ScorerPress``: a key's score is minus its smallest **support-vector margin**
  ``logit_top − logit_t`` over a window of the most recent queries (``window_size``), with the queries' logits
  recomputed from the hidden states with RoPE at their own positions; per KV head, the minimum margin over the
  head's GQA group of query heads (the key is kept if it is near the top for *some* head of the group). The first
  ``n_sink`` keys and the window's own keys are protected.
* :class:`SVMSupportPress` — the same window; keeps the **support keys** of the window's attention SVMs (one
  Frobenius Att-SVM per query row and head, all solved at once by ``fit_stack``;
  :func:`attsvm.analysis.kv_scores.svm_support_scores`), then the rest by SV margin. The SV press to use for
  prefill compression: on Gemma 3 270M it loses least against the best kvpress press (docs/guide/kv-cache.md).
* :class:`H2OPress` — the same window, scoring accumulated attention (summed over the group): H2O's heavy hitters.
* :class:`HybridPress` — any kvpress press on models with sliding-window layers: those keep their window.
* :class:`SVMarginDecodingPress`, :class:`H2ODecodingPress` — kvpress ``DecodingPress`` subclasses: decode-time
  eviction every ``compression_interval`` steps down to ``target_size`` keys. The buffered queries get RoPE at
  their own positions (kvpress's own window presses rotate every buffered query to the current position), and the
  statistic is carried across compressions for the keys that stay: the running minimum margin (svm) or the
  running attention sum (H2O's accumulation; kvpress has no decode-time H2O).

The presses only score (kvpress's shape: its ``ScorerPress`` keeps the top keys). Their rules are the
policies of :mod:`attsvm.analysis.kv_scores`, which :class:`~attsvm.analysis.kv_cache.EvictionCache` runs too:
a press feeds its window's probabilities to the policy's ``accumulate`` and ranks by its ``priority``; the
protection rule and ``compute_n_kept`` come from there as well.

kvpress is imported lazily, on first access to a press class: importing it patches transformers' attention
functions for the whole process. A missing install raises :class:`attsvm._extras.MissingExtraError` naming the
extra. Contract (tested): every layer keeps ``compute_n_kept`` keys per KV head; the presses compose with
``AdaKVPress``, ``DecodingPress`` and ``KeyRerotationPress``.
"""

from __future__ import annotations

from typing import Any

import torch

from .._extras import require
from .._validation import check_bool
from ..analysis.kv_scores import (
    H2OPolicy,
    SVMarginPolicy,
    check_compression_ratio,
    check_count,
    compute_n_kept,
    protect,
    window_scores,
)

# the presses are built on first access by __getattr__ (kvpress is an optional dependency)
PRESSES: tuple[str, ...] = (
    "SVMarginPress",
    "SVMSupportPress",
    "H2OPress",
    "SVMarginDecodingPress",
    "H2ODecodingPress",
    "HybridPress",
)

__all__ = [
    *PRESSES,
    "compute_n_kept",
    "check_compression_ratio",
    "protect",
    "margin_scores",
    "attention_scores",
    "window_logits",
    "window_queries",
    "is_sliding_layer",
    "track_positions",
    "PRESSES",
]

_POSITIONS = "attsvm_buffered_position_ids"  # kwargs key: positions of the buffered queries (decoding presses)


# ---------------------------------------------------------------------------------------- the window scores
def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _query_rope(module: Any, hidden: torch.Tensor, kwargs: dict, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of shape (B, n, d_head) for the last ``n`` rows of ``hidden`` at their own positions."""
    positions = kwargs.get(_POSITIONS)
    if positions is None:
        emb = kwargs.get("position_embeddings")
        if emb is not None and emb[0].shape[-2] == hidden.shape[1]:  # this pass's own queries (prefill)
            return emb[0][:, -n:], emb[1][:, -n:]
        start = _offset_in(hidden, kwargs.get("hidden_states"))
        if emb is not None and start is not None:  # a slice of this pass's queries (ChunkPress): its own positions
            end = start + hidden.shape[1]
            return emb[0][:, end - n : end], emb[1][:, end - n : end]
        pid = kwargs.get("position_ids")
        if pid is None:
            pid = kwargs["cache_position"][None]
        # buffered queries of consecutive decoding steps, the last one at the current position
        positions = pid[:, -1:] - (n - 1) + torch.arange(n, device=pid.device)
    rotary = getattr(module, "rotary_emb", None)
    if rotary is None:
        raise ValueError(
            f"{type(module).__name__} has no rotary_emb: the margin presses need a RoPE model "
            "(Llama, Qwen2/3, Mistral, ...) used through the press's context manager"
        )
    layer_type = getattr(module, "layer_type", None)  # Gemma 2/3: one RoPE base per layer type
    extra = {"layer_type": layer_type} if layer_type is not None else {}
    cos, sin = rotary(hidden, position_ids=positions[:, -n:].expand(hidden.shape[0], -1), **extra)
    return cos, sin


def _offset_in(part: torch.Tensor, whole: Any) -> int | None:
    """The row offset of ``part`` (B, n, d) inside ``whole`` (B, N, d) when ``part`` is a slice of it along the
    sequence (the same storage, as kvpress's ChunkPress hands its chunks), else None."""
    if not isinstance(whole, torch.Tensor) or whole.dim() != 3 or part.dim() != 3 or part.shape[1] == whole.shape[1]:
        return None
    if part.untyped_storage().data_ptr() != whole.untyped_storage().data_ptr() or part.stride() != whole.stride():
        return None
    start, rem = divmod(int(part.storage_offset()) - int(whole.storage_offset()), int(whole.stride(1)))
    return start if rem == 0 and 0 <= start <= whole.shape[1] - part.shape[1] else None


def is_sliding_layer(module: Any, kwargs: dict) -> bool:
    """Whether this call's layer caches a sliding window (Gemma 2/3's local layers, Mistral-style models): its
    cache layer is a sliding-window one (transformers' ``is_sliding``), which holds at most the window and whose
    masks assume exactly that many keys; the presses here leave such a layer as it is (module doc)."""
    if getattr(module, "is_sliding", False) or getattr(module, "sliding_window", None) is not None:
        return True  # (also when the cache stores every key: kvpress's pipeline builds DynamicCache() without config)
    cache = kwargs.get("past_key_values")
    layers = getattr(cache, "layers", None)
    idx = getattr(module, "layer_idx", None)
    if layers is None or idx is None or idx >= len(layers):
        return False
    return bool(getattr(layers[idx], "is_sliding", False))


def track_positions(layer: Any) -> Any:
    """Make a compressed (non-sliding) cache layer build its masks by position, not by slot.

    transformers numbers a layer's cached keys 0 … L − 1 when it builds a mask, and the new queries by
    ``cache_position``, which comes from the first layer's length. When every layer is compressed alike the two
    agree. On a hybrid model the first (sliding) layer counts every token, so a compressed global layer's new keys
    would be numbered below their queries' positions and a multi-token step would see its own future. The layer's
    class is swapped for a subclass whose mask offset is ``cache_position[0] − L`` (the keys kept stay visible, the
    new ones are causal); a layer that needs no offset gets 0, as before."""
    cls = type(layer)
    if getattr(cls, "_attsvm_tracks_positions", False):
        return layer
    tracked = _TRACKED.get(cls)
    if tracked is None:

        def get_mask_sizes(self: Any, cache_position: Any, *args: Any) -> tuple[int, int]:
            length, offset = cls.get_mask_sizes(self, cache_position, *args)
            if isinstance(cache_position, torch.Tensor) and cache_position.numel() and offset == 0:
                offset = max(int(cache_position[0]) - int(self.get_seq_length()), 0)
            return length, offset

        tracked = type(cls.__name__, (cls,), {"get_mask_sizes": get_mask_sizes, "_attsvm_tracks_positions": True})
        _TRACKED[cls] = tracked
    layer.__class__ = tracked
    return layer


_TRACKED: dict[type, type] = {}


def keep_window(module: Any, kwargs: dict) -> None:
    """A sliding layer whose cache stores every key (a ``DynamicCache()`` built without the model's config, as
    kvpress's pipeline builds it) is replaced by transformers' sliding-window cache layer holding the last W − 1
    keys, as a cache built from the config holds them; the cache then reports the layer as sliding, so that the
    masks of later steps are built per layer type (the global layers' from a global layer)."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    cache = kwargs.get("past_key_values")
    layers = getattr(cache, "layers", None)
    idx = getattr(module, "layer_idx", None)
    W = getattr(module, "sliding_window", None)
    if layers is None or idx is None or idx >= len(layers) or W is None or getattr(layers[idx], "is_sliding", False):
        return
    old = layers[idx]
    if not getattr(old, "is_initialized", False):
        return
    new = DynamicSlidingWindowLayer(sliding_window=int(W))
    new.lazy_initialization(old.keys, old.values)
    new.keys, new.values = old.keys[:, :, -int(W) + 1 :], old.values[:, :, -int(W) + 1 :]
    new.cumulative_length = int(old.keys.shape[-2])
    layers[idx] = new  # (the cache's is_sliding follows its layers)


def refuse_padding(kwargs: dict, press: str) -> None:
    """A ValueError when this pass's attention mask hides some earlier key from the newest query (left padding):
    a press would score padding, protect it as sinks and count it in the budget. Call it on a global layer (a
    sliding layer's mask hides the keys past its window by design)."""
    mask = kwargs.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4 or mask.shape[-1] == 0:
        return
    last = mask[..., -1, :]  # the newest query sees every earlier key unless some are padding
    hidden = ~last if last.dtype == torch.bool else last <= torch.finfo(last.dtype).min / 2
    if bool(hidden.any()):
        raise ValueError(
            f"{press} does not support padded batches: attention_mask hides keys (padding) from the newest query. "
            "Compress padded rows one at a time, or batch rows of equal length"
        )


def _after_compression(module: Any, kwargs: dict) -> None:
    cache = kwargs.get("past_key_values")
    layers = getattr(cache, "layers", None)
    idx = getattr(module, "layer_idx", None)
    if layers is not None and idx is not None and idx < len(layers) and not getattr(layers[idx], "is_sliding", False):
        track_positions(layers[idx])


def window_queries(
    module: Any, hidden_states: torch.Tensor, keys: torch.Tensor, kwargs: dict, window_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The last ``w = min(window_size, len(hidden_states), K)`` queries (B, H_q, w, d) as the logits use them
    (RoPE at the queries' own positions, times the layer's scaling), and the causal visibility (w, K) of the
    ``K`` keys: the ``w`` queries are the tokens of the last ``w`` key slots."""
    from kvpress.utils import get_prerope_query_states

    K, d = keys.shape[2], keys.shape[3]
    w = min(window_size, hidden_states.shape[1], K)
    q = get_prerope_query_states(module, hidden_states[:, -w:])  # (B, H_q, w, d)
    cos, sin = _query_rope(module, hidden_states, kwargs, w)
    q = (q * cos.unsqueeze(1) + _rotate_half(q) * sin.unsqueeze(1)) * getattr(module, "scaling", d**-0.5)
    visible = torch.arange(K, device=keys.device)[None, :] <= (K - w + torch.arange(w, device=keys.device))[:, None]
    return q, visible


def window_logits(
    module: Any, hidden_states: torch.Tensor, keys: torch.Tensor, kwargs: dict, window_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (B, H_q, w, K) of the :func:`window_queries` on all ``K`` keys, and their visibility (w, K)."""
    q, visible = window_queries(module, hidden_states, keys, kwargs, window_size)
    G = q.shape[1] // keys.shape[1]
    k = keys.repeat_interleave(G, dim=1) if G > 1 else keys
    return torch.matmul(q, k.transpose(-1, -2).to(q.dtype)), visible


def margin_scores(logits: torch.Tensor, visible: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """Minus the smallest SV margin ``logit_top − logit_t`` of every key over the queries (B, H_q, w, K) that see
    it, then the minimum over each KV head's group: (B, H_kv, K), float64 — the SV-margin policy's keep-priority
    on the window (:func:`~attsvm.analysis.kv_scores.window_scores`). A key whose margin passes 745 nats (its
    probability underflows float64) scores −inf."""
    return window_scores(_SVM, logits, visible, n_kv_heads)


def attention_scores(logits: torch.Tensor, visible: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """Attention accumulated over the queries (B, H_q, w, K), summed over each KV head's group: (B, H_kv, K),
    float64 — the H2O policy's keep-priority on the window (softmax in float64; never NaN)."""
    return window_scores(_H2O, logits, visible, n_kv_heads)


_SVM, _H2O = SVMarginPolicy(), H2OPolicy()


def _check_rope_model(model: Any, press: str) -> None:
    """A model the window presses can hook: kvpress's ``model.model`` (or ``.language_model``) with RoPE."""
    inner = getattr(model, "model", None)
    lm = getattr(inner, "language_model", inner)
    if getattr(lm, "rotary_emb", None) is None or not hasattr(lm, "layers"):
        raise ValueError(
            f"model must be a RoPE decoder model (Llama, Qwen2/3, Mistral, ...: model.model.rotary_emb and "
            f".layers) for {press}, got {type(model).__name__}"
        )


_WINDOW_FIELDS = {
    "compression_ratio": check_compression_ratio,
    "window_size": lambda v: check_count(v, "window_size", 1),
    "n_sink": lambda v: check_count(v, "n_sink", 0),
    "n_candidates": lambda v: check_count(v, "n_candidates", 2),
}
_DECODING_FIELDS = {
    "compression_interval": lambda v: check_count(v, "compression_interval", 1),
    "target_size": lambda v: check_count(v, "target_size", 1),
    "hidden_states_buffer_size": lambda v: check_count(v, "hidden_states_buffer_size", 0),
    "window_size": lambda v: check_count(v, "window_size", 1),
    "n_sink": lambda v: check_count(v, "n_sink", 0),
    "carry": lambda v: check_bool(v, "carry"),
}


def __getattr__(name: str) -> Any:
    if name in PRESSES:
        require("kvpress", feature="attsvm.integrations.kvpress")
        from . import _presses  # (imports kvpress: this patches transformers' attention)

        return getattr(_presses, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
