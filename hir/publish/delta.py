"""The `hir refresh` delta: one file format for new entities, whatever the dataset.

A CSV (``.csv``, ``.csv.gz``) or Parquet file with one row per new entity, or one row per first
event of one (the entity's columns repeated, or given on one of its rows):

=================  ==========================================================================
``entity_id``      required: the entity's key in the dataset's id space (embeddings' ``entity_id``)
``entity_type``    user | product | advertiser | campaign | category; default ``refresh.entity_type``
``text``           what the text encoder reads (``text`` of ``graph/nodes/<type>.parquet``)
``attr_<name>``    attributes, named as the type's ``attr_*`` columns in ``graph/nodes/<type>.parquet``
``category``,      keys of snapshot entities the new one links to: a product's category and
``advertiser``,    advertiser, a campaign's advertiser and promoted products, a category's parent;
``product``        one key per cell (more rows for more links)
``timestamp``      when the entity appeared (ISO 8601 or epoch seconds/ms); its features are
                   valid from then, never before the live export's cutoff; default: refresh time
``user_id``,       with ``timestamp``: the entity's first events (``stage`` one of the snapshot's
``stage``          stages); recorded beside the refresh, the earliest one is its ``timestamp``
=================  ==========================================================================

Every problem is an :class:`~hir.errors.InputError` naming the file, the column, the rows and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl

from hir.data import quality as q
from hir.data.schema import ENTITY_TYPES, METADATA_RELATIONS, TS
from hir.data.snapshot import Snapshot
from hir.errors import InputError

ROW = "_row"
EVENT_COLUMNS = ("user_id", "stage")
# link column (= the linked entity's type) -> relation, per source type
LINKS: dict[str, dict[str, str]] = {}
for _rel, (_src, _dst) in METADATA_RELATIONS.items():
    LINKS.setdefault(_src, {})[_dst] = _rel
CONTENT = ("text",)


@dataclass
class Delta:
    """A validated delta file.

    Attributes:
        path: the file.
        entities: entity type -> one row per new entity: ``key`` str, ``text``, the type's
            ``attr_*`` columns (as the snapshot types them), ``first_seen`` datetime (nullable),
            ``_row`` (first row of the entity in the file).
        links: entity type -> {key: [(linked type, linked key), ...]}.
        events: the first events: ``entity_type``, ``entity_id``, ``user_id``, ``stage``,
            ``timestamp`` (empty without event columns).
        rows: data rows in the file.
    """

    path: Path
    entities: dict[str, pl.DataFrame]
    links: dict[str, dict[str, list[tuple[str, str]]]] = field(default_factory=dict)
    events: pl.DataFrame = field(default_factory=pl.DataFrame)
    rows: int = 0


def _rows(frame: pl.DataFrame, limit: int = 5) -> str:
    """``rows 3, 8, 9`` (1-based data rows, header not counted) of ``frame``'s ``_row``."""
    rows = frame[ROW].to_list()
    more = f" (+{len(rows) - limit} more)" if len(rows) > limit else ""
    return f"row{'s' if len(rows) > 1 else ''} {', '.join(str(r) for r in rows[:limit])}{more}"


def read_file(path: Path) -> pl.DataFrame:
    """The delta as a frame of strings (CSV) or as stored (Parquet), plus ``_row``."""
    what = "hir refresh"
    if not path.exists():
        raise InputError(f"refresh.delta_path={path} does not exist; give the file of new entities "
                         "(docs/serving.md: Serving new entities between trainings)")
    if path.is_dir() or path.stat().st_size == 0:
        raise InputError(f"refresh.delta_path={path} is {'a directory' if path.is_dir() else 'empty'}; give a CSV or "
                         "Parquet file of new entities")
    name = path.name.lower()
    if name.endswith(".parquet"):
        try:
            frame = pl.read_parquet(path)
        except (pl.exceptions.PolarsError, OSError, ValueError) as err:
            raise InputError(f"{what}: cannot read {path} as Parquet ({q.brief(err)}); re-export the file "
                             "(a truncated or corrupt file, or duplicate column names)") from err
    elif name.endswith((".csv", ".csv.gz", ".tsv", ".tsv.gz")):
        try:
            frame = pl.read_csv(path, infer_schema=False, encoding="utf8-lossy",
                                separator="\t" if ".tsv" in name else ",")
        except (pl.exceptions.PolarsError, OSError, ValueError) as err:
            raise InputError(f"{what}: cannot parse {path} as CSV ({q.brief(err)}); check the separator and "
                             "quoting") from err
    else:
        raise InputError(f"{what}: {path} is neither .csv[.gz] nor .parquet; write the new entities as one of those")
    if frame.height == 0:
        raise InputError(f"{what}: {path} has no data rows; nothing to refresh")
    frame = q.strip_bom(frame)
    q.require_plain_types(frame, frame.columns, path, what)
    if "entity_id" not in frame.columns:
        raise InputError(f"{what}: {path} has no column 'entity_id' (columns found: {frame.columns}); every row names "
                         "the new entity's key in an entity_id column")
    return frame.with_row_index(ROW, offset=1)


def _node_columns(snap: Snapshot, etype: str) -> dict[str, pl.DataType]:
    """Column -> dtype of the snapshot's ``etype`` nodes (empty when it has none)."""
    return snap.node_schema(etype) if snap.has_nodes(etype) else {}


def _column_errors(frame: pl.DataFrame, path: Path, types: list[str], snap: Snapshot) -> None:
    """Unknown columns, unknown attributes of a type, and link columns a type cannot have."""
    known = {"entity_id", "entity_type", "text", "timestamp", *EVENT_COLUMNS, ROW}
    link_cols = {d for t in types for d in LINKS.get(t, {})}
    attrs = {c for t in types for c in _node_columns(snap, t) if c.startswith("attr_")}
    unknown = [c for c in frame.columns if c not in known | link_cols | attrs]
    if unknown:
        attr_help = {t: sorted(c for c in _node_columns(snap, t) if c.startswith("attr_")) for t in types}
        raise InputError(
            f"hir refresh: {path} has columns {unknown} that no entity type of the file takes. Columns: entity_id, "
            f"entity_type, text, timestamp, user_id, stage; attributes per type {attr_help}; links per type "
            f"{ {t: sorted(LINKS.get(t, {})) for t in types} }. Rename or drop them"
        )
    if any(c in frame.columns for c in EVENT_COLUMNS) and not all(c in frame.columns for c in (*EVENT_COLUMNS, "timestamp")):
        raise InputError(f"hir refresh: {path} has {[c for c in EVENT_COLUMNS if c in frame.columns]} but events need "
                         "all of user_id, stage and timestamp; add the missing columns or drop these")


def _types(frame: pl.DataFrame, path: Path, default: str, served: list[str], snap: Snapshot) -> pl.DataFrame:
    if "entity_type" in frame.columns:
        etype = pl.col("entity_type").cast(pl.String).str.strip_chars()
        etype = pl.when(etype == "").then(None).otherwise(etype)
    else:
        etype = pl.lit(None, pl.String)
    frame = frame.with_columns(pl.coalesce(etype, pl.lit(default)).alias("entity_type"))
    bad = frame.filter(~pl.col("entity_type").is_in(list(ENTITY_TYPES)))
    if bad.height:
        raise InputError(f"hir refresh: {path} column entity_type has {sorted(set(bad['entity_type']))} at "
                         f"{_rows(bad)}; expected one of {list(ENTITY_TYPES)}")
    in_snapshot = [t for t in ENTITY_TYPES if snap.has_nodes(t)]
    unserved = frame.filter(~pl.col("entity_type").is_in(served) | ~pl.col("entity_type").is_in(in_snapshot))
    if unserved.height:
        raise InputError(f"hir refresh: {path} has {sorted(set(unserved['entity_type']))} entities at {_rows(unserved)}, "
                         f"but the live version serves {sorted(served)} (a type must be in the snapshot and published)")
    return frame


def _timestamps(frame: pl.DataFrame, path: Path) -> pl.DataFrame:
    if "timestamp" not in frame.columns:
        return frame.with_columns(pl.lit(None, TS).alias("timestamp"))
    raw = frame["timestamp"]
    if raw.dtype == pl.Datetime or raw.dtype == pl.Date:
        parsed = raw.cast(pl.Datetime("us"))
        parsed = parsed.dt.replace_time_zone("UTC") if parsed.dtype.time_zone is None else parsed.dt.convert_time_zone("UTC")
        return frame.with_columns(parsed.alias("timestamp"))
    frame = frame.with_columns(q.parse_timestamp("timestamp").alias("_ts"))
    bad = frame.filter(pl.col("_ts").is_null() & pl.col("timestamp").cast(pl.String).str.strip_chars().ne(""))
    if bad.height:
        raise InputError(f"hir refresh: {path} column timestamp has unparseable values "
                         f"{bad['timestamp'].cast(pl.String).head(3).to_list()} at {_rows(bad)}; write ISO 8601 "
                         "(2017-12-01 10:30:00, UTC unless an offset is given) or epoch seconds/milliseconds")
    return frame.drop("timestamp").rename({"_ts": "timestamp"})


def _attributes(frame: pl.DataFrame, etype: str, path: Path, snap: Snapshot) -> pl.DataFrame:
    """The type's attr columns with the snapshot's dtypes (numbers stay numbers)."""
    out = []
    for col, dtype in _node_columns(snap, etype).items():
        if not col.startswith("attr_") or col not in frame.columns:
            continue
        s = frame[col]
        if isinstance(s.dtype, pl.Categorical | pl.Enum):  # a dictionary-encoded Parquet column: its text
            s = s.cast(pl.String)
        if dtype.is_numeric() and s.dtype == pl.String:
            parsed = s.str.strip_chars().cast(pl.Float64, strict=False)
            bad = frame.filter(parsed.is_null() & s.is_not_null() & (s.str.strip_chars() != ""))
            if bad.height:
                raise InputError(f"hir refresh: {path} column {col} holds non-numbers {bad[col].head(3).to_list()} "
                                 f"at {_rows(bad)}; the snapshot's {etype} {col} is numeric: write a number or "
                                 "leave it empty")
            s = parsed
        elif dtype == pl.String:
            s = s.cast(pl.String).str.strip_chars()
            s = pl.select(pl.when(s == "").then(None).otherwise(s)).to_series()
        out.append(s.cast(dtype, strict=False).alias(col))
    return pl.DataFrame(out) if out else pl.DataFrame()


def _agree(group: pl.DataFrame, cols: list[str], etype: str, path: Path) -> None:
    """Rows of one entity may repeat its content, never contradict it."""
    for col in cols:
        values = group.select(pl.col("key"), pl.col(col)).drop_nulls().unique()
        clash = values.filter(pl.col("key").is_duplicated())
        if clash.height:
            key = clash["key"][0]
            rows = group.filter((pl.col("key") == key) & pl.col(col).is_not_null())
            raise InputError(f"hir refresh: {path} gives {etype} {key!r} different {col} values "
                             f"{rows[col].cast(pl.String).unique().head(3).to_list()} at {_rows(rows)}; one entity "
                             "has one content: make the rows agree (or leave the repeats empty)")


def read_delta(path: Path, default_type: str, served: list[str], snap: Snapshot) -> Delta:
    """Read and check the delta file against the live version's snapshot."""
    frame = read_file(path)
    frame = _types(frame, path, default_type, served, snap)
    types = sorted(set(frame["entity_type"]))
    _column_errors(frame, path, types, snap)
    frame = frame.with_columns(pl.col("entity_id").cast(pl.String).str.strip_chars().str.replace(r"^(-?\d+)\.0+$", "${1}"))
    missing = frame.filter(pl.col("entity_id").is_null() | (pl.col("entity_id") == ""))
    if missing.height:
        raise InputError(f"hir refresh: {path} column entity_id is empty at {_rows(missing)}; every row names its entity")
    frame = _timestamps(frame, path)
    entities: dict[str, pl.DataFrame] = {}
    links: dict[str, dict[str, list[tuple[str, str]]]] = {}
    for etype in types:
        rows = frame.filter(pl.col("entity_type") == etype)
        text = (rows.select(pl.col("text").cast(pl.String).str.strip_chars()).to_series() if "text" in rows.columns
                else pl.Series("text", [None] * rows.height, pl.String))
        text = pl.select(pl.when(text == "").then(None).otherwise(text)).to_series()
        body = pl.concat([rows.select(pl.col("entity_id").alias("key"), pl.col(ROW), pl.col("timestamp")),
                          text.alias("text").to_frame(), _attributes(rows, etype, path, snap)], how="horizontal")
        content = [c for c in body.columns if c in CONTENT or c.startswith("attr_")]
        _agree(body, content, etype, path)
        entities[etype] = body.group_by("key", maintain_order=True).agg(
            *[pl.col(c).drop_nulls().first() for c in content],
            pl.col("timestamp").min().alias("first_seen"), pl.col(ROW).min(),
        )
        links[etype] = _links(rows, etype, path, snap)
    events = pl.DataFrame(schema={"entity_type": pl.String, "entity_id": pl.String, "user_id": pl.String,
                                  "stage": pl.String, "timestamp": TS})
    if "user_id" in frame.columns:
        events = _events(frame, path, snap)
    return Delta(path, entities, links, events, frame.height)


def _links(rows: pl.DataFrame, etype: str, path: Path, snap: Snapshot) -> dict[str, list[tuple[str, str]]]:
    """{key: [(type, key), ...]} from the link columns; every linked key must be a snapshot entity."""
    out: dict[str, list[tuple[str, str]]] = {}
    for dst in LINKS.get(etype, {}):
        if dst not in rows.columns:
            continue
        col = rows.select(pl.col("entity_id"), pl.col(ROW),
                          pl.col(dst).cast(pl.String).str.strip_chars().str.replace(r"^(-?\d+)\.0+$", "${1}").alias("_to"))
        col = col.filter(pl.col("_to").is_not_null() & (pl.col("_to") != ""))
        if not col.height:
            continue
        if not snap.has_nodes(dst):
            raise InputError(f"hir refresh: {path} column {dst} links {etype} entities to {dst}s, but the snapshot has "
                             f"no {dst} entities; drop the column")
        unknown = col.filter(~pl.col("_to").is_in(snap.keys(dst).implode()))
        if unknown.height:
            example = snap.keys(dst).head(3).to_list()
            raise InputError(
                f"hir refresh: {path} column {dst} names {dst} keys the snapshot does not have "
                f"{unknown['_to'].unique(maintain_order=True).head(3).to_list()} at {_rows(unknown)}; link to existing "
                f"{dst} entities (keys of graph/nodes/{dst}.parquet, e.g. {example}) or leave the cell empty "
                "(new linked entities need a training run)"
            )
        for key, to in col.select("entity_id", "_to").unique(maintain_order=True).iter_rows():
            out.setdefault(key, []).append((dst, to))
    return out


def _events(frame: pl.DataFrame, path: Path, snap: Snapshot) -> pl.DataFrame:
    ev = frame.filter(pl.col("user_id").is_not_null() | pl.col("stage").is_not_null())
    ev = ev.with_columns(pl.col("user_id").cast(pl.String).str.strip_chars().str.replace(r"^(-?\d+)\.0+$", "${1}"),
                         pl.col("stage").cast(pl.String).str.strip_chars())
    incomplete = ev.filter(pl.col("user_id").is_null() | pl.col("stage").is_null() | pl.col("timestamp").is_null())
    if incomplete.height:
        raise InputError(f"hir refresh: {path} has events without a user_id, stage or timestamp at "
                         f"{_rows(incomplete)}; an event row needs all three (an entity-only row leaves user_id "
                         "and stage empty)")
    unknown = ev.filter(~pl.col("stage").is_in(snap.stage_order))
    if unknown.height:
        raise InputError(f"hir refresh: {path} column stage has {sorted(set(unknown['stage']))} at {_rows(unknown)}; "
                         f"the snapshot's stages are {snap.stage_order}")
    return ev.select("entity_type", "entity_id", "user_id", "stage", "timestamp")


def first_seen(delta: Delta, etype: str) -> dict[str, datetime | None]:
    """{key: when the entity appeared} (None when the file does not say)."""
    frame = delta.entities[etype]
    return dict(zip(frame["key"].to_list(), frame["first_seen"].to_list()))


def describe(delta: Delta) -> dict[str, Any]:
    """Counts for logs and the refresh record."""
    return {"rows": delta.rows, "entities": {t: f.height for t, f in delta.entities.items()},
            "links": {t: sum(len(v) for v in d.values()) for t, d in delta.links.items()},
            "events": delta.events.height}
