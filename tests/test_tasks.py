"""RULER-style retrieval tasks: seeded generators, kvpress's row schema, no leaks, kvpress's string-match rule."""

from __future__ import annotations

import numpy as np
import pytest

pd = pytest.importorskip("pandas")

from attsvm.analysis.tasks import (
    KEY_CODES,
    TASKS,
    VALUE_CODES,
    TaskSpec,
    filler_words,
    make_rows,
    ruler_scores,
    sample_example,
    score_row,
    split_words,
    string_match_all,
    string_match_part,
)

N_TOKENS = 160  # small contexts: the rules do not depend on the length
SEEDS = range(6)
KVPRESS_COLUMNS = ["context", "question", "answer_prefix", "answer", "max_new_tokens"]


@pytest.mark.parametrize("task", TASKS)
def test_generators_are_deterministic_per_seed(task):
    a = make_rows(task, 3, n_tokens=N_TOKENS, seed=7)
    b = make_rows(task, 3, n_tokens=N_TOKENS, seed=7)
    c = make_rows(task, 3, n_tokens=N_TOKENS, seed=8)
    pd.testing.assert_frame_equal(a, b)
    assert not a["context"].equals(c["context"])
    assert list(a.columns[:5]) == KVPRESS_COLUMNS


@pytest.mark.parametrize("task", TASKS)
def test_contexts_have_exactly_n_tokens_and_hold_the_answer(task):
    rows = make_rows(task, 4, n_tokens=N_TOKENS, seed=1)
    for r in rows.itertuples():
        words = split_words(r.context)
        assert len(words) == N_TOKENS
        assert all(a in words for a in r.answer)
        if task == "vt":  # the chain: value -> first variable -> ... in order
            src = r.answer_prefix.split()[-1]
            for var in r.answer:
                i = next(j for j in range(len(words) - 1) if words[j] == src and words[j + 1] == var)
                assert words[i + 2] == "."
                src = var
        else:  # the needle "key value ." with the key asked in the prefix
            key = r.answer_prefix.split()[-1]
            assert key in KEY_CODES and words.count(key) == 1
            assert words[words.index(key) + 1] == r.answer[0]


@pytest.mark.parametrize("task", TASKS)
def test_the_answer_is_never_leaked_into_the_question_or_prefix(task):
    for seed in SEEDS:
        for r in make_rows(task, 3, n_tokens=N_TOKENS, seed=seed).itertuples():
            asked = set(split_words(r.question)) | set(split_words(r.answer_prefix))
            assert not asked & set(r.answer), (r.question, r.answer_prefix, r.answer)
            assert all(a.lower() not in (r.question + r.answer_prefix).lower() for a in r.answer)


def test_rows_of_a_multi_query_context_share_it_and_ask_distinct_keys():
    spec = TaskSpec()
    rows = make_rows("mqar", 2, n_tokens=N_TOKENS, seed=0)
    assert len(rows) == 2 * spec.n_queries
    for _, part in rows.groupby("sample"):
        assert part["context"].nunique() == 1
        assert part["answer_prefix"].nunique() == spec.n_queries


def test_codes_are_never_substrings_of_each_other():
    codes = KEY_CODES + VALUE_CODES
    assert len({len(c) for c in codes}) == 1 and len(set(codes)) == len(codes)
    assert not set(codes) & set(filler_words("heldout"))


def test_train_and_heldout_filler_differ():
    assert filler_words("train")[:200] != filler_words("heldout")[:200]


# kvpress's RULER rule (evaluation/benchmarks/ruler/calculate_metrics.py): strip, drop control characters, strip;
# a reference counts if it is a case-insensitive substring; "all" = fraction found, "part" = any found;
# a task's score is the row mean in percent rounded to 2 decimals; tasks named qa_* use "part".
def test_scoring_follows_kvpress_ruler_string_match():
    assert score_row("  V42 .\n", ["v42"]) == 1.0
    assert score_row("k03 k11", ["k03", "k11", "k20"]) == pytest.approx(2 / 3)
    assert score_row("k03 k11", ["k03", "k11", "k20"], rule="part") == 1.0
    assert score_row("nothing", ["k03", "k11"], rule="part") == 0.0
    assert score_row("v4\x072", ["v42"]) == 1.0  # control characters are removed before matching
    assert score_row("v4 2", ["v42"]) == 0.0
    preds = ["v42", "V17 and v03", "none"]
    refs = [["v42"], ["v17", "v03", "v99"], ["v01"]]
    assert string_match_all(preds, refs) == round(100 * (1 + 2 / 3 + 0) / 3, 2) == 55.56
    assert string_match_part(preds, refs) == round(100 * 2 / 3, 2)
    df = pd.DataFrame(
        {
            "task": ["niah_single", "niah_single", "qa_1", "qa_1"],
            "answer": [["a"], ["b", "c"], ["x", "y"], ["z"]],
            "predicted_answer": ["A", "b", "y", "q"],
        }
    )
    assert ruler_scores(df) == {"niah_single": 75.0, "qa_1": 50.0}


def test_bad_input_is_named():
    rng = np.random.default_rng(0)
    words = filler_words("heldout")
    with pytest.raises(ValueError, match="task"):
        make_rows("niah", 1, n_tokens=N_TOKENS)
    with pytest.raises(ValueError, match="n_tokens must exceed"):
        sample_example("mqar", rng, words, 10)
    with pytest.raises(TypeError, match=r"rng must be a numpy\.random\.Generator"):
        sample_example("vt", 0, words, N_TOKENS)
    with pytest.raises(ValueError, match="n_queries must be <="):
        TaskSpec(n_queries=9, mqar_needles=8)
    with pytest.raises(ValueError, match="answers must be a non-empty list"):
        score_row("x", "x")
    with pytest.raises(ValueError, match="split"):
        filler_words("test")
    with pytest.raises(ValueError, match="equally long"):
        string_match_all(["a"], [])
