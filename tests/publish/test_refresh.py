"""`hir refresh` plumbing: new entities read from a delta in the dataset's own format (REES46
events CSV), validated, pushed to Feast (ONLINE) and inserted into the live Milvus collection."""

from __future__ import annotations

import csv
import gzip
import json
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest

from hir.publish import refresh
from hir.publish import stage as publish
from hir.publish.live import read_state
from hir.validate import stage as validate
from tests.conftest import REES46
from tests.publish.conftest import compose_at
from tests.publish.export_fixture import contract_rows, write_export

NEW = ["990000001", "990000002", "990000003"]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """rees46 prepared, exported (contract fixture), validated and published."""
    from hir.data import prepare

    run = tmp_path_factory.mktemp("refresh") / "run"
    cfg = compose_at(run, data=("data=rees46",))
    prepare.run(cfg)
    write_export(run / "graph", run / "embeddings", version="v1", created=datetime(2026, 1, 1, tzinfo=UTC))
    validate.run(cfg)
    publish.run(cfg)
    # a delta in the dataset's format: three views of products the snapshot never saw, of a
    # known brand and category, plus one row of an already-served product
    with gzip.open(REES46, "rt") as fh:
        rows = [r for _, r in zip(range(50), csv.DictReader(fh)) if r["brand"] and r["category_code"]]
    delta = run.parent / "new_products.csv"
    with delta.open("w", newline="") as fh:
        out = csv.DictWriter(fh, fieldnames=list(rows[0]))
        out.writeheader()
        for pid, row in zip([*NEW, rows[3]["product_id"]], rows):
            out.writerow({**row, "product_id": pid})
    return SimpleNamespace(cfg=cfg, run=run, delta=delta, store_dir=Path(cfg.publish.store_dir))


def test_delta_is_read_with_the_dataset_adapter_and_only_unseen_entities_are_new(live) -> None:
    cfg = compose_at(live.run, f"refresh.delta_path={live.delta}", data=("data=rees46",))
    raw = refresh.read_delta(cfg, live.run / "publish" / "refresh")
    manifest = read_state(live.store_dir)["versions"]["v1"]["manifest"]
    new = refresh.new_entities(raw, manifest, live.store_dir)
    assert set(new) == {"product"} and sorted(new["product"]["key"].to_list()) == NEW
    assert new["product"]["text"].null_count() == 0  # brand + category path, for the content encoder


def test_new_rows_are_served_by_feast_and_milvus_then_recorded(live) -> None:
    from feast import FeatureStore

    from hir.publish.retrieval import Retriever

    state = read_state(live.store_dir)
    manifest = state["versions"]["v1"]["manifest"]
    rows = contract_rows(pl.Series(NEW), pl.Series([10_000 + i for i in range(3)]), pl.Series([True] * 3),
                         "product", dim=manifest["dim"], levels=manifest["levels"], top_k=manifest["top_k"],
                         version="v1", seed=[99], created=datetime.now(UTC))
    record = refresh.refresh_rows(live.cfg, {"product": rows}, str(live.delta), state)
    assert record["rows"] == {"product": 3}

    live_manifest = read_state(live.store_dir)["versions"]["v1"]["manifest"]
    assert live_manifest["refreshes"][-1]["rows"] == {"product": 3}
    store = FeatureStore(repo_path=live_manifest["feast"]["repo_path"])
    got = store.get_online_features(features=store.get_feature_service(live_manifest["feast"]["live_feature_service"]),
                                    entity_rows=[{"user_id": "nobody", "product_id": p} for p in NEW],
                                    full_feature_names=True).to_dict()
    np.testing.assert_allclose(np.asarray(got["product__embedding"]), np.stack(rows["embedding"].to_numpy()), rtol=1e-6)
    assert got["product__tokens_l0"] == rows["tokens_l0"].to_list()

    r = Retriever(live_manifest)
    try:
        hits = r.search(np.stack(rows["embedding"].to_numpy()), "product", k=1)
        assert [h[0][0] for h in hits] == NEW
    finally:
        r.close()

    # the same entities again: refused by validation, nothing pushed twice
    with pytest.raises(validate.ValidationFailed, match="not served by the live version yet"):
        refresh.refresh_rows(live.cfg, {"product": rows}, str(live.delta), read_state(live.store_dir))
    assert json.loads((live.store_dir / "live.json").read_text())["history"][-1]["event"] == "refresh"
