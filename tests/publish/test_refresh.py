"""`hir refresh` plumbing on REES46: the delta format (new entities + links + first events,
the same for every dataset) is checked against the snapshot; new rows are validated, pushed to
Feast online AND offline (point-in-time training data sees them from their timestamp) and
inserted into the live Milvus collection. The whole command on completejourney is in
test_refresh_cj.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import polars as pl
import pytest

from hir.data.snapshot import load_snapshot
from hir.errors import InputError
from hir.publish import refresh
from hir.publish import stage as publish
from hir.publish.delta import read_delta
from hir.serving import read_state
from hir.validate import stage as validate
from hir.validate.binding import sha256
from tests.conftest import REES46
from tests.publish.export_fixture import contract_rows, write_export
from tests.publish.fixtures import compose_at

NEW = ["990000001", "990000002", "990000003"]
EXPORT_TS = datetime(2026, 1, 1, tzinfo=UTC)

pytestmark = pytest.mark.skipif(not REES46.exists(), reason=f"needs {REES46}")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, rees46_graph: Path) -> SimpleNamespace:
    """rees46 prepared (a copy of the session's snapshot), exported (contract fixture), validated
    and published."""
    import shutil

    run = tmp_path_factory.mktemp("refresh") / "run"
    shutil.copytree(rees46_graph, run / "graph")  # refresh appends to its snapshot: a copy
    cfg = compose_at(run, data=("data=rees46",))
    write_export(run / "graph", run / "embeddings", version="v1", created=EXPORT_TS)
    validate.run(cfg)
    publish.run(cfg)
    store_dir = Path(cfg.publish.store_dir)
    manifest = read_state(store_dir)["versions"]["v1"]["manifest"]
    return SimpleNamespace(cfg=cfg, run=run, store_dir=store_dir, snap=load_snapshot(run / "graph"),
                           served=list(manifest["feast"]["feature_views"]))


def _write(path: Path, rows: list[dict]) -> Path:
    pl.DataFrame(rows, infer_schema_length=None).write_csv(path)
    return path


def test_a_delta_of_new_products_with_links_and_first_events(live, tmp_path: Path) -> None:
    """Three unseen products (text, price, brand, a category and a brand to link to, two with a
    first view), plus one row of a product the live version serves already."""
    nodes = pl.read_parquet(live.run / "graph" / "nodes" / "product.parquet")
    known = nodes["key"][0]
    delta = _write(tmp_path / "new_products.csv", [
        {"entity_id": NEW[0], "text": "samsung electronics > smartphone", "attr_price": "199.5",
         "attr_brand": "samsung", "category": "electronics.smartphone", "advertiser": "samsung"},
        {"entity_id": NEW[1], "text": "aqua appliances > environment > water_heater", "attr_price": "33.2",
         "category": "appliances.environment.water_heater", "advertiser": "aqua", "user_id": "541312140",
         "stage": "view", "timestamp": "2019-10-01 04:00:00 UTC"},
        {"entity_id": NEW[1], "user_id": "1", "stage": "cart", "timestamp": "2019-10-01 03:30:00"},
        {"entity_id": NEW[2], "text": "no-name accessories > bag", "category": "accessories.bag",
         "user_id": "2", "stage": "view", "timestamp": "1569902400"},  # epoch seconds: 2019-10-01 04:00 UTC
        {"entity_id": known, "text": "already served"},
    ])
    d = read_delta(delta, "product", live.served, live.snap)
    assert d.rows == 5 and set(d.entities) == {"product"}
    products = d.entities["product"].sort("key")
    assert products["key"].to_list() == sorted([*NEW, known])
    assert products.filter(pl.col("key") == NEW[0])["attr_price"].to_list() == [199.5]  # numeric, as in the snapshot
    seen = dict(zip(products["key"], products["first_seen"]))
    assert seen[NEW[0]] is None and seen[NEW[1]] == datetime(2019, 10, 1, 3, 30, tzinfo=UTC)  # the earliest event
    assert seen[NEW[2]] == datetime(2019, 10, 1, 4, 0, tzinfo=UTC)
    assert sorted(d.links["product"][NEW[0]]) == [("advertiser", "samsung"), ("category", "electronics.smartphone")]
    assert d.events.height == 3 and set(d.events["stage"]) == {"view", "cart"}

    manifest = read_state(live.store_dir)["versions"]["v1"]["manifest"]
    new, skipped = refresh.new_entities(d, manifest, live.store_dir)
    assert sorted(new["product"]["key"].to_list()) == NEW and skipped == {"product": 1}


@pytest.mark.parametrize(("rows", "message"), [
    ([{"id": "1"}], r"has no column 'entity_id'"),
    ([{"entity_id": "1", "colour": "red"}], r"has columns \['colour'\] that no entity type of the file takes"),
    ([{"entity_id": "1", "attr_size": "3"}], r"columns \['attr_size'\].*'product': \['attr_brand', 'attr_price'\]"),
    ([{"entity_id": "1", "category": "electronics.smartphone"}, {"entity_id": "2", "category": "no.such.thing"}],
     r"column category names category keys the snapshot does not have \['no.such.thing'\] at row 2;"
     r" link to existing category entities"),
    ([{"entity_id": "1", "attr_price": "cheap"}], r"column attr_price holds non-numbers \['cheap'\] at row 1"),
    ([{"entity_id": "1", "timestamp": "yesterday"}], r"column timestamp has unparseable values \['yesterday'\] at row 1"),
    ([{"entity_id": "1", "user_id": "7", "stage": "wishlist", "timestamp": "2019-10-01"}],
     r"column stage has \['wishlist'\] at row 1; the snapshot's stages are \['view', 'cart', 'purchase'\]"),
    ([{"entity_id": "1", "user_id": "7", "timestamp": "2019-10-01"}], r"events need all of user_id, stage and timestamp"),
    ([{"entity_id": "1", "text": "a"}, {"entity_id": "1", "text": "b"}],
     r"gives product '1' different text values .* at rows 1, 2"),
    ([{"entity_id": "1", "entity_type": "campaign"}], r"has \['campaign'\] entities at row 1, but the live version serves"),
    ([{"entity_id": "", "text": "x"}], r"column entity_id is empty at row 1"),
])
def test_bad_deltas_name_the_file_column_and_rows(live, tmp_path: Path, rows: list[dict], message: str) -> None:
    path = _write(tmp_path / "delta.csv", rows)
    with pytest.raises(InputError, match=message) as err:
        read_delta(path, "product", live.served, live.snap)
    assert str(path) in str(err.value)


def test_new_rows_are_served_online_offline_and_by_milvus(live) -> None:
    from feast import FeatureStore

    from hir.publish.retrieval import Retriever

    state = read_state(live.store_dir)
    manifest = state["versions"]["v1"]["manifest"]
    appeared = datetime(2026, 3, 1, tzinfo=UTC)
    rows = contract_rows(pl.Series(NEW), pl.Series([10_000 + i for i in range(3)]), pl.Series([True] * 3),
                         "product", dim=manifest["dim"], levels=manifest["levels"], top_k=manifest["top_k"],
                         version="v1", seed=[99], created=datetime.now(UTC))
    rows = rows.with_columns(pl.lit(appeared).cast(pl.Datetime("us", "UTC")).alias("event_timestamp"))
    record = refresh.refresh_rows(live.cfg, {"product": rows}, "delta.csv", state)
    assert record["rows"] == {"product": 3} and record["valid_from"] == {"product": appeared.isoformat()}
    assert record["sha256"]["product"] == sha256(Path(record["files"]["product"]))
    assert record["milvus"]["product"]["sha256"] == sha256(Path(record["milvus"]["product"]["file"]))

    live_manifest = read_state(live.store_dir)["versions"]["v1"]["manifest"]
    assert live_manifest["refreshes"][-1]["rows"] == {"product": 3}
    offline = Path(live_manifest["feast"]["offline_files"]["product"])
    assert live_manifest["feast"]["offline_sha256"]["product"] == sha256(offline)
    assert set(NEW) <= set(pl.read_parquet(offline, columns=["product_id"])["product_id"])
    store = FeatureStore(repo_path=live_manifest["feast"]["repo_path"])
    service = store.get_feature_service(live_manifest["feast"]["live_feature_service"])
    got = store.get_online_features(features=service, entity_rows=[{"user_id": "nobody", "product_id": p} for p in NEW],
                                    full_feature_names=True).to_dict()
    np.testing.assert_allclose(np.asarray(got["product__embedding"]), np.stack(rows["embedding"].to_numpy()), rtol=1e-6)
    assert got["product__tokens_l0"] == rows["tokens_l0"].to_list()

    # point in time: a training row before the entity appeared gets nothing, one after gets the features
    entity_df = pd.DataFrame({"user_id": ["nobody"] * 2, "product_id": [NEW[0]] * 2,
                              "event_timestamp": pd.to_datetime([appeared - timedelta(days=1),
                                                                 appeared + timedelta(days=1)], utc=True)})
    hist = store.get_historical_features(entity_df=entity_df, features=service, full_feature_names=True).to_df()
    hist = hist.sort_values("event_timestamp").reset_index(drop=True)
    assert hist["product__model_version"].tolist() == [None, "v1"]
    np.testing.assert_allclose(hist["product__embedding"][1], rows["embedding"][0].to_list(), rtol=1e-6)

    r = Retriever(live_manifest)
    try:
        hits = r.search(np.stack(rows["embedding"].to_numpy()), "product", k=1)
        assert [h[0][0] for h in hits] == NEW
    finally:
        r.close()

    # the same entities again: refused by validation, nothing pushed twice
    with pytest.raises(validate.ValidationFailed, match="not served by the live version yet"):
        refresh.refresh_rows(live.cfg, {"product": rows}, "delta.csv", read_state(live.store_dir))
    assert json.loads((live.store_dir / "live.json").read_text())["history"][-1]["event"] == "refresh"
    # the run's own manifest (what published v1) carries the refresh too
    run_manifest = json.loads((live.run / "publish" / "manifest.json").read_text())
    assert run_manifest["refreshes"][-1]["rows"] == {"product": 3} and run_manifest["status"] == "live"


def test_refresh_never_changes_an_existing_entitys_tokens(live, tmp_path: Path) -> None:
    """Issue 34: ids stay put. A delta that names a served product beside a new one skips the
    served one, and refreshing the new one leaves every served product's tokens as they were,
    offline (the Feast parquet) and online."""
    from feast import FeatureStore

    manifest = read_state(live.store_dir)["versions"]["v1"]["manifest"]
    offline = Path(manifest["feast"]["offline_files"]["product"])
    token_cols = [c for c in pl.read_parquet_schema(offline) if c.startswith("tokens_l")]
    assert token_cols, f"{offline} has no tokens_l<k> columns"
    before = pl.read_parquet(offline, columns=["product_id", *token_cols])
    known = before["product_id"].head(25).to_list()
    store = FeatureStore(repo_path=manifest["feast"]["repo_path"])
    service = store.get_feature_service(manifest["feast"]["live_feature_service"])

    def online_tokens() -> dict[str, list]:
        got = store.get_online_features(features=service, full_feature_names=True,
                                        entity_rows=[{"user_id": "nobody", "product_id": p} for p in known]).to_dict()
        return {c: got[f"product__{c}"] for c in token_cols}

    online_before = online_tokens()
    new_key = "990000031"
    delta = _write(tmp_path / "mixed.csv", [{"entity_id": new_key, "text": "acme garden > hose"},
                                            {"entity_id": known[0], "text": "a served product, renamed"}])
    new, skipped = refresh.new_entities(read_delta(delta, "product", live.served, live.snap), manifest, live.store_dir)
    assert new["product"]["key"].to_list() == [new_key] and skipped == {"product": 1}

    rows = contract_rows(pl.Series([new_key]), pl.Series([20_000]), pl.Series([True]), "product", dim=manifest["dim"],
                         levels=manifest["levels"], top_k=manifest["top_k"], version="v1", seed=[31],
                         created=datetime.now(UTC))
    refresh.refresh_rows(live.cfg, {"product": rows}, str(delta), read_state(live.store_dir))

    after = pl.read_parquet(offline, columns=["product_id", *token_cols])
    assert after.height == before.height + 1 and after["product_id"].to_list().count(new_key) == 1
    kept = after.filter(pl.col("product_id") != new_key)
    assert kept.sort("product_id").equals(before.sort("product_id"))
    assert online_tokens() == online_before
