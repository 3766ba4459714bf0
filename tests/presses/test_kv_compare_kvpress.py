"""`attsvm kv-compare` with kvpress's presses (the kvpress environment: kvpress 0.5.5, transformers 5.2.x)."""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("pandas")
pytest.importorskip("kvpress")  # importing it patches attention globally: only in its own environment

from attsvm.analysis.kv_compare import (
    ATTSVM_PRESSES,
    KVPRESS_METHODS,
    QUICK_COMPARE,
    _method,
    answer_context,
    available_methods,
    compute_n_kept,
    kv_compare,
    write_compare_report,
)
from attsvm.analysis.lm import TINY_RETRIEVAL_LM, load_llama_lm, train_llama_lm
from attsvm.analysis.tasks import make_rows

pytestmark = pytest.mark.models

N_TOKENS = 40


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = train_llama_lm(tmp_path_factory.mktemp("lm") / "tiny", TINY_RETRIEVAL_LM)
    return (folder, *load_llama_lm(folder))


def _rows():
    rows = make_rows("mqar", 1, n_tokens=N_TOKENS, seed=5)
    return rows["context"][0], [(r.question, r.answer_prefix, r.max_new_tokens) for r in rows.itertuples()]


@pytest.mark.parametrize("name", ["full", "snapkv", "knorm", "tova", "streaming_llm"])
def test_our_runner_answers_as_kvpress_pipeline(tiny, name):
    from kvpress import KVPressTextGenerationPipeline

    _, model, tok = tiny
    context, queries = _rows()
    method = _method(name, 4)
    ratio = 0.0 if name == "full" else 0.5
    ours, _, _ = answer_context(model, tok, method, ratio, context, queries)
    pipe = KVPressTextGenerationPipeline(model=model, tokenizer=tok, device="cpu")
    press = method.build(model, ratio, 0)
    for (question, prefix, max_new), answer in zip(queries, ours):
        theirs = pipe(context, question=question, answer_prefix=prefix, press=press, max_new_tokens=max_new)["answer"]
        assert theirs == answer


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75, 0.9])
def test_every_press_keeps_n_kept_keys_per_layer(tiny, ratio):
    _, model, tok = tiny
    context, queries = _rows()
    names, skipped = available_methods(KVPRESS_METHODS + ATTSVM_PRESSES)
    assert not skipped
    for name in names:  # answer_context raises BudgetMismatch if any layer keeps another number
        _, n, kept = answer_context(model, tok, _method(name, 4), ratio, context, queries[:1])
        assert kept == compute_n_kept(n, ratio), name


def test_kv_compare_runs_kvpress_presses_beside_attsvm(tiny, tmp_path):
    folder = tiny[0]
    config = dataclasses.replace(
        QUICK_COMPARE,
        n_tokens=N_TOKENS,
        n_samples=1,
        ratios=(0.5,),
        tasks=("niah_single",),
        chunk=8,
        window_size=4,
        ppl_sequences=1,
        ppl_context=24,
        ppl_continuation=8,
        n_boot=50,
        lm=TINY_RETRIEVAL_LM,
    )
    res = kv_compare(config, lm_dir=folder)
    out = res.save(tmp_path / "cmp")
    data = json.loads((out / "results.json").read_text())
    assert {s["method"] for s in data["results"]} >= set(KVPRESS_METHODS) | set(ATTSVM_PRESSES) | {"svm_margin_cache"}
    assert not data["meta"]["skipped_methods"]
    assert "attsvm's methods only" not in write_compare_report(out).read_text()
