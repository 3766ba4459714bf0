"""The support keys of a window's attention SVMs (attsvm.analysis.kv_scores.svm_support_scores): the batched
cutting-plane solve equals one AttentionSVM.fit per query on every key it sees."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attsvm import AttentionProblem
from attsvm.analysis.kv_scores import svm_support_scores
from attsvm.svm import AttentionSVM


def _window(seed: int, B=1, Hq=4, Hkv=2, w=5, K=40, d=6):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, w, d, generator=g, dtype=torch.float64) * 2
    k = torch.randn(B, Hkv, K, d, generator=g, dtype=torch.float64)
    visible = torch.arange(K)[None, :] <= (K - w + torch.arange(w))[:, None]
    return q, k, visible


def _reference(q, k, visible):
    """Per (b, KV head): how many query rows of its group select a key or need it as a support key, each SVM
    fitted alone on all the keys its query sees (no candidates, no cutting planes)."""
    B, Hq, w, d = q.shape
    Hkv, K = k.shape[1], k.shape[2]
    G = Hq // Hkv
    counts = np.zeros((B, Hkv, K))
    for b in range(B):
        for h in range(Hkv):
            for g in range(G):
                for j in range(w):
                    z = q[b, h * G + g, j].numpy()
                    seen = np.flatnonzero(visible[j].numpy())
                    X = k[b, h, seen].numpy()
                    sel = int(np.argmax(X @ z))
                    prob = AttentionProblem(X[None], np.ones(1), np.zeros(d), Z=z[None])  # (y, v: unused here)
                    est = AttentionSVM().fit(prob, [sel])
                    assert est.status_ == "optimal"
                    counts[b, h, seen[sel]] += 1
                    counts[b, h, seen[est.support_[0]]] += 1
    return counts


@pytest.mark.parametrize("n_candidates", [2, 4, 64])
@pytest.mark.parametrize("seed", [0, 1])
def test_support_counts_equal_one_fit_per_query_on_every_key(seed, n_candidates):
    q, k, visible = _window(seed)
    scores, info = svm_support_scores(q, k, visible, n_candidates=n_candidates)
    counts = np.floor(scores.numpy())  # (the tie-break lies in [0, 1/2])
    np.testing.assert_array_equal(counts, _reference(q, k, visible))
    assert info["unsolved"] == 0 and info["instances"] == 20
    if n_candidates == 2:
        assert info["rounds"] > 1  # (two candidates cannot hold the answer: the cutting planes did the work)


def test_keys_no_svm_needs_rank_by_their_sv_margin():
    q, k, visible = _window(3, K=60)
    scores, _ = svm_support_scores(q, k, visible)
    G = 2
    logits = (q.view(1, 2, G * 5, 6) @ k.transpose(-1, -2)).masked_fill(~visible.repeat(G, 1), -np.inf)
    margin = (logits.amax(-1, keepdim=True) - logits).amin(-2)[0]  # (H_kv, K)
    rest = np.floor(scores[0].numpy()) == 0
    for h in range(2):
        order = np.argsort(-scores[0, h].numpy()[rest[h]], kind="stable")
        assert np.all(np.diff(margin[h].numpy()[rest[h]][order]) >= -1e-12)
    assert bool((scores[0][~torch.from_numpy(rest)] >= 1).all())


def test_bad_candidates_are_named():
    q, k, visible = _window(0)
    with pytest.raises(ValueError, match="n_candidates"):
        svm_support_scores(q, k, visible, n_candidates=1)
