"""Gowalla check-ins in the LightGCN benchmark split (``train.txt``, ``test.txt``).

Each line is ``user item item ...`` (space-separated 0-based integer ids). Every (user, item)
token is one input row (``_row`` is its line number), one event of the single stage ``checkin``
(the deep stage: retrieval and the contrastive objective target it). There are no timestamps:
``test.txt`` is the test split exactly as shipped, val is a seeded ``data.split.val_fraction``
of the ``train.txt`` pairs, and event times are synthesized (:mod:`hir.data.split`).

Keys stay integers, so node ids equal the benchmark's ids whenever every id occurs (it does on
the published files). The files are checked against the README's md5 and pair counts; a
mismatch is an error that names the file. See ../shared/data/gowalla_lightgcn/README.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import polars as pl

from hir.data import quality as q
from hir.data.adapters.common import CANONICAL
from hir.data.raw import Quarantine, RawDataset
from hir.data.schema import TS
from hir.errors import InputError

RAW = ["user", "item"]


def load(
    quarantine: Quarantine,
    train_path: str,
    test_path: str,
    stage: str = "checkin",
    md5: Mapping[str, str | None] | None = None,
    pairs: Mapping[str, int | None] | None = None,
) -> RawDataset:
    """Read and check both files.

    Args:
        train_path, test_path: the benchmark's ``train.txt`` and ``test.txt``.
        stage: the name of the one engagement stage.
        md5: ``{train: ..., test: ...}`` expected md5 of each file (null: not checked).
        pairs: ``{train: ..., test: ...}`` expected (user, item) tokens per file (null: not checked).
    """
    md5, pairs = md5 or {}, pairs or {}
    train = _read(quarantine, "train", train_path, stage, md5.get("train"), pairs.get("train"))
    test = _read(quarantine, "test", test_path, stage, md5.get("test"), pairs.get("test"))
    return RawDataset(
        events=train, heldout=test, stage_order=[stage], has_timestamps=False,
        sources=(str(train_path), str(test_path)),
    )


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


def _read(
    quarantine: Quarantine, split: str, path: str, stage: str, md5: str | None, expected: int | None
) -> pl.LazyFrame:
    what = f"gowalla {split} file"
    src = q.check_file(path, what)
    if md5:
        found = hashlib.md5(src.read_bytes()).hexdigest()
        if found != md5:
            raise InputError(
                f"{what}: {src} has md5 {found}, expected {md5} (the LightGCN benchmark file in the dataset "
                f"README); replace it with the published {src.name}, or set data.adapter.md5.{split}=null to "
                "read another version"
            )
    rows = parse_lines(src)
    if expected is not None and rows.height != expected:
        raise InputError(
            f"{what}: {src} has {rows.height} (user, item) pairs, expected {expected} (dataset README); the file "
            f"is truncated or another version; replace it, or set data.adapter.pairs.{split}=null"
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
        f"gowalla_{split}", src, df, RAW, CANONICAL,
        reason_columns={"unparseable_user": "user", "unparseable_item": "item", "duplicate_pair": "item"},
    )
    return kept.lazy()
