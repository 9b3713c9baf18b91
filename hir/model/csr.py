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

    def degree(self, rows: np.ndarray) -> np.ndarray:
        return self.indptr[rows + 1] - self.indptr[rows]

    def sources(self) -> np.ndarray:
        """(E,) the source node of every edge."""
        return np.repeat(np.arange(len(self.indptr) - 1), np.diff(self.indptr))
