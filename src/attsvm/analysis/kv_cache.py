"""KV-cache eviction by attention margins, and the usual rules, as a transformers ``Cache`` (docs/spec.md §7).

A policy scores the cached keys (with their values); once a layer holds more than its ``budget`` of tokens the
cache evicts the lowest-priority ones, per layer and per **KV head**, so every KV head keeps exactly ``budget``
keys. Policies only score; protection (sinks, recent window) and the choice of the victim are one rule of the
cache (:func:`eviction_scores`). The policies and that rule live in :mod:`attsvm.analysis.kv_scores`, which the
kvpress presses of :mod:`attsvm.integrations.kvpress` share (re-exported here).

Policies (each a small class; :func:`make_policy` builds one by name):

* ``"svm_margin"`` (also spelt ``"svm"``) — **support-vector margin**: a key's score is the smallest margin
  ``logit_top − logit_t = log p_top − log p_t`` it had over the queries seen since it arrived (docs/spec.md §2:
  keys near the top are the support vectors of the selection); keep the smallest, evict the farthest.
  A recent window (default a quarter of the budget) is protected, since a new key has been scored by
  few queries.
* ``"h2o"`` — heavy hitters (accumulated attention) + a recent window (default half the budget).
* ``"tova"`` — the current query's attention (token omission via attention).
* ``"streaming"`` — attention sinks (default 4 first tokens) + the most recent tokens (StreamingLLM).
* ``"recent"`` — the most recent tokens only.
* ``"random"`` — uniformly at random (seeded ``torch.Generator``).

Attention layouts. Multi-head (MHA), grouped-query (GQA) and multi-query (MQA) attention are handled alike: the
cache stores keys per KV head, and the ``G = num_attention_heads / num_key_value_heads`` query heads sharing a
KV head (its *group*) all attend to the same keys, so a key stays or goes for the whole group. Statistics are
therefore kept per KV head, reduced over the group as follows (a key is kept if *some* head of the group needs
it, the reading that makes the budget safe for every head):

* ``svm``: the **minimum margin over the group** (and over the queries) — the margin of the head for which the
  key is closest to being selected; the min over queries and heads commute, so this is exact per head.
* ``h2o``: attention **summed over the group** (G × kvpress's group mean: the same ranking).
* ``tova``: the current query's attention **averaged over the group** (as kvpress's TOVA).

With ``G = 1`` (MHA, GPT-2) every rule is the per-head one. Policies see the probabilities of a KV head's
group as rows of one matrix: ``accumulate(stats, probs)`` gets ``stats`` (B, H_kv, S) and ``probs``
(B, H_kv, G·q, S+q) whose row ``g·q + t`` is query ``t`` of the group's head ``g`` (group-major, a free view of
the model's (B, H, q, S+q)). The budget holds per KV head.

How the policies see attention: :class:`EvictionCache` registers a forward hook on each attention
module of the model; with ``attn_implementation="eager"`` those modules return their probabilities
``(B, H, q, S+q)``, the hook hands them to the layer's cache, which updates the policy's statistics
and then evicts down to the budget. So at every step the new queries attend to ``budget`` old keys
plus the new ones, and between steps every layer and KV head holds exactly ``budget`` keys. Margins
need no raw logits: softmax is shift-invariant, so ``logit_top − logit_t = log p_top − log p_t``.

Speed: in the steady state of one-token decoding (every layer full, one key in, one key out) the layers
are fused (``fuse_layers=True``, the default): their (budget + 1)-slot buffers are stacked, each hook only hands
over its probabilities, and after the last layer one eviction step runs for all layers together — the
same rule, victims and slot layout as per-layer eviction (the tests compare them bit for bit; the
random policy follows the same rule but draws for all layers at once, so its victims differ), at a
fraction of the per-operation overhead that dominates on small models. Custom policies keep their
``(B, H, ...)`` contract (the layer axis is folded into the batch axis for them). Any other step (several new
tokens, beam reordering, a pass that stopped part-way) falls back to the per-layer code.

Positions: ``get_seq_length`` reports the number of tokens *seen* (so position ids, and RoPE, stay right; the
stored keys keep the rotation of their own position), and ``get_mask_sizes`` places the stored keys just
before the new queries, so the causal mask lets every new query see every stored key (all are in its past) and
the new keys causally. Padding is refused: once keys are evicted per row and head they no longer line up with
the columns of a padding mask, so a forward pass with an ``attention_mask`` holding zeros raises a
``ValueError`` (decode padded rows one at a time, or batch rows of equal length).

Transformers range: the cache implements the layer interface of transformers 5.2 (``get_max_cache_shape``,
mask sizes from ``cache_position``) and of the newest 5.x (``get_max_length``, mask sizes from the query length).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from .._extras import require
from .._validation import check_bool, check_positive_int
from .kv_scores import (  # noqa: F401  (the scoring core, re-exported: policies, the one eviction rule)
    POLICIES,
    EvictionPolicy,
    H2OPolicy,
    PolicyName,
    RandomPolicy,
    RecentPolicy,
    StreamingPolicy,
    SVMarginPolicy,
    TOVAPolicy,
    _eviction_scores,
    eviction_scores,
    make_policy,
    select_keep,
)

_cache_utils = require("transformers.cache_utils", feature="attsvm.analysis.kv_cache")
Cache, CacheLayerMixin = _cache_utils.Cache, _cache_utils.CacheLayerMixin

__all__ = [  # (the policies and the eviction rule are re-exported from attsvm.analysis.kv_scores)
    "EvictionLayer",
    "EvictionCache",
    "AttentionLayout",
    "attention_layout",
    "attention_modules",
    "cache_kwargs",
    "returned_cache",
]


@dataclass
class SlotBuffers:
    """The steady state's (budget + 1)-slot tensors and their views (made once, reused every step).

    The first ``budget`` slots (``kept_*``) hold the stored keys; the last slot (``new_*``) receives the newest
    key, which the eviction step then moves into the victim's slot.
    """

    keys: torch.Tensor  # (..., H, budget + 1, d_head)
    values: torch.Tensor
    positions: torch.Tensor  # (..., H, budget + 1)

    def __post_init__(self) -> None:
        self.new_key, self.new_value = self.keys[..., -1:, :], self.values[..., -1:, :]
        self.new_position = self.positions[..., -1:]
        self.kept_keys, self.kept_values = self.keys[..., :-1, :], self.values[..., :-1, :]
        self.kept_positions = self.positions[..., :-1]


@dataclass
class EvictionStep:
    """What one steady eviction step needs: the slot buffers, the statistics (with the newest key's slot last)
    and the victim indices with their expansions to the key and value widths (made once)."""

    slots: SlotBuffers
    stats: torch.Tensor | None  # (..., H, budget + 1)
    victim: torch.Tensor  # (..., H, 1) long

    def __post_init__(self) -> None:
        self.victim_k = self.victim.unsqueeze(-1).expand(*self.victim.shape, self.slots.keys.shape[-1])
        self.victim_v = self.victim.unsqueeze(-1).expand(*self.victim.shape, self.slots.values.shape[-1])
        self.new_stat = None if self.stats is None else self.stats[..., -1:]
        # with a single (batch row, head) the newest slot is a dense view of its buffer, and torch refuses a
        # scatter whose source overlaps its destination: copy the source then (otherwise none is needed)
        self.copy_source = self.slots.new_key.is_contiguous() or self.slots.new_position.is_contiguous()
        # the policies' (B, H, S) contract with any leading axes folded into B: views made once
        positions = self.slots.positions
        self.flat_positions = positions.view(-1, *positions.shape[-2:])
        self.flat_stats = None if self.stats is None else self.stats.view(-1, *self.stats.shape[-2:])
        self.flat_victim = self.victim.view(-1, *self.victim.shape[-2:])

    def run(
        self,
        policy: EvictionPolicy,
        probs: torch.Tensor | None,
        n_seen: int,
        protected: tuple[int, int],
        own_update: bool,
    ) -> None:
        """Update the statistics with ``probs`` (..., H, G, budget + 1), pick the victim per row and KV head
        (:func:`eviction_scores`), move the newest key into its slot."""
        s, stats = self.slots, self.stats
        s.new_position.fill_(n_seen - 1)
        if stats is not None:
            assert probs is not None
            if own_update:
                policy.update_(stats, probs)
            else:  # accumulate's (B, H, G·q, S+q) contract: fold leading axes into the batch axis
                flat = self.flat_stats
                assert flat is not None  # a view of stats
                new = policy.accumulate(flat[..., :-1], probs.reshape(-1, *probs.shape[-3:]))
                assert new is not None, "a policy that keeps statistics returns them from accumulate"
                flat.copy_(new)
        self.evict(_eviction_scores(policy, self.flat_stats, self.flat_positions, n_seen, protected))
        if stats is not None:
            assert self.new_stat is not None  # a view of stats
            stats.scatter_(-1, self.victim, self.new_stat.clone() if self.copy_source else self.new_stat)
            self.new_stat.fill_(policy.fresh)

    def evict(self, score: torch.Tensor) -> None:
        """The victim per row and KV head is the highest evict-first ``score`` (its leading axes as the slots' or
        folded into one); the newest key takes its slot."""
        s = self.slots
        torch.argmax(
            score, dim=-1, keepdim=True, out=self.victim if score.dim() == self.victim.dim() else self.flat_victim
        )
        if self.copy_source:
            s.keys.scatter_(-2, self.victim_k, s.new_key.clone())
            s.values.scatter_(-2, self.victim_v, s.new_value.clone())
            s.positions.scatter_(-1, self.victim, s.new_position.clone())
            return
        s.keys.scatter_(-2, self.victim_k, s.new_key)
        s.values.scatter_(-2, self.victim_v, s.new_value)
        s.positions.scatter_(-1, self.victim, s.new_position)


def _own_update(policy: EvictionPolicy) -> bool:
    """Whether ``policy.update_`` was written for its own ``accumulate`` (defined by the same class or a subclass
    of the one defining accumulate); otherwise the fast path calls accumulate."""
    definer = {name: next(c for c in type(policy).__mro__ if name in c.__dict__) for name in ("update_", "accumulate")}
    return definer["update_"] is not EvictionPolicy and issubclass(definer["update_"], definer["accumulate"])


def _query_length(arg: Any) -> int:
    """The number of new queries from ``get_mask_sizes``'s argument: an int (transformers ≥ 5.3) or the
    ``cache_position`` tensor (transformers 5.2)."""
    return int(arg) if isinstance(arg, int) else int(arg.shape[-1])


class EvictionLayer(CacheLayerMixin):  # type: ignore[misc, valid-type]  # transformers' base is imported lazily
    """One layer's cache: keys/values (B, H_kv, S, d_head), their absolute positions and policy statistics."""

    is_compileable = False
    is_sliding = False
    is_croppable = False
    keys: torch.Tensor | None  # (B, H_kv, S, d_head); None until the first update (set by the base class)
    values: torch.Tensor | None

    def __init__(self, policy: EvictionPolicy, budget: int, group_size: int = 1) -> None:
        super().__init__()
        if not isinstance(policy, EvictionPolicy):
            raise TypeError(f"policy must be an EvictionPolicy (make_policy(name)), got {type(policy).__name__}")
        self.policy = policy
        self.budget = check_positive_int(budget, "budget")
        self.group_size = check_positive_int(group_size, "group_size")  # query heads per KV head
        self.protected = policy.protected(self.budget)  # (n_sinks, n_recent): fixed with the policy and budget
        self.positions: torch.Tensor | None = None
        self.stats: torch.Tensor | None = None
        self.cumulative_length = 0
        self.pending = 0  # new tokens stored whose attention has not been observed yet
        self.n_evicted = 0
        self.step: EvictionStep | None = None  # the steady state's buffers, once the layer is full
        self.group: FusedLayers | None = None  # set while every layer's steady state is fused (speed only)
        self.group_index = 0  # this layer's index in the group
        self.hold = 0  # > 0: do not fuse for that many more steps (see _map_batch)
        self.closed = False  # the cache's hooks were removed (EvictionCache.close)

    def join(self, group: FusedLayers, i: int, slots: SlotBuffers, stats: torch.Tensor | None) -> None:
        """Use layer ``i`` of the group's stacked buffers as this layer's slot buffers."""
        self.step = EvictionStep(slots, None if stats is None else stats, group.victim[i])
        self.keys, self.values, self.positions = slots.kept_keys, slots.kept_values, slots.kept_positions
        if stats is not None:
            self.stats = stats[..., :-1]
        self.group, self.group_index = group, i

    def leave_group(self) -> None:
        if self.group is not None:
            self.group.dissolve()

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any) -> None:
        B, H, _, D = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        self.keys = key_states.new_zeros((B, H, 0, D))
        self.values = value_states.new_zeros((B, H, 0, value_states.shape[-1]))
        self.positions = torch.zeros((B, H, 0), dtype=torch.long, device=self.device)
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.closed:
            raise RuntimeError(
                "this EvictionCache is closed (its hooks were removed on close() or at the end of its with-block): "
                "build a new EvictionCache(model, ...) for another forward pass"
            )
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self.keys is not None and self.values is not None and self.positions is not None
        if self.group is not None and (self.group.observed[self.group_index] or self.pending):
            self.group.dissolve()  # the last pass stopped part-way: finish it per layer
        if self.pending:  # the previous step was never observed (no hook, or no probabilities)
            if self.policy.needs_scores:
                raise RuntimeError(
                    f"the {self.policy.name!r} policy never saw the attention probabilities of the last step: "
                    "build the cache with EvictionCache(model, ...) on a model loaded with "
                    "attn_implementation='eager'"
                )
            self.observe(None)
        B, H, q, _ = key_states.shape
        S = self.keys.shape[-2]
        if q == 1 and self.step is not None and S == self.budget:
            # steady state: write the new token into the spare slot of the (budget + 1) buffers, no copy
            slots = self.step.slots
            slots.new_key.copy_(key_states)
            slots.new_value.copy_(value_states)
            if self.group is None:  # fused layers write all positions at once in their eviction step
                slots.new_position.fill_(self.cumulative_length)
            self.keys, self.values, self.positions = slots.keys, slots.values, slots.positions
        else:
            self.leave_group()
            new_pos = torch.arange(self.cumulative_length, self.cumulative_length + q, device=self.device)
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
            self.positions = torch.cat([self.positions, new_pos.expand(B, H, q)], dim=-1)
            self.step = None
        self.cumulative_length += q
        self.pending = q
        if self.hold:
            self.hold -= 1
        return self.keys, self.values

    def group_rows(self, probs: torch.Tensor) -> torch.Tensor:
        """The model's probabilities (B, H_q, q, S+q) as the policies' (B, H_kv, G·q, S+q) (a view)."""
        B, Hq, q, N = probs.shape
        assert self.keys is not None  # probabilities come after an update
        Hkv = self.keys.shape[1]
        if Hq % Hkv:
            raise RuntimeError(f"attention has {Hq} query heads for {Hkv} KV heads: not a whole group per KV head")
        self.group_size = Hq // Hkv  # as observed (the fused step sizes its buffers by it)
        return probs.reshape(B, Hkv, (Hq // Hkv) * q, N)

    def observe(self, probs: torch.Tensor | None) -> None:
        """Update the policy statistics with this step's probabilities (B, H_q, q, S+q), then evict to the budget."""
        if self.policy.needs_scores:
            if probs is None:
                raise RuntimeError(
                    f"the {self.policy.name!r} policy needs attention probabilities: load the model "
                    "with attn_implementation='eager'"
                )
            rows = self.group_rows(probs.detach() if probs.requires_grad else probs)
            self.stats = self.policy.accumulate(self.stats, rows)
        self.pending = 0
        assert self.keys is not None and self.values is not None and self.positions is not None
        excess = self.keys.shape[-2] - self.budget
        if excess <= 0:
            return
        self.n_evicted += excess
        if excess == 1:
            # one key too many: the tensors of size budget + 1 become the slot buffers; the victim's slot takes
            # the newest key and the first budget slots are the stored keys
            if self.step is None or self.step.slots.keys is not self.keys:  # buffers (and views) made once
                self.step = EvictionStep(
                    SlotBuffers(self.keys, self.values, self.positions),
                    None,
                    torch.empty((*self.positions.shape[:-1], 1), dtype=torch.long, device=self.positions.device),
                )
            self._evict_one()
            return
        keep = select_keep(self.policy, self.stats, self.positions, self.budget, self.cumulative_length)
        idx = keep[..., None]
        self.keys = self.keys.gather(2, idx.expand(-1, -1, -1, self.keys.shape[-1]))
        self.values = self.values.gather(2, idx.expand(-1, -1, -1, self.values.shape[-1]))
        self.positions = self.positions.gather(2, keep)
        if self.stats is not None:
            self.stats = self.stats.gather(2, keep)
        self.step = None

    def _evict_one(self) -> None:
        """The per-layer steady step (statistics already updated): pick the victim, move the newest key there.
        The statistics stay per layer (a new tensor per step); the fused step updates them in place."""
        step = self.step
        assert step is not None
        s = step.slots
        step.evict(_eviction_scores(self.policy, self.stats, s.positions, self.cumulative_length, self.protected))
        if self.stats is not None:
            self.stats = self.stats.scatter(2, step.victim, self.stats[..., -1:])[..., :-1]
        self.keys, self.values, self.positions = s.kept_keys, s.kept_values, s.kept_positions

    def get_mask_sizes(self, query_length: Any) -> tuple[int, int]:
        stored = 0 if self.keys is None else self.keys.shape[-2]
        return stored + _query_length(query_length), self.cumulative_length - stored

    def get_seq_length(self, *args: Any) -> int:
        return self.cumulative_length

    def get_max_length(self) -> int:
        return -1

    def get_max_cache_shape(self) -> int:  # transformers 5.2's name of get_max_length
        return -1

    def reset(self) -> None:
        self.leave_group()
        self.keys = self.values = self.positions = self.stats = None
        self.step = None
        self.is_initialized = False
        self.cumulative_length = self.pending = self.n_evicted = 0

    def _map_batch(self, fn: Any) -> None:
        """Apply ``fn`` to the batch axis of every stored tensor (beam reordering, batch expansion/selection)."""
        self.leave_group()
        self.hold = 2  # decoding steps before the layers may fuse again (beam search reorders every step)
        self.step = None
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


class FusedLayers:
    """Every layer's steady-state slot buffers stacked along a leading layer axis (speed only).

    In the steady state of one-token decoding each layer holds ``budget`` keys plus the newest one and evicts
    exactly one per step. With the layers fused, each layer's hook only hands over its probabilities (stacked
    into one buffer); after the last layer has run, one :class:`EvictionStep` (statistics, protection, victim,
    the move of the newest key into the victim's slot) serves all layers at once: a dozen tensor operations per
    decoding step instead of a dozen per layer, which is what the policies cost on small models (per-operation
    overhead, not arithmetic). The rule, the statistics, the victims and the slot layout are exactly the
    per-layer ones. Any other step (several tokens, beam reordering, reset) dissolves the group back into
    per-layer state.
    """

    def __init__(self, layers: list[EvictionLayer]) -> None:
        self.layers = layers
        self.policy = policy = layers[0].policy
        steps = [layer.step for layer in layers if layer.step is not None]
        assert len(steps) == len(layers)
        self.slots = SlotBuffers(
            torch.stack([s.slots.keys for s in steps]),  # (L, B, H, budget + 1, d)
            torch.stack([s.slots.values for s in steps]),
            torch.stack([s.slots.positions for s in steps]),
        )  # (L, B, H, budget + 1)
        self.stats: torch.Tensor | None = None
        self.probs: torch.Tensor | None = None
        L, B, H = self.slots.positions.shape[:3]
        if policy.needs_scores:
            layer_stats = [layer.stats for layer in layers if layer.stats is not None]
            assert len(layer_stats) == len(layers)  # a scoring policy keeps statistics in every layer
            stats = torch.stack(layer_stats)  # (L, B, H, budget)
            self.stats = torch.nn.functional.pad(stats, (0, 1), value=policy.fresh)
            self.probs = self.stats.new_empty((L, B, H, layers[0].group_size, self.stats.shape[-1]))
            self._stacked = self.probs.view(L, B, -1, 1, self.stats.shape[-1])  # the hooks' (B, H_q, 1, S+1)
        self.victim = torch.empty((L, B, H, 1), dtype=torch.long, device=self.slots.positions.device)
        self.step = EvictionStep(self.slots, self.stats, self.victim)
        self.protected = layers[0].protected
        self.own_update = _own_update(policy)
        self._probs_in: list[torch.Tensor | None] = [None] * len(layers)  # this step's, per layer
        self.observed = [False] * len(layers)
        self.n_observed = 0
        self.n_steps = 0  # fused eviction steps run
        for i, layer in enumerate(layers):
            layer.join(
                self,
                i,
                SlotBuffers(self.slots.keys[i], self.slots.values[i], self.slots.positions[i]),
                None if self.stats is None else self.stats[i],
            )

    def observe(self, i: int, probs: torch.Tensor | None) -> None:
        """Layer ``i``'s hook: keep its probabilities; after the last layer, evict in every layer."""
        layer = self.layers[i]
        if self.observed[i] or (self.probs is not None and probs is None):
            self.dissolve()  # not the steady one-token step: the per-layer code handles (or reports) it
            layer.observe(probs)
            return
        if self.probs is not None:
            assert probs is not None
            self._probs_in[i] = probs.detach() if probs.requires_grad else probs
        layer.pending = 0
        layer.n_evicted += 1
        assert layer.step is not None  # a joined layer keeps its step
        layer.keys, layer.values, layer.positions = (
            layer.step.slots.kept_keys,
            layer.step.slots.kept_values,
            layer.step.slots.kept_positions,
        )  # budget keys once the step has run
        self.observed[i] = True
        self.n_observed += 1
        if self.n_observed == len(self.layers):
            self.n_steps += 1
            if self.probs is not None:  # (L, B, H_q, 1, S+1) stacked = (L, B, H_kv, G, S+1)
                torch.stack(self._probs_in, out=self._stacked)  # type: ignore[arg-type]
            self.step.run(self.policy, self.probs, self.layers[0].cumulative_length, self.protected, self.own_update)
            self.observed = [False] * len(self.layers)
            self.n_observed = 0

    def dissolve(self) -> None:
        """Back to per-layer state (finishing the step for layers already observed, if a pass stopped part-way)."""
        for i, done in enumerate(self.observed):
            layer = self.layers[i]
            if done:
                assert layer.step is not None  # a joined layer keeps its step
                step = EvictionStep(
                    layer.step.slots, None if self.stats is None else self.stats[i], torch.empty_like(self.victim[i])
                )
                probs = self._probs_in[i]
                rows = (
                    None
                    if probs is None
                    else probs.view(*step.slots.positions.shape[:2], -1, step.slots.positions.shape[-1])
                )
                step.run(self.policy, rows, layer.cumulative_length, self.protected, self.own_update)
            elif layer.pending:  # stored but not yet seen by its attention: its position is still unset
                assert layer.step is not None
                layer.step.slots.new_position.fill_(layer.cumulative_length - 1)
        self.observed = [False] * len(self.layers)
        self.n_observed = 0
        self._probs_in = [None] * len(self.layers)
        for layer in self.layers:
            layer.group = None


# ---------------------------------------------------------------------------------------- the model side
@dataclass(frozen=True)
class AttentionLayout:
    """A decoder's self-attention layout: ``n_layers`` layers of ``n_heads`` query heads sharing
    ``n_kv_heads`` KV heads (MHA: equal; GQA: a divisor; MQA: 1)."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    sliding_window: int | None = None  # a window every layer applies (Mistral); the budget must fit in it
    # hybrid local/global models (Gemma 2/3): the window of the "sliding_attention" layers, which keep it
    local_window: int | None = None
    layer_types: tuple[str, ...] = ()

    def is_local(self, layer_idx: int) -> bool:
        """Whether layer ``layer_idx`` is a sliding-window layer of a hybrid model (it keeps its window)."""
        return self.local_window is not None and self.layer_types[layer_idx] == "sliding_attention"

    @property
    def group_size(self) -> int:
        return self.n_heads // self.n_kv_heads

    @property
    def kind(self) -> str:
        return "MHA" if self.n_kv_heads == self.n_heads else "MQA" if self.n_kv_heads == 1 else "GQA"


def attention_layout(model: Any) -> AttentionLayout:
    """The model's attention layout, or a ValueError naming what the eviction cache cannot handle.

    Handled: decoder-only models whose layers use full causal self-attention with every KV head serving a
    whole group of query heads (Llama, Qwen2, Mistral, GPT-2, ...), and hybrid models whose other layers are
    sliding-window layers (Gemma 2/3: ``layer_types`` of "full_attention" and "sliding_attention"), where the
    sliding layers keep their window and the global layers evict. Refused, before any generation:
    encoder-decoder models, chunked / linear-attention layers, and head counts that do not divide.
    """
    config = getattr(model, "config", None)
    if config is None:
        raise TypeError(f"model must be a transformers model with a .config, got {type(model).__name__}")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    name = type(model).__name__
    if getattr(text, "is_encoder_decoder", False):
        raise ValueError(f"model {name} is an encoder-decoder: the eviction cache handles decoder-only models")
    n_heads = getattr(text, "num_attention_heads", None)
    n_kv = getattr(text, "num_key_value_heads", None) or n_heads
    n_layers = getattr(text, "num_hidden_layers", None)
    if not (
        isinstance(n_heads, int)
        and n_heads > 0
        and isinstance(n_kv, int)
        and n_kv > 0
        and isinstance(n_layers, int)
        and n_layers > 0
    ):
        raise ValueError(
            f"model {name}: cannot read num_attention_heads / num_key_value_heads / num_hidden_layers "
            "from its config; the eviction cache needs a standard decoder layout"
        )
    if n_heads % n_kv:
        raise ValueError(
            f"model {name} has num_attention_heads={n_heads} not a multiple of "
            f"num_key_value_heads={n_kv}: each KV head must serve a whole group of query heads"
        )
    types = tuple(str(t) for t in (getattr(text, "layer_types", None) or []))
    other = sorted({t for t in types if t not in ("full_attention", "sliding_attention")})
    if other:
        raise ValueError(
            f"model {name} has {', '.join(other)} layers: the eviction cache handles full causal self-attention "
            "and sliding-window layers only (those layers bound their cache by their own rule)"
        )
    window = getattr(text, "sliding_window", None) if getattr(text, "use_sliding_window", True) else None
    window = window if isinstance(window, int) and window > 0 else None
    if window is not None and "sliding_attention" in types and "full_attention" in types:
        if len(types) != n_layers:
            raise ValueError(f"model {name}: layer_types has {len(types)} entries for {n_layers} layers")
        return AttentionLayout(n_layers, n_heads, n_kv, None, window, types)
    return AttentionLayout(n_layers, n_heads, n_kv, window)


def attention_modules(model: Any) -> dict[int, Any]:
    """The self-attention modules of a model by ``layer_idx`` (those that call ``Cache.update``)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (a transformers model), got {type(model).__name__}")
    found: dict[int, Any] = {}
    for mod in model.modules():
        idx = getattr(mod, "layer_idx", None)
        if (
            isinstance(idx, int)
            and type(mod).__name__.endswith("Attention")
            and not getattr(mod, "is_cross_attention", False)
        ):
            if idx in found:
                raise ValueError(f"model has two attention modules with layer_idx={idx}; cannot attach the cache")
            found[idx] = mod
    if not found:
        raise ValueError(f"found no attention modules with a layer_idx in {type(model).__name__}")
    return found


def cache_kwargs(model: Any, cache: Any) -> dict[str, Any]:
    """The keyword that hands ``cache`` to ``model(...)`` / ``model.generate(...)``: ``cache`` from transformers
    5.3 on, ``past_key_values`` before (5.2.x, the kvpress range), where an unknown ``cache=`` is silently ignored."""
    import inspect

    if not callable(getattr(model, "forward", None)):
        raise TypeError(f"model must be a transformers model (with a forward method), got {type(model).__name__}")
    params = inspect.signature(model.forward).parameters
    return {"cache" if "cache" in params else "past_key_values": cache}


def returned_cache(output: Any) -> Any:
    """The cache a forward pass returned: ``output.cache`` (transformers >= 5.3) or ``output.past_key_values``."""
    if not hasattr(output, "get"):
        raise TypeError(f"output must be a model's forward output (a ModelOutput), got {type(output).__name__}")
    found = output.get("cache") if hasattr(output, "get") else None
    return output.get("past_key_values") if found is None and hasattr(output, "get") else found


def _refuse_padding(mask: Any) -> None:
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and not bool(mask.all()):
        raise ValueError(
            "EvictionCache does not support padded batches: attention_mask has zeros (padding). "
            "Evicted keys no longer line up with the mask's columns; decode padded rows one at a "
            "time, or batch rows of equal length"
        )


class EvictionCache(Cache):  # type: ignore[misc, valid-type]  # transformers' Cache is imported lazily
    """A transformers ``Cache`` that evicts keys by ``policy`` to keep ``budget`` tokens per layer and KV head.

    Use as ``model.generate(ids, past_key_values=EvictionCache(model, "h2o", budget=64))`` or in a
    manual decoding loop. Score-based policies need the model loaded with ``attn_implementation="eager"``.
    The hooks stay on the model until :meth:`close` (or the ``with`` block ends); a hook whose cache was
    garbage-collected, or that fires for another cache, does nothing. ``fuse_layers=False`` keeps every
    eviction in its layer's hook (slower; the same results, see the module notes). The model's layout is
    checked here (:func:`attention_layout`), and a padded batch is refused at its first forward pass. On a hybrid
    model (Gemma 2/3) the sliding-window layers keep their window (transformers' own sliding-window cache layer)
    and the global layers evict to ``budget``.
    """

    def __init__(
        self,
        model: Any,
        policy: EvictionPolicy | PolicyName,
        budget: int,
        *,
        fuse_layers: bool = True,
        **policy_kwargs: Any,
    ) -> None:
        if isinstance(policy, str):
            policy = make_policy(policy, **policy_kwargs)
        elif not isinstance(policy, EvictionPolicy):
            raise TypeError(f"policy must be an EvictionPolicy or one of {POLICIES}, got {type(policy).__name__}")
        elif policy_kwargs:
            raise TypeError("policy keyword arguments are only accepted with a policy name")
        budget = check_positive_int(budget, "budget")
        fuse_layers = check_bool(fuse_layers, "fuse_layers")
        self.layout = attention_layout(model)
        if self.layout.sliding_window is not None and budget > self.layout.sliding_window:
            raise ValueError(
                f"budget={budget} exceeds the model's sliding window ({self.layout.sliding_window}): "
                "the window mask would read the stored keys' compacted slots as positions; use "
                "budget <= sliding_window"
            )
        impl = getattr(model.config, "_attn_implementation", None)
        if policy.needs_scores and impl != "eager":
            raise ValueError(
                f"policy {policy.name!r} needs attention probabilities: load the model with "
                f"attn_implementation='eager' (it uses {impl!r})"
            )
        mods = attention_modules(model)
        n_layers = max(mods) + 1
        from transformers.cache_utils import DynamicSlidingWindowLayer

        super().__init__(
            layers=[
                DynamicSlidingWindowLayer(sliding_window=int(self.layout.local_window or 0))  # (keeps its window)
                if i < self.layout.n_layers and self.layout.is_local(i)
                else EvictionLayer(policy, budget, self.layout.group_size)
                for i in range(n_layers)
            ]
        )
        self.policy = policy
        self.budget = budget
        self._can_fuse = fuse_layers
        self._group: FusedLayers | None = None  # the live group, if any (see FusedLayers)
        self._fused_steps_done = 0  # steps of the groups before it
        ref = weakref.ref(self)

        def hook(mod: Any, args: Any, output: Any) -> None:
            cache = ref()
            if cache is None:
                return
            layer = cache.layers[mod.layer_idx]
            if not isinstance(layer, EvictionLayer) or not layer.pending:  # (a hybrid model's sliding layers)
                return
            probs = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if layer.group is not None:
                layer.group.observe(layer.group_index, probs)
                return
            layer.observe(probs)
            if cache._can_fuse and layer.step is not None:
                cache._try_fuse()

        def check_mask(mod: Any, args: Any, kwargs: dict[str, Any]) -> None:
            if ref() is not None:
                _refuse_padding(kwargs.get("attention_mask"))

        self._handles = [m.register_forward_hook(hook) for m in mods.values()]
        base = getattr(model, "base_model", model)  # the decoder stack: reached by model(...) and model.model(...)
        self._handles.append(base.register_forward_pre_hook(check_mask, with_kwargs=True))

    def _try_fuse(self) -> None:
        """Fuse the layers once all are in the steady one-token state with alike buffers (see FusedLayers)."""
        layers: list[Any] = [la for la in self.layers if isinstance(la, EvictionLayer)]
        if any(la.step is None or la.pending or la.group is not None or la.hold for la in layers):
            return
        a = layers[0].step.slots
        ref = layers[0]
        alike = all(
            la.step.slots.keys.shape == a.keys.shape
            and la.step.slots.values.shape == a.values.shape
            and la.step.slots.keys.dtype == a.keys.dtype
            and la.step.slots.keys.device == a.keys.device
            and la.cumulative_length == ref.cumulative_length
            and (la.stats is None) == (ref.stats is None)
            and (la.stats is None or (la.stats.shape == ref.stats.shape and la.stats.dtype == ref.stats.dtype))
            for la in layers
        )
        if alike:
            if self._group is not None:  # dissolved: keep its count, drop its buffers
                self._fused_steps_done += self._group.n_steps
            self._group = FusedLayers(list(layers))
        elif any(
            la.step.slots.keys.shape != a.keys.shape or la.step.slots.values.shape != a.values.shape for la in layers
        ):
            self._can_fuse = False  # e.g. layers with different head counts: stay per layer for good

    @property
    def n_fused_steps(self) -> int:
        """Decoding steps whose eviction ran fused over all layers (the fast path; see the module notes)."""
        return self._fused_steps_done + (0 if self._group is None else self._group.n_steps)

    @property
    def n_evicted(self) -> int:
        """Keys evicted so far, summed over layers (per batch row and KV head)."""
        return sum(layer.n_evicted for layer in self.layers if isinstance(layer, EvictionLayer))

    def stored_length(self, layer_idx: int = 0) -> int:
        """Keys currently stored by a layer (≤ budget between steps)."""
        idx = check_positive_int(layer_idx, "layer_idx", minimum=0)
        if idx >= len(self.layers):
            raise ValueError(f"layer_idx must be in [0, {len(self.layers)}), got {layer_idx}")
        keys = self.layers[idx].keys
        return 0 if keys is None else int(keys.shape[-2])

    def close(self) -> None:
        """Remove the hooks from the model; the cache refuses further forward passes (a named RuntimeError)."""
        for h in self._handles:
            h.remove()
        self._handles = []
        for layer in self.layers:
            if isinstance(layer, EvictionLayer):
                layer.closed = True

    def __enter__(self) -> EvictionCache:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
