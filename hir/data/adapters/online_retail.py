"""UCI Online Retail: a year of purchases of a UK gift retailer, with product description text.

Stages ``cancellation < purchase``: lines of invoices starting with ``C`` are cancellations (their
own stage, never purchases); the deep-funnel label is purchase. Rows are quarantined, with a
reason, for: no CustomerID, non-product stock codes (postage, fees, manual adjustments: the
dataset README's list, configurable), negative quantities outside cancellations (stock
adjustments), bad-debt adjustment invoices (``A...``), negative prices, unparseable values and
exact duplicate lines.  See ../shared/data/uci_online_retail/README.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from hir.data import quality as q
from hir.data.adapters.common import CANONICAL, clean_text, event_checks, string_key
from hir.data.download import ensure_file
from hir.data.raw import Quarantine, RawDataset

COLUMNS = ["InvoiceNo", "StockCode", "Description", "Quantity", "InvoiceDate", "UnitPrice", "CustomerID", "Country"]
NON_PRODUCT_CODES = (
    "POST", "DOT", "M", "D", "S", "BANK CHARGES", "AMAZONFEE", "CRUK", "DCGSSGIRL", "DCGSSBOY", "PADS", "B",
)


def load(
    quarantine: Quarantine,
    path: str,
    url: str | None = None,
    sha256: str | None = None,
    download_dir: str = ".cache/downloads",
    non_product_codes: Sequence[str] = NON_PRODUCT_CODES,
    stage_order: tuple[str, ...] = ("cancellation", "purchase"),
    time_range: tuple[str | None, str | None] = (None, None),
) -> RawDataset:
    src = ensure_file(path, url, sha256, download_dir)
    what = "online_retail"
    raw = q.read_csv_strings(src, COLUMNS, what)
    ts = q.parse_timestamp("InvoiceDate")
    qty = q.parse_float("Quantity")
    price = q.parse_float("UnitPrice")
    invoice = pl.col("InvoiceNo").str.strip_chars().str.to_uppercase()
    code = pl.col("StockCode").str.strip_chars().str.to_uppercase()
    cancelled = invoice.str.starts_with("C")
    checks = event_checks(
        raw, user="CustomerID", item="StockCode", stage="InvoiceNo", timestamp="InvoiceDate", parsed_ts=ts,
        time_range=q.time_bounds(*time_range), numeric=["Quantity", "UnitPrice"], text=["Description", "Country"],
    )
    # the generic "missing_stage" check looks at InvoiceNo, which decides the stage here
    checks[2] = ("missing_invoice", q.missing("InvoiceNo"))
    checks[-1:-1] = [
        ("missing_quantity", q.missing("Quantity")),
        ("non_product_code", code.is_in(list(non_product_codes))),
        ("bad_debt_adjustment", invoice.str.starts_with("A")),
        ("zero_quantity", qty == 0),
        ("negative_quantity", (qty < 0) & ~cancelled),
        ("negative_price", price < 0),
    ]
    df = q.with_reason(raw, checks).with_columns(
        string_key("CustomerID").alias("user_key"),
        code.alias("entity_key"),
        pl.lit("product").alias("entity_type"),
        pl.when(cancelled).then(pl.lit("cancellation")).otherwise(pl.lit("purchase")).alias("stage"),
        ts.alias("timestamp"),
        qty.abs().alias("quantity"),
        (qty.abs() * price).alias("value"),
        invoice.alias("session"),
        clean_text("Description").alias("_desc"),
        price.alias("_price"),
        clean_text("Country").alias("_country"),
    )
    kept = quarantine.split("events", src, df, COLUMNS, [*CANONICAL, "_desc", "_price", "_country"])

    # 650 stock codes carry several description variants: use the most frequent one
    desc = (
        kept.filter(pl.col("_desc").is_not_null())
        .group_by("entity_key", "_desc")
        .len()
        .sort(["entity_key", "len", "_desc"], descending=[False, True, False])
        .group_by("entity_key", maintain_order=True)
        .agg(pl.col("_desc").first().alias("text"))
    )
    products = (
        kept.filter(pl.col("stage") == "purchase")
        .group_by("entity_key")
        .agg(pl.col("_price").median().alias("attr_price"))
        .join(desc, on="entity_key", how="full", coalesce=True)
        .rename({"entity_key": "key"})
        .select("key", "text", "attr_price")
    )
    users = (
        kept.group_by("user_key", "_country")
        .len()
        .sort(["user_key", "len"], descending=[False, True])
        .group_by("user_key", maintain_order=True)
        .agg(pl.col("_country").first().alias("attr_country"))
        .select(pl.col("user_key").alias("key"), pl.lit(None, pl.String).alias("text"), "attr_country")
    )
    return RawDataset(
        events=kept.select(CANONICAL).lazy(),
        stage_order=list(stage_order),
        entities={"product": products, "user": users},
    )
