"""The published HIR version as a consumer sees it: ``publish/manifest.json``, user vectors from
the Feast online store, and top-K search in Milvus by the entity type's alias."""

from __future__ import annotations

import json
import logging
import warnings
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


def published_search(
    manifest: dict[str, Any], entity_type: str, user_keys: list[str], k: int, batch: int = 100
) -> tuple[list[list[str]], np.ndarray]:
    """Each user's published embedding (Feast online) searched in the Milvus alias of
    ``entity_type`` through the publish stage's reader (:class:`hir.publish.retrieval.Retriever`).

    Returns (top-``k`` entity keys per user with an embedding, present (n_users,) bool).
    """
    with warnings.catch_warnings():  # feast's own import-time pydantic notices (STACK.md section 5)
        warnings.simplefilter("ignore", UserWarning)
        from hir.publish.retrieval import Retriever

        retriever = Retriever(manifest)
    try:
        vecs, present = online_vectors(retriever, "user", user_keys)
        hits: list[list[str]] = []
        queries = vecs[present]
        for start in range(0, len(queries), batch):
            hits += [[str(key) for key, _ in row] for row in retriever.search(queries[start : start + batch], entity_type, k)]
        return hits, present
    finally:
        retriever.close()
