"""The scoring core of KV-cache eviction, shared by :class:`~attsvm.analysis.kv_cache.EvictionCache` and the kvpress
presses of :mod:`attsvm.integrations.kvpress` (docs/spec.md §7). Torch only.

* **Policies** score the cached keys per KV head from the attention probabilities of the queries that saw them
  (:class:`EvictionPolicy` and its subclasses; :func:`make_policy` by name). ``accumulate(stats, probs)`` is the
  one update rule: the cache feeds it each decoding step's probabilities, a press feeds it the probabilities of
  its observation window (:func:`window_probs`), and a decoding press carries the statistics of the keys it kept
  into the next compression through it.
* **Protection**: :func:`protected_rank` says which keys are never evicted (the first ``n_sinks`` tokens and the
  last ``n_recent`` of the ``n_seen``) and ranks them among themselves (sinks first, then the recent keys from the
  newest back); the cache masks them (:func:`eviction_scores`), a press raises their scores (:func:`protect`).
* **Budget**: :func:`compute_n_kept` is kvpress's rule for the keys a press keeps at a compression ratio.
* **Support keys**: :func:`svm_support_scores` ranks keys by how many attention SVMs of a window's queries need
  them (docs/spec.md §7), the scores of ``SVMSupportPress``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal, cast

import numpy as np
import torch

from .._validation import check_choice, check_positive_int, check_seed

__all__ = [
    "EvictionPolicy",
    "SVMarginPolicy",
    "H2OPolicy",
    "TOVAPolicy",
    "StreamingPolicy",
    "RecentPolicy",
    "RandomPolicy",
    "POLICIES",
    "POLICY_ALIASES",
    "PolicyName",
    "make_policy",
    "eviction_scores",
    "select_keep",
    "protected_rank",
    "protect",
    "window_probs",
    "window_scores",
    "window_priority",
    "compute_n_kept",
    "check_compression_ratio",
    "check_count",
    "svm_support_scores",
]

PolicyName = Literal["svm_margin", "svm", "h2o", "tova", "streaming", "recent", "random"]
POLICIES: tuple[str, ...] = ("svm_margin", "h2o", "tova", "streaming", "recent", "random")
# other spellings :func:`make_policy` accepts
POLICY_ALIASES: dict[str, str] = {"svm": "svm_margin", "svm-margin": "svm_margin"}


class EvictionPolicy:
    """The interface: statistics per cached key (per KV head), and a priority (higher = keep).

    ``sinks`` (number of first tokens) and ``recent`` (number of last tokens, or a fraction of the
    budget if a float in (0, 1]) are protected: never evicted. Subclasses set ``name``,
    ``needs_scores`` and implement :meth:`accumulate` / :meth:`priority` (see the module notes for the shapes).
    """

    name: ClassVar[str] = "base"
    needs_scores: ClassVar[bool] = True
    fresh: ClassVar[float] = 0.0  # a new key's statistic before any query saw it (see update_)

    def __init__(self, *, sinks: int = 0, recent: int | float = 0) -> None:
        self.sinks = check_positive_int(sinks, "sinks", minimum=0)
        if isinstance(recent, (bool, np.bool_)) or not isinstance(recent, (int, float, np.integer, np.floating)):
            raise TypeError(
                f"recent must be an int (tokens) or a float in [0, 1] (share of the budget), got {recent!r}"
            )
        recent = int(recent) if isinstance(recent, (int, np.integer)) else float(recent)  # (numpy scalars too)
        if isinstance(recent, float) and not 0.0 <= recent <= 1.0:
            raise ValueError(f"recent as a share of the budget must be in [0, 1], got {recent}")
        if isinstance(recent, int) and recent < 0:
            raise ValueError(f"recent must be >= 0, got {recent}")
        self.recent = recent

    def protected(self, budget: int) -> tuple[int, int]:
        """``(n_sinks, n_recent)`` protected at this budget; together at most ``budget``."""
        budget = check_positive_int(budget, "budget")
        n_sinks = min(self.sinks, budget)
        n_recent = math.floor(self.recent * budget) if isinstance(self.recent, float) else self.recent
        return n_sinks, max(0, min(n_recent, budget - n_sinks))

    def accumulate(self, stats: torch.Tensor | None, probs: torch.Tensor) -> torch.Tensor | None:
        """New statistics (B, H, S+q) from the old ones (B, H, S) and this step's probabilities (B, H, G·q, S+q)
        (H: KV heads; the rows are the queries of the KV head's group, group-major). The shapes are checked, not the
        values (probabilities in [0, 1]: checking them would cost a device sync on every decoding step)."""
        return None

    def update_(self, stats: torch.Tensor, p: torch.Tensor) -> None:
        """In place, for one query per head: ``stats`` (..., S+1) of the stored keys and, in the last slot, the
        new key (holding :attr:`fresh`); ``p`` (..., G, S+1) the group's probabilities. Must equal
        :meth:`accumulate` (the default calls it); subclasses override it with cheaper in-place arithmetic."""
        new = self.accumulate(stats[..., :-1], p)
        assert new is not None, "a policy that keeps statistics returns them from accumulate"
        stats.copy_(new)

    def priority(self, stats: torch.Tensor | None, positions: torch.Tensor) -> torch.Tensor:
        """Keep-priority (..., S) of the stored keys (higher = keep); ``positions`` (..., S) absolute."""
        raise NotImplementedError

    def eviction_score(self, stats: torch.Tensor | None, positions: torch.Tensor) -> torch.Tensor:
        """Evict-first score (..., S): ``−priority`` (a policy may return an equivalent tensor more cheaply)."""
        return -self.priority(stats, positions)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sinks={self.sinks}, recent={self.recent})"


def _needs(stats: torch.Tensor | None, policy: EvictionPolicy) -> torch.Tensor:
    """``stats`` of a policy that scores keys by them: a ValueError naming it when there are none."""
    if stats is None:
        raise ValueError(f"stats must be a tensor of the keys' statistics for the {policy.name!r} policy, got None")
    return stats


def _check_accumulate(stats: Any, probs: Any) -> None:
    """The arguments of ``accumulate``: shapes and types only (a check of the values would cost a device sync on
    every decoding step; the probabilities are the model's own)."""
    if not isinstance(probs, torch.Tensor) or probs.dim() < 3:
        raise TypeError(
            f"probs must be a torch.Tensor (B, H, G·q, S+q) of attention probabilities, got {type(probs).__name__}"
            + (f" of shape {tuple(probs.shape)}" if isinstance(probs, torch.Tensor) else "")
        )
    if stats is None:
        return
    if not isinstance(stats, torch.Tensor):
        raise TypeError(f"stats must be a torch.Tensor (B, H, S) or None, got {type(stats).__name__}")
    if stats.shape[:-1] != probs.shape[:-2] or stats.shape[-1] >= probs.shape[-1]:
        raise ValueError(
            "stats (B, H, S) must match probs (B, H, G·q, S+q) with at least one new key: got stats of shape "
            f"{tuple(stats.shape)} and probs of shape {tuple(probs.shape)}"
        )


def _pad(stats: torch.Tensor | None, like: torch.Tensor, fill: float) -> torch.Tensor:
    """Old statistics (B, H, S) extended with ``fill`` for the q new keys to shape (B, H, S+q)."""
    n = like.shape[-1]
    if stats is None:
        return torch.full((*like.shape[:-2], n), fill, dtype=like.dtype, device=like.device)
    return torch.nn.functional.pad(stats.to(like.dtype), (0, n - stats.shape[-1]), value=fill)


class SVMarginPolicy(EvictionPolicy):
    """Support-vector margin: keep keys whose margin ``log p_top − log p_t`` stayed small (docs/spec.md §2, §7).

    Per KV head the statistic is the minimum margin over its group's query heads and over the queries seen.
    """

    name = "svm_margin"
    fresh = math.inf

    def __init__(self, *, sinks: int = 0, recent: int | float = 0.25) -> None:
        super().__init__(sinks=sinks, recent=recent)

    def accumulate(self, stats: torch.Tensor | None, probs: torch.Tensor) -> torch.Tensor:
        _check_accumulate(stats, probs)
        if probs.shape[-2] == 1:  # one query sees every key
            logp = probs[..., 0, :].log()  # (B, H, S+1); p = 0 → −inf
            margin = logp.amax(-1, keepdim=True) - logp  # an underflowed key: margin +inf
            if stats is not None:  # new key: its first margin
                old = margin[..., : stats.shape[-1]]
                torch.minimum(old, stats, out=old)
            return margin
        logp = probs.log()  # (B, H, R, S+q); p = 0 → −inf
        margin = logp.amax(-1, keepdim=True) - logp  # an underflowed key: margin +inf
        margin = margin.masked_fill(probs <= 0, math.inf)  # a masked key: no margin from it
        return torch.minimum(_pad(stats, probs, math.inf), margin.amin(dim=-2))

    def update_(self, stats: torch.Tensor, p: torch.Tensor) -> None:
        logp = p.log()
        torch.sub(logp.amax(-1, keepdim=True), logp, out=logp)  # margins; p = 0 → +inf
        torch.minimum(stats, logp.select(-2, 0) if logp.shape[-2] == 1 else logp.amin(-2), out=stats)

    def priority(self, stats: torch.Tensor | None, positions: torch.Tensor) -> torch.Tensor:
        return -_needs(stats, self)

    def eviction_score(self, stats: torch.Tensor | None, positions: torch.Tensor) -> torch.Tensor:
        return _needs(stats, self)  # the largest margin goes first (no negation on the fast path)


class H2OPolicy(EvictionPolicy):
    """Heavy hitters: attention accumulated over the queries seen (summed over the group), plus a recent window."""

    name = "h2o"

    def __init__(self, *, sinks: int = 0, recent: int | float = 0.5) -> None:
        super().__init__(sinks=sinks, recent=recent)

    def accumulate(self, stats: torch.Tensor | None, probs: torch.Tensor) -> torch.Tensor:
        _check_accumulate(stats, probs)
        total = probs.sum(dim=-2)  # (B, H, S+q), a new tensor
        if stats is not None:
            total[..., : stats.shape[-1]].add_(stats)
        return total

    def update_(self, stats: torch.Tensor, p: torch.Tensor) -> None:
        stats.add_(p.select(-2, 0) if p.shape[-2] == 1 else p.sum(-2))  # the new key: 0 + p

    def priority(self, stats: torch.Tensor | None, positions: torch.Tensor) -> torch.Tensor:
        return _needs(stats, self)


class TOVAPolicy(EvictionPolicy):
    """Token omission via attention: the current (last) query's attention decides (averaged over the group)."""

    name = "tova"

    def accumulate(self, stats: torch.Tensor | None, probs: torch.Tensor) -> torch.Tensor:
        _check_accumulate(stats, probs)
        n_new = probs.shape[-1] - (0 if stats is None else stats.shape[-1])  # q: this step's queries
        rows = probs.unflatten(-2, (probs.shape[-2] // n_new, n_new))  # (B, H, G, q, S+q)
        last = rows[..., -1, :]
        return last[..., 0, :] if last.shape[-2] == 1 else last.mean(-2)

    def update_(self, stats: torch.Tensor, p: torch.Tensor) -> None:
        stats.copy_(p.select(-2, 0) if p.shape[-2] == 1 else p.mean(-2))

    def priority(self, stats: torch.Tensor | None, positions: torch.Tensor) -> torch.Tensor:
        return _needs(stats, self)


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
        self.seed = check_seed(seed)
        self._gen = torch.Generator().manual_seed(self.seed)

    def priority(self, stats: torch.Tensor | None, positions: torch.Tensor) -> torch.Tensor:
        return torch.rand(positions.shape, generator=self._gen, dtype=torch.float64).to(positions.device)


_CLASSES: dict[str, type[EvictionPolicy]] = {
    c.name: c for c in (SVMarginPolicy, H2OPolicy, TOVAPolicy, StreamingPolicy, RecentPolicy, RandomPolicy)
}


def make_policy(name: PolicyName, **kwargs: Any) -> EvictionPolicy:
    """Build a policy by name (one of :data:`POLICIES`, or a spelling of :data:`POLICY_ALIASES`); keyword arguments go
    to its constructor."""
    name = cast(PolicyName, POLICY_ALIASES.get(name, name)) if isinstance(name, str) else name
    check_choice(name, "policy", POLICIES)
    return _CLASSES[name](**kwargs)


# ---------------------------------------------------------------------------------------- the one eviction rule
def eviction_scores(
    policy: EvictionPolicy, stats: torch.Tensor | None, positions: torch.Tensor, n_seen: int, protected: tuple[int, int]
) -> torch.Tensor:
    """Evict-first scores (..., S) of the stored keys: the policy's, with protected keys at −inf.

    ``protected = (n_sinks, n_recent)``: positions below ``n_sinks`` and the last ``n_recent`` of the ``n_seen``
    tokens are never evicted. Every eviction (one victim per step, or many at once) goes through here.
    """
    _check_scoring(policy, stats, positions)
    n_seen = check_positive_int(n_seen, "n_seen", minimum=int(positions.shape[-1]))
    if not (isinstance(protected, (tuple, list)) and len(protected) == 2):
        raise TypeError(f"protected must be a pair (n_sinks, n_recent), got {protected!r}")
    protected = (
        check_positive_int(protected[0], "protected[0] (n_sinks)", minimum=0),
        check_positive_int(protected[1], "protected[1] (n_recent)", minimum=0),
    )
    return _eviction_scores(policy, stats, positions, n_seen, protected)


def _check_scoring(policy: Any, stats: Any, positions: Any) -> None:
    """The policy, statistics and positions of :func:`eviction_scores` and :func:`select_keep`."""
    if not isinstance(policy, EvictionPolicy):
        raise TypeError(f"policy must be an EvictionPolicy, got {type(policy).__name__}")
    if not isinstance(positions, torch.Tensor) or positions.dim() < 1:
        raise TypeError(f"positions must be a torch.Tensor (B, H, S), got {type(positions).__name__}")
    if positions.dtype.is_floating_point or positions.dtype.is_complex or positions.dtype == torch.bool:
        raise TypeError(f"positions must be an integer tensor (token positions), got dtype {positions.dtype}")
    if stats is None:
        if policy.needs_scores:
            raise ValueError(
                f"stats must be a tensor of shape {tuple(positions.shape)} for the {policy.name!r} "
                "policy (it scores keys by their statistics), got None"
            )
    elif not isinstance(stats, torch.Tensor):
        raise TypeError(f"stats must be a torch.Tensor or None, got {type(stats).__name__}")
    elif stats.shape != positions.shape:
        raise ValueError(f"stats must have the shape of positions {tuple(positions.shape)}, got {tuple(stats.shape)}")


def _eviction_scores(
    policy: EvictionPolicy, stats: torch.Tensor | None, positions: torch.Tensor, n_seen: int, protected: tuple[int, int]
) -> torch.Tensor:
    """:func:`eviction_scores` of checked arguments (the decoding loop's path)."""
    score = policy.eviction_score(stats, positions)
    n_sinks, n_recent = protected
    if n_sinks:  # (protected_rank's rule as two masks, on the decoding loop's path)
        score = score.masked_fill(positions < n_sinks, -math.inf)
    if n_recent:
        score = score.masked_fill(positions >= n_seen - n_recent, -math.inf)
    return score


def select_keep(
    policy: EvictionPolicy, stats: torch.Tensor | None, positions: torch.Tensor, budget: int, n_seen: int
) -> torch.Tensor:
    """Indices (B, H, budget), ascending, of the stored keys to keep (protected ones first, then priority).

    ``stats`` (B, H, S) are the policy's statistics of the stored keys (``None`` for a policy without
    statistics), ``positions`` (B, H, S) their absolute positions, ``n_seen`` (≥ S) the tokens seen so far.
    """
    _check_scoring(policy, stats, positions)
    stored = int(positions.shape[-1])
    if not 1 <= check_positive_int(budget, "budget") <= stored:
        raise ValueError(f"budget must be in [1, {stored}] (the keys stored), got {budget}")
    n_seen = check_positive_int(n_seen, "n_seen", minimum=stored)  # (every stored key is a token seen)
    if stats is not None and bool(torch.isnan(stats).any()):  # (topk would pick among NaNs arbitrarily)
        raise ValueError("stats must not hold NaN (NaN attention probabilities from the model?)")
    score = _eviction_scores(policy, stats, positions, n_seen, policy.protected(budget)).to(torch.float64)
    return torch.topk(score, budget, dim=-1, largest=False, sorted=False).indices.sort(dim=-1).values


def protected_rank(positions: torch.Tensor, n_seen: int, n_sinks: int, n_recent: int) -> torch.Tensor:
    """The protection rule: 0 for a key that may be evicted; for a protected key its rank among the protected
    (float64, the shape of ``positions``): the last ``n_recent`` of the ``n_seen`` tokens get 1 (the oldest of
    them) … ``n_recent`` (the newest), the first ``n_sinks`` tokens ``n_recent + 1``."""
    first_recent = n_seen - n_recent
    rank = torch.where(positions >= first_recent, (positions - first_recent + 1).to(torch.float64), 0.0)
    return rank.masked_fill(positions < n_sinks, float(n_recent + 1))


def protect(scores: torch.Tensor, window: int, n_sink: int) -> torch.Tensor:
    """Keep-scores (..., K) of the keys 0 … K − 1 with the protected ones (:func:`protected_rank` with the last
    ``window`` keys recent and the first ``n_sink`` sinks) raised strictly above every other, finite (as kvpress's
    AdaKV and rerotation wrappers expect), so ``topk`` keeps them in every float dtype.

    The protected keys keep their rank among themselves, for budgets smaller than ``n_sink + window``: a budget
    of b < n_sink + window keeps the sinks and the newest b − n_sink keys; below n_sink, the first b sinks' ties
    are broken by ``topk``. They take the values ``top + rank · step`` above the best unprotected score ``top``,
    with ``step = max(1, |top|/64)``, which exceeds the dtype's spacing there (bfloat16 included); where those
    values would pass the dtype's largest value, the unprotected scores are capped at half of it and the
    protected ones spread over the upper half. A NaN score (a model's NaN) is evicted first."""
    window = check_count(window, "window", 0)
    n_sink = check_count(n_sink, "n_sink", 0)
    finfo = torch.finfo(scores.dtype)
    out = torch.where(torch.isnan(scores), finfo.min, scores)  # (topk ranks NaN above everything)
    K = out.shape[-1]
    w = min(window, K)
    s = min(n_sink, K - w)
    if w + s == 0:
        return out
    prio = protected_rank(torch.arange(K, device=out.device), K, s, w)
    guarded = prio > 0
    rest = out[..., ~guarded]
    top = float(rest.detach().amax()) if rest.numel() else -math.inf
    if top == -math.inf:
        top = 0.0
    vals = top + prio * max(1.0, abs(top) / 64) if math.isfinite(top) else torch.full_like(prio, math.inf)
    cast = vals[guarded].to(scores.dtype)
    levels = torch.unique(cast.double())
    distinct = len(levels) == len(torch.unique(prio[guarded]))
    if not (bool(torch.isfinite(cast).all()) and float(levels[0]) > top and distinct):
        half = finfo.max / 2  # (no room above the top score: cap the others at half the range, spread above it)
        out = out.clamp(max=float(torch.tensor(half * (1 - finfo.eps), dtype=scores.dtype)))
        vals = half + prio * (half / (w + 1))
        vals[guarded] = vals[guarded].clamp(max=finfo.max)
    out = out.clone()
    out[..., guarded] = vals[guarded].to(scores.dtype)
    return out


# ---------------------------------------------------------------------------------------- a press's window
def _group(logits: torch.Tensor, n_kv_heads: Any) -> int:
    """Query heads per KV head: ``n_kv_heads`` must be a positive int dividing the logits' query heads."""
    n_kv_heads = check_count(n_kv_heads, "n_kv_heads", 1)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 4 or logits.shape[1] % n_kv_heads:
        raise ValueError(
            f"n_kv_heads must divide the query heads of logits (B, H_q, w, K), got {n_kv_heads} for logits of shape "
            f"{tuple(getattr(logits, 'shape', ()))}"
        )
    return int(logits.shape[1]) // n_kv_heads


def window_probs(logits: torch.Tensor, visible: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """The attention probabilities of a window of queries as a policy reads them: logits (B, H_q, w, K) of the
    window's queries on the K keys and their visibility (w, K) → probabilities (B, H_kv, G·w, K), the rows of a KV
    head's group group-major, 0 where a query does not see a key. The softmax runs in float64, so a margin
    ``log p_top − log p_t`` stays finite up to 745 nats (float32 underflowed past 103); infinite logits are taken
    at the largest finite value / 4 (differences stay finite, never inf − inf)."""
    G = _group(logits, n_kv_heads)
    big = torch.finfo(logits.dtype).max / 4
    work = logits.clamp(-big, big).double().masked_fill(~visible, -math.inf)
    probs = torch.softmax(work, dim=-1)
    B, Hq, w, K = logits.shape
    return probs.view(B, Hq // G, G * w, K)


def window_scores(policy: EvictionPolicy, logits: torch.Tensor, visible: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """Keep-priority (B, H_kv, K) of the keys from one window of queries: ``policy.accumulate`` on
    :func:`window_probs` from no statistics, then ``policy.priority`` (the cache's rule on the press's window)."""
    stats = policy.accumulate(None, window_probs(logits, visible, n_kv_heads))
    assert stats is not None  # (the window policies keep statistics)
    return window_priority(policy, stats)


def window_priority(policy: EvictionPolicy, stats: torch.Tensor) -> torch.Tensor:
    """``policy.priority`` of statistics (..., K) of the keys 0 … K − 1 of one window (their positions)."""
    return policy.priority(stats, torch.arange(stats.shape[-1], device=stats.device).expand(stats.shape))


# ---------------------------------------------------------------------------------------- kvpress's budget
def check_compression_ratio(compression_ratio: Any) -> float:
    """``compression_ratio`` as a float in [0, 1] (numpy numbers too), or a ValueError/TypeError naming it.

    1.0 evicts the whole layer, as in kvpress (whose ``PerLayerCompressionPress`` assigns it per layer)."""
    if isinstance(compression_ratio, (bool, np.bool_)) or not isinstance(
        compression_ratio, (int, float, np.integer, np.floating)
    ):
        raise TypeError(f"compression_ratio must be a float in [0, 1], got {compression_ratio!r}")
    if not 0.0 <= float(compression_ratio) <= 1.0 or math.isnan(compression_ratio):
        raise ValueError(f"compression_ratio must be in [0, 1], got {compression_ratio}")
    return float(compression_ratio)


def compute_n_kept(k_len: int, compression_ratio: float) -> int:
    """Keys kept per layer and KV head out of ``k_len`` at ``compression_ratio``, kvpress's rule (no kvpress
    import needed): 0 at ratio 1 (the layer is emptied), else ``max(1, int(k_len · (1 − compression_ratio)))``."""
    k_len = check_count(k_len, "k_len", 1)
    ratio = check_compression_ratio(compression_ratio)
    return 0 if ratio >= 1.0 else max(1, int(k_len * (1 - ratio)))


def check_count(value: Any, name: str, minimum: int) -> int:
    """``value`` as an int of at least ``minimum``; TypeError (not an int) or ValueError naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


# ---------------------------------------------------------------------------------------- the support keys
def svm_support_scores(
    queries: torch.Tensor,
    keys: torch.Tensor,
    visible: torch.Tensor,
    *,
    n_candidates: int = 64,
    max_rounds: int = 30,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Keep-priority (B, H_kv, K) from the support keys of the attention SVMs of a window of queries.

    ``queries`` (B, H_q, w, d) are the window's queries as the logits use them (RoPE applied, scaled), ``keys``
    (B, H_kv, K, d), ``visible`` (w, K) which keys each query sees. Every query row of every head (the H_q/H_kv
    heads of a KV head's group) selects its top-logit key k_α, and its attention SVM (docs/spec.md §2, one
    sequence, Frobenius norm) is ``min ‖W‖ s.t. (k_α − k_t)ᵀ W z ≥ 1`` for every other visible key t: its support
    keys are the keys that bound the selection. All of them (B·H_q·w instances) are solved at once by
    ``AttentionSVM.fit_stack`` on ``n_candidates`` keys per query, by cutting planes: start from the top-logit
    keys; while a solution violates a constraint of a key outside its candidates, swap the non-support candidates
    for the most violated keys and solve again (a solution that meets every constraint is the SVM on all keys).

    A key's priority is the number of (query, head) SVMs in its group for which it is the selected key or a
    support key, plus ``exp(−margin)/2`` with its smallest SV margin over those queries as the tie-break (the
    SV-margin order among the keys no SVM needs). The second value reports ``rounds``, ``instances``,
    ``unsolved`` (instances without an optimal certified SVM after ``max_rounds``: they count their selected key
    only) and ``support_keys`` (per KV head, the keys some SVM needs)."""
    from ..svm import AttentionSVM

    n_candidates = check_count(n_candidates, "n_candidates", 2)
    max_rounds = check_count(max_rounds, "max_rounds", 1)
    B, Hq, w, d = queries.shape
    Hkv, K = keys.shape[1], keys.shape[2]
    G = _group(torch.empty(B, Hq, w, K, device="meta"), Hkv)
    q = queries.detach().double().reshape(B, Hkv, G * w, d)  # rows group-major, as window_probs
    k = keys.detach().double()
    vis = visible.bool().repeat(G, 1)  # (G·w, K)
    logits = (q @ k.transpose(-1, -2)).masked_fill(~vis, -math.inf)  # (B, Hkv, R, K)
    R = G * w
    margin = (logits.amax(-1, keepdim=True) - logits).masked_fill(~vis, math.inf)
    tie = torch.exp(-margin.amin(-2)) / 2  # (B, Hkv, K) in [0, 1/2]
    selected = logits.argmax(-1)  # (B, Hkv, R)
    counts = torch.zeros(B, Hkv, K, dtype=torch.float64)
    counts.scatter_add_(-1, selected, torch.ones_like(selected, dtype=torch.float64))
    m = min(n_candidates, int(vis.sum(-1).min()))  # (every row sees at least m keys)
    info: dict[str, Any] = {"rounds": 0, "instances": B * Hkv * R, "unsolved": 0}
    if m < 2:  # (a query that sees one key selects it: no constraint)
        info["support_keys"] = (counts > 0).sum(-1)
        return counts + tie, info
    N = B * Hkv * R
    kn = k.numpy()
    qz = q.reshape(N, d).numpy()
    lg = logits.reshape(N, K).numpy()
    sel = selected.reshape(N).numpy()
    head = np.repeat(np.arange(B * Hkv), R)  # the (b, h_kv) of every instance
    keys_of = kn.reshape(B * Hkv, K, d)
    visn = np.broadcast_to(vis.numpy(), (B * Hkv, R, K)).reshape(N, K)
    cand = np.argsort(-lg, axis=1, kind="stable")[:, :m]  # the selected key first
    solver = AttentionSVM()
    todo = np.arange(N)
    support = np.zeros((N, K), dtype=bool)
    for r in range(max_rounds):
        info["rounds"] = r + 1
        X = keys_of[head[todo][:, None], cand[todo]][:, None]  # (n, 1, m, d)
        st = solver.fit_stack(X, qz[todo][:, None], np.zeros((len(todo), 1), dtype=np.int64))
        ok = st.status == "optimal"
        wz = np.einsum("nij,nj->ni", np.nan_to_num(st.W), qz[todo])  # (n, d): W z
        rows = np.arange(len(todo))
        marg = np.empty((len(todo), K))
        for h in np.unique(head[todo]):  # (per KV head: one (n_h, d) @ (d, K) product)
            at = head[todo] == h
            marg[at] = -(wz[at] @ keys_of[h].T)
        marg -= marg[rows, sel[todo]][:, None]  # (k_α − k_t)ᵀ W z
        marg[~visn[todo]] = np.inf
        marg[rows, sel[todo]] = np.inf
        violated = (marg < 1 - 1e-7).any(-1) & ok
        sup = st.support[:, 0]  # (n, m) over the candidates
        fin = np.flatnonzero(~violated & ok)  # (solved: their support keys, in one scatter)
        rows = np.broadcast_to(todo[fin][:, None], sup[fin].shape)
        support[rows[sup[fin]], cand[todo[fin]][sup[fin]]] = True
        info["unsolved"] += int((~ok).sum())
        if not violated.any():
            todo = todo[:0]
            break
        # next candidates: the selected key, the support keys, then the most violated (nearest) keys
        left = np.flatnonzero(violated)
        prio = -marg[left]
        held = np.zeros((len(left), K), dtype=bool)
        held[np.arange(len(left))[:, None], cand[todo[left]]] = sup[left]
        prio[held] = np.finfo(np.float64).max
        prio[np.arange(len(left)), sel[todo[left]]] = np.inf  # (first: the SVM's selected token is index 0)
        if held.sum(-1).max() + 1 >= m:  # (the support fills the candidates: room for more)
            m = min(2 * m, int(visn.sum(-1).min()))
        todo = todo[left]
        cand = np.full((N, m), 0, dtype=np.int64) if cand.shape[1] != m else cand
        cand[todo] = np.argsort(-prio, axis=1, kind="stable")[:, :m]
    info["unsolved"] += len(todo)
    counts += torch.from_numpy(support.reshape(B, Hkv, R, K).sum(2).astype(np.float64))
    info["support_keys"] = (counts > 0).sum(-1)
    return counts + tie, info
