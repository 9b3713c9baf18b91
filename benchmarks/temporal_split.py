"""A temporal online_retail split as a user's own event files: train before a date, test after.

    python benchmarks/temporal_split.py                         # outputs/or_temporal/{events,test}.csv
    python benchmarks/temporal_split.py --cut 2011-10-01 --out /tmp/or_temporal

Reads UCI Online Retail (``../shared/data/uci_online_retail/online_retail.csv.gz``), keeps the rows
the `online_retail` adapter keeps (a CustomerID; product stock codes, not postage, fees or manual
adjustments; no bad-debt invoices; no zero quantity; a negative quantity only on a cancellation
invoice; no negative price; no exact duplicate line), and writes two CSV files with the same
columns, cut in time at ``--cut`` (train: before it, test: at or after it):

    user_id, item_id, behavior (buy | cancel), ts (ISO), quantity, value, title

They are read as any user's files would be, by the generic `events_csv` adapter (`docs/datasets.md`)::

    hir pipeline data=events_csv data.path=outputs/or_temporal/events.csv \\
      data.test_path=outputs/or_temporal/test.csv $(python benchmarks/temporal_split.py --print-args)

``--print-args`` prints the `data.*` overrides (:data:`DATA_ARGS`) and nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
# the data directory as conf/paths/default.yaml finds it: $HIR_DATA_DIR, else ../shared/data beside the
# repository (it was ROOT.parent.parent, which only a checkout one folder deeper, a worktree, resolved)
SOURCE = Path(os.environ.get("HIR_DATA_DIR") or ROOT.parent / "shared" / "data") / "uci_online_retail" / "online_retail.csv.gz"
# the online_retail adapter's non-product codes (hir/data/adapters/online_retail.py)
NON_PRODUCT = ("POST", "DOT", "M", "D", "S", "BANK CHARGES", "AMAZONFEE", "CRUK", "DCGSSGIRL", "DCGSSBOY", "PADS", "B")
# the events_csv overrides that map these files (the test file is given by data.test_path)
DATA_ARGS = ["data.columns.user=user_id", "data.columns.item=item_id", "data.columns.stage=behavior",
             "data.columns.timestamp=ts", "data.columns.quantity=quantity", "data.columns.value=value",
             "data.columns.text=title", "data.stages={cancel: cancellation, buy: purchase}",
             "data.stage_order=[cancellation,purchase]"]


def events(source: Path) -> pl.DataFrame:
    """The cleaned invoice lines of ``source`` as (user_id, item_id, behavior, ts, quantity, value,
    title), sorted by time."""
    raw = pl.read_csv(source, infer_schema_length=0)  # every column as text, parsed below
    invoice = pl.col("InvoiceNo").str.strip_chars().str.to_uppercase()
    code = pl.col("StockCode").str.strip_chars().str.to_uppercase()
    qty = pl.col("Quantity").cast(pl.Float64, strict=False)
    price = pl.col("UnitPrice").cast(pl.Float64, strict=False)
    cancel = invoice.str.starts_with("C")
    df = raw.unique(maintain_order=True).filter(
        pl.col("CustomerID").is_not_null() & (pl.col("CustomerID").str.strip_chars() != ""),
        ~code.is_in(list(NON_PRODUCT)), ~invoice.str.starts_with("A"), qty.is_not_null(), qty != 0,
        (qty > 0) | cancel, price.is_not_null(), price >= 0,
    )
    return df.select(
        pl.col("CustomerID").str.replace(r"\.0$", "").alias("user_id"),
        code.alias("item_id"),
        pl.when(cancel).then(pl.lit("cancel")).otherwise(pl.lit("buy")).alias("behavior"),
        pl.col("InvoiceDate").str.to_datetime("%Y-%m-%d %H:%M:%S").alias("ts"),
        qty.abs().alias("quantity"),
        (qty.abs() * price).round(4).alias("value"),
        pl.col("Description").str.strip_chars().alias("title"),
    ).sort("ts", maintain_order=True)


def write_split(source: Path, cut: str, out: Path) -> dict[str, object]:
    """Write ``out``/events.csv (before ``cut``) and ``out``/test.csv (at or after it); returns
    their row, user and item counts."""
    df = events(source)
    at = pl.lit(cut).str.to_datetime("%Y-%m-%d")
    parts = {"events": df.filter(pl.col("ts") < at), "test": df.filter(pl.col("ts") >= at)}
    out.mkdir(parents=True, exist_ok=True)
    stats: dict[str, object] = {"source": os.path.relpath(source, ROOT), "cut": cut}
    for name, part in parts.items():
        part.with_columns(pl.col("ts").dt.strftime("%Y-%m-%dT%H:%M:%S")).write_csv(out / f"{name}.csv")
        stats[name] = {"rows": part.height, "users": part["user_id"].n_unique(), "items": part["item_id"].n_unique(),
                       "first": str(part["ts"].min()), "last": str(part["ts"].max())}
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, default=SOURCE)
    ap.add_argument("--cut", default="2011-10-01", help="first day of the test period (YYYY-MM-DD)")
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "or_temporal")
    ap.add_argument("--print-args", action="store_true", help="print the data.* overrides and exit")
    args = ap.parse_args()
    if args.print_args:
        print(" ".join(f"'{a}'" for a in DATA_ARGS))
        return
    if not args.source.exists():
        sys.exit(f"{args.source}: the UCI Online Retail file is missing; pass --source <online_retail.csv.gz>")
    print(json.dumps(write_split(args.source, args.cut, args.out), indent=1))


if __name__ == "__main__":
    main()
