"""The suite of ``funnel/open_funnel.parquet`` (`hir funnel`): what `hir publish` serves as the
user's open funnel must be well formed before it is published.

Checks: the columns of :data:`hir.funnel.source.COLUMNS` plus ``pos`` and ``event_timestamp``
with their dtype families; non-null ids inside the snapshot's node counts; one row per (user,
entity); ``deepest`` a stage rank and ``gap`` >= 0; ``converted`` == (``n_target`` > 0); counts
>= 1 (``n_target`` >= 0); every age >= 0; ``pos`` unique per user and >= 0; ``event_timestamp``
equal to the export's (the rows describe the same cut-off as the embeddings they are served with).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import great_expectations.expectations as gxe
import polars as pl

from hir.data.snapshot import Snapshot
from hir.funnel import cycle
from hir.funnel.source import COLUMNS
from hir.validate import views
from hir.validate.suites import Table, _e, _not_null, flag

SOURCE = "funnel/open_funnel.parquet"
FLOATS = ("age_days", "target_age_days", "user_last_days", "entity_conversion", "entity_repeat", *cycle.FLOAT_COLUMNS)
EXPECTED = {
    **{c: "float" if c in FLOATS else "bool" if c == "converted" else "int" for c in COLUMNS},
    "pos": "int", "event_timestamp": "datetime",
}


def funnel_view(frame: pl.DataFrame, n_users: int, n_entities: int, n_stages: int,
                export_ts: datetime | None) -> pl.DataFrame:
    """Per pair row: ``id`` ("user:entity"), the source columns GE checks directly, and the
    derived flags ``user_ok``, ``entity_ok``, ``stage_ok``, ``converted_ok``, ``pos_ok``, ``ts_ok``."""
    ts_ok = pl.col("event_timestamp") == pl.lit(export_ts, pl.Datetime("us", "UTC")) if export_ts is not None \
        else pl.lit(True)
    # the range-checked columns widened to int64 / float64 (exact: every bound is an integer):
    # GE 1.24 checks a range on those dtypes vectorised, on int8 / int32 / float32 with one Python
    # call per row (~1.25M rows on completejourney)
    return frame.select(
        pl.format("{}:{}", "user_id", "entity_id").alias("id"),
        "user_id", "entity_id",
        *[pl.col(c).cast(pl.Int64) for c in ("gap", "pos", "n_events", "n_deepest", "n_target")],
        *[pl.col(c).cast(pl.Float64) for c in ("age_days", "target_age_days", "user_last_days")],
        pl.col("user_id").is_between(0, n_users - 1).fill_null(False).alias("user_ok"),
        pl.col("entity_id").is_between(0, n_entities - 1).fill_null(False).alias("entity_ok"),
        pl.col("deepest").is_between(0, n_stages - 1).fill_null(False).alias("stage_ok"),
        (pl.col("converted") == (pl.col("n_target") > 0)).fill_null(False).alias("converted_ok"),
        (~pl.struct("user_id", "pos").is_duplicated()).alias("pos_ok"),
        ts_ok.fill_null(False).alias("ts_ok"),
    )


def funnel_table(view: pl.DataFrame, n_users: int, n_entities: int, export_ts: datetime | None) -> Table:
    """The expectations of the module docstring over :func:`funnel_view`."""
    ts_check = f"event_timestamp = the export's ({export_ts})" if export_ts else "event_timestamp (no export time)"
    return Table("funnel_open_funnel", SOURCE, view, [
        *_not_null("user_id", "entity_id", "gap", "pos", "age_days", "user_last_days"),
        _e(gxe.ExpectColumnValuesToBeUnique, "user_id, entity_id", "one row per (user, entity)", column="id"),
        flag("user_ok", "user_id", f"user_id a user node id in [0, {n_users - 1}]"),
        flag("entity_ok", "entity_id", f"entity_id an entity node id in [0, {n_entities - 1}]"),
        flag("stage_ok", "deepest", "deepest a stage rank of the snapshot"),
        _e(gxe.ExpectColumnValuesToBeBetween, "gap", "gap >= 0", column="gap", min_value=0),
        flag("converted_ok", "converted", "converted == (n_target > 0)"),
        _e(gxe.ExpectColumnValuesToBeBetween, "n_events", "n_events >= 1", column="n_events", min_value=1),
        _e(gxe.ExpectColumnValuesToBeBetween, "n_deepest", "n_deepest >= 1", column="n_deepest", min_value=1),
        _e(gxe.ExpectColumnValuesToBeBetween, "n_target", "n_target >= 0", column="n_target", min_value=0),
        *[_e(gxe.ExpectColumnValuesToBeBetween, c, f"{c} >= 0 (null: never)" if c == "target_age_days" else
             f"{c} >= 0", column=c, min_value=0.0) for c in ("age_days", "target_age_days", "user_last_days")],
        _e(gxe.ExpectColumnValuesToBeBetween, "pos", "pos >= 0", column="pos", min_value=0),
        flag("pos_ok", "pos", "pos unique per user"),
        flag("ts_ok", "event_timestamp", ts_check),
    ])


def schema_table(view: pl.DataFrame) -> Table:
    """The file's columns exist with the right dtype family."""
    return Table("funnel_open_funnel_columns", f"{SOURCE} (columns)", view, [
        flag("present", "*", "column of hir.funnel.source.COLUMNS + pos, event_timestamp present"),
        flag("dtype_ok", "*", "column dtype family as written by `hir funnel`"),
    ])


def export_timestamp(emb_dir: Path, emb_meta: dict[str, Any]) -> datetime | None:
    """The export's ``event_timestamp`` (its cut-off): meta.json's, else the first table's rows."""
    if emb_meta.get("event_timestamp"):
        return datetime.fromisoformat(emb_meta["event_timestamp"])
    files = sorted(emb_dir.glob("*.parquet"))
    if not files:
        return None
    return pl.read_parquet(files[0], columns=["event_timestamp"])["event_timestamp"].min()


def funnel_tables(funnel_dir: Path, snap: Snapshot, export_ts: datetime | None) -> list[Table]:
    """The tables of ``funnel_dir/open_funnel.parquet`` (the content checks only when every column is there)."""
    frame = pl.read_parquet(funnel_dir / "open_funnel.parquet")
    meta_path = funnel_dir / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    schema = views.schema_view(dict(frame.schema), EXPECTED)
    tables = [schema_table(schema)]
    if not schema["dtype_ok"].all():
        return tables
    n_users = snap.num_nodes("user")
    etype = meta.get("entity_type", "product")
    n_entities = snap.num_nodes(etype) if snap.has_nodes(etype) else 0
    view = funnel_view(frame, n_users, n_entities, len(snap.stage_order), export_ts)
    tables.append(funnel_table(view, n_users, n_entities, export_ts))
    return tables
