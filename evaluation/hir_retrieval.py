"""The HIR retrieval arm: each test user's published embedding searched against the entity
type's Milvus alias (production path), or exact cosine search over the export files (fallback)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from hir_evaluation.hir_source import read_embeddings
from hir_evaluation.published import published_search
from hir_evaluation.retrieval import RetrievalData, TopK, topk_dense
from hir_evaluation.snapshot import Snapshot

log = logging.getLogger(__name__)


def _keys(snap: Snapshot, entity_type: str) -> np.ndarray:
    nodes = snap.nodes(entity_type).sort("node_id")
    return nodes["key"].cast(pl.String).to_numpy()


def published_topk(manifest: dict[str, Any], snap: Snapshot, entity_type: str) -> TopK:
    """User vectors from the Feast online store, top-k from Milvus by alias, keys mapped back to node ids."""

    def run(data: RetrievalData, k: int) -> np.ndarray:
        hits, present = published_search(manifest, entity_type, _keys(snap, "user")[data.users].tolist(), k)
        key_to_id = {key: i for i, key in enumerate(_keys(snap, entity_type).tolist())}
        out = np.full((len(data.users), k), -1, dtype=np.int64)
        for row, keys in zip(np.flatnonzero(present), hits):
            ids = [key_to_id.get(key, -1) for key in keys[:k]]
            out[row, : len(ids)] = ids
        log.info("hir retrieval (milvus): %d/%d test users have a published embedding", int(present.sum()), len(present))
        return out

    return run


def _vectors(emb_dir: Path, snap: Snapshot, entity_type: str) -> tuple[np.ndarray, np.ndarray]:
    """(n_nodes, d) latest exported vector per node (zeros when absent) and a presence mask."""
    emb = read_embeddings(emb_dir, entity_type).with_columns(pl.col("entity_id").cast(pl.String))
    emb = emb.sort("event_timestamp").unique(subset=["entity_id"], keep="last")
    nodes = snap.nodes(entity_type).select("node_id", pl.col("key").cast(pl.String).alias("entity_id"))
    joined = nodes.join(emb.select("entity_id", "embedding"), on="entity_id", how="inner")
    dim = int(joined["embedding"].list.len().max() or 1)
    out = np.zeros((snap.num_nodes(entity_type), dim), dtype=np.float32)
    has = np.zeros(len(out), dtype=bool)
    if joined.height:
        ids = joined["node_id"].to_numpy()
        out[ids] = joined["embedding"].cast(pl.List(pl.Float32)).list.to_array(dim).to_numpy()
        has[ids] = True
    return out, has


def files_topk(emb_dir: Path, snap: Snapshot, entity_type: str) -> TopK:
    """Exact inner-product top-k over ``embeddings/`` (vectors are L2-normalised, so cosine)."""

    def run(data: RetrievalData, k: int) -> np.ndarray:
        users, has_user = _vectors(emb_dir, snap, "user")
        items, has_item = _vectors(emb_dir, snap, entity_type)
        top = topk_dense(users[data.users], items, k, item_mask=has_item)
        top[~has_user[data.users]] = -1
        return top

    return run
