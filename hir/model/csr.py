"""Adjacency in CSR form over global node ids, with per-edge features and sampling weights."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class CSR:
    """Rows = source nodes, ``indptr[i]:indptr[i + 1]`` their edges, sorted by destination.

    ``weight`` (E,) >= 0; ``cumw`` (E,) is the inclusive cumulative sum of ``weight`` over the
    whole array, so a row's weighted draw is a ``searchsorted`` in ``[cumw[start-1], cumw[end-1]]``.
    """

    indptr: np.ndarray  # (n+1,) int64
    dst: np.ndarray  # (E,) int64 global ids
    weight: np.ndarray  # (E,) float64
    cumw: np.ndarray  # (E,) float64
    stage: np.ndarray  # (E,) int8: 1..S for engagement, 0 for metadata
    recency: np.ndarray  # (E,) int8: 1..N_RECENCY for engagement, 0 for metadata
    count: np.ndarray  # (E,) float32 log1p(count)
    age: np.ndarray  # (E,) float32 age of the last event / span of the visible window
    hop: np.ndarray  # (E,) int8: 1 or 2

    @classmethod
    def build(cls, n: int, src: np.ndarray, dst: np.ndarray, weight: np.ndarray, **features: np.ndarray) -> CSR:
        """Edges ``src -> dst`` (E,) of an ``n``-node graph with their ``weight`` (E,) and any of
        the edge features (E,) (the others: 0, hop 1)."""
        order = np.lexsort((dst, src))
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.add.at(indptr, src + 1, 1)
        indptr = np.cumsum(indptr)
        e = len(src)
        feats = {
            "stage": np.zeros(e, np.int8), "recency": np.zeros(e, np.int8), "count": np.zeros(e, np.float32),
            "age": np.zeros(e, np.float32), "hop": np.ones(e, np.int8),
        } | features
        w = weight.astype(np.float64)[order]
        return cls(indptr, dst.astype(np.int64)[order], w, np.cumsum(w), **{k: v[order] for k, v in feats.items()})

    @classmethod
    def build_pairs(cls, n: int, u: np.ndarray, v: np.ndarray, weight: np.ndarray,
                    features: dict[str, np.ndarray]) -> CSR:
        """:meth:`build` of the undirected pairs ``u`` -- ``v`` (P,): the edges ``u -> v`` and then
        ``v -> u``, each with the pair's ``weight`` and ``features`` (P,), exactly as
        ``build(n, [u, v], [v, u], [w, w], ...)``, without holding both directions of every
        feature beside the sorted copies: the order is computed from the ids alone, and each
        array is doubled, gathered and dropped one at a time. ``features`` is emptied."""
        p = len(u)
        src = np.concatenate([u, v])
        dst = np.concatenate([v, u])
        order = np.lexsort((dst, src))
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.add.at(indptr, src + 1, 1)
        indptr = np.cumsum(indptr)
        del src
        dst = dst[order]
        e = 2 * p

        def doubled(x: np.ndarray, dtype: type) -> np.ndarray:
            # the gather of [x, x] by order: row i of the doubled array is x[i mod p]
            return np.asarray(x, dtype)[np.where(order < p, order, order - p)]

        w = doubled(weight, np.float64)
        feats: dict[str, np.ndarray] = {}
        for k in list(features):
            x = features.pop(k)
            feats[k] = doubled(x, x.dtype)
            del x
        defaults = {"stage": (np.int8, 0), "recency": (np.int8, 0), "count": (np.float32, 0), "age": (np.float32, 0),
                    "hop": (np.int8, 1)}
        for k, (dtype, value) in defaults.items():
            if k not in feats:
                feats[k] = np.full(e, value, dtype)
        return cls(indptr, dst, w, np.cumsum(w), **feats)

    def degree(self, rows: np.ndarray) -> np.ndarray:
        return self.indptr[rows + 1] - self.indptr[rows]

    def sources(self) -> np.ndarray:
        """(E,) the source node of every edge."""
        return np.repeat(np.arange(len(self.indptr) - 1), np.diff(self.indptr))
