"""Head anatomy of a real transformer: low rank, sparsity, margins, low-rank compression (docs/spec.md §7).

For every layer ℓ and head h (``W`` in the paper's convention, see :mod:`attsvm.analysis._models`):

* **spectrum** of ``W_h = s·W_kᵀW_q`` (d × d, s = 1/√d_head stated in the report), its numerical rank
  (≤ d_head by construction), effective rank and ``‖W_h‖_*/‖W_h‖_F`` against the ceiling √d_head;
* **sparsity** over the corpus: the share of query positions whose top-1 (top-3) keys hold ≥ 95 % of
  the attention mass, the mean mass on special tokens ([CLS]/[SEP]) and the top-1 share once the
  special keys are removed (renormalised);
* **margins** ``logit_top − logit_t`` (docs/spec.md §2 margins of the selection "top key"), as a histogram, and
  the number of *support keys* per query: keys within ``delta`` of the top logit, the top included;
* **low-rank compression**: truncate the bilinear part of W_h to rank r (biases kept) and measure the
  KL divergence KL(p ‖ p_r) and the top-1 agreement of attention against r.

Logits are computed in float64 from the extracted weights and the model's own hidden states; they
agree with the model's ``output_attentions`` to ~1e-6 (tested).

RoPE models (Gemma 3, sliding and global layers) have no single bilinear form per head; for them
:func:`analyze` takes the exact logits of :mod:`attsvm.analysis.rope_heads` (normalised, rotated queries
and keys; each layer's causal mask and sliding window), measures compression by RoPE-aware truncation of
the keys (:func:`rope_attention_stats`), reports every statistic per layer type (sliding / global) and adds
the SVM view of a few heads in their rotated coordinates (:func:`attsvm.analysis.svm_view.rope_svm_views`).
The spectrum of ``W_h`` (folded q/k norm gains and scale) is computed as for the other models.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._linalg import RANK_TOL
from .._threads import blas_threads
from .._validation import check_finite_scalar, check_positive_int
from ._models import QKWeights, attention_inputs, attention_logits, corpus_windows, load_model, qk_weights

__all__ = [
    "SpectrumStats",
    "spectrum_stats",
    "factored_svd",
    "AttentionStats",
    "attention_stats",
    "CompressionStats",
    "compression_stats",
    "HeadAnatomy",
    "analyze",
    "MASS",
    "MARGIN_EDGES",
    "DEFAULT_RANKS",
]

log = logging.getLogger(__name__)

MASS = 0.95  # "holds ≥ 95 % of the mass" (docs/spec.md §7)
DEFAULT_DELTA = 1.0  # support keys: within this many logit units of the top
MIN_KEYS = 4  # causal models: queries that see fewer keys are not counted
MARGIN_STEP = 0.5
MARGIN_EDGES = np.concatenate([np.arange(0.0, 20.0 + 1e-9, MARGIN_STEP), [np.inf]])  # bins, logit units
DEFAULT_RANKS = (1, 2, 4, 8, 16, 24, 32)
ROPE_RANKS = (1, 2, 4, 8, 16, 32, 64, 128)  # RoPE models (d_head 256 for Gemma 3 270M)
# RoPE models (Gemma 3): windows longer than the sliding window (512 for Gemma 3 270M), so that the
# sliding layers' mask matters; (windows, tokens per window, compression windows)
ROPE_DEFAULT = (24, 1024, 4)
ROPE_QUICK = (2, 768, 1)


# ---------------------------------------------------------------------------------------- spectra
@dataclass(frozen=True)
class SpectrumStats:
    """Singular spectra of every head's ``W_h`` (L, H, d) and derived statistics (L, H)."""

    singular_values: NDArray[np.float64]
    rank: NDArray[np.int64]
    effective_rank: NDArray[np.float64]
    nuc_fro_ratio: NDArray[np.float64]
    d_head: int
    scaling: NDArray[np.float64]

    @property
    def ceiling(self) -> float:
        """``‖W‖_*/‖W‖_F ≤ √rank ≤ √d_head``."""
        return math.sqrt(self.d_head)


def factored_svd(w: QKWeights) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Thin SVD of every ``W_h = s·W_kᵀW_q`` from its factors: ``U`` (L,H,d,k), ``S`` (L,H,k), ``V`` (L,H,d,k).

    With ``W_kᵀ = Q₁R₁`` and ``W_qᵀ = Q₂R₂`` (thin QR, k = d_head), ``W = Q₁ (s R₁R₂ᵀ) Q₂ᵀ``, so the SVD
    of the k × k core gives the exact nonzero spectrum at O(d k²) cost instead of O(d³).
    """
    Q1, R1 = np.linalg.qr(np.swapaxes(w.W_k, -1, -2))  # (L,H,d,k), (L,H,k,k)
    Q2, R2 = np.linalg.qr(np.swapaxes(w.W_q, -1, -2))
    core = w.scaling[:, None, None, None] * R1 @ np.swapaxes(R2, -1, -2)
    Uc, S, Vct = np.linalg.svd(core)
    return Q1 @ Uc, S, Q2 @ np.swapaxes(Vct, -1, -2)


def spectrum_stats(w: QKWeights, tol: float = RANK_TOL) -> SpectrumStats:
    """Spectrum (padded with zeros to length d), rank at relative tolerance ``tol``, effective rank and
    ‖·‖_*/‖·‖_F of every head, from :func:`factored_svd` (rank ≤ d_head by construction; the tests
    check it against a dense SVD of W_h)."""
    _, S, _ = factored_svd(w)
    full = np.concatenate([S, np.zeros((*S.shape[:-1], w.d - S.shape[-1]))], axis=-1)
    top = full[..., :1]
    rank = ((full > tol * top).sum(-1) * (top[..., 0] > 0)).astype(np.int64)
    tot = full.sum(-1, keepdims=True)
    pr = np.divide(full, tot, out=np.zeros_like(full), where=tot > 0)
    er = np.exp(-(np.where(pr > 0, pr * np.log(np.where(pr > 0, pr, 1.0)), 0.0)).sum(-1))
    fro = np.sqrt((full**2).sum(-1))
    nfr = np.divide(full.sum(-1), fro, out=np.zeros_like(fro), where=fro > 0)
    return SpectrumStats(full, rank, er, nfr, w.d_head, w.scaling.copy())


# ---------------------------------------------------------------------------------------- attention
@dataclass
class AttentionStats:
    """Sparsity and margin statistics accumulated over query positions, per (layer, head).

    Counts are sums over queries; the shares are ``counts / n_queries``. ``margin_hist`` (L, H, B)
    counts the margins ``logit_top − logit_t`` (t ≠ top) in the bins :data:`MARGIN_EDGES`.
    """

    n_layers: int
    n_heads: int
    delta: float
    n_queries: int = 0
    n_windows: int = 0
    top1: NDArray[np.float64] = field(default=None)  # type: ignore[arg-type]  # set in __post_init__
    top3: NDArray[np.float64] = field(default=None)  # type: ignore[arg-type]  # set in __post_init__
    top1_content: NDArray[np.float64] = field(default=None)  # type: ignore[arg-type]  # set in __post_init__
    special_mass: NDArray[np.float64] = field(default=None)  # type: ignore[arg-type]  # set in __post_init__
    n_support: NDArray[np.float64] = field(default=None)  # type: ignore[arg-type]  # set in __post_init__
    margin_hist: NDArray[np.float64] = field(default=None)  # type: ignore[arg-type]  # set in __post_init__

    def __post_init__(self) -> None:
        shape = (self.n_layers, self.n_heads)
        for name in ("top1", "top3", "top1_content", "special_mass", "n_support"):
            if getattr(self, name) is None:
                setattr(self, name, np.zeros(shape))
        if self.margin_hist is None:
            self.margin_hist = np.zeros((*shape, len(MARGIN_EDGES) - 1))

    def share(self, name: str) -> NDArray[np.float64]:
        """Mean over the queries seen of a per-query statistic (``top1`` → share with top-1 ≥ 95 %)."""
        return getattr(self, name) / max(self.n_queries, 1)


def _window_stats(
    logits: Any,
    special: Any,
    causal: bool,
    delta: float,
    stats: AttentionStats,
    layer: int,
    visible: Any = None,
) -> None:
    """Accumulate one window's statistics for one layer; ``logits`` (H, N, N) float64 tensor.

    ``visible`` (N, N) bool, when given, is the layer's own mask (``[query, key]``, e.g. causal and a
    sliding window) and replaces the plain causal one."""
    import torch

    H, N, _ = logits.shape
    if visible is not None:
        logits = logits.masked_fill(~visible, -math.inf)
        keep_q = visible.sum(-1) >= MIN_KEYS  # queries seeing at least MIN_KEYS keys
    elif causal:
        future = torch.ones(N, N, dtype=torch.bool).triu(1)
        logits = logits.masked_fill(future, -math.inf)
        keep_q = torch.arange(N) >= MIN_KEYS - 1  # queries seeing at least MIN_KEYS keys
    else:
        keep_q = torch.ones(N, dtype=torch.bool)
    lg = logits[:, keep_q]  # (H, M, N)
    p = torch.softmax(lg, dim=-1)
    top3 = torch.topk(p, k=min(3, N), dim=-1).values  # (H, M, 3)
    stats.top1[layer] += (top3[..., 0] >= MASS).sum(-1).numpy()
    stats.top3[layer] += (top3.sum(-1) >= MASS).sum(-1).numpy()
    smass = p[..., special].sum(-1)  # (H, M)
    stats.special_mass[layer] += smass.sum(-1).numpy()
    content = p.masked_fill(special, 0.0)
    csum = content.sum(-1)
    ctop = content.max(-1).values / csum.clamp_min(1e-300)
    stats.top1_content[layer] += ((ctop >= MASS) & (csum > 0)).sum(-1).numpy()
    margin = lg.max(-1, keepdim=True).values - lg  # (H, M, N), +inf on masked keys
    stats.n_support[layer] += (margin <= delta).sum(-1).sum(-1).double().numpy()
    # histogram of the margins in uniform bins of MARGIN_STEP (last bin: ≥ MARGIN_EDGES[-2], and inf)
    B = len(MARGIN_EDGES) - 1
    bins = (margin * (1.0 / MARGIN_STEP)).floor_().clamp_(max=B - 1).long()
    flat = (torch.arange(H)[:, None, None] * B + bins).view(-1)
    hist = torch.bincount(flat, minlength=H * B).reshape(H, B).double()
    hist[:, 0] -= keep_q.sum()  # the top key of each query (margin exactly 0) is not a margin
    if visible is not None:  # masked keys landed in the overflow bin
        hist[:, -1] -= (~visible[keep_q]).sum()
    elif causal:  # masked future keys landed in the overflow bin
        q = torch.arange(N)[keep_q]
        hist[:, -1] -= (N - 1 - q).sum()
    stats.margin_hist[layer] += hist.numpy()


def attention_stats(
    model: Any,
    tokenizer: Any,
    w: QKWeights,
    windows: list[list[int]],
    *,
    delta: float = DEFAULT_DELTA,
    keep_inputs: int = 0,
    progress: bool = False,
) -> tuple[AttentionStats, list[list[Any]]]:
    """Run the model over ``windows`` (lists of token ids) and accumulate :class:`AttentionStats`.

    Also returns the attention inputs of every layer (float64 tensors (N, d)) of the first
    ``keep_inputs`` windows (for :func:`compression_stats`).
    """
    import torch
    from tqdm.auto import tqdm

    delta = check_finite_scalar(delta, "delta", positive=True)
    stats = AttentionStats(w.n_layers, w.n_heads, delta)
    special_ids = torch.tensor(sorted(set(getattr(tokenizer, "all_special_ids", []) or [])), dtype=torch.long)
    kept_inputs: list[list[Any]] = []
    with torch.no_grad():
        for ids in tqdm(windows, desc="attention", disable=not progress, leave=False):
            x = torch.tensor([ids], dtype=torch.long)
            out = model(input_ids=x, output_hidden_states=True)
            ins = [t[0].double() for t in attention_inputs(model, out.hidden_states)]
            special = torch.isin(x[0], special_ids)
            for layer in range(w.n_layers):
                _window_stats(attention_logits(w, layer, ins[layer]), special, w.causal, delta, stats, layer)
            n = len(ids) if not w.causal else max(len(ids) - MIN_KEYS + 1, 0)
            stats.n_queries += n
            stats.n_windows += 1
            if len(kept_inputs) < keep_inputs:
                kept_inputs.append(ins)
    return stats, kept_inputs


# ---------------------------------------------------------------------------------------- compression
@dataclass(frozen=True)
class CompressionStats:
    """Attention under rank-r truncation of each head's bilinear part: KL and top-1 agreement (L, H, R)."""

    ranks: tuple[int, ...]
    kl: NDArray[np.float64]
    top1_agreement: NDArray[np.float64]
    n_queries: int


def compression_stats(
    w: QKWeights, inputs: list[list[Any]], ranks: tuple[int, ...] = DEFAULT_RANKS
) -> CompressionStats:
    """Truncate ``W_h`` to rank r (SVD; biases kept) and compare attention with the full head.

    ``inputs[j][ℓ]`` are window j's layer-ℓ attention inputs (N, d). KL is ``KL(p ‖ p_r)`` in nats,
    averaged over queries; agreement is the share of queries whose argmax key is unchanged.
    """
    import torch

    ranks = tuple(sorted({min(check_positive_int(r, "ranks"), w.d_head) for r in ranks}))
    U, S, V = (torch.from_numpy(a) for a in factored_svd(w))  # (L,H,d,k), (L,H,k), (L,H,d,k)
    L, H = w.n_layers, w.n_heads
    kl = np.zeros((L, H, len(ranks)))
    agree = np.zeros((L, H, len(ranks)))
    n_q = 0
    for ins in inputs:
        N = ins[0].shape[0]
        mask = torch.ones(N, N, dtype=torch.bool).triu(1) if w.causal else None
        n_q += N
        for layer in range(L):
            X = ins[layer]  # (N, d)
            full = attention_logits(w, layer, X)  # (H, N, N)  [query, key]
            P = torch.einsum("nd,hdk->hnk", X, U[layer])  # key side   x_nᵀ u_i
            Q = torch.einsum("md,hdk->hmk", X, V[layer])  # query side v_iᵀ z_m
            terms = S[layer][:, None, :] * Q  # (H, N, k)
            bilinear = terms @ P.transpose(-1, -2)  # (H, M, N), rank d_head = exact part
            rest = full - bilinear  # bias terms (+ round-off)
            if mask is not None:
                full = full.masked_fill(mask, -math.inf)
            logp = torch.log_softmax(full, -1)
            top = full.argmax(-1)
            for j, r in enumerate(ranks):
                lg_r = rest + terms[..., :r] @ P[..., :r].transpose(-1, -2)
                if mask is not None:
                    lg_r = lg_r.masked_fill(mask, -math.inf)
                logq = torch.log_softmax(lg_r, -1)
                pk = logp.exp()
                diff = torch.where(pk > 0, pk * (logp - logq), torch.zeros_like(pk))
                kl[layer, :, j] += diff.sum(-1).sum(-1).numpy()
                agree[layer, :, j] += (lg_r.argmax(-1) == top).sum(-1).numpy()
    n = max(n_q, 1)
    return CompressionStats(ranks, kl / n, agree / n, n_q)


# ---------------------------------------------------------------------------------------- RoPE models
def rope_attention_stats(
    model: Any,
    tokenizer: Any,
    w: QKWeights,
    windows: list[list[int]],
    *,
    delta: float = DEFAULT_DELTA,
    compression_windows: int = 0,
    ranks: tuple[int, ...] = ROPE_RANKS,
    progress: bool = False,
) -> tuple[AttentionStats, CompressionStats]:
    """:func:`attention_stats` and :func:`compression_stats` of a RoPE model (Gemma 3) in one pass.

    Logits are the exact ones of :mod:`attsvm.analysis.rope_heads` with each layer's own mask (causal,
    and the sliding window on sliding layers). Compression on the first ``compression_windows`` windows
    is RoPE-aware: each KV head's normalised pre-RoPE keys are projected onto their top-r right-singular
    subspace over the window, then rotated as the model does (queries and masks unchanged); KL(p ‖ p_r)
    and top-1 agreement are computed as in :func:`compression_stats`.
    """
    import torch
    from tqdm.auto import tqdm

    from .rope_heads import rope_window

    delta = check_finite_scalar(delta, "delta", positive=True)
    ranks = tuple(sorted({min(check_positive_int(r, "ranks"), w.d_head) for r in ranks}))
    L, H = w.n_layers, w.n_heads
    stats = AttentionStats(L, H, delta)
    kl = np.zeros((L, H, len(ranks)))
    agree = np.zeros((L, H, len(ranks)))
    n_cq = 0
    special_ids = torch.tensor(sorted(set(getattr(tokenizer, "all_special_ids", []) or [])), dtype=torch.long)
    with torch.no_grad():
        for j, ids in enumerate(tqdm(windows, desc="attention", disable=not progress, leave=False)):
            win = rope_window(model, ids)
            special = torch.isin(torch.tensor(ids, dtype=torch.long), special_ids)
            compress = j < compression_windows
            N = len(ids)
            for layer in range(L):
                vis = win.visible(layer)
                full = win.logits(layer, masked=False)
                _window_stats(full, special, True, delta, stats, layer, visible=vis)
                if not compress:
                    continue
                full = full.masked_fill(~vis, -math.inf)
                logp = torch.log_softmax(full, -1)
                pk = logp.exp()
                top = full.argmax(-1)
                for k, keys in enumerate(win.truncated_keys(layer, ranks)):
                    lg_r = win.logits(layer, keys)
                    logq = torch.log_softmax(lg_r, -1)
                    diff = torch.where(pk > 0, pk * (logp - logq), torch.zeros_like(pk))
                    kl[layer, :, k] += diff.sum(-1).sum(-1).numpy()
                    agree[layer, :, k] += (lg_r.argmax(-1) == top).sum(-1).numpy()
            if compress:
                n_cq += N
            stats.n_queries += max(N - MIN_KEYS + 1, 0)
            stats.n_windows += 1
    n = max(n_cq, 1)
    return stats, CompressionStats(ranks, kl / n, agree / n, n_cq)


def default_svm_heads(types: tuple[str, ...], n_heads: int, quick: bool) -> list[tuple[int, int]]:
    """Heads of :func:`analyze`'s SVM section on a model with sliding and global layers.

    ``quick``: head 0 of the first sliding layer, the first global layer, the first sliding layer after
    it and the second global layer (those that exist). Otherwise: every head of the first sliding layer,
    of the first sliding layer after the first global one, and of every global layer."""
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    full = [i for i, t in enumerate(types) if t != "sliding_attention"]
    after = [i for i in sliding if full and i > full[0]]
    if quick:
        layers = sorted({*sliding[:1], *full[:1], *after[:1], *full[1:2]})
        return [(layer, 0) for layer in layers]
    layers = sorted({*sliding[:1], *after[:1], *full})
    return [(layer, h) for layer in layers for h in range(n_heads)]


def _type_label(t: str) -> str:
    return "sliding" if t == "sliding_attention" else "global"


# ---------------------------------------------------------------------------------------- analysis
@dataclass
class HeadAnatomy:
    """Everything :func:`analyze` measured; :meth:`records` gives one dict per head (``heads.json``)."""

    model: str
    n_layers: int
    n_heads: int
    d: int
    d_head: int
    spectrum: SpectrumStats
    attention: AttentionStats
    compression: CompressionStats
    n_windows: int
    max_length: int
    seconds: float
    layer_types: tuple[str, ...] = ()  # RoPE models with sliding/global layers (empty: not reported)
    svm_heads: list[dict[str, Any]] = field(default_factory=list)  # RoPE models: the SVM section
    smoke_test: bool = False  # a quick run: too few, too short windows for findings (the report says so)

    def records(self) -> list[dict[str, Any]]:
        sp, at, cp = self.spectrum, self.attention, self.compression
        out = []
        top1, top3, t1c = at.share("top1"), at.share("top3"), at.share("top1_content")
        smass, nsup = at.share("special_mass"), at.share("n_support")
        for layer in range(self.n_layers):
            for h in range(self.n_heads):
                out.append(
                    {
                        "layer": layer,
                        "head": h,
                        "rank": int(sp.rank[layer, h]),
                        "effective_rank": float(sp.effective_rank[layer, h]),
                        "nuc_fro_ratio": float(sp.nuc_fro_ratio[layer, h]),
                        "nuc_fro_ceiling": sp.ceiling,
                        "sigma_max": float(sp.singular_values[layer, h, 0]),
                        "top1_95": float(top1[layer, h]),
                        "top3_95": float(top3[layer, h]),
                        "top1_95_content": float(t1c[layer, h]),
                        "special_mass": float(smass[layer, h]),
                        "mean_support_keys": float(nsup[layer, h]),
                        "kl_by_rank": {str(r): float(cp.kl[layer, h, j]) for j, r in enumerate(cp.ranks)},
                        "top1_agreement_by_rank": {
                            str(r): float(cp.top1_agreement[layer, h, j]) for j, r in enumerate(cp.ranks)
                        },
                    }
                )
                if self.layer_types:
                    out[-1]["layer_type"] = _type_label(self.layer_types[layer])
        return out

    def by_layer_type(self) -> dict[str, dict[str, Any]]:
        """Means over the heads of the sliding and of the global layers (RoPE models; empty otherwise)."""
        if not self.layer_types:
            return {}
        recs = self.records()
        out: dict[str, dict[str, Any]] = {}
        for label in ("sliding", "global"):
            rows = [r for r in recs if r["layer_type"] == label]
            if not rows:
                continue
            entry: dict[str, Any] = {"layers": sorted({r["layer"] for r in rows}), "n_heads": len(rows)}
            for key in (
                "effective_rank",
                "nuc_fro_ratio",
                "top1_95",
                "top3_95",
                "top1_95_content",
                "special_mass",
                "mean_support_keys",
            ):
                entry[key] = float(np.mean([r[key] for r in rows]))
            for key in ("kl_by_rank", "top1_agreement_by_rank"):
                entry[key] = {str(rk): float(np.mean([r[key][str(rk)] for r in rows])) for rk in self.compression.ranks}
            svm = [v for v in self.svm_heads if v["layer_type"] == label]
            if svm:
                entry["svm_corr_fro"] = float(np.mean([v["corr_fro"] for v in svm]))
                entry["svm_corr_nuc"] = float(np.mean([v["corr_nuc"] for v in svm]))
                entry["svm_heads"] = len(svm)
            out[label] = entry
        return out

    def summary(self) -> dict[str, Any]:
        at = self.attention
        return {
            "model": self.model,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "d": self.d,
            "d_head": self.d_head,
            "scaling": float(self.spectrum.scaling[0]),
            "n_windows": self.n_windows,
            "n_queries": at.n_queries,
            "max_length": self.max_length,
            "delta": at.delta,
            "mass": MASS,
            "seconds": self.seconds,
            "overall_top1_95": float(at.top1.sum() / max(at.n_queries * self.n_layers * self.n_heads, 1)),
            "overall_top3_95": float(at.top3.sum() / max(at.n_queries * self.n_layers * self.n_heads, 1)),
            "overall_special_mass": float(at.special_mass.sum() / max(at.n_queries * self.n_layers * self.n_heads, 1)),
            "max_rank": int(self.spectrum.rank.max()),
            "compression_ranks": list(self.compression.ranks),
            "compression_queries": self.compression.n_queries,
            "smoke_test": self.smoke_test,
        } | (
            {
                "layer_types": [_type_label(t) for t in self.layer_types],
                "by_layer_type": self.by_layer_type(),
                "attention_logits": "exact RoPE logits (rope_heads) with each layer's causal/sliding-window mask",
            }
            if self.layer_types
            else {}
        )

    def save(self, out: str | Path) -> Path:
        """Write ``heads.json``, ``summary.json`` and ``anatomy.npz`` (arrays for the figures) to ``out``."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "heads.json").write_text(json.dumps(self.records(), indent=1))
        (out / "summary.json").write_text(json.dumps(self.summary(), indent=1))
        np.savez_compressed(
            out / "anatomy.npz",
            singular_values=self.spectrum.singular_values,
            margin_hist=self.attention.margin_hist,
            margin_edges=MARGIN_EDGES,
            kl=self.compression.kl,
            top1_agreement=self.compression.top1_agreement,
            ranks=np.asarray(self.compression.ranks),
        )
        if self.svm_heads:
            (out / "svm_heads.json").write_text(json.dumps(self.svm_heads, indent=1))
        return out


def analyze(
    model: str = "minilm",
    *,
    quick: bool = False,
    max_windows: int | None = None,
    max_length: int | None = None,
    compression_windows: int | None = None,
    ranks: tuple[int, ...] | None = None,
    delta: float = DEFAULT_DELTA,
    progress: bool = False,
    svm_heads: list[tuple[int, int]] | None = None,
    seed: int = 0,
) -> HeadAnatomy:
    """Head anatomy of ``model`` (``"minilm"``, ``"gemma3-270m"`` or a local HF folder) over the pydoc corpus.

    ``quick`` uses 4 windows of 128 tokens (CI); otherwise every topic is cut into windows of
    ``max_length`` tokens (default 256; ``max_windows`` caps their number). Compression is measured on the
    first ``compression_windows`` windows (default 16; it costs one softmax per rank and head); ``ranks``
    defaults to :data:`DEFAULT_RANKS`.

    RoPE models (Gemma 3) use the exact RoPE logits of :mod:`attsvm.analysis.rope_heads` and RoPE-aware
    compression (:func:`rope_attention_stats`); their windows are the corpus windows of exactly
    ``max_length`` tokens first (then shorter ones), with defaults :data:`ROPE_DEFAULT` (``quick``:
    :data:`ROPE_QUICK`) and ranks :data:`ROPE_RANKS`, and the result adds per-layer-type (sliding /
    global) summaries and an SVM section: :func:`attsvm.analysis.svm_view.rope_svm_views` of
    ``svm_heads`` (default :func:`default_svm_heads`).
    """
    import torch

    from .rope_heads import is_rope_model

    t0 = time.perf_counter()
    check_finite_scalar(delta, "delta", positive=True)  # (the arguments before the model is loaded)
    if compression_windows is not None:
        check_positive_int(compression_windows, "compression_windows")
    if max_windows is not None:
        check_positive_int(max_windows, "max_windows")
    net, tok = load_model(model)
    w = qk_weights(net)
    with blas_threads(1):  # (many small factorisations: a BLAS pool per core only waits on 2 busy cores)
        spec = spectrum_stats(w)

    def anatomy(att: AttentionStats, comp: CompressionStats, n_windows: int, length: int, **more: Any) -> HeadAnatomy:
        return HeadAnatomy(
            str(model),
            w.n_layers,
            w.n_heads,
            w.d,
            w.d_head,
            spec,
            att,
            comp,
            n_windows,
            length,
            time.perf_counter() - t0,
            **more,
            smoke_test=quick,
        )

    if not is_rope_model(net):
        if quick:
            max_windows, max_length, compression_windows = 4, 128, 2
        max_length = 256 if max_length is None else max_length
        compression_windows = 16 if compression_windows is None else compression_windows
        windows = [ids for _, ids in corpus_windows(tok, max_length=max_length, max_windows=max_windows)]
        log.info("analyze %s: %d windows of <= %d tokens", model, len(windows), max_length)
        att, inputs = attention_stats(
            net, tok, w, windows, delta=delta, keep_inputs=compression_windows, progress=progress
        )
        with torch.no_grad():
            comp = compression_stats(w, inputs, DEFAULT_RANKS if ranks is None else ranks)
        return anatomy(att, comp, len(windows), max_length)
    from .svm_view import rope_svm_views

    n_win, length, n_comp = ROPE_QUICK if quick else ROPE_DEFAULT
    max_windows = n_win if quick or max_windows is None else max_windows
    max_length = length if quick or max_length is None else max_length
    compression_windows = n_comp if quick or compression_windows is None else compression_windows
    windows = rope_corpus_windows(tok, max_length, max_windows)
    log.info("analyze %s: %d windows of <= %d tokens (RoPE logits)", model, len(windows), max_length)
    att, comp = rope_attention_stats(
        net,
        tok,
        w,
        windows,
        delta=delta,
        compression_windows=compression_windows,
        ranks=ROPE_RANKS if ranks is None else ranks,
        progress=progress,
    )
    heads = default_svm_heads(w.layer_types, w.n_heads, quick) if svm_heads is None else list(svm_heads)
    views = rope_svm_views(net, tok, heads, seed=seed, quick=quick, progress=progress) if heads else []
    return anatomy(
        att,
        comp,
        len(windows),
        max_length,
        layer_types=w.layer_types,
        svm_heads=[v.brief() for v in views],
    )


def rope_corpus_windows(tok: Any, max_length: int, max_windows: int | None) -> list[list[int]]:
    """Corpus windows of exactly ``max_length`` tokens first (so that long-range masks such as a sliding
    window matter), then the shorter topic tails, at most ``max_windows`` in all (corpus order within each)."""
    every = [ids for _, ids in corpus_windows(tok, max_length=max_length)]
    full = [ids for ids in every if len(ids) == max_length]
    rest = [ids for ids in every if len(ids) < max_length]
    return (full + rest)[:max_windows]
