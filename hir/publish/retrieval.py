"""Candidate retrieval from the published version: an entity's embedding from Feast, its nearest
entities of a type from Milvus (optionally only those under given coarse tokens).

    from hir.publish.retrieval import Retriever
    r = Retriever.live("outputs/serving/rees46")
    r.for_user("512475445", "product", k=10)                   # [(product id, cosine), ...]
    r.for_user("512475445", "product", k=10, coarse_tokens=[3]) # only level-0 interest 3

Every read goes to the manifest's own version: its Feast views and its Milvus collections, never
the aliases or the unversioned service. Those pointers move in the switch just before
``live.json`` commits, so a publish killed in between leaves them ahead of the commit record;
a reader pinned to the manifest cannot see that, and :meth:`Retriever.live` also puts them back
(hir/publish/switch.py ``repair_on_read``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from hir.errors import HirError
from hir.publish import milvus_store
from hir.publish.exact import online_embeddings
from hir.serving import live_manifest


def _not_in(ids: list[str]) -> str:
    """A Milvus filter leaving out ``ids`` (JSON string literals: quotes and backslashes escaped)."""
    return f"id not in {json.dumps([str(i) for i in ids])}" if ids else ""


class Retriever:
    """Reads through one manifest (normally the live one, from ``<store_dir>/live.json``).

    Args:
        manifest: a publish manifest (``feast.repo_path``, ``feast.feature_views``,
            ``milvus.uri``, ``milvus.collections``).
        search_params: Milvus search params; default: the ones published (``ef``).
        store_dir: the serving store ``manifest`` was read from; when given, the aliases and the
            live service are put back to ``live.json`` if a killed publish left them ahead
            (``self.repaired`` lists what was). None: read only.
    """

    def __init__(self, manifest: dict[str, Any], search_params: dict[str, Any] | None = None,
                 store_dir: str | Path | None = None) -> None:
        from feast import FeatureStore

        self.manifest = manifest
        self.store = FeatureStore(repo_path=manifest["feast"]["repo_path"])
        self.client = milvus_store.connect(manifest["milvus"]["uri"])
        self.search_params = dict(search_params or manifest["milvus"].get("search_params") or {})
        self._loaded: set[str] = set()
        self.repaired: list[str] = []
        if store_dir is not None:
            from hir.publish.switch import repair_on_read

            self.repaired = repair_on_read(Path(store_dir), self.client, self.store)

    @classmethod
    def live(cls, store_dir: str | Path, search_params: dict[str, Any] | None = None) -> Retriever:
        """A reader of the version ``<store_dir>/live.json`` names (and the pointers put back to it)."""
        return cls(live_manifest(Path(store_dir)), search_params, store_dir=store_dir)

    def embeddings(self, entity_type: str, ids: list[str]) -> np.ndarray:
        """(len(ids), dim) float32 embeddings from the Feast online store; unknown ids raise."""
        return online_embeddings(self.store, self.manifest, entity_type, ids)

    def search(self, vectors: np.ndarray, entity_type: str, k: int = 10,
               coarse_tokens: list[int] | None = None,
               exclude: list[list[str]] | None = None) -> list[list[tuple[str, float]]]:
        """Top-``k`` (id, cosine) of ``entity_type`` for each row of ``vectors`` (n, dim), in the
        manifest's own collection of the type (not the alias, which a killed publish can leave
        ahead of live.json); ``coarse_tokens`` filters on the level-0 token; ``exclude[i]``: ids
        row ``i`` must not get (its history), left out inside Milvus so each row gets ``k`` hits
        in one search of limit ``k``. A filter holds for a whole call, so with ``exclude`` each
        row is its own search. Only ``id`` is fetched: the vectors stay in Milvus."""
        coll = self.manifest["milvus"]["collections"].get(entity_type)
        if coll is None:
            raise HirError(f"entity type {entity_type!r} has no Milvus collection in version "
                           f"{self.manifest['version']!r}; have {sorted(self.manifest['milvus']['collections'])}")
        if coll not in self._loaded:
            milvus_store.ensure_loaded(self.client, coll)
            self._loaded.add(coll)
        vectors = np.atleast_2d(vectors).astype(np.float32)
        base = f"coarse_token in {[int(t) for t in coarse_tokens]}" if coarse_tokens else ""
        if exclude is not None and len(exclude) != len(vectors):
            raise HirError(f"exclude has {len(exclude)} id lists for {len(vectors)} query vectors; give one per row")
        calls = [(vectors, base)] if exclude is None else [
            (vectors[i:i + 1], " and ".join(f for f in (base, _not_in(ids)) if f)) for i, ids in enumerate(exclude)]
        out: list[list[tuple[str, float]]] = []
        for rows, expr in calls:
            hits = self.client.search(coll, data=rows.tolist(), limit=k, filter=expr,
                                      search_params={"params": self.search_params}, output_fields=["id"])
            out += [[(h["id"], float(h["distance"])) for h in row] for row in hits]
        return out

    def for_user(self, user_id: str, entity_type: str = "product", k: int = 10,
                 coarse_tokens: list[int] | None = None) -> list[tuple[str, float]]:
        """The user's embedding (Feast) -> its top-``k`` entities of ``entity_type`` (Milvus)."""
        return self.search(self.embeddings("user", [user_id]), entity_type, k, coarse_tokens)[0]

    def close(self) -> None:
        """Close the Milvus client (and release a Milvus Lite dir for other processes)."""
        milvus_store.disconnect(self.client, self.manifest["milvus"]["uri"])
