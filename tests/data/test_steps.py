from datetime import UTC, datetime

import polars as pl
import pytest

from hir.data import steps
from hir.data.schema import TS


def _ts(*hours: int) -> pl.Series:
    return pl.Series([datetime(2024, 1, 1, h, tzinfo=UTC) for h in hours], dtype=TS)


def test_node_table_dense_sorted_ids_with_metadata_and_first_seen():
    keys = pl.LazyFrame({"key": ["b", "a", "c", "a"]})
    ents = pl.DataFrame({"key": ["a", "c"], "text": ["apple", "cherry"], "attr_price": [1.0, 2.0]})
    first = pl.LazyFrame({"key": ["a"], "first_seen": _ts(3)})
    out = steps.node_table(keys, ents, first).collect()
    assert out["key"].to_list() == ["a", "b", "c"]
    assert out["node_id"].to_list() == [0, 1, 2]
    assert out["text"].to_list() == ["apple", None, "cherry"]
    assert out["first_seen"].null_count() == 2
    assert "attr_price" in out.columns


def test_split_bounds_and_labels_are_temporal():
    ev = pl.LazyFrame({"timestamp": _ts(*range(10))})
    b = steps.split_bounds_from_quantiles(ev, 0.2, 0.2)
    labelled = steps.label_split(ev, b["val_start"], b["test_start"]).collect()
    counts = labelled.group_by("split").len().sort("split")
    assert dict(counts.iter_rows()) == {"test": 2, "train": 6, "val": 2}
    # every test event is later than every train event
    assert labelled.filter(pl.col("split") == "test")["timestamp"].min() > labelled.filter(pl.col("split") == "train")["timestamp"].max()


def test_split_fractions_validated():
    ev = pl.LazyFrame({"timestamp": _ts(1, 2)})
    with pytest.raises(ValueError, match="split fractions"):
        steps.split_bounds_from_quantiles(ev, 0.6, 0.5)


def test_assign_ids_joins_users_and_typed_entities():
    ev = pl.LazyFrame({"user_key": ["u1", "u2"], "entity_key": ["p1", "c1"], "entity_type": ["product", "campaign"]})
    users = pl.LazyFrame({"key": ["u1", "u2"], "node_id": [0, 1]})
    ents = pl.LazyFrame({"entity_type": ["product", "campaign"], "key": ["p1", "c1"], "node_id": [5, 7]})
    out = steps.assign_ids(ev, users, ents).collect().sort("user_id")
    assert out.select("user_id", "entity_id").rows() == [(0, 5), (1, 7)]


def test_aggregate_edges_counts_first_last_and_value():
    ev = pl.LazyFrame(
        {
            "user_id": [0, 0, 0, 1],
            "entity_type": ["product"] * 4,
            "entity_id": [1, 1, 1, 1],
            "stage": ["view", "view", "purchase", "view"],
            "split": ["train"] * 4,
            "timestamp": _ts(1, 5, 6, 2),
            "value": [0.0, 0.0, 9.5, 0.0],
        }
    )
    out = steps.aggregate_edges(ev).collect().sort("user_id", "stage")
    row = out.filter((pl.col("user_id") == 0) & (pl.col("stage") == "view")).row(0, named=True)
    assert row["count"] == 2 and row["first_ts"].hour == 1 and row["last_ts"].hour == 5
    assert out.filter(pl.col("stage") == "purchase")["value"].item() == 9.5
    assert out.height == 3


def test_stage_rank_follows_funnel_order():
    df = pl.DataFrame({"stage": ["purchase", "view", "cart"]})
    assert df.select(steps.stage_rank(["view", "cart", "purchase"]))["stage"].to_list() == [2, 0, 1]


def test_taxonomy_edges_every_prefix_is_a_node():
    cats, edges = steps.taxonomy_edges(pl.DataFrame({"path": ["a.b.c", "a.b", "a.d"]}), ".")
    assert sorted(cats["key"].to_list()) == ["a", "a.b", "a.b.c", "a.d"]
    assert dict(edges.iter_rows()) == {"a.b.c": "a.b", "a.b": "a", "a.d": "a"}
    assert cats.filter(pl.col("key") == "a.b.c")["attr_level"].item() == 3.0


def test_map_relation_dedupes_and_maps_ids():
    rel = pl.LazyFrame({"src_key": ["x", "x", "y"], "dst_key": ["a", "a", "b"]})
    src = pl.LazyFrame({"key": ["x", "y"], "node_id": [0, 1]})
    dst = pl.LazyFrame({"key": ["a", "b"], "node_id": [3, 4]})
    out = steps.map_relation(rel, src, dst).collect()
    assert out.rows() == [(0, 3), (1, 4)]
