"""Retrieval lift: top-K entities per test user, scored on held-out deep-funnel events.

Every arm sees the same history (events before the test period), the same users and the same
candidate catalogue (every node of the entity type); none filters out a user's past entities,
so repeat engagement counts for all arms alike. Slices: held-out entities new to the user (no
event of any stage with it before the test period) and item-cold ones (first event in the test
period).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

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
    data of every baseline; n_users / n_items: node counts."""

    users: np.ndarray
    relevant: list[set[int]]
    new_to_user: list[set[int]]
    item_cold: list[set[int]]
    history: pl.DataFrame
    n_users: int
    n_items: int


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


def score_arm(topk: np.ndarray, data: RetrievalData, ks: tuple[int, ...]) -> dict[str, dict[str, float]]:
    """recall@K / NDCG@K overall and per slice for one arm's (U, Kmax) top-K ids."""
    return {
        "all": recall_ndcg_at_k(topk, data.relevant, ks),
        "new_to_user": recall_ndcg_at_k(topk, data.new_to_user, ks),
        "item_cold": recall_ndcg_at_k(topk, data.item_cold, ks),
    }


def topk_ids(scores: torch.Tensor, k: int) -> np.ndarray:
    """(U, k) ids of the highest scores per row, best first; -1 pads rows with fewer than k
    finite scores (a catalogue smaller than k, or items excluded with -inf)."""
    kk = min(k, scores.shape[1])
    values, ids = torch.topk(scores, kk, dim=1)
    ids = ids.numpy().astype(np.int64)
    ids[~torch.isfinite(values).numpy()] = -1
    return np.pad(ids, ((0, 0), (0, k - kk)), constant_values=-1)


def topk_dense(
    user_vecs: np.ndarray, item_vecs: np.ndarray, k: int, chunk: int = 512, item_mask: np.ndarray | None = None
) -> np.ndarray:
    """Exact top-k by inner product: user_vecs (U, d) x item_vecs (I, d) -> (U, k) item ids.

    ``item_mask`` (I,) False excludes items (e.g. without a vector) from every list.
    """
    items = torch.from_numpy(np.ascontiguousarray(item_vecs, dtype=np.float32))
    out = []
    for start in range(0, user_vecs.shape[0], chunk):
        scores = torch.from_numpy(np.ascontiguousarray(user_vecs[start : start + chunk], dtype=np.float32)) @ items.T
        if item_mask is not None:
            scores[:, ~torch.from_numpy(item_mask)] = -torch.inf
        out.append(topk_ids(scores, k))
    return np.concatenate(out) if out else np.zeros((0, k), dtype=np.int64)


def interaction_matrix(history: pl.DataFrame, n_users: int, n_items: int) -> sp.csr_matrix:
    """Binary (n_users, n_items) CSR matrix of history pairs."""
    return sp.csr_matrix(
        (np.ones(history.height, dtype=np.float32), (history["user_id"].to_numpy(), history["entity_id"].to_numpy())),
        shape=(n_users, n_items),
    )


def popularity_topk(data: RetrievalData, k: int) -> np.ndarray:
    """The same list for everyone: entities by history event count (ties by id)."""
    counts = data.history.group_by("entity_id").agg(pl.col("n").sum()).sort(["n", "entity_id"], descending=[True, False])
    top = counts["entity_id"].head(k).to_numpy()
    top = np.pad(top, (0, k - len(top)), constant_values=-1)
    return np.tile(top, (len(data.users), 1))


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


def itemknn_topk(data: RetrievalData, k: int, neighbours: int = 100, chunk: int = 256) -> np.ndarray:
    """Item-based CF: score(u, j) = Σ_{i ∈ hist(u)} cos(i, j) over each item's ``neighbours`` most
    similar items (0 = every co-occurring item, cheaper but popularity-dominated)."""
    x = interaction_matrix(data.history, data.n_users, data.n_items)
    deg = np.asarray(x.sum(0)).ravel()
    never = torch.from_numpy(deg == 0)
    out = []
    if neighbours > 0:
        sim = item_neighbours(x, neighbours)
        for start in range(0, len(data.users), chunk):
            scores = torch.from_numpy((x[data.users[start : start + chunk]] @ sim).toarray().astype(np.float32))
            scores[:, never] = -torch.inf  # never-interacted items have no neighbours
            out.append(topk_ids(scores, k))
        return np.concatenate(out)
    # full neighbourhood as (x_u D^-1/2 Xᵀ)(X D^-1/2), never forming the item-item matrix
    xn = sp.csr_matrix(x @ sp.diags((1.0 / np.sqrt(np.maximum(deg, 1.0))).astype(np.float32)), dtype=np.float32)
    x_t, xn_t = x.T.tocsr(), xn.T.tocsr()
    for start in range(0, len(data.users), chunk):
        overlap = (xn[data.users[start : start + chunk]] @ x_t).toarray()  # (chunk, n_users): x_u D^-1/2 Xᵀ
        scores = torch.from_numpy(np.ascontiguousarray((xn_t @ overlap.T).T, dtype=np.float32))  # (chunk, n_items)
        scores[:, never] = -torch.inf
        out.append(topk_ids(scores, k))
    return np.concatenate(out)


def repeat_topk(data: RetrievalData, k: int) -> np.ndarray:
    """The user's own history, most frequent first (ties by id): the repeat-engagement baseline."""
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
    return out


def profile_topk(data: RetrievalData, item_vecs: np.ndarray, has_vec: np.ndarray, k: int) -> np.ndarray:
    """Content arm: a user is the mean of their history entities' vectors; cosine top-k over
    entities that have a vector."""
    from hir_evaluation.content_source import user_profiles

    profiles, present = user_profiles(
        item_vecs, has_vec, data.history["user_id"].to_numpy(), data.history["entity_id"].to_numpy(), data.n_users
    )
    top = topk_dense(profiles[data.users], item_vecs, k, item_mask=has_vec)
    top[~present[data.users]] = -1  # no history with text: nothing to retrieve from
    return top


# an arm: test data, k -> (U, k) entity ids, best first (-1 = empty slot)
TopK = Callable[[RetrievalData, int], np.ndarray]
