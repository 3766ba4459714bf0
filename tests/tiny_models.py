"""Tiny random models shared by the tests (random weights: cache and press mechanics, never model quality)."""

from __future__ import annotations

from typing import Any

GEMMA3_TYPES = ("sliding_attention", "sliding_attention", "full_attention") * 2


def tiny_gemma3(
    vocab: int, *, window: int = 16, positions: int = 256, dtype: Any = None, q_scale: float = 8.0, seed: int = 0
) -> Any:
    """A random Gemma 3 text model in eval mode: 6 layers (one global in three, ``window``-token sliding window),
    4 query heads on 1 KV head, head dimension 16, eager attention. ``q_scale`` sharpens the attention (random
    initial weights spread it thin, and eviction would then change nothing)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.Gemma3TextConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=len(GEMMA3_TYPES),
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=window,
        layer_types=list(GEMMA3_TYPES),
        max_position_embeddings=positions,
        query_pre_attn_scalar=16,
    )
    cfg._attn_implementation = "eager"
    net = transformers.Gemma3ForCausalLM(cfg).eval()
    if dtype is not None:
        net = net.to(dtype)
    with torch.no_grad():
        for layer in net.model.layers:
            layer.self_attn.q_proj.weight.mul_(q_scale)
    return net


def logits_with_keys_hidden(net: Any, ids: Any, new: Any, hidden: dict[int, Any]) -> Any:
    """The reference for an evicted cache: logits of the ``new`` tokens (1, q) after ``ids`` (1, N) from one full
    forward in which, in each layer ``i`` of ``hidden``, the new queries cannot see the prefill positions where
    ``hidden[i]`` (N,) bool is True (the eager attention's additive masks, replaced by forward pre-hooks)."""
    import math

    import torch

    N = ids.shape[1]
    hooks = []
    for i, layer in enumerate(net.model.layers):
        if i not in hidden:
            continue

        def pre(mod: Any, args: Any, kwargs: Any, drop: Any = hidden[i]) -> Any:
            m = kwargs["attention_mask"].clone()
            if m.dtype == torch.bool:
                m = torch.zeros(m.shape, dtype=torch.float64).masked_fill(~m, -math.inf)
            m[..., N:, :N][..., drop] = -math.inf
            kwargs["attention_mask"] = m
            return args, kwargs

        hooks.append(layer.self_attn.register_forward_pre_hook(pre, with_kwargs=True))
    try:
        with torch.no_grad():
            return net(input_ids=torch.cat([ids, new], dim=1)).logits[:, N:]
    finally:
        for h in hooks:
            h.remove()
