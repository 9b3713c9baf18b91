"""The Bag-of-Meaning ranking arm: the HIR arm's embeddings plus the user's and the entity's
tokens at every hierarchy level as sparse inputs (weighted EmbeddingBags, the way a production
ranker takes id lists), and per level the weight of the tokens the two share (what `hir explain`
lists for a pair)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import polars as pl

from hir_evaluation.ranking.arms.hir import vector_blocks
from hir_evaluation.ranking.features import RankerInputs
from hir_evaluation.sources.hir import TokenBag
from hir_evaluation.sources.selection import Sources


def shared_weight(user: TokenBag, entity: TokenBag) -> np.ndarray:
    """(n,) float32: Σ over tokens in both bags of w_user · w_entity (0 when none is shared),
    i.e. the inner product of the two weighted bags of one level."""
    same = user.ids[:, :, None] == entity.ids[:, None, :]  # (n, k_u, k_e)
    both = user.weights[:, :, None] * entity.weights[:, None, :]
    return (same * both).sum(axis=(1, 2)).astype(np.float32)


@dataclass(frozen=True)
class HirTokenFeatures:
    """The HIR arm plus, per level k: the user's and the entity's token bags (``hir_user_l<k>``,
    ``hir_entity_l<k>``) and their shared weight (``hir_shared_l<k>``)."""

    needs: ClassVar[tuple[str, ...]] = ("hir",)

    def inputs(self, sources: Sources, rows: pl.DataFrame, base: RankerInputs) -> RankerInputs:
        user, entity = sources.hir_features(rows)
        dense, vectors = vector_blocks(user, entity)
        bags: dict[str, TokenBag] = {}
        for k, (u, e) in enumerate(zip(user.tokens, entity.tokens)):
            bags |= {f"hir_user_l{k}": u, f"hir_entity_l{k}": e}
            dense[f"hir_shared_l{k}"] = shared_weight(u, e)
        return base.with_blocks(dense, vectors, bags)
