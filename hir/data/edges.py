"""Engagement edges from the final events file, in user-range buckets so memory stays bounded."""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from hir.data.schema import engage_relation

# one bucket's group-by is the peak of the edge step: 16M events is ~2.5 GiB here
BUCKET_EVENTS = 16_000_000
_KEYS = ["user_id", "entity_type", "entity_id", "stage_rank", "split"]


def write_engagement_edges(
    events_path: Path,
    edges_dir: Path,
    n_users: int,
    n_events: int,
    stage_order: Sequence[str],
    bucket_events: int = BUCKET_EVENTS,
) -> dict[str, int]:
    """Aggregate events into ``edges_dir/user__engages__<type>.parquet``; returns rows per relation.

    Up to ``bucket_events`` events this is one streaming group-by. Above it, events are first
    partitioned by user-id range; the buckets, processed in user order, each append to one
    Parquet writer per relation, so the output stays sorted by (src_id, dst_id).
    """
    final = pl.scan_parquet(events_path)
    k = max(1, math.ceil(n_events / bucket_events))
    cols = [*_KEYS, "timestamp", "value"]
    tmp = edges_dir.parent / "_tmp_edges"
    if k == 1:
        parts = [final.select(cols)]
    else:
        final.select(*cols, (pl.col("user_id") * k // max(n_users, 1)).alias("b")).sink_parquet(
            pl.PartitionBy(tmp, key="b", include_key=False), compression="lz4"
        )
        parts = [pl.scan_parquet(tmp / f"b={b}") for b in range(k) if (tmp / f"b={b}").exists()]
    stage_names = pl.col("stage_rank").replace_strict(
        list(range(len(stage_order))), list(stage_order), return_dtype=pl.String
    )
    writers: dict[str, pq.ParquetWriter] = {}
    counts: dict[str, int] = {}
    try:
        for part in parts:
            agg = (
                part.group_by(_KEYS)
                .agg(
                    pl.len().cast(pl.UInt32).alias("count"),
                    pl.col("timestamp").min().alias("first_ts"),
                    pl.col("timestamp").max().alias("last_ts"),
                    pl.col("value").sum().alias("value"),
                )
                .collect(engine="streaming")
            )
            for (etype,), g in agg.partition_by("entity_type", as_dict=True).items():
                # one packed int64 sort key is ~2x cheaper than a two-column sort
                g = g.sort(pl.col("user_id") * (1 << 32) + pl.col("entity_id")).select(
                    pl.col("user_id").alias("src_id"), pl.col("entity_id").alias("dst_id"),
                    stage_names.alias("stage"), "split", "count", "first_ts", "last_ts", "value",
                )
                name = engage_relation(str(etype))
                table = g.to_arrow()
                if name not in writers:
                    writers[name] = pq.ParquetWriter(edges_dir / f"{name}.parquet", table.schema, compression="zstd")
                writers[name].write_table(table)
                counts[name] = counts.get(name, 0) + g.height
    finally:
        for w in writers.values():
            w.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return counts
