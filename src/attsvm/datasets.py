"""Instances: the published data recipe, the hand-built GD-path instances, and a numpy generator.

``paper_instance`` follows docs/spec.md §6 draw for draw (one ``torch.Generator`` seeded with the run index;
``v``, ``Y``, ``X``, ``Z`` drawn in that order in float32 and normalised as the published code does,
then converted to float64), so seed ``s`` here is run ``s`` of the published notebooks.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import numpy as np
from numpy.typing import NDArray

from ._validation import (
    check_bool,
    check_choice,
    check_finite_scalar,
    check_fits_memory,
    check_positive_int,
    check_seed,
)
from .problem import AttentionProblem, Head

__all__ = ["paper_instance", "gd_paths_instance", "random_instance", "mlp_head", "hop_instance", "HopInstance"]


def _check_nTd(n: int, T: int, d: int) -> tuple[int, int, int]:
    return (check_positive_int(n, "n"), check_positive_int(T, "T", minimum=2), check_positive_int(d, "d"))


def _check_seed(seed: int) -> int:
    return check_seed(seed)


def _check_query(self_attention: bool, query_index: int) -> bool:
    """``self_attention`` as a bool; ``query_index`` must be an integer, and left at 0 without self-attention
    (cross-attention has no query token, so another index would be silently ignored)."""
    self_attention = check_bool(self_attention, "self_attention")
    if isinstance(query_index, bool) or not isinstance(query_index, (int, np.integer)):
        raise TypeError(f"query_index must be an integer token index, got {type(query_index).__name__} {query_index!r}")
    if not self_attention and query_index != 0:
        raise ValueError(f"query_index={query_index} needs self_attention=True (cross-attention has no query token)")
    return self_attention


def paper_instance(
    n: int, T: int, d: int, *, seed: int, self_attention: bool = False, query_index: int = 0
) -> AttentionProblem:
    """The published data recipe (docs/spec.md §6), reproducing the published draws seed for seed.

    ``v ~ N(0, I_d)`` normalised; ``Y = 2·1[N(0,1) > 0] − 1``; ``X ~ N(0, I)`` of shape (n, T, d) with
    each token normalised; ``Z ~ N(0, I)`` of shape (n, d) with each row normalised. With
    ``self_attention=True`` the same draws are made (``Z`` is drawn and discarded, as in the published
    code) and ``z_i = x_{i, query_index}``; a non-zero ``query_index`` without self-attention is refused.
    """
    import torch  # (here, not at import: a process that only plots or aggregates never loads torch)

    n, T, d = _check_nTd(n, T, d)
    self_attention = _check_query(self_attention, query_index)
    seed = _check_seed(seed)
    # (float32 draws, their float64 copies and the problem's validated copy: ~24 bytes per token value)
    check_fits_memory(24.0 * n * (T + 1) * d, f"the instance's arrays at n={n}, T={T}, d={d}")
    g = torch.Generator()
    g.manual_seed(seed)
    v = torch.randn((d,), generator=g)
    v /= torch.norm(v)
    Y = 2 * torch.ones(n) * (torch.randn(n, generator=g) > 0) - 1
    X = torch.randn((n, T, d), generator=g)
    X /= torch.norm(X, dim=-1, keepdim=True)
    Z = torch.randn((n, d), generator=g)
    Z /= torch.norm(Z, dim=-1, keepdim=True)
    Xn, Yn, Zn, vn = (t.double().numpy() for t in (X, Y, Z, v))
    if self_attention:
        return AttentionProblem(Xn, Yn, vn, query_index=query_index)
    return AttentionProblem(Xn, Yn, vn, Z=Zn)


def gd_paths_instance(T: Literal[3, 5] = 3) -> AttentionProblem:
    """The hand-built instance of the GD-path figures (docs/spec.md §6 ``gd-paths``): n = 2, d = 2.

    Seed 1; ``v ~ N(0, I)`` normalised; ``y = (1, 1)``; tokens ``0.3·N(0, I)`` shifted by (−1, 0) in
    sequence 0 and (+1, 0) in sequence 1; unit-norm Gaussian cross-attention queries.
    """
    import torch

    if T not in (3, 5):
        raise ValueError(f"T must be 3 or 5 (the two GD-path figures), got {T!r}")
    n, d = 2, 2
    g = torch.Generator()
    g.manual_seed(1)
    v = torch.randn((d,), generator=g)
    v /= torch.norm(v)
    Y = torch.ones(n)
    X = 0.3 * torch.randn((n, T, d), generator=g)
    X[0] += torch.tensor([-1.0, 0.0])
    X[1] += torch.tensor([1.0, 0.0])
    Z = torch.randn((n, d), generator=g)
    Z /= torch.norm(Z, dim=-1, keepdim=True)
    return AttentionProblem(X.double().numpy(), Y.double().numpy(), v.double().numpy(), Z=Z.double().numpy())


def random_instance(
    n: int,
    T: int,
    d: int,
    *,
    seed: int | np.random.Generator,
    self_attention: bool = False,
    query_index: int = 0,
    token_norm: float | None = 1.0,
    query_norm: float | None = 1.0,
    head: Literal["linear", "relu", "multiclass"] = "linear",
    n_classes: int = 3,
    head_width: int | None = None,
) -> AttentionProblem:
    """A Gaussian instance from a numpy generator, with options.

    Tokens, queries and head are standard Gaussian; ``token_norm`` / ``query_norm`` rescale each
    token / query to that norm (None keeps the raw draw). ``head="relu"`` draws V (d, head_width)
    with ‖V‖_F = 1; ``head="multiclass"`` draws V (d, n_classes) and uniform class labels.

    An option that has no effect is refused, naming it: ``head_width`` other than None unless
    ``head="relu"``, ``n_classes`` other than its default 3 unless ``head="multiclass"``, and a non-zero
    ``query_index`` without ``self_attention``.
    """
    n, T, d = _check_nTd(n, T, d)
    check_fits_memory(24.0 * n * (T + 1) * d, f"the instance's arrays at n={n}, T={T}, d={d}")
    check_choice(head, "head", ("linear", "relu", "multiclass"))
    self_attention = _check_query(self_attention, query_index)
    if head_width is not None and head != "relu":
        raise ValueError(f"head_width={head_width!r} applies to head='relu' only, got head={head!r}")
    if head != "multiclass" and not (
        isinstance(n_classes, (int, np.integer)) and not isinstance(n_classes, bool) and n_classes == 3
    ):
        raise ValueError(f"n_classes={n_classes!r} applies to head='multiclass' only, got head={head!r}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(_check_seed(seed))
    X = rng.standard_normal((n, T, d))
    if token_norm is not None:
        token_norm = check_finite_scalar(token_norm, "token_norm", positive=True)
        X *= token_norm / np.linalg.norm(X, axis=-1, keepdims=True)
    Z = rng.standard_normal((n, d))
    if query_norm is not None:
        query_norm = check_finite_scalar(query_norm, "query_norm", positive=True)
        Z *= query_norm / np.linalg.norm(Z, axis=-1, keepdims=True)
    if head == "linear":
        v = rng.standard_normal(d)
        h: Head = Head.linear(v / np.linalg.norm(v))
        y = np.where(rng.standard_normal(n) > 0, 1.0, -1.0)
    elif head == "relu":
        k = d if head_width is None else check_positive_int(head_width, "head_width")
        V = rng.standard_normal((d, k))
        h = Head.relu(V / np.linalg.norm(V))
        y = np.where(rng.standard_normal(n) > 0, 1.0, -1.0)
    else:
        C = check_positive_int(n_classes, "n_classes", minimum=2)
        V = rng.standard_normal((d, C))
        h = Head.multiclass(V / np.linalg.norm(V))
        y = rng.integers(0, C, size=n).astype(np.float64)
    if self_attention:
        return AttentionProblem(X, y, h, query_index=query_index)
    return AttentionProblem(X, y, h, Z=Z)


def mlp_head(
    d: int,
    *,
    width: int | None = None,
    depth: int = 1,
    activation: str = "gelu",
    seed: int | np.random.Generator = 0,
) -> Head:
    """A random MLP head (docs/spec.md §5): ``depth`` hidden layers of ``width`` units (default d) and
    ``activation`` ("gelu", "silu", "relu", "swiglu"). The first layer (and the SwiGLU gate) is
    Gaussian with ‖·‖_F = 1, as the ReLU head of the svm-eq recipe; later layers are N(0, 1/width);
    the output weights are ones."""
    from .problem import ACTIVATIONS

    d = check_positive_int(d, "d")
    k = d if width is None else check_positive_int(width, "width")
    depth = check_positive_int(depth, "depth")
    check_choice(activation, "activation", ACTIVATIONS)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(_check_seed(seed))
    V = rng.standard_normal((d, k))
    gate = None
    if activation == "swiglu":
        G = rng.standard_normal((d, k))
        gate = G / np.linalg.norm(G)
    hidden = [rng.standard_normal((k, k)) / np.sqrt(k) for _ in range(depth - 1)]
    return Head.mlp(V / np.linalg.norm(V), activation=activation, hidden=hidden, gate=gate)


class HopInstance(NamedTuple):
    """A multi-hop instance (:func:`hop_instance`): the problem and, per sequence, the position of the
    token each layer should select (``targets`` (n, hops))."""

    problem: AttentionProblem
    targets: NDArray[np.int64]


def hop_instance(
    n: int,
    hops: int,
    d: int,
    *,
    candidates: int = 3,
    codes: int = 4,
    margin: float = 1.0,
    seed: int | np.random.Generator = 0,
) -> HopInstance:
    """A task that needs ``hops`` attention hops (docs/spec.md §8, "Depth").

    Orthonormal directions: a query q, one flag per level f_1..f_H, a label direction v, and per level
    j ≥ 2 a code book of ``codes`` addresses in a subspace of its own. Every sequence holds

    * level 1, one *bridge*: ``f_1 + a_2[k_2]`` (it points to address k_2 of level 2);
    * each level 2 ≤ j ≤ H, ``candidates`` tokens with distinct addresses: ``f_j + a_j[k] + (pointer)``,
      the one at the address pointed to by level j−1 being the right one; below the last level the
      pointer is ``a_{j+1}[·]`` (the right token points on, the others at random), at the last level
      it is the label, ``margin·y_i·v``, on the right token only (the others carry none, so the right
      token is the only optimal one, and no attention that is linear in the tokens can find it by its
      label: its position is known only through the pointers).

    The query is q for every sequence and the head is v, so one layer cannot know which last-level
    candidate is right: it is found by following the pointers, layer ℓ selecting the right level-ℓ
    token (its query z^{ℓ−1} then holds that token's pointer). Token order is shuffled per sequence.
    Needs ``hops ≥ 2`` (with one hop a sequence would hold the bridge alone, one token, and attention
    would have no choice) and ``d ≥ hops + 2 + (hops − 1)·codes``.
    """
    n = check_positive_int(n, "n")
    H = check_positive_int(hops, "hops", minimum=2)
    d = check_positive_int(d, "d")
    C = check_positive_int(candidates, "candidates")
    K = check_positive_int(codes, "codes", minimum=max(2, C))
    margin = check_finite_scalar(margin, "margin", positive=True)
    need = H + 2 + (H - 1) * K
    if d < need:
        raise ValueError(f"d must be at least hops + 2 + (hops − 1)·codes = {need} for this instance, got {d}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(_check_seed(seed))
    B, _ = np.linalg.qr(rng.standard_normal((d, d)))
    q, v = B[:, 0], B[:, 1]
    flags = [B[:, 2 + j] for j in range(H)]
    books = [B[:, H + 2 + j * K : H + 2 + (j + 1) * K] for j in range(H - 1)]  # addresses of levels 2..H
    T = 1 + (H - 1) * C
    X = np.zeros((n, T, d))
    y = np.where(rng.standard_normal(n) > 0, 1.0, -1.0)
    targets = np.zeros((n, H), dtype=np.int64)
    for i in range(n):
        rows: list[np.ndarray] = []
        right: list[int] = []
        chain = [int(rng.integers(K)) for _ in range(H - 1)]  # address of the right token at levels 2..H
        bridge = flags[0] + books[0][:, chain[0]]
        right.append(0)
        rows.append(bridge)
        for lev in range(1, H):
            addr = [chain[lev - 1], *rng.choice([k for k in range(K) if k != chain[lev - 1]], C - 1, replace=False)]
            for c, a in enumerate(addr):
                tok = flags[lev] + books[lev - 1][:, a]
                if lev < H - 1:
                    tok = tok + books[lev][:, chain[lev] if c == 0 else int(rng.integers(K))]
                else:
                    if c == 0:
                        tok = tok + margin * y[i] * v
                if c == 0:
                    right.append(len(rows))
                rows.append(tok)
        perm = rng.permutation(T)
        X[i] = np.asarray(rows)[perm]
        targets[i] = np.argsort(perm)[right]
    prob = AttentionProblem(X, y, v, Z=np.tile(q, (n, 1)))
    return HopInstance(prob, targets)
