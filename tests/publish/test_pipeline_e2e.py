"""End to end on real REES46 data with the real model (minutes, so `slow`): prepare -> enrich ->
train (1 short epoch) -> export -> validate -> publish, then `hir refresh` adds unseen products
that Feast and Milvus serve afterwards."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.conftest import REES46, run_hir

pytestmark = pytest.mark.slow

NEW = [f"99000000{i}" for i in range(4)]


def test_pipeline_publishes_and_refresh_serves_new_products(tmp_path: Path) -> None:
    run, store = tmp_path / "run", tmp_path / "store"
    common = [f"hydra.run.dir={run}", f"paths.cache_dir={tmp_path}/.cache", f"publish.store_dir={store}",
              "data=rees46", "trainer.max_epochs=1", "datamodule.seeds_per_epoch=2048"]
    proc = run_hir("pipeline", "pipeline.stages=[prepare,enrich,train,export,validate,publish]", *common,
                   cwd=tmp_path, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    manifest = json.loads((run / "publish" / "manifest.json").read_text())
    assert json.loads((run / "validation" / "result.json").read_text())["success"]
    assert manifest["version"] == json.loads((run / "embeddings" / "meta.json").read_text())["model_version"]

    with gzip.open(REES46, "rt") as fh:
        rows = [r for _, r in zip(range(100), csv.DictReader(fh)) if r["brand"] and r["category_code"]][: len(NEW)]
    # the documented delta (docs/serving.md "Serving new entities"): content columns, links, a first view
    delta = tmp_path / "new_products.csv"
    with delta.open("w", newline="") as fh:
        out = csv.DictWriter(fh, fieldnames=["entity_id", "text", "attr_price", "attr_brand", "category", "advertiser",
                                             "user_id", "stage", "timestamp"])
        out.writeheader()
        texts = {pid: f"{r['brand']} {r['category_code'].replace('.', ' > ')}" for r, pid in zip(rows, NEW)}
        out.writerows({"entity_id": pid, "text": texts[pid],
                       "attr_price": r["price"], "attr_brand": r["brand"], "category": r["category_code"],
                       "advertiser": r["brand"], "user_id": r["user_id"], "stage": "view", "timestamp": r["event_time"]}
                      for r, pid in zip(rows, NEW))
    proc = run_hir("refresh", f"refresh.delta_path={delta}", *common, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "with {'product': 4} new entities" in proc.stdout + proc.stderr

    from hir.publish.retrieval import Retriever

    r = Retriever.live(store)
    try:
        z = r.embeddings("product", NEW)  # from the Feast online store
        assert z.shape == (len(NEW), manifest["dim"]) and np.allclose(np.linalg.norm(z, axis=1), 1, atol=1e-3)
        # Milvus, through the alias: each new product is its own nearest hit, or ties with the
        # products of the same text that export placed at the same point (its content twins: up
        # to ~100 in rees46, so the search is deep enough to hold them all)
        nodes = pl.read_parquet(run / "graph" / "nodes" / "product.parquet", columns=["key", "text"])
        twins = {pid: set(nodes.filter(pl.col("text") == text)["key"].cast(pl.String)) for pid, text in texts.items()}
        k = 5 + max(len(t) for t in twins.values())
        for key, hits in zip(NEW, r.search(z, "product", k=k)):
            keys, scores = [h[0] for h in hits], [h[1] for h in hits]
            assert key in keys and scores[keys.index(key)] >= scores[0] - 1e-5, (key, len(twins[key]), hits[:10])
            assert set(keys[:keys.index(key)]) <= twins[key], (key, hits[:10])  # only twins rank before it
        assert r.manifest["refreshes"][-1]["rows"] == {"product": len(NEW)}
    finally:
        r.close()
