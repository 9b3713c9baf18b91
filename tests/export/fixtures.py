"""Helpers of the export tests: what `hir refresh` would be given for a run's cold products."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
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


def refreshed_cold_tokens(export_dir: Path, out: Path) -> tuple[list[np.ndarray], pl.DataFrame]:
    """What `hir refresh` gives the export's cold products (:func:`cold_product_inputs`): each
    re-embedded from its content and links with the export's checkpoint, placed as the export placed
    it, blended with its text at the export's weight and tokenised by the saved tokenizer.
    Returns (per level the (n, k) token ids, their exported rows)."""
    from hir.export.cold import place_like_export
    from hir.export.content_tokens import array_text, blend
    from hir.export.embed import Embedder
    from hir.export.recorded import exported_checkpoint

    emb_dir = export_dir / "embeddings"
    meta = json.loads((emb_dir / "meta.json").read_text())
    emb = Embedder(exported_checkpoint(meta["checkpoint"], emb_dir), out / "graph", out / "content")
    emb.load_tokenizer(export_dir / "hierarchy" / "tokenizer.pt")
    cold, content, links = cold_product_inputs(out, emb_dir)
    text, has = np.stack(content["text_vec"].to_numpy()), content["has_text"].to_numpy()
    z = emb.embed_new("product", text, np.stack(content["attr_vec"].to_numpy()), has, links)
    z = place_like_export(emb_dir, emb.store, "product", z, text, has)
    t = int(emb.store.layout["text_dim"])
    codes, _ = emb.tokens(blend(z, array_text(text, has, t), t, meta["token_content"]))
    return codes, cold
