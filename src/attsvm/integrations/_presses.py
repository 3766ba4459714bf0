"""The press classes of :mod:`attsvm.integrations.kvpress`, on kvpress's bases (importing this imports kvpress,
which patches transformers' attention functions: :mod:`attsvm.integrations.kvpress` imports it on first access
to a press class).

Each press only scores, in kvpress's shape: its ``score`` is the keep-priority of an
:mod:`attsvm.analysis.kv_scores` policy on the probabilities of the observation window (the cache's own update
rule, ``policy.accumulate``), with the protected keys raised (:func:`~attsvm.analysis.kv_scores.protect`);
kvpress's ``ScorerPress`` keeps the top ``compute_n_kept`` keys. The decoding presses carry the policy's
statistics of the kept keys into the next compression through the same ``accumulate``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch
from kvpress import AdaKVPress, BasePress, DecodingPress, ScorerPress
from kvpress.presses.base_press import is_prefilling

from ..analysis.kv_scores import (
    EvictionPolicy,
    H2OPolicy,
    SVMarginPolicy,
    protect,
    svm_support_scores,
    window_priority,
    window_probs,
)
from .kvpress import (
    _DECODING_FIELDS,
    _POSITIONS,
    _WINDOW_FIELDS,
    _after_compression,
    _check_rope_model,
    is_sliding_layer,
    keep_window,
    refuse_padding,
    window_logits,
    window_queries,
)

__all__ = ["SVMarginPress", "SVMSupportPress", "H2OPress", "SVMarginDecodingPress", "H2ODecodingPress", "HybridPress"]


@dataclass
class _WindowPress(ScorerPress):
    """A policy's keep-priority over the last ``window_size`` queries (RoPE-recomputed), sinks and window protected."""

    compression_ratio: float = 0.0
    window_size: int = 64
    n_sink: int = 4

    policy: ClassVar[EvictionPolicy]  # the scoring rule (attsvm.analysis.kv_scores)

    def __post_init__(self) -> None:
        if self.compression_ratio >= 1.0:  # (kvpress's ScorerPress asserts this; a named error instead)
            raise ValueError(
                "compression_ratio must be in [0, 1) when a press is built, as in kvpress (assign 1.0 afterwards "
                "to empty a layer, as PerLayerCompressionPress does)"
            )
        super().__post_init__()

    def __setattr__(self, name: str, value: Any) -> None:
        # every assignment of a field is checked, at construction and after it
        check = _WINDOW_FIELDS.get(name)
        super().__setattr__(name, value if check is None else check(value))

    def post_init_from_model(self, model: Any) -> None:
        _check_rope_model(model, type(self).__name__)
        super().post_init_from_model(model)

    def forward_hook(self, module: Any, input: Any, kwargs: dict, output: Any) -> Any:
        if is_sliding_layer(module, kwargs):  # a sliding layer keeps its window (kvpress module doc)
            keep_window(module, kwargs)
            return output
        if is_prefilling(kwargs["cache_position"], kwargs["hidden_states"].shape[1]):  # (not per decoding step)
            refuse_padding(kwargs, type(self).__name__)
        out = super().forward_hook(module, input, kwargs, output)
        _after_compression(module, kwargs)
        return out

    def window_probs(self, module: Any, hidden_states: torch.Tensor, keys: torch.Tensor, kwargs: dict) -> torch.Tensor:
        """The window's attention probabilities (B, H_kv, G·w, K), float64, as the policy reads them."""
        logits, visible = window_logits(module, hidden_states, keys, kwargs, self.window_size)
        return window_probs(logits, visible, keys.shape[1])

    def raw_score(self, module: Any, hidden_states: torch.Tensor, keys: torch.Tensor, kwargs: dict) -> torch.Tensor:
        """The policy's keep-priority (B, H_kv, K) from the window alone, before protection."""
        stats = self.policy.accumulate(None, self.window_probs(module, hidden_states, keys, kwargs))
        assert stats is not None  # (the window policies keep statistics)
        return window_priority(self.policy, stats)

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

    policy = SVMarginPolicy()


@dataclass
class SVMSupportPress(_WindowPress):
    """Keep the support keys of the attention SVMs of the last ``window_size`` queries: per query row and head, the
    Frobenius Att-SVM of its selected (top-logit) key against every other key it sees, solved for all queries and
    heads at once (:func:`~attsvm.analysis.kv_scores.svm_support_scores`, ``n_candidates`` keys per query with
    cutting planes to the exact SVM). A key ranks by the number of SVMs of its KV head's group that need it
    (selected or support), then by its SV margin; sinks and the window are protected. The scores of one prefill's
    keys are computed once and reused by every press of this class (every ratio); ``last_info`` holds the
    solver's report per layer."""

    n_candidates: int = 64

    policy = SVMarginPolicy()  # (the order among the keys no SVM needs)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "last_info", {})

    def raw_score(self, module: Any, hidden_states: torch.Tensor, keys: torch.Tensor, kwargs: dict) -> torch.Tensor:
        q, visible = window_queries(module, hidden_states, keys, kwargs, self.window_size)
        memo_key = (tuple(keys.shape), self.window_size, self.n_candidates, module.layer_idx)
        hit = [m for m in _SUPPORT_MEMO if m[2] == memo_key and torch.equal(m[1], q) and torch.equal(m[0], keys)]
        if hit:  # (the same keys and window seen before: every ratio's press of one prefill)
            scores, info = hit[0][3], hit[0][4]
        else:
            scores, info = svm_support_scores(q, keys, visible, n_candidates=self.n_candidates)
            _SUPPORT_MEMO.append((keys.detach().clone(), q, memo_key, scores, info))
            del _SUPPORT_MEMO[:-8]
        self.last_info[module.layer_idx] = info
        return scores.to(keys.device)


# the support scores of the last few (keys, window queries) seen, matched by content: one prefill's layers serve
# every ratio's press
_SUPPORT_MEMO: list[tuple[torch.Tensor, torch.Tensor, tuple[Any, ...], torch.Tensor, dict[str, Any]]] = []


@dataclass
class H2OPress(_WindowPress):
    """Keep the heavy hitters: attention accumulated over the last ``window_size`` queries (RoPE-recomputed;
    summed over each GQA group); sinks and the window are protected."""

    policy = H2OPolicy()


@dataclass
class _CarryingDecodingPress(DecodingPress):
    base_press: Any = None
    compression_interval: int = 32
    target_size: int = 256
    hidden_states_buffer_size: int = 32
    window_size: int = 64
    n_sink: int = 4
    carry: bool = True
    _base_class: ClassVar[type[_WindowPress]] = _WindowPress

    def __post_init__(self) -> None:
        if self.base_press is None:
            self.base_press = self._base_class(window_size=self.window_size, n_sink=self.n_sink)
        elif not isinstance(self.base_press, (ScorerPress, AdaKVPress)):
            raise TypeError(
                f"base_press must be a kvpress ScorerPress or AdaKVPress, got {type(self.base_press).__name__}"
            )
        else:
            # window_size/n_sink given with a base press: the base press's own must agree; afterwards the fields
            # show the base press's values
            defaults = {f.name: f.default for f in fields(self) if f.name in ("window_size", "n_sink")}
            base = self.base_press
            own = {n: getattr(base, n) for n in defaults} if isinstance(base, _WindowPress) else None
            if any(getattr(self, n) != d and (own is None or getattr(self, n) != own[n]) for n, d in defaults.items()):
                has = (
                    f"base_press has window_size={own['window_size']}, n_sink={own['n_sink']}"
                    if own is not None
                    else f"{type(base).__name__} has no window"
                )
                raise ValueError(
                    "window_size and n_sink configure the default base press; with base_press given, set them "
                    f"on it ({has})"
                )
            for n, v in (own or {}).items():
                setattr(self, n, v)
        super().__post_init__()
        self._positions: dict[int, list[torch.Tensor]] = defaultdict(list)
        self._carried: dict[int, torch.Tensor] = {}  # the policy's statistics of the keys kept, per layer
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
        """The keep-priority carried for the keys a layer kept at its last compression (B, H_kv, n_kept), if any."""
        stats = self._carried.get(layer_idx)
        return None if stats is None else window_priority(self.base_press.policy, stats)

    def reset(self) -> None:
        super().reset()
        self._positions = defaultdict(list)
        self._carried = {}
        self._since = defaultdict(int)

    def forward_hook(self, module: Any, input: Any, kwargs: dict, output: Any) -> Any:
        if is_sliding_layer(module, kwargs):  # a sliding layer keeps its window (kvpress module doc)
            keep_window(module, kwargs)
            return output
        hidden = kwargs["hidden_states"]
        layer = module.layer_idx
        if is_prefilling(kwargs["cache_position"], hidden.shape[1]):
            refuse_padding(kwargs, type(self).__name__)  # (at the prefill: padding then stays for every step)
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
        probs = base.window_probs(module, hidden_states, keys, kwargs)
        prev = self._carried.get(layer)
        if prev is not None and not (prev.shape[:2] == probs.shape[:2] and prev.shape[-1] + self._since[layer] == K):
            prev = None  # (the carried keys come first, the keys appended since after; anything else starts anew)
        stats = base.policy.accumulate(prev, probs)  # the cache's update rule
        assert stats is not None  # (the window policies keep statistics)
        self._since[layer] = 0
        if K <= self.target_size:  # nothing to evict yet: carry every key's statistic
            self._carried[layer] = stats
            return keys, values
        n_kept = self.target_size  # = compute_n_kept(K, ratio) at DecodingPress's target ratio
        scores = protect(
            window_priority(base.policy, stats), min(base.window_size, hidden_states.shape[1], K), base.n_sink
        )
        idx = scores.topk(n_kept, dim=-1).indices.sort(dim=-1).values  # kept keys stay in order
        self._carried[layer] = stats.gather(2, idx)
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

    def compress(self, module: Any, hidden_states: Any, keys: Any, values: Any, attentions: Any, kwargs: dict) -> Any:
        return self.press.compress(module, hidden_states, keys, values, attentions, kwargs)


for _cls in (SVMarginPress, SVMSupportPress, H2OPress, SVMarginDecodingPress, H2ODecodingPress, HybridPress):
    _cls.__module__ = "attsvm.integrations.kvpress"  # (documented and pickled under the public module)
