"""Retrieval lift: top-K entities per test user, scored on held-out deep-funnel events.

Every arm sees the same history (``RetrievalData.history``: the history stages' events of the
periods the arms may learn from), the same users and the same candidate catalogue (every node of
the entity type). Two protocols, both computed for every arm from one scoring pass:

- ``full`` (the first protocol): each arm ranks the whole catalogue, past entities included, so
  repeat engagement counts for all arms alike; relevance = every held-out entity. Slices:
  held-out entities new to the user (no event of any stage with it before the period) and
  item-cold ones (first event in the period).
- ``masked_new_to_user`` (the LightGCN paper's protocol, He et al. 2020): each user's history
  entities are removed from the ranking (score -inf) before the top-K is taken, and relevance is
  the held-out entities new to the user; slice: item-cold entities under the same masking.

Masking lives in one place, :func:`rank_dense` (dense-score arms: -inf on the user's row of the
sparse history matrix, a chunk of users at a time); the HIR Milvus arm masks its search results
the equivalent way (evaluation/hir_retrieval.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import polars as pl
import scipy.sparse as sp
import torch

from hir.errors import HirError
from hir_evaluation.metrics import recall_ndcg_at_k
from hir_evaluation.snapshot import Snapshot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetrievalTask:
    """Args:
    entity_type: the entity type retrieved.
    target_stage: stage of the held-out test events that count as relevant (null = deepest).
    history_stages: stages whose events before the test period form a user's history and the
        baselines' training data (null = every stage).
    ks: cut-offs; the largest is how many entities each arm retrieves.
    max_users: test users scored (a seeded sample when there are more; 0 = all).
    """

    entity_type: str = "product"
    target_stage: str | None = None
    history_stages: tuple[str, ...] | None = None
    ks: tuple[int, ...] = (10, 20, 50)
    max_users: int = 0


@dataclass
class RetrievalData:
    """users: (U,) test user ids; relevant / new_to_user / item_cold: per user sets of entity ids;
    history: (user_id, entity_id, n) pairs before the test period (history stages), the train
    data of every baseline and what the masked protocol removes; n_users / n_items: node counts."""

    users: np.ndarray
    relevant: list[set[int]]
    new_to_user: list[set[int]]
    item_cold: list[set[int]]
    history: pl.DataFrame
    n_users: int
    n_items: int

    @cached_property
    def seen(self) -> sp.csr_matrix:
        """(n_users, n_items) binary CSR of the history pairs, by user id: the entities the masked
        protocol removes from each user's ranking."""
        return interaction_matrix(self.history, self.n_users, self.n_items)


def history_frame(snap: Snapshot, task: RetrievalTask, splits: list[str]) -> pl.DataFrame:
    ev = snap.events.filter((pl.col("entity_type") == task.entity_type) & pl.col("split").is_in(splits))
    if task.history_stages:
        ev = ev.filter(pl.col("stage").is_in(list(task.history_stages)))
    return ev.group_by("user_id", "entity_id").agg(pl.len().cast(pl.Float64).alias("n"))


def retrieval_data(
    snap: Snapshot, task: RetrievalTask, split: str = "test", seed: int = 0, history_splits: list[str] | None = None
) -> RetrievalData:
    """Held-out sets of ``split`` (test, or val for early stopping with train as history).

    ``history_splits`` (default: every period before ``split``) is what the arms may learn
    from; "new to the user" is always judged against every earlier period.
    """
    stage = task.target_stage or snap.deep_stage
    if stage not in snap.stage_order:
        raise HirError(f"eval.task.retrieval.target_stage={stage!r} is not in the stage order {snap.stage_order}")
    before = ["train", "val"] if split == "test" else ["train"]
    hist_splits = history_splits or before
    if not set(hist_splits) <= set(before):
        raise HirError(f"retrieval history {hist_splits} must come before the {split} period ({before})")
    target = (
        snap.events.filter(
            (pl.col("entity_type") == task.entity_type) & (pl.col("split") == split) & (pl.col("stage") == stage)
        )
        .select("user_id", "entity_id")
        .unique()
    )
    if target.is_empty():
        raise HirError(f"no {stage!r} events of {task.entity_type} in the {split} period; nothing to retrieve")
    seen = (
        snap.events.filter((pl.col("entity_type") == task.entity_type) & pl.col("split").is_in(before))
        .select("user_id", "entity_id")
        .unique()
        .with_columns(pl.lit(True).alias("seen"))
    )
    start = snap.test_start if split == "test" else snap.val_start
    first = snap.nodes(task.entity_type).select(
        pl.col("node_id").alias("entity_id"),
        pl.col("first_seen").fill_null(pl.lit(start, pl.Datetime("us", "UTC"))) >= pl.lit(start, pl.Datetime("us", "UTC")),
    ).rename({"first_seen": "cold"})
    target = target.join(seen, on=["user_id", "entity_id"], how="left").join(first, on="entity_id", how="left")
    per_user = target.group_by("user_id").agg(
        pl.col("entity_id").alias("rel"),
        pl.col("entity_id").filter(pl.col("seen").is_null()).alias("new"),
        pl.col("entity_id").filter(pl.col("cold").fill_null(False)).alias("cold"),
    ).sort("user_id")
    if task.max_users and per_user.height > task.max_users:
        per_user = per_user.sample(task.max_users, seed=seed).sort("user_id")
    return RetrievalData(
        users=per_user["user_id"].to_numpy(),
        relevant=[set(x) for x in per_user["rel"].to_list()],
        new_to_user=[set(x) for x in per_user["new"].to_list()],
        item_cold=[set(x) for x in per_user["cold"].to_list()],
        history=history_frame(snap, task, hist_splits),
        n_users=snap.num_nodes("user"),
        n_items=snap.num_nodes(task.entity_type),
    )


@dataclass
class Ranked:
    """One arm's (U, k) top-k entity ids per protocol, best first (-1 = empty slot).

    full: ranked over the whole catalogue; masked: the user's history entities removed before
    the top-k was taken (None: the arm has no masked list; ``repeat`` ranks history only).
    """

    full: np.ndarray
    masked: np.ndarray | None


# an arm: test data, k -> its top-k lists under both protocols
TopK = Callable[["RetrievalData", int], Ranked]
# a dense arm's scorer: user ids (n,) -> (n, I) float32 scores; -inf = never retrieved
Scores = Callable[[np.ndarray], torch.Tensor]

FULL_SLICES = {"all": "relevant", "new_to_user": "new_to_user", "item_cold": "item_cold"}
MASKED_SLICES = {"masked_new_to_user": "new_to_user", "masked_item_cold": "item_cold"}


def score_arm(ranked: Ranked, data: RetrievalData, ks: tuple[int, ...]) -> dict[str, dict[str, float]]:
    """recall@K / NDCG@K of one arm per protocol and slice.

    Keys: ``all``, ``new_to_user``, ``item_cold`` (the full ranking against every held-out
    entity, the new-to-user ones and the item-cold ones) and, when the arm has a masked list,
    ``masked_new_to_user`` and ``masked_item_cold`` (history masked; relevance = the new-to-user
    / item-cold held-out entities).
    """
    out = {name: recall_ndcg_at_k(ranked.full, getattr(data, sets), ks) for name, sets in FULL_SLICES.items()}
    if ranked.masked is not None:
        out |= {name: recall_ndcg_at_k(ranked.masked, getattr(data, sets), ks) for name, sets in MASKED_SLICES.items()}
    return out


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


def rank_dense(scores: Scores, users: np.ndarray, k: int, seen: sp.csr_matrix | None, chunk: int = 256) -> Ranked:
    """Both protocols' top-k of a dense-score arm, scoring each chunk of users once.

    Args:
        scores: the arm's scorer, user ids (n,) -> (n, I) scores.
        users: (U,) user ids ranked.
        seen: (n_users, I) history matrix by user id (``RetrievalData.seen``); None = full only.
    Returns:
        Ranked with ``full`` (U, k) and ``masked`` (U, k): the same scores with the user's history
        entities at -inf.
    """
    full, masked = [], []
    for start in range(0, len(users), chunk):
        block = users[start : start + chunk]
        s = scores(block)  # (n, I)
        full.append(topk_ids(s, k))
        if seen is not None:
            mask_seen(s, seen[block])
            masked.append(topk_ids(s, k))
    empty = np.zeros((0, k), dtype=np.int64)
    return Ranked(np.concatenate(full) if full else empty,
                  (np.concatenate(masked) if masked else empty) if seen is not None else None)


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


def interaction_matrix(history: pl.DataFrame, n_users: int, n_items: int) -> sp.csr_matrix:
    """Binary (n_users, n_items) CSR matrix of history pairs."""
    return sp.csr_matrix(
        (np.ones(history.height, dtype=np.float32), (history["user_id"].to_numpy(), history["entity_id"].to_numpy())),
        shape=(n_users, n_items),
    )


def popularity_scores(data: RetrievalData) -> Scores:
    """The same scores for everyone: entities by history event count, ties by id (a strict order,
    so the list never depends on how topk breaks ties); entities without history are -inf."""
    counts = data.history.group_by("entity_id").agg(pl.col("n").sum()).sort(["n", "entity_id"], descending=[True, False])
    order = counts["entity_id"].to_numpy().copy()  # writable: torch indexes with it
    row = torch.full((data.n_items,), -torch.inf)
    row[torch.from_numpy(order)] = torch.arange(len(order), 0, -1, dtype=torch.float32)
    return lambda users: row.expand(len(users), -1).clone()


def popularity_topk(data: RetrievalData, k: int) -> Ranked:
    """The most popular entities; masked: the most popular ones the user has not had."""
    return rank_dense(popularity_scores(data), data.users, k, data.seen)


def item_neighbours(x: sp.csr_matrix, k: int, chunk: int = 2000) -> sp.csr_matrix:
    """Each item's ``k`` most cosine-similar items (itself included) as a sparse (I, I) matrix.

    cos(i, j) = |U_i ∩ U_j| / sqrt(|U_i| |U_j|) over the binary user-item matrix ``x``; rows are
    computed a chunk of items at a time and pruned at once, so the full item-item matrix never exists.
    """
    deg = np.asarray(x.sum(0)).ravel()
    xn = sp.csr_matrix(x @ sp.diags((1.0 / np.sqrt(np.maximum(deg, 1.0))).astype(np.float32)), dtype=np.float32)
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
    xn = sp.csr_matrix(x @ sp.diags((1.0 / np.sqrt(np.maximum(deg, 1.0))).astype(np.float32)), dtype=np.float32)
    x_t, xn_t = x.T.tocsr(), xn.T.tocsr()

    def score_all(users: np.ndarray) -> torch.Tensor:
        overlap = (xn[users] @ x_t).toarray()  # (n, n_users): x_u D^-1/2 Xᵀ
        s = torch.from_numpy(np.ascontiguousarray((xn_t @ overlap.T).T, dtype=np.float32))  # (n, I)
        s[:, never] = -torch.inf
        return s

    return score_all


def itemknn_topk(data: RetrievalData, k: int, neighbours: int = 20) -> Ranked:
    """Item-kNN top-k under both protocols (masked: the user's own history entities removed)."""
    return rank_dense(itemknn_scores(data, neighbours), data.users, k, data.seen)


def repeat_topk(data: RetrievalData, k: int) -> Ranked:
    """The user's own history, most frequent first (ties by id): the repeat-engagement reference.
    No masked list: every entity it ranks is one the masked protocol removes."""
    ranked = (
        data.history.join(pl.DataFrame({"user_id": data.users}), on="user_id", how="semi")
        .sort(["user_id", "n", "entity_id"], descending=[False, True, False])
        .group_by("user_id", maintain_order=True)
        .head(k)
        .group_by("user_id", maintain_order=True)
        .agg("entity_id")
    )
    lists = dict(zip(ranked["user_id"].to_list(), ranked["entity_id"].to_list()))
    out = np.full((len(data.users), k), -1, dtype=np.int64)
    for row, user in enumerate(data.users.tolist()):
        items = lists.get(user, [])
        out[row, : len(items)] = items
    return Ranked(out, None)


def profile_topk(data: RetrievalData, item_vecs: np.ndarray, has_vec: np.ndarray, k: int) -> Ranked:
    """Content arm: a user is the mean of their history entities' vectors; cosine top-k over
    entities that have a vector."""
    from hir_evaluation.content_source import user_profiles

    profiles, present = user_profiles(
        item_vecs, has_vec, data.history["user_id"].to_numpy(), data.history["entity_id"].to_numpy(), data.n_users
    )
    ranked = rank_dense(inner_product_scores(profiles, item_vecs, has_vec), data.users, k, data.seen)
    for top in (ranked.full, ranked.masked):
        top[~present[data.users]] = -1  # no history with text: nothing to retrieve from
    return ranked
