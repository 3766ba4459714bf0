"""Next-token prediction with self-attention: the problem, its token-priority graphs and their SCCs
(docs/spec.md §8, "Next-token graph-SVM"; Li, Huang, Ildiz, Rawat, Oymak, AISTATS 2024).

A :class:`NextTokenProblem` holds n token sequences over a vocabulary of V tokens with embedding
``E`` (V, d), and the next token (label) ``y_i`` of each. The query of sequence i is the embedding of
its last token ``k_i`` and attention runs over all its tokens (the last position of causal
self-attention), with logits ``γ_it = x_itᵀ W x_{k_i}``.

For each last token k the **token-priority graph** ``G^(k)`` on the vocabulary has an edge ``y → j``
for every sequence i ending in k, with label y, and every other token j of that sequence (the label
should be retrieved before j). Its strongly connected components (SCCs, computed with
``scipy.sparse.csgraph.connected_components(connection="strong")``) order the tokens: an edge ``y → j``
leaves y's SCC for a *lower* one unless j is in y's SCC. The graph-SVM built from them is in
:mod:`attsvm.svm.graph`; training is :mod:`attsvm.training.ntp`.

Sequences may have different lengths; arrays use the (n, T) layout padded to the longest sequence
with a boolean ``valid`` mask (False on padding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from numpy.typing import ArrayLike, NDArray
from scipy.sparse.csgraph import connected_components

from ._validation import as_float_array, check_bool, check_positive_int, check_seed

__all__ = ["NextTokenProblem", "TokenPriorityGraph", "random_ntp_problem"]


def _int_array(value: object, name: str) -> NDArray[np.int64]:
    arr = np.asarray(value)
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        if (
            np.issubdtype(arr.dtype, np.floating)
            and arr.size
            and np.all(np.isfinite(arr))
            and np.all(arr == np.round(arr))
        ):
            return arr.astype(np.int64)
        raise TypeError(f"{name} must hold integer vocabulary indices, got dtype {arr.dtype}")
    return arr.astype(np.int64)


@dataclass(frozen=True)
class TokenPriorityGraph:
    """The token-priority graph ``G^(k)`` of one last token k (module doc).

    Attributes
    ----------
    k : the last token.
    adjacency : (V, V) CSR bool, ``adjacency[y, j]`` for an edge ``y → j``.
    nodes : (V,) bool, the tokens that occur in some sequence ending in k.
    scc : (V,) int, SCC label of every vocabulary token (tokens outside ``nodes`` are singletons).
    sequences : (m,) indices of the sequences ending in k.
    """

    k: int
    adjacency: sp.csr_matrix
    nodes: NDArray[np.bool_]
    scc: NDArray[np.int64]
    sequences: NDArray[np.int64]

    @property
    def n_scc(self) -> int:
        """Number of SCCs among the tokens that occur (``nodes``)."""
        return int(np.unique(self.scc[self.nodes]).size)

    @property
    def cyclic(self) -> bool:
        """True when some SCC has more than one token (the graph has a cycle)."""
        return self.n_scc < int(self.nodes.sum())

    def edges(self) -> NDArray[np.int64]:
        """(E, 2) the edges ``(y, j)`` in row-major order."""
        coo = self.adjacency.tocoo()
        order = np.lexsort((coo.col, coo.row))
        return np.stack([coo.row[order], coo.col[order]], axis=1).astype(np.int64)


class NextTokenProblem:
    """Sequences over a vocabulary, their next tokens and the embedding (docs/spec.md §8).

    Parameters
    ----------
    sequences : list of n non-empty integer sequences (any lengths), or an (n, T) integer array;
        entries are vocabulary indices in ``[0, V)``. The last entry is the query token ``k_i``.
    labels : (n,) the next token ``y_i`` of each sequence. It must occur in its sequence (the
        paper's realisable-label setting: attention can only output tokens it sees).
    E : (V, d) the token embedding (row v is ``e_v``).

    Raises ValueError naming the argument for an empty sequence, an index out of range, a label
    that is not in its sequence, or an embedding of the wrong shape.
    """

    def __init__(self, sequences: Sequence[Sequence[int]] | ArrayLike, labels: ArrayLike, E: ArrayLike) -> None:
        Em = as_float_array(E, "E", ndim=2)
        V, d = Em.shape
        if V < 1 or d < 1:
            raise ValueError(f"E must have shape (V, d) with V, d >= 1, got {Em.shape}")
        if isinstance(sequences, np.ndarray) and sequences.ndim == 2:
            seqs = [sequences[i] for i in range(sequences.shape[0])]
        elif isinstance(sequences, (str, bytes)) or not isinstance(sequences, (Sequence, np.ndarray)):
            raise TypeError(f"sequences must be a list of integer sequences, got {type(sequences).__name__}")
        else:
            seqs = list(sequences)
        n = len(seqs)
        if n == 0:
            raise ValueError("sequences must hold at least one sequence, got none")
        rows = []
        for i, s in enumerate(seqs):
            a = _int_array(s, f"sequences[{i}]")
            if a.ndim != 1:
                raise ValueError(f"sequences[{i}] must be a 1-D sequence of token indices, got shape {a.shape}")
            if a.size == 0:
                raise ValueError(f"sequences[{i}] is empty; every sequence needs at least its last (query) token")
            bad = (a < 0) | (a >= V)
            if bad.any():
                raise ValueError(
                    f"sequences[{i}] has vocabulary index {int(a[bad][0])} out of range [0, V={V}) "
                    "(V is the number of rows of E)"
                )
            rows.append(a)
        y = _int_array(labels, "labels")
        if y.shape != (n,):
            raise ValueError(f"labels must have shape (n,) = ({n},), one next token per sequence, got {y.shape}")
        bad_y = (y < 0) | (y >= V)
        if bad_y.any():
            i = int(np.flatnonzero(bad_y)[0])
            raise ValueError(f"labels[{i}] = {int(y[i])} is a vocabulary index out of range [0, V={V})")
        missing = [i for i, a in enumerate(rows) if not np.any(a == y[i])]
        if missing:
            raise ValueError(
                f"labels must occur in their sequences (realisable next tokens); labels{missing[:5]} do not"
            )
        T = max(a.size for a in rows)
        tokens = np.zeros((n, T), dtype=np.int64)
        valid = np.zeros((n, T), dtype=bool)
        for i, a in enumerate(rows):
            tokens[i, : a.size] = a
            valid[i, : a.size] = True
        self.E = Em
        self.labels = y
        self.tokens = tokens
        self.valid = valid
        self.lengths = valid.sum(axis=1).astype(np.int64)
        self.last = tokens[np.arange(n), self.lengths - 1]
        for arr in (self.E, self.labels, self.tokens, self.valid, self.lengths, self.last):
            arr.flags.writeable = False

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_corpus(cls, corpus: Sequence[Sequence[int]], E: ArrayLike, *, min_length: int = 1) -> NextTokenProblem:
        """Causal language modelling on ``corpus``: every prefix ``s[:t]`` (``t ≥ min_length``) predicts
        ``s[t]``, keeping the prefixes whose next token occurs in them (realisable labels, as in the
        paper). Raises ValueError naming ``corpus`` when no prefix qualifies."""
        seqs: list[NDArray[np.int64]] = []
        labels: list[int] = []
        for i, s in enumerate(corpus):
            a = _int_array(s, f"corpus[{i}]")
            for t in range(max(1, int(min_length)), a.size):
                if np.any(a[:t] == a[t]):
                    seqs.append(a[:t])
                    labels.append(int(a[t]))
        if not seqs:
            raise ValueError("corpus has no prefix whose next token occurs in it (no realisable next-token pair)")
        return cls(seqs, np.asarray(labels, dtype=np.int64), E)

    # ------------------------------------------------------------------ sizes and arrays
    @property
    def n(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def T(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def V(self) -> int:
        return int(self.E.shape[0])

    @property
    def d(self) -> int:
        return int(self.E.shape[1])

    @property
    def X(self) -> NDArray[np.float64]:
        """(n, T, d) token embeddings, zero on padding."""
        return np.where(self.valid[..., None], self.E[self.tokens], 0.0)

    @property
    def queries(self) -> NDArray[np.float64]:
        """(n, d) the embedding of each sequence's last token."""
        return self.E[self.last]

    @property
    def label_positions(self) -> NDArray[np.bool_]:
        """(n, T) True where the token is the label."""
        return self.valid & (self.tokens == self.labels[:, None])

    def logits(self, W: ArrayLike) -> NDArray[np.float64]:
        """``γ_it = x_itᵀ W x_{k_i}`` (n, T) or (R, n, T) for a stack; ``-inf`` on padding."""
        Wm = as_float_array(W, "W")
        if Wm.shape[-2:] != (self.d, self.d):
            raise ValueError(f"W must have shape (..., d, d) = (..., {self.d}, {self.d}), got {Wm.shape}")
        g = np.einsum("ntd,...de,ne->...nt", self.X, Wm, self.queries)
        return np.where(self.valid, g, -np.inf)

    def attention(self, W: ArrayLike) -> NDArray[np.float64]:
        """Softmax of :meth:`logits` over each sequence (0 on padding)."""
        g = self.logits(W)
        g = g - g.max(axis=-1, keepdims=True)
        e = np.exp(g)
        return e / e.sum(axis=-1, keepdims=True)

    # ------------------------------------------------------------------ graphs
    def last_tokens(self) -> NDArray[np.int64]:
        """The distinct last tokens k, sorted."""
        return np.unique(self.last)

    def graph(self, k: int) -> TokenPriorityGraph:
        """The token-priority graph ``G^(k)`` (module doc) and its SCCs."""
        k = int(k)
        idx = np.flatnonzero(self.last == k)
        if idx.size == 0:
            raise ValueError(f"k={k} is not the last token of any sequence; last tokens: {self.last_tokens().tolist()}")
        V = self.V
        tok, val, y = self.tokens[idx], self.valid[idx], self.labels[idx]
        src = np.broadcast_to(y[:, None], tok.shape)
        keep = val & (tok != src)
        adj = sp.coo_matrix((np.ones(int(keep.sum()), dtype=bool), (src[keep], tok[keep])), shape=(V, V)).tocsr()
        adj.sum_duplicates()
        adj.data[:] = True
        nodes = np.zeros(V, dtype=bool)
        nodes[tok[val]] = True
        _, scc = connected_components(adj, directed=True, connection="strong")
        return TokenPriorityGraph(k=k, adjacency=adj, nodes=nodes, scc=scc.astype(np.int64), sequences=idx)

    def graphs(self) -> dict[int, TokenPriorityGraph]:
        """``{k: G^(k)}`` for every last token k."""
        return {int(k): self.graph(int(k)) for k in self.last_tokens()}

    def n_scc(self) -> int:
        """Total number of SCCs over all graphs (tokens that occur only)."""
        return sum(g.n_scc for g in self.graphs().values())

    def scc_positions(self, graphs: dict[int, TokenPriorityGraph] | None = None) -> NDArray[np.bool_]:
        """(n, T) True where the token lies in the label's SCC of the graph of the sequence's last token.

        These are the tokens that attention keeps in the limit (hard retrieval); their softmax
        probabilities stay finite and are fixed by ``W_fin`` (soft composition)."""
        gs = self.graphs() if graphs is None else graphs
        scc = np.stack([gs[int(k)].scc for k in self.last])  # (n, V)
        lab = scc[np.arange(self.n), self.labels]  # (n,)
        return self.valid & (np.take_along_axis(scc, self.tokens, axis=1) == lab[:, None])


def random_ntp_problem(
    n: int,
    T: int,
    V: int,
    d: int,
    *,
    seed: int | np.random.Generator = 0,
    cyclic: bool | None = None,
    max_tries: int = 1000,
) -> NextTokenProblem:
    """A random instance on the published recipe (Li et al. 2024's ``data_generator``, token choice "random").

    Unit-norm Gaussian embeddings (V, d); n sequences of T distinct tokens (T ≤ V); each label
    uniform over the vocabulary, replaced by a uniform token of its sequence when absent (realisable
    labels). ``cyclic=True`` redraws until some graph has an SCC of two or more tokens (and the
    graph-SVM keeps an inequality row), ``False`` until every graph is acyclic — the published
    rejection loop; ``None`` accepts the first draw. Raises ValueError after ``max_tries`` draws.
    ``n``, ``V``, ``d`` and ``max_tries`` are integers >= 1, ``seed`` an integer in [0, 2**63) or a Generator.
    """
    n = check_positive_int(n, "n")
    V = check_positive_int(V, "V")
    d = check_positive_int(d, "d")
    if not (isinstance(T, (int, np.integer)) and not isinstance(T, bool) and 1 <= T <= V):
        raise ValueError(f"T must be an integer in [1, V] (sequences of distinct tokens), got T={T}, V={V}")
    if cyclic is not None:
        if not isinstance(cyclic, (bool, np.bool_)):
            raise TypeError(f"cyclic must be True, False or None, got {type(cyclic).__name__} {cyclic!r}")
        cyclic = check_bool(cyclic, "cyclic")
    max_tries = check_positive_int(max_tries, "max_tries")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(check_seed(seed))
    for _ in range(max_tries):
        E = rng.standard_normal((V, d))
        E /= np.linalg.norm(E, axis=1, keepdims=True)
        seqs = np.stack([rng.choice(V, T, replace=False) for _ in range(n)])
        lab = rng.integers(0, V, n)
        absent = ~(seqs == lab[:, None]).any(axis=1)
        lab[absent] = seqs[absent, rng.integers(0, T, int(absent.sum()))]
        p = NextTokenProblem(seqs, lab, E)
        if cyclic is None:
            return p
        gs = p.graphs().values()
        has_cycle = any(g.cyclic for g in gs)
        has_order = any(g.n_scc > 1 for g in gs)
        if (has_cycle and has_order) if cyclic else not has_cycle:
            return p
    raise ValueError(f"no {'cyclic' if cyclic else 'acyclic'} instance in {max_tries} draws (n={n}, T={T}, V={V})")
