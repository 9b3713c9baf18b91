"""Input checks shared by the adapters.

Two kinds of problem:
- structural (missing file or column, empty or unreadable file, unmapped stage): raise
  :class:`hir.errors.InputError` naming the file, the column and the fix;
- row-level (bad timestamp, NaN, duplicate, unknown id, ...): the row gets a ``_reason`` and is
  quarantined by :func:`hir.data.raw.EventSource` handling in the builder; never dropped silently.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl

from hir.data.schema import TS
from hir.errors import InputError

REASON = "_reason"
ROW = "_row"
REPLACEMENT_CHAR = "\ufffd"

# ISO-like layouts tried in order, after stripping a trailing " UTC" / "Z"
_TS_FORMATS = (
    "%Y-%m-%d %H:%M:%S%.f",
    "%Y-%m-%dT%H:%M:%S%.f",
    "%Y-%m-%d %H:%M",
    "%Y-%m-%dT%H:%M",
    "%Y-%m-%d",
)


def brief(err: BaseException, limit: int = 300) -> str:
    """A library's error as one short line (polars' messages span lines with hints)."""
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_plain(dtype: pl.DataType) -> bool:
    """Text, a number, a boolean or a time: a type with one text form per cell."""
    return not (dtype.is_nested() or dtype in (pl.Binary, pl.Object) or isinstance(dtype, pl.Decimal))


def require_plain_types(df: pl.DataFrame, columns: Sequence[str], path: Path | str, what: str) -> None:
    """The ``columns`` hir reads hold text, numbers, booleans or times: a list, struct or binary
    column (a Parquet written by another tool) is refused naming the column and its type."""
    for c in columns:
        dtype = df.schema[c]
        if not is_plain(dtype):
            raise InputError(f"{what}: {path} column {c!r} has type {dtype}; hir reads text, numbers or times "
                             "there: write it as one of those (e.g. cast to string before writing the Parquet)")


def strip_bom(df: pl.DataFrame) -> pl.DataFrame:
    """Column names without a leading byte-order mark (how Excel and some exporters begin a
    UTF-8 file), so ``\ufeffuser_id`` is the ``user_id`` column; a clash stays a clear error."""
    names = [c.lstrip("\ufeff") for c in df.columns]
    if names == df.columns or len(set(names)) != len(names):
        return df
    return df.rename(dict(zip(df.columns, names, strict=True)))


def check_file(path: Path | str, what: str) -> Path:
    """The file exists, is not empty and (for .gz) decompresses to the end."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{what}: file {path} does not exist; fix the path in the data config (data.path=...)")
    if path.is_dir():
        raise InputError(f"{what}: {path} is a directory, expected a file")
    if path.stat().st_size == 0:
        raise InputError(f"{what}: file {path} is empty (0 bytes); re-export or re-download it")
    if path.suffix == ".gz":
        try:
            with gzip.open(path, "rb") as fh:
                while fh.read(1 << 22):
                    pass
        except (EOFError, OSError, zlib.error) as err:
            raise InputError(
                f"{what}: {path} is a truncated or corrupt gzip file ({err}); re-download it "
                "(delete the file and hir will fetch it again where the dataset has a download URL)"
            ) from err
    return path


def read_csv_strings(path: Path | str, required: Sequence[str], what: str, separator: str = ",") -> pl.DataFrame:
    """Read a CSV (optionally .gz) with every column as text, plus a 1-based ``_row`` column.

    Text that is not valid UTF-8 is decoded lossily so the row can be quarantined
    (:func:`non_utf8`) instead of failing the whole file.
    """
    path = check_file(path, what)
    try:
        df = pl.read_csv(path, infer_schema=False, encoding="utf8-lossy", separator=separator)
    except (pl.exceptions.PolarsError, OSError, ValueError) as err:
        raise InputError(f"{what}: cannot parse {path} as CSV ({brief(err)}); check the separator and quoting") from err
    if df.height == 0:
        raise InputError(f"{what}: {path} has a header but no data rows; nothing to prepare")
    df = strip_bom(df)
    require_columns(df.columns, required, path, what)
    return df.with_row_index(ROW, offset=1)


def read_table(path: Path | str, required: Sequence[str], what: str, separator: str = ",") -> pl.DataFrame:
    """CSV or Parquet by suffix; CSVs as text (see :func:`read_csv_strings`), Parquet as stored."""
    path = Path(path)
    if path.suffix == ".parquet" or path.name.endswith(".parquet"):
        check_file(path, what)
        try:
            df = pl.read_parquet(path)
        except (pl.exceptions.PolarsError, OSError, ValueError) as err:
            raise InputError(f"{what}: cannot read {path} as Parquet ({brief(err)}); re-export the file "
                             "(a truncated or corrupt file, or duplicate column names)") from err
        if df.height == 0:
            raise InputError(f"{what}: {path} has no rows; nothing to prepare")
        df = strip_bom(df)
        require_columns(df.columns, required, path, what)
        require_plain_types(df, required, path, what)
        return df.with_row_index(ROW, offset=1)
    return read_csv_strings(path, required, what, separator)


def require_columns(found: Sequence[str], required: Sequence[str], path: Path | str, what: str) -> None:
    missing = [c for c in required if c not in found]
    if missing:
        raise InputError(
            f"{what}: {path} has no column {', '.join(repr(c) for c in missing)} "
            f"(columns found: {list(found)}); fix the file or map the column in the data config "
            f"(e.g. data.columns.<role>=<column name>)"
        )


def with_reason(df: pl.DataFrame | pl.LazyFrame, checks: Sequence[tuple[str, pl.Expr]]):
    """Add ``_reason``: the name of the first check whose expression is true, else null.

    A row keeps the reason it already had (checks run in order; the earliest wins).
    """
    expr = pl.lit(None, dtype=pl.String)
    for reason, bad in reversed(checks):
        expr = pl.when(bad.fill_null(False)).then(pl.lit(reason)).otherwise(expr)
    if REASON in df.collect_schema().names():
        expr = pl.coalesce(pl.col(REASON), expr)
    return df.with_columns(expr.alias(REASON))


def duplicated(columns: Sequence[str]) -> pl.Expr:
    """True for the second and later copies of a row (on ``columns``); the first copy is kept."""
    return ~pl.struct(list(columns)).is_first_distinct()


def non_utf8(columns: Sequence[str]) -> pl.Expr:
    """True where any of the text ``columns`` held bytes that were not UTF-8."""
    return pl.any_horizontal(pl.col(c).str.contains(REPLACEMENT_CHAR, literal=True) for c in columns)


def parse_timestamp(col: str, fmt: str = "auto") -> pl.Expr:
    """Text column -> ``Datetime(us, UTC)``; unparseable values become null.

    ``fmt``: ``auto`` (epoch seconds/ms when numeric, else ISO 8601), ``iso``, ``epoch_s``,
    ``epoch_ms``, or a strftime layout.
    """
    s = pl.col(col).cast(pl.String).str.strip_chars()
    numeric = s.str.contains(r"^-?\d+(\.\d+)?$")
    as_num = s.cast(pl.Float64, strict=False)
    epoch_s = (as_num * 1_000_000).cast(pl.Int64, strict=False).cast(pl.Datetime("us")).dt.replace_time_zone("UTC")
    epoch_ms = (as_num * 1_000).cast(pl.Int64, strict=False).cast(pl.Datetime("us")).dt.replace_time_zone("UTC")
    iso_s = s.str.replace(r"( UTC|Z|\+00:00|\+0000)$", "")
    iso = pl.coalesce(
        [iso_s.str.strptime(pl.Datetime("us"), f, strict=False) for f in _TS_FORMATS]
    ).dt.replace_time_zone("UTC")
    if fmt == "auto":
        # 1e11 s is the year 5138: anything larger is milliseconds
        return pl.when(numeric).then(pl.when(as_num.abs() >= 1e11).then(epoch_ms).otherwise(epoch_s)).otherwise(iso)
    if fmt == "iso":
        return iso
    if fmt == "epoch_s":
        return pl.when(numeric).then(epoch_s)
    if fmt == "epoch_ms":
        return pl.when(numeric).then(epoch_ms)
    return s.str.strptime(pl.Datetime("us"), fmt, strict=False).dt.replace_time_zone("UTC")


def parse_float(col: str) -> pl.Expr:
    """Text or numeric column -> Float64; unparseable values become null (NaN/inf stay)."""
    return pl.col(col).cast(pl.String).str.strip_chars().cast(pl.Float64, strict=False)


def bad_float(col: str) -> pl.Expr:
    """The raw value is present but not a finite number."""
    parsed = parse_float(col)
    present = pl.col(col).is_not_null() & (pl.col(col).cast(pl.String).str.strip_chars() != "")
    return present & (parsed.is_null() | parsed.is_nan() | parsed.is_infinite())


def timestamp_checks(parsed: pl.Expr, raw_col: str, low: datetime, high: datetime) -> list[tuple[str, pl.Expr]]:
    """Checks for a parsed timestamp: missing, unparseable, outside [low, high]."""
    missing = pl.col(raw_col).is_null() | (pl.col(raw_col).cast(pl.String).str.strip_chars() == "")
    return [
        ("missing_timestamp", missing),
        ("unparseable_timestamp", parsed.is_null()),
        ("timestamp_out_of_range", (parsed < pl.lit(low, TS)) | (parsed > pl.lit(high, TS))),
    ]


def missing(col: str) -> pl.Expr:
    return pl.col(col).is_null() | (pl.col(col).cast(pl.String).str.strip_chars() == "")


def time_bounds(low: str | None, high: str | None) -> tuple[datetime, datetime]:
    """Configured plausible time range; defaults 1990-01-01 .. one day after now."""
    lo = datetime.fromisoformat(low) if low else datetime(1990, 1, 1)
    hi = datetime.fromisoformat(high) if high else datetime.now(UTC) + timedelta(days=1)
    lo = lo.replace(tzinfo=UTC) if lo.tzinfo is None else lo
    hi = hi.replace(tzinfo=UTC) if hi.tzinfo is None else hi
    return lo, hi
