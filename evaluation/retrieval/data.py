"""The held-out sets every retrieval arm is scored on: test users, their relevant entities and
slices, and the history the arms learn from (the protocols: evaluation/retrieval/rank.py)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import polars as pl
import scipy.sparse as sp

from hir.data.snapshot import Snapshot
from hir.errors import HirError
from hir_evaluation.tasks import RetrievalTask


@dataclass
class RetrievalData:
    """users: (U,) test user ids; relevant / new_to_user / item_cold: per user sets of entity ids;
    history: (user_id, entity_id, n) pairs before the test period (history stages), the train
    data of every baseline and what the masked protocol removes; n_users / n_items: node counts;
    deep_history: the (user_id, entity_id, n) pairs of the target stage (e.g. purchases) in the
    same periods, what the deep-funnel protocol removes (None: nothing is removed)."""

    users: np.ndarray
    relevant: list[set[int]]
    new_to_user: list[set[int]]
    item_cold: list[set[int]]
    history: pl.DataFrame
    n_users: int
    n_items: int
    deep_history: pl.DataFrame | None = None

    @cached_property
    def repeat(self) -> list[set[int]]:
        """Per user, the relevant entities the user engaged with, at any stage, in an earlier
        period (relevant − new_to_user): the repeat / continuation slice."""
        return [r - n for r, n in zip(self.relevant, self.new_to_user, strict=True)]

    @cached_property
    def seen(self) -> sp.csr_matrix:
        """(n_users, n_items) binary CSR of the history pairs, by user id: the entities the masked
        protocol removes from each user's ranking."""
        return interaction_matrix(self.history, self.n_users, self.n_items)

    @cached_property
    def seen_deep(self) -> sp.csr_matrix:
        """(n_users, n_items) binary CSR of the target-stage history pairs, by user id: the
        entities the deep-funnel protocol removes (the user's past purchases; carts and views
        stay rankable). Empty without ``deep_history``."""
        if self.deep_history is None:
            return sp.csr_matrix((self.n_users, self.n_items), dtype=np.float32)
        return interaction_matrix(self.deep_history, self.n_users, self.n_items)

    def history_events(self) -> np.ndarray:
        """(U,) float64: each test user's history size (the events of ``history``, summed over its
        pairs); a user without history has 0."""
        counts = np.bincount(self.history["user_id"].to_numpy(), weights=self.history["n"].to_numpy(),
                             minlength=self.n_users)
        return counts[self.users]

    def few_events(self, max_events: int) -> np.ndarray:
        """(U,) bool: the test users whose history (:meth:`history_events`) has at most
        ``max_events`` events."""
        return self.history_events() <= max_events


def history_frame(
    snap: Snapshot, task: RetrievalTask, splits: list[str], stages: list[str] | None = None
) -> pl.DataFrame:
    """(user_id, entity_id, n) event counts of ``splits`` at ``stages`` (default: the task's
    history stages; none = every stage)."""
    ev = snap.events.filter((pl.col("entity_type") == task.entity_type) & pl.col("split").is_in(splits))
    stages = list(task.history_stages or []) if stages is None else stages
    if stages:
        ev = ev.filter(pl.col("stage").is_in(stages))
    return ev.group_by("user_id", "entity_id").agg(pl.len().cast(pl.Float64).alias("n"))


def retrieval_data(
    snap: Snapshot, task: RetrievalTask, split: str = "test", seed: int = 0, history_splits: list[str] | None = None
) -> RetrievalData:
    """Held-out sets of ``split`` (test, or val for early stopping with train as history).

    ``history_splits`` (default: every period before ``split``) is what the arms may learn
    from; "new to the user" is always judged against every earlier period. The deep-funnel
    protocol removes the target-stage pairs of the same periods as the history (``deep_history``).
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
        deep_history=history_frame(snap, task, hist_splits, [stage]),
    )


def interaction_matrix(history: pl.DataFrame, n_users: int, n_items: int) -> sp.csr_matrix:
    """Binary (n_users, n_items) CSR matrix of history pairs."""
    return sp.csr_matrix(
        (np.ones(history.height, dtype=np.float32), (history["user_id"].to_numpy(), history["entity_id"].to_numpy())),
        shape=(n_users, n_items),
    )
