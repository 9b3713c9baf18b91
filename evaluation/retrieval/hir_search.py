"""The HIR retrieval search: each test user's published embedding searched against the entity
type's Milvus alias (production path), or exact cosine search over the export files (fallback).

Both give the three protocols of evaluation/retrieval/rank.py. The masked and deep-funnel ones from
Milvus: each user's search returns k + max(|history|, |target-stage history|) hits (rounded up, see
:func:`masked_limits`); the masked list drops the history entities from them and the deep list the
target-stage history entities, each keeping the first k, which is exactly the exact top-k of its
protocol when the index is exact (one search serves both: each drops at most as many hits as the
limit holds beyond k). The full list is the first k of the same hits (the limit is at least k), so
each user is searched once.

:class:`SharedSearch` runs that search once per test set at the deepest k any arm asks (the hir
arm's k, the recommend arm's discovery depth) and cuts it for each: with an exact index the first
k of a top-K list are the top-k (equal scores aside), so the figures are those of separate searches
(measured on completejourney's make-run export: Milvus Lite's FLAT search costs ~30 us a returned
hit, and the two arms' searches took 69 s and 81 s of `hir evaluate`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
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
        # one search per user: its first k hits are the full list (every limit is at least k)
        (masked_hits,), present = published_search(
            manifest, entity_type, _keys(snap, "user")[data.users].tolist(), [limits])
        key_to_id = {key: i for i, key in enumerate(_keys(snap, entity_type).tolist())}
        rows = np.flatnonzero(present)
        hits = [[key_to_id.get(key, -1) for key in keys] for keys in masked_hits]
        full = np.full((len(data.users), k), -1, dtype=np.int64)
        for row, ids in zip(rows, hits):
            full[row, : len(ids[:k])] = ids[:k]
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


def cut(ranked: Ranked, k: int) -> Ranked:
    """``ranked``'s lists cut to their first ``k`` columns (U, k)."""
    return Ranked(ranked.full[:, :k], None if ranked.masked is None else ranked.masked[:, :k], ranked.fit,
                  None if ranked.deep is None else ranked.deep[:, :k])


@dataclass
class SharedSearch:
    """``search`` run once per test set at ``depth`` (or the largest k asked, if deeper), each
    call answered with the first k columns. Exact for an exact index (FLAT; equal scores aside):
    the first k of a top-K list, masked or not, are the top-k. ``prefetched``: lists searched
    elsewhere (evaluation/retrieval/prefetch.py), asked first; None from it means search here."""

    search: TopK
    depth: int = 0
    prefetched: Callable[[RetrievalData, int], Ranked | None] | None = None
    _data: RetrievalData | None = field(default=None, repr=False)
    _ranked: Ranked | None = field(default=None, repr=False)

    def __call__(self, data: RetrievalData, k: int) -> Ranked:
        held = 0 if self._ranked is None else self._ranked.full.shape[1]
        if self._data is not data or held < k:
            want = max(k, self.depth)
            ranked = self.prefetched(data, want) if self.prefetched is not None else None
            self._ranked, self._data = (ranked if ranked is not None else self.search(data, want)), data
        assert self._ranked is not None
        return cut(self._ranked, k)


def hir_search(sources: Sources, depth: int = 0,
               prefetched: Callable[[RetrievalData, int], Ranked | None] | None = None) -> TopK | None:
    """The HIR search of ``sources`` (Milvus or exact search over the files), None without
    embeddings; searched once per test set at ``depth`` (at least) and shared by the arms;
    ``prefetched``: the Milvus lists the baselines' process searched (:class:`SharedSearch`)."""
    if sources.hir == "published":
        return SharedSearch(published_topk(sources.manifest, sources.snap, sources.entity_type), depth, prefetched)
    if sources.hir == "files":
        return SharedSearch(files_topk(sources.emb_dir, sources.snap, sources.entity_type), depth)
    return None
