"""The public-dataset adapters on the real files in ../shared/data (read there, never copied)."""

import json

import polars as pl
import pytest

from hir.data.prepare import run
from tests.conftest import REES46

pytestmark = pytest.mark.skipif(not REES46.exists(), reason="../shared/data is not beside the project")


def _graph(compose, *overrides):
    cfg = compose(*overrides, stage="prepare")
    meta = run(cfg)
    return meta, cfg


def test_rees46_reconciles_with_the_dataset_readme(rees46_graph):
    # the session's snapshot (tests/conftest.py), prepared with the default config
    meta = json.loads((rees46_graph / "meta.json").read_text())
    # README: 17,434 rows; 4,504 users; 6,493 products; 864 brands
    assert meta["input_rows"] == 17434 == meta["kept_rows"] + meta["quarantined_rows"]
    assert meta["nodes"]["user"] == 4504 and meta["nodes"]["product"] == 6493
    assert meta["nodes"]["advertiser"] == 864
    assert meta["stage_order"] == ["view", "cart", "purchase"]
    assert meta["sources"]["events"]["quarantine"] == {"duplicate_row": meta["quarantined_rows"]}
    assert sum(meta["stages"].values()) == meta["kept_rows"]
    cats = pl.read_parquet(rees46_graph / "nodes" / "category.parquet")
    assert "electronics.audio.headphone" in cats["key"].to_list()
    assert meta["category_levels"] >= 3


def test_online_retail_cancellations_and_non_products(compose):
    meta, cfg = _graph(compose, "data=online_retail")
    assert meta["input_rows"] == 541909 == meta["kept_rows"] + meta["quarantined_rows"]
    reasons = meta["sources"]["events"]["quarantine"]
    assert reasons["missing_user"] == 135080  # README: rows without CustomerID
    assert reasons["non_product_code"] > 0
    assert meta["stages"]["cancellation"] > 0 and meta["deep_stage"] == "purchase"
    ev = pl.scan_parquet(f"{cfg.paths.graph_dir}/events.parquet")
    products = pl.read_parquet(f"{cfg.paths.graph_dir}/nodes/product.parquet")
    assert products.filter(pl.col("key") == "POST").height == 0
    assert ev.filter(pl.col("quantity") <= 0).select(pl.len()).collect().item() == 0
    assert products["text"].null_count() < products.height * 0.05


@pytest.mark.slow
def test_completejourney_funnel(compose):
    """The whole default dataset (1.47M transactions, so slow); the adapter's funnel on a cut of
    the same tables is tests/data/test_completejourney.py, in the fast suite."""
    meta, cfg = _graph(compose, "data=completejourney")
    assert meta["stage_order"] == ["exposure", "coupon", "purchase"]
    # transactions 1,469,307 + campaigns 6,589 + coupon redemptions 2,102
    assert meta["input_rows"] == 1469307 + 6589 + 2102
    assert meta["input_rows"] == meta["kept_rows"] + meta["quarantined_rows"]
    assert meta["events"] == meta["kept_rows"] + sum(meta["derived_events"].values())
    assert meta["nodes"]["product"] == 92331 and meta["nodes"]["user"] == 2469 and meta["nodes"]["campaign"] == 27
    assert meta["stages"]["coupon"] == 2102
    for rel in ("product__in_category__category", "category__child_of__category", "product__by_advertiser__advertiser",
                "campaign__promotes__product", "user__engages__product", "user__engages__campaign"):
        assert meta["edges"][rel] > 0, rel
    users = pl.read_parquet(f"{cfg.paths.graph_dir}/nodes/user.parquet")
    assert users["attr_income"].drop_nulls().len() == 801  # demographics cover 801 households
