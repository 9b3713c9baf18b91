"""The Polars engine: canonical events -> ``events.parquet`` and the engagement edges, in one pass.

Events get dense ids, a split code and a stage rank, then go through the writer in user-range
buckets. Each bucket is sorted once by one packed int64 key (user, entity type, entity, stage,
split), and that one sort serves both outputs: the bucket's events are appended to
``events.parquet`` in that order, and its edges are the runs of equal keys (count = run length,
first/last time and value by ``reduceat`` over the runs), appended to one Parquet writer per
relation. Buckets are user ranges taken in order, so every edge file comes out sorted by
(src_id, dst_id) with no second sort, and no file is read back.

Up to ``bucket_events`` events the whole table is one bucket held in memory (no temporary
files at all). Above it, the labelled events are first partitioned by user range to
lz4 Parquet, and each bucket is read, written and dropped in turn, so memory stays at one
bucket plus the node tables (benchmarks/results/prepare.json has the measured peaks: one
10M-event bucket, and 100M events in seven buckets).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from hir.data.schema import SPLITS, TS, engage_relation

BUCKET_EVENTS = 16_000_000
# columns of a labelled bucket handed to SnapshotWriter.write
CODED = ("user_id", "entity_id", "type_code", "stage_rank", "split_code", "timestamp", "quantity", "value", "session")


def dense_ids(keys: pl.Series, sorted_keys: pl.Series) -> np.ndarray:
    """Position of each of ``keys`` in the sorted, distinct ``sorted_keys`` (= its node id).

    Integer keys use a lookup table when their range is small, else a binary search; string
    keys an Enum cast (categories in key order, so the physical code is the position). Every
    key must occur in ``sorted_keys``.
    """
    if keys.dtype.is_integer():
        k, table = keys.to_numpy(), sorted_keys.to_numpy()
        lo, hi = (int(table[0]), int(table[-1])) if len(table) else (0, -1)
        if len(table) and hi - lo < 4 * len(table) + 1_000_000:
            lut = np.full(hi - lo + 1, -1, np.int64)
            lut[table - lo] = np.arange(len(table))
            return lut[k - lo]
        return np.searchsorted(table, k).astype(np.int64)
    enum = pl.Enum(sorted_keys.cast(pl.String).to_list())
    return keys.cast(pl.String).cast(enum).to_physical().cast(pl.Int64).to_numpy()


def coded_events(
    events: pl.DataFrame,
    users: pl.DataFrame,
    entities: dict[str, pl.DataFrame],
    types: Sequence[str],
    stage_order: Sequence[str],
    bounds: dict,
) -> pl.DataFrame:
    """Canonical events (keys) -> the :data:`CODED` columns: dense ids, entity type code (index in
    ``types``), stage rank, split code (index in ``SPLITS``: train before ``val_start``, val
    before ``test_start``, test after)."""
    type_code = events["entity_type"].cast(pl.Enum(list(types))).to_physical().cast(pl.Int8).to_numpy()
    entity_id = np.zeros(events.height, np.int64)
    keys = events["entity_key"]
    for code, etype in enumerate(types):
        rows = np.flatnonzero(type_code == code)
        if len(rows) == len(type_code):
            entity_id = dense_ids(keys, entities[etype]["key"])
        elif len(rows):
            entity_id[rows] = dense_ids(keys.gather(rows), entities[etype]["key"])
    ts = pl.col("timestamp")
    return events.select(
        pl.Series("user_id", dense_ids(events["user_key"], users["key"])),
        pl.Series("entity_id", entity_id),
        pl.Series("type_code", type_code),
        pl.col("stage").cast(pl.Enum(list(stage_order))).to_physical().cast(pl.Int8).alias("stage_rank"),
        pl.when(ts >= pl.lit(bounds["test_start"], TS)).then(pl.lit(2, pl.Int8))
        .when(ts >= pl.lit(bounds["val_start"], TS)).then(pl.lit(1, pl.Int8))
        .otherwise(pl.lit(0, pl.Int8)).alias("split_code"),
        "timestamp", "quantity", "value", "session",
    )


# numpy -> Arrow through Polars (zero-copy): pyarrow's own numpy path imports pandas, which
# costs seconds of start-up on a busy 2-core machine
def _arrow(values: np.ndarray) -> pa.Array:
    return pl.Series(values=values).to_arrow()


def _arrow_ts(micros: np.ndarray) -> pa.Array:
    return pl.Series(values=micros).cast(pl.Datetime("us")).dt.replace_time_zone("UTC").to_arrow()


def _table(columns: dict[str, pa.Array]) -> pa.Table:
    return pa.Table.from_arrays(list(columns.values()), names=list(columns))


class SnapshotWriter:
    """Appends labelled buckets to ``events.parquet`` and ``edges/user__engages__<type>.parquet``.

    Text columns (entity type, stage, split) are written as dictionary pages straight from their
    small integer codes, never as per-row strings; the files carry no Arrow schema, so every
    reader sees plain strings. The events of a bucket are written on a second thread while its
    edges are computed.

    Args:
        out_dir: the snapshot directory (``graph/``).
        n_users: user count (the packed key's range).
        n_entities: entity count per type, in type-code order.
        types: entity type per type code.
        stage_order: stage name per stage rank.
    """

    def __init__(
        self, out_dir: Path, n_users: int, n_entities: Sequence[int], types: Sequence[str], stage_order: Sequence[str]
    ) -> None:
        self.out_dir, self.types, self.stage_order = Path(out_dir), list(types), list(stage_order)
        # key = (((type * U + user) * E + entity) * S + stage) * 3 + split, exact while it fits 63 bits;
        # type leads, so each relation's edges are one contiguous, (src, dst)-sorted slice
        self.sizes = [max(len(types), 1), max(n_users, 1), max(max(n_entities, default=1), 1),
                      max(len(stage_order), 1), len(SPLITS)]
        self.packed = math.prod(self.sizes) < 2**62
        self.events: pq.ParquetWriter | None = None
        self.edges: dict[str, pq.ParquetWriter] = {}
        self.counts: dict[str, int] = {}
        self.pool = ThreadPoolExecutor(max_workers=1)

    def _runs(self, cols: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """A stable order of the bucket's rows by (type, user, entity, stage, split) and the start,
        in that order, of every run of equal keys."""
        names = ["type_code", "user_id", "entity_id", "stage_rank", "split_code"]
        if self.packed:
            key = cols["type_code"].astype(np.int64)
            for name, size in zip(names[1:], self.sizes[1:], strict=True):
                key *= size  # in place: each step would otherwise allocate a copy of the key
                key += cols[name]
            order = pl.DataFrame({"k": key}).with_row_index("i").sort("k", maintain_order=True)["i"].to_numpy()
            k = key[order]
            change = k[1:] != k[:-1]
        else:
            order = np.lexsort([cols[c] for c in reversed(names)])
            change = np.zeros(max(len(order) - 1, 0), bool)
            for c in names:
                v = cols[c][order]
                change |= v[1:] != v[:-1]
        return order, np.concatenate([[0], np.flatnonzero(change) + 1]).astype(np.int64)

    def _text(self, codes: np.ndarray, names: Sequence[str]) -> pa.DictionaryArray:
        names = pl.Series(values=list(names), dtype=pl.String).to_arrow().cast(pa.string())
        return pa.DictionaryArray.from_arrays(_arrow(codes.astype(np.int8, copy=False)), names)

    def _append(self, writer: pq.ParquetWriter | None, path: Path, table: pa.Table) -> pq.ParquetWriter:
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema, compression="lz4", store_schema=False)
        writer.write_table(table, row_group_size=1 << 20)
        return writer

    def write(self, df: pl.DataFrame) -> None:
        """Append one labelled bucket (columns :data:`CODED`; users of later buckets all have
        larger ids). Events keep the bucket's row order; edges come out sorted."""
        if df.height == 0:
            return
        cols = {c: df[c].to_numpy() for c in ("user_id", "entity_id", "type_code", "stage_rank", "split_code")}
        ts = df["timestamp"].dt.epoch("us").to_numpy()
        value = df["value"].to_numpy()
        events = _table({
            "user_id": _arrow(cols["user_id"]), "entity_id": _arrow(cols["entity_id"]),
            "entity_type": self._text(cols["type_code"], self.types),
            "stage": self._text(cols["stage_rank"], self.stage_order),
            "stage_rank": _arrow(cols["stage_rank"].astype(np.int8, copy=False)),
            "timestamp": _arrow_ts(ts),
            "split": self._text(cols["split_code"], SPLITS),
            "quantity": df["quantity"].to_arrow(), "value": _arrow(value),
            "session": df["session"].cast(pl.String).to_arrow().cast(pa.string()),
        })
        pending = self.pool.submit(self._append, self.events, self.out_dir / "events.parquet", events)

        order, starts = self._runs(cols)
        first = order[starts]
        ts_sorted = ts[order]
        runs = {
            "src_id": cols["user_id"][first], "dst_id": cols["entity_id"][first], "type_code": cols["type_code"][first],
            "stage_rank": cols["stage_rank"][first], "split_code": cols["split_code"][first],
            "count": np.diff(starts, append=len(order)).astype(np.uint32),
            "first_ts": np.minimum.reduceat(ts_sorted, starts), "last_ts": np.maximum.reduceat(ts_sorted, starts),
            "value": np.add.reduceat(value[order], starts),
        }
        # runs are ordered by type first: each type's edges are one slice
        bounds = np.searchsorted(runs["type_code"], np.arange(len(self.types) + 1))
        for code, etype in enumerate(self.types):
            lo, hi = int(bounds[code]), int(bounds[code + 1])
            if lo == hi:
                continue
            part = {k: v[lo:hi] for k, v in runs.items()}
            table = _table({
                "src_id": _arrow(part["src_id"]), "dst_id": _arrow(part["dst_id"]),
                "stage": self._text(part["stage_rank"], self.stage_order),
                "split": self._text(part["split_code"], SPLITS),
                "count": _arrow(part["count"]),
                "first_ts": _arrow_ts(part["first_ts"]), "last_ts": _arrow_ts(part["last_ts"]),
                "value": _arrow(part["value"]),
            })
            name = engage_relation(etype)
            self.edges[name] = self._append(self.edges.get(name), self.out_dir / "edges" / f"{name}.parquet", table)
            self.counts[name] = self.counts.get(name, 0) + table.num_rows
        self.events = pending.result()

    def close(self) -> dict[str, int]:
        """Close every file; edge rows per relation."""
        self.pool.shutdown()
        for w in [self.events, *self.edges.values()]:
            if w is not None:
                w.close()
        return self.counts


def write_events_and_edges(
    events: pl.LazyFrame | pl.DataFrame,
    n_events: int,
    users: pl.DataFrame,
    entities: dict[str, pl.DataFrame],
    stage_order: Sequence[str],
    bounds: dict,
    out_dir: Path,
    bucket_events: int = BUCKET_EVENTS,
) -> dict[str, int]:
    """Write ``events.parquet`` and the engagement edges of canonical ``events``; rows per relation.

    Args:
        events: canonical events (keys), a DataFrame when it fits one bucket.
        n_events: their number (sets the bucket count).
        users: the user node table (``key`` in node-id order).
        entities: node table per entity type with events.
        bounds: split bounds (``val_start``, ``test_start``).
    """
    types = sorted(entities)
    writer = SnapshotWriter(out_dir, users.height, [entities[t].height for t in types], types, stage_order)
    k = max(1, math.ceil(n_events / bucket_events))
    tmp = out_dir / "_tmp_buckets"
    try:
        if k == 1:
            frame = events if isinstance(events, pl.DataFrame) else events.collect(engine="streaming")
            writer.write(coded_events(frame, users, entities, types, stage_order, bounds))
        else:
            _partition(events.lazy(), users, entities, types, stage_order, bounds, k, tmp)
            for b in range(k):
                if (tmp / f"b={b}").exists():
                    writer.write(pl.read_parquet(tmp / f"b={b}"))
    finally:
        counts = writer.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return counts


def _partition(
    events: pl.LazyFrame, users: pl.DataFrame, entities: dict[str, pl.DataFrame], types: Sequence[str],
    stage_order: Sequence[str], bounds: dict, k: int, tmp: Path,
) -> None:
    """Label every event (ids by join, streaming) and partition them by user range to ``tmp/b=<i>``."""
    key_dtype = events.collect_schema()["entity_key"]
    ent = pl.concat([
        entities[t].lazy().select(pl.lit(t).alias("entity_type"), pl.col("key").cast(key_dtype).alias("entity_key"),
                                  pl.col("node_id").alias("entity_id"))
        for t in types
    ])
    ids = events.join(
        users.lazy().select(pl.col("key").alias("user_key"), pl.col("node_id").alias("user_id")), on="user_key"
    ).join(ent, on=["entity_type", "entity_key"])
    ts = pl.col("timestamp")
    labelled = ids.select(
        "user_id", "entity_id",
        pl.col("entity_type").cast(pl.Enum(list(types))).to_physical().cast(pl.Int8).alias("type_code"),
        pl.col("stage").cast(pl.Enum(list(stage_order))).to_physical().cast(pl.Int8).alias("stage_rank"),
        pl.when(ts >= pl.lit(bounds["test_start"], TS)).then(pl.lit(2, pl.Int8))
        .when(ts >= pl.lit(bounds["val_start"], TS)).then(pl.lit(1, pl.Int8))
        .otherwise(pl.lit(0, pl.Int8)).alias("split_code"),
        "timestamp", "quantity", "value", "session",
        (pl.col("user_id") * k // max(users.height, 1)).alias("b"),
    )
    labelled.sink_parquet(pl.PartitionBy(tmp, key="b", include_key=False), compression="lz4")
