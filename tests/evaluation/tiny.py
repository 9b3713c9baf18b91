"""A hand-built graph snapshot (docs/contracts.md `graph/`) small enough to check by eye.

Users 0-3, products 0-5, stages view < cart < purchase. Train = day 1-3, val = day 4, test = day 5.
Categories: 0 = "food" (root), 1 = "food > fruit", 2 = "food > dairy"; products 0-2 are fruit,
3-5 dairy. Product 5 first appears in the test period (cold start).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl

TS = pl.Datetime("us", "UTC")
DAY0 = datetime(2024, 1, 1, tzinfo=UTC)
STAGES = ["view", "cart", "purchase"]


def t(day: float, hour: float = 0.0) -> datetime:
    return DAY0 + timedelta(days=day, hours=hour)


# (user, product, stage, time)
EVENTS = [
    # train
    (0, 0, "view", t(1)), (0, 0, "purchase", t(1, 1)), (0, 1, "view", t(1, 2)),
    (1, 0, "view", t(1, 3)), (1, 3, "view", t(2)), (1, 3, "purchase", t(2, 1)),
    (2, 3, "view", t(2, 2)), (2, 4, "view", t(2, 3)), (2, 4, "cart", t(2, 4)), (2, 4, "purchase", t(2, 5)),
    (3, 1, "view", t(3)),
    # val
    (0, 1, "view", t(4)), (0, 1, "purchase", t(4, 1)), (1, 4, "view", t(4, 2)), (3, 2, "view", t(4, 3)),
    (3, 2, "purchase", t(4, 4)),
    # test
    (0, 2, "view", t(5)), (0, 2, "purchase", t(5, 1)), (1, 5, "view", t(5, 2)), (1, 3, "view", t(5, 3)),
    (1, 3, "purchase", t(5, 4)), (2, 0, "view", t(5, 5)), (3, 4, "view", t(5, 6)), (3, 4, "cart", t(5, 7)),
]
VAL_START, TEST_START = t(4), t(5)


def write_snapshot(root: Path, events: list[tuple] = EVENTS) -> Path:
    """Write ``root/graph`` for ``events``; returns the graph dir."""
    g = root / "graph"
    (g / "nodes").mkdir(parents=True, exist_ok=True)
    (g / "edges").mkdir(parents=True, exist_ok=True)
    ev = pl.DataFrame(
        {
            "user_id": [e[0] for e in events],
            "entity_id": [e[1] for e in events],
            "entity_type": ["product"] * len(events),
            "stage": [e[2] for e in events],
            "stage_rank": [STAGES.index(e[2]) for e in events],
            "timestamp": [e[3] for e in events],
        },
        schema_overrides={"timestamp": TS, "stage_rank": pl.Int8},
    ).with_columns(
        pl.when(pl.col("timestamp") >= TEST_START).then(pl.lit("test"))
        .when(pl.col("timestamp") >= VAL_START).then(pl.lit("val")).otherwise(pl.lit("train")).alias("split"),
        pl.lit(1.0).alias("quantity"),
        pl.when(pl.col("stage") == "purchase").then(2.0).otherwise(0.0).alias("value"),
        pl.lit(None, pl.String).alias("session"),
    )
    ev.write_parquet(g / "events.parquet")
    first = ev.group_by("entity_id").agg(pl.col("timestamp").min().alias("first_seen"))
    users_first = ev.group_by("user_id").agg(pl.col("timestamp").min().alias("first_seen"))
    products = pl.DataFrame({"node_id": list(range(6)), "key": [f"p{i}" for i in range(6)],
                             "text": ["red apple", "green apple", "banana", "milk", "cheese", None],
                             "attr_price": [1.0, 1.2, 0.5, 0.9, 4.0, None]})
    products.join(first.rename({"entity_id": "node_id"}), on="node_id", how="left").select(
        "node_id", "key", "text", "first_seen", "attr_price").write_parquet(g / "nodes" / "product.parquet")
    pl.DataFrame({"node_id": list(range(4)), "key": [f"u{i}" for i in range(4)], "text": [None] * 4},
                 schema_overrides={"text": pl.String}).join(
        users_first.rename({"user_id": "node_id"}), on="node_id", how="left"
    ).write_parquet(g / "nodes" / "user.parquet")
    pl.DataFrame({"node_id": [0, 1, 2], "key": ["food", "food|fruit", "food|dairy"],
                  "text": ["food", "food > fruit", "food > dairy"], "first_seen": [None] * 3},
                 schema_overrides={"first_seen": TS}).write_parquet(g / "nodes" / "category.parquet")
    pl.DataFrame({"src_id": list(range(6)), "dst_id": [1, 1, 1, 2, 2, 2]}).write_parquet(
        g / "edges" / "product__in_category__category.parquet")
    pl.DataFrame({"src_id": [1, 2], "dst_id": [0, 0]}).write_parquet(g / "edges" / "category__child_of__category.parquet")
    meta = {
        "snapshot_version": 1, "dataset": "tiny", "stage_order": STAGES, "deep_stage": "purchase",
        "nodes": {"user": 4, "product": 6, "category": 3},
        "split_bounds": {"min": t(1).isoformat(), "max": t(5, 7).isoformat(),
                         "val_start": VAL_START.isoformat(), "test_start": TEST_START.isoformat()},
    }
    (g / "meta.json").write_text(json.dumps(meta))
    return g
