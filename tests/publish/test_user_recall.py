"""Publish's user-query sanity check: an index that finds every entity itself but misses users'
nearest entities (HNSW at a low ef on HIR's scale-in-the-last-coordinate geometry) is refused;
exact FLAT search passes with recall 1."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hir.errors import HirError
from hir.publish import milvus_store


def _geometry(n_items: int, n_users: int, dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Entities ``[a s, sqrt(1 - a^2)]`` with long-tailed scales a (median ~0.08, as measured on
    online_retail), users ``[s, 0]``."""
    rng = np.random.default_rng(seed)
    s = rng.normal(size=(n_items, dim)).astype(np.float32)
    s /= np.linalg.norm(s, axis=1, keepdims=True)
    a = np.clip(rng.lognormal(np.log(0.08), 1.0, n_items), 0, 1).astype(np.float32)[:, None]
    items = np.hstack([a * s, np.sqrt(1 - a**2)])
    u = rng.normal(size=(n_users, dim)).astype(np.float32)
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    users = np.hstack([u, np.zeros((n_users, 1), np.float32)])
    return items, users


@pytest.mark.parametrize("index", ["FLAT", "HNSW"])
def test_user_recall_gate(tmp_path: Path, index: str) -> None:
    items, users = _geometry(3000, 200, 32)
    data = {"ids": [f"p{i}" for i in range(len(items))], "vectors": items, "coarse": np.zeros(len(items), np.int64)}
    cfg = {"index_type": index, "metric_type": "COSINE", "insert_batch": 10000,
           # publish's defaults (before hir sent build params as Lite reads them, Lite built every
           # HNSW with these whatever was asked; M 8 / efConstruction 40 finds only 76% of selves)
           "index_params": {"M": 16, "efConstruction": 200} if index == "HNSW" else {}}
    uri = str(tmp_path / "milvus.db")
    client = milvus_store.connect(uri)
    try:
        milvus_store.stage(client, "c", data, "product", "v1", cfg)
        params = {"ef": 128} if index == "HNSW" else {}
        # self-queries pass (measured here: HNSW 0.86 at ef 128, while users get ~0.5 of their exact top-20)
        assert milvus_store.sanity_search(client, "c", data, 50, params, 0.8)["self_hit"] >= 0.8
        if index == "FLAT":
            out = milvus_store.user_recall(client, "c", users, data, 50, 20, {}, 0.9, cfg)
            assert out["user_recall@k"] == 1.0 and out["recall_k"] == 20 and out["user_queries"] == 50
        else:
            with pytest.raises(HirError, match=r"returns only .* of the exact top-20.*index_type=FLAT"):
                milvus_store.user_recall(client, "c", users, data, 50, 20, params, 0.9, cfg)
    finally:
        milvus_store.disconnect(client, uri)
