"""Repeat: the user's own history, the reference point for repeat engagement."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import polars as pl

from hir_evaluation.retrieval.data import RetrievalData
from hir_evaluation.retrieval.rank import Ranked
from hir_evaluation.retrieval.registry import ArmInfo, RetrievalContext


def own_history_topk(history: pl.DataFrame, users: np.ndarray, k: int) -> np.ndarray:
    """(U, k): each user's entities of ``history`` (user_id, entity_id, n), most frequent first
    (ties by id), -1 padded."""
    ranked = (
        history.join(pl.DataFrame({"user_id": users}), on="user_id", how="semi")
        .sort(["user_id", "n", "entity_id"], descending=[False, True, False])
        .group_by("user_id", maintain_order=True)
        .head(k)
        .group_by("user_id", maintain_order=True)
        .agg("entity_id")
    )
    lists = dict(zip(ranked["user_id"].to_list(), ranked["entity_id"].to_list()))
    out = np.full((len(users), k), -1, dtype=np.int64)
    for row, user in enumerate(users.tolist()):
        items = lists.get(user, [])
        out[row, : len(items)] = items
    return out


def repeat_topk(data: RetrievalData, k: int) -> Ranked:
    """The user's own history, most frequent first (ties by id): the repeat-engagement reference.
    No masked list: every entity it ranks is one the masked protocol removes. Deep funnel: the
    same list without the user's target-stage history entities (what the protocol removes), so
    it is the user's not-yet-converted entities (carted, viewed) by how often they were engaged."""
    deep_history = data.history
    if data.deep_history is not None:
        deep_history = data.history.join(data.deep_history.select("user_id", "entity_id"),
                                         on=["user_id", "entity_id"], how="anti")
    return Ranked(own_history_topk(data.history, data.users, k), None,
                  deep=own_history_topk(deep_history, data.users, k))


@dataclass(frozen=True)
class Repeat:
    """The user's own past entities, most frequent first. Reported beside the baselines, never one
    of them: repeat engagement dominates grocery-like data."""

    info: ClassVar[ArmInfo] = ArmInfo(
        role="reference", no_masked="ranks only the user's history entities, which this protocol removes")

    def topk(self, ctx: RetrievalContext, k: int) -> Ranked:
        return repeat_topk(ctx.test, k)
