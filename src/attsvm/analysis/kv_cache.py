"""KV-cache eviction by attention margins, and the usual rules, as a transformers ``Cache`` (SPEC §7).

A policy decides which cached keys (with their values) to keep once the cache holds more than its
``budget`` of tokens; eviction is per layer and per head, so every head keeps exactly ``budget`` keys.

Policies (each a small class; :func:`make_policy` builds one by name):

* ``"svm"`` — **support-vector margin**: a key's score is the smallest margin
  ``logit_top − logit_t = log p_top − log p_t`` it had over the queries seen since it arrived (SPEC §2:
  keys near the top are the support vectors of the selection); keep the smallest, evict the farthest.
  A recent window (default a quarter of the budget) is protected, since a new key has been scored by
  few queries.
* ``"h2o"`` — heavy hitters (accumulated attention) + a recent window (default half the budget).
* ``"tova"`` — the current query's attention (token omission via attention).
* ``"streaming"`` — attention sinks (default 4 first tokens) + the most recent tokens (StreamingLLM).
* ``"recent"`` — the most recent tokens only.
* ``"random"`` — uniformly at random (seeded ``torch.Generator``).

How the policies see attention: :class:`EvictionCache` registers a forward hook on each attention
module of the model; with ``attn_implementation="eager"`` those modules return their probabilities
``(B, H, q, S+q)``, the hook hands them to the layer's cache, which updates the policy's statistics
and then evicts down to the budget. So at every step the new queries attend to ``budget`` old keys
plus the new ones, and between steps every layer and head holds exactly ``budget`` keys. Margins
need no raw logits: softmax is shift-invariant, so ``logit_top − logit_t = log p_top − log p_t``.

Speed: in the steady state of one-token decoding (every layer full, one key in, one key out) the layers
are fused (``fuse_layers=True``, the default): their (budget + 1) buffers are stacked, each hook only hands
over its probabilities, and after the last layer one eviction step runs for all layers together — the
same rule, victims and slot layout as per-layer eviction (the tests compare them bit for bit; the
random policy follows the same rule but draws for all layers at once, so its victims differ), at a
fraction of the per-operation overhead that dominates on small models. Custom policies keep their
``(B, H, ...)`` contract (the layer axis is folded into the batch axis for them). Any other step (several new
tokens, beam reordering, a pass that stopped part-way) falls back to the per-layer code.

Positions: ``get_seq_length`` reports the number of tokens *seen* (so position ids stay right), and
``get_mask_sizes`` places the stored keys just before the new queries, so the causal mask lets every
new query see every stored key (all are in its past) and the new keys causally. Padding masks are
not supported after an eviction (the stored keys no longer line up with mask columns): use batches
without padding, as :mod:`attsvm.analysis.kv_bench` does.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, ClassVar, Literal

import torch

from .._validation import check_choice, check_positive_int

try:  # transformers is an optional dependency (the [models] extra)
    from transformers.cache_utils import Cache, CacheLayerMixin
except ImportError as exc:  # pragma: no cover
    raise ImportError("attsvm.analysis.kv_cache needs transformers (pip install 'attsvm[models]')") from exc

__all__ = ["EvictionPolicy", "SVMarginPolicy", "H2OPolicy", "TOVAPolicy", "StreamingPolicy", "RecentPolicy",
           "RandomPolicy", "POLICIES", "PolicyName", "make_policy", "EvictionLayer", "EvictionCache",
           "attention_modules"]

PolicyName = Literal["svm", "h2o", "tova", "streaming", "recent", "random"]
POLICIES: tuple[str, ...] = ("svm", "h2o", "tova", "streaming", "recent", "random")

class EvictionPolicy:
    """The interface: statistics per cached key, and a priority (higher = keep).

    ``sinks`` (number of first tokens) and ``recent`` (number of last tokens, or a fraction of the
    budget if a float in (0, 1]) are protected: never evicted. Subclasses set ``name``,
    ``needs_scores`` and implement :meth:`accumulate` / :meth:`priority`.
    """

    name: ClassVar[str] = "base"
    needs_scores: ClassVar[bool] = True
    priority_is_negated_stats: ClassVar[bool] = False  # priority(stats, ·) == -stats (lets eviction skip a negation)
    fresh: ClassVar[float] = 0.0  # a new key's statistic before any query saw it (see update_)

    def __init__(self, *, sinks: int = 0, recent: int | float = 0) -> None:
        self.sinks = check_positive_int(sinks, "sinks", minimum=0)
        if isinstance(recent, bool) or not isinstance(recent, (int, float)):
            raise TypeError(f"recent must be an int (tokens) or a float in [0, 1] (share of the budget), got {recent!r}")
        if isinstance(recent, float) and not 0.0 <= recent <= 1.0:
            raise ValueError(f"recent as a share of the budget must be in [0, 1], got {recent}")
        if isinstance(recent, int) and recent < 0:
            raise ValueError(f"recent must be >= 0, got {recent}")
        self.recent = recent

    def protected(self, budget: int) -> tuple[int, int]:
        """``(n_sinks, n_recent)`` protected at this budget; together at most ``budget``."""
        n_sinks = min(self.sinks, budget)
        n_recent = int(math.floor(self.recent * budget)) if isinstance(self.recent, float) else self.recent
        return n_sinks, max(0, min(n_recent, budget - n_sinks))

    def accumulate(self, stats: torch.Tensor | None, probs: torch.Tensor) -> torch.Tensor | None:
        """New statistics (B, H, S+q) from the old ones (B, H, S) and this step's probabilities (B, H, q, S+q)."""
        return None

    def update_(self, stats: torch.Tensor, p: torch.Tensor) -> None:
        """In place, for one query: ``stats`` (..., S+1) of the stored keys and, in the last slot, the new key
        (holding :attr:`fresh`); ``p`` (..., S+1) the query's probabilities. Must equal :meth:`accumulate`
        (the default calls it); subclasses override it with cheaper in-place arithmetic."""
        stats.copy_(self.accumulate(stats[..., :-1], p.unsqueeze(-2)))

    def priority(self, stats: torch.Tensor | None, positions: torch.Tensor) -> torch.Tensor:
        """Keep-priority (..., S) of the stored keys (higher = keep); ``positions`` (..., S) absolute."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sinks={self.sinks}, recent={self.recent})"


def _pad(stats: torch.Tensor | None, like: torch.Tensor, fill: float) -> torch.Tensor:
    """Old statistics (B, H, S) extended with ``fill`` for the q new keys to shape (B, H, S+q)."""
    B, H, _, n = like.shape
    if stats is None:
        return torch.full((B, H, n), fill, dtype=like.dtype, device=like.device)
    return torch.nn.functional.pad(stats.to(like.dtype), (0, n - stats.shape[-1]), value=fill)


class SVMarginPolicy(EvictionPolicy):
    """Support-vector margin: keep keys whose margin ``log p_top − log p_t`` stayed small (SPEC §2, §7)."""

    name = "svm"
    priority_is_negated_stats = True
    fresh = math.inf

    def __init__(self, *, sinks: int = 0, recent: int | float = 0.25) -> None:
        super().__init__(sinks=sinks, recent=recent)

    def accumulate(self, stats: torch.Tensor | None, probs: torch.Tensor) -> torch.Tensor:
        if probs.shape[-2] == 1:                                      # one query sees every key
            logp = probs[..., 0, :].log()                             # (B, H, S+1); p = 0 → −inf
            margin = logp.amax(-1, keepdim=True) - logp               # an underflowed key: margin +inf
            if stats is not None:                                     # new key: its first margin
                old = margin[..., :stats.shape[-1]]
                torch.minimum(old, stats, out=old)
            return margin
        logp = probs.log()                                            # (B, H, q, S+q); p = 0 → −inf
        margin = logp.amax(-1, keepdim=True) - logp                   # an underflowed key: margin +inf
        margin = margin.masked_fill(probs <= 0, math.inf)             # a masked key: no margin from it
        return torch.minimum(_pad(stats, probs, math.inf), margin.min(dim=-2).values)

    def update_(self, stats: torch.Tensor, p: torch.Tensor) -> None:
        logp = p.log()
        torch.sub(logp.amax(-1, keepdim=True), logp, out=logp)       # margins; p = 0 → +inf
        torch.minimum(stats, logp, out=stats)                          # the new key: min(+inf, margin)

    def priority(self, stats: torch.Tensor | None, positions: torch.Tensor) -> torch.Tensor:
        assert stats is not None
        return -stats


class H2OPolicy(EvictionPolicy):
    """Heavy hitters: accumulated attention over the queries seen, plus a recent window (H2O)."""

    name = "h2o"

    def __init__(self, *, sinks: int = 0, recent: int | float = 0.5) -> None:
        super().__init__(sinks=sinks, recent=recent)

    def accumulate(self, stats: torch.Tensor | None, probs: torch.Tensor) -> torch.Tensor:
        total = probs.sum(dim=-2)                                     # (B, H, S+q), a new tensor
        if stats is not None:
            total[..., :stats.shape[-1]].add_(stats)
        return total

    def update_(self, stats: torch.Tensor, p: torch.Tensor) -> None:
        stats.add_(p)                                                  # the new key: 0 + p

    def priority(self, stats: torch.Tensor | None, positions: torch.Tensor) -> torch.Tensor:
        assert stats is not None
        return stats


class TOVAPolicy(EvictionPolicy):
    """Token omission via attention: the current (last) query's attention decides."""

    name = "tova"

    def accumulate(self, stats: torch.Tensor | None, probs: torch.Tensor) -> torch.Tensor:
        return probs[..., -1, :]

    def update_(self, stats: torch.Tensor, p: torch.Tensor) -> None:
        stats.copy_(p)

    def priority(self, stats: torch.Tensor | None, positions: torch.Tensor) -> torch.Tensor:
        assert stats is not None
        return stats


class RecentPolicy(EvictionPolicy):
    """The most recent tokens only (a sliding window)."""

    name = "recent"
    needs_scores = False

    def priority(self, stats: torch.Tensor | None, positions: torch.Tensor) -> torch.Tensor:
        return positions.to(torch.float64)


class StreamingPolicy(RecentPolicy):
    """Attention sinks (the first tokens) + the most recent tokens (StreamingLLM)."""

    name = "streaming"

    def __init__(self, *, sinks: int = 4, recent: int | float = 0) -> None:
        super().__init__(sinks=sinks, recent=recent)


class RandomPolicy(EvictionPolicy):
    """Evict uniformly at random; seeded (``seed``) so runs repeat."""

    name = "random"
    needs_scores = False

    def __init__(self, *, seed: int = 0, sinks: int = 0, recent: int | float = 0) -> None:
        super().__init__(sinks=sinks, recent=recent)
        self.seed = check_positive_int(seed, "seed", minimum=0)
        self._gen = torch.Generator().manual_seed(self.seed)

    def priority(self, stats: torch.Tensor | None, positions: torch.Tensor) -> torch.Tensor:
        return torch.rand(positions.shape, generator=self._gen, dtype=torch.float64).to(positions.device)


_CLASSES: dict[str, type[EvictionPolicy]] = {c.name: c for c in (SVMarginPolicy, H2OPolicy, TOVAPolicy,
                                                                   StreamingPolicy, RecentPolicy, RandomPolicy)}


def make_policy(name: PolicyName, **kwargs: Any) -> EvictionPolicy:
    """Build a policy by name (one of :data:`POLICIES`); keyword arguments go to its constructor."""
    check_choice(name, "policy", POLICIES)
    return _CLASSES[name](**kwargs)


def select_keep(policy: EvictionPolicy, stats: torch.Tensor | None, positions: torch.Tensor, budget: int,
                n_seen: int) -> torch.Tensor:
    """Indices (B, H, budget), ascending, of the stored keys to keep (protected ones first, then priority)."""
    pri = policy.priority(stats, positions).to(torch.float64)
    n_sinks, n_recent = policy.protected(budget)
    protect = (positions < n_sinks) | (positions >= n_seen - n_recent)
    pri = pri.masked_fill(protect, math.inf)
    return torch.topk(pri, budget, dim=-1, sorted=False).indices.sort(dim=-1).values


class EvictionLayer(CacheLayerMixin):
    """One layer's cache: keys/values (B, H, S, d_head), their absolute positions and policy statistics."""

    is_compileable = False
    is_sliding = False
    is_croppable = False

    def __init__(self, policy: EvictionPolicy, budget: int) -> None:
        super().__init__()
        self.policy = policy
        self.budget = check_positive_int(budget, "budget")
        self.positions: torch.Tensor | None = None
        self.stats: torch.Tensor | None = None
        self.cumulative_length = 0
        self.pending = 0
        self.n_evicted = 0
        self._kbuf: torch.Tensor | None = None  # (B, H, budget + 1, d_head) once the cache is full
        self._vbuf: torch.Tensor | None = None
        self._pbuf: torch.Tensor | None = None
        self._views: tuple[torch.Tensor, ...] | None = None  # (buffer, its last slots, its first budget slots)
        self._protected: tuple[int, int] | None = None  # the policy's (n_sinks, n_recent) at this budget
        self._group: _FusedLayers | None = None  # set while every layer's steady state is fused (speed only)
        self._gi = 0                              # this layer's index in the group
        self._hold = 0                            # > 0: do not fuse for that many more steps (see reorder_cache)

    def _join(self, group: _FusedLayers, i: int) -> None:
        """Use layer ``i`` of the group's stacked buffers as this layer's (budget + 1) buffers."""
        K, V, P = group.K[i], group.V[i], group.P[i]
        self._kbuf, self._vbuf, self._pbuf = K, V, P
        self._views = (K, K[:, :, -1:], V[:, :, -1:], P[:, :, -1:], K[:, :, :-1], V[:, :, :-1], P[:, :, :-1])
        self.keys, self.values, self.positions = self._views[4:]
        if group.S is not None:
            self.stats = group.S[i][..., :-1]
        self._group, self._gi = group, i

    def _leave_group(self) -> None:
        if self._group is not None:
            self._group.dissolve()

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        B, H, _, D = key_states.shape
        self.device = key_states.device
        self.keys = key_states.new_zeros((B, H, 0, D))
        self.values = value_states.new_zeros((B, H, 0, value_states.shape[-1]))
        self.positions = torch.zeros((B, H, 0), dtype=torch.long, device=self.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self._group is not None and (self._group.observed[self._gi] or self.pending):
            self._group.dissolve()  # the last pass stopped part-way: finish it per layer
        if self.pending:  # the previous step was never observed (no hook, or no probabilities)
            if self.policy.needs_scores:
                raise RuntimeError(
                    f"the {self.policy.name!r} policy never saw the attention probabilities of the last step: "
                    "build the cache with EvictionCache(model, ...) on a model loaded with "
                    "attn_implementation='eager'")
            self.observe(None)
        B, H, q, _ = key_states.shape
        S = self.keys.shape[-2]
        if q == 1 and self._kbuf is not None and S == self.budget:
            # steady state: write the new token into the spare slot of the (budget + 1) buffers, no copy
            _, k_last, v_last, p_last, *_ = self._views
            k_last.copy_(key_states)
            v_last.copy_(value_states)
            if self._group is None:  # fused layers write all positions at once in their eviction step
                p_last.fill_(self.cumulative_length)
            self.keys, self.values, self.positions = self._kbuf, self._vbuf, self._pbuf
        else:
            self._leave_group()
            new_pos = torch.arange(self.cumulative_length, self.cumulative_length + q, device=self.device)
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
            self.positions = torch.cat([self.positions, new_pos.expand(B, H, q)], dim=-1)
            self._kbuf = self._vbuf = self._pbuf = None
        self.cumulative_length += q
        self.pending = q
        if self._hold:
            self._hold -= 1
        return self.keys, self.values

    def observe(self, probs: torch.Tensor | None) -> None:
        """Update the policy statistics with this step's probabilities (B, H, q, S+q), then evict to the budget."""
        if self.policy.needs_scores:
            if probs is None:
                raise RuntimeError(f"the {self.policy.name!r} policy needs attention probabilities: load the model "
                                   "with attn_implementation='eager'")
            self.stats = self.policy.accumulate(self.stats, probs.detach() if probs.requires_grad else probs)
        self.pending = 0
        assert self.keys is not None and self.values is not None and self.positions is not None
        S = self.keys.shape[-2]
        excess = S - self.budget
        if excess <= 0:
            return
        self.n_evicted += excess
        if excess == 1:
            # one key too many: overwrite the victim slot with the newest (last) slot and drop the last;
            # the tensors of size budget + 1 become the buffers the next step writes into
            # evict the lowest priority; when priority is −stats, the highest statistic (skips a negation)
            neg = self.policy.priority_is_negated_stats
            score = self.stats if neg else self.policy.priority(self.stats, self.positions)
            fill = -math.inf if neg else math.inf
            if self._protected is None:  # the policy and budget are fixed: compute once
                self._protected = self.policy.protected(self.budget)
            n_sinks, n_recent = self._protected
            if n_sinks:
                score = score.masked_fill(self.positions < n_sinks, fill)
            if n_recent:
                score = score.masked_fill(self.positions >= self.cumulative_length - n_recent, fill)
            victim = (score.argmax if neg else score.argmin)(dim=-1, keepdim=True)          # (B, H, 1)
            if self._views is None or self._views[0] is not self.keys:  # views of the buffers, made once
                k, v, p = self.keys, self.values, self.positions
                self._views = (k, k[:, :, -1:], v[:, :, -1:], p[:, :, -1:], k[:, :, :-1], v[:, :, :-1], p[:, :, :-1])
            _, k_last, v_last, p_last, k_head, v_head, p_head = self._views
            vidx = victim[..., None]
            self.keys.scatter_(2, vidx.expand(-1, -1, -1, k_last.shape[-1]), k_last)
            self.values.scatter_(2, vidx.expand(-1, -1, -1, v_last.shape[-1]), v_last)
            self.positions.scatter_(2, victim, p_last)
            self._kbuf, self._vbuf, self._pbuf = self.keys, self.values, self.positions
            self.keys, self.values, self.positions = k_head, v_head, p_head
            if self.stats is not None:
                self.stats = self.stats.scatter(2, victim, self.stats[:, :, -1:])[:, :, :-1]
            return
        keep = select_keep(self.policy, self.stats, self.positions, self.budget, self.cumulative_length)
        idx = keep[..., None]
        self.keys = self.keys.gather(2, idx.expand(-1, -1, -1, self.keys.shape[-1]))
        self.values = self.values.gather(2, idx.expand(-1, -1, -1, self.values.shape[-1]))
        self.positions = self.positions.gather(2, keep)
        if self.stats is not None:
            self.stats = self.stats.gather(2, keep)
        self._kbuf = self._vbuf = self._pbuf = None

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        stored = 0 if self.keys is None else self.keys.shape[-2]
        return stored + query_length, self.cumulative_length - stored

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self._leave_group()
        self.keys = self.values = self.positions = self.stats = None
        self._kbuf = self._vbuf = self._pbuf = self._views = None
        self.is_initialized = False
        self.cumulative_length = self.pending = self.n_evicted = 0

    def _map_batch(self, fn: Any) -> None:
        """Apply ``fn`` to the batch axis of every stored tensor (beam reordering, batch expansion/selection)."""
        self._leave_group()
        self._hold = 2  # decoding steps before the layers may fuse again (beam search reorders every step)
        self._kbuf = self._vbuf = self._pbuf = None
        if self.is_initialized:
            for name in ("keys", "values", "positions", "stats"):
                t = getattr(self, name)
                if t is not None:
                    setattr(self, name, fn(t))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map_batch(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map_batch(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map_batch(lambda t: t[indices])

    def crop(self, tokens_to_remove: int) -> None:  # pragma: no cover - assisted decoding only
        raise NotImplementedError("an evicting cache cannot be cropped (the evicted keys are gone)")


class _FusedLayers:
    """Every layer's steady-state (budget + 1) buffers stacked along a leading layer axis (speed only).

    In the steady state of one-token decoding each layer holds ``budget`` keys plus the newest one and evicts
    exactly one per step. With the layers fused, each layer's hook only hands over its probabilities (stacked
    into one buffer); after the last layer has run, one eviction step (statistics, protection, victim, the move of the
    newest key into the victim's slot) serves all layers at once: a dozen tensor operations per decoding step
    instead of a dozen per layer, which is what the policies cost on small models (per-operation overhead, not
    arithmetic). The rule, the statistics, the victims and the slot layout are exactly the per-layer ones.
    Any other step (several tokens, beam reordering, reset) dissolves the group back into per-layer state.
    """

    def __init__(self, layers: list[EvictionLayer]) -> None:
        self.layers = layers
        self.policy = policy = layers[0].policy
        self.K = torch.stack([layer._kbuf for layer in layers])   # (L, B, H, budget + 1, d_head)
        self.V = torch.stack([layer._vbuf for layer in layers])
        self.P = torch.stack([layer._pbuf for layer in layers])   # (L, B, H, budget + 1)
        self.S: torch.Tensor | None = None
        self.probs: torch.Tensor | None = None
        if policy.needs_scores:
            stats = torch.stack([layer.stats for layer in layers])  # (L, B, H, budget)
            self.S = torch.nn.functional.pad(stats, (0, 1), value=policy.fresh)
            self.probs = self.S.new_empty((*self.S.shape[:-1], 1, self.S.shape[-1]))  # (L, B, H, 1, budget + 1)
            self._p = self.probs[..., 0, :]
        self._probs_in: list[torch.Tensor | None] = [None] * len(layers)  # this step's, per layer
        self.victim = torch.empty((*self.P.shape[:-1], 1), dtype=torch.long, device=self.P.device)
        self.protected = policy.protected(layers[0].budget)
        # a subclass's in-place update_ is used only when it was written for its own accumulate (defined by
        # the same class or a subclass of the one defining accumulate); otherwise accumulate decides
        definer = {name: next(c for c in type(policy).__mro__ if name in c.__dict__) for name in ("update_", "accumulate")}
        self._own_update = definer["update_"] is not EvictionPolicy and issubclass(definer["update_"],
                                                                                   definer["accumulate"])
        self._bufs = self._buffers(self.K, self.V, self.P, self.S, self.victim)
        self.observed = [False] * len(layers)
        self.n_observed = 0
        self.n_steps = 0  # fused eviction steps run
        for i, layer in enumerate(layers):
            layer._join(self, i)

    @staticmethod
    def _buffers(K: torch.Tensor, V: torch.Tensor, P: torch.Tensor, S: torch.Tensor | None, victim: torch.Tensor
                 ) -> tuple[Any, ...]:
        """The views one eviction step needs, made once: victim indices expanded to K and V, the newest slots."""
        return (K, V, P, S, victim, victim.unsqueeze(-1).expand(*victim.shape, K.shape[-1]),
                victim.unsqueeze(-1).expand(*victim.shape, V.shape[-1]), K[..., -1:, :], V[..., -1:, :],
                P[..., -1:], None if S is None else S[..., -1:])

    def observe(self, i: int, probs: torch.Tensor | None) -> None:
        """Layer ``i``'s hook: keep its probabilities; after the last layer, evict in every layer."""
        layer = self.layers[i]
        if self.observed[i] or (self.probs is not None and probs is None):
            self.dissolve()   # not the steady one-token step: the per-layer code handles (or reports) it
            layer.observe(probs)
            return
        if self.probs is not None:
            assert probs is not None
            self._probs_in[i] = probs.detach() if probs.requires_grad else probs
        layer.pending = 0
        layer.n_evicted += 1
        v = layer._views
        layer.keys, layer.values, layer.positions = v[4], v[5], v[6]   # budget keys once the step has run
        self.observed[i] = True
        self.n_observed += 1
        if self.n_observed == len(self.layers):
            self.n_steps += 1
            if self.probs is not None:
                torch.stack(self._probs_in, out=self.probs)  # type: ignore[arg-type]
            self._evict(None if self.probs is None else self._p, self.layers[0].cumulative_length, self._bufs)
            self.observed = [False] * len(self.layers)
            self.n_observed = 0

    def _evict(self, probs: torch.Tensor | None, n_seen: int, bufs: tuple[Any, ...]) -> None:
        """Update the statistics, pick the victim per (layer,) batch row and head, move the newest key there."""
        K, V, P, S, victim, vk, vv, k_last, v_last, p_last, s_last = bufs
        pol = self.policy
        p_last.fill_(n_seen - 1)                                        # the newest key's position
        if S is not None:
            if self._own_update:
                pol.update_(S, probs)
            else:  # accumulate's (B, H, q, S+q) contract: fold the layer axis into the batch axis
                S2 = S.view(-1, *S.shape[-2:])
                S2.copy_(pol.accumulate(S2[..., :-1], probs.reshape(-1, *probs.shape[-2:]).unsqueeze(-2)))
        neg = pol.priority_is_negated_stats
        if neg:
            score = S
        else:  # priority's (B, H, S) contract, as for accumulate
            score = pol.priority(None if S is None else S.view(-1, *S.shape[-2:]), P.view(-1, *P.shape[-2:]))
            score = score.view(P.shape)
        fill = -math.inf if neg else math.inf
        n_sinks, n_recent = self.protected
        if n_sinks:
            score = score.masked_fill(P < n_sinks, fill)
        if n_recent:
            score = score.masked_fill(P >= n_seen - n_recent, fill)
        (torch.argmax if neg else torch.argmin)(score, dim=-1, keepdim=True, out=victim)
        K.scatter_(-2, vk, k_last)
        V.scatter_(-2, vv, v_last)
        P.scatter_(-1, victim, p_last)
        if S is not None:
            S.scatter_(-1, victim, s_last)
            s_last.fill_(pol.fresh)

    def dissolve(self) -> None:
        """Back to per-layer state (finishing the step for layers already observed, if a pass stopped part-way)."""
        for i, done in enumerate(self.observed):
            if done:
                S = None if self.S is None else self.S[i]
                victim = torch.empty_like(self.victim[i])
                bufs = self._buffers(self.K[i], self.V[i], self.P[i], S, victim)
                probs = self._probs_in[i]
                self._evict(None if probs is None else probs[..., 0, :], self.layers[i].cumulative_length, bufs)
            elif self.layers[i].pending:  # stored but not yet seen by its attention: its position is still unset
                layer = self.layers[i]
                layer._views[3].fill_(layer.cumulative_length - 1)
        self.observed = [False] * len(self.layers)
        self.n_observed = 0
        self._probs_in = [None] * len(self.layers)
        for layer in self.layers:
            layer._group = None


def attention_modules(model: Any) -> dict[int, Any]:
    """The self-attention modules of a model by ``layer_idx`` (those that call ``Cache.update``)."""
    found: dict[int, Any] = {}
    for mod in model.modules():
        idx = getattr(mod, "layer_idx", None)
        if (isinstance(idx, int) and type(mod).__name__.endswith("Attention")
                and not getattr(mod, "is_cross_attention", False)):
            if idx in found:
                raise ValueError(f"model has two attention modules with layer_idx={idx}; cannot attach the cache")
            found[idx] = mod
    if not found:
        raise ValueError(f"found no attention modules with a layer_idx in {type(model).__name__}")
    return found


class EvictionCache(Cache):
    """A transformers ``Cache`` that evicts keys by ``policy`` to keep ``budget`` tokens per layer and head.

    Use as ``model.generate(ids, past_key_values=EvictionCache(model, "h2o", budget=64))`` or in a
    manual decoding loop. Score-based policies need the model loaded with ``attn_implementation="eager"``.
    The hooks stay on the model until :meth:`close` (or the ``with`` block ends); a hook whose cache was
    garbage-collected, or that fires for another cache, does nothing. ``fuse_layers=False`` keeps every
    eviction in its layer's hook (slower; the same results, see the module notes).
    """

    def __init__(self, model: Any, policy: EvictionPolicy | PolicyName, budget: int, *, fuse_layers: bool = True,
                 **policy_kwargs: Any) -> None:
        if isinstance(policy, str):
            policy = make_policy(policy, **policy_kwargs)  # type: ignore[arg-type]
        elif not isinstance(policy, EvictionPolicy):
            raise TypeError(f"policy must be an EvictionPolicy or one of {POLICIES}, got {type(policy).__name__}")
        elif policy_kwargs:
            raise TypeError("policy keyword arguments are only accepted with a policy name")
        budget = check_positive_int(budget, "budget")
        impl = getattr(model.config, "_attn_implementation", None)
        if policy.needs_scores and impl != "eager":
            raise ValueError(f"policy {policy.name!r} needs attention probabilities: load the model with "
                             f"attn_implementation='eager' (it uses {impl!r})")
        mods = attention_modules(model)
        n_layers = max(mods) + 1
        super().__init__(layers=[EvictionLayer(policy, budget) for _ in range(n_layers)])
        self.policy = policy
        self.budget = budget
        if not isinstance(fuse_layers, bool):
            raise TypeError(f"fuse_layers must be a bool, got {fuse_layers!r}")
        self._can_fuse = fuse_layers
        self._group: _FusedLayers | None = None   # the live group, if any (see _FusedLayers)
        self._fused_steps_done = 0                # steps of the groups before it
        ref = weakref.ref(self)

        def hook(mod: Any, args: Any, output: Any) -> None:
            cache = ref()
            if cache is None:
                return
            layer = cache.layers[mod.layer_idx]
            if not layer.pending:
                return
            probs = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if layer._group is not None:
                layer._group.observe(layer._gi, probs)
                return
            layer.observe(probs)
            if cache._can_fuse and layer._kbuf is not None:
                cache._try_fuse()

        self._handles = [m.register_forward_hook(hook) for m in mods.values()]

    def _try_fuse(self) -> None:
        """Fuse the layers once all are in the steady one-token state with alike buffers (see _FusedLayers)."""
        layers = self.layers
        if any(la._kbuf is None or la.pending or la._group is not None or la._hold for la in layers):
            return
        a = layers[0]
        alike = all(la._kbuf.shape == a._kbuf.shape and la._vbuf.shape == a._vbuf.shape
                    and la._kbuf.dtype == a._kbuf.dtype and la._kbuf.device == a._kbuf.device
                    and la.cumulative_length == a.cumulative_length
                    and (la.stats is None) == (a.stats is None)
                    and (la.stats is None or (la.stats.shape == a.stats.shape and la.stats.dtype == a.stats.dtype))
                    for la in layers)
        if alike:
            if self._group is not None:  # dissolved: keep its count, drop its buffers
                self._fused_steps_done += self._group.n_steps
            self._group = _FusedLayers(list(layers))  # type: ignore[arg-type]
        elif any(la._kbuf.shape != a._kbuf.shape or la._vbuf.shape != a._vbuf.shape for la in layers):
            self._can_fuse = False  # e.g. layers with different head counts: stay per layer for good

    @property
    def n_fused_steps(self) -> int:
        """Decoding steps whose eviction ran fused over all layers (the fast path; see the module notes)."""
        return self._fused_steps_done + (0 if self._group is None else self._group.n_steps)

    @property
    def n_evicted(self) -> int:
        """Keys evicted so far, summed over layers (per batch row and head)."""
        return sum(layer.n_evicted for layer in self.layers)

    def stored_length(self, layer_idx: int = 0) -> int:
        """Keys currently stored by a layer (≤ budget between steps)."""
        keys = self.layers[layer_idx].keys
        return 0 if keys is None else int(keys.shape[-2])

    def close(self) -> None:
        """Remove the hooks from the model."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def __enter__(self) -> EvictionCache:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
