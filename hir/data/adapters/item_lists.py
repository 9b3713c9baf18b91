"""Files of ``user item item ...`` lines, as the LightGCN and GHCF benchmark releases ship them.

One line per user: the user's id, then the ids of the items it engaged with, space-separated
0-based integers (plain text or gzip). Every (user, item) token pair is one input row (``_row`` is
its line number) and one event of the file's stage, without a timestamp. A file is checked
against the dataset README's md5 and pair count before it is read; a mismatch is an error that
names the file and the config key that skips the check.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import polars as pl

from hir.data import quality as q
from hir.data.adapters.common import CANONICAL
from hir.data.raw import Quarantine
from hir.data.schema import TS
from hir.errors import InputError

RAW = ["user", "item"]


def parse_lines(path: Path) -> pl.DataFrame:
    """``user item item ...`` lines -> one row per token pair: ``_row`` (line), ``user``, ``item`` (text)."""
    lines = pl.read_csv(
        path, has_header=False, new_columns=["line"], separator="\x01", quote_char=None, infer_schema=False,
    )
    tokens = lines.with_row_index(q.ROW, offset=1).select(
        q.ROW, pl.col("line").str.strip_chars().str.split(" ").alias("tok")
    )
    return (
        tokens.select(q.ROW, pl.col("tok").list.first().alias("user"), pl.col("tok").list.slice(1).alias("item"))
        .explode("item")
        .filter(pl.col("item").is_not_null())  # a line with a user and no items has no pairs
    )


def read_pairs(
    quarantine: Quarantine,
    dataset: str,
    key: str,
    path: str,
    stage: str,
    md5: str | None,
    expected: int | None,
    origin: str,
) -> pl.LazyFrame:
    """One file as canonical events (Int64 keys, entity type ``product``, null timestamps).

    Args:
        dataset, key: name the source ``<dataset>_<key>`` (quarantine, ``meta.json``) and the
            checks' config keys ``data.adapter.md5.<key>`` / ``data.adapter.pairs.<key>``.
        path: the file.
        stage: the funnel stage of every event in it.
        md5: expected md5 of the file's bytes (None: not checked).
        expected: expected (user, item) pairs (None: not checked).
        origin: what the file should be, for the md5 message (e.g. "the LightGCN benchmark file").

    Unparseable ids and a pair repeated inside the file are quarantined with their line.
    """
    what = f"{dataset} {key} file"
    src = q.check_file(path, what)
    if md5:
        found = hashlib.md5(src.read_bytes()).hexdigest()
        if found != md5:
            raise InputError(
                f"{what}: {src} has md5 {found}, expected {md5} ({origin} in the dataset README); replace it with "
                f"the published {src.name}, or set data.adapter.md5.{key}=null to read another version"
            )
    rows = parse_lines(src)
    if expected is not None and rows.height != expected:
        raise InputError(
            f"{what}: {src} has {rows.height} (user, item) pairs, expected {expected} (dataset README); the file "
            f"is truncated or another version; replace it, or set data.adapter.pairs.{key}=null"
        )
    user, item = (pl.col(c).cast(pl.Int64, strict=False) for c in RAW)
    df = q.with_reason(rows, [
        ("unparseable_user", user.is_null() | (user < 0)),
        ("unparseable_item", item.is_null() | (item < 0)),
        ("duplicate_pair", q.duplicated(RAW)),
    ]).with_columns(
        user.alias("user_key"),
        item.alias("entity_key"),
        pl.lit("product").alias("entity_type"),
        pl.lit(stage).alias("stage"),
        pl.lit(None, TS).alias("timestamp"),
        pl.lit(1.0).alias("quantity"),
        pl.lit(0.0).alias("value"),
        pl.lit(None, pl.String).alias("session"),
    )
    kept = quarantine.split(
        f"{dataset}_{key}", src, df, RAW, CANONICAL,
        reason_columns={"unparseable_user": "user", "unparseable_item": "item", "duplicate_pair": "item"},
    )
    return kept.lazy()
