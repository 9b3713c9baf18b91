"""Many per-row checks of a table as one Great Expectations expectation, reported check by check.

GE 1.24 spends ~7 ms of fixed work on each expectation (its metric graph, configuration copies),
whatever the table's size: ~530 expectations made `hir validate` on the tiny pipeline output a
4 s stage, nearly all of it overhead. The row checks of a table (values in a set, between bounds,
not null, unique; every row must pass) are evaluated here in Polars, with GE's own semantics
(a null or NaN value is *missing*: only the not-null check sees it), into one derived column,
``failed_checks``: per row, the checks it fails, ``""`` when none. GE then checks that one column
(values in ``{""}``), so its result, the data docs and the exit code still come from GE, and
:func:`failures` turns each failing check back into the line a separate expectation would have
given: its table, source column, check, ``n of total rows fail (values ...)`` and example ids.

Checks with ``mostly`` < 1 or a ``row_condition``, and table-level ones (row count, mean), stay
separate expectations: they are few, and a row of theirs failing is not a table failing.
``tests/validate/test_bundle.py`` runs both ways on planted defects and compares every failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import great_expectations.expectations as gxe
import polars as pl

# the derived column GE checks: per row, the labels of the bundled checks it fails
COLUMN = "failed_checks"
SEPARATOR = "; "
ROW_CHECKS = (gxe.ExpectColumnValuesToBeInSet, gxe.ExpectColumnValuesToBeBetween,
              gxe.ExpectColumnValuesToNotBeNull, gxe.ExpectColumnValuesToBeUnique)


@dataclass
class Bundled:
    """One row check taken out of GE: the expectation, its label in ``failed_checks`` and the
    rows it fails, (n,) bool."""

    expectation: gxe.Expectation
    label: str
    fails: pl.Series


def _tz(value: Any) -> bool | None:
    """Whether a bound is a timezone-aware datetime (None: not a datetime)."""
    return value.tzinfo is not None if isinstance(value, datetime) else None


def bundles(expectation: gxe.Expectation, frame: pl.DataFrame) -> bool:
    """True for a per-row check that every row must pass, on a column of ``frame`` (a range on
    timestamps only when column and bounds agree on having a timezone: pandas refuses to compare
    the two kinds, and GE's own error is then the report)."""
    if not (type(expectation) in ROW_CHECKS and expectation.row_condition is None
            and float(expectation.mostly) == 1.0 and expectation.column in frame.columns):
        return False
    if isinstance(expectation, gxe.ExpectColumnValuesToBeBetween):
        dtype = frame.schema[expectation.column]
        aware = isinstance(dtype, pl.Datetime) and dtype.time_zone is not None
        bounds = {_tz(v) for v in (expectation.min_value, expectation.max_value) if v is not None}
        if bounds - {None} and (bounds != {aware} or not isinstance(dtype, pl.Datetime)):
            return False
    return True


def _missing(col: str, dtype: pl.DataType) -> pl.Expr:
    """GE's view of a missing value: pandas reads a null as None/NaN/NaT and skips it in every
    check but not-null, and a float NaN is missing to pandas too."""
    c = pl.col(col)
    return (c.is_null() | c.is_nan()) if dtype.is_float() else c.is_null()


def _fails(exp: gxe.Expectation, dtype: pl.DataType) -> pl.Expr:
    """The rows of ``exp.column`` (of ``dtype``) that ``exp`` reports as unexpected."""
    col = exp.column
    missing = _missing(col, dtype)
    # a Categorical column (views._categorical) holds strings to GE: compare its values
    c = pl.col(col).cast(pl.String) if dtype in (pl.Categorical, pl.Enum) else pl.col(col)
    if isinstance(exp, gxe.ExpectColumnValuesToNotBeNull):
        return missing
    if isinstance(exp, gxe.ExpectColumnValuesToBeInSet):
        bad = ~c.is_in(list(exp.value_set)) if exp.value_set else pl.lit(True)
    elif isinstance(exp, gxe.ExpectColumnValuesToBeBetween):
        bad = pl.lit(False)
        if exp.min_value is not None:
            low = pl.lit(exp.min_value).cast(dtype) if dtype.is_temporal() else pl.lit(exp.min_value)
            bad = bad | ((c <= low) if exp.strict_min else (c < low))
        if exp.max_value is not None:
            high = pl.lit(exp.max_value).cast(dtype) if dtype.is_temporal() else pl.lit(exp.max_value)
            bad = bad | ((c >= high) if exp.strict_max else (c > high))
    else:  # unique: every present row whose value another present row has
        present = pl.when(~missing).then(c)
        bad = present.is_duplicated()
    return (~missing & bad).fill_null(False)


def label(exp: gxe.Expectation) -> str:
    """``<source column>: <check>`` from the expectation's meta (suites._e)."""
    meta = exp.meta or {}
    return f"{meta.get('column', exp.column)}: {meta.get('check', type(exp).__name__)}"


def split(expectations: list[gxe.Expectation], frame: pl.DataFrame) -> tuple[list[gxe.Expectation], list[Bundled]]:
    """``expectations`` -> (those GE runs itself, the row checks bundled into ``failed_checks``).
    A check Polars cannot evaluate (say a value set of strings on an int column) is left to GE,
    whose result then reports the error as it always did."""
    own, bundled = [], []
    for exp in expectations:
        fails = None
        if bundles(exp, frame):
            try:
                fails = frame.select(_fails(exp, frame.schema[exp.column]).alias("fails"))["fails"]
            except pl.exceptions.PolarsError:
                fails = None
        if fails is None:
            own.append(exp)
        else:
            bundled.append(Bundled(exp, label(exp), fails))
    return own, bundled


def with_failed_checks(frame: pl.DataFrame, bundled: list[Bundled]) -> pl.DataFrame:
    """``frame`` (n rows) plus ``failed_checks`` (n,): the labels of the checks each row fails,
    joined by ``"; "``, ``""`` for a row that passes them all (Categorical: pandas reads it as
    `category`, which GE checks on the codes)."""
    if COLUMN in frame.columns:
        raise ValueError(f"a validated table has a column {COLUMN!r} of its own (columns {frame.columns}); "
                         "rename it in hir/validate/views.py")
    parts = [pl.when(b.fails).then(pl.lit(b.label + SEPARATOR)).otherwise(pl.lit("")) for b in bundled]
    joined = pl.concat_str(parts).str.strip_suffix(SEPARATOR) if parts else pl.lit("")
    return frame.with_columns(joined.cast(pl.Categorical).alias(COLUMN))


def expectation(bundled: list[Bundled]) -> gxe.Expectation:
    """The one GE expectation that stands for every bundled check of a table."""
    checks = [b.label for b in bundled]
    return gxe.ExpectColumnValuesToBeInSet(
        column=COLUMN, value_set=[""],
        meta={"column": "*", "check": f"every row passes the {len(checks)} row checks", "bundled": checks},
    )


def failures(frame: pl.DataFrame, bundled: list[Bundled], n_examples: int) -> list[dict[str, Any]]:
    """Per bundled check that some row fails: ``expectation`` (its GE type name), ``column``,
    ``check``, ``unexpected_count``, ``element_count``, ``values`` (the first ``n_examples`` failing values)
    and ``ids`` (the first ``n_examples`` failing rows' ``id``), as GE's SUMMARY result holds
    them for a separate expectation."""
    out = []
    for b in bundled:
        mask = b.fails
        n = int(mask.sum())
        if not n:
            continue
        bad = frame.filter(mask)
        meta = b.expectation.meta or {}
        # as GE holds them: read into pandas (a null int is NaN there, a null string None)
        values = bad.select(b.expectation.column).head(n_examples).to_pandas()[b.expectation.column].tolist()
        out.append({
            "expectation": b.expectation.expectation_type, "column": str(meta.get("column", b.expectation.column)),
            "check": str(meta.get("check", "")), "unexpected_count": n, "element_count": frame.height,
            "values": values,
            "ids": [str(x) for x in bad["id"].head(n_examples).to_list()] if "id" in frame.columns else [],
        })
    return out
