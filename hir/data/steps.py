"""Pure LazyFrame -> LazyFrame steps of the snapshot builder (unit-tested on tiny frames)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl

from hir.data.schema import TS


def node_table(keys: pl.LazyFrame, entities: pl.DataFrame | None, first_seen: pl.LazyFrame) -> pl.LazyFrame:
    """Dense ids for one entity type.

    Args:
        keys: every key of the type that occurs anywhere (events, relations, metadata); one
            column ``key``, duplicates allowed.
        entities: metadata rows (``key``, ``text``, ``attr_*``) or None.
        first_seen: ``key``, ``first_seen`` (earliest event time), keys without events absent.

    Returns:
        ``node_id`` (0..n-1, ordered by key), ``key``, ``text``, ``first_seen``, ``attr_*``.
    """
    nodes = keys.unique().sort("key").with_row_index("node_id").with_columns(pl.col("node_id").cast(pl.Int64))
    if entities is not None:
        nodes = nodes.join(entities.lazy(), on="key", how="left")
    else:
        nodes = nodes.with_columns(pl.lit(None, dtype=pl.String).alias("text"))
    # a type without events gets an empty first_seen frame whose key dtype may differ
    key_dtype = nodes.collect_schema()["key"]
    nodes = nodes.join(first_seen.with_columns(pl.col("key").cast(key_dtype, strict=False)), on="key", how="left")
    attrs = [c for c in nodes.collect_schema().names() if c.startswith("attr_")]
    return nodes.select("node_id", "key", "text", "first_seen", *attrs).sort("node_id")


def split_bounds_from_quantiles(events: pl.LazyFrame, val_fraction: float, test_fraction: float) -> dict[str, datetime]:
    """Temporal split boundaries: the last ``test_fraction`` of events (by time) are test, the
    ``val_fraction`` before them val."""
    if not (0 <= val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise ValueError(
            f"split fractions val={val_fraction}, test={test_fraction} must be in [0, 1) with val+test < 1"
        )
    ts = events.select(pl.col("timestamp").dt.epoch("us")).collect(engine="streaming").to_series()
    ts = ts.drop_nulls().to_numpy()
    n = len(ts)
    if n == 0:
        raise ValueError("no event timestamps to split by")
    # the 'higher' quantile q is the element at rank ceil(q * (n - 1)): one O(n) partition
    ranks = [math.ceil((1 - val_fraction - test_fraction) * (n - 1)), math.ceil((1 - test_fraction) * (n - 1))]
    val_start, test_start = np.partition(ts, ranks)[ranks]
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    at = lambda us: epoch + timedelta(microseconds=int(us))  # noqa: E731
    return {"min": at(ts.min()), "max": at(ts.max()), "val_start": at(val_start), "test_start": at(test_start)}


def label_split(events: pl.LazyFrame, val_start: datetime, test_start: datetime) -> pl.LazyFrame:
    """Add ``split``: train before ``val_start``, val before ``test_start``, test after."""
    ts = pl.col("timestamp")
    return events.with_columns(
        pl.when(ts >= pl.lit(test_start, TS))
        .then(pl.lit("test"))
        .when(ts >= pl.lit(val_start, TS))
        .then(pl.lit("val"))
        .otherwise(pl.lit("train"))
        .alias("split")
    )


def assign_ids(events: pl.LazyFrame, users: pl.LazyFrame, entities: pl.LazyFrame) -> pl.LazyFrame:
    """Replace keys by dense ids.

    Args:
        events: ``user_key``, ``entity_key``, ``entity_type``, ...
        users: ``key``, ``node_id`` of the user type.
        entities: ``entity_type``, ``key``, ``node_id`` of every other type.
    """
    out = events.join(users.select(pl.col("key").alias("user_key"), pl.col("node_id").alias("user_id")), on="user_key")
    ents = entities.select("entity_type", pl.col("key").alias("entity_key"), pl.col("node_id").alias("entity_id"))
    if ents.select(pl.col("entity_type").n_unique()).collect().item() == 1:
        # one type: joining on the key alone is ~2x cheaper than on (type, key)
        out = out.join(ents.drop("entity_type"), on="entity_key")
    else:
        out = out.join(ents, on=["entity_type", "entity_key"])
    return out.drop("user_key", "entity_key")


def stage_rank(stage_order: Sequence[str]) -> pl.Expr:
    """``stage`` -> its position in the funnel (0 = shallowest) as Int8."""
    # an Enum cast is elementwise and streams; replace_strict materialises the column
    return pl.col("stage").cast(pl.Enum(list(stage_order))).to_physical().cast(pl.Int8)


def aggregate_edges(events: pl.LazyFrame) -> pl.LazyFrame:
    """Events -> engagement edges: one row per (user, entity, stage, split)."""
    return events.group_by("user_id", "entity_type", "entity_id", "stage", "split").agg(
        pl.len().cast(pl.UInt32).alias("count"),
        pl.col("timestamp").min().alias("first_ts"),
        pl.col("timestamp").max().alias("last_ts"),
        pl.col("value").sum().alias("value"),
    )


def map_relation(rel: pl.LazyFrame, src: pl.LazyFrame, dst: pl.LazyFrame) -> pl.LazyFrame:
    """``src_key``/``dst_key`` -> ``src_id``/``dst_id`` through the two node tables; duplicates removed."""
    cols = ["src_id", "dst_id", *(["weight"] if "weight" in rel.collect_schema().names() else [])]
    return (
        rel.join(src.select(pl.col("key").alias("src_key"), pl.col("node_id").alias("src_id")), on="src_key")
        .join(dst.select(pl.col("key").alias("dst_key"), pl.col("node_id").alias("dst_id")), on="dst_key")
        .select(cols)
        .unique(subset=["src_id", "dst_id"], keep="first")
        .sort("src_id", "dst_id")
    )


def taxonomy_edges(paths: pl.DataFrame, separator: str, key_prefix: str = "") -> tuple[pl.DataFrame, pl.DataFrame]:
    """Dotted taxonomy paths -> category nodes for every prefix and child->parent edges.

    ``a.b.c`` gives nodes ``a``, ``a.b``, ``a.b.c`` and edges ``a.b.c -> a.b``, ``a.b -> a``.

    Args:
        paths: one column ``path`` of full taxonomy paths.
    Returns:
        (categories with ``key``, ``text``, ``attr_level``; parent edges ``src_key``, ``dst_key``)
    """
    parts = paths.select(pl.col("path").str.split(separator).alias("parts")).unique()
    rows: list[tuple[str, str, float, str | None]] = []
    seen: set[str] = set()
    for (items,) in parts.iter_rows():
        for depth in range(1, len(items) + 1):
            key = separator.join(items[:depth])
            if key in seen:
                continue
            seen.add(key)
            parent = separator.join(items[: depth - 1]) if depth > 1 else None
            text = " > ".join(x.replace("_", " ") for x in items[:depth])
            rows.append((key_prefix + key, text, float(depth), key_prefix + parent if parent else None))
    cats = pl.DataFrame(rows, schema=["key", "text", "attr_level", "parent"], orient="row")
    edges = cats.filter(pl.col("parent").is_not_null()).select(
        pl.col("key").alias("src_key"), pl.col("parent").alias("dst_key")
    )
    return cats.drop("parent"), edges
