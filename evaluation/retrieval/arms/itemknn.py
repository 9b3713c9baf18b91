"""Item-kNN: a user's history entities vote for their most cosine-similar entities."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import scipy.sparse as sp
import torch

from hir_evaluation.retrieval.data import RetrievalData
from hir_evaluation.retrieval.rank import Ranked, Scores, col_scaled, rank_dense, through_users
from hir_evaluation.retrieval.registry import ArmInfo, RetrievalContext


def item_neighbours(x: sp.csr_matrix, k: int, chunk: int = 2000) -> sp.csr_matrix:
    """Each item's ``k`` most cosine-similar items (itself included) as a sparse (I, I) matrix.

    cos(i, j) = |U_i ∩ U_j| / sqrt(|U_i| |U_j|) over the binary user-item matrix ``x``; rows are
    computed a chunk of items at a time and pruned at once, so the full item-item matrix never exists.
    """
    deg = np.asarray(x.sum(0)).ravel()
    xn = col_scaled(x, 1.0 / np.sqrt(np.maximum(deg, 1.0)))
    xn_t = xn.T.tocsr()
    rows, cols, vals = [], [], []
    items = np.flatnonzero(deg > 0)
    for start in range(0, len(items), chunk):
        ids = items[start : start + chunk]
        sims = (xn_t[ids] @ xn).tocsr()  # (chunk, I)
        for r, item in enumerate(ids):
            lo, hi = sims.indptr[r], sims.indptr[r + 1]
            data, idx = sims.data[lo:hi], sims.indices[lo:hi]
            if hi - lo > k:
                top = np.argpartition(-data, k)[:k]
                data, idx = data[top], idx[top]
            rows.append(np.full(len(idx), item))
            cols.append(idx)
            vals.append(data)
    n = x.shape[1]
    if not rows:
        return sp.csr_matrix((n, n), dtype=np.float32)
    return sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n))


def itemknn_scores(data: RetrievalData, neighbours: int = 20) -> Scores:
    """Item-based CF: score(u, j) = Σ_{i ∈ hist(u)} cos(i, j) over each item's ``neighbours`` most
    similar items (0 = every co-occurring item); items without history are -inf."""
    x = data.seen
    deg = np.asarray(x.sum(0)).ravel()
    never = torch.from_numpy(deg == 0)  # never-interacted items have no neighbours
    if neighbours > 0:
        sim = item_neighbours(x, neighbours)

        def score(users: np.ndarray) -> torch.Tensor:
            s = torch.from_numpy((x[users] @ sim).toarray().astype(np.float32))  # (n, I)
            s[:, never] = -torch.inf
            return s

        return score
    # full neighbourhood as (x_u D^-1/2 Xᵀ)(X D^-1/2), never forming the item-item matrix
    xn = col_scaled(x, 1.0 / np.sqrt(np.maximum(deg, 1.0)))
    x_t, xn_t = x.T.tocsr(), xn.T.tocsr()

    def score_all(users: np.ndarray) -> torch.Tensor:
        s = torch.from_numpy(through_users(xn[users], x_t, xn_t))  # (n, I)
        s[:, never] = -torch.inf
        return s

    return score_all


def itemknn_topk(data: RetrievalData, k: int, neighbours: int = 20) -> Ranked:
    """Item-kNN top-k under every protocol (masked: the user's own history entities removed;
    deep: the user's target-stage history entities removed)."""
    return rank_dense(itemknn_scores(data, neighbours), data.users, k, data.seen, deep=data.seen_deep)


@dataclass(frozen=True)
class ItemKNN:
    """Item-based CF over the binary history: each history entity adds its ``neighbours`` most
    cosine-similar entities (0 = every co-occurring entity)."""

    neighbours: int
    info: ClassVar[ArmInfo] = ArmInfo(role="baseline")

    def topk(self, ctx: RetrievalContext, k: int) -> Ranked:
        return itemknn_topk(ctx.test, k, self.neighbours)
