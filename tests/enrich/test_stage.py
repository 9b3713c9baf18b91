from __future__ import annotations

import functools
import json
import shutil

import numpy as np
import polars as pl
import pytest
from PIL import Image

from hir.enrich.attributes import fit_attributes
from hir.enrich.content import encode_new_entities
from hir.enrich.image import PixelStatsImageEncoder
from hir.enrich.stage import enrich, run
from hir.enrich.text import SentenceEncoder
from hir.errors import HirError, InputError

FIT = functools.partial(fit_attributes, n_bands=4, top_n=4)
CONTRACT = {
    "node_id": pl.Int64, "has_text": pl.Boolean, "text_vec": pl.List(pl.Float32),
    "attr_vec": pl.List(pl.Float32), "content_hash": pl.String,
}


def _vecs(frame: pl.DataFrame, col: str) -> np.ndarray:
    return np.array(frame[col].to_list(), dtype=np.float32)


def test_outputs_follow_the_contract(graph, counting, tmp_path):
    out = tmp_path / "content"
    meta = enrich(graph, out, tmp_path / "cache", counting, FIT)
    product = pl.read_parquet(out / "product.parquet")
    assert dict(product.schema) == CONTRACT
    assert product["node_id"].to_list() == [0, 1, 2, 3, 4, 5]
    text = _vecs(product, "text_vec")
    assert text.shape == (6, 384)
    # node 2 has no text, node 4 only whitespace: zeros and has_text False
    assert product["has_text"].to_list() == [True, True, False, True, False, True]
    assert not text[[2, 4]].any()
    np.testing.assert_allclose(np.linalg.norm(text[[0, 1, 3, 5]], axis=1), 1.0, atol=1e-5)
    # p0 and p3 share their text, not their price: same text_vec, different content_hash
    np.testing.assert_array_equal(text[0], text[3])
    assert product["content_hash"][0] != product["content_hash"][3]
    assert _vecs(product, "attr_vec").shape == (6, meta["attr_dims"]["product"])

    user = pl.read_parquet(out / "user.parquet")
    assert dict(user.schema) == CONTRACT and not user["has_text"].any()
    assert not _vecs(user, "text_vec").any()
    assert _vecs(user, "attr_vec").shape == (3, meta["attr_dims"]["user"]) == (3, 2 + 2)  # 2 ages, other, missing

    assert meta["text_dim"] == 384 and meta["counts"] == {"product": 6, "user": 3}
    assert meta["types"]["product"]["distinct_texts"] == 3
    assert json.loads((out / "meta.json").read_text()) == meta
    assert set(json.loads((out / "attr_encoders.json").read_text())["types"]) == {"product", "user"}


def test_cache_round_trip(graph, counting, new_counting, make_graph, products, tmp_path):
    cache = tmp_path / "cache"
    first = enrich(graph, tmp_path / "c1", cache, counting, FIT)
    assert sorted(counting.encoded) == ["organic green tea", "red running shoes", "stainless steel kettle"]
    assert first["cache"]["text_misses"] == 3 and first["cache"]["text_hits"] == 0

    again = new_counting()
    second = enrich(graph, tmp_path / "c2", cache, again, FIT)
    assert again.encoded == []
    assert second["cache"] | {"dir": None} == {"dir": None, "text_hits": 3, "text_misses": 0, "image_hits": 0, "image_misses": 0}

    changed = products.with_columns(
        pl.when(pl.col("key") == "p1").then(pl.lit("electric kettle with whistle")).otherwise(pl.col("text")).alias("text")
    )
    graph2 = make_graph(tmp_path / "graph2", changed)
    third_enc = new_counting()
    third = enrich(graph2, tmp_path / "c3", cache, third_enc, FIT)
    assert third_enc.encoded == ["electric kettle with whistle"]
    assert third["cache"]["text_misses"] == 1 and third["cache"]["text_hits"] == 2
    old = pl.read_parquet(tmp_path / "c1" / "product.parquet")
    new = pl.read_parquet(tmp_path / "c3" / "product.parquet")
    untouched = [0, 2, 3, 4, 5]
    np.testing.assert_array_equal(_vecs(old, "text_vec")[untouched], _vecs(new, "text_vec")[untouched])
    assert old["content_hash"][1] != new["content_hash"][1]


def test_new_entity_function_reproduces_stage(graph, minilm, new_counting, products, tmp_path):
    out = tmp_path / "content"
    enrich(graph, out, tmp_path / "cache" / "content", minilm, FIT)
    stage_rows = pl.read_parquet(out / "product.parquet")

    existing = products.filter(pl.col("key").is_in(["p1", "p4"])).drop("node_id").sort("key")
    counting = new_counting()
    fresh = encode_new_entities(existing, "product", out, cache_dir=tmp_path / "cache", text_encoder=counting)
    assert counting.encoded == []  # served from the stage's cache (paths.cache_dir/content)
    expected = stage_rows.filter(pl.col("node_id").is_in([1, 4])).sort("node_id")
    assert fresh["key"].to_list() == ["p1", "p4"]
    np.testing.assert_allclose(_vecs(fresh, "text_vec"), _vecs(expected, "text_vec"), atol=1e-6)
    np.testing.assert_array_equal(_vecs(fresh, "attr_vec"), _vecs(expected, "attr_vec"))
    assert fresh["content_hash"].to_list() == expected["content_hash"].to_list()
    assert fresh["has_text"].to_list() == [True, False]
    # a delta file read as strings (price "25.5") is the same content
    as_text = encode_new_entities(existing.with_columns(pl.col("attr_price").cast(pl.String)), "product", out,
                                  text_encoder=minilm)
    assert as_text["content_hash"].to_list() == expected["content_hash"].to_list()

    # the encoder is rebuilt from content/meta.json when not given; unseen entity, no attributes
    unseen = encode_new_entities(pl.DataFrame({"key": ["p9"], "text": ["green tea bags"]}), "product", out)
    assert _vecs(unseen, "attr_vec").shape == (1, stage_rows["attr_vec"].list.len()[0])
    assert _vecs(unseen, "text_vec").shape == (1, 384) and unseen["has_text"][0]

    with pytest.raises(HirError, match="differs from the one that built"):
        encode_new_entities(existing, "product", out, text_encoder=SentenceEncoder(normalize=False))
    with pytest.raises(InputError, match="campaign"):
        encode_new_entities(existing, "campaign", out, text_encoder=minilm)


def test_images_end_to_end(make_graph, products, minilm, tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    for name, colour in [("red.png", (220, 20, 30)), ("blue.png", (20, 30, 220))]:
        Image.fromarray(np.full((20, 20, 3), colour, dtype=np.uint8)).save(images / name)
    shutil.copy(images / "red.png", images / "red_copy.png")  # same bytes: encoded once
    paths = {"p0": "red.png", "p1": str(images / "blue.png"), "p2": None, "p3": "red_copy.png", "p4": "", "p5": "gone.png"}
    with_images = products.with_columns(pl.col("key").replace_strict(paths, return_dtype=pl.String).alias("image_path"))
    graph = make_graph(tmp_path / "graph", with_images)
    out = tmp_path / "content"
    encoder = PixelStatsImageEncoder(size=8, proj_dim=16)
    meta = enrich(graph, out, tmp_path / "cache", minilm, FIT, image_encoder=encoder, image_root=images)

    product = pl.read_parquet(out.joinpath("product.parquet"))
    # node order: p0 (red), p1 (blue), p2 (none), p3 (red copy), p4 (""), p5 (missing file)
    assert product["has_image"].to_list() == [True, True, False, True, False, False]
    img = _vecs(product, "image_vec")
    assert img.shape == (6, encoder.dim)
    np.testing.assert_array_equal(img[0], img[3])
    assert not img[[2, 4, 5]].any() and not np.allclose(img[0], img[1])
    assert meta["image_dim"] == encoder.dim and meta["image_encoder"]["name"] == encoder.name
    assert meta["types"]["product"]["distinct_images"] == 2 and meta["types"]["product"]["missing_images"] == 1
    assert "image_vec" not in pl.read_parquet(out / "user.parquet").columns

    # refresh path: a new product with an image, and one without any image column
    new = encode_new_entities(pl.DataFrame({"key": ["p9"], "image_path": ["blue.png"]}), "product", out,
                              text_encoder=minilm, image_encoder=encoder)
    np.testing.assert_array_equal(_vecs(new, "image_vec")[0], img[1])
    bare = encode_new_entities(pl.DataFrame({"key": ["p10"]}), "product", out, text_encoder=minilm, image_encoder=encoder)
    assert not bare["has_image"][0] and not _vecs(bare, "image_vec").any()


def test_run_reuses_outputs_unless_inputs_change_or_force(compose, graph, minilm, tmp_path):
    cfg = compose("enrich.text_encoder.batch_size=16", stage="enrich")
    first = run(cfg)
    assert (tmp_path / "content" / "product.parquet").exists()
    assert first["cache"]["text_misses"] == 3
    assert run(cfg)["created"] == first["created"]  # reused
    (graph / "meta.json").write_text(json.dumps({"dataset": "tiny", "created": "2026-02-02T00:00:00+00:00"}))
    rebuilt = run(cfg)  # the snapshot changed: rebuilt, every text from the cache
    assert rebuilt["created"] != first["created"] and rebuilt["cache"]["text_hits"] == 3
    forced = run(compose("force=true", stage="enrich"))
    assert forced["created"] != rebuilt["created"] and forced["cache"]["text_misses"] == 0


def test_missing_graph_is_a_clear_error(tmp_path, minilm):
    with pytest.raises(InputError, match="run `hir prepare` first"):
        enrich(tmp_path / "nowhere", tmp_path / "content", tmp_path / "cache", minilm, FIT)
