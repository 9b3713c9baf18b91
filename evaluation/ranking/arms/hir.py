"""The HIR ranking arm: user and entity embeddings, Bag-of-Meaning tokens and their affinity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import polars as pl

from hir_evaluation.ranking.features import RankerInputs, affinity
from hir_evaluation.sources.hir import HirSide, TokenBag
from hir_evaluation.sources.selection import Sources


def side_blocks(name: str, side: HirSide) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, TokenBag]]:
    """(dense, vectors, bags) blocks for :meth:`RankerInputs.with_blocks`."""
    dense = {f"has_{name}": side.present.astype(np.float32)}
    bags = {f"{name}_l{k}": bag for k, bag in enumerate(side.tokens)}
    return dense, {name: side.vectors}, bags


@dataclass(frozen=True)
class HirFeatures:
    """The baseline plus HIR features, point-in-time (Feast or the export files): the user's and
    the entity's embeddings, their token bags per hierarchy level and the cosine of the two."""

    needs: ClassVar[tuple[str, ...]] = ("hir",)

    def inputs(self, sources: Sources, rows: pl.DataFrame, base: RankerInputs) -> RankerInputs:
        user, entity = sources.hir_features(rows)
        du, vu, bu = side_blocks("hir_user", user)
        de, ve, be = side_blocks("hir_entity", entity)
        return base.with_blocks(du | de | {"hir_affinity": affinity(user.vectors, entity.vectors)}, vu | ve, bu | be)
