"""The serving search path against Milvus Lite: what hir asks Milvus to build and to return.

A 300-row collection in a tmp dir: exact search must equal numpy's top-k (ids and cosine), the
configured build parameters must reach the index, the collection is flushed before the index is
built, and the serving search asks for the ids only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hir.publish import milvus_store
from hir.publish.retrieval import Retriever


def _payload(n: int = 300, dim: int = 17, seed: int = 0) -> dict[str, Any]:
    """Unit vectors ``[a s, sqrt(1 - a^2)]`` (HIR's geometry: the last coordinate carries the
    scale), ids ``p<i>``."""
    rng = np.random.default_rng(seed)
    s = rng.normal(size=(n, dim - 1)).astype(np.float32)
    s /= np.linalg.norm(s, axis=1, keepdims=True)
    a = np.clip(rng.lognormal(np.log(0.3), 0.8, n), 0.01, 1).astype(np.float32)[:, None]
    vecs = np.hstack([a * s, np.sqrt(1 - a**2)]).astype(np.float32)
    return {"ids": [f"p{i}" for i in range(n)], "vectors": vecs, "coarse": rng.integers(0, 4, n)}


@pytest.fixture
def lite(tmp_path: Path) -> Any:
    uri = str(tmp_path / "milvus.db")
    client = milvus_store.connect(uri)
    yield client, uri
    milvus_store.disconnect(client, uri)


def test_index_request_wraps_build_params_and_makes_lite_flat_a_faiss_scan() -> None:
    # pymilvus 3 would spread a flat dict into key-value pairs Milvus Lite never reads
    assert milvus_store.index_request("HNSW", "COSINE", {"M": 8}, lite=True)["params"] == {"params": {"M": 8}}
    assert milvus_store.index_request("FLAT", "COSINE", {}, lite=True) == {
        "field_name": "embedding", "index_type": "IVF_FLAT", "metric_type": "COSINE", "params": {"params": {"nlist": 1}}}
    # a server keeps its own FLAT
    assert milvus_store.index_request("FLAT", "COSINE", {}, lite=False)["index_type"] == "FLAT"
    assert milvus_store.index_request("IVF_FLAT", "IP", {"nlist": 64}, lite=False)["params"] == {"params": {"nlist": 64}}


def test_exact_search_equals_numpy(lite: Any) -> None:
    client, uri = lite
    data = _payload()
    cfg = {"index_type": "FLAT", "metric_type": "COSINE", "index_params": {}, "insert_batch": 128, "uri": uri}
    milvus_store.stage(client, "c", data, "product", "v1", cfg)
    info = client.describe_index("c", "embedding")
    assert (info["index_type"], info["params"]) == ("IVF_FLAT", {"nlist": 1})
    rng = np.random.default_rng(1)
    q = rng.normal(size=(5, data["vectors"].shape[1])).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    k = 25
    hits = client.search("c", data=q.tolist(), limit=k, search_params={"params": {}}, output_fields=["id"])
    sims = q @ data["vectors"].T  # (5, 300)
    for row, got in zip(sims, hits, strict=True):
        order = np.argsort(-row, kind="stable")[:k]
        assert [h["id"] for h in got] == [data["ids"][i] for i in order]
        np.testing.assert_allclose([h["distance"] for h in got], row[order], atol=1e-5)
    # a filter (discovery's history exclusion) keeps the search exact among the rest
    banned = [data["ids"][i] for i in np.argsort(-sims[0])[:10]]
    got = client.search("c", data=q[:1].tolist(), limit=k, filter=f"id not in {banned}",
                        search_params={"params": {}}, output_fields=["id"])[0]
    rest = [i for i in np.argsort(-sims[0], kind="stable") if data["ids"][i] not in banned][:k]
    assert [h["id"] for h in got] == [data["ids"][i] for i in rest]


def test_build_params_reach_milvus_lite(lite: Any) -> None:
    client, uri = lite
    cfg = {"index_type": "IVF_FLAT", "metric_type": "COSINE", "index_params": {"nlist": 3}, "insert_batch": 1000,
           "uri": uri}
    milvus_store.stage(client, "c", _payload(), "product", "v1", cfg)
    assert client.describe_index("c", "embedding")["params"] == {"nlist": 3}


def test_collection_is_flushed_before_the_index_is_built() -> None:
    """Rows left in Milvus Lite's memtable are brute-forced on every search, whatever the index."""
    calls: list[str] = []

    class Client:
        def flush(self, name: str) -> None:
            calls.append("flush")

        def prepare_index_params(self) -> Any:
            class Params:
                def add_index(self, **kw: Any) -> None:
                    calls.append(f"add_index {kw['index_type']}")
            return Params()

        def create_index(self, name: str, index: Any, sync: bool = True) -> None:
            calls.append(f"create_index sync={sync}")

        def describe_index(self, name: str, field: str) -> dict[str, Any]:
            return {"pending_index_rows": 0, "state": "Finished"}

    milvus_store.build_index(Client(), "c", "FLAT", "COSINE", {})
    # sync=False: hir polls the build itself (pymilvus would sleep 0.5 s before its first look)
    assert calls == ["flush", "add_index IVF_FLAT", "create_index sync=False"]


def test_serving_search_asks_for_ids_only() -> None:
    """Discovery needs the ids and the scores: the vectors and the other fields stay in Milvus."""
    seen: dict[str, Any] = {}

    class Client:
        def search(self, name: str, **kw: Any) -> list[list[dict[str, Any]]]:
            seen.update(kw, name=name)
            return [[{"id": "p1", "distance": 0.5}]]

    r = Retriever.__new__(Retriever)
    r.manifest = {"version": "v1", "milvus": {"collections": {"product": "c_v1"}}}
    r.client, r.search_params, r._loaded = Client(), {}, {"c_v1"}
    assert r.search(np.ones((1, 4), np.float32), "product", 3, exclude=[["p2", "p3"]]) == [[("p1", 0.5)]]
    assert seen["output_fields"] == ["id"] and seen["name"] == "c_v1" and seen["limit"] == 3
    assert seen["filter"] == 'id not in ["p2", "p3"]'
