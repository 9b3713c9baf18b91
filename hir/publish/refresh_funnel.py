"""`hir refresh` and the open funnel: the users a delta adds events for get their open-funnel row
recomputed point-in-time and pushed to the live version's ``open_funnel`` view.

The events a recomputed row reads: the snapshot's events the published funnel read (its
``visible_splits``, before its cut-off), every earlier refresh's events and the delta's, mapped to
keys (a delta's entities are new: they have no dense id). The row is :func:`hir.funnel.source.open_funnel`
of those events as of the delta's latest event (never before the published cut-off), for the
delta's users only; every other user keeps the row that was published (or refreshed) for them.

Feast's offline push cannot write an Array(String) column (../shared/STACK.md section 5), so the
offline table gains the rows by an atomic rewrite here (the journal backed it up first), and the
online store by Feast's online push.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from hir.data.schema import TS
from hir.data.snapshot import Snapshot
from hir.publish import funnel as funnel_table

log = logging.getLogger(__name__)


def delta_users(events: pl.DataFrame, entity_type: str) -> list[str]:
    """Users with events on ``entity_type`` in a delta's events (``hir.publish.delta.Delta.events``)."""
    if not events.height:
        return []
    return sorted(set(events.filter(pl.col("entity_type") == entity_type)["user_id"].to_list()))


def earlier_events(manifest: dict[str, Any]) -> list[pl.DataFrame]:
    """The events of the live version's earlier refreshes (what its open funnel saw since the cut-off)."""
    files = [r.get("events_file") for r in manifest.get("refreshes", [])]
    return [pl.read_parquet(f) for f in files if f and Path(f).exists()]


def keyed_events(snap: Snapshot, funnel: dict[str, Any], deltas: list[pl.DataFrame]) -> pl.LazyFrame:
    """The snapshot's events the published funnel read plus the deltas' events, keyed:
    ``user_id``, ``entity_id`` (keys, String), ``stage_rank``, ``timestamp``."""
    from hir.funnel.source import visible_events

    etype = funnel["entity_type"]
    asof = datetime.fromisoformat(funnel["asof"]) - timedelta(microseconds=1)
    base = visible_events(snap.scan_events(), etype, asof, funnel["visible_splits"]).select(
        "user_id", "entity_id", "stage_rank", "timestamp").collect()
    users, entities = snap.keys("user"), snap.keys(etype)
    base = base.with_columns(
        pl.col("user_id").replace_strict(pl.int_range(len(users), eager=True), users),
        pl.col("entity_id").replace_strict(pl.int_range(len(entities), eager=True), entities),
    )
    rank = {s: i for i, s in enumerate(snap.stage_order)}
    frames = [base.with_columns(pl.col("stage_rank").cast(pl.Int64), pl.col("timestamp").cast(TS))]
    for d in deltas:
        d = d.filter(pl.col("entity_type") == etype)
        frames.append(d.select(pl.col("user_id").cast(pl.String), pl.col("entity_id").cast(pl.String),
                               pl.col("stage").replace_strict(rank, return_dtype=pl.Int64).alias("stage_rank"),
                               pl.col("timestamp").cast(TS)))
    return pl.concat(frames).lazy()


def funnel_rows(snap: Snapshot, manifest: dict[str, Any], delta_events: pl.DataFrame, created: datetime,
                earlier: list[pl.DataFrame] | None = None) -> pl.DataFrame:
    """The served rows (hir/publish/funnel.py's columns) of the users with events in ``delta_events``,
    recomputed from the snapshot, ``earlier`` refreshes' events and ``delta_events``; empty when
    the live version publishes no funnel or the delta has no event on its entity type."""
    from hir.funnel.source import open_funnel, plain_order

    funnel = manifest["feast"].get("funnel")
    if not funnel:
        return pl.DataFrame()
    users = delta_users(delta_events, funnel["entity_type"])
    if not users:
        return pl.DataFrame()
    cutoff = datetime.fromisoformat(funnel["asof"])
    latest = delta_events.filter(pl.col("user_id").is_in(users))["timestamp"].max()
    asof = max(latest, cutoff) if latest is not None else cutoff
    events = keyed_events(snap, funnel, [*(earlier or []), delta_events]).filter(pl.col("timestamp") <= pl.lit(asof, TS))
    pairs = open_funnel(events, int(funnel["target_rank"]), asof).filter(pl.col("user_id").is_in(users)).collect()
    pairs = plain_order(pairs, include_converted=True).with_columns(
        pl.lit(asof).cast(pl.Datetime("us", "UTC")).alias("event_timestamp"))
    pairs = pairs.rename({"user_id": "user_key", "entity_id": "entity_key"})
    rows = funnel_table.user_rows(pairs, int(funnel["max_pairs"]), manifest["version"], created)
    log.info("open funnel: %d user(s) of the delta recomputed as of %s (%d pairs)", rows.height, asof, pairs.height)
    return rows


def push_funnel(rows: pl.DataFrame, manifest: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """Append ``rows`` to the live funnel's offline table (an atomic rewrite) and push them online;
    returns the record (file of the rows, users, the offline table)."""
    import warnings

    import pyarrow as pa
    import pyarrow.parquet as pq
    from feast.data_source import PushMode

    from hir.atomic import write_parquet_atomic
    from hir.publish import faults, feast_store

    funnel = manifest["feast"]["funnel"]
    path = out_dir / funnel_table.FILE
    write_parquet_atomic(rows, path)
    offline = Path(funnel["path"])
    table = pq.read_table(offline)
    new = feast_store.plain_table(rows.to_arrow()).select(table.column_names).cast(table.schema)
    tmp = offline.with_suffix(".parquet.tmp")
    pq.write_table(pa.concat_tables([table, new]), tmp)
    tmp.replace(offline)
    faults.point("refresh_funnel")
    store = feast_store.open_store(Path(manifest["feast"]["repo_path"]))
    with warnings.catch_warnings():  # ibis 12 calls duckdb's deprecated fetch_arrow_table
        warnings.filterwarnings("ignore", message=".*fetch_arrow_table", category=DeprecationWarning)
        store.push(funnel["push_source"], rows.to_pandas(), to=PushMode.ONLINE)
    return {"file": str(path), "users": rows.height, "offline_file": str(offline)}
