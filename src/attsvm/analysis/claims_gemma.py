"""The claims of :mod:`attsvm.analysis.claims` on a hybrid local/global decoder LLM: Gemma 3 (docs/spec.md §7.6).

Gemma 3 270M has 15 sliding-window layers (a query at position q sees keys q − W < k ≤ q, W = 512) and
3 global layers, 4 query heads on 1 key/value head (MQA), RoPE and a per-head RMS normalisation of
queries and keys. Its long contexts make the dense (L, H, N, N) maps of :func:`claims.sequence_metrics`
too large (4096 tokens: 4.8 GB per sequence in float64), so this module measures the same quantities
*streaming*: forward hooks on every attention module read the layer's attention probabilities as the
model computes them and reduce them at once, in blocks of query rows, to per-(layer, head) sums; the
map of one layer is alive at a time. The reductions are exactly those of :func:`claims.sequence_metrics`
(the tests compare the two on a tiny Gemma 3), with the visible keys of a sliding layer being its window,
not the whole causal past. The probabilities arrive in float32 (the model's dtype); sums are float64.

One prefill of a window serves every claim at once:

* **concentration, sinks, support** on windows of 512, 1024, 2048 and 4096 tokens (BOS + contiguous text
  of the pydoc corpus's training topics), per layer type (sliding, global) and per head, and support by
  window length;
* **serving** on the 1024-token windows: the keys of the first S = N − 16 positions that the layer's
  cache holds (a sliding layer caches only its last W) are scored by their smallest margin over the
  queries before S, cut to half per layer (pages of 16, one keep-set per layer: with one key head a
  layer has one set anyway), and the next 16 tokens are predicted with the evicted keys hidden, by a
  second forward whose attention masks are replaced (forward pre-hooks); the baseline loss comes from
  the first pass;
* **low rank**: the spectra of every ``W_h`` (norm gains and scaling folded, :func:`qk_weights`); the
  RoPE-aware truncation on the 1024-token windows (each layer's normalised pre-RoPE keys projected on
  their top-r right-singular subspace, then rotated as the model does), from the queries, keys, values,
  RoPE tables and masks captured in the same prefill; the MLA-style shared rank-c key/value latent per
  layer, with perplexity on windows of the held-out topics.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .claims import (
    DELTAS,
    LENGTH_EDGES,
    MASS,
    MIN_KEYS,
    PAGE,
    SERVING_EVAL,
    SERVING_MODES,
    SERVING_RATIOS,
    SERVING_WINDOW,
    SINK_EPS,
    LowRankMetrics,
    SequenceMetrics,
    _compare,
    _head_stats,
    _special_mask,
    keep_sets,
    masked_tail_loss,
)

__all__ = [
    "GemmaWindowMetrics",
    "GemmaSettings",
    "window_plan",
    "measure_window",
    "measure_gemma",
    "WINDOW_LENGTHS",
]

WINDOW_LENGTHS = (512, 1024, 2048, 4096)  # tokens per window, BOS included
DEFAULT_COUNTS = (8, 8, 3, 2)  # windows per length (default run)
QUICK_COUNTS = (2, 2, 0, 0)  # --quick
SERVING_LENGTH = 1024  # windows of this length also run the serving and low-rank measurements
SERVING_RATIO = 0.5  # share of each layer's cached keys kept
# RoPE-aware key truncation ranks as fractions of d_head (Gemma 3 270M: 4, 8, …, 256)
RANK_FRACTIONS = (1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 3 / 8, 1 / 2, 3 / 4, 1)
# shared key/value latent sizes as fractions of the stacked [W_k; W_v] rows (Gemma: 32, …, 384, 512 = exact)
LATENT_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4, 1)
BLOCK = 256  # query rows reduced at once
# visible-key buckets for the support curve of long contexts (the last bucket is open)
LONG_EDGES = (4, 16, 64, 256, 512, 1024, 2048, 1 << 30)


@dataclass
class GemmaSettings:
    """How many windows of each length (``lengths`` ↔ ``counts``), how many of the serving-length windows
    also run the low-rank truncation, and the held-out MLA windows (count × tokens)."""

    lengths: tuple[int, ...] = WINDOW_LENGTHS
    counts: tuple[int, ...] = DEFAULT_COUNTS
    lowrank_windows: int = 2
    mla_windows: int = 2
    mla_length: int = 512
    rank_fractions: tuple[float, ...] = RANK_FRACTIONS
    latent_fractions: tuple[float, ...] = LATENT_FRACTIONS

    @classmethod
    def quick(cls) -> GemmaSettings:
        return cls(
            counts=QUICK_COUNTS,
            lowrank_windows=1,
            mla_windows=1,
            mla_length=256,
            rank_fractions=(1 / 16, 1 / 4, 1 / 2, 1),
        )


@dataclass
class GemmaWindowMetrics:
    """One window's streaming reductions: ``seq`` as :func:`claims.sequence_metrics` would give for the
    whole model; ``pairs_lh`` / ``pairs_ex_lh`` / ``pairs_nobos_lh`` (L, H) the share of counted queries
    with top-3 mass ≥ 0.95 (all keys / specials and punctuation removed / BOS removed, renormalised);
    ``top3_nobos`` (L, H) mean top-3 mass without BOS; ``support_len`` / ``count_len`` (L, B) support
    keys at δ = 1 summed / queries counted per visible-key bucket of LONG_EDGES; ``serving`` the lost
    attention mass per mode (and per layer), with the kept sets; ``lowrank`` per rank and head."""

    n_tokens: int
    seq: SequenceMetrics
    pairs_lh: NDArray[np.float64]
    pairs_ex_lh: NDArray[np.float64]
    pairs_nobos_lh: NDArray[np.float64]
    top3_nobos: NDArray[np.float64]
    support_len: NDArray[np.float64]
    count_len: NDArray[np.float64]
    serving: dict[str, Any] | None = None
    lowrank: LowRankMetrics | None = None
    timings: dict[str, float] = field(default_factory=dict)


def window_plan(n_tokens: int, lengths: Sequence[int], counts: Sequence[int]) -> list[tuple[int, int]]:
    """``(start, length)`` of non-overlapping windows (text tokens, BOS not counted) spread over a stream of
    ``n_tokens``: the stream is cut into as many equal segments as windows, and the lengths are dealt
    round-robin over them, so that every length samples text from the whole corpus."""
    todo = [ln for ln, c in zip(lengths, counts) for _ in range(int(c))]
    if not todo:
        raise ValueError("counts must ask for at least one window")
    order: list[int] = []
    pools = {ln: [x for x in todo if x == ln] for ln in dict.fromkeys(todo)}
    while any(pools.values()):
        for ln in list(pools):
            if pools[ln]:
                order.append(pools[ln].pop())
    seg = n_tokens // len(order)
    if seg < max(order) - 1:
        raise ValueError(
            f"the corpus has {n_tokens} tokens: too few for {len(order)} windows of up to {max(order)} tokens"
        )
    return [(k * seg, ln - 1) for k, ln in enumerate(order)]


# ------------------------------------------------------------------------------------------ one layer
class _LayerReducer:
    """The streaming reductions of one layer's attention probabilities ``P`` (H, N, N) (module doc)."""

    def __init__(self, L: int, H: int, special: NDArray[np.bool_], window: list[int | None]) -> None:
        import torch

        self.L, self.H = L, H
        self.N = int(special.shape[0])
        self.special = torch.from_numpy(np.asarray(special, dtype=bool))
        self.window = window
        z = lambda *s: np.zeros(s)  # noqa: E731
        self.sums = {k: z(L, H) for k in ("top1", "top3", "ent", "top3_ex", "top3_nobos", "spec", "first")}
        self.pairs = {k: z(L, H) for k in ("all", "ex", "nobos")}
        self.support = z(len(DELTAS), L, H)
        self.share = z(len(DELTAS), L, H)
        self.sup_len = z(L, len(LONG_EDGES) - 1)
        self.cnt_len = z(L, len(LONG_EDGES) - 1)
        self.rows = 0

    def visible_keys(self, layer: int) -> Any:
        import torch

        nk = torch.arange(1, self.N + 1)
        W = self.window[layer]
        return nk.clamp(max=W) if W is not None else nk

    def add(self, layer: int, P: Any) -> None:
        import torch

        N, r_min = self.N, MIN_KEYS - 1
        nk_all = self.visible_keys(layer)
        edges = torch.tensor(LONG_EDGES)
        for r0 in range(r_min, N, BLOCK):
            r1 = min(N, r0 + BLOCK)
            W = self.window[layer]
            k0 = 0 if W is None else max(0, r0 - W + 1)
            A = P[:, r0:r1, k0:r1].double()  # (H, R, K): keys outside [k0, r1) are invisible (exact zeros)
            nk = nk_all[r0:r1].double()
            topv = A.topk(min(3, A.shape[-1]), dim=-1).values
            top1, top3 = topv[..., 0], topv.sum(-1)
            ent = -torch.special.xlogy(A, A).sum(-1)
            sp = self.special[k0:r1]
            rest = A.masked_fill(sp, 0.0)
            tot = rest.sum(-1, keepdim=True)
            top3_ex = (rest / tot.clamp_min(1e-300)).topk(min(3, A.shape[-1]), dim=-1).values.sum(-1)
            top3_ex = torch.where(tot[..., 0] > 0, top3_ex, torch.zeros_like(top3_ex))
            first = A[..., 0] if k0 == 0 else torch.zeros_like(top1)
            nob = A.clone()
            if k0 == 0:
                nob[..., 0] = 0.0
            tot0 = nob.sum(-1, keepdim=True)
            top3_nobos = (nob / tot0.clamp_min(1e-300)).topk(min(3, A.shape[-1]), dim=-1).values.sum(-1)
            top3_nobos = torch.where(tot0[..., 0] > 0, top3_nobos, torch.zeros_like(top3_nobos))
            s = self.sums
            for key, v in (
                ("top1", top1),
                ("top3", top3),
                ("ent", ent),
                ("top3_ex", top3_ex),
                ("top3_nobos", top3_nobos),
                ("spec", (A * sp).sum(-1)),
                ("first", first),
            ):
                s[key][layer] += v.sum(-1).numpy()
            self.pairs["all"][layer] += (top3 >= MASS).sum(-1).numpy()
            self.pairs["ex"][layer] += (top3_ex >= MASS).sum(-1).numpy()
            self.pairs["nobos"][layer] += (top3_nobos >= MASS).sum(-1).numpy()
            # support keys within δ: margin log(p_top / p_t) ≤ δ ⇔ p_t ≥ p_top·e^{−δ} (> 0: invisible keys never count)
            for j, dl in enumerate(DELTAS):
                cnt = (A >= top1[..., None] * math.exp(-dl)).sum(-1).double()  # (H, R)
                self.support[j, layer] += cnt.sum(-1).numpy()
                self.share[j, layer] += (cnt / nk).sum(-1).numpy()
                if dl == 1.0:
                    b = torch.bucketize(nk, edges, right=True) - 1  # (R,) bucket of each row
                    per_row = cnt.mean(0)  # (R,) mean over heads
                    self.sup_len[layer] += np.bincount(b.numpy(), per_row.numpy(), len(LONG_EDGES) - 1)
                    self.cnt_len[layer] += np.bincount(b.numpy(), minlength=len(LONG_EDGES) - 1)
        if layer == 0:
            self.rows = N - r_min

    def metrics(self, n_tokens: int) -> GemmaWindowMetrics:
        M = float(self.rows)
        s = {k: v / M for k, v in self.sums.items()}
        # the verdict's length curve uses claims.LENGTH_EDGES (visible keys): regroup the long buckets
        by_len = np.full(len(LENGTH_EDGES) - 1, np.nan)
        centers_lo = np.asarray(LONG_EDGES[:-1])
        for b in range(len(LENGTH_EDGES) - 1):
            sel = (centers_lo >= LENGTH_EDGES[b]) & (centers_lo < LENGTH_EDGES[b + 1])
            c = self.cnt_len[:, sel].sum()
            if c > 0:
                by_len[b] = float(self.sup_len[:, sel].sum() / c)
        seq = SequenceMetrics(
            top1=s["top1"],
            top3=s["top3"],
            entropy=s["ent"],
            top3_ex=s["top3_ex"],
            special_mass=s["spec"],
            first=s["first"],
            support=self.support / M,
            support_share=self.share / M,
            support_by_length=by_len,
            pairs_top3=float(self.pairs["all"].mean() / M),
            pairs_top3_ex=float(self.pairs["ex"].mean() / M),
        )
        return GemmaWindowMetrics(
            n_tokens=n_tokens,
            seq=seq,
            pairs_lh=self.pairs["all"] / M,
            pairs_ex_lh=self.pairs["ex"] / M,
            pairs_nobos_lh=self.pairs["nobos"] / M,
            top3_nobos=s["top3_nobos"],
            support_len=self.sup_len.copy(),
            count_len=self.cnt_len.copy(),
        )


# ------------------------------------------------------------------------------------------ serving
class _ServingScorer:
    """Per layer: SV-margin scores of the cached keys from the queries before S and the attention the next
    SERVING_EVAL queries put on them (module doc)."""

    def __init__(self, L: int, N: int, window: list[int | None]) -> None:
        self.L, self.N, self.S = L, N, N - SERVING_EVAL
        self.window = window
        self.score_all = np.full((L, 1, self.S), np.inf)
        self.score_win = np.full((L, 1, self.S), np.inf)
        self.future: list[Any] = [None] * L

    def add(self, layer: int, P: Any) -> None:
        import torch

        S, W = self.S, self.window[layer]
        lo = 0 if W is None else max(0, S - W)  # the keys this layer's cache holds at the eviction point
        best_all = torch.full((P.shape[0], S), math.inf, dtype=torch.float64)
        best_win = best_all.clone()
        for r0 in range(0, S, BLOCK):
            r1 = min(S, r0 + BLOCK)
            A = P[:, r0:r1, :S].double()
            logA = torch.log(A)  # -inf for invisible / underflowed keys: infinite margin
            marg = logA.max(-1, keepdim=True).values - logA  # (H, R, S)
            best_all = torch.minimum(best_all, marg.min(1).values)
            w0 = max(r0, S - SERVING_WINDOW)
            if w0 < r1:
                best_win = torch.minimum(best_win, marg[:, w0 - r0 :].min(1).values)
        best_all[:, :lo] = math.inf  # (not in the cache: never kept, never counted in the budget)
        best_win[:, :lo] = math.inf
        # one key head serves the layer's query heads: the group keeps one set, ranked by its best score
        self.score_all[layer, 0] = best_all.min(0).values.numpy()
        self.score_win[layer, 0] = best_win.min(0).values.numpy()
        self.future[layer] = P[:, S:, :S].double().numpy()  # (H, E, S)

    def keep(self, ratio: float = SERVING_RATIO) -> dict[str, NDArray[np.bool_]]:
        """Kept keys (L, S) per mode, the share ``ratio`` of each layer's cached keys."""
        out = {}
        for mode in SERVING_MODES:
            score = self.score_win if mode in ("window", "all") else self.score_all
            page = PAGE if mode in ("page", "all") else None
            shared = mode in ("layer_shared", "all")
            rows = []
            for ell in range(self.L):
                budget = max(1, round(ratio * self._cached(ell)))
                rows.append(keep_sets(score[ell : ell + 1], budget, page=page, shared=shared)[0, 0])
            out[mode] = np.stack(rows)
        return out

    def _cached(self, layer: int) -> int:
        W = self.window[layer]
        return self.S if W is None else min(self.S, W)

    def lost(self, keep: NDArray[np.bool_]) -> NDArray[np.float64]:
        """Attention mass the next queries put on evicted keys, per layer (mean over heads and queries)."""
        return np.asarray([float((f * ~keep[ell][None, None, :]).sum(-1).mean()) for ell, f in enumerate(self.future)])


# ------------------------------------------------------------------------------------------ one window
def _gemma_layout(net: Any) -> tuple[list[Any], list[int | None], list[str]]:
    from ._models import layer_types, sliding_window

    mods = [layer.self_attn for layer in net.model.layers]
    kinds = layer_types(net)
    W = sliding_window(net)
    return mods, [W if k == "sliding_attention" else None for k in kinds], list(kinds)


def measure_window(
    net: Any, tok: Any, ids: list[int], *, serving: bool = False, lowrank_ranks: Sequence[int] | None = None
) -> GemmaWindowMetrics:
    """One prefill of ``ids`` (BOS first) through a Gemma 3 model, reduced by forward hooks (module doc);
    ``serving`` adds the eviction measurements (a second forward per distinct keep set), ``lowrank_ranks``
    the RoPE-aware truncation."""
    import torch

    mods, window, kinds = _gemma_layout(net)
    sliding = next((w for w in window if w is not None), None)
    L, H = len(mods), int(net.config.num_attention_heads)
    N = len(ids)
    special = _special_mask(tok, ids)
    red = _LayerReducer(L, H, special, window)
    srv = _ServingScorer(L, N, window) if serving else None
    cap: list[dict[str, Any]] = [{} for _ in range(L)] if lowrank_ranks else []
    masks_seen: list[Any] = [None] * L  # each layer's attention mask (sliding layers have their own)
    hooks = []
    t0 = time.perf_counter()

    for ell, mod in enumerate(mods):

        def post(m: Any, args: Any, out: Any, ell: int = ell) -> None:
            P = out[1]
            if P is None:
                raise ValueError("the model returned no attention weights: load it with attn_implementation='eager'")
            P = P[0].detach()
            red.add(ell, P)
            if srv is not None:
                srv.add(ell, P)

        hooks.append(mod.register_forward_hook(post))
        if srv is not None or cap:

            def pre(m: Any, args: Any, kwargs: Any, ell: int = ell) -> None:
                if cap:
                    cap[ell]["pe"] = tuple(t.detach() for t in kwargs["position_embeddings"])
                if srv is not None:
                    masks_seen[ell] = kwargs.get("attention_mask")

            hooks.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
        if cap:
            hooks.append(
                mod.q_norm.register_forward_hook(lambda m, a, o, ell=ell: cap[ell].__setitem__("q", o.detach()))
            )
            hooks.append(
                mod.k_norm.register_forward_hook(lambda m, a, o, ell=ell: cap[ell].__setitem__("k", o.detach()))
            )
            hooks.append(
                mod.v_proj.register_forward_hook(lambda m, a, o, ell=ell: cap[ell].__setitem__("v", o.detach()))
            )
    x = torch.tensor([ids])
    try:
        with torch.no_grad():
            logits = net(x, logits_to_keep=SERVING_EVAL + 1).logits[0, :SERVING_EVAL].double()
    finally:
        for h in hooks:
            h.remove()
    out = red.metrics(N)
    out.timings["prefill"] = time.perf_counter() - t0
    if srv is not None:
        t1 = time.perf_counter()
        target = x[0, N - SERVING_EVAL :]
        base = float(torch.nn.functional.cross_entropy(logits, target))
        keeps = srv.keep()
        lost = {mode: srv.lost(k) for mode, k in keeps.items()}  # (L,) at SERVING_RATIO
        lost_r: dict[str, list[float]] = {mode: [] for mode in SERVING_MODES}  # mean over layers, per ratio
        for ratio in SERVING_RATIOS:
            for mode, k in srv.keep(ratio).items():
                lost_r[mode].append(float(srv.lost(k).mean()))
        ppl: dict[str, float] = {}
        done: dict[bytes, float] = {}
        for mode, keep in keeps.items():
            key = np.packbits(keep).tobytes()
            if key not in done:
                done[key] = _masked_loss(net, x, mods, masks_seen, keep, srv.S)
            ppl[mode] = float(np.exp(done[key] - base))
        out.serving = {
            "lost_by_layer": lost,
            "lost": {m: np.asarray(v) for m, v in lost_r.items()},
            "ppl_ratio": ppl,
            "forwards": len(done),
            # share of each layer's cached keys that were the top key of some query (score 0: tied)
            "top_key_share": np.asarray(
                [float((srv.score_all[ell, 0] == 0).sum() / srv._cached(ell)) for ell in range(L)]
            ),
        }
        out.timings["serving"] = time.perf_counter() - t1
    if cap:
        t2 = time.perf_counter()
        out.lowrank = _rope_truncation(net, ids, cap, kinds, sliding, lowrank_ranks or ())
        out.timings["lowrank"] = time.perf_counter() - t2
    return out


def _masked_loss(net: Any, x: Any, mods: list[Any], masks: list[Any], keep: NDArray[np.bool_], S: int) -> float:
    """Loss on the last SERVING_EVAL tokens when the queries from position S on cannot see the evicted keys: each
    layer's own additive mask (``masks``, sliding windows included) with the evicted keys added."""
    import torch

    cut = []
    for ell, base in enumerate(masks):
        if base is None or base.dtype == torch.bool:
            raise ValueError("serving needs the eager attention's additive float masks (attn_implementation='eager')")
        m = base.clone()
        m[..., S:, :S][..., torch.from_numpy(~keep[ell])] = torch.finfo(m.dtype).min  # (a view: m itself)
        cut.append(m)
    return masked_tail_loss(net, x, mods, cut, SERVING_EVAL)


# ------------------------------------------------------------------------------------------ low rank
def _rope_truncation(
    net: Any, ids: list[int], cap: list[dict[str, Any]], kinds: list[str], window: int | None, ranks: Sequence[int]
) -> LowRankMetrics:
    """Top-1 agreement, support Jaccard, runner-up margin ratio and output error per (rank, layer, head)
    when each layer's normalised pre-RoPE keys are projected on their top-r right-singular subspace
    (:meth:`attsvm.analysis.rope_heads.RopeWindow.truncated_keys`), from the tensors captured in the prefill."""
    import torch

    from .rope_heads import RopeWindow, rotate

    L = len(cap)
    H = int(net.config.num_attention_heads)
    dh = int(net.config.head_dim)
    rk = tuple(sorted({min(int(r), dh) for r in ranks}))
    pes = [tuple(t[0].double() for t in c["pe"]) for c in cap]  # (cos, sin), each (N, dh)
    kpre = [c["k"][0].double() for c in cap]  # (H_kv, N, dh) normalised, before RoPE
    win = RopeWindow(
        ids=list(ids),
        q=[rotate(c["q"][0].double(), *pe) for c, pe in zip(cap, pes)],
        k=[rotate(k, *pe) for k, pe in zip(kpre, pes)],
        k_pre=kpre,
        cos=[pe[0] for pe in pes],
        sin=[pe[1] for pe in pes],
        scaling=tuple(float(layer.self_attn.scaling) for layer in net.model.layers),
        layer_types=tuple(kinds),
        window=window,
    )
    shape = (len(rk), L, H)
    top1, jac, mr, err = (np.zeros(shape) for _ in range(4))
    for ell, c in enumerate(cap):
        N, Hkv = kpre[ell].shape[1], kpre[ell].shape[0]
        v = c["v"][0].double().view(N, Hkv, dh).transpose(0, 1).repeat_interleave(H // Hkv, dim=0)  # (H, N, dh)
        mask = ~win.visible(ell)
        rows = torch.arange(N) >= MIN_KEYS - 1
        a0, m0, s0, o0 = _head_stats(win.logits(ell), mask, rows, v)
        for j, keys in enumerate(win.truncated_keys(ell, rk)):
            a, m, sp, o = _head_stats(win.logits(ell, keys), mask, rows, v)
            top1[j, ell], jac[j, ell], mr[j, ell], err[j, ell] = _compare(a0, m0, s0, o0, a, m, sp, o)
    return LowRankMetrics(rk, top1, jac, mr, err)


def _nll(net: Any, ids: Any) -> tuple[float, int]:
    """Summed next-token negative log-likelihood of ``ids`` (1, N) and the number of predicted tokens; the
    vocabulary projection in blocks of rows (262k logits per token)."""
    import torch

    with torch.no_grad():
        h = net.model(ids).last_hidden_state[0, :-1]
        tgt = ids[0, 1:]
        soft = getattr(net.config, "final_logit_softcapping", None)
        tot = 0.0
        for r0 in range(0, h.shape[0], 128):
            lg = net.lm_head(h[r0 : r0 + 128]).double()
            if soft:
                lg = torch.tanh(lg / soft) * soft
            tot += float(torch.nn.functional.cross_entropy(lg, tgt[r0 : r0 + 128], reduction="sum"))
    return tot, int(tgt.numel())


def mla_gemma(
    net: Any, heldout: list[list[int]], latents: Sequence[int], *, progress: bool = False
) -> dict[int, float]:
    """Held-out perplexity when every layer's stacked key/value projection ``[W_k; W_v]`` (2·H_kv·d_head × d)
    is replaced by its best rank-c approximation (one shared latent of size c per layer, as MLA caches);
    the weights are changed in place and restored afterwards. ``progress``: a bar over the latents."""
    import torch
    from tqdm.auto import tqdm

    layers = [layer.self_attn for layer in net.model.layers]
    saved = [(a.k_proj.weight.detach().clone(), a.v_proj.weight.detach().clone()) for a in layers]
    svds = []
    for a in layers:
        kv = torch.cat([a.k_proj.weight, a.v_proj.weight]).detach().double()
        svds.append(torch.linalg.svd(kv, full_matrices=False))
    out: dict[int, float] = {}
    try:
        for c in tqdm(latents, desc="MLA latents", unit="latent", disable=not progress):
            with torch.no_grad():
                for a, (U, S, Vh), (wk, _) in zip(layers, svds, saved):
                    approx = (U[:, :c] * S[:c]) @ Vh[:c]
                    a.k_proj.weight.copy_(approx[: wk.shape[0]].to(wk.dtype))
                    a.v_proj.weight.copy_(approx[wk.shape[0] :].to(wk.dtype))
            tot, n = 0.0, 0
            for ids in heldout:
                t, k = _nll(net, torch.tensor([ids]))
                tot, n = tot + t, n + k
            out[int(c)] = float(math.exp(tot / n))
    finally:
        with torch.no_grad():
            for a, (wk, wv) in zip(layers, saved):
                a.k_proj.weight.copy_(wk)
                a.v_proj.weight.copy_(wv)
    return out


# ------------------------------------------------------------------------------------------ the run
def corpus_streams(tok: Any) -> tuple[list[int], list[int]]:
    """Token ids (no BOS) of the training topics and of the held-out topics, each topic's text joined by blank
    lines in name order (the split of :func:`attsvm.analysis.lm.split_corpus`)."""
    from .lm import split_corpus

    train, held = split_corpus()

    def enc(texts: dict[str, str]) -> list[int]:
        return list(tok("\n\n".join(texts.values()), add_special_tokens=False, verbose=False)["input_ids"])

    return enc(train), enc(held)


def measure_gemma(net: Any, tok: Any, settings: GemmaSettings, *, progress: bool | None = None) -> dict[str, Any]:
    """Every window of ``settings`` through :func:`measure_window`, then the spectra and the MLA latents.
    Returns ``{"windows": [GemmaWindowMetrics], "spectra": ..., "mla": {c: ppl}, "layer_types": [...], ...}``."""
    from tqdm.auto import tqdm

    from .._threads import blas_threads
    from ._models import qk_weights
    from .anatomy import spectrum_stats

    _, window, kinds = _gemma_layout(net)
    bos = tok.bos_token_id
    if bos is None:
        raise ValueError("the tokenizer has no BOS token: Gemma 3 windows start with BOS")
    dh = int(net.config.head_dim)
    ranks = tuple(sorted({max(1, round(f * dh)) for f in settings.rank_fractions}))
    train, held = corpus_streams(tok)
    plan = window_plan(len(train), settings.lengths, settings.counts)
    wins: list[GemmaWindowMetrics] = []
    n_low = 0
    disable = (not sys.stderr.isatty()) if progress is None else not progress
    t0 = time.perf_counter()
    for start, n in tqdm(plan, desc="gemma windows", unit="window", disable=disable):
        ids = [int(bos), *train[start : start + n]]
        serve = len(ids) == SERVING_LENGTH
        low = ranks if serve and n_low < settings.lowrank_windows else None
        n_low += low is not None
        wins.append(measure_window(net, tok, ids, serving=serve, lowrank_ranks=low))
    t_windows = time.perf_counter() - t0
    t_spec = time.perf_counter()
    with blas_threads(1):  # (72 small factorisations: a BLAS pool per core only waits, 77 s against 1 s)
        spec = spectrum_stats(qk_weights(net))
    t1 = time.perf_counter()
    heldout = [
        [int(bos), *held[k * settings.mla_length : (k + 1) * settings.mla_length - 1]]
        for k in range(settings.mla_windows)
    ]
    rows = 2 * int(net.config.num_key_value_heads) * dh  # the stacked [W_k; W_v]
    latents = sorted({max(1, round(f * rows)) for f in settings.latent_fractions})
    mla = mla_gemma(net, heldout, latents, progress=not disable) if settings.mla_windows else {}
    return {
        "windows": wins,
        "d_head": dh,
        "spectra": spec,
        "mla": mla,
        "layer_types": kinds,
        "corpus_tokens": {"train": len(train), "heldout": len(held)},
        "timings": {"windows": t_windows, "spectra": t1 - t_spec, "mla": time.perf_counter() - t1},
    }


# ------------------------------------------------------------------------------------------ records
LAYER_GROUPS = (("sliding", "sliding_attention"), ("global", "full_attention"))


def _subset(w: GemmaWindowMetrics, layers: NDArray[np.intp]) -> SequenceMetrics:
    """The window's metrics restricted to ``layers`` (as :func:`claims.sequence_metrics` on those layers)."""
    s = w.seq
    lo = np.asarray(LONG_EDGES[:-1])
    by_len = np.full(len(LENGTH_EDGES) - 1, np.nan)
    for b in range(len(LENGTH_EDGES) - 1):
        sel = (lo >= LENGTH_EDGES[b]) & (lo < LENGTH_EDGES[b + 1])
        c = w.count_len[layers][:, sel].sum()
        if c > 0:
            by_len[b] = float(w.support_len[layers][:, sel].sum() / c)
    return SequenceMetrics(
        top1=s.top1[layers],
        top3=s.top3[layers],
        entropy=s.entropy[layers],
        top3_ex=s.top3_ex[layers],
        special_mass=s.special_mass[layers],
        first=s.first[layers],
        support=s.support[:, layers],
        support_share=s.support_share[:, layers],
        support_by_length=by_len,
        pairs_top3=float(w.pairs_lh[layers].mean()),
        pairs_top3_ex=float(w.pairs_ex_lh[layers].mean()),
    )


def _low_subset(m: LowRankMetrics, layers: NDArray[np.intp]) -> LowRankMetrics:
    return LowRankMetrics(
        m.ranks, m.top1[:, layers], m.jaccard[:, layers], m.margin_ratio[:, layers], m.output_error[:, layers]
    )


def gemma_records(name: str, measured: dict[str, Any], *, seed: int = 0) -> tuple[list[Any], dict[str, Any]]:
    """The claim records of a Gemma 3 run (whole model, then ``name:sliding`` and ``name:global``) and the
    per-layer-type, per-layer and per-head summary for the report."""
    from .claims import bootstrap_ci, lowrank_verdict, serving_verdict, verdicts

    wins: list[GemmaWindowMetrics] = measured["windows"]
    kinds: list[str] = list(measured["layer_types"])
    L, H = wins[0].seq.top1.shape
    groups = {g: np.flatnonzero(np.asarray(kinds) == t) for g, t in LAYER_GROUPS}
    groups = {g: ix for g, ix in groups.items() if ix.size}
    low = [w.lowrank for w in wins if w.lowrank is not None]
    srv = [w.serving for w in wins if w.serving is not None]
    dh = int(measured["d_head"])
    records = verdicts(name, [w.seq for w in wins], seed=seed)
    if low:
        records.append(lowrank_verdict(name, low, dh, measured["mla"] or None, seed=seed))
    if srv:
        records.append(serving_verdict(name, [s["lost"] for s in srv], [s["ppl_ratio"] for s in srv], seed=seed))
    for g, ix in groups.items():
        records += verdicts(f"{name}:{g}", [_subset(w, ix) for w in wins], seed=seed)
        if low:
            records.append(lowrank_verdict(f"{name}:{g}", [_low_subset(m, ix) for m in low], dh, None, seed=seed))
    spec = measured["spectra"]
    lengths = sorted({w.n_tokens for w in wins})

    def ci(values: Any) -> list[float]:
        return list(bootstrap_ci(values, seed=seed))

    by_type: dict[str, Any] = {}
    for g, ix in groups.items():
        t3 = np.stack([w.seq.top3[ix] for w in wins])  # (S, l, H)
        t3n = np.stack([w.top3_nobos[ix] for w in wins])
        j1 = DELTAS.index(1.0)
        entry: dict[str, Any] = {
            "layers": ix.tolist(),
            "share_of_heads_top3_mass_above_0.95": ci([float((t >= MASS).mean()) for t in t3]),
            "share_of_heads_top3_mass_above_0.95_without_bos": ci([float((t >= MASS).mean()) for t in t3n]),
            "share_of_pairs_top3_mass_above_0.95_without_bos": ci([float(w.pairs_nobos_lh[ix].mean()) for w in wins]),
            "mean_top1": ci([float(w.seq.top1[ix].mean()) for w in wins]),
            "mean_top3": ci([float(w.seq.top3[ix].mean()) for w in wins]),
            "first_token_mass": ci([float(w.seq.first[ix].mean()) for w in wins]),
            "support_keys_d1": ci([float(w.seq.support[j1][ix].mean()) for w in wins]),
            "support_keys_d1_by_window_length": {
                str(n): ci([float(w.seq.support[j1][ix].mean()) for w in wins if w.n_tokens == n]) for n in lengths
            },
            "support_share_d1_by_window_length": {
                str(n): ci([float(w.seq.support_share[j1][ix].mean()) for w in wins if w.n_tokens == n])
                for n in lengths
            },
            "effective_rank_W_h": float(spec.effective_rank[ix].mean()),
            "nuc_over_fro_W_h": float(spec.nuc_fro_ratio[ix].mean()),
        }
        cnt = sum(w.count_len[ix].sum(0) for w in wins)
        sup = sum(w.support_len[ix].sum(0) for w in wins)
        entry["support_keys_d1_by_visible_keys"] = [
            None if c == 0 else float(v / c) for v, c in zip(np.atleast_1d(sup), np.atleast_1d(cnt))
        ]
        if srv:
            entry["share_of_cached_keys_that_were_some_querys_top_key"] = ci(
                [float(s["top_key_share"][ix].mean()) for s in srv]
            )
            entry["lost_mass_at_half"] = {
                m: ci([float(s["lost_by_layer"][m][ix].mean()) for s in srv]) for m in SERVING_MODES
            }
        if low:
            T1 = np.stack([m.top1[:, ix] for m in low]).mean(0)  # (R, l, H)
            ok = T1 >= 0.99
            ranks = np.asarray(low[0].ranks)
            r99 = np.where(ok.any(0), np.take(ranks, ok.argmax(0)), dh)
            entry["rank_for_99pct_top1"] = {"median": float(np.median(r99)), "max": int(r99.max())}
            entry["top1_agreement_by_rank"] = [float(x) for x in T1.mean((1, 2))]
            entry["output_error_by_rank"] = [
                float(x) for x in np.stack([m.output_error[:, ix] for m in low]).mean(0).mean((1, 2))
            ]
        by_type[g] = entry
    mean = lambda attr: np.stack([getattr(w.seq, attr) for w in wins]).mean(0)  # noqa: E731  (L, H)
    j1 = DELTAS.index(1.0)
    per_layer: dict[str, Any] = {
        "type": kinds,
        "top1": mean("top1").mean(1).tolist(),
        "top3": mean("top3").mean(1).tolist(),
        "top3_without_bos": np.stack([w.top3_nobos for w in wins]).mean(0).mean(1).tolist(),
        "first_token_mass": mean("first").mean(1).tolist(),
        "sink_share": (mean("first") > SINK_EPS).mean(1).tolist(),
        "support_keys_d1": np.stack([w.seq.support[j1] for w in wins]).mean(0).mean(1).tolist(),
        "effective_rank_W_h": spec.effective_rank.mean(1).tolist(),
        "nuc_over_fro_W_h": spec.nuc_fro_ratio.mean(1).tolist(),
    }
    if srv:
        per_layer["lost_mass_all_at_half"] = np.mean([s["lost_by_layer"]["all"] for s in srv], axis=0).tolist()
    per_head = {
        "top1": mean("top1").tolist(),
        "top3": mean("top3").tolist(),
        "first_token_mass": mean("first").tolist(),
        "support_keys_d1": np.stack([w.seq.support[j1] for w in wins]).mean(0).tolist(),
        "effective_rank_W_h": spec.effective_rank.tolist(),
    }
    summary = {
        "layers": L,
        "heads": H,
        "windows": {str(n): sum(w.n_tokens == n for w in wins) for n in lengths},
        "by_layer_type": by_type,
        "per_layer": per_layer,
        "per_head": per_head,
        "visible_key_edges": list(LONG_EDGES[:-1]),
        "mla_latent_perplexity": {str(k): v for k, v in measured["mla"].items()},
        "corpus_tokens": measured["corpus_tokens"],
        "serving_forwards": [s["forwards"] for s in srv],
        "timings_s": measured["timings"],
    }
    return records, summary
