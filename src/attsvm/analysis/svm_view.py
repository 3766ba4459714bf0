"""The SVM view of a real attention head (docs/spec.md §2–3, §7).

For layer ℓ, head h: sample (sequence, query) pairs from the corpus. For a query at position q the
tokens are the layer's attention inputs at the window of the last ``T`` positions up to and including
q (for a bidirectional encoder this restricts the head to that window), in homogeneous coordinates
``x̃ = [x; 1]`` so that the head's biases are part of its matrix; the query is ``z̃_q``. The head's own
selection is ``α_i = argmax_t x̃_tᵀ W̃_h z̃_q`` (exact logits). This is a cross-attention instance
(docs/spec.md §1) with ``d + 1`` features, and the real ``W̃_h`` separates it by construction.

Reported:

* ``corr(W̃_h, W_mm)`` and ``corr(W̃_h, W*_mm)`` (Frobenius and rank-≤-d_head nuclear Att-SVM of α),
  raw and after projecting W̃_h onto the subspaces the constraints can see (span{a_k} × span{z_i}),
  since components outside them are invisible to every constraint;
* the same statistics for baselines: the other heads of the layer (on this head's selection) and
  random rank-d_head matrices ``KQᵀ`` (Gaussian, seeded);
* margin efficiency ``(min_k a_kᵀWz_k / ‖W‖_F) · ‖W_mm‖_F ∈ (−∞, 1]``: 1 means W is the max-margin
  direction, ≤ 0 that W does not even separate the selection;
* local optimality (docs/spec.md §2) of α: it needs token scores γ, which a real head does not define; we use
  ``γ_it = ±vᵀx_it`` with v the head's dominant value–output input direction (top right singular
  vector of W_O,h W_V,h, both signs), and random unit v as a baseline.

A Gemma 3 (RoPE) head is not one bilinear form of its layer inputs; :func:`svm_view` then views it in its
rotated d_head coordinates, where ``W_h = s·I`` (:class:`RopeSVMView`, :func:`rope_svm_views`; the
reduction and its baselines are stated in :mod:`attsvm.analysis.rope_heads`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._linalg import correlation
from .._validation import check_bool, check_positive_int, check_seed
from ..svm.status import CERTIFIED
from ..tokens import differences
from ._models import attention_inputs, corpus_windows, family_of, head_matrices, load_model, qk_weights

__all__ = ["SVMView", "RopeSVMView", "svm_view", "rope_svm_views", "collect_pairs", "parse_head", "ov_direction"]

log = logging.getLogger(__name__)

N_RANDOM = 50  # random low-rank baseline matrices


def parse_head(text: str) -> tuple[int, int]:
    """``"LAYER:HEAD"`` → (layer, head)."""
    try:
        layer, head = (int(p) for p in str(text).split(":"))
    except ValueError as exc:
        raise ValueError(f"head must be given as LAYER:HEAD (e.g. 2:5), got {text!r}") from exc
    if layer < 0 or head < 0:
        raise ValueError(f"head must be given as LAYER:HEAD with non-negative indices, got {text!r}")
    return layer, head


def _layer_head(model: Any, layer: Any, head: Any) -> tuple[int, int]:
    """``layer`` and ``head`` as ints within the model's layers and heads (a ValueError/TypeError naming them)."""
    if model is None or not hasattr(model, "config"):
        raise TypeError(f"model must be a transformers model (or a name), got {type(model).__name__}")
    w = qk_weights(model)
    layer = check_positive_int(layer, "layer", minimum=0)
    head = check_positive_int(head, "head", minimum=0)
    if not (layer < w.n_layers and head < w.n_heads):
        raise ValueError(f"layer:head must be within 0..{w.n_layers - 1}:0..{w.n_heads - 1}, got {layer}:{head}")
    return layer, head


def collect_pairs(
    model: Any,
    tok: Any,
    layer: int,
    head: int,
    *,
    n_pairs: int,
    T: int,
    seed: int,
    max_length: int = 128,
    max_windows: int = 64,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.int64], NDArray[np.float64]]:
    """Sample ``n_pairs`` (window, query) pairs: ``X`` (n, T, d+1), ``Z`` (n, d+1), ``alpha`` (n,), logits (n, T)."""
    import torch

    layer, head = _layer_head(model, layer, head)
    n_pairs = check_positive_int(n_pairs, "n_pairs", minimum=2)
    T = check_positive_int(T, "T", minimum=2)
    seed = check_seed(seed)
    max_length = check_positive_int(max_length, "max_length", minimum=T + 1)
    max_windows = check_positive_int(max_windows, "max_windows")
    if not callable(tok):
        raise TypeError(f"tok must be the model's tokenizer, got {type(tok).__name__}")
    w = qk_weights(model)
    Wt = head_matrices(w, bias=True)[layer, head]
    rng = np.random.default_rng(seed)
    windows = [ids for _, ids in corpus_windows(tok, max_length=max_length, max_windows=max_windows)]
    order = rng.permutation(len(windows))
    per = max(1, int(np.ceil(n_pairs / len(windows))) + 1)
    X, Z, A, LG = [], [], [], []
    with torch.no_grad():
        for j in order:
            ids = windows[j]
            if len(ids) < T + 1:
                continue
            out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
            H = attention_inputs(model, out.hidden_states)[layer][0].double().numpy()
            Ht = np.c_[H, np.ones(len(H))]  # (N, d+1)
            qs = rng.choice(np.arange(T - 1, len(ids)), size=min(per, len(ids) - T + 1), replace=False)
            for q in qs:
                Xw = Ht[q - T + 1 : q + 1]  # (T, d+1)
                lg = Xw @ Wt @ Ht[q]
                srt = np.sort(lg)
                if srt[-1] - srt[-2] < 1e-6 * max(1.0, abs(srt[-1])):  # a tie: no strict selection
                    continue
                X.append(Xw)
                Z.append(Ht[q])
                A.append(int(np.argmax(lg)))
                LG.append(lg)
                if len(X) >= n_pairs:
                    break
            if len(X) >= n_pairs:
                break
    if len(X) < 2:
        raise ValueError(f"found only {len(X)} usable (sequence, query) pairs; lower T={T} or use more windows")
    return np.stack(X), np.stack(Z), np.asarray(A, dtype=np.int64), np.stack(LG)


def ov_direction(model: Any, layer: int, head: int) -> NDArray[np.float64]:
    """Top right singular vector (d,) of the head's value–output map ``W_O,h W_V,h``."""
    layer, head = _layer_head(model, layer, head)
    fam = family_of(model)
    d = int(model.config.hidden_size)
    H = int(model.config.num_attention_heads)
    dh = d // H
    if fam == "bert":
        lay = model.encoder.layer[layer]
        Wv = lay.attention.self.value.weight.detach().double().numpy()  # (H·dh, d)
        Wo = lay.attention.output.dense.weight.detach().double().numpy()  # (d, H·dh)
    else:
        att = model.transformer.h[layer].attn if hasattr(model, "transformer") else model.h[layer].attn
        Wv = att.c_attn.weight.detach().double().numpy()[:, 2 * d :].T  # (d, d) rows = outputs
        Wo = att.c_proj.weight.detach().double().numpy().T
    sl = slice(head * dh, (head + 1) * dh)
    W_ov = Wo[:, sl] @ Wv[sl]  # (d, d)
    _, _, vt = np.linalg.svd(W_ov)
    return vt[0]


def _selection_constraints(X: NDArray[np.float64], Z: NDArray[np.float64], alpha: NDArray[np.intp]) -> Any:
    """The Att-SVM constraints of the selection ``alpha``: tokens X (n, T, d), queries Z (n, d)."""
    from ..svm import ConstraintSet

    n, T = X.shape[:2]
    mask = np.ones((n, T), dtype=bool)
    mask[np.arange(n), alpha] = False
    return ConstraintSet(differences(X[np.arange(n), alpha], X), Z, mask)


def _certificate(fit: Any) -> dict[str, float]:
    """What a fitted Att-SVM certifies: violation, duality gap, objective, rank."""
    return {
        "max_violation": float(fit.max_violation_),
        "relative_gap": float(fit.relative_gap_),
        "objective": float(fit.objective_),
        "rank": int(fit.rank_ if fit.rank_ is not None else 0),
    }


def _random_baseline(stats: Any, d: int, rank: int, count: int, rng: np.random.Generator) -> dict[str, list[float]]:
    """``stats`` of ``count`` random Gaussian products ``K Qᵀ`` (d × d, rank ``rank``)."""
    out: dict[str, list[float]] = {}
    for _ in range(count):
        K = rng.standard_normal((d, rank))
        Q = rng.standard_normal((d, rank))
        for k, v in stats(K @ Q.T).items():
            out.setdefault(k, []).append(v)
    return out


def _stats_against(cs: Any, W_mm: NDArray[np.float64], W_star: NDArray[np.float64]) -> Any:
    """``W ↦`` its correlations with W_mm and W*_mm, raw and projected onto the subspaces the constraints
    ``cs`` see, and its margin efficiency (module doc)."""
    sub = cs.subspaces()
    PU, PV = sub.U @ sub.U.T, sub.V @ sub.V.T
    fro_mm = float(np.linalg.norm(W_mm))

    def stats(W: NDArray[np.float64]) -> dict[str, float]:
        Wp = PU @ W @ PV
        return {
            "corr_fro": float(correlation(W, W_mm)),
            "corr_nuc": float(correlation(W, W_star)),
            "corr_fro_projected": float(correlation(Wp, W_mm)),
            "corr_nuc_projected": float(correlation(Wp, W_star)),
            "margin_efficiency": _margin_efficiency(cs, W, fro_mm),
        }

    return stats


def _margin_efficiency(cs: Any, W: NDArray[np.float64], fro_mm: float) -> float:
    m = cs.apply(W)[cs.mask]
    nrm = float(np.linalg.norm(W))
    return float(m.min() / nrm * fro_mm) if nrm > 0 else float("nan")


@dataclass
class SVMView:
    """Results of :func:`svm_view` (all plain numbers and lists; ``save`` writes ``svm_view.json``)."""

    layer: int
    head: int
    n_pairs: int
    T: int
    d: int
    d_head: int
    fro_status: str
    nuc_status: str
    nuc_rank: int | None
    nuc_note: str
    fro_certificate: dict[str, float]
    nuc_certificate: dict[str, float]
    corr_fro: float
    corr_nuc: float
    corr_fro_projected: float
    corr_nuc_projected: float
    margin_efficiency: float
    support_per_query: float
    other_heads: dict[str, list[float]] = field(default_factory=dict)
    random_lowrank: dict[str, list[float]] = field(default_factory=dict)
    local_optimality: dict[str, Any] = field(default_factory=dict)
    summary: str = ""

    def save(self, out: str | Path) -> Path:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / "svm_view.json"
        path.write_text(json.dumps(asdict(self), indent=1))
        (out / "svm_view.md").write_text(self.markdown())
        return path

    def markdown(self) -> str:
        def stat(v: list[float]) -> str:
            a = np.asarray(v, dtype=float)
            return f"mean {a.mean():.3f} ± {a.std():.3f}, max {a.max():.3f}" if a.size else "—"

        oh, rl, lo = self.other_heads, self.random_lowrank, self.local_optimality
        return "\n".join(
            [
                f"# SVM view of layer {self.layer}, head {self.head}",
                "",
                f"{self.n_pairs} (sequence, query) pairs, T = {self.T} keys (the last T positions up to the query), "
                f"d + 1 = {self.d + 1} homogeneous features; α = the head's own argmax.",
                "",
                f"* Frobenius Att-SVM: status {self.fro_status}; certificate {self.fro_certificate}.",
                f"* Nuclear Att-SVM* ({f'rank ≤ {self.nuc_rank:d}' if self.nuc_rank else 'convex'}): "
                f"status {self.nuc_status}; certificate {self.nuc_certificate}"
                + (f" ({self.nuc_note})." if self.nuc_note else "."),
                f"* support keys per query (tight constraints of W_mm): {self.support_per_query:.2f} of {self.T - 1}.",
                "",
                "| statistic | this head | other heads, same layer | random rank-d_head |",
                "|---|---|---|---|",
                f"| corr(W, W_mm) | {self.corr_fro:.3f} | {stat(oh.get('corr_fro', []))} | "
                f"{stat(rl.get('corr_fro', []))} |",
                f"| corr(W, W*_mm) | {self.corr_nuc:.3f} | {stat(oh.get('corr_nuc', []))} | "
                f"{stat(rl.get('corr_nuc', []))} |",
                f"| corr(P W P', W_mm), projected | {self.corr_fro_projected:.3f} | "
                f"{stat(oh.get('corr_fro_projected', []))} | {stat(rl.get('corr_fro_projected', []))} |",
                f"| corr(P W P', W*_mm), projected | {self.corr_nuc_projected:.3f} | "
                f"{stat(oh.get('corr_nuc_projected', []))} | {stat(rl.get('corr_nuc_projected', []))} |",
                f"| margin efficiency | {self.margin_efficiency:.3f} | {stat(oh.get('margin_efficiency', []))} | "
                f"{stat(rl.get('margin_efficiency', []))} |",
                "",
                f"Local optimality (docs/spec.md §2) with γ = ±vᵀx, v = the head's value–output direction: "
                f"{lo.get('ov_plus_passed', 0):.3f} / {lo.get('ov_minus_passed', 0):.3f} of sequences pass "
                f"(α = opt for {lo.get('ov_plus_is_opt', 0):.3f} / {lo.get('ov_minus_is_opt', 0):.3f}); "
                f"random v: {lo.get('random_passed_mean', 0):.3f} pass on average. Whole selection locally optimal: "
                f"{lo.get('ov_plus_locally_optimal')} / {lo.get('ov_minus_locally_optimal')}.",
                "",
                self.summary,
                "",
            ]
        )


def svm_view(
    model: str | Any = "minilm",
    layer: int = 0,
    head: int = 0,
    *,
    n_pairs: int = 32,
    T: int = 8,
    seed: int = 0,
    quick: bool = False,
    tok: Any = None,
) -> SVMView:
    """Solve Att-SVM / Att-SVM* on a real head's selections and compare with the head (module doc).

    ``quick=True`` (a smoke run) caps ``n_pairs`` at 12 and ``T`` at 6, reads at most 8 windows and
    draws 8 random directions; the result's shapes say what was used. A Gemma 3 (RoPE) head is viewed in
    its rotated d_head coordinates and gives a :class:`RopeSVMView` (:func:`rope_svm_views`)."""
    from ..problem import AttentionProblem
    from ..svm import AttentionSVM
    from ..tokens import local_optimality_report

    quick = check_bool(quick, "quick")
    seed = check_seed(seed)
    n_pairs = check_positive_int(n_pairs, "n_pairs", minimum=2)
    T = check_positive_int(T, "T", minimum=2)
    if isinstance(model, str):
        model, tok = load_model(model)
    elif tok is None:
        raise TypeError("tok (the model's tokenizer) is required when model is a model object, not a name")
    layer, head = _layer_head(model, layer, head)
    if family_of(model) == "gemma3":  # RoPE: the head's rotated coordinates (rope_heads module doc)
        return rope_svm_views(model, tok, [(layer, head)], n_pairs=n_pairs, T=T, seed=seed, quick=quick)[0]
    w = qk_weights(model)
    if quick:
        n_pairs, T = min(n_pairs, 12), min(T, 6)
    X, Z, alpha, _ = collect_pairs(
        model, tok, layer, head, n_pairs=n_pairs, T=T, seed=seed, max_windows=8 if quick else 64
    )
    n = len(alpha)
    cs = _selection_constraints(X, Z, alpha)
    fro = AttentionSVM("fro").fit_constraints(cs)
    # some W*_mm has rank <= n (docs/spec.md §3), so the rank constraint only binds when n > d_head
    nuc_rank: int | None = w.d_head if n > w.d_head else None
    nuc_note = "" if nuc_rank else f"rank constraint inactive (n = {n} <= d_head)"
    try:
        nuc = AttentionSVM("nuc", rank=nuc_rank).fit_constraints(cs)
    except Exception as exc:  # a solver bug must not lose the Frobenius results: report it and fall back
        if nuc_rank is None:
            raise
        log.warning("rank-constrained Att-SVM* raised %r; using the convex Att-SVM*", exc)
        nuc_note = f"rank-constrained solve raised {type(exc).__name__}: {exc}; convex Att-SVM* used"
        nuc = AttentionSVM("nuc").fit_constraints(cs)
        nuc_rank = None
    if nuc.W_ is None and nuc_rank is not None:  # did not solve: fall back to the convex Att-SVM*, and say so
        nuc_note = f"rank-constrained status {nuc.status_}; convex Att-SVM* used"
        nuc = AttentionSVM("nuc").fit_constraints(cs)
        nuc_rank = None
    if fro.W_ is None or nuc.W_ is None:
        raise RuntimeError(f"the SVMs did not solve (Frobenius {fro.status_}, nuclear {nuc.status_})")
    W_mm, W_star = fro.W_, nuc.W_
    stats = _stats_against(cs, W_mm, W_star)

    all_W = head_matrices(w, bias=True)[layer]
    mine = stats(all_W[head])
    other: dict[str, list[float]] = {}
    for h in range(w.n_heads):
        if h != head:
            for k, v in stats(all_W[h]).items():
                other.setdefault(k, []).append(v)
    rng = np.random.default_rng(seed)
    rand = _random_baseline(stats, w.d + 1, w.d_head, 8 if quick else N_RANDOM, rng)

    # local optimality (docs/spec.md §2) under the head's value-output direction, both signs, and random v
    v = np.r_[ov_direction(model, layer, head), 0.0]
    y = np.ones(n)
    lo: dict[str, Any] = {}
    for name, vv in (("ov_plus", v), ("ov_minus", -v)):
        prob = AttentionProblem(X, y, vv, Z=Z)
        rep = local_optimality_report(prob, alpha, fro.support_, feasible=True)
        lo[f"{name}_passed"] = float(rep.passed.mean())
        lo[f"{name}_locally_optimal"] = bool(rep.locally_optimal)
        lo[f"{name}_is_opt"] = float(np.mean(np.argmax(prob.scores, axis=1) == alpha))
    passes = []
    for _ in range(20):
        vr = rng.standard_normal(w.d + 1)
        vr[-1] = 0.0
        prob = AttentionProblem(X, y, vr / np.linalg.norm(vr), Z=Z)
        passes.append(float(local_optimality_report(prob, alpha, fro.support_, feasible=True).passed.mean()))
    lo["random_passed_mean"] = float(np.mean(passes))

    oh_fro = np.asarray(other["corr_fro_projected"])
    rl_fro = np.asarray(rand["corr_fro_projected"])
    verdict = (
        f"Projected onto the constraint subspaces, this head correlates {mine['corr_fro_projected']:.3f} with "
        f"W_mm and {mine['corr_nuc_projected']:.3f} with W*_mm; other heads of the layer reach "
        f"{oh_fro.mean():.3f} on average and random rank-{w.d_head} matrices {rl_fro.mean():.3f}. "
    )
    if mine["corr_fro_projected"] > max(oh_fro.max(), rl_fro.max()):
        verdict += "The head is closer to its max-margin direction than every baseline, "
    else:
        verdict += "The head is not closer to its max-margin direction than all baselines, "
    verdict += (
        f"but far from equal to it (margin efficiency {mine['margin_efficiency']:.3f}, where 1 would be the "
        "SVM direction): the real head separates its own selections with a much smaller normalized margin "
        "than the SVM solution, consistent with finite training far from the norm → ∞ regime."
    )
    best_ov = max(lo["ov_plus_passed"], lo["ov_minus_passed"])
    verdict += (
        f" Local optimality (docs/spec.md §2) needs token scores a real head does not define: with γ = ±vᵀx along the "
        f"head's value–output direction, {best_ov:.2f} of the sequences pass (random v: "
        f"{lo['random_passed_mean']:.2f}), so "
        + (
            "these scores do not single out the head's selections."
            if best_ov <= lo["random_passed_mean"] + 0.05
            else "these scores favour the head's selections."
        )
    )
    return SVMView(
        layer=int(layer),
        head=int(head),
        n_pairs=n,
        T=T,
        d=w.d,
        d_head=w.d_head,
        fro_status=str(fro.status_),
        nuc_status=str(nuc.status_),
        nuc_rank=nuc_rank,
        nuc_note=nuc_note,
        fro_certificate=_certificate(fro),
        nuc_certificate=_certificate(nuc),
        **mine,  # corr_fro, corr_nuc, their projected forms, margin_efficiency
        support_per_query=float(fro.support_.sum() / n),
        other_heads=other,
        random_lowrank=rand,
        local_optimality=lo,
        summary=verdict,
    )


# ---------------------------------------------------------------------------------------- RoPE heads
@dataclass
class RopeSVMView(SVMView):
    """:class:`SVMView` of a RoPE (Gemma 3) head in its rotated d_head coordinates (:mod:`.rope_heads`).

    ``d`` is d_head (no bias coordinate); ``other_heads`` also holds ``fit_r2``, the coefficient of
    determination of the least-squares maps carrying this head's features to each other head's;
    ``local_optimality`` is not measured (the value path does not live in these coordinates)."""

    layer_type: str = ""
    positions: list[int] = field(default_factory=list)

    def brief(self) -> dict[str, Any]:
        """The numbers of :func:`attsvm.analysis.anatomy.analyze`'s SVM section."""

        def mean(key: str, d: dict[str, list[float]]) -> float:
            v = d.get(key, [])
            return float(np.mean(v)) if v else float("nan")

        return {
            "layer": self.layer,
            "head": self.head,
            "layer_type": self.layer_type,
            "n_pairs": self.n_pairs,
            "T": self.T,
            "fro_status": self.fro_status,
            "nuc_status": self.nuc_status,
            "certified": self.fro_status in CERTIFIED and self.nuc_status in CERTIFIED,
            "fro_max_violation": self.fro_certificate["max_violation"],
            "fro_relative_gap": self.fro_certificate["relative_gap"],
            "nuc_max_violation": self.nuc_certificate["max_violation"],
            "nuc_relative_gap": self.nuc_certificate["relative_gap"],
            "corr_fro": self.corr_fro,
            "corr_nuc": self.corr_nuc,
            "corr_fro_projected": self.corr_fro_projected,
            "corr_nuc_projected": self.corr_nuc_projected,
            "margin_efficiency": self.margin_efficiency,
            "other_heads_corr_fro": mean("corr_fro", self.other_heads),
            "other_heads_corr_nuc": mean("corr_nuc", self.other_heads),
            "other_heads_fit_r2": mean("fit_r2", self.other_heads),
            "random_corr_fro": mean("corr_fro", self.random_lowrank),
            "random_corr_nuc": mean("corr_nuc", self.random_lowrank),
            "max_query_position": max(self.positions) if self.positions else -1,
        }

    def markdown(self) -> str:
        def stat(v: list[float]) -> str:
            a = np.asarray(v, dtype=float)
            return f"mean {a.mean():.3f} ± {a.std():.3f}, max {a.max():.3f}" if a.size else "—"

        oh, rl = self.other_heads, self.random_lowrank
        rows = [
            ("corr(W, W_mm)", self.corr_fro, "corr_fro"),
            ("corr(W, W*_mm)", self.corr_nuc, "corr_nuc"),
            ("corr(P W P', W_mm), projected", self.corr_fro_projected, "corr_fro_projected"),
            ("corr(P W P', W*_mm), projected", self.corr_nuc_projected, "corr_nuc_projected"),
            ("margin efficiency", self.margin_efficiency, "margin_efficiency"),
        ]
        return "\n".join(
            [
                f"# SVM view of layer {self.layer} ({self.layer_type}), head {self.head} (RoPE)",
                "",
                f"{self.n_pairs} (sequence, query) pairs, T = {self.T} keys (the last T positions up to the query, "
                f"query positions up to {max(self.positions) if self.positions else 0}), in the head's rotated "
                f"d_head = {self.d} coordinates: key tokens x_t = R_t k̂_t, query z = R_q q̂_q, W_h = s·I "
                "(see `attsvm.analysis.rope_heads`); α = the head's own argmax.",
                "",
                f"* Frobenius Att-SVM: status {self.fro_status}; certificate {self.fro_certificate}.",
                f"* Nuclear Att-SVM* (convex; rank ≤ d_head is vacuous here): status {self.nuc_status}; "
                f"certificate {self.nuc_certificate}" + (f" ({self.nuc_note})." if self.nuc_note else "."),
                f"* support keys per query (tight constraints of W_mm): {self.support_per_query:.2f} of {self.T - 1}.",
                "",
                "| statistic | this head | other heads, same layer (least-squares maps) | random d_head × d_head |",
                "|---|---|---|---|",
                *(f"| {name} | {v:.3f} | {stat(oh.get(k, []))} | {stat(rl.get(k, []))} |" for name, v, k in rows),
                "",
                "Other heads are mapped into this head's coordinates by least squares "
                f"(R² {stat(oh.get('fit_r2', []))}).",
                "",
                self.summary,
                "",
            ]
        )


def _rope_pairs(
    wins: list[Any], layer: int, head: int, n_pairs: int, T: int, rng: np.random.Generator
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.int64], list[int]]:
    """``X`` (n, T, d_head) rotated keys of the last T positions, ``Z`` (n, d_head) rotated queries, ``α``."""
    X, Z, A, P = [], [], [], []
    per = max(1, int(np.ceil(n_pairs / len(wins))) + 1)
    for j in rng.permutation(len(wins)):
        win = wins[j]
        N = win.n_tokens
        if N < T + 1:
            continue
        q = win.q[layer][head].numpy()  # (N, dh)
        k = win.k[layer][head // (win.q[layer].shape[0] // win.k[layer].shape[0])].numpy()
        s = win.scaling[layer]
        for m in rng.choice(np.arange(T - 1, N), size=min(per, N - T + 1), replace=False):
            Xw = k[m - T + 1 : m + 1]
            lg = s * (Xw @ q[m])
            srt = np.sort(lg)
            if srt[-1] - srt[-2] < 1e-6 * max(1.0, abs(srt[-1])):  # a tie: no strict selection
                continue
            X.append(Xw)
            Z.append(q[m])
            A.append(int(np.argmax(lg)))
            P.append(int(m))
            if len(X) >= n_pairs:
                break
        if len(X) >= n_pairs:
            break
    if len(X) < 2:
        raise ValueError(f"found only {len(X)} usable (sequence, query) pairs; lower T={T} or use more windows")
    return np.stack(X), np.stack(Z), np.asarray(A, dtype=np.int64), P


def rope_svm_views(
    model: Any,
    tok: Any,
    heads: list[tuple[int, int]],
    *,
    n_pairs: int = 32,
    T: int = 8,
    seed: int = 0,
    quick: bool = False,
    progress: bool = False,
    windows: list[list[int]] | None = None,
) -> list[RopeSVMView]:
    """The SVM view of each ``(layer, head)`` of a RoPE model (Gemma 3) in the head's rotated coordinates,
    from one hooked forward pass per window (reduction and baselines: :mod:`attsvm.analysis.rope_heads`).

    Windows (default): the corpus windows of 1024 tokens (``quick``: 768), 4 of them (``quick``: 2), so
    that query positions go past a 512-token sliding window; ``quick`` caps ``n_pairs`` at 12 and ``T`` at
    6 and draws 8 random matrices."""
    from tqdm.auto import tqdm

    from .anatomy import rope_corpus_windows
    from .rope_heads import rope_window

    quick = check_bool(quick, "quick")
    seed = check_seed(seed)
    n_pairs = check_positive_int(n_pairs, "n_pairs", minimum=2)
    T = check_positive_int(T, "T", minimum=2)
    if not isinstance(heads, (list, tuple)) or not heads:
        raise ValueError(f"heads must be a non-empty list of (layer, head) pairs, got {heads!r}")
    heads = [_layer_head(model, layer, head) for layer, head in heads]
    if quick:
        n_pairs, T = min(n_pairs, 12), min(T, 6)
    if windows is None:
        windows = rope_corpus_windows(tok, 768 if quick else 1024, 2 if quick else 4)
    layers = sorted({layer for layer, _ in heads})
    wins = [rope_window(model, ids, layers=layers) for ids in tqdm(windows, desc="svm view", disable=not progress)]
    w = qk_weights(model)
    return [
        _rope_view(wins, w, layer, head, n_pairs, T, seed, quick)
        for layer, head in tqdm(heads, desc="svm heads", disable=not progress, leave=False)
    ]


def _rope_view(
    wins: list[Any], w: Any, layer: int, head: int, n_pairs: int, T: int, seed: int, quick: bool
) -> RopeSVMView:
    from ..svm import AttentionSVM
    from .rope_heads import lstsq_map

    rng = np.random.default_rng([seed, layer, head])
    X, Z, alpha, positions = _rope_pairs(wins, layer, head, n_pairs, T, rng)
    n, _, dh = X.shape
    cs = _selection_constraints(X, Z, alpha)
    fro = AttentionSVM("fro").fit_constraints(cs)
    nuc = AttentionSVM("nuc").fit_constraints(cs)  # d = d_head: a rank <= d_head constraint is vacuous
    if fro.W_ is None or nuc.W_ is None:
        raise RuntimeError(f"the SVMs did not solve (Frobenius {fro.status_}, nuclear {nuc.status_})")
    W_mm, W_star = fro.W_, nuc.W_
    stats = _stats_against(cs, W_mm, W_star)

    s = float(wins[0].scaling[layer])
    mine = stats(s * np.eye(dh))
    # other heads, mapped into this head's coordinates by least squares over every position read
    H = wins[0].q[layer].shape[0]
    G = H // wins[0].k[layer].shape[0]
    q_all = np.concatenate([win.q[layer].numpy() for win in wins], axis=1)  # (H, ΣN, dh)
    k_all = np.concatenate([win.k[layer].numpy() for win in wins], axis=1)  # (H_kv, ΣN, dh)
    other: dict[str, list[float]] = {}
    for h in range(H):
        if h == head:
            continue
        B, r2q = lstsq_map(q_all[head], q_all[h])
        if h // G == head // G:
            Amap, r2k = np.eye(dh), 1.0
        else:
            Amap, r2k = lstsq_map(k_all[head // G], k_all[h // G])
        for key, v in (stats(s * Amap.T @ B) | {"fit_r2": min(r2q, r2k)}).items():
            other.setdefault(key, []).append(v)
    rand = _random_baseline(stats, dh, dh, 8 if quick else N_RANDOM, rng)

    rl = np.asarray(rand["corr_fro_projected"])
    oh = np.asarray(other.get("corr_fro_projected", [np.nan]))
    verdict = (
        f"In its rotated coordinates (W_h = s·I), this head correlates {mine['corr_fro']:.3f} with W_mm and "
        f"{mine['corr_nuc']:.3f} with W*_mm ({mine['corr_fro_projected']:.3f} / {mine['corr_nuc_projected']:.3f} "
        f"projected onto the constraint subspaces); the other heads of the layer, mapped by least squares, reach "
        f"{np.nanmean(oh):.3f} (projected, Frobenius) and random d_head × d_head matrices {rl.mean():.3f}; "
        f"margin efficiency {mine['margin_efficiency']:.3f} (1 would be the SVM direction)."
    )
    layer_type = "sliding" if w.layer_types and w.layer_types[layer] == "sliding_attention" else "global"
    return RopeSVMView(
        layer=int(layer),
        head=int(head),
        n_pairs=n,
        T=T,
        d=dh,
        d_head=dh,
        fro_status=str(fro.status_),
        nuc_status=str(nuc.status_),
        nuc_rank=None,
        nuc_note="",
        fro_certificate=_certificate(fro),
        nuc_certificate=_certificate(nuc),
        **mine,  # corr_fro, corr_nuc, their projected forms, margin_efficiency
        support_per_query=float(fro.support_.sum() / n),
        other_heads=other,
        random_lowrank=rand,
        local_optimality={"note": "not measured for RoPE heads (the value path is not in these coordinates)"},
        summary=verdict,
        layer_type=layer_type,
        positions=positions,
    )
