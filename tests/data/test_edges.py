"""The one-pass writer of events.parquet and the engagement edges (hir/data/build.py)."""

from datetime import UTC, datetime

import polars as pl

from hir.data import steps
from hir.data.build import write_events_and_edges
from hir.data.schema import TS

ORDER = ["view", "cart", "purchase"]
BOUNDS = {"val_start": datetime(2024, 1, 1, 0, 40, tzinfo=UTC), "test_start": datetime(2024, 1, 1, 0, 50, tzinfo=UTC)}


def _canonical(n: int = 200) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "user_key": [f"u{i % 17:02d}" for i in range(n)],
            "entity_key": [f"e{i % 7}" for i in range(n)],
            "entity_type": ["product" if i % 5 else "campaign" for i in range(n)],
            "stage": [ORDER[i % 3] for i in range(n)],
            "timestamp": pl.Series([datetime(2024, 1, 1, 0, i % 60, tzinfo=UTC) for i in range(n)], dtype=TS),
            "quantity": [1.0] * n,
            "value": [float(i) for i in range(n)],
            "session": [None] * n,
        },
        schema_overrides={"session": pl.String},
    )


def _nodes(ev: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, pl.DataFrame]]:
    users = ev.select(pl.col("user_key").unique().sort().alias("key")).with_row_index("node_id")
    ents = {
        t: g.select(pl.col("entity_key").unique().sort().alias("key")).with_row_index("node_id")
        for (t,), g in ev.partition_by("entity_type", as_dict=True).items()
    }
    return users, ents


def _write(tmp_path, name, ev, bucket_events, lazy=False):
    out = tmp_path / name
    (out / "edges").mkdir(parents=True)
    users, ents = _nodes(ev)
    counts = write_events_and_edges(ev.lazy() if lazy else ev, ev.height, users, ents, ORDER, BOUNDS, out, bucket_events)
    return out, counts


def test_edges_equal_the_reference_group_by_and_come_out_sorted(tmp_path):
    ev = _canonical()
    out, counts = _write(tmp_path, "one", ev, 10_000)
    events = pl.read_parquet(out / "events.parquet")
    assert events.height == ev.height and events.schema["stage"] == pl.String and events.schema["split"] == pl.String
    expected = steps.label_split(events.lazy().drop("split"), BOUNDS["val_start"], BOUNDS["test_start"]).collect()
    assert events["split"].to_list() == expected["split"].to_list()
    ref = steps.aggregate_edges(events.lazy()).collect()
    for etype in ("product", "campaign"):
        got = pl.read_parquet(out / "edges" / f"user__engages__{etype}.parquet")
        assert got.schema["count"] == pl.UInt32 and got.schema["first_ts"] == TS
        want = ref.filter(pl.col("entity_type") == etype).select(
            pl.col("user_id").alias("src_id"), pl.col("entity_id").alias("dst_id"), "stage", "split",
            "count", "first_ts", "last_ts", "value",
        )
        key = ["src_id", "dst_id", "stage", "split"]
        assert got.sort(key).equals(want.sort(key))
        packed = (got["src_id"] * (1 << 32) + got["dst_id"]).to_list()
        assert packed == sorted(packed)
        assert counts[f"user__engages__{etype}"] == got.height


def test_bucketed_build_equals_the_single_bucket_build(tmp_path):
    ev = _canonical(500)
    one, c1 = _write(tmp_path, "one", ev, 10_000)
    many, c2 = _write(tmp_path, "many", ev, 60, lazy=True)
    assert c1 == c2
    key = ["user_id", "entity_id", "stage", "timestamp", "value"]
    assert pl.read_parquet(one / "events.parquet").sort(key).equals(pl.read_parquet(many / "events.parquet").sort(key))
    for name in c1:
        a = pl.read_parquet(one / "edges" / f"{name}.parquet")
        b = pl.read_parquet(many / "edges" / f"{name}.parquet")
        assert a.equals(b)  # same rows in the same (src, dst, stage, split) order
    assert not (many / "_tmp_buckets").exists()
