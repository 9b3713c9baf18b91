"""Event-table validation shared by the CSV-based adapters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import polars as pl

from hir.data import quality as q
from hir.errors import InputError

CANONICAL = ["user_key", "entity_key", "entity_type", "stage", "timestamp", "quantity", "value", "session"]


def map_stages(df: pl.DataFrame, col: str, stages: Mapping[str, str], path: Path | str, what: str) -> pl.Expr:
    """Raw behaviour values -> canonical stages; any value without a mapping is a structural error.

    Empty/missing values are left to the row checks (they quarantine as ``missing_stage``).
    """
    seen = df.select(pl.col(col).drop_nulls().str.strip_chars().unique()).to_series().to_list()
    unmapped = sorted(v for v in seen if v != "" and v not in stages)
    if unmapped:
        counts = (
            df.filter(pl.col(col).str.strip_chars().is_in(unmapped))
            .group_by(pl.col(col).str.strip_chars())
            .len()
            .sort("len", descending=True)
        )
        listing = ", ".join(f"{v!r} ({n} rows)" for v, n in counts.iter_rows())
        raise InputError(
            f"{what}: {path} column {col!r} has values with no stage mapping: {listing}. "
            f"Values seen: {sorted(seen)}. Map each one, e.g. data.stages={{{unmapped[0]}: purchase}}"
        )
    return pl.col(col).str.strip_chars().replace_strict(dict(stages), default=None, return_dtype=pl.String)


def event_checks(
    df: pl.DataFrame,
    *,
    user: str,
    item: str,
    stage: str,
    timestamp: str | None,
    parsed_ts: pl.Expr,
    time_range: tuple,
    numeric: Sequence[str] = (),
    text: Sequence[str] = (),
    dedupe: bool = True,
) -> list[tuple[str, pl.Expr]]:
    """The row checks every event table gets, in the order reasons are assigned
    (``timestamp=None``: the table has no event times, so no time checks)."""
    checks: list[tuple[str, pl.Expr]] = [
        ("missing_user", q.missing(user)),
        ("missing_item", q.missing(item)),
        ("missing_stage", q.missing(stage)),
        *(q.timestamp_checks(parsed_ts, timestamp, *time_range) if timestamp else []),
    ]
    checks += [(f"non_finite_{c}", q.bad_float(c)) for c in numeric]
    if text:
        checks.append(("non_utf8_text", q.non_utf8(text)))
    if dedupe:
        checks.append(("duplicate_row", q.duplicated([c for c in df.columns if c != q.ROW])))
    return checks


def event_reason_columns(
    *, user: str, item: str, stage: str, timestamp: str | None, numeric: Sequence[str] = ()
) -> dict[str, str]:
    """Reason of :func:`event_checks` -> the raw column it reads (for quarantine messages)."""
    out = {"missing_user": user, "missing_item": item, "missing_stage": stage}
    if timestamp:
        out |= {r: timestamp for r in ("missing_timestamp", "unparseable_timestamp", "timestamp_out_of_range")}
    return out | {f"non_finite_{c}": c for c in numeric}


def string_key(col: str) -> pl.Expr:
    """Ids as clean text: whitespace stripped, a float-like ``17850.0`` becomes ``17850``."""
    return pl.col(col).cast(pl.String).str.strip_chars().str.replace(r"^(-?\d+)\.0+$", "${1}")


def clean_text(col: str) -> pl.Expr:
    """Trimmed text with runs of spaces collapsed; empty becomes null."""
    s = pl.col(col).cast(pl.String).str.strip_chars().str.replace_all(r"\s+", " ")
    return pl.when(s == "").then(None).otherwise(s)
