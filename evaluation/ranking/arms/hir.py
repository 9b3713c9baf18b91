"""The HIR ranking arm: the user's and the entity's universal embeddings and their cosine, read
point-in-time from the published version (Feast) or the export files. Its token bags are the
``hir_tokens`` arm's (arms/hir_tokens.py), so the two lifts separate the vector from the tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import polars as pl

from hir_evaluation.ranking.features import RankerInputs, affinity
from hir_evaluation.sources.hir import HirSide
from hir_evaluation.sources.selection import Sources


def vector_blocks(user: HirSide, entity: HirSide) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(dense, vectors) blocks of the embeddings for :meth:`RankerInputs.with_blocks`: ``has_hir_user``,
    ``has_hir_entity`` (coverage, (n,)), ``hir_affinity`` (the cosine, (n,)) and the two (n, d) vectors."""
    dense = {"has_hir_user": user.present.astype(np.float32), "has_hir_entity": entity.present.astype(np.float32),
             "hir_affinity": affinity(user.vectors, entity.vectors)}
    return dense, {"hir_user": user.vectors, "hir_entity": entity.vectors}


@dataclass(frozen=True)
class HirFeatures:
    """The baseline plus the HIR embeddings of the user and the entity and their cosine."""

    needs: ClassVar[tuple[str, ...]] = ("hir",)

    def inputs(self, sources: Sources, rows: pl.DataFrame, base: RankerInputs) -> RankerInputs:
        user, entity = sources.hir_features(rows)
        dense, vectors = vector_blocks(user, entity)
        return base.with_blocks(dense, vectors, {})
