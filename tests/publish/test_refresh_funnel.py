"""`hir refresh` and the open funnel (hir/publish/refresh_funnel.py): the users a delta adds events
for get their row recomputed point-in-time (snapshot + delta) and pushed online and offline; every
other user keeps the published row; a failure leaves the published rows in place."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import polars as pl
import pytest

from hir.data.snapshot import load_snapshot
from hir.publish import refresh
from hir.publish import stage as publish
from hir.publish.faults import FAIL_ENV, InjectedFailure
from hir.publish.refresh_funnel import funnel_rows
from hir.serving import read_state
from hir.validate import stage as validate
from hir.validate.binding import sha256
from tests.publish.export_fixture import contract_rows
from tests.publish.fixtures import funnel_run

NEW = "new-product-1"


@pytest.fixture(scope="module")
def live(tiny_graph: Path, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """Run ``r1`` validated and published, built once for this module (a publish costs ~10 s):
    the point-in-time test only reads it, and the push test fails a push, then makes it."""
    run = tmp_path_factory.mktemp("refresh_funnel") / "r1"
    cfg = funnel_run(tiny_graph, run, "r1")
    validate.run(cfg)
    publish.run(cfg)
    state = read_state(run.parent / "store")
    manifest = state["versions"][state["live"]]["manifest"]
    pairs = pl.read_parquet(run / "funnel" / "open_funnel.parquet")
    users = pl.read_parquet(run / "graph" / "nodes" / "user.parquet").sort("node_id")["key"]
    counts = pairs.group_by("user_id").len().sort(["len", "user_id"], descending=[True, False])
    busy, other = counts["user_id"][0], counts["user_id"][1]
    return SimpleNamespace(cfg=cfg, run=run, store_dir=run.parent / "store", manifest=manifest, pairs=pairs,
                           snap=load_snapshot(run / "graph"), user=users[busy], user_id=busy, other=users[other],
                           asof=datetime.fromisoformat(manifest["feast"]["funnel"]["asof"]))


def _delta(live: SimpleNamespace, at: datetime) -> pl.DataFrame:
    """The busy user carts the new product; a user the snapshot never saw views it."""
    return pl.DataFrame({"entity_type": ["product"] * 3, "entity_id": [NEW] * 3,
                         "user_id": [live.user, live.user, "brand-new-user"], "stage": ["view", "cart", "view"],
                         "timestamp": [at - timedelta(hours=1), at, at]}).with_columns(
        pl.col("timestamp").cast(pl.Datetime("us", "UTC")))


def _product_rows(live: SimpleNamespace, at: datetime) -> pl.DataFrame:
    m = live.manifest
    rows = contract_rows(pl.Series([NEW]), pl.Series([10_000]), pl.Series([True]), "product", dim=m["dim"],
                         levels=m["levels"], top_k=m["top_k"], version="r1", seed=[5], created=datetime.now(UTC))
    return rows.with_columns(pl.lit(at).cast(pl.Datetime("us", "UTC")).alias("event_timestamp"))


def _online(live: SimpleNamespace, *users: str) -> dict:
    from feast import FeatureStore

    store = FeatureStore(repo_path=live.manifest["feast"]["repo_path"])
    service = store.get_feature_service(live.manifest["feast"]["funnel"]["live_feature_service"])
    return store.get_online_features(features=service, entity_rows=[{"user_id": u} for u in users],
                                     full_feature_names=True).to_dict()


def test_rows_are_recomputed_point_in_time(live: SimpleNamespace) -> None:
    at = live.asof + timedelta(days=2)
    rows = funnel_rows(live.snap, live.manifest, _delta(live, at), datetime.now(UTC))
    assert sorted(rows["user_id"].to_list()) == sorted([live.user, "brand-new-user"])
    row = rows.filter(pl.col("user_id") == live.user).row(0, named=True)
    before = live.pairs.filter(pl.col("user_id") == live.user_id)
    assert row["funnel_pairs"] == before.height + 1 and NEW in row["funnel_entity"]
    assert row["event_timestamp"] == at
    # the snapshot's pairs keep their counts; their ages grew by the time since the cut-off
    keys = pl.read_parquet(live.run / "graph" / "nodes" / "product.parquet").sort("node_id")["key"]
    old = {keys[e]: (n, a) for e, n, a in before.select("entity_id", "n_events", "age_days").iter_rows()}
    grew = (at - live.asof).total_seconds() / 86_400
    for key, n, age in zip(row["funnel_entity"], row["funnel_n_events"], row["funnel_age_days"], strict=True):
        if key == NEW:
            assert n == 2 and age == pytest.approx(0.0, abs=1e-6)
        else:
            assert n == old[key][0] and age == pytest.approx(old[key][1] + grew, rel=1e-5)
    assert row["user_events"] == before["user_events"][0] + 2 and row["user_last_days"] == pytest.approx(0.0, abs=1e-6)


def test_a_failed_funnel_push_leaves_the_published_rows_then_the_push_replaces_the_delta_users_rows(
        live: SimpleNamespace) -> None:
    # one store for both halves: the failure must leave it exactly as published, so the push
    # that follows starts from the published rows
    at = live.asof + timedelta(days=1)
    offline = Path(live.manifest["feast"]["funnel"]["path"])
    sha, before = sha256(offline), _online(live, live.user)
    funnel = funnel_rows(live.snap, live.manifest, _delta(live, at), datetime.now(UTC))
    os.environ[FAIL_ENV] = "refresh_funnel"
    try:
        with pytest.raises(InjectedFailure):
            refresh.refresh_rows(live.cfg, {"product": _product_rows(live, at)}, "delta.csv",
                                 read_state(live.store_dir), None, funnel)
    finally:
        del os.environ[FAIL_ENV]
    after = _online(live, live.user)
    assert sha256(offline) == sha
    for col in ("open_funnel__funnel_entity", "open_funnel__funnel_pairs", "open_funnel__funnel_age_days"):
        assert after[col] == before[col]  # NaN-free columns (target_age_days holds NaN: never equal)
    assert read_state(live.store_dir)["versions"]["r1"]["manifest"].get("refreshes", []) == []

    at = live.asof + timedelta(days=2)
    before = _online(live, live.user, live.other)
    funnel = funnel_rows(live.snap, live.manifest, _delta(live, at), datetime.now(UTC))
    record = refresh.refresh_rows(live.cfg, {"product": _product_rows(live, at)}, "delta.csv",
                                  read_state(live.store_dir), None, funnel)
    assert record["funnel"]["users"] == 2
    after = _online(live, live.user, live.other, "brand-new-user")
    assert NEW in after["open_funnel__funnel_entity"][0]
    assert after["open_funnel__funnel_pairs"][0] == before["open_funnel__funnel_pairs"][0] + 1
    assert after["open_funnel__funnel_entity"][1] == before["open_funnel__funnel_entity"][1]  # not in the delta
    assert after["open_funnel__funnel_entity"][2] == [NEW]
    manifest = read_state(live.store_dir)["versions"]["r1"]["manifest"]
    offline = Path(manifest["feast"]["funnel"]["path"])
    assert manifest["feast"]["offline_sha256"]["open_funnel"] == sha256(offline)

    # point in time offline: the published row at the cut-off, the refreshed one from the delta on
    from feast import FeatureStore

    store = FeatureStore(repo_path=manifest["feast"]["repo_path"])
    entity_df = pd.DataFrame({"user_id": [live.user] * 2, "event_timestamp": [live.asof, at]})
    hist = store.get_historical_features(entity_df=entity_df, features=store.get_feature_service(
        manifest["feast"]["funnel"]["feature_service"]), full_feature_names=True).to_df()
    hist = hist.sort_values("event_timestamp").reset_index(drop=True)
    assert list(hist["open_funnel__funnel_entity"][0]) == before["open_funnel__funnel_entity"][0]
    assert list(hist["open_funnel__funnel_entity"][1]) == after["open_funnel__funnel_entity"][0]
