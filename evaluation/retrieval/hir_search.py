"""The HIR retrieval search: each test user's published embedding searched against the entity
type's Milvus alias (production path), or exact cosine search over the export files (fallback).

Both give the three protocols of evaluation/retrieval/rank.py. The masked and deep-funnel ones from
Milvus: each user's search returns k + max(|history|, |target-stage history|) hits (rounded up, see
:func:`masked_limits`); the masked list drops the history entities from them and the deep list the
target-stage history entities, each keeping the first k, which is exactly the exact top-k of its
protocol when the index is exact (one search serves both: each drops at most as many hits as the
limit holds beyond k).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import scipy.sparse as sp

from hir.data.snapshot import Snapshot
from hir_evaluation.retrieval.data import RetrievalData
from hir_evaluation.retrieval.rank import Ranked, TopK, inner_product_scores, rank_dense
from hir_evaluation.sources.hir import read_embeddings
from hir_evaluation.sources.published import MILVUS_MAX_LIMIT, published_search
from hir_evaluation.sources.selection import Sources

log = logging.getLogger(__name__)


def _keys(snap: Snapshot, entity_type: str) -> np.ndarray:
    nodes = snap.nodes(entity_type).sort("node_id")
    return nodes["key"].cast(pl.String).to_numpy()


def masked_limits(k: int, history_sizes: np.ndarray, cap: int = MILVUS_MAX_LIMIT) -> np.ndarray:
    """(U,) Milvus limits for the masked protocol: k + |history_u| rounded up to a quarter-octave
    step (at most four distinct limits per doubling, so users share search calls while fetching
    at most 25% more hits than needed), capped at ``cap``."""
    need = k + np.asarray(history_sizes, dtype=np.int64)
    step = np.maximum(1, 2 ** np.floor(np.log2(np.maximum(need, 1))).astype(np.int64) // 4)
    return np.minimum(-(-need // step) * step, cap)


def drop_seen(hits: list[list[int]], seen_rows: sp.csr_matrix, k: int) -> np.ndarray:
    """(U, k): each row of ``hits`` (entity ids, best first) without the entities of the user's
    row in ``seen_rows`` (U, I), cut to k (-1 pads)."""
    out = np.full((len(hits), k), -1, dtype=np.int64)
    for row, ids in enumerate(hits):
        seen = set(seen_rows.indices[seen_rows.indptr[row] : seen_rows.indptr[row + 1]].tolist())
        kept = [i for i in ids if i not in seen][:k]
        out[row, : len(kept)] = kept
    return out


def published_topk(manifest: dict[str, Any], snap: Snapshot, entity_type: str) -> TopK:
    """User vectors from the Feast online store, top-k from Milvus by alias, keys mapped back to
    node ids; masked: k + |history| hits per user with the history entities dropped; deep: the
    same hits with the target-stage history entities dropped."""

    def run(data: RetrievalData, k: int) -> Ranked:
        seen = data.seen[data.users]  # (U, I)
        seen_deep = data.seen_deep[data.users]  # (U, I)
        sizes = np.maximum(np.diff(seen.indptr), np.diff(seen_deep.indptr))
        limits = masked_limits(k, sizes)
        short = int((k + sizes > MILVUS_MAX_LIMIT).sum())
        if short:
            log.warning("hir retrieval (milvus): %d users have more than %d history entities; their masked / deep lists "
                        "may hold fewer than %d entities", short, MILVUS_MAX_LIMIT - k, k)
        (full_hits, masked_hits), present = published_search(
            manifest, entity_type, _keys(snap, "user")[data.users].tolist(), [np.full(len(data.users), k), limits])
        key_to_id = {key: i for i, key in enumerate(_keys(snap, entity_type).tolist())}
        rows = np.flatnonzero(present)
        full = np.full((len(data.users), k), -1, dtype=np.int64)
        for row, keys in zip(rows, full_hits):
            ids = [key_to_id.get(key, -1) for key in keys[:k]]
            full[row, : len(ids)] = ids
        hits = [[key_to_id.get(key, -1) for key in keys] for keys in masked_hits]
        masked = np.full((len(data.users), k), -1, dtype=np.int64)
        masked[rows] = drop_seen(hits, seen[rows], k)
        deep = np.full((len(data.users), k), -1, dtype=np.int64)
        deep[rows] = drop_seen(hits, seen_deep[rows], k)
        log.info("hir retrieval (milvus): %d/%d test users have a published embedding; masked searches at %d "
                 "limits (up to %d)", int(present.sum()), len(present), len(set(limits.tolist())), int(limits.max(initial=0)))
        return Ranked(full, masked, deep=deep)

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
    """Exact inner-product top-k over ``embeddings/`` (vectors are L2-normalised, so cosine),
    every protocol from one scoring pass."""

    def run(data: RetrievalData, k: int) -> Ranked:
        users, has_user = _vectors(emb_dir, snap, "user")
        items, has_item = _vectors(emb_dir, snap, entity_type)
        ranked = rank_dense(inner_product_scores(users, items, has_item), data.users, k, data.seen,
                            deep=data.seen_deep)
        for top in ranked.lists():
            top[~has_user[data.users]] = -1
        return ranked

    return run


def hir_search(sources: Sources) -> TopK | None:
    """The HIR search of ``sources`` (Milvus or exact search over the files), None without embeddings."""
    if sources.hir == "published":
        return published_topk(sources.manifest, sources.snap, sources.entity_type)
    if sources.hir == "files":
        return files_topk(sources.emb_dir, sources.snap, sources.entity_type)
    return None
