"""KV-cache compression on a real hybrid decoder: every press on Gemma 3 270M, one prefill per context.

``attsvm kv-compare --model gemma3-270m [--quick]`` (run it in the kvpress environment, ``.venv-kvpress``, for
kvpress's presses). RULER-style tasks in natural language, on haystacks of the held-out pydoc topics cut to
``n_tokens`` Gemma tokens (BOS included):

``niah_single``
    one needle "The special magic number for {word} is {5 digits}."; the question asks for it;
``niah_multikey``
    four such needles with distinct words; the question asks for one;
``mqar``
    four needles, two questions on the same context (each answered from the compressed context cache);
``vt``
    variable tracking: "VAR A = 12345.", "VAR B = VAR A.", "VAR C = VAR B."; the question asks for every
    variable holding the value;
``quote``
    a question over the real text itself, nothing inserted: the question quotes a passage of the haystack (12
    tokens at a random depth, found once in the context) and the answer must continue it with the next two
    words (the quotation format the base model answers: ``Quote from the text above: "<passage>``).

Answers are compared with runs of whitespace collapsed to one space (the text's line breaks are not words).

A task is compared only where the full cache answers at least ``min_accuracy`` (0.9) of its rows at that
context length; the others are reported with their full-cache accuracy. Methods: every kvpress 0.5.5 press of
:data:`KVPRESS_PRESSES` that runs offline on CPU (each wrapped in
:class:`~attsvm.integrations.kvpress.HybridPress`: sliding layers keep their window, the 3 global layers are
compressed), and attsvm's ``svm_margin`` and ``h2o`` presses; a press that cannot be built or run is listed with
its error. Query-agnostic (the question is not seen by the press) and, optionally, query-aware (the question is
appended to the context before compression). Every method and ratio of a context is served by one prefill
(:mod:`attsvm.analysis.kv_oneprefill`). Scores: kvpress's RULER string match (every expected string in the
answer), means over contexts with 95% bootstrap intervals; attsvm's methods against the best other press with
a paired bootstrap interval of the difference.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._folders import save_figure
from .._validation import check_positive_int
from .tasks import score_row

__all__ = ["GemmaCompareConfig", "QUICK_GEMMA", "KVPRESS_PRESSES", "make_contexts", "run_gemma_compare"]

log = logging.getLogger(__name__)

GEMMA_TASKS = ("niah_single", "niah_multikey", "mqar", "vt", "quote")
WORDS = (
    "apple",
    "river",
    "candle",
    "forest",
    "violin",
    "copper",
    "meadow",
    "rocket",
    "harbor",
    "lantern",
    "pepper",
    "glacier",
    "saddle",
    "marble",
    "falcon",
    "thimble",
    "orchard",
    "beacon",
    "walnut",
    "compass",
)
VARS = ("XKQ", "BTR", "MZL", "PWE", "DJN", "RFA", "QOV", "HUT")
# kvpress 0.5.5 presses that compress a prefill on CPU, offline: name -> (kvpress module, ratio) -> press
KVPRESS_PRESSES: dict[str, Callable[[Any, float], Any]] = {
    "knorm": lambda k, r: k.KnormPress(compression_ratio=r),
    "snapkv": lambda k, r: k.SnapKVPress(compression_ratio=r),
    "streaming_llm": lambda k, r: k.StreamingLLMPress(compression_ratio=r),
    "tova": lambda k, r: k.TOVAPress(compression_ratio=r),
    "expected_attention": lambda k, r: k.ExpectedAttentionPress(compression_ratio=r),
    "observed_attention": lambda k, r: k.ObservedAttentionPress(compression_ratio=r),
    "keydiff": lambda k, r: k.KeyDiffPress(compression_ratio=r),
    "random": lambda k, r: k.RandomPress(compression_ratio=r, seed=0),
    "cur": lambda k, r: k.CURPress(compression_ratio=r),
    "leverage": lambda k, r: k.LeverageScorePress(compression_ratio=r),
    "lagkv": lambda k, r: k.LagKVPress(compression_ratio=r),
    "pyramidkv": lambda k, r: k.PyramidKVPress(compression_ratio=r),
    "compactor": lambda k, r: k.CompactorPress(compression_ratio=r),
    "think": lambda k, r: k.ThinKPress(key_channel_compression_ratio=r),  # (compresses key channels, not tokens)
    "adakv_snapkv": lambda k, r: k.AdaKVPress(k.SnapKVPress(compression_ratio=r)),
    "criticalkv_snapkv": lambda k, r: k.CriticalKVPress(k.SnapKVPress(compression_ratio=r)),
    "kvzip": lambda k, r: k.KVzipPress(compression_ratio=r),
}
ATTSVM_PRESSES = {"svm_margin": "SVMarginPress", "svm_support": "SVMSupportPress", "h2o": "H2OPress"}


@dataclass
class GemmaCompareConfig:
    """What the comparison measures (module doc)."""

    lengths: tuple[int, ...] = (1024, 2048, 4096)
    tasks: tuple[str, ...] = GEMMA_TASKS
    ratios: tuple[float, ...] = (0.25, 0.5, 0.75, 0.9)
    contexts: int = 3  # per task and length
    query_aware: bool = False
    min_accuracy: float = 0.9
    max_new_tokens: int = 12
    n_boot: int = 1000
    seed: int = 0
    methods: tuple[str, ...] | None = None  # a subset of KVPRESS_PRESSES and ATTSVM_PRESSES (None: all)


QUICK_GEMMA = GemmaCompareConfig(lengths=(1024,), tasks=("niah_single", "niah_multikey"), ratios=(0.5,), contexts=2)


# ---------------------------------------------------------------------------------------- tasks
def _needle(word: str, num: str) -> str:
    return f"The special magic number for {word} is {num}."


def _question(word: str) -> tuple[str, str]:
    return (
        f"What is the special magic number for {word} mentioned in the provided text?",
        f"The special magic number for {word} mentioned in the provided text is",
    )


def make_contexts(tok: Any, task: str, n_tokens: int, count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` contexts of ``task`` with haystacks of held-out pydoc text, each of exactly ``n_tokens`` tokens
    (BOS first): ``{"ids": [...], "questions": [(question ids, expected strings)], "text": ...}``."""
    from .lm import split_corpus

    if task not in GEMMA_TASKS:
        raise ValueError(f"task must be one of {GEMMA_TASKS}, got {task!r}")
    n_tokens = check_positive_int(n_tokens, "n_tokens", minimum=64)
    _, held = split_corpus()
    hay = tok("\n\n".join(held.values()), add_special_tokens=False, verbose=False)["input_ids"]
    rng = random.Random(f"{task}-{n_tokens}-{seed}")
    out = []
    for _ in range(count):
        if task == "quote":
            out.append(_quote_context(tok, hay, n_tokens, rng))
            continue
        if task == "vt":
            num = str(rng.randrange(10000, 100000))
            names = rng.sample(VARS, 3)
            needles = [f"VAR {names[0]} = {num}."] + [f"VAR {names[i]} = VAR {names[i - 1]}." for i in (1, 2)]
            qa = [
                (
                    f"Find all variables that are assigned the value {num} in the text above.",
                    f"Answer: According to the chain(s) of variable assignment in the text above, 3 variables are "
                    f"assigned the value {num}, they are:",
                    names,
                )
            ]
        else:
            k = 1 if task == "niah_single" else 4
            words = rng.sample(WORDS, k)
            nums = [str(rng.randrange(10000, 100000)) for _ in words]
            needles = [_needle(w, n) for w, n in zip(words, nums)]
            asked = [0] if task != "mqar" else [0, 1]
            qa = [(*_question(words[j]), [nums[j]]) for j in asked]
        needle_ids = [tok(" " + s + " ", add_special_tokens=False)["input_ids"] for s in needles]
        n_fill = n_tokens - 1 - sum(len(x) for x in needle_ids)
        if n_fill < 16 or n_fill > len(hay):
            raise ValueError(f"n_tokens={n_tokens} leaves {n_fill} haystack tokens for task {task!r}")
        start = rng.randrange(0, len(hay) - n_fill)
        body = list(hay[start : start + n_fill])
        # at random depths (10%-90%) of the haystack, token-exact; inserted from the deepest up, so that no needle
        # lands inside another
        depths = sorted((rng.randrange(n_fill // 10, 9 * n_fill // 10) for _ in needle_ids), reverse=True)
        for at, ids in zip(depths, needle_ids):
            body[at:at] = ids
        ids = [int(tok.bos_token_id), *body]
        questions = [
            (tok("\n\n" + q + "\n" + prefix, add_special_tokens=False)["input_ids"], ans) for q, prefix, ans in qa
        ]
        out.append({"ids": ids, "questions": questions})
    return out


def _quote_context(tok: Any, hay: Sequence[int], n_tokens: int, rng: random.Random) -> dict[str, Any]:
    """A ``quote`` context: ``n_tokens − 1`` haystack tokens after BOS, and a question quoting 12 of them (a passage
    found once in the context, on one line, ending where a word ends) whose answer is the next two words."""
    words = re.compile(r"[A-Za-z]+")
    for _ in range(100):
        start = rng.randrange(0, len(hay) - n_tokens)
        body = list(hay[start : start + n_tokens - 1])
        text = tok.decode(body)
        for _ in range(50):
            at = rng.randrange(len(body) // 10, 9 * len(body) // 10)
            passage = tok.decode(body[at : at + 12]).strip()
            after = tok.decode(body[at + 12 : at + 24])
            nxt = after.split()[:2]
            if (
                len(passage.split()) >= 6
                and "\n" not in passage
                and after[:1].isspace()
                and len(nxt) == 2
                and all(words.fullmatch(w) for w in nxt)
                and text.count(passage) == 1
            ):
                q = tok(f'\n\nQuote from the text above: "{passage}', add_special_tokens=False)["input_ids"]
                return {"ids": [int(tok.bos_token_id), *body], "questions": [(q, [" ".join(nxt)])]}
    raise ValueError(f"n_tokens={n_tokens}: no passage of the haystack can be quoted for task 'quote'")


# ---------------------------------------------------------------------------------------- methods
def build_methods(ratios: Sequence[float]) -> tuple[dict[tuple[str, float], Any], dict[str, str]]:
    """``{(method, ratio): press}`` for every press that can be built (kvpress's wrapped in HybridPress), and
    ``{method: error}`` for those that cannot (kvpress missing included)."""
    methods: dict[tuple[str, float], Any] = {}
    errors: dict[str, str] = {}
    try:
        import kvpress

        from ..integrations import kvpress as akv
    except ImportError as exc:
        for name in [*KVPRESS_PRESSES, *ATTSVM_PRESSES]:
            errors[name] = f"kvpress is not installed ({exc}); run in the kvpress environment"
        return methods, errors
    for name, make in KVPRESS_PRESSES.items():
        try:
            for r in ratios:
                methods[(name, r)] = akv.HybridPress(make(kvpress, r))
        except Exception as exc:  # (a press this kvpress cannot build here is reported, not fatal)
            errors[name] = f"{type(exc).__name__}: {exc}"
            for r in ratios:
                methods.pop((name, r), None)
    for name, cls_name in ATTSVM_PRESSES.items():
        for r in ratios:
            methods[(name, r)] = getattr(akv, cls_name)(compression_ratio=r)
    return methods, errors


# ---------------------------------------------------------------------------------------- the run
def context_scores(
    model: Any,
    tok: Any,
    ctx: dict[str, Any],
    methods: dict[tuple[str, float], Any],
    config: GemmaCompareConfig,
    errors: dict[str, str],
    *,
    full_must_pass: bool = False,
) -> dict[tuple[str, float], float]:
    """Mean RULER score over a context's questions for the full cache (``("full", 0.0)``) and every method, from
    one prefill per context (query-agnostic) or per question (query-aware: the question, all but its last
    token, is prefilled and compressed with the context; its last token starts the answer). With
    ``full_must_pass``, a context the full cache does not answer in full gets the full cache's score only (its
    task can no longer pass the gate: the methods are not run)."""
    import torch

    from .kv_oneprefill import answers_from_caches, compressed_cache, record_prefill

    recs: list[tuple[Any, Any, Any]] = []
    for q, expected in ctx["questions"]:
        if config.query_aware:
            rec = record_prefill(model, torch.tensor([ctx["ids"] + q[:-1]]))
            qids = torch.tensor([q[-1:]])
        else:
            rec = recs[0][0] if recs else record_prefill(model, torch.tensor([ctx["ids"]]))
            qids = torch.tensor([q])
        recs.append((rec, qids, expected))
    per: dict[tuple[str, float], list[float]] = {}

    def fail(key: tuple[str, float], exc: Exception) -> None:  # (a press that cannot run is reported, then skipped)
        errors[key[0]] = f"{type(exc).__name__}: {str(exc)[:200]}"
        log.warning("kv-compare: %s cannot run on Gemma 3: %s", key[0], errors[key[0]])

    def run(todo: dict[tuple[str, float], Any]) -> None:
        """Score every method of ``todo`` on every question: its caches are built from the one record and the
        answers to a question decoded together (one batch row per method and ratio)."""
        for rec, qids, expected in recs:
            keys, caches = [], []
            for key, press in todo.items():
                if key[0] in errors:
                    continue
                try:
                    caches.append(compressed_cache(rec, press, model, seed=config.seed))
                    keys.append(key)
                except Exception as exc:
                    fail(key, exc)
            answers = answers_from_caches(model, caches, qids, rec.context_length, config.max_new_tokens)
            for key, ans in zip(keys, answers, strict=True):
                if isinstance(ans, Exception):
                    fail(key, ans)
                    continue
                said = " ".join(tok.decode(ans, skip_special_tokens=True).split())  # (line breaks are not words)
                per.setdefault(key, []).append(score_row(said, expected))
        for key in list(per):
            if key[0] in errors:
                del per[key]

    run({("full", 0.0): None})
    if not (full_must_pass and np.mean(per.get(("full", 0.0), [0.0])) < 1.0):
        run({k: v for k, v in methods.items() if k[0] not in errors})
    return {k: float(np.mean(v)) for k, v in per.items()}


def _ci(x: np.ndarray, n_boot: int, seed: int) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def run_gemma_compare(
    out: str | Path,
    config: GemmaCompareConfig | None = None,
    *,
    model: Any = None,
    tok: Any = None,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Run the comparison (module doc) and write ``results.json`` (redrawn from on a rerun: finished cells are kept),
    ``report.md`` and ``kv_gemma.png`` to ``out``. ``model``/``tok`` default to Gemma 3 270M."""
    from tqdm.auto import tqdm

    config = config or GemmaCompareConfig()
    if not config.ratios or any(not (isinstance(r, float | int) and 0.0 <= r < 1.0) for r in config.ratios):
        raise ValueError(f"ratios must be numbers in [0, 1), got {config.ratios}")
    for n in config.lengths:
        check_positive_int(n, "lengths", minimum=64)
    check_positive_int(config.contexts, "contexts")
    bad = sorted(set(config.tasks) - set(GEMMA_TASKS))
    if bad or not config.tasks:
        raise ValueError(f"tasks must be among {GEMMA_TASKS}, got {config.tasks}")
    outp = Path(out)
    store = outp / "results.json"
    if store.is_file():  # a rerun resumes its own run only: contexts measured under other settings never mix in
        before = json.loads(store.read_text()).get("config")
        if before != json.loads(json.dumps(asdict(config))):
            raise ValueError(
                f"out {str(outp)!r} holds a run with other settings ({before}); use another folder or the same settings"
            )
    outp.mkdir(parents=True, exist_ok=True)
    if model is None:
        from ._models import load_model

        model, tok = load_model("gemma3-270m", causal_lm=True)
    methods, errors = build_methods(config.ratios)
    if config.methods is not None:
        known = {*KVPRESS_PRESSES, *ATTSVM_PRESSES}
        unknown = sorted(set(config.methods) - known)
        if unknown:
            raise ValueError(f"methods must be among {sorted(known)}, got unknown {unknown}")
        methods = {k: v for k, v in methods.items() if k[0] in config.methods}
        errors = {k: v for k, v in errors.items() if k in config.methods}
    done: dict[str, Any] = json.loads(store.read_text())["cells"] if store.is_file() else {}
    cells = [(t, n, c) for n in config.lengths for t in config.tasks for c in range(config.contexts)]
    disable = (not sys.stderr.isatty()) if progress is None else not progress
    t0 = time.perf_counter()
    for task, n, c in tqdm(cells, desc="kv-compare gemma", unit="context", disable=disable):
        key = f"{task}|{n}|{c}|{'qa' if config.query_aware else 'qg'}"
        if key in done:
            continue
        ctx = make_contexts(tok, task, n, c + 1, config.seed)[c]
        mode = "qa" if config.query_aware else "qg"
        failed = sum(
            v.get("full|0.0", 0.0) < 1.0 for k, v in done.items() if k.startswith(f"{task}|{n}|") and k.endswith(mode)
        )
        allowed = math.floor((1.0 - config.min_accuracy) * config.contexts + 1e-9)  # full-cache misses the gate allows
        sc = context_scores(
            model, tok, ctx, methods if failed <= allowed else {}, config, errors, full_must_pass=failed >= allowed
        )
        done[key] = {f"{m}|{r}": v for (m, r), v in sc.items()}
        store.write_text(json.dumps({"config": asdict(config), "cells": done, "errors": errors}, indent=1))
    results = summarise(done, config, errors)
    results["seconds"] = time.perf_counter() - t0
    store.write_text(
        json.dumps({"config": asdict(config), "cells": done, "errors": errors, "summary": results}, indent=1)
    )
    write_report(outp, results, config)
    return results


def summarise(cells: dict[str, Any], config: GemmaCompareConfig, errors: dict[str, str]) -> dict[str, Any]:
    """Accuracy per (task, length, method, ratio) with CIs, the full-cache gate and attsvm's verdicts."""
    mode = "qa" if config.query_aware else "qg"
    table: list[dict[str, Any]] = []
    verdicts: list[dict[str, Any]] = []
    gates: dict[str, float] = {}
    for task in config.tasks:
        for n in config.lengths:
            rows = [cells[k] for k in cells if k.startswith(f"{task}|{n}|") and k.endswith(mode)]
            if not rows:
                continue
            full = np.array([r.get("full|0.0", np.nan) for r in rows])
            gates[f"{task}|{n}"] = float(np.nanmean(full))
            if np.nanmean(full) < config.min_accuracy:
                continue
            names = sorted({k.split("|")[0] for r in rows for k in r} - {"full"})
            for ratio in config.ratios:
                acc: dict[str, np.ndarray] = {}
                for m in names:
                    v = np.array([r.get(f"{m}|{ratio}", np.nan) for r in rows])
                    if np.isnan(v).any():
                        continue
                    acc[m] = v
                    lo, hi = _ci(v, config.n_boot, config.seed)
                    table.append(
                        {"task": task, "n": n, "ratio": ratio, "method": m, "acc": float(v.mean()), "ci": [lo, hi]}
                    )
                others = {m: v for m, v in acc.items() if m not in ATTSVM_PRESSES}
                if not others:
                    continue
                best = max(others, key=lambda m: others[m].mean())
                for m in ATTSVM_PRESSES:
                    if m not in acc:
                        continue
                    lo, hi = _ci(acc[m] - others[best], config.n_boot, config.seed)
                    verdict = "win" if lo > 0 else "loss" if hi < 0 else "tie"
                    verdicts.append(
                        {
                            "task": task,
                            "n": n,
                            "ratio": ratio,
                            "method": m,
                            "best_other": best,
                            "diff": float((acc[m] - others[best]).mean()),
                            "ci": [lo, hi],
                            "verdict": verdict,
                        }
                    )
    return {"table": table, "verdicts": verdicts, "full_cache_accuracy": gates, "errors": dict(errors)}


def redraw(out: str | Path) -> Path:
    """``report.md`` and ``kv_gemma.png`` again from a finished run's ``results.json`` (nothing recomputed)."""
    outp = Path(out)
    store = json.loads((outp / "results.json").read_text())
    if "summary" not in store:
        raise ValueError(f"out must hold a finished run's results.json, got an unfinished one in {outp}")
    cfg = dict(store["config"])
    for k in ("lengths", "tasks", "ratios", "methods"):
        if cfg.get(k) is not None:
            cfg[k] = tuple(cfg[k])
    return write_report(outp, store["summary"], GemmaCompareConfig(**cfg))


def write_report(outp: Path, results: dict[str, Any], config: GemmaCompareConfig) -> Path:
    """``report.md`` and ``kv_gemma.png`` from the summary."""
    import matplotlib

    matplotlib.use("Agg")

    lines = [
        "# KV-cache compression on Gemma 3 270M (sliding layers keep their window; global layers compressed)",
        "",
        f"Settings: {asdict(config)}. One prefill per context serves every method and ratio. Accuracy: kvpress's "
        "RULER string match, means over contexts with 95% bootstrap intervals. Q4_K_M weights (dequantised).",
        "",
    ]
    if config.contexts < 3:
        lines += ["**A smoke run: too few contexts for evidence.**", ""]
    lines += [f"## Full cache per task and length (the gate: ≥ {config.min_accuracy:.2f})", ""]
    lines += [
        f"- {k}: {v:.2f}{'' if v >= config.min_accuracy else ' (below the gate: not compared)'}"
        for k, v in results["full_cache_accuracy"].items()
    ]
    lines += [
        "",
        "## Accuracy",
        "",
        "| task | tokens | ratio | method | accuracy | 95% CI |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(results["table"], key=lambda r: (r["task"], r["n"], r["ratio"], -r["acc"])):
        lines.append(
            f"| {r['task']} | {r['n']} | {r['ratio']} | {r['method']} | {r['acc']:.2f} | "
            f"[{r['ci'][0]:.2f}, {r['ci'][1]:.2f}] |"
        )
    lines += [
        "",
        "## attsvm against the best other press",
        "",
        "| task | tokens | ratio | method | best other | difference | 95% CI | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v in results["verdicts"]:
        lines.append(
            f"| {v['task']} | {v['n']} | {v['ratio']} | {v['method']} | {v['best_other']} | "
            f"{v['diff']:+.2f} | [{v['ci'][0]:+.2f}, {v['ci'][1]:+.2f}] | {v['verdict']} |"
        )
    lines += ["", "## Presses that could not run", ""]
    lines += [f"- {k}: {e}" for k, e in results["errors"].items()] or ["- none"]
    (outp / "report.md").write_text("\n".join(lines) + "\n")
    _plot(results, config, outp / "kv_gemma.png")
    return outp / "report.md"


def _plot(results: dict[str, Any], config: GemmaCompareConfig, path: Path) -> None:
    """Accuracy against compression ratio: one panel per task (rows) and context length (columns), attsvm's presses
    bold, one legend for the figure; a cell whose full cache misses the gate says so instead of a plot."""
    import matplotlib.pyplot as plt

    from .._style import figure_legend, style, subplots

    tasks = [t for t in config.tasks if any(k.startswith(f"{t}|") for k in results["full_cache_accuracy"])]
    lengths = list(config.lengths)
    methods = sorted({r["method"] for r in results["table"]})
    others = [m for m in methods if m not in ATTSVM_PRESSES]
    colour: dict[str, Any] = {m: plt.get_cmap("tab20")(k % 20) for k, m in enumerate(others)}  # (≤ 20 distinct)
    colour.update({"svm_support": "black", "svm_margin": "crimson", "h2o": "darkgreen"})  # (attsvm's: fixed)
    with style():
        fig, axes = subplots(len(lengths), max(1, len(tasks)), width=3.0, height=2.3, sharex=True, sharey=True)
        for a, task in enumerate(tasks):
            for b, n in enumerate(lengths):
                ax = axes[a, b]
                ax.set_title(f"{task}, {n:,} tokens")
                ax.set_ylim(-0.05, 1.05)
                gate = results["full_cache_accuracy"].get(f"{task}|{n}")
                rows = [r for r in results["table"] if (r["task"], r["n"]) == (task, n)]
                if not rows:
                    why = (
                        "not run"
                        if gate is None
                        else f"full cache {gate:.2f} < {config.min_accuracy:.2f}:\nnot compared"
                    )
                    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="0.4")
                for m in methods:
                    pts = sorted((r["ratio"], r["acc"]) for r in rows if r["method"] == m)
                    if pts:
                        mine = m in ATTSVM_PRESSES
                        style_ = "o-" if mine else ".--"
                        ax.plot(*zip(*pts), style_, color=colour[m], lw=2 if mine else 0.9, ms=4, label=m)
                if b == 0:
                    ax.set_ylabel("accuracy (RULER match)")
                if a == len(tasks) - 1:
                    ax.set_xlabel("compression ratio, global layers")
        figure_legend(fig, ncol=6)
        fig.suptitle("Gemma 3 270M: accuracy against compression (attsvm's presses bold; one prefill per context)")
        save_figure(fig, path)
    plt.close(fig)
