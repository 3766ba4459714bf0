"""attsvm's KV-cache scores as NVIDIA kvpress presses (the ``attsvm[kvpress]`` extra: ``kvpress==0.5.5``).

kvpress compresses a Hugging Face model's KV cache with *presses*: forward hooks on the attention layers that keep,
per layer and KV head, the ``compute_n_kept(k_len, compression_ratio)`` keys a press scores highest. This module
offers attsvm's rules in that form (docs/spec.md §2, §7):

* :class:`SVMarginPress` — a ``ScorerPress``: a key's score is minus its smallest **support-vector margin**
  ``logit_top − logit_t`` over a window of the most recent queries (``window_size``), with the queries' logits
  recomputed from the hidden states with RoPE at their own positions; per KV head, the minimum margin over the
  head's GQA group of query heads (the key is kept if it is near the top for *some* head of the group). The first
  ``n_sink`` keys and the window's own keys are protected.
* :class:`H2OPress` — the same window, scoring accumulated attention (summed over the group): H2O's heavy hitters.
* :class:`SVMarginDecodingPress`, :class:`H2ODecodingPress` — kvpress ``DecodingPress`` subclasses: decode-time
  eviction every ``compression_interval`` steps down to ``target_size`` keys. The buffered queries get RoPE at
  their own positions (kvpress's own window presses rotate every buffered query to the current position), and the
  statistic is carried across compressions for the keys that stay: the running minimum margin (svm) or the
  running attention sum (H2O's accumulation; kvpress has no decode-time H2O).

kvpress is imported lazily, on first access to a press class: importing it patches transformers' attention
functions for the whole process. A missing install raises :class:`attsvm._extras.MissingExtraError` naming the
extra. Contract (tested): every layer keeps ``compute_n_kept`` keys per KV head; the presses compose with
``AdaKVPress``, ``DecodingPress`` and ``KeyRerotationPress``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import torch

from .._extras import require
from .._validation import check_bool

# the presses are built on first access by __getattr__ (kvpress is an optional dependency)
PRESSES: tuple[str, ...] = ("SVMarginPress", "H2OPress", "SVMarginDecodingPress", "H2ODecodingPress", "HybridPress")

__all__ = [*PRESSES, "compute_n_kept", "check_compression_ratio", "is_sliding_layer", "track_positions", "PRESSES"]

_POSITIONS = "attsvm_buffered_position_ids"  # kwargs key: positions of the buffered queries (decoding presses)


def check_compression_ratio(compression_ratio: Any) -> float:
    """``compression_ratio`` as a float in [0, 1] (numpy numbers too), or a ValueError/TypeError naming it.

    1.0 evicts the whole layer, as in kvpress (whose ``PerLayerCompressionPress`` assigns it per layer)."""
    if isinstance(compression_ratio, (bool, np.bool_)) or not isinstance(
        compression_ratio, (int, float, np.integer, np.floating)
    ):
        raise TypeError(f"compression_ratio must be a float in [0, 1], got {compression_ratio!r}")
    if not 0.0 <= float(compression_ratio) <= 1.0 or math.isnan(compression_ratio):
        raise ValueError(f"compression_ratio must be in [0, 1], got {compression_ratio}")
    return float(compression_ratio)


def compute_n_kept(k_len: int, compression_ratio: float) -> int:
    """Keys kept per layer and KV head out of ``k_len`` at ``compression_ratio``, kvpress's rule (no kvpress
    import needed): 0 at ratio 1 (the layer is emptied), else ``max(1, int(k_len · (1 − compression_ratio)))``."""
    k_len = _check_int(k_len, "k_len", 1)
    ratio = check_compression_ratio(compression_ratio)
    return 0 if ratio >= 1.0 else max(1, int(k_len * (1 - ratio)))


def _check_int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


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


def _after_compression(module: Any, kwargs: dict) -> None:
    cache = kwargs.get("past_key_values")
    layers = getattr(cache, "layers", None)
    idx = getattr(module, "layer_idx", None)
    if layers is not None and idx is not None and idx < len(layers) and not getattr(layers[idx], "is_sliding", False):
        track_positions(layers[idx])


def window_logits(
    module: Any, hidden_states: torch.Tensor, keys: torch.Tensor, kwargs: dict, window_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (B, H_q, w, K) of the last ``w = min(window_size, len(hidden_states))`` queries on all ``K`` keys,
    recomputed with RoPE at the queries' own positions, and the causal visibility (w, K): the ``w`` queries are the
    tokens of the last ``w`` key slots."""
    from kvpress.utils import get_prerope_query_states

    B, Hkv, K, d = keys.shape
    w = min(window_size, hidden_states.shape[1], K)
    q = get_prerope_query_states(module, hidden_states[:, -w:])  # (B, H_q, w, d)
    cos, sin = _query_rope(module, hidden_states, kwargs, w)
    q = q * cos.unsqueeze(1) + _rotate_half(q) * sin.unsqueeze(1)
    G = q.shape[1] // Hkv
    k = keys.repeat_interleave(G, dim=1) if G > 1 else keys
    scaling = getattr(module, "scaling", d**-0.5)
    logits = torch.matmul(q, k.transpose(-1, -2).to(q.dtype)) * scaling  # (B, H_q, w, K)
    visible = torch.arange(K, device=keys.device)[None, :] <= (K - w + torch.arange(w, device=keys.device))[:, None]
    return logits, visible


def _group(logits: torch.Tensor, n_kv_heads: Any) -> int:
    """Query heads per KV head: ``n_kv_heads`` must be a positive int dividing the logits' query heads."""
    n_kv_heads = _check_int(n_kv_heads, "n_kv_heads", 1)
    if logits.dim() != 4 or logits.shape[1] % n_kv_heads:
        raise ValueError(
            f"n_kv_heads must divide the query heads of logits (B, H_q, w, K), got {n_kv_heads} for logits of shape "
            f"{tuple(logits.shape)}"
        )
    return int(logits.shape[1]) // n_kv_heads


def margin_scores(logits: torch.Tensor, visible: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """Minus the smallest SV margin ``logit_top − logit_t`` of every key over the queries (B, H_q, w, K) that see
    it, then the minimum margin over each KV head's group: (B, H_kv, K). Infinite logits are taken at the dtype's
    largest finite value (so a margin is never inf − inf)."""
    G = _group(logits, n_kv_heads)
    masked = _finite(logits).masked_fill(~visible, -math.inf)
    margin = masked.amax(-1, keepdim=True) - masked  # +inf where a query does not see the key
    B, _, _, K = logits.shape
    m = margin.amin(dim=-2).view(B, -1, G, K).amin(dim=2)
    return -m


def attention_scores(logits: torch.Tensor, visible: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """Attention accumulated over the queries (B, H_q, w, K), summed over each KV head's group: (B, H_kv, K).
    The softmax is taken in float32, or in float64 for float64 logits (which may lie beyond float32's range:
    cast down they gave inf − inf = NaN); infinite logits are taken at the largest finite value, so the scores
    are never NaN."""
    G = _group(logits, n_kv_heads)
    work = logits if logits.dtype == torch.float64 else logits.float()
    probs = torch.softmax(_finite(work).masked_fill(~visible, -math.inf), dim=-1).to(logits.dtype)
    B, _, _, K = logits.shape
    return probs.sum(dim=-2).view(B, -1, G, K).sum(dim=2)


def _finite(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` with ±inf replaced by ± the dtype's largest finite value / 4 (differences stay finite)."""
    big = torch.finfo(logits.dtype).max / 4
    return logits.clamp(-big, big)


def protect(scores: torch.Tensor, window: int, n_sink: int) -> torch.Tensor:
    """Scores with the first ``n_sink`` and the last ``window`` keys raised strictly above every other (finite, as
    kvpress's AdaKV and rerotation wrappers expect), so ``topk`` keeps them in every float dtype.

    The protected keys are ranked among themselves, for budgets smaller than ``n_sink + window``: the sinks first,
    then the window's keys from the newest back (so a budget of b < n_sink + window keeps the sinks and the newest
    b − n_sink keys; below n_sink, the first b sinks' ties are broken by ``topk``). They take the values
    ``top + p · step`` (p = 1 for the oldest window key … window + 1 for the sinks) above the best unprotected
    score ``top``, with ``step = max(1, |top|/64)``, which exceeds the dtype's spacing there (bfloat16 included);
    where those values would pass the dtype's largest value, the unprotected scores are capped at half of it and
    the protected ones spread over the upper half. A NaN score (a model's NaN) is evicted first."""
    window = _check_int(window, "window", 0)
    n_sink = _check_int(n_sink, "n_sink", 0)
    finfo = torch.finfo(scores.dtype)
    out = torch.where(torch.isnan(scores), finfo.min, scores)  # (topk ranks NaN above everything)
    K = out.shape[-1]
    w = min(window, K)
    s = min(n_sink, K - w)
    if w + s == 0:
        return out
    prio = torch.zeros(K, dtype=torch.float64, device=out.device)
    prio[K - w :] = torch.arange(1, w + 1, dtype=torch.float64, device=out.device)
    prio[:s] = w + 1
    guarded = prio > 0
    rest = out[..., ~guarded]
    top = float(rest.detach().amax()) if rest.numel() else -math.inf
    if top == -math.inf:
        top = 0.0
    vals = top + prio * max(1.0, abs(top) / 64) if math.isfinite(top) else torch.full_like(prio, math.inf)
    cast = vals[guarded].to(scores.dtype)
    levels = torch.unique(cast.double())
    distinct = len(levels) == len(torch.unique(prio[guarded]))
    if not (bool(torch.isfinite(cast).all()) and float(levels[0]) > top and distinct):
        half = finfo.max / 2  # (no room above the top score: cap the others at half the range, spread above it)
        out = out.clamp(max=float(torch.tensor(half * (1 - finfo.eps), dtype=scores.dtype)))
        vals = half + prio * (half / (w + 1))
        vals[guarded] = vals[guarded].clamp(max=finfo.max)
    out = out.clone()
    out[..., guarded] = vals[guarded].to(scores.dtype)
    return out


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
    "window_size": lambda v: _check_int(v, "window_size", 1),
    "n_sink": lambda v: _check_int(v, "n_sink", 0),
}
_DECODING_FIELDS = {
    "compression_interval": lambda v: _check_int(v, "compression_interval", 1),
    "target_size": lambda v: _check_int(v, "target_size", 1),
    "hidden_states_buffer_size": lambda v: _check_int(v, "hidden_states_buffer_size", 0),
    "window_size": lambda v: _check_int(v, "window_size", 1),
    "n_sink": lambda v: _check_int(v, "n_sink", 0),
    "carry": lambda v: check_bool(v, "carry"),
}


# ---------------------------------------------------------------------------------------- the press classes
@functools.cache
def _classes() -> dict[str, type]:
    """Build the press classes on kvpress's bases (imports kvpress: this patches transformers' attention)."""
    require("kvpress", feature="attsvm.integrations.kvpress")
    from collections import defaultdict
    from dataclasses import dataclass, fields

    from kvpress import AdaKVPress, BasePress, DecodingPress, ScorerPress
    from kvpress.presses.base_press import is_prefilling

    @dataclass
    class _WindowPress(ScorerPress):
        compression_ratio: float = 0.0
        window_size: int = 64
        n_sink: int = 4

        combine = "max"  # how the decoding presses carry the raw score across compressions ("max" or "sum")

        def __post_init__(self) -> None:
            if self.compression_ratio >= 1.0:  # (kvpress's ScorerPress asserts this; a named error instead)
                raise ValueError(
                    "compression_ratio must be in [0, 1) when a press is built, as in kvpress (assign 1.0 afterwards "
                    "to empty a layer, as PerLayerCompressionPress does)"
                )
            super().__post_init__()

        def __setattr__(self, name: str, value: Any) -> None:
            # every assignment of a field is checked, at construction and after it (p.window_size = 0 used to
            # reach the scores unchecked)
            check = _WINDOW_FIELDS.get(name)
            super().__setattr__(name, value if check is None else check(value))

        def post_init_from_model(self, model: Any) -> None:
            _check_rope_model(model, type(self).__name__)
            super().post_init_from_model(model)

        def forward_hook(self, module: Any, input: Any, kwargs: dict, output: Any) -> Any:
            if is_sliding_layer(module, kwargs):  # a sliding layer keeps its window (module doc)
                keep_window(module, kwargs)
                return output
            out = super().forward_hook(module, input, kwargs, output)
            _after_compression(module, kwargs)
            return out

        def raw_score(self, module: Any, hidden_states: torch.Tensor, keys: torch.Tensor, kwargs: dict) -> torch.Tensor:
            raise NotImplementedError

        def score(
            self,
            module: Any,
            hidden_states: torch.Tensor,
            keys: torch.Tensor,
            values: torch.Tensor,
            attentions: Any,
            kwargs: dict,
        ) -> torch.Tensor:
            raw = self.raw_score(module, hidden_states, keys, kwargs)
            return protect(raw, min(self.window_size, hidden_states.shape[1], keys.shape[2]), self.n_sink)

    @dataclass
    class SVMarginPress(_WindowPress):
        """Keep the keys with the smallest support-vector margin over the last ``window_size`` queries
        (RoPE-recomputed logits; minimum over each GQA group); sinks and the window are protected."""

        combine = "max"  # score = −margin: the running minimum margin is the running maximum score

        def raw_score(self, module: Any, hidden_states: torch.Tensor, keys: torch.Tensor, kwargs: dict) -> torch.Tensor:
            logits, visible = window_logits(module, hidden_states, keys, kwargs, self.window_size)
            return margin_scores(logits, visible, keys.shape[1])

    @dataclass
    class H2OPress(_WindowPress):
        """Keep the heavy hitters: attention accumulated over the last ``window_size`` queries (RoPE-recomputed;
        summed over each GQA group); sinks and the window are protected."""

        combine = "sum"

        def raw_score(self, module: Any, hidden_states: torch.Tensor, keys: torch.Tensor, kwargs: dict) -> torch.Tensor:
            logits, visible = window_logits(module, hidden_states, keys, kwargs, self.window_size)
            return attention_scores(logits, visible, keys.shape[1])

    @dataclass
    class _CarryingDecodingPress(DecodingPress):
        base_press: Any = None
        compression_interval: int = 32
        target_size: int = 256
        hidden_states_buffer_size: int = 32
        window_size: int = 64
        n_sink: int = 4
        carry: bool = True
        _base_class = _WindowPress

        def __post_init__(self) -> None:
            if self.base_press is None:
                self.base_press = self._base_class(window_size=self.window_size, n_sink=self.n_sink)
            elif not isinstance(self.base_press, (ScorerPress, AdaKVPress)):
                raise TypeError(
                    f"base_press must be a kvpress ScorerPress or AdaKVPress, got {type(self.base_press).__name__}"
                )
            else:
                # window_size/n_sink given with a base press: the base press's own must agree (they were silently
                # ignored); afterwards the fields show the base press's values
                defaults = {f.name: f.default for f in fields(self) if f.name in ("window_size", "n_sink")}
                base = self.base_press
                own = {n: getattr(base, n) for n in defaults} if isinstance(base, _WindowPress) else None
                if any(
                    getattr(self, n) != d and (own is None or getattr(self, n) != own[n]) for n, d in defaults.items()
                ):
                    has = (
                        f"base_press has window_size={own['window_size']}, n_sink={own['n_sink']}"
                        if own is not None
                        else f"{type(base).__name__} has no window"
                    )
                    raise ValueError(
                        f"window_size and n_sink configure the default base press; with base_press given, set them "
                        f"on it ({has})"
                    )
                for n, v in (own or {}).items():
                    setattr(self, n, v)
            super().__post_init__()
            self._positions: dict[int, list[torch.Tensor]] = defaultdict(list)
            self._carried: dict[int, torch.Tensor] = {}
            self._since: dict[int, int] = defaultdict(int)  # tokens appended since the last compression
            object.__setattr__(self, "_ready", True)

        def __setattr__(self, name: str, value: Any) -> None:
            # every assignment of a field is checked, at construction and after it
            check = _DECODING_FIELDS.get(name)
            value = value if check is None else check(value)
            if name in ("window_size", "n_sink") and self.__dict__.get("_ready"):
                # after construction the base press holds them: set them there (or refuse: it has no window)
                if not isinstance(self.base_press, _WindowPress):
                    raise ValueError(f"{name} configures a window press; {type(self.base_press).__name__} has none")
                setattr(self.base_press, name, value)
            super().__setattr__(name, value)

        def carried_scores(self, layer_idx: int) -> torch.Tensor | None:
            """The statistic carried for the keys a layer kept at its last compression (B, H_kv, n_kept), if any."""
            return self._carried.get(layer_idx)

        def reset(self) -> None:
            super().reset()
            self._positions = defaultdict(list)
            self._carried = {}
            self._since = defaultdict(int)

        def forward_hook(self, module: Any, input: Any, kwargs: dict, output: Any) -> Any:
            if is_sliding_layer(module, kwargs):  # a sliding layer keeps its window (module doc)
                keep_window(module, kwargs)
                return output
            hidden = kwargs["hidden_states"]
            layer = module.layer_idx
            if is_prefilling(kwargs["cache_position"], hidden.shape[1]):
                self._carried.pop(layer, None)
                self._since[layer] = 0
                return super().forward_hook(module, input, kwargs, output)
            pid = kwargs.get("position_ids")
            pid = kwargs["cache_position"][None] if pid is None else pid
            self._positions[layer].append(pid.expand(hidden.shape[0], -1))
            self._since[layer] += hidden.shape[1]
            kwargs[_POSITIONS] = torch.cat(self._positions[layer], dim=1)
            try:
                out = super().forward_hook(module, input, kwargs, output)
            finally:
                kwargs.pop(_POSITIONS, None)
            _after_compression(module, kwargs)
            kept = len(self.hidden_states_buffer[layer])  # mirror the hidden-state buffer (cleared, trimmed)
            self._positions[layer] = self._positions[layer][len(self._positions[layer]) - kept :] if kept else []
            return out

        def compress(
            self,
            module: Any,
            hidden_states: torch.Tensor,
            keys: torch.Tensor,
            values: torch.Tensor,
            attentions: Any,
            kwargs: dict,
        ) -> tuple[torch.Tensor, torch.Tensor]:
            base = self.base_press
            K = keys.shape[2]
            layer = module.layer_idx
            if not (self.carry and isinstance(base, _WindowPress)):
                return super().compress(module, hidden_states, keys, values, attentions, kwargs)
            raw = base.raw_score(module, hidden_states, keys, kwargs)
            prev = self._carried.get(layer)
            if prev is not None and prev.shape[:2] == raw.shape[:2] and prev.shape[-1] + self._since[layer] == K:
                old = raw[..., : prev.shape[-1]]  # the carried keys come first, the keys appended since after
                if base.combine == "sum":
                    old.add_(prev)
                else:
                    torch.maximum(old, prev, out=old)
            self._since[layer] = 0
            if K <= self.target_size:  # nothing to evict yet: carry every key's statistic
                self._carried[layer] = raw
                return keys, values
            n_kept = self.target_size  # = compute_n_kept(K, ratio) at DecodingPress's target ratio
            scores = protect(raw, min(base.window_size, hidden_states.shape[1], K), base.n_sink)
            idx = scores.topk(n_kept, dim=-1).indices.sort(dim=-1).values  # kept keys stay in order
            self._carried[layer] = raw.gather(2, idx)
            gather = idx.unsqueeze(-1)
            return (
                keys.gather(2, gather.expand(-1, -1, -1, keys.shape[-1])).contiguous(),
                values.gather(2, gather.expand(-1, -1, -1, values.shape[-1])).contiguous(),
            )

    @dataclass
    class SVMarginDecodingPress(_CarryingDecodingPress):
        """Decode-time SV-margin eviction (kvpress ``DecodingPress``): every ``compression_interval`` steps, keep
        ``target_size`` keys per layer and KV head by the running minimum margin over the queries seen (buffered
        queries at their own RoPE positions)."""

        _base_class = SVMarginPress

    @dataclass
    class H2ODecodingPress(_CarryingDecodingPress):
        """Decode-time H2O eviction (kvpress ``DecodingPress``): every ``compression_interval`` steps, keep
        ``target_size`` keys per layer and KV head by attention accumulated over the queries seen."""

        _base_class = H2OPress

    @dataclass
    class HybridPress(BasePress):
        """Run any kvpress press on a model with sliding-window layers (Gemma 2/3, ...): the layers whose cache is a
        sliding window keep it untouched, and ``press`` compresses the global layers (their keys, positions and
        masks stay consistent, since every global layer keeps the same number of keys). On a model without
        sliding layers it is ``press`` itself. ``compression_ratio`` is the wrapped press's (global layers)."""

        press: Any = None

        def __post_init__(self) -> None:
            if not isinstance(self.press, BasePress):
                raise TypeError(f"press must be a kvpress press, got {type(self.press).__name__}")

        @property
        def compression_ratio(self) -> float:
            return float(self.press.compression_ratio)

        @compression_ratio.setter
        def compression_ratio(self, value: float) -> None:
            self.press.compression_ratio = value

        def post_init_from_model(self, model: Any) -> None:
            self.press.post_init_from_model(model)

        def forward_hook(self, module: Any, input: Any, kwargs: dict, output: Any) -> Any:
            if is_sliding_layer(module, kwargs):
                keep_window(module, kwargs)
                return output
            out = self.press.forward_hook(module, input, kwargs, output)
            _after_compression(module, kwargs)
            return out

        def compress(
            self, module: Any, hidden_states: Any, keys: Any, values: Any, attentions: Any, kwargs: dict
        ) -> Any:
            return self.press.compress(module, hidden_states, keys, values, attentions, kwargs)

    found: dict[str, type] = {
        "SVMarginPress": SVMarginPress,
        "H2OPress": H2OPress,
        "SVMarginDecodingPress": SVMarginDecodingPress,
        "H2ODecodingPress": H2ODecodingPress,
        "HybridPress": HybridPress,
    }
    for name, cls in found.items():
        cls.__module__, cls.__qualname__ = __name__, name
    return found


def __getattr__(name: str) -> Any:
    if name in PRESSES:
        return _classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
