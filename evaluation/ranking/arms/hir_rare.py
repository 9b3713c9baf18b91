"""HIR in place of the id features of rare entities: the HIR arm's inputs, with the entity's id
(and, when set, the user's id) mapped to the shared "unknown" row of its table wherever it has at
most ``max_events`` events before the row's time. An id seen a handful of times has an
embedding row trained on a handful of labels, which the ranker memorises; production rankers map
such ids to one out-of-vocabulary row, and here the HIR vector speaks for them instead."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import polars as pl

from hir.errors import HirError
from hir_evaluation.ranking.arms.hir import vector_blocks
from hir_evaluation.ranking.features import RankerInputs
from hir_evaluation.sources.selection import Sources


def rare(base: RankerInputs, count: str, max_events: int) -> np.ndarray:
    """(n,) bool: rows whose prior event count (base dense ``count``, stored as log1p) is at most ``max_events``."""
    return np.expm1(base.dense[:, base.dense_names.index(count)]) <= max_events + 0.5


@dataclass(frozen=True)
class HirForRareIds:
    """Args:
    max_events: an entity with at most this many events (any stage) before the row's time loses
        its id feature (point-in-time, as the baseline's ``entity_n`` counts them).
    user_max_events: the same for the user id; negative = user ids are kept.
    """

    max_events: int = 20
    user_max_events: int = -1
    needs: ClassVar[tuple[str, ...]] = ("hir",)

    def inputs(self, sources: Sources, rows: pl.DataFrame, base: RankerInputs) -> RankerInputs:
        user, entity = sources.hir_features(rows)
        dense, vectors = vector_blocks(user, entity)
        sparse = base.sparse.copy()
        for column, count, limit in (("entity", "entity_n", self.max_events), ("user", "user_n", self.user_max_events)):
            if limit < 0:
                continue
            if column not in base.sparse_names:
                raise HirError(f"eval.ranking: the baseline has no {column!r} id column (has {base.sparse_names})")
            mask = rare(base, count, limit)
            sparse[mask, base.sparse_names.index(column)] = 0
            dense[f"rare_{column}_id"] = mask.astype(np.float32)
        out = base.with_blocks(dense, vectors, {})
        out.sparse = sparse
        return out
