"""Popularity: the same list for everyone, entities by history event count."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import polars as pl
import torch

from hir_evaluation.retrieval.data import RetrievalData
from hir_evaluation.retrieval.rank import Ranked, Scores, rank_dense
from hir_evaluation.retrieval.registry import ArmInfo, RetrievalContext


def popularity_scores(data: RetrievalData) -> Scores:
    """The same scores for everyone: entities by history event count, ties by id (a strict order,
    so the list never depends on how topk breaks ties); entities without history are -inf."""
    counts = data.history.group_by("entity_id").agg(pl.col("n").sum()).sort(["n", "entity_id"], descending=[True, False])
    order = counts["entity_id"].to_numpy().copy()  # writable: torch indexes with it
    row = torch.full((data.n_items,), -torch.inf)
    row[torch.from_numpy(order)] = torch.arange(len(order), 0, -1, dtype=torch.float32)
    return lambda users: row.expand(len(users), -1).clone()


def popularity_topk(data: RetrievalData, k: int) -> Ranked:
    """The most popular entities; masked: the most popular ones the user has not had; deep: the
    most popular ones the user has not had at the target stage."""
    return rank_dense(popularity_scores(data), data.users, k, data.seen, deep=data.seen_deep)


@dataclass(frozen=True)
class Popularity:
    """The most popular entities of the history (event counts), masked: those the user has not had."""

    info: ClassVar[ArmInfo] = ArmInfo(role="baseline")

    def topk(self, ctx: RetrievalContext, k: int) -> Ranked:
        return popularity_topk(ctx.test, k)
