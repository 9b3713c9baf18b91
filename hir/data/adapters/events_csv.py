"""Any CSV/Parquet of (user, item, behaviour, time) events, mapped by config alone.

    hir prepare data=events_csv data.path=UserBehavior.csv \
        data.columns.user=user_id data.columns.item=item_id \
        data.columns.stage=behavior data.columns.timestamp=ts \
        'data.stages={pv: view, fav: save, cart: cart, buy: purchase}'

Optional: ``data.columns.category`` (a per-event item category, dotted paths become a taxonomy
with ``data.category_separator=.``), ``data.entities_path`` (item metadata: key column, text,
category, any other columns become attributes), ``data.timestamp_format``,
``data.columns.timestamp=null`` (no event times: a seeded random split of the (user, item)
pairs, see :mod:`hir.data.split`) and ``data.test_path`` (a shipped test file, same columns).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import polars as pl

from hir.data import quality as q
from hir.data.adapters.common import (
    CANONICAL,
    clean_text,
    event_checks,
    event_reason_columns,
    map_stages,
    string_key,
)
from hir.data.raw import Quarantine, RawDataset
from hir.data.schema import TS
from hir.data.steps import taxonomy_edges
from hir.errors import InputError

# funnel order of the stage names hir knows; a custom stage needs data.stage_order
KNOWN_ORDER = ("impression", "exposure", "view", "click", "save", "cart", "coupon", "purchase")
# behaviour values read without a data.stages mapping: hir's stage names and the UserBehavior
# (Taobao) abbreviations
KNOWN_STAGES = {**{s: s for s in KNOWN_ORDER}, "pv": "view", "fav": "save", "buy": "purchase"}
# required roles; data.columns.timestamp may be null (no event times: a seeded random split)
ROLES = ("user", "item", "stage")

log = logging.getLogger(__name__)


def load(
    quarantine: Quarantine,
    path: str,
    columns: Mapping[str, str | None],
    stages: Mapping[str, str] | None = None,
    stage_order: list[str] | None = None,
    timestamp_format: str = "auto",
    entities_path: str | None = None,
    entity_columns: Mapping[str, str | None] | None = None,
    category_separator: str | None = None,
    separator: str = ",",
    time_range: tuple[str | None, str | None] = (None, None),
    test_path: str | None = None,
) -> RawDataset:
    """Validate and map a generic event file; see the module docstring for the config keys.

    Args:
        stages: raw behaviour value -> hir stage. It is the whole mapping: a value it lacks is
            an error that lists the values seen. None: the known names (:data:`KNOWN_STAGES`).
        test_path: a shipped held-out file with the same columns: the test split exactly as
            given (val is carved from ``path``; see :mod:`hir.data.split`).
    """
    if not path or path == "???":
        raise InputError("events_csv: set data.path=<your events CSV or Parquet file>")
    unset = [r for r in ROLES if not columns.get(r)]
    if unset:
        raise InputError(
            f"events_csv: data.columns.{unset[0]} is not set; map every role "
            f"({', '.join(f'data.columns.{r}=<column>' for r in ROLES)}; data.columns.timestamp=null when the "
            "file has no event times)"
        )
    col = {role: name for role, name in columns.items() if name}
    if stages is None:
        stages = KNOWN_STAGES
        log.info(
            "data.stages is not set: using the known behaviour names %s; any other value is refused, map "
            "yours with data.stages={value: stage, ...}", ", ".join(f"{k}->{v}" for k, v in KNOWN_STAGES.items()),
        )
    items_col = col["item"]
    meta = None
    if entities_path:
        meta = _entities(quarantine, entities_path, entity_columns or {}, items_col, separator)
    read = dict(col=col, stages=stages, timestamp_format=timestamp_format, separator=separator,
                time_range=q.time_bounds(*time_range), known_items=None if meta is None else meta["key"])
    kept = _events(quarantine, "events", path, "events_csv events", **read)
    held = _events(quarantine, "test_events", test_path, "events_csv test events (data.test_path)", **read) \
        if test_path else None
    both = kept if held is None else pl.concat([kept, held])

    seen = [s for s in both["stage"].unique().to_list() if s is not None]
    order = list(stage_order) if stage_order else _default_order(seen)
    items = (
        both.sort("timestamp", maintain_order=True)
        .group_by("entity_key", maintain_order=True)
        .agg(pl.col("_cat").drop_nulls().last(), pl.col("_text").drop_nulls().last().alias("text"))
        .rename({"entity_key": "key"})
    )
    if meta is not None:
        items = meta.join(items.select("key", pl.col("_cat").alias("_ev_cat")), on="key", how="full", coalesce=True)
        items = items.with_columns(pl.coalesce("_cat", "_ev_cat").alias("_cat")).drop("_ev_cat")
    entities: dict[str, pl.DataFrame] = {"product": items.drop("_cat")}
    relations: dict[str, pl.DataFrame] = {}
    cats = items.filter(pl.col("_cat").is_not_null())
    if cats.height:
        if category_separator:
            nodes, parents = taxonomy_edges(cats.select(pl.col("_cat").alias("path")), category_separator)
            relations["category__child_of__category"] = parents
        else:
            nodes = cats.select(pl.col("_cat").unique().sort().alias("key")).with_columns(
                pl.col("key").alias("text"), pl.lit(1.0).alias("attr_level")
            )
        entities["category"] = nodes
        relations["product__in_category__category"] = cats.select(
            pl.col("key").alias("src_key"), pl.col("_cat").alias("dst_key")
        )
    return RawDataset(
        events=kept.select(CANONICAL).lazy(), stage_order=order, entities=entities, relations=relations,
        has_timestamps="timestamp" in col, heldout=None if held is None else held.select(CANONICAL).lazy(),
        sources=(str(path), str(test_path)),
    )


def _events(
    quarantine: Quarantine,
    name: str,
    path: str,
    what: str,
    col: Mapping[str, str],
    stages: Mapping[str, str],
    timestamp_format: str,
    separator: str,
    time_range: tuple,
    known_items: pl.Series | None,
) -> pl.DataFrame:
    """One event file: read, check every row, quarantine the bad ones, map to canonical columns
    (plus ``_cat`` and ``_text``). Without a timestamp column, ``timestamp`` is null and repeated
    rows are repeated engagement (counted), not duplicates."""
    raw = q.read_table(path, [], what, separator)
    for role, name_ in col.items():
        if name_ not in raw.columns:
            raise InputError(
                f"{what}: {path} has no column {name_!r} (mapped by data.columns.{role}); columns found: "
                f"{[c for c in raw.columns if c != q.ROW]}; fix it with data.columns.{role}=<one of those>"
            )
    q.require_plain_types(raw, list(col.values()), path, what)
    # columns hir does not read, of types with no text form (lists, structs, bytes): not kept
    unread = [c for c in raw.columns if c not in col.values() and c != q.ROW and not q.is_plain(raw.schema[c])]
    if unread:
        log.warning("%s: %s columns %s are not mapped and have no text form; not kept in the quarantine", what, path,
                    unread)
        raw = raw.drop(unread)
    raw = raw.with_columns(pl.col(c).cast(pl.String) for c in raw.columns if c != q.ROW)
    has_ts = "timestamp" in col
    ts = q.parse_timestamp(col["timestamp"], timestamp_format) if has_ts else pl.lit(None, TS)
    stage = map_stages(raw, col["stage"], stages, path, what)
    optional_text = [col[r] for r in ("category", "session", "text") if r in col]
    numeric = [col[r] for r in ("quantity", "value") if r in col]
    checks = event_checks(
        raw, user=col["user"], item=col["item"], stage=col["stage"], timestamp=col.get("timestamp"), parsed_ts=ts,
        time_range=time_range, numeric=numeric, text=[col["user"], col["item"], *optional_text], dedupe=has_ts,
    )
    where = event_reason_columns(user=col["user"], item=col["item"], stage=col["stage"],
                                 timestamp=col.get("timestamp"), numeric=numeric)
    at = len(checks) - 1 if has_ts else len(checks)  # before the duplicate check
    if "quantity" in col:
        checks.insert(at, ("negative_quantity", q.parse_float(col["quantity"]) < 0))
        where["negative_quantity"] = col["quantity"]
        at += 1
    if known_items is not None:
        checks.insert(at, ("unknown_item", ~string_key(col["item"]).is_in(known_items.implode())))
        where["unknown_item"] = col["item"]

    df = q.with_reason(raw, checks).with_columns(
        string_key(col["user"]).alias("user_key"),
        string_key(col["item"]).alias("entity_key"),
        pl.lit("product").alias("entity_type"),
        stage.alias("stage"),
        ts.alias("timestamp"),
        (q.parse_float(col["quantity"]) if "quantity" in col else pl.lit(1.0)).alias("quantity"),
        (q.parse_float(col["value"]) if "value" in col else pl.lit(0.0)).fill_null(0.0).alias("value"),
        (clean_text(col["session"]) if "session" in col else pl.lit(None, pl.String)).alias("session"),
        (clean_text(col["category"]) if "category" in col else pl.lit(None, pl.String)).alias("_cat"),
        (clean_text(col["text"]) if "text" in col else pl.lit(None, pl.String)).alias("_text"),
    )
    raw_cols = [c for c in raw.columns if c != q.ROW]
    return quarantine.split(name, path, df, raw_cols, [*CANONICAL, "_cat", "_text"], reason_columns=where)


def _default_order(seen: list[str]) -> list[str]:
    custom = sorted(set(seen) - set(KNOWN_ORDER))
    if custom:
        raise InputError(
            f"events_csv: stages {custom} have no known funnel position; list the full order, "
            f"shallowest first, e.g. data.stage_order=[{', '.join(sorted(seen))}]"
        )
    return [s for s in KNOWN_ORDER if s in seen]


def _entities(
    quarantine: Quarantine, path: str, cols: Mapping[str, str | None], item_col: str, separator: str
) -> pl.DataFrame:
    """Item metadata: ``key``, ``text``, ``_cat`` and ``attr_<column>`` for every other column."""
    key = cols.get("key") or item_col
    what = "events_csv entities (data.entities_path)"
    df = q.read_table(path, [key], what, separator)
    df = df.with_columns(pl.col(c).cast(pl.String) for c in df.columns if c != q.ROW)
    text_col, cat_col = cols.get("text"), cols.get("category")
    q.require_columns(df.columns, [c for c in (text_col, cat_col) if c], path, what)
    raw_cols = [c for c in df.columns if c != q.ROW]
    attrs = [c for c in raw_cols if c not in (key, text_col, cat_col)]
    df = q.with_reason(
        df,
        [
            ("missing_key", q.missing(key)),
            ("non_utf8_text", q.non_utf8(raw_cols)),
            ("duplicate_key", q.duplicated([key])),
        ],
    ).with_columns(
        string_key(key).alias("key"),
        (clean_text(text_col) if text_col else pl.lit(None, pl.String)).alias("text"),
        (clean_text(cat_col) if cat_col else pl.lit(None, pl.String)).alias("_cat"),
        *[clean_text(c).alias(f"attr_{c}") for c in attrs],
    )
    name = Path(path).stem.split(".")[0] or "entities"
    keep = ["key", "text", "_cat", *[f"attr_{c}" for c in attrs]]
    return quarantine.split(f"entities_{name}", path, df, raw_cols, keep, kind="entities")
