"""The content ranking arm: the entity's text vector and the user's content profile."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import ClassVar

import numpy as np
import polars as pl

from hir.data.snapshot import Snapshot
from hir_evaluation.ranking.features import RankerInputs, affinity
from hir_evaluation.sources.content import history_pairs, load_content, user_profiles
from hir_evaluation.sources.selection import Sources


def content_blocks(
    snap: Snapshot,
    content_dir: Path,
    rows: pl.DataFrame,
    entity_type: str,
    profile_cutoff: datetime,
    stages: list[str] | None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(dense, vectors) blocks of the content arm for ``rows``.

    The entity's own text vector is catalogue metadata (always known). The user profile averages
    the text of entities the user engaged with before ``profile_cutoff`` and is given only to rows
    at or after the cutoff (point-in-time, the same cutoff the HIR embeddings are trained to).
    """
    n_items = snap.num_nodes(entity_type)
    vecs, has = load_content(content_dir, entity_type, n_items)
    pairs = history_pairs(snap, entity_type, profile_cutoff, stages)
    profiles, has_profile = user_profiles(
        vecs, has, pairs["user_id"].to_numpy(), pairs["entity_id"].to_numpy(), snap.num_nodes("user")
    )
    uid, eid = rows["user_id"].to_numpy(), rows["entity_id"].to_numpy()
    visible = rows.select(pl.col("ts") >= pl.lit(profile_cutoff, pl.Datetime("us", "UTC"))).to_series().to_numpy()
    user_has = has_profile[uid] & visible
    user_vec = np.where(user_has[:, None], profiles[uid], 0.0).astype(np.float32)
    item_vec = vecs[eid]
    dense = {"has_content_entity": has[eid].astype(np.float32), "has_content_user": user_has.astype(np.float32),
             "content_affinity": affinity(user_vec, item_vec)}
    return dense, {"content_entity": item_vec, "content_user": user_vec}


@dataclass(frozen=True)
class ContentFeatures:
    """The baseline plus content features (:func:`content_blocks`); the user profile is cut at
    val_start, the end of the period the HIR model trains on."""

    needs: ClassVar[tuple[str, ...]] = ("content",)

    def inputs(self, sources: Sources, rows: pl.DataFrame, base: RankerInputs) -> RankerInputs:
        dense, vectors = content_blocks(sources.snap, sources.content_dir, rows, sources.entity_type,
                                        sources.snap.val_start, sources.history_stages)
        return base.with_blocks(dense, vectors, {})
