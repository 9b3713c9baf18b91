"""REES46 multi-category store events (view -> cart -> purchase), brand as advertiser, the
dotted ``category_code`` as a taxonomy.  See ../shared/data/rees46_multicat_2019oct_head/README.md."""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

from hir.data import quality as q
from hir.data.adapters.common import CANONICAL, clean_text, event_checks, map_stages, string_key
from hir.data.download import ensure_file
from hir.data.raw import Quarantine, RawDataset
from hir.data.steps import taxonomy_edges

# event_type value -> stage; data.adapter.stages replaces it as a whole
STAGES = {"view": "view", "cart": "cart", "purchase": "purchase"}
COLUMNS = [
    "event_time", "event_type", "product_id", "category_id", "category_code",
    "brand", "price", "user_id", "user_session",
]


def load(
    quarantine: Quarantine,
    path: str,
    stages: Mapping[str, str] | None,
    stage_order: list[str],
    url: str | None = None,
    sha256: str | None = None,
    download_dir: str = ".cache/downloads",
    time_range: tuple[str | None, str | None] = (None, None),
) -> RawDataset:
    """Read the events CSV, quarantine bad rows, derive products, brands and the taxonomy.

    ``stages`` (event_type -> stage) is the whole mapping when given, default :data:`STAGES`.
    """
    stages = STAGES if stages is None else stages
    src = ensure_file(path, url, sha256, download_dir)
    what = "rees46 events"
    raw = q.read_csv_strings(src, COLUMNS, what)
    ts = q.parse_timestamp("event_time")
    stage = map_stages(raw, "event_type", stages, src, what)
    checks = event_checks(
        raw, user="user_id", item="product_id", stage="event_type", timestamp="event_time",
        parsed_ts=ts, time_range=q.time_bounds(*time_range), numeric=["price"],
        text=["brand", "category_code", "user_session"],
    )
    checks.append(("negative_price", q.parse_float("price") < 0))
    df = q.with_reason(raw, checks).with_columns(
        string_key("user_id").alias("user_key"),
        string_key("product_id").alias("entity_key"),
        pl.lit("product").alias("entity_type"),
        stage.alias("stage"),
        ts.alias("timestamp"),
        pl.lit(1.0).alias("quantity"),
        pl.when(stage == "purchase").then(q.parse_float("price")).otherwise(0.0).alias("value"),
        clean_text("user_session").alias("session"),
        clean_text("brand").str.to_lowercase().alias("_brand"),
        clean_text("category_code").alias("_code"),
        string_key("category_id").alias("_cid"),
        q.parse_float("price").alias("_price"),
    )
    kept = quarantine.split("events", src, df, COLUMNS, [*CANONICAL, "_brand", "_code", "_cid", "_price"])

    # each product has one category and brand; take the latest non-null values
    products = (
        kept.sort("timestamp")
        .group_by("entity_key")
        .agg(
            pl.col("_brand").drop_nulls().last(),
            pl.col("_code").drop_nulls().last(),
            pl.col("_cid").drop_nulls().last(),
            pl.col("_price").median().alias("attr_price"),
        )
        .rename({"entity_key": "key"})
    )
    products = products.with_columns(
        pl.concat_str(
            [pl.col("_brand").fill_null(""), pl.col("_code").str.replace_all(r"\.", " > ").str.replace_all("_", " ")],
            separator=" ",
            ignore_nulls=True,
        ).str.strip_chars().alias("text"),
        pl.col("_brand").alias("attr_brand"),
    )
    products = products.with_columns(pl.when(pl.col("text") == "").then(None).otherwise(pl.col("text")).alias("text"))

    # taxonomy: every code prefix is a category; each category_id is a leaf under its code
    cats, parents = taxonomy_edges(products.select(pl.col("_code").drop_nulls().alias("path")), ".")
    leaf = (
        products.filter(pl.col("_cid").is_not_null())
        .group_by("_cid")
        .agg(pl.col("_code").drop_nulls().first())
        .select(
            ("cid:" + pl.col("_cid")).alias("key"),
            pl.coalesce(pl.col("_code").str.replace_all(r"\.", " > ").str.replace_all("_", " "), pl.lit(None)).alias("text"),
            (pl.col("_code").str.count_matches(r"\.") + 2).cast(pl.Float64).fill_null(1.0).alias("attr_level"),
            pl.col("_code"),
        )
    )
    categories = pl.concat([cats, leaf.drop("_code")], how="vertical_relaxed")
    leaf_parent = leaf.filter(pl.col("_code").is_not_null()).select(
        pl.col("key").alias("src_key"), pl.col("_code").alias("dst_key")
    )
    brands = products.select(pl.col("_brand").drop_nulls().unique().sort().alias("key")).with_columns(
        pl.col("key").alias("text")
    )
    return RawDataset(
        events=kept.select(CANONICAL).lazy(),
        stage_order=list(stage_order),
        entities={
            "product": products.select("key", "text", "attr_price", "attr_brand"),
            "advertiser": brands,
            "category": categories,
        },
        relations={
            "product__in_category__category": products.filter(pl.col("_cid").is_not_null()).select(
                pl.col("key").alias("src_key"), ("cid:" + pl.col("_cid")).alias("dst_key")
            ),
            "product__by_advertiser__advertiser": products.filter(pl.col("_brand").is_not_null()).select(
                pl.col("key").alias("src_key"), pl.col("_brand").alias("dst_key")
            ),
            "category__child_of__category": pl.concat([parents, leaf_parent]),
        },
    )

