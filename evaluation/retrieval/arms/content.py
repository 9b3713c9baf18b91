"""Content-only retrieval: a user is the mean content vector of their history entities."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from hir_evaluation.retrieval.data import RetrievalData
from hir_evaluation.retrieval.rank import Ranked, inner_product_scores, rank_dense
from hir_evaluation.retrieval.registry import ArmInfo, RetrievalContext
from hir_evaluation.sources.content import user_profiles


def profile_topk(data: RetrievalData, item_vecs: np.ndarray, has_vec: np.ndarray, k: int) -> Ranked:
    """Content arm: a user is the mean of their history entities' vectors; cosine top-k over
    entities that have a vector."""
    profiles, present = user_profiles(
        item_vecs, has_vec, data.history["user_id"].to_numpy(), data.history["entity_id"].to_numpy(), data.n_users
    )
    ranked = rank_dense(inner_product_scores(profiles, item_vecs, has_vec), data.users, k, data.seen,
                        deep=data.seen_deep)
    for top in ranked.lists():
        top[~present[data.users]] = -1  # no history with text: nothing to retrieve from
    return ranked


@dataclass(frozen=True)
class ContentProfile:
    """Cosine of the user's content profile (mean text vector of their history entities) and
    each entity's text vector, over entities with text."""

    info: ClassVar[ArmInfo] = ArmInfo(role="baseline", needs=("content",))

    def topk(self, ctx: RetrievalContext, k: int) -> Ranked:
        assert ctx.content is not None  # info.needs: not run without content vectors
        return profile_topk(ctx.test, *ctx.content, k)
