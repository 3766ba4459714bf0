"""KV-cache compression on retrieval tasks: kvpress's presses beside attsvm's policies (``attsvm kv-compare``).

The model is the small Llama of :func:`attsvm.analysis.lm.train_llama_lm` (RoPE, GQA), the tasks those of
:mod:`attsvm.analysis.tasks` (the answer sits in a few far-away tokens: the token-selection setting of
docs/spec.md §7). Every method answers every row the way kvpress's pipeline does (:func:`answer_context`):

``full``
    no compression (the reference; its accuracy must reach ``min_accuracy`` on every task, else the whole
    comparison is marked void).
kvpress presses (family ``kvpress``, kind ``prefill``)
    ``knorm, snapkv, streaming_llm, tova, expected_attention, observed_attention, keydiff, random``: the context
    is prefilled under ``with press(model)``; the question and the answer are not compressed.
attsvm presses (family ``attsvm``, kind ``prefill``)
    ``svm_margin_press`` and ``h2o_press`` from :mod:`attsvm.integrations.kvpress` (kvpress ``ScorerPress``es).
attsvm decode-time caches (family ``attsvm``, kind ``decode``)
    ``svm_margin_cache, h2o_cache, tova_cache, streaming_cache, random_cache``: an
    :class:`~attsvm.analysis.kv_cache.EvictionCache` holding ``n_kept`` keys per layer and KV head while the
    context streams in by chunks of ``chunk`` tokens (and while the question and answer are decoded).
attsvm one-pass caches (family ``attsvm``, kind ``oneshot``)
    ``svm_margin_oneshot, h2o_oneshot``: the same cache fed the whole context in one pass (it evicts once, after seeing
    every context query: a prefill press without kvpress).

Budgets. At compression ratio ``r`` every method keeps ``n_kept = max(1, int(n * (1 - r)))`` keys of an
``n``-token context (kvpress's rule) per layer and KV head; this is checked for every context and method
(:class:`BudgetMismatch` otherwise). A decode-time cache keeps that many keys at all times, so the question's
tokens displace context keys; a prefill press keeps ``n_kept`` context keys plus the question.

Query-agnostic runs compress the context alone; query-aware runs (kvpress's ``query_aware``) append the question
to the context before compression. Without kvpress installed (the main environment) only attsvm's own methods
run, and the report says so; the ``kvpress`` extra (kvpress 0.5.5, transformers 5.2.x) adds the presses. kvpress
is imported lazily: importing it patches transformers' attention functions for the whole process.

Names. The SV-margin policy is ``svm_margin`` in all three forms: ``svm_margin_press``, ``svm_margin_cache`` and
``svm_margin_oneshot``; ``attsvm kv-compare --methods`` also accepts the spellings ``svm_cache`` and ``svm_oneshot``
(:data:`METHOD_ALIASES`). A run
whose ``meta`` says ``"smoke_test": true`` (``attsvm kv-compare --quick``) is reported without verdicts.

Accuracy is kvpress's RULER string match (:func:`attsvm.analysis.tasks.score_row`), with percentile bootstrap
confidence intervals over contexts (rows of one context are resampled together). Held-out perplexity: pydoc
text the model never trained on, a context of ``ppl_context`` tokens compressed by the method, then the loss on
the next ``ppl_continuation`` tokens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np

from .._extras import require
from .._folders import save_figure
from .._validation import check_choice, check_finite_scalar, check_positive_int, check_seed
from .claims import SMOKE_TEST
from .lm import (
    QUICK_RETRIEVAL_LM,
    RETRIEVAL_LM,
    LlamaLMConfig,
    cache_kw,
    decode_answer,
    encode_query,
    load_llama_lm,
    split_corpus,
    train_llama_lm,
)
from .tasks import TASKS, make_rows, score_row

__all__ = [
    "CompareConfig",
    "QUICK_COMPARE",
    "Method",
    "METHODS",
    "KVPRESS_METHODS",
    "ATTSVM_METHODS",
    "SVM_METHODS",
    "METHOD_ALIASES",
    "BudgetMismatch",
    "compute_n_kept",
    "available_methods",
    "answer_context",
    "kv_compare",
    "CompareResult",
    "bootstrap_ci",
    "plot_kv_compare",
    "write_compare_report",
]

log = logging.getLogger(__name__)

QueryMode = Literal["agnostic", "aware"]

KVPRESS_METHODS: tuple[str, ...] = (
    "knorm",
    "snapkv",
    "streaming_llm",
    "tova",
    "expected_attention",
    "observed_attention",
    "keydiff",
    "random",
)
ATTSVM_PRESSES: tuple[str, ...] = ("svm_margin_press", "h2o_press")
ATTSVM_CACHES: tuple[str, ...] = (
    "svm_margin_cache",
    "h2o_cache",
    "tova_cache",
    "streaming_cache",
    "random_cache",
    "svm_margin_oneshot",
    "h2o_oneshot",
)
ATTSVM_METHODS: tuple[str, ...] = ATTSVM_PRESSES + ATTSVM_CACHES
SVM_METHODS: tuple[str, ...] = ("svm_margin_press", "svm_margin_cache", "svm_margin_oneshot")
METHODS: tuple[str, ...] = ("full", *KVPRESS_METHODS, *ATTSVM_METHODS)
# other spellings ``--methods`` accepts (module doc)
METHOD_ALIASES: dict[str, str] = {"svm_cache": "svm_margin_cache", "svm_oneshot": "svm_margin_oneshot"}


class BudgetMismatch(AssertionError):
    """A method kept a different number of keys than the ratio's ``n_kept`` (the comparison would be unfair)."""


def compute_n_kept(n_tokens: int, ratio: float) -> int:
    """Keys kept of an ``n_tokens`` context at compression ``ratio`` in [0, 1): kvpress's rule
    (:func:`attsvm.analysis.kv_scores.compute_n_kept`), ``max(1, int(n (1 - r)))``."""
    from .kv_scores import compute_n_kept as kept

    n_tokens = check_positive_int(n_tokens, "n_tokens")
    ratio = check_finite_scalar(ratio, "ratio")
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"ratio must be in [0, 1), got {ratio}")
    return kept(n_tokens, ratio)


@dataclass(frozen=True)
class CompareConfig:
    """The grid of ``attsvm kv-compare`` (every value seeded)."""

    ratios: tuple[float, ...] = (0.25, 0.5, 0.75, 0.9)
    tasks: tuple[str, ...] = TASKS
    seeds: tuple[int, ...] = (0, 1, 2)
    n_samples: int = 1  # contexts per task and seed
    n_tokens: int = 1024  # context length (tokens)
    query_modes: tuple[str, ...] = ("agnostic", "aware")
    methods: tuple[str, ...] | None = None  # None: every available method
    chunk: int = 64  # decode-time caches: context tokens per forward pass
    window_size: int = 64  # observation window of SnapKV and the attsvm presses
    ppl_sequences: int = 6
    ppl_context: int = 512
    ppl_continuation: int = 64
    n_boot: int = 2000
    min_accuracy: float = 0.9  # full-cache accuracy needed on every task, else the comparison is void
    lm: LlamaLMConfig = RETRIEVAL_LM

    def __post_init__(self) -> None:
        for f in (
            "n_samples",
            "n_tokens",
            "chunk",
            "window_size",
            "ppl_sequences",
            "ppl_context",
            "ppl_continuation",
            "n_boot",
        ):
            check_positive_int(getattr(self, f), f)
        for f in ("ratios", "tasks", "seeds", "query_modes", "methods"):
            value = getattr(self, f)
            if f == "methods" and value is None:
                continue
            # (a string would be iterated character by character, a scalar not at all)
            if not isinstance(value, (tuple, list)):
                raise TypeError(f"{f} must be a tuple, got {type(value).__name__} {value!r}")
            if not value:
                raise ValueError(f"{f} must be non-empty, got {value!r}")
            object.__setattr__(self, f, tuple(value))
        for r in self.ratios:
            compute_n_kept(8, r)  # validates the range
        for t in self.tasks:
            check_choice(t, "tasks", TASKS)
        for m in self.query_modes:
            check_choice(m, "query_modes", ("agnostic", "aware"))
        object.__setattr__(self, "seeds", tuple(check_seed(s, "seeds") for s in self.seeds))  # (as plain ints)
        if self.methods is not None:
            for m in self.methods:
                check_choice(m, "methods", METHODS)
        acc = check_finite_scalar(self.min_accuracy, "min_accuracy")
        if not 0.0 <= acc <= 1.0:
            raise ValueError(f"min_accuracy must be in [0, 1] (a share of rows answered), got {self.min_accuracy}")
        if not isinstance(self.lm, LlamaLMConfig):
            raise TypeError(f"lm must be a LlamaLMConfig, got {type(self.lm).__name__}")


# --quick (CI): 256-token contexts, one seed, fewer samples; the quick model
QUICK_COMPARE = CompareConfig(
    seeds=(0,),
    n_samples=2,
    n_tokens=256,
    chunk=32,
    window_size=16,
    ppl_sequences=2,
    ppl_context=192,
    ppl_continuation=32,
    n_boot=200,
    lm=QUICK_RETRIEVAL_LM,
)


@dataclass(frozen=True)
class Method:
    """A compression method: ``build(model, ratio, n_kept)`` returns a kvpress press (kind ``prefill``) or an
    ``EvictionCache`` (kinds ``decode``, ``oneshot``); ``None`` for ``full``."""

    name: str
    family: Literal["reference", "kvpress", "attsvm"]
    kind: Literal["full", "prefill", "decode", "oneshot"]
    build: Callable[[Any, float, int], Any] = field(repr=False, compare=False)


def _kvpress_module() -> Any:
    return require("kvpress", feature="kvpress's presses in attsvm kv-compare")


def _kvpress_method(name: str, window_size: int) -> Method:
    def build(model: Any, ratio: float, n_kept: int) -> Any:
        kp = _kvpress_module()
        if name == "snapkv":
            return kp.SnapKVPress(compression_ratio=ratio, window_size=window_size)
        if name == "random":
            return kp.RandomPress(compression_ratio=ratio, seed=0)
        cls = {
            "knorm": "KnormPress",
            "streaming_llm": "StreamingLLMPress",
            "tova": "TOVAPress",
            "expected_attention": "ExpectedAttentionPress",
            "observed_attention": "ObservedAttentionPress",
            "keydiff": "KeyDiffPress",
        }[name]
        return getattr(kp, cls)(compression_ratio=ratio)

    return Method(name, "kvpress", "prefill", build)


def _attsvm_press(name: str, window_size: int) -> Method:
    def build(model: Any, ratio: float, n_kept: int) -> Any:
        integ = require("attsvm.integrations.kvpress", feature="attsvm's kvpress presses")
        cls = getattr(integ, "SVMarginPress" if name == "svm_margin_press" else "H2OPress")
        return cls(compression_ratio=ratio, window_size=window_size)

    return Method(name, "attsvm", "prefill", build)


def _attsvm_cache(name: str) -> Method:
    policy, kind = name.rsplit("_", 1)

    def build(model: Any, ratio: float, n_kept: int) -> Any:
        from .kv_cache import EvictionCache, PolicyName

        kw: dict[str, Any] = {"seed": 0} if policy == "random" else {}
        return EvictionCache(model, cast(PolicyName, policy), budget=n_kept, **kw)

    return Method(name, "attsvm", "decode" if kind == "cache" else "oneshot", build)


def _method(name: str, window_size: int) -> Method:
    check_choice(name, "method", METHODS)
    if name == "full":
        return Method("full", "reference", "full", lambda model, ratio, n_kept: None)
    if name in KVPRESS_METHODS:
        return _kvpress_method(name, window_size)
    if name in ATTSVM_PRESSES:
        return _attsvm_press(name, window_size)
    return _attsvm_cache(name)


def kvpress_available() -> bool:
    """Whether kvpress can be imported (without importing it: importing patches attention globally)."""
    import importlib.util

    spec = importlib.util.find_spec("kvpress")
    return spec is not None and spec.origin is not None  # a namespace package (e.g. a folder named kvpress) is not it


def available_methods(requested: Sequence[str] | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(runnable, skipped)``: methods needing kvpress (its presses and attsvm's presses) are skipped when it is
    not installed; ``requested=None`` means all of :data:`METHODS`."""
    names = METHODS if requested is None else tuple(requested)
    for n in names:
        check_choice(n, "methods", METHODS)
    needs_kvpress = set(KVPRESS_METHODS) | set(ATTSVM_PRESSES)
    if kvpress_available():
        return tuple(names), ()
    return (tuple(n for n in names if n not in needs_kvpress), tuple(n for n in names if n in needs_kvpress))


# ------------------------------------------------------------------------------------------------ running
def _layer_lengths(cache: Any) -> list[int]:
    return [int(layer.keys.shape[-2]) if getattr(layer, "keys", None) is not None else 0 for layer in cache.layers]


def _prefill(model: Any, cache: Any, ids: Any, chunk: int | None) -> None:
    import torch

    n = ids.shape[1]
    step = n if chunk is None else chunk
    kw = cache_kw(model.model, cache)
    with torch.no_grad():
        for s in range(0, n, step):
            part = ids[:, s : s + step]
            model.model(
                input_ids=part, position_ids=torch.arange(s, s + part.shape[1]).unsqueeze(0), use_cache=True, **kw
            )


def answer_context(
    model: Any,
    tok: Any,
    method: Method,
    ratio: float,
    context: str,
    queries: Sequence[tuple[str, str, int]],
    *,
    chunk: int = 64,
) -> tuple[list[str], int, int]:
    """Answer ``queries`` ``[(question, answer_prefix, max_new_tokens)]`` about one ``context`` with ``method``.

    Mirrors kvpress's pipeline: ``<s> context`` is prefilled (under the press, or into the method's cache), then
    each question and its greedy answer; between questions the cache goes back to its post-context state (a
    fresh cache for the decode-time methods, which evict as they go). Returns ``(predictions, n_context,
    n_kept)``; raises :class:`BudgetMismatch` if any layer holds other than ``n_kept`` keys after the context.
    """
    from transformers import DynamicCache

    ctx, _ = encode_query(tok, context, "", "")
    n = int(ctx.shape[1])
    n_kept = n if method.kind == "full" else compute_n_kept(n, ratio)
    preds: list[str] = []
    if method.kind in ("full", "prefill"):
        cache = DynamicCache()
        press = method.build(model, ratio, n_kept)
        with press(model) if press is not None else contextlib.nullcontext():
            _prefill(model, cache, ctx, None)
        lengths = _layer_lengths(cache)
        _check_kept(method, lengths, n_kept)
        for question, prefix, max_new in queries:
            _, q = encode_query(tok, "", question, prefix)
            preds.append(decode_answer(model, tok, cache, q, n, max_new))
            for layer, length in zip(cache.layers, lengths):  # drop the question and answer (kvpress does too)
                layer.keys = layer.keys[:, :, :length]  # a DynamicCache layer
                layer.values = layer.values[:, :, :length]  # a DynamicCache layer
        return preds, n, n_kept
    for question, prefix, max_new in queries:
        cache = method.build(model, ratio, n_kept)
        try:
            _prefill(model, cache, ctx, chunk if method.kind == "decode" else None)
            _check_kept(method, [cache.stored_length(i) for i in range(len(cache.layers))], n_kept)
            _, q = encode_query(tok, "", question, prefix)
            preds.append(decode_answer(model, tok, cache, q, n, max_new))
        finally:
            cache.close()
    return preds, n, n_kept


def _check_kept(method: Method, lengths: list[int], n_kept: int) -> None:
    if any(length != n_kept for length in lengths):
        raise BudgetMismatch(
            f"method {method.name!r} kept {lengths} keys per layer after the context; "
            f"every method must keep n_kept={n_kept}"
        )


def _contexts(
    task: str, seed: int, config: CompareConfig
) -> list[tuple[int, str, list[tuple[str, str, int]], list[list[str]]]]:
    rows = make_rows(task, config.n_samples, n_tokens=config.n_tokens, seed=seed)
    out = []
    for sample, part in rows.groupby("sample", sort=True):
        out.append(
            (
                int(sample),
                str(part["context"].iloc[0]),
                [(str(r.question), str(r.answer_prefix), int(r.max_new_tokens)) for r in part.itertuples()],
                [list(r.answer) for r in part.itertuples()],
            )
        )
    return out


def _ppl_windows(tok: Any, config: CompareConfig) -> Any:
    import torch

    _, held = split_corpus(config.lm.heldout_every)
    ids: list[int] = []
    for t in held.values():
        ids.extend(tok.encode(t, add_special_tokens=False))
    L = config.ppl_context + config.ppl_continuation
    n = min(config.ppl_sequences, len(ids) // L)
    if n < 1:
        raise ValueError(f"held-out text has {len(ids)} tokens; ppl_context + ppl_continuation={L} is too long")
    return torch.tensor(ids[: n * L]).view(n, L)


def _continuation_nll(model: Any, method: Method, ratio: float, seq: Any, n_ctx: int, chunk: int) -> tuple[float, int]:
    """(summed NLL, count) of the continuation after a compressed context."""
    import torch
    from transformers import DynamicCache

    ctx, cont = seq[None, :n_ctx], seq[None, n_ctx:]
    n_kept = n_ctx if method.kind == "full" else compute_n_kept(n_ctx, ratio)
    if method.kind in ("full", "prefill"):
        cache = DynamicCache()
        press = method.build(model, ratio, n_kept)
        with press(model) if press is not None else contextlib.nullcontext():
            _prefill(model, cache, ctx, None)
        _check_kept(method, _layer_lengths(cache), n_kept)
        close: Callable[[], None] = lambda: None  # noqa: E731
    else:
        cache = method.build(model, ratio, n_kept)
        _prefill(model, cache, ctx, chunk if method.kind == "decode" else None)
        _check_kept(method, [cache.stored_length(i) for i in range(len(cache.layers))], n_kept)
        close = cache.close
    try:
        with torch.no_grad():
            m = cont.shape[1]
            logits = model(
                input_ids=cont,
                position_ids=torch.arange(n_ctx, n_ctx + m).unsqueeze(0),
                use_cache=True,
                **cache_kw(model, cache),
            ).logits[0, :-1]
            nll = torch.nn.functional.cross_entropy(logits.double(), cont[0, 1:], reduction="sum")
    finally:
        close()
    return float(nll), m - 1


def bootstrap_ci(
    scores: np.ndarray, clusters: np.ndarray, *, n_boot: int, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of ``scores`` resampling whole ``clusters`` (rows of one context)."""
    scores = np.asarray(scores, dtype=np.float64)
    clusters = np.asarray(clusters)
    if scores.ndim != 1 or scores.shape != clusters.shape or not scores.size:
        raise ValueError(
            f"scores and clusters must be equal non-empty 1-d arrays, got {scores.shape}, {clusters.shape}"
        )
    n_boot = check_positive_int(n_boot, "n_boot")
    ids, inv = np.unique(clusters, return_inverse=True)
    sums = np.bincount(inv, weights=scores, minlength=len(ids))
    counts = np.bincount(inv, minlength=len(ids)).astype(np.float64)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(ids), size=(n_boot, len(ids)))
    means = sums[pick].sum(axis=1) / counts[pick].sum(axis=1)
    a = (1.0 - level) / 2.0
    return float(np.quantile(means, a)), float(np.quantile(means, 1.0 - a))


@dataclass
class CompareResult:
    """Rows (one per method, mode, task, ratio, seed, sample, query), summaries and metadata."""

    rows: Any
    summary: list[dict[str, Any]]
    perplexity: list[dict[str, Any]]
    meta: dict[str, Any]

    def save(self, out: str | Path) -> Path:
        """Write ``results.json``, ``rows.parquet`` (and ``rows.csv``); returns the folder."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(
            json.dumps({"meta": self.meta, "results": self.summary, "perplexity": self.perplexity}, indent=1)
        )
        require("pyarrow", feature="attsvm kv-compare (Parquet output)")
        df = self.rows.copy()
        df["answer"] = df["answer"].map(lambda a: " | ".join(a))
        df.to_parquet(out / "rows.parquet", index=False)
        return out


def kv_compare(
    config: CompareConfig = CompareConfig(), *, lm_dir: str | Path | None = None, progress: bool = False
) -> CompareResult:
    """Run the grid of :class:`CompareConfig` (module notes) on the model in ``lm_dir`` (a folder written by
    :func:`~attsvm.analysis.lm.train_llama_lm`), or on ``config.lm`` trained or reused from the cache."""
    import torch
    from tqdm.auto import tqdm

    pd = require("pandas", feature="attsvm kv-compare")
    if not isinstance(config, CompareConfig):
        raise TypeError(f"config must be a CompareConfig, got {type(config).__name__}")
    t0 = time.perf_counter()
    folder = train_llama_lm(None, config.lm, progress=progress) if lm_dir is None else Path(lm_dir)
    model, tok = load_llama_lm(folder)  # (names a folder that is not an LM checkpoint)
    lm_meta = json.loads((Path(folder) / "attsvm_lm.json").read_text())
    t_model = time.perf_counter() - t0
    names, skipped = available_methods(config.methods)
    if "full" not in names:
        names = ("full", *names)
    if skipped:
        log.warning(
            "kvpress is not installed: running attsvm's methods only (skipped: %s); "
            "build the kvpress environment for kvpress's presses (make install-kvpress in a clone; kvpress 0.5.5 "
            "needs transformers < 5.3)",
            ", ".join(skipped),
        )
    methods = [_method(n, config.window_size) for n in names]
    records: list[dict[str, Any]] = []
    seconds: dict[str, float] = {m.name: 0.0 for m in methods}
    jobs = [(task, seed) for task in config.tasks for seed in config.seeds]
    bar = tqdm(total=len(jobs) * len(config.query_modes), desc="kv-compare", disable=not progress, leave=False)
    for task, seed in jobs:
        contexts = _contexts(task, seed, config)
        for mode in config.query_modes:
            for sample, context, queries, answers in contexts:
                groups = (
                    [(context, list(zip(queries, answers, range(len(queries)))))]
                    if mode == "agnostic"
                    else [
                        (context + q[0], [(("", q[1], q[2]), a, i)]) for i, (q, a) in enumerate(zip(queries, answers))
                    ]
                )
                for ctx_text, items in groups:
                    qs = [it[0] for it in items]
                    kept_by_ratio: dict[float, int] = {}
                    for method in methods:
                        ratios = (0.0,) if method.kind == "full" else config.ratios
                        for ratio in ratios:
                            t1 = time.perf_counter()
                            preds, n_ctx, n_kept = answer_context(
                                model, tok, method, ratio, ctx_text, qs, chunk=config.chunk
                            )
                            seconds[method.name] += time.perf_counter() - t1
                            if method.kind != "full" and kept_by_ratio.setdefault(ratio, n_kept) != n_kept:
                                raise BudgetMismatch(
                                    f"{method.name} kept {n_kept} keys at ratio {ratio}, others {kept_by_ratio[ratio]}"
                                )
                            for pred, (_, ans, qi) in zip(preds, items):
                                records.append(
                                    {
                                        "method": method.name,
                                        "family": method.family,
                                        "kind": method.kind,
                                        "mode": mode,
                                        "task": task,
                                        "ratio": ratio,
                                        "seed": seed,
                                        "sample": sample,
                                        "query": qi,
                                        "prediction": pred,
                                        "answer": ans,
                                        "score": score_row(pred, ans),
                                        "n_context": n_ctx,
                                        "n_kept": n_kept,
                                    }
                                )
            bar.update(1)
    bar.close()
    rows = pd.DataFrame.from_records(records)
    summary = _summarise(rows, config)
    t_ppl = time.perf_counter()
    windows = _ppl_windows(tok, config)
    perplexity = []
    for method in methods:
        for ratio in (0.0,) if method.kind == "full" else config.ratios:
            tot, cnt = 0.0, 0
            for seq in windows:
                nll, c = _continuation_nll(model, method, ratio, seq, config.ppl_context, config.chunk)
                tot, cnt = tot + nll, cnt + c
            perplexity.append(
                {
                    "method": method.name,
                    "family": method.family,
                    "kind": method.kind,
                    "ratio": ratio,
                    "perplexity": math.exp(tot / cnt),
                    "n_kept": config.ppl_context
                    if method.kind == "full"
                    else compute_n_kept(config.ppl_context, ratio),
                }
            )
    full = {(s["mode"], s["task"]): s["accuracy"] for s in summary if s["method"] == "full"}
    void = [f"{task} ({mode}): {acc:.2f}" for (mode, task), acc in sorted(full.items()) if acc < config.min_accuracy]
    import transformers

    meta = {
        "config": _jsonable(dataclasses.asdict(config)),
        "model_dir": str(folder),
        "model": lm_meta,
        "methods": list(names),
        "skipped_methods": list(skipped),
        "kvpress": kvpress_available(),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "full_cache_accuracy": {f"{t}/{m}": a for (m, t), a in full.items()},
        "void": bool(void),
        "void_reasons": void,
        "seconds_model": t_model,
        "seconds_ppl": time.perf_counter() - t_ppl,
        "seconds_by_method": seconds,
        "seconds": time.perf_counter() - t0,
    }
    return CompareResult(rows, summary, perplexity, meta)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def _summarise(rows: Any, config: CompareConfig) -> list[dict[str, Any]]:
    out = []
    for (method, mode, task, ratio), part in rows.groupby(["method", "mode", "task", "ratio"], sort=True):
        clusters = part["seed"].astype(str) + ":" + part["sample"].astype(str)
        lo, hi = bootstrap_ci(part["score"].to_numpy(), clusters.to_numpy(), n_boot=config.n_boot)
        kept = sorted(set(part["n_kept"].tolist()))
        out.append(
            {
                "method": method,
                "family": part["family"].iloc[0],
                "kind": part["kind"].iloc[0],
                "mode": mode,
                "task": task,
                "ratio": float(ratio),
                "accuracy": float(part["score"].mean()),
                "ci_low": lo,
                "ci_high": hi,
                "n_kept": kept[0] if len(kept) == 1 else float(np.mean(part["n_kept"])),
                "n_kept_values": kept,
                "n_rows": len(part),
                "n_contexts": int(clusters.nunique()),
            }
        )
    return out


# ------------------------------------------------------------------------------------------------ output
def _load(out: Path) -> dict[str, Any]:
    path = Path(out) / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r} not found: run attsvm kv-compare first")
    return json.loads(path.read_text())


def plot_kv_compare(out: str | Path) -> list[Path]:
    """``accuracy.png`` (rows: query modes; panels: tasks; accuracy against compression ratio with CIs) and
    ``perplexity.png``, from ``results.json``."""
    require("matplotlib", feature="attsvm kv-compare figures")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    res = _load(out)
    summ = res["results"]
    modes = sorted({s["mode"] for s in summ})
    tasks = [t for t in TASKS if any(s["task"] == t for s in summ)]
    methods = [m for m in METHODS if any(s["method"] == m for s in summ)]
    cmap = plt.get_cmap("tab20")
    fig, axes = plt.subplots(
        len(modes), len(tasks), figsize=(3.6 * len(tasks), 3.0 * len(modes)), squeeze=False, sharey=True
    )
    for i, mode in enumerate(modes):
        for j, task in enumerate(tasks):
            ax = axes[i][j]
            for k, m in enumerate(methods):
                pts = sorted(
                    (s["ratio"], s["accuracy"], s["ci_low"], s["ci_high"])
                    for s in summ
                    if s["method"] == m and s["mode"] == mode and s["task"] == task
                )
                if not pts:
                    continue
                r, a, lo, hi = map(np.asarray, zip(*pts))
                if m == "full":
                    ax.axhline(a[0], color="k", ls="--", lw=1, label="full cache")
                    continue
                style = "-" if m in SVM_METHODS else (":" if m in ATTSVM_METHODS else "-.")
                ax.errorbar(
                    r,
                    a,
                    yerr=[a - lo, hi - a],
                    color=cmap(k % 20),
                    ls=style,
                    marker="o",
                    ms=3,
                    lw=1.2 if m in SVM_METHODS else 0.8,
                    capsize=2,
                    label=m,
                )
            ax.set_title(f"{task} ({mode})", fontsize=9)
            ax.set_xlabel("compression ratio")
            ax.set_ylim(-0.05, 1.05)
            if j == 0:
                ax.set_ylabel("accuracy (RULER string match)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=7)
    fig.suptitle("accuracy against compression; error bars: 95% bootstrap intervals over contexts", fontsize=9)
    fig.tight_layout(rect=(0, 0, 0.84, 1))
    paths = [out / "accuracy.png"]
    save_figure(fig, paths[0], dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for k, m in enumerate(methods):
        ppl = sorted((q["ratio"], q["perplexity"]) for q in res["perplexity"] if q["method"] == m)
        if not ppl:
            continue
        r_ppl, p = zip(*ppl, strict=True)
        if m == "full":
            ax.axhline(p[0], color="k", ls="--", lw=1, label="full cache")
        else:
            ls = "-" if m in SVM_METHODS else "-."
            ax.plot(r_ppl, p, marker="o", ms=3, color=cmap(k % 20), ls=ls, label=m)
    ax.set_xlabel("compression ratio")
    ax.set_ylabel("held-out perplexity")
    ax.set_yscale("log")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    paths.append(out / "perplexity.png")
    save_figure(fig, paths[1], dpi=110)
    plt.close(fig)
    return paths


MIN_VERDICT_CONTEXTS = 3  # fewer contexts in a cell: the bootstrap CI is degenerate, no verdict


def _verdicts(summ: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per mode, task, ratio and SV-margin method: its accuracy against the best other compressing method; win /
    lose when the bootstrap CIs do not overlap, tie otherwise; "too few contexts" below
    :data:`MIN_VERDICT_CONTEXTS` contexts (one context resamples to itself: its CI is a point)."""
    out = []
    keys = sorted(
        {(s["mode"], s["task"], s["ratio"]) for s in summ if s["method"] != "full"},
        key=lambda k: (k[0], TASKS.index(k[1]) if k[1] in TASKS else 99, k[2]),
    )
    for mode, task, ratio in keys:
        cell = [s for s in summ if (s["mode"], s["task"], s["ratio"]) == (mode, task, ratio)]
        others = [s for s in cell if s["method"] not in SVM_METHODS and s["method"] != "full"]
        if not others:
            continue
        best = max(others, key=lambda s: s["accuracy"])
        for s in cell:
            if s["method"] not in SVM_METHODS:
                continue
            if min(s["n_contexts"], best["n_contexts"]) < MIN_VERDICT_CONTEXTS:
                verdict = "too few contexts"
            elif s["ci_low"] > best["ci_high"]:
                verdict = "win"
            elif s["ci_high"] < best["ci_low"]:
                verdict = "lose"
            else:
                verdict = "tie"
            out.append(
                {
                    "mode": mode,
                    "task": task,
                    "ratio": ratio,
                    "svm_method": s["method"],
                    "svm": s["accuracy"],
                    "best_other": best["method"],
                    "other": best["accuracy"],
                    "verdict": verdict,
                }
            )
    return out


def write_compare_report(out: str | Path) -> Path:
    """``report.md``: the setting, the full-cache gate, the verdict table, the accuracy and perplexity tables (a
    smoke test's report, ``meta["smoke_test"]``, says :data:`SMOKE_TEST` in place of the verdict table)."""
    out = Path(out)
    res = _load(out)
    meta, summ = res["meta"], res["results"]
    smoke = bool(meta.get("smoke_test", False))
    lines = ["# kv-compare: KV-cache compression on retrieval tasks", ""]
    if smoke:
        lines += [
            f"**{SMOKE_TEST[0].upper()}{SMOKE_TEST[1:]}** (`--quick`: short contexts, one seed, the quick model). "
            "The numbers below test the machinery; no method is judged against another.",
            "",
        ]
    if meta["void"]:
        lines += [
            "**COMPARISON VOID**: the full-cache model is below the required accuracy "
            f"{meta['config']['min_accuracy']} on: " + "; ".join(meta["void_reasons"]) + ". The method "
            "differences below are not evidence about retrieval.",
            "",
        ]
    if meta["skipped_methods"]:
        lines += [
            "**attsvm's methods only**: kvpress is not installed in this environment, so its presses (and "
            "attsvm's kvpress presses) did not run: "
            + ", ".join(meta["skipped_methods"])
            + ". Run it in the kvpress environment (`make install-kvpress` in a clone: kvpress 0.5.5, transformers "
            "5.2.x) for the full comparison.",
            "",
        ]
    m = meta["model"]
    c = meta["config"]
    lines += [
        f"Model: LlamaForCausalLM, {m['n_params']:,} parameters, {m['config']['n_layer']} layers, "
        f"{m['config']['n_head']} query heads : {m['config']['n_kv_head']} KV heads (GQA), RoPE; trained "
        f"{m['train_seconds']:.0f} s; held-out perplexity {m['heldout_ppl']:.1f}.",
        f"Grid: ratios {c['ratios']}, tasks {c['tasks']}, seeds {c['seeds']}, {c['n_samples']} contexts per "
        f"task and seed, {c['n_tokens']}-token contexts, modes {c['query_modes']}; transformers "
        f"{meta['transformers']}, kvpress {'installed' if meta['kvpress'] else 'not installed'}; "
        f"{meta['seconds']:.0f} s.",
        "",
        "Full-cache accuracy: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(meta["full_cache_accuracy"].items())),
        "",
        "SV-margin (`svm_margin`): keys with the smallest support-vector margin are kept, as a kvpress press "
        "(`svm_margin_press`), a decode-time cache (`svm_margin_cache`) or a cache fed the context in one pass "
        "(`svm_margin_oneshot`); `h2o` likewise; the other names are kvpress's presses.",
        "",
    ]
    if smoke:
        lines += ["## Verdict", "", f"{SMOKE_TEST}. Rerun without `--quick` for the verdicts.", ""]
    else:
        lines += [
            "## Verdict: svm_margin against the best other method (95% bootstrap CIs; win/lose = no overlap)",
            "",
            "| mode | task | ratio | svm_margin method | acc | best other | acc | verdict |",
            "|---|---|---|---|---|---|---|---|",
        ]
        verdicts = _verdicts(summ)
        for v in verdicts:
            lines.append(
                f"| {v['mode']} | {v['task']} | {v['ratio']} | {v['svm_method']} | {v['svm']:.2f} | "
                f"{v['best_other']} | {v['other']:.2f} | {v['verdict']} |"
            )
        counts = {k: sum(v["verdict"] == k for v in verdicts) for k in ("win", "tie", "lose", "too few contexts")}
        lines += [
            "",
            f"Totals: {_count(counts['win'], 'win')}, {_count(counts['tie'], 'tie')}, "
            f"{_count(counts['lose'], 'loss', 'losses')}, {_count(counts['too few contexts'], 'cell')} with fewer "
            f"than {MIN_VERDICT_CONTEXTS} contexts (no verdict).",
            "",
        ]
    lines += ["## Accuracy (mean [95% CI], n_kept keys per layer and KV head)", ""]
    modes = sorted({s["mode"] for s in summ})
    ratios = sorted({s["ratio"] for s in summ if s["method"] != "full"})
    for mode in modes:
        for task in [t for t in TASKS if any(s["task"] == t for s in summ)]:
            lines += [
                f"### {task}, query-{mode}",
                "",
                "| method | " + " | ".join(f"r={r}" for r in ratios) + " |",
                "|---|" + "---|" * len(ratios),
            ]
            for meth in METHODS:
                cells = {s["ratio"]: s for s in summ if (s["method"], s["mode"], s["task"]) == (meth, mode, task)}
                if not cells:
                    continue
                if meth == "full":
                    s = cells[0.0]
                    lines.append(
                        f"| full | {s['accuracy']:.2f} [{s['ci_low']:.2f}, {s['ci_high']:.2f}] (all "
                        f"{s['n_kept']} keys) |" + " |" * (len(ratios) - 1)
                    )
                    continue
                lines.append(
                    f"| {meth} | "
                    + " | ".join(
                        f"{cells[r]['accuracy']:.2f} [{cells[r]['ci_low']:.2f}, {cells[r]['ci_high']:.2f}] "
                        f"({cells[r]['n_kept']})"
                        if r in cells
                        else ""
                        for r in ratios
                    )
                    + " |"
                )
            lines.append("")
    lines += [
        "## Held-out perplexity",
        "",
        "| method | " + " | ".join(f"r={r}" for r in ratios) + " |",
        "|---|" + "---|" * len(ratios),
    ]
    for meth in METHODS:
        cells = {p["ratio"]: p["perplexity"] for p in res["perplexity"] if p["method"] == meth}
        if cells:
            lines.append(
                f"| {meth} | " + " | ".join(f"{cells.get(r, cells.get(0.0, float('nan'))):.2f}" for r in ratios) + " |"
            )
    seconds = ", ".join(f"{k} {v:.0f}" for k, v in meta["seconds_by_method"].items())
    lines += ["", f"Seconds by method: {seconds}", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def _count(n: int, noun: str, plural: str | None = None) -> str:
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"
