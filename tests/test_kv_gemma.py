"""kv-compare on Gemma 3 (attsvm.analysis.kv_gemma): the task contexts, the full-cache gate and the run's
resumable store, on a tiny random Gemma 3 with a small byte-level tokenizer (smoke tests of the machinery; the
presses themselves are compared with kvpress's pipeline in tests/presses/test_oneprefill.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attsvm.analysis import kv_gemma
from attsvm.analysis.lm import build_tokenizer, split_corpus
from tiny_models import tiny_gemma3


@pytest.fixture(scope="module")
def tiny():
    _, held = split_corpus()
    tok = build_tokenizer([*list(held.values())[:3], "The special magic number for apple is 12345."], 320)
    tok.bos_token = tok.eos_token  # (the byte-level tokenizer has one special token)
    net = tiny_gemma3(len(tok), positions=1024, q_scale=1.0)
    net.generation_config.eos_token_id = tok.eos_token_id
    return net, tok


@pytest.mark.parametrize("task", kv_gemma.GEMMA_TASKS)
def test_contexts_have_exact_lengths_and_their_needles(tiny, task):
    _, tok = tiny
    ctxs = kv_gemma.make_contexts(tok, task, 300, 2, seed=0)
    assert len(ctxs) == 2 and ctxs[0]["ids"] != ctxs[1]["ids"]
    for ctx in ctxs:
        assert len(ctx["ids"]) == 300 and ctx["ids"][0] == tok.bos_token_id
        text = " ".join(tok.decode(ctx["ids"]).split())
        for _, expected in ctx["questions"]:
            assert all(e in text for e in expected)  # every expected answer is in the context
    assert len(ctxs[0]["questions"]) == (2 if task == "mqar" else 1)
    assert kv_gemma.make_contexts(tok, task, 300, 2, seed=0) == ctxs  # seeded
    with pytest.raises(ValueError, match="task must be one of"):
        kv_gemma.make_contexts(tok, "nope", 300, 1, seed=0)


def test_the_run_gates_on_the_full_cache_and_resumes(tiny, tmp_path: Path):
    net, tok = tiny
    cfg = kv_gemma.GemmaCompareConfig(lengths=(128,), tasks=("niah_single",), ratios=(0.5,), contexts=2)
    res = kv_gemma.run_gemma_compare(tmp_path, cfg, model=net, tok=tok, progress=False)
    # a random model answers nothing: the task is below the gate and not compared
    assert res["full_cache_accuracy"] == {"niah_single|128": 0.0} and res["table"] == []
    stored = json.loads((tmp_path / "results.json").read_text())
    assert len(stored["cells"]) == 2 and all("full|0.0" in c for c in stored["cells"].values())
    report = (tmp_path / "report.md").read_text()
    assert "below the gate" in report and "smoke run" in report
    # a rerun keeps the finished contexts (nothing recomputed: the scorer is never called)
    called = []
    orig = kv_gemma.context_scores
    kv_gemma.context_scores = lambda *a, **k: called.append(1) or orig(*a, **k)
    try:
        kv_gemma.run_gemma_compare(tmp_path, cfg, model=net, tok=tok, progress=False)
    finally:
        kv_gemma.context_scores = orig
    assert called == []


def test_unknown_methods_are_named(tiny, tmp_path: Path):
    net, tok = tiny
    cfg = kv_gemma.GemmaCompareConfig(lengths=(128,), tasks=("niah_single",), contexts=1, methods=("snapkv", "nope"))
    with pytest.raises(ValueError, match=r"unknown \['nope'\]"):
        kv_gemma.run_gemma_compare(tmp_path, cfg, model=net, tok=tok, progress=False)


def test_a_finished_run_redraws_without_recomputing(tiny, tmp_path: Path):
    net, tok = tiny
    cfg = kv_gemma.GemmaCompareConfig(lengths=(128,), tasks=("niah_single",), ratios=(0.5,), contexts=1)
    kv_gemma.run_gemma_compare(tmp_path, cfg, model=net, tok=tok, progress=False)
    (tmp_path / "report.md").unlink()
    (tmp_path / "kv_gemma.png").unlink()
    assert kv_gemma.redraw(tmp_path) == tmp_path / "report.md"
    assert (tmp_path / "kv_gemma.png").stat().st_size > 0 and "Full cache" in (tmp_path / "report.md").read_text()


def test_a_folder_of_another_run_is_refused_and_bad_settings_are_named(tiny, tmp_path: Path):
    net, tok = tiny
    cfg = kv_gemma.GemmaCompareConfig(lengths=(128,), tasks=("niah_single",), ratios=(0.5,), contexts=1)
    kv_gemma.run_gemma_compare(tmp_path, cfg, model=net, tok=tok, progress=False)
    other = kv_gemma.GemmaCompareConfig(lengths=(128,), tasks=("niah_single",), ratios=(0.25,), contexts=1)
    with pytest.raises(ValueError, match="holds a run with other settings"):
        kv_gemma.run_gemma_compare(tmp_path, other, model=net, tok=tok, progress=False)
    for bad, match in (
        ({"ratios": (1.5,)}, "ratios must be"),
        ({"tasks": ("x",)}, "tasks must be"),
        ({"lengths": (10,)}, "lengths"),
    ):
        with pytest.raises(ValueError, match=match):
            kv_gemma.run_gemma_compare(tmp_path / "new", kv_gemma.GemmaCompareConfig(**bad), model=net, tok=tok)


def test_a_quote_question_quotes_the_context_once_and_asks_for_the_next_two_words(tiny):
    _, tok = tiny
    for ctx in kv_gemma.make_contexts(tok, "quote", 400, 3, seed=1):
        text = " ".join(tok.decode(ctx["ids"][1:]).split())
        ((q, (expected,)),) = ctx["questions"]
        passage = tok.decode(q).split('Quote from the text above: "', 1)[1]
        assert text.count(passage) == 1 and f"{passage} {expected}" in text
        assert len(expected.split()) == 2 and expected.replace(" ", "").isalpha()


def test_the_figure_has_one_legend_labelled_panels_and_says_which_cells_missed_the_gate(tmp_path: Path, monkeypatch):
    """Every task × length gets a panel; a cell whose full cache missed the gate says so; one legend per figure."""
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    figs = []
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(
        matplotlib.figure.Figure, "savefig", lambda self, *a, **k: (figs.append(self), real(self, *a, **k))[1]
    )
    cfg = kv_gemma.GemmaCompareConfig(lengths=(1024, 2048), tasks=("niah_single", "quote"), ratios=(0.5,), contexts=3)
    table = [
        {"task": "niah_single", "n": n, "ratio": 0.5, "method": m, "acc": 1.0, "ci": [1.0, 1.0]}
        for n in (1024, 2048)
        for m in ("snapkv", "svm_support")
    ]
    gates = {"niah_single|1024": 1.0, "niah_single|2048": 1.0, "quote|1024": 0.67, "quote|2048": 0.33}
    results = {"table": table, "verdicts": [], "full_cache_accuracy": gates, "errors": {}}
    kv_gemma.write_report(tmp_path, results, cfg)
    fig = figs[0]
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert len(panels) == 4 and all(ax.get_xlabel() for ax in panels if ax.get_subplotspec().rowspan.start == 1)
    assert sum(ax.get_legend() is not None for ax in fig.axes) + len(fig.legends) == 1
    said = " ".join(t.get_text() for ax in panels for t in ax.texts)
    assert said.count("not compared") == 2 and "0.67 < 0.90" in said
    assert {ax.get_ylabel() for ax in panels if ax.get_subplotspec().colspan.start == 0} == {"accuracy (RULER match)"}
