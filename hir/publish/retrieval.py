"""Candidate retrieval from the published version: an entity's embedding from Feast, its nearest
entities of a type from Milvus (optionally only those under given coarse tokens).

    from hir.publish.retrieval import Retriever
    r = Retriever.live("outputs/serving/rees46")
    r.for_user("512475445", "product", k=10)                   # [(product id, cosine), ...]
    r.for_user("512475445", "product", k=10, coarse_tokens=[3]) # only level-0 interest 3
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hir.errors import HirError
from hir.publish import milvus_store
from hir.serving import live_manifest


class Retriever:
    """Reads through one manifest (normally the live one, from ``<store_dir>/live.json``).

    Args:
        manifest: a publish manifest (``feast.repo_path``, ``feast.feature_views``,
            ``milvus.uri``, ``milvus.aliases``).
        search_params: Milvus search params; default: the ones published (``ef``).
    """

    def __init__(self, manifest: dict[str, Any], search_params: dict[str, Any] | None = None) -> None:
        from feast import FeatureStore

        self.manifest = manifest
        self.store = FeatureStore(repo_path=manifest["feast"]["repo_path"])
        self.client = milvus_store.connect(manifest["milvus"]["uri"])
        self.search_params = dict(search_params or manifest["milvus"].get("search_params") or {})
        self._loaded: set[str] = set()

    @classmethod
    def live(cls, store_dir: str | Path, search_params: dict[str, Any] | None = None) -> Retriever:
        return cls(live_manifest(Path(store_dir)), search_params)

    def _view(self, entity_type: str) -> str:
        views = self.manifest["feast"]["feature_views"]
        if entity_type not in views:
            raise HirError(f"entity type {entity_type!r} is not published; have {sorted(views)}")
        return views[entity_type]

    def embeddings(self, entity_type: str, ids: list[str]) -> np.ndarray:
        """(len(ids), dim) float32 embeddings from the Feast online store; unknown ids raise."""
        key = self.manifest["feast"]["entities"][entity_type]["join_key"]
        rows = self.store.get_online_features(
            features=[f"{self._view(entity_type)}:embedding"], entity_rows=[{key: i} for i in ids]
        ).to_dict()["embedding"]
        missing = [i for i, v in zip(ids, rows) if v is None]
        if missing:
            raise HirError(f"no {entity_type} embedding online for ids {missing[:5]} (version "
                           f"{self.manifest['version']!r}); unknown ids, or not yet refreshed")
        return np.asarray(rows, dtype=np.float32)

    def search(self, vectors: np.ndarray, entity_type: str, k: int = 10,
               coarse_tokens: list[int] | None = None) -> list[list[tuple[str, float]]]:
        """Top-``k`` (id, cosine) of ``entity_type`` for each row of ``vectors`` (n, dim), through
        the type's alias (the live collection); ``coarse_tokens`` filters on the level-0 token."""
        alias = self.manifest["milvus"]["aliases"].get(entity_type)
        if alias is None:
            raise HirError(f"entity type {entity_type!r} has no Milvus alias; have {sorted(self.manifest['milvus']['aliases'])}")
        if alias not in self._loaded:
            milvus_store.ensure_loaded(self.client, alias)
            self._loaded.add(alias)
        expr = f"coarse_token in {[int(t) for t in coarse_tokens]}" if coarse_tokens else ""
        hits = self.client.search(alias, data=np.atleast_2d(vectors).astype(np.float32).tolist(), limit=k,
                                  filter=expr, search_params={"params": self.search_params}, output_fields=["id"])
        return [[(h["id"], float(h["distance"])) for h in row] for row in hits]

    def for_user(self, user_id: str, entity_type: str = "product", k: int = 10,
                 coarse_tokens: list[int] | None = None) -> list[tuple[str, float]]:
        """The user's embedding (Feast) -> its top-``k`` entities of ``entity_type`` (Milvus)."""
        return self.search(self.embeddings("user", [user_id]), entity_type, k, coarse_tokens)[0]

    def close(self) -> None:
        """Close the Milvus client (and release a Milvus Lite dir for other processes)."""
        milvus_store.disconnect(self.client, self.manifest["milvus"]["uri"])
