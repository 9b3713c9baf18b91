"""Helpers of the export tests: what `hir refresh` would be given for a run's cold products."""

from __future__ import annotations

from pathlib import Path

import polars as pl


def cold_product_inputs(out: Path, emb_dir: Path) -> tuple[pl.DataFrame, pl.DataFrame, list[list[tuple[str, str]]]]:
    """The cold products of the export in ``emb_dir`` that no campaign promotes (their context is
    their content and links alone), by node id: (their exported rows, their content rows, per
    product its (entity_type, key) links to its categories and advertisers, as
    :meth:`hir.export.embed.Embedder.embed_new` takes them)."""
    products = pl.read_parquet(emb_dir / "product.parquet")
    promoted = set(pl.read_parquet(out / "graph" / "edges" / "campaign__promotes__product.parquet")["dst_id"].to_list())
    cold = products.filter(pl.col("cold_start") & ~pl.col("node_id").is_in(list(promoted))).sort("node_id")
    assert cold.height > 0
    content = pl.read_parquet(out / "content" / "product.parquet").join(cold.select("node_id"), on="node_id").sort("node_id")
    cats = pl.read_parquet(out / "graph" / "edges" / "product__in_category__category.parquet")
    advs = pl.read_parquet(out / "graph" / "edges" / "product__by_advertiser__advertiser.parquet")
    cat_keys = pl.read_parquet(out / "graph" / "nodes" / "category.parquet").select("node_id", "key")
    adv_keys = pl.read_parquet(out / "graph" / "nodes" / "advertiser.parquet").select("node_id", "key")
    links = []
    for pid in content["node_id"].to_list():
        c = cats.filter(pl.col("src_id") == pid).join(cat_keys, left_on="dst_id", right_on="node_id")["key"].to_list()
        a = advs.filter(pl.col("src_id") == pid).join(adv_keys, left_on="dst_id", right_on="node_id")["key"].to_list()
        links.append([("category", k) for k in c] + [("advertiser", k) for k in a])
    return cold, content, links
