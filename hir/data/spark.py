"""The Spark engine (``prepare.engine=spark``): the snapshot's heavy part on Apache Spark.

The adapter and the split are shared with the Polars engine (:func:`hir.data.prepare.build_snapshot`):
Spark starts from the canonical events table, staged as Parquet in ``prepare.spark.work_dir``,
and does what grows with the events:

1. first-seen times of every user and entity (two group-bys), collected to the driver, where
   the shared Polars code builds the node tables (dense ids in key order, metadata joined);
2. dense ids (joins with the node tables), split labels by the shared bounds, stage ranks:
   ``events``;
3. the engagement edges, one group-by over (user, entity type, entity, stage, split), globally
   sorted by (src_id, dst_id, stage, split) per relation.

Spark writes its part files to ``work_dir``; the driver then streams them, in part order, into
the contract's single files (``graph/events.parquet``, ``graph/edges/<rel>.parquet``), cast to
the contract's dtypes. The result equals the Polars engine's snapshot (tests/data/test_spark.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from hir.data.schema import SPLITS, engage_relation
from hir.data.spark_options import SparkOptions
from hir.errors import HirError

log = logging.getLogger(__name__)

EVENTS_SCHEMA = pa.schema([
    ("user_id", pa.int64()), ("entity_id", pa.int64()), ("entity_type", pa.string()), ("stage", pa.string()),
    ("stage_rank", pa.int8()), ("timestamp", pa.timestamp("us", tz="UTC")), ("split", pa.string()),
    ("quantity", pa.float64()), ("value", pa.float64()), ("session", pa.string()),
])
EDGES_SCHEMA = pa.schema([
    ("src_id", pa.int64()), ("dst_id", pa.int64()), ("stage", pa.string()), ("split", pa.string()),
    ("count", pa.uint32()), ("first_ts", pa.timestamp("us", tz="UTC")), ("last_ts", pa.timestamp("us", tz="UTC")),
    ("value", pa.float64()),
])


def _micros(value: datetime) -> int:
    """A UTC datetime as microseconds since the epoch (what ``unix_micros`` gives in Spark)."""
    return (value - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


class SparkBuild:
    """One Spark session for one snapshot: ``stage`` -> ``first_seen`` -> ``write`` -> ``stop``."""

    @staticmethod
    def _start(builder: Any, tries: int = 2) -> Any:
        """``builder.getOrCreate()``, tried again once when the JVM exits before it reports its port:
        on a loaded machine a local gateway did so once in a full test run (the next start succeeded)."""
        for _ in range(tries - 1):
            try:
                return builder.getOrCreate()
            except Exception as err:
                if "JAVA_GATEWAY_EXITED" not in str(err):
                    raise
                log.warning("spark: the Java gateway exited before it started (%s); starting it again", err)
                time.sleep(1.0)
        return builder.getOrCreate()

    def __init__(self, options: SparkOptions, tmp: Path) -> None:
        try:
            from pyspark.sql import SparkSession
        except ImportError as err:
            raise HirError(
                "prepare.engine=spark needs pyspark: pip install 'hir[spark]' (or pip install pyspark), and Java 17+"
            ) from err
        self.options = options
        self.work = options.work_dir or str(Path(tmp).resolve() / "spark")
        builder = (
            SparkSession.builder.master(options.master).appName(options.app_name)
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        )
        if options.shuffle_partitions:
            builder = builder.config("spark.sql.shuffle.partitions", str(options.shuffle_partitions))
        if options.master.startswith("local") and "spark.pyspark.python" not in options.conf:
            # Python workers (the fold-in's mapInArrow) must run this interpreter, whose packages
            # (numpy, pyarrow) they import; pyspark 4.3 reads PYSPARK_PYTHON (the conf key alone
            # left them on the base interpreter). A cluster names its executors' Python in `conf`
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        for key, value in options.conf.items():
            builder = builder.config(key, str(value))
        try:
            self.spark = self._start(builder)
        except Exception as err:  # the JVM did not start: say what is needed
            raise HirError(
                f"prepare.engine=spark: could not start Spark (master {options.master!r}): {err}; "
                "Spark needs Java 17+ on PATH or JAVA_HOME"
            ) from err
        self.spark.sparkContext.setLogLevel("WARN")
        self.fs, self.root = pafs.FileSystem.from_uri(self.work if "://" in self.work else str(Path(self.work).resolve()))
        log.info("spark %s (master %s), work dir %s", self.spark.version, options.master, self.work)

    def uri(self, name: str) -> str:
        return f"{self.work.rstrip('/')}/{name}"

    def stage(self, events: pl.LazyFrame | pl.DataFrame) -> Any:
        """Write the canonical events to ``work_dir/canonical`` and return them as a Spark frame."""
        self.fs.create_dir(self.root, recursive=True)
        path = f"{self.root}/canonical.parquet"
        with self.fs.open_output_stream(path) as sink:
            events.lazy().collect(engine="streaming").write_parquet(sink, compression="snappy")
        return self.spark.read.parquet(self.uri("canonical.parquet"))

    def first_seen(self, canonical: Any) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The engine's half of :func:`hir.data.prepare.first_seen_tables`."""
        from pyspark.sql import functions as F

        ent = canonical.groupBy("entity_type", "entity_key").agg(F.min("timestamp").alias("first_seen"))
        users = canonical.groupBy("user_key").agg(F.min("timestamp").alias("first_seen"))
        return _to_polars(ent), _to_polars(users)

    def write(
        self,
        canonical: Any,
        users: pl.DataFrame,
        entities: dict[str, pl.DataFrame],
        stage_order: Sequence[str],
        bounds: dict[str, datetime],
        out_dir: Path,
    ) -> dict[str, int]:
        """``events.parquet`` and ``edges/user__engages__<type>.parquet``; rows per relation."""
        from pyspark.sql import functions as F

        key_type = dict(canonical.dtypes)["entity_key"]
        user_map = self._frame(users.select(pl.col("key").alias("user_key"), pl.col("node_id").alias("user_id")))
        ent_map = self._frame(pl.concat([
            f.select(pl.lit(t).alias("entity_type"), pl.col("key").alias("entity_key"), pl.col("node_id").alias("entity_id"))
            for t, f in sorted(entities.items())
        ])).withColumn("entity_key", F.col("entity_key").cast(key_type))
        us = F.unix_micros(F.col("timestamp"))
        split = (F.when(us >= F.lit(_micros(bounds["test_start"])), "test")
                 .when(us >= F.lit(_micros(bounds["val_start"])), "val").otherwise("train"))
        rank = F.create_map(*[x for i, s in enumerate(stage_order) for x in (F.lit(s), F.lit(i))])
        events = (
            canonical.join(F.broadcast(user_map) if users.height < 5_000_000 else user_map, "user_key")
            .join(ent_map, ["entity_type", "entity_key"])
            .select(
                "user_id", "entity_id", "entity_type", "stage", rank[F.col("stage")].cast("byte").alias("stage_rank"),
                "timestamp", split.alias("split"), "quantity", "value", F.col("session").cast("string"),
            )
            .cache()
        )
        events.write.mode("overwrite").parquet(self.uri("events"))
        self.assemble("events", out_dir / "events.parquet", EVENTS_SCHEMA)

        split_rank = F.create_map(*[x for i, s in enumerate(SPLITS) for x in (F.lit(s), F.lit(i))])
        edges = events.groupBy("user_id", "entity_type", "entity_id", "stage", "stage_rank", "split").agg(
            F.count(F.lit(1)).alias("count"), F.min("timestamp").alias("first_ts"),
            F.max("timestamp").alias("last_ts"), F.sum("value").alias("value"),
        ).cache()
        counts: dict[str, int] = {}
        for etype in sorted(entities):
            name = engage_relation(etype)
            part = (
                edges.filter(F.col("entity_type") == etype)
                .orderBy("user_id", "entity_id", "stage_rank", split_rank[F.col("split")])
                .select(F.col("user_id").alias("src_id"), F.col("entity_id").alias("dst_id"), "stage", "split",
                        "count", "first_ts", "last_ts", "value")
            )
            part.write.mode("overwrite").parquet(self.uri(f"edges_{name}"))
            counts[name] = self.assemble(f"edges_{name}", out_dir / "edges" / f"{name}.parquet", EDGES_SCHEMA)
        edges.unpersist()
        events.unpersist()
        return {k: v for k, v in counts.items() if v}

    def _frame(self, frame: pl.DataFrame) -> Any:
        return self.spark.createDataFrame(frame.to_pandas())

    def assemble(self, name: str, target: Path, schema: pa.Schema) -> int:
        """Stream Spark's part files of ``work_dir/name``, in part order, into one Parquet file
        with the contract's ``schema``; returns its rows (an empty result writes no file)."""
        parts = sorted(
            (f.path for f in self.fs.get_file_info(pafs.FileSelector(f"{self.root}/{name}"))
             if f.base_name.startswith("part-") and f.base_name.endswith(".parquet")),
            key=lambda p: p.rsplit("/", 1)[-1],
        )
        rows = 0
        writer: pq.ParquetWriter | None = None
        try:
            for path in parts:
                pfile = pq.ParquetFile(path, filesystem=self.fs)
                for batch in pfile.iter_batches(batch_size=1 << 20):
                    table = pa.Table.from_batches([batch]).select(schema.names).cast(schema)
                    if writer is None:
                        writer = pq.ParquetWriter(target, schema, compression="lz4")
                    writer.write_table(table)
                    rows += table.num_rows
        finally:
            if writer is not None:
                writer.close()
        return rows

    def stop(self) -> None:
        """Stop the session and drop the work dir when it is the local default."""
        self.spark.stop()
        if not self.options.work_dir:
            shutil.rmtree(self.work, ignore_errors=True)


def _to_polars(frame: Any) -> pl.DataFrame:
    """A (small) Spark frame on the driver, timestamps as UTC microseconds."""
    table = frame.toArrow()
    out = pl.from_arrow(table)
    return out.with_columns(pl.col(c).dt.cast_time_unit("us").dt.convert_time_zone("UTC")
                            for c, t in out.schema.items() if isinstance(t, pl.Datetime))
