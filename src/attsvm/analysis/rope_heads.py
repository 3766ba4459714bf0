"""Exact attention logits of RoPE heads (Gemma 3), and the head's own coordinates for the SVM view.

**Why a separate path.** A Gemma 3 head (family ``"gemma3"``, :mod:`attsvm.analysis._models`) computes the
logit of a query at position m (layer input z) on a key at position n (layer input x) as

    logit(n, m) = s · ⟨R_m q̂_m, R_n k̂_n⟩,   q̂_m = D_q W_q z / r_q(z),   k̂_n = D_k W_k x / r_k(x),

with ``D = diag(1 + w)`` the q/k RMSNorm gains, ``r`` the per-token RMS of the projected head vector,
``R_p`` the RoPE rotation of position p (block-diagonal 2 × 2 rotations, NeoX layout, a different base
for sliding and full-attention layers), and ``s = query_pre_attn_scalar^{-1/2}`` (``self_attn.scaling``).
A query sees the keys ``n ≤ m`` (causal) and, in a sliding layer, only ``m − n < window``
(``config.sliding_window``); the other keys have logit −∞. Because ``⟨R_m u, R_n v⟩ = ⟨u, R_{n−m} v⟩``
depends on the offset n − m, and ``r`` on the token, the logit is *not* one bilinear form ``xᵀ W z`` of
the layer inputs, so :func:`attsvm.analysis._models.attention_logits` refuses Gemma.

**Exact logits.** :func:`rope_window` runs one forward pass of a token window with hooks that capture,
per layer, the outputs of ``self_attn.q_norm`` and ``self_attn.k_norm`` (the normalised pre-RoPE ``q̂``
and ``k̂``, shapes (H, N, d_head) and (H_kv, N, d_head)) and the ``position_embeddings = (cos, sin)``
handed to ``self_attn`` (a forward pre-hook). In float64 it rotates them as the model does
(``transformers``' ``apply_rotary_pos_emb``), and :meth:`RopeWindow.logits` returns
``s · q_rot k_rotᵀ`` (H, N, N) with the layer's mask as −∞; a KV head serves the ``H / H_kv`` query heads
of its group (heads ``g·G … g·G + G − 1``, as ``repeat_kv`` orders them). Their softmax is the model's
eager attention (tested to ~1e-6). Gemma 3's attention passes no logit soft-capping to its kernel, so none
is applied here.

**RoPE-aware low-rank compression** (:meth:`RopeWindow.truncated_keys`): each KV head's pre-RoPE keys
``k̂_1 … k̂_N`` over the window are projected onto their top-r right-singular subspace
(``k̂ ↦ P_r k̂``, ``P_r = V_r V_rᵀ`` from the SVD of the N × d_head key matrix), then rotated by their
own positions; queries and masks are unchanged. This is the Llama version of
:func:`attsvm.analysis.claims.rope_lowrank_metrics` for Gemma's normalised keys.

**The SVM view of a RoPE head** (:func:`attsvm.analysis.svm_view.svm_view` on a Gemma model). Fix layer ℓ
and query head h (KV head g = h // G). For a query at position m take the window of the last T positions
``n = m − T + 1 … m`` (all visible, since T ≤ window) and define, in the head's rotated d_head-dimensional
coordinates,

    key tokens      x_t = R_{n_t} k̂_{n_t}   (the KV head's normalised, rotated keys),
    query feature   z   = R_m q̂_m          (the head's normalised, rotated query).

Then the head's exact logit is ``logit_t = s · x_tᵀ z = x_tᵀ W_h z`` with ``W_h = s · I`` (d_head × d_head):
in these coordinates every RoPE head is one bilinear form, the nonlinear parts (RMS norms, rotations by
position) having been moved into the features. The head's selection is ``α = argmax_t x_tᵀ W_h z``
(pairs with a tie at relative tolerance 1e-6 are skipped), an instance of cross attention (docs/spec.md
§1) with d = d_head features and no bias coordinate. The Frobenius Att-SVM (W_mm) and the nuclear
Att-SVM* (W*_mm; since ``d = d_head`` a rank ≤ d_head constraint is vacuous and the convex problem is
solved) are fitted on these constraints, and ``corr(W_h, W_mm) = tr(W_mm) / (√d_head ‖W_mm‖_F)`` (the
scale s cancels), likewise for W*_mm and for the projections onto the constraint subspaces.
Baselines: random Gaussian d_head × d_head products ``K Qᵀ`` and the *other heads of the layer*
mapped into this head's coordinates. Head h' shares the key tokens x_t when it is in the same KV group
(with a different KV head its keys differ; its query and key maps are both fitted); its logit
``s · x'_tᵀ z'`` is represented by ``W_{h'} = s · A_{h'}ᵀ B_{h'}`` with ``B_{h'}`` the least-squares linear
map ``z ↦ z'`` over all query positions of the windows read and ``A_{h'}`` the map ``x ↦ x'`` over all key
positions (the identity inside a KV group); the coefficient of determination of these fits is reported,
because RoPE makes the maps only approximately linear across positions when the heads differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from .._validation import check_positive_int
from ._models import _layers, family_of, layer_types, sliding_window

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["RopeWindow", "rope_window", "rope_logits", "rotate", "is_rope_model", "visible_mask"]


def is_rope_model(model: Any) -> bool:
    """Whether ``model`` is a RoPE model this module reads (the Gemma 3 family)."""
    return family_of(model) == "gemma3"


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE of ``x`` (..., heads, N, d_head) with the model's ``cos``/``sin`` (N, d_head), as the model applies it."""
    from transformers.models.gemma3.modeling_gemma3 import apply_rotary_pos_emb

    out, _ = apply_rotary_pos_emb(x, x, cos, sin, unsqueeze_dim=0)
    return out


def visible_mask(N: int, layer_type: str, window: int | None) -> torch.Tensor:
    """(N, N) bool, ``[m, n]`` True where query m sees key n: ``n ≤ m``, and ``m − n < window`` when sliding."""
    import torch

    pos = torch.arange(N)
    vis = pos[None, :] <= pos[:, None]
    if layer_type == "sliding_attention" and window is not None:
        vis &= (pos[:, None] - pos[None, :]) < window
    return vis


@dataclass
class RopeWindow:
    """One window's captured, float64 per-layer tensors (module doc); lists are indexed by layer.

    ``q`` (H, N, d_head) and ``k`` (H_kv, N, d_head) are normalised and rotated; ``k_pre`` is the
    normalised pre-RoPE keys; ``cos``/``sin`` (N, d_head) the layer's rotary tables. Layers not captured
    hold None. ``attention`` holds the model's own probabilities (H, N, N) when asked for.
    """

    ids: list[int]
    q: list[Any]
    k: list[Any]
    k_pre: list[Any]
    cos: list[Any]
    sin: list[Any]
    scaling: tuple[float, ...]
    layer_types: tuple[str, ...]
    window: int | None
    attention: list[Any] | None = None

    @property
    def n_tokens(self) -> int:
        return len(self.ids)

    @property
    def n_layers(self) -> int:
        return len(self.layer_types)

    def visible(self, layer: int) -> torch.Tensor:
        """(N, N) bool mask of the layer: causal, and the sliding window on sliding layers."""
        return visible_mask(self.n_tokens, self.layer_types[layer], self.window)

    def _get(self, layer: int) -> tuple[Any, Any]:
        if not (0 <= layer < self.n_layers) or self.q[layer] is None:
            captured = [i for i, t in enumerate(self.q) if t is not None]
            raise ValueError(f"layer must be one of the captured layers {captured}, got {layer}")
        return self.q[layer], self.k[layer]

    def logits(self, layer: int, keys: torch.Tensor | None = None, *, masked: bool = True) -> torch.Tensor:
        """Exact logits (H, N, N) ``[head, query, key]`` in float64, invisible keys at −∞ (``masked``).

        ``keys`` (H_kv, N, d_head) replaces the layer's rotated keys (e.g. :meth:`truncated_keys`).
        """
        import torch

        q, k = self._get(layer)
        if keys is not None:
            k = keys
        H, N, dh = q.shape
        Hkv = k.shape[0]
        G = H // Hkv
        lg = (q.reshape(Hkv, G, N, dh) @ k.transpose(-1, -2)[:, None]).reshape(H, N, N)
        lg = lg * self.scaling[layer]
        if masked:
            lg = lg.masked_fill(~self.visible(layer), -torch.inf)
        return lg

    def truncated_keys(self, layer: int, ranks: tuple[int, ...]) -> list[torch.Tensor]:
        """Rotated keys (H_kv, N, d_head) after projecting each KV head's pre-RoPE keys onto their top-r
        right-singular subspace over the window, one tensor per rank in ``ranks`` (module doc)."""
        import torch

        self._get(layer)
        kp = self.k_pre[layer]
        _, _, Vh = torch.linalg.svd(kp, full_matrices=False)  # (H_kv, d_head, d_head)
        out = []
        for r in ranks:
            Vr = Vh[:, :r]  # (H_kv, r, d_head)
            proj = (kp @ Vr.transpose(-1, -2)) @ Vr
            out.append(rotate(proj, self.cos[layer], self.sin[layer]))
        return out


def rope_window(model: Any, ids: list[int], *, layers: list[int] | None = None, attention: bool = False) -> RopeWindow:
    """Run ``model`` (a Gemma 3 model, with or without its LM head) once on ``ids`` and capture, for each
    layer in ``layers`` (default all), the tensors of :class:`RopeWindow` (module doc).

    ``attention=True`` also keeps the model's own attention probabilities (eager attention)."""
    import torch

    if not is_rope_model(model):
        raise ValueError(f"model must be a Gemma 3 (RoPE) model, got model type {model.config.model_type!r}")
    blocks = _layers(model)
    L = len(blocks)
    if not isinstance(ids, (list, tuple)) or len(ids) < 1:
        raise ValueError(f"ids must be a non-empty list of token ids, got {type(ids).__name__}")
    wanted = list(range(L)) if layers is None else sorted({check_positive_int(i, "layers", minimum=0) for i in layers})
    if wanted and wanted[-1] >= L:
        raise ValueError(f"layers must be within 0..{L - 1}, got {wanted[-1]}")
    qn: list[Any] = [None] * L
    kn: list[Any] = [None] * L
    pe: list[Any] = [None] * L
    att: list[Any] = [None] * L
    hooks = []

    def keep(store: list[Any], i: int) -> Any:
        def hook(module: Any, args: Any, out: Any) -> None:
            store[i] = out[0].detach().double()

        return hook

    def keep_pe(i: int) -> Any:
        def hook(module: Any, args: Any, kwargs: Any) -> None:
            cos, sin = kwargs["position_embeddings"]
            pe[i] = (cos[0].detach().double(), sin[0].detach().double())

        return hook

    def keep_att(i: int) -> Any:
        def hook(module: Any, args: Any, out: Any) -> None:
            att[i] = out[1][0].detach().double()

        return hook

    for i in wanted:
        sa = blocks[i].self_attn
        hooks.append(sa.q_norm.register_forward_hook(keep(qn, i)))
        hooks.append(sa.k_norm.register_forward_hook(keep(kn, i)))
        hooks.append(sa.register_forward_pre_hook(keep_pe(i), with_kwargs=True))
        if attention:
            hooks.append(sa.register_forward_hook(keep_att(i)))
    base = getattr(model, "base_model", model)  # skip the LM head: only the attention is needed
    try:
        with torch.no_grad():
            base(input_ids=torch.tensor([list(ids)], dtype=torch.long), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    q: list[Any] = [None] * L
    k: list[Any] = [None] * L
    for i in wanted:
        cos, sin = pe[i]
        q[i] = rotate(qn[i], cos, sin)
        k[i] = rotate(kn[i], cos, sin)
    return RopeWindow(
        ids=list(ids),
        q=q,
        k=k,
        k_pre=kn,
        cos=[None if p is None else p[0] for p in pe],
        sin=[None if p is None else p[1] for p in pe],
        scaling=tuple(float(b.self_attn.scaling) for b in blocks),
        layer_types=layer_types(model),
        window=sliding_window(model),
        attention=att if attention else None,
    )


def rope_logits(model: Any, ids: list[int]) -> list[torch.Tensor]:
    """Every layer's exact masked attention logits (H, N, N), float64, for one window (module doc)."""
    win = rope_window(model, ids)
    return [win.logits(i) for i in range(win.n_layers)]


def lstsq_map(src: NDArray[np.float64], dst: NDArray[np.float64]) -> tuple[NDArray[np.float64], float]:
    """Least-squares ``M`` with ``dst ≈ src @ Mᵀ`` (rows are samples) and its coefficient of determination."""
    Mt, *_ = np.linalg.lstsq(src, dst, rcond=None)
    res = dst - src @ Mt
    tot = float(((dst - dst.mean(0)) ** 2).sum())
    r2 = 1.0 - float((res**2).sum()) / tot if tot > 0 else float("nan")
    return np.asarray(Mt.T, dtype=np.float64), r2
