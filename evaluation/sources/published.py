"""The published HIR version as a consumer sees it: ``publish/manifest.json``, user vectors from
the Feast online store, and top-K search in Milvus by the entity type's alias."""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hir.errors import InputError

log = logging.getLogger(__name__)

REQUIRED = {
    "feast": ("repo_path", "feature_service", "feature_views"),
    "milvus": ("uri", "aliases"),
}


def load_manifest(publish_dir: Path) -> dict[str, Any] | None:
    """The manifest of ``publish_dir`` (None when nothing was published there), checked for the
    keys evaluation relies on (docs/contracts.md)."""
    path = Path(publish_dir) / "manifest.json"
    if not path.exists():
        return None
    manifest = json.loads(path.read_text())
    missing = [f"{sec}.{key}" for sec, keys in REQUIRED.items() for key in keys if key not in manifest.get(sec, {})]
    if "version" not in manifest:
        missing.insert(0, "version")
    if missing:
        raise InputError(f"{path} lacks {missing}; republish with `hir publish force=true`")
    return manifest


def online_vectors(retriever: Any, entity_type: str, keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Embeddings of ``keys`` from the Feast online store: ((n, d) float32 with zero rows for keys
    that have none, present (n,) bool). ``retriever`` is a :class:`hir.publish.retrieval.Retriever`."""
    manifest = retriever.manifest
    views = manifest["feast"]["feature_views"]
    if entity_type not in views:
        raise InputError(f"the published version has no {entity_type} feature view (views: {sorted(views)})")
    join_key = manifest["feast"]["entities"][entity_type]["join_key"]
    vecs = retriever.store.get_online_features(
        features=[f"{views[entity_type]}:embedding"], entity_rows=[{join_key: k} for k in keys]
    ).to_dict()["embedding"]
    present = np.array([v is not None and len(v) > 0 for v in vecs], dtype=bool)
    dim = len(next((v for v in vecs if v), [0.0]))
    out = np.zeros((len(keys), dim), dtype=np.float32)
    if present.any():
        out[present] = np.asarray([v for v in vecs if v], dtype=np.float32)
    return out, present


# Milvus' largest top-k per search (a server rejects more; Milvus Lite caps nothing, but the
# evaluation keeps to what a production server allows)
MILVUS_MAX_LIMIT = 16384
# graph indexes whose search returns fewer, and not the nearest, hits when the limit exceeds ef
# (measured on Milvus Lite 3.2.2, HNSW, 5000 vectors: limit 1000 at ef 128 gave recall 0.84 against
# exact search, at ef 1000 recall 1.0; limit 16384 at ef 128 returned only 1420 hits)
EF_INDEXES = ("HNSW", "HNSW_SQ", "HNSW_PQ", "HNSW_PRQ", "AUTOINDEX")


def search_params_for(manifest: dict[str, Any], limit: int) -> dict[str, Any]:
    """The published search params, with ``ef`` raised to ``limit`` for an HNSW-type index."""
    params = dict(manifest["milvus"].get("search_params") or {})
    index = str((manifest["milvus"].get("index") or {}).get("index_type", "")).upper()
    if index in EF_INDEXES:
        params["ef"] = max(int(params.get("ef", 0)), int(limit))
    return params


def grouped_search(
    search: Callable[[np.ndarray, int], list[list[str]]], queries: np.ndarray, limits: np.ndarray, batch: int = 100
) -> list[list[str]]:
    """Each query's top-``limits[i]`` keys through ``search(vectors (n, d), limit)``, one call per
    batch of up to ``batch`` queries that share a limit (so callers bucket the limits to keep
    the calls few). Returns the hit lists in query order."""
    limits = np.asarray(limits, dtype=np.int64)
    if len(limits) != len(queries):
        raise ValueError(f"{len(limits)} limits for {len(queries)} queries; expected one per query")
    out: list[list[str]] = [[] for _ in range(len(queries))]
    for limit in np.unique(limits):
        rows = np.flatnonzero(limits == limit)
        for start in range(0, len(rows), batch):
            part = rows[start : start + batch]
            for row, hits in zip(part, search(queries[part], int(limit))):
                out[row] = hits
    return out


def published_search(
    manifest: dict[str, Any], entity_type: str, user_keys: list[str], limits: Sequence[np.ndarray], batch: int = 100
) -> tuple[list[list[list[str]]], np.ndarray]:
    """Each user's published embedding (Feast online) searched in the Milvus alias of
    ``entity_type`` through the publish stage's reader (:class:`hir.publish.retrieval.Retriever`).

    Args:
        limits: one (n_users,) array of per-user hit counts per search wanted (e.g. k for
            everyone, and k + |history| for the masked protocol); each run shares the Feast read.
    Returns:
        (per entry of ``limits``: the top-limit entity keys of each user with an embedding, in
        user order; present (n_users,) bool).
    """
    with warnings.catch_warnings():  # feast's own import-time pydantic notices (STACK.md section 5)
        warnings.simplefilter("ignore", UserWarning)
        from hir.publish.retrieval import Retriever

        retriever = Retriever(manifest)
    try:
        vecs, present = online_vectors(retriever, "user", user_keys)
        queries = vecs[present]

        def search(q: np.ndarray, limit: int) -> list[list[str]]:
            # the reader's search params are per call here: ef must cover the limit (EF_INDEXES)
            retriever.search_params = search_params_for(manifest, limit)
            return [[str(key) for key, _ in row] for row in retriever.search(q, entity_type, limit)]

        runs = [grouped_search(search, queries, np.asarray(lim, dtype=np.int64)[present], batch) for lim in limits]
        return runs, present
    finally:
        retriever.close()
