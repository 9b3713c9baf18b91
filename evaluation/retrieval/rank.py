"""Retrieval lift: top-K entities per test user, scored on held-out deep-funnel events.

Every arm sees the same history (``RetrievalData.history``: the history stages' events of the
periods the arms may learn from), the same users and the same candidate catalogue (every node of
the entity type). An arm returns :class:`Ranked`, its top-k under three protocols, all computed
from one scoring pass:

- ``full`` (the first protocol): each arm ranks the whole catalogue, past entities included, so
  repeat engagement counts for all arms alike; relevance = every held-out entity. Slices:
  held-out entities new to the user (no event of any stage with it before the period; explore),
  the others (``repeat``: engaged with before, at any stage) and item-cold ones (first event in
  the period).
- ``masked_new_to_user`` (the LightGCN paper's protocol, He et al. 2020): each user's history
  entities are removed from the ranking (score -inf) before the top-K is taken, and relevance is
  the held-out entities new to the user; slice: item-cold entities under the same masking.
- ``deep_funnel`` (the multi-behaviour protocol of GHCF / EHCF / CRGCN): only the user's history
  entities of the target stage (``RetrievalData.seen_deep``, e.g. past purchases) are removed;
  carted or viewed ones stay rankable. Relevance = every held-out entity (on Beibei the one test
  purchase, so HR@K = recall@K); slices ``repeat`` (engaged with before at a shallower stage, or
  bought before and so masked) and ``explore`` (new to the user).

Both protocols also have a few-events slice when asked for (``eval.retrieval_few_events``): the
same relevance, restricted to the users whose history has at most that many events.

Masking lives in one place, :func:`rank_dense` (dense-score arms: -inf on the user's row of the
sparse history matrix, a chunk of users at a time); the HIR Milvus arm masks its search results
the equivalent way (evaluation/retrieval/hir_search.py). An arm with its own ordering (repeat,
open-funnel) builds its lists itself and passes ``deep=`` to :class:`Ranked`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from hir_evaluation.metrics import recall_ndcg_at_k
from hir_evaluation.retrieval.data import RetrievalData


@dataclass
class Ranked:
    """One arm's (U, k) top-k entity ids per protocol, best first (-1 = empty slot).

    full: ranked over the whole catalogue; masked: the user's history entities removed before
    the top-k was taken (None: the arm has no masked list; ``repeat`` ranks history only);
    deep: only the user's target-stage history entities removed (the deep-funnel protocol;
    None: the arm has no deep list and reports null there).
    """

    full: np.ndarray
    masked: np.ndarray | None
    # what an arm that trains reports about its fit (metrics.json retrieval.fits.<arm>), or None
    fit: dict[str, Any] | None = None
    deep: np.ndarray | None = None

    def lists(self) -> list[np.ndarray]:
        """The lists the arm has (full, then masked and deep when present), e.g. to blank users
        without a vector in all of them at once."""
        return [top for top in (self.full, self.masked, self.deep) if top is not None]


# a search: test data, k -> its top-k lists under both protocols
TopK = Callable[[RetrievalData, int], Ranked]
# a dense arm's scorer: user ids (n,) -> (n, I) float32 scores; -inf = never retrieved
Scores = Callable[[np.ndarray], torch.Tensor]

FULL_SLICES = {"all": "relevant", "new_to_user": "new_to_user", "repeat": "repeat", "item_cold": "item_cold"}
MASKED_SLICES = {"masked_new_to_user": "new_to_user", "masked_item_cold": "item_cold"}
# score_arm key -> RetrievalData sets: the deep-funnel protocol, then its repeat and explore slices
DEEP_SLICES = {"deep_funnel": "relevant", "deep_repeat": "repeat", "deep_explore": "new_to_user"}


def score_arm(
    ranked: Ranked, data: RetrievalData, ks: tuple[int, ...], few_events: np.ndarray | None = None
) -> dict[str, dict[str, float]]:
    """recall@K / NDCG@K of one arm per protocol and slice.

    Keys: ``all``, ``new_to_user``, ``repeat``, ``item_cold`` (the full ranking against every
    held-out entity, the new-to-user ones, the others and the item-cold ones); when the arm has a
    masked list, ``masked_new_to_user`` and ``masked_item_cold`` (history masked; relevance = the
    new-to-user / item-cold held-out entities); when it has a deep list, ``deep_funnel``,
    ``deep_repeat`` and ``deep_explore`` (target-stage history masked; relevance = every / the
    repeat / the new-to-user held-out entities), each with HR@K too. With ``few_events`` ((U,)
    bool over ``data.users``, e.g. ``data.few_events(5)``) also ``few_events`` and
    ``masked_few_events``: ``all`` and ``masked_new_to_user`` restricted to those users.
    """
    out = {name: recall_ndcg_at_k(ranked.full, getattr(data, sets), ks) for name, sets in FULL_SLICES.items()}
    if ranked.deep is not None:
        out |= {name: recall_ndcg_at_k(ranked.deep, getattr(data, sets), ks, hit_ratio=True)
                for name, sets in DEEP_SLICES.items()}
    if few_events is not None:
        out["few_events"] = recall_ndcg_at_k(ranked.full, only_users(data.relevant, few_events), ks)
    if ranked.masked is not None:
        out |= {name: recall_ndcg_at_k(ranked.masked, getattr(data, sets), ks) for name, sets in MASKED_SLICES.items()}
        if few_events is not None:
            out["masked_few_events"] = recall_ndcg_at_k(ranked.masked, only_users(data.new_to_user, few_events), ks)
    return out


def only_users(sets: list[set[int]], keep: np.ndarray) -> list[set[int]]:
    """``sets`` (one per user) with the users where ``keep`` (U,) is False emptied, so
    recall_ndcg_at_k scores only the kept users."""
    if len(keep) != len(sets):
        raise ValueError(f"user mask has {len(keep)} entries for {len(sets)} users")
    return [s if k else set() for s, k in zip(sets, keep, strict=True)]


def topk_ids(scores: torch.Tensor, k: int) -> np.ndarray:
    """(U, k) ids of the highest scores per row, best first; -1 pads rows with fewer than k
    finite scores (a catalogue smaller than k, or items excluded with -inf)."""
    kk = min(k, scores.shape[1])
    values, ids = torch.topk(scores, kk, dim=1)
    ids = ids.numpy().astype(np.int64)
    ids[~torch.isfinite(values).numpy()] = -1
    return np.pad(ids, ((0, 0), (0, k - kk)), constant_values=-1)


def mask_seen(scores: torch.Tensor, seen_rows: sp.csr_matrix) -> None:
    """Set ``scores`` (n, I) to -inf, in place, wherever ``seen_rows`` (n, I) has an entry."""
    rows = np.repeat(np.arange(seen_rows.shape[0]), np.diff(seen_rows.indptr))
    scores[torch.from_numpy(rows), torch.from_numpy(seen_rows.indices.astype(np.int64))] = -torch.inf


def rank_dense(
    scores: Scores,
    users: np.ndarray,
    k: int,
    seen: sp.csr_matrix | None,
    chunk: int = 256,
    deep: sp.csr_matrix | None = None,
) -> Ranked:
    """Every protocol's top-k of a dense-score arm, scoring each chunk of users once.

    Args:
        scores: the arm's scorer, user ids (n,) -> (n, I) scores.
        users: (U,) user ids ranked.
        seen: (n_users, I) history matrix by user id (``RetrievalData.seen``); None = no masked list.
        deep: (n_users, I) target-stage history matrix by user id (``RetrievalData.seen_deep``);
            None = no deep list.
    Returns:
        Ranked with ``full`` (U, k), ``masked`` (U, k): the same scores with the user's history
        entities at -inf, and ``deep`` (U, k): with only the target-stage history entities at -inf.
    """
    full, masked, deep_top = [], [], []
    for start in range(0, len(users), chunk):
        block = users[start : start + chunk]
        s = scores(block)  # (n, I)
        full.append(topk_ids(s, k))
        if deep is not None:
            # a copy: the deep mask need not lie inside the history one (the target stage may be
            # left out of the history stages), and the masked list must not lose those entities
            d = s.clone() if seen is not None else s
            mask_seen(d, deep[block])
            deep_top.append(topk_ids(d, k))
        if seen is not None:
            mask_seen(s, seen[block])
            masked.append(topk_ids(s, k))
    empty = np.zeros((0, k), dtype=np.int64)

    def stacked(parts: list[np.ndarray], wanted: bool) -> np.ndarray | None:
        return (np.concatenate(parts) if parts else empty) if wanted else None

    full_top = stacked(full, True)
    assert full_top is not None
    return Ranked(full_top, stacked(masked, seen is not None), deep=stacked(deep_top, deep is not None))


def inner_product_scores(user_vecs: np.ndarray, item_vecs: np.ndarray, item_mask: np.ndarray | None = None) -> Scores:
    """Scorer of user_vecs (n_users, d), indexed by user id, times item_vecs (I, d); ``item_mask``
    (I,) False excludes an item (-inf) from every list (e.g. one without a vector)."""
    items = torch.from_numpy(np.ascontiguousarray(item_vecs, dtype=np.float32))
    excluded = None if item_mask is None else torch.from_numpy(~np.asarray(item_mask, dtype=bool))

    def score(users: np.ndarray) -> torch.Tensor:
        s = torch.from_numpy(np.ascontiguousarray(user_vecs[users], dtype=np.float32)) @ items.T  # (n, I)
        if excluded is not None:
            s[:, excluded] = -torch.inf
        return s

    return score


def through_users(rows: sp.csr_matrix, left_t: sp.csr_matrix, right_t: sp.csr_matrix) -> np.ndarray:
    """(n, I) float32 scores ``rows @ left_t @ right_tᵀ`` for rows (n, I) and left_t, right_t (I, U)
    CSR: an item-item filter applied through the user dimension, (n, U) then (n, I), so the
    (I, I) item-item matrix never exists (item-kNN without pruning, GF-CF's linear filter)."""
    overlap = (rows @ left_t).toarray()  # (n, U)
    return np.ascontiguousarray((right_t @ overlap.T).T, dtype=np.float32)


def col_scaled(x: sp.csr_matrix, scale: np.ndarray) -> sp.csr_matrix:
    """``x`` (U, I) with column i times ``scale[i]``, float32 CSR."""
    return sp.csr_matrix(x @ sp.diags(scale.astype(np.float32)), dtype=np.float32)
