"""The content-blended token space (hir/export/content_tokens.py; export.token_content)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from hir.export.cold import place_like_export
from hir.export.content_tokens import Blended, array_text, blend, store_text, widened
from hir.export.embed import Embedder, direction, resolve_checkpoint
from hir.export.recorded import exported_checkpoint
from hir.export.stage import ExportConfig, run
from tests.export.fixtures import cold_product_inputs, refreshed_cold_tokens
from tests.train.fixtures import TINY_DATA, TINY_MODEL, compose


def test_the_tokenizer_reads_the_normalised_blend_of_direction_and_text() -> None:
    rng = np.random.default_rng(0)
    z = rng.normal(size=(5, 4)).astype(np.float32)  # K = 3 directions + the slack
    text = rng.normal(size=(5, 6)).astype(np.float32)
    text /= np.linalg.norm(text, axis=1, keepdims=True)
    text[2] = 0.0  # no text
    out = blend(z, lambda rows: text[rows], 6, 2.0, block=2)
    assert out.shape == (5, 3 + 6 + 1) and (out[:, -1] == 0).all()
    s = z[:, :3] / np.linalg.norm(z[:, :3], axis=1, keepdims=True)
    want = np.concatenate([s, 2.0 * text], 1)
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    np.testing.assert_allclose(direction(torch.from_numpy(out)).numpy(), want, atol=1e-6)
    # a row without text reads its collaborative direction alone
    np.testing.assert_allclose(direction(torch.from_numpy(out[2:3])).numpy()[0, :3], s[2], atol=1e-6)
    # read lazily, by slice or by row ids, it gives the same rows
    lazy = Blended(z, lambda rows: text[rows], 6, 2.0)
    assert lazy.shape == out.shape and len(lazy) == 5
    np.testing.assert_array_equal(lazy[1:4], out[1:4])
    np.testing.assert_array_equal(lazy[np.array([4, 0, 2])], out[[4, 0, 2]])
    with pytest.raises(ValueError, match="weight > 0"):
        blend(z, lambda rows: text[rows], 6, 0.0)
    with pytest.raises(ValueError, match="expected"):
        blend(z, lambda rows: text[rows[:-1]], 6, 1.0)


def test_config_refuses_a_negative_weight_and_the_checkpoint_tree(trained_run: Path) -> None:
    from hydra.utils import instantiate

    for value, fit, match in (("-1", "coengage", "weight >= 0"), ("0.5", "checkpoint", "hierarchy_fit=coengage")):
        cfg = compose(trained_run, *TINY_DATA, *TINY_MODEL, f"export.token_content={value}",
                      f"export.hierarchy_fit={fit}", stage="export")
        with pytest.raises(Exception, match=match):  # hydra wraps the ValueError
            instantiate(cfg.export)
    assert isinstance(instantiate(compose(trained_run, *TINY_DATA, *TINY_MODEL, stage="export").export), ExportConfig)


def test_new_entities_read_the_text_the_store_holds(trained_run: Path) -> None:
    """`hir refresh` blends a new entity's text as enrich wrote it (:func:`array_text`), the export
    blends the store's content rows (:func:`store_text`): for the same entities they are equal."""
    emb = Embedder(resolve_checkpoint("best", trained_run / "checkpoints"), trained_run / "graph",
                   trained_run / "content")
    st = emb.store
    lo, hi = st.type_range("product")
    content = pl.read_parquet(trained_run / "content" / "product.parquet").sort("node_id")
    assert content.height == hi - lo and content["has_text"].any()
    t_store = store_text(st)(np.arange(lo, hi))
    t_new = array_text(np.stack(content["text_vec"].to_numpy()), content["has_text"].to_numpy(),
                       int(st.layout["text_dim"]))(np.arange(hi - lo))
    assert ((np.abs(t_store).sum(1) > 0) == content["has_text"].to_numpy()).all()
    np.testing.assert_allclose(t_new, t_store, atol=1e-6)


@pytest.fixture(scope="module")
def blended(trained_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("blended")
    run(compose(trained_run, *TINY_DATA, *TINY_MODEL, "export.token_content=1.0", "force=true",
                f"paths.embeddings_dir={d}/embeddings", f"paths.hierarchy_dir={d}/hierarchy", stage="export"))
    return d


def test_export_fits_and_reads_the_tokens_in_the_blended_space(blended: Path, trained_run: Path) -> None:
    """The tree, its prototypes and the saved tokenizer are K + T wide; the saved tokenizer gives
    every exported row its tokens from its embedding blended with its text; the served embeddings
    are those of an export without the blend."""
    meta = json.loads((blended / "embeddings" / "meta.json").read_text())
    assert meta["token_content"] == 1.0
    emb = Embedder(exported_checkpoint(meta["checkpoint"], blended / "embeddings"), trained_run / "graph", trained_run / "content")
    k, t = emb.net.tokenizer.dim, int(emb.store.layout["text_dim"])
    assert t > 0
    emb.load_tokenizer(blended / "hierarchy" / "tokenizer.pt")
    assert emb.tokenizer.dim == k + t
    protos = pl.read_parquet(blended / "hierarchy" / "prototypes.parquet")
    assert set(protos["vector"].list.len().to_list()) == {k + t}
    st = emb.store
    for etype in ("product", "user"):
        frame = pl.read_parquet(blended / "embeddings" / f"{etype}.parquet").sort("node_id")
        lo = st.type_range(etype)[0]
        z = np.stack(frame["embedding"].to_numpy())
        codes, _ = emb.tokens(blend(z, lambda rows, lo=lo: store_text(st)(lo + rows), t, 1.0))
        for lvl in range(3):
            assert (codes[lvl] == np.stack(frame[f"tokens_l{lvl}"].to_numpy())).all(), (etype, lvl)
    plain = blended / "plain"
    run(compose(trained_run, *TINY_DATA, *TINY_MODEL, "export.token_content=0", "force=true",
                f"paths.embeddings_dir={plain}/embeddings",
                f"paths.hierarchy_dir={plain}/hierarchy", stage="export"))
    a = pl.read_parquet(blended / "embeddings" / "product.parquet").sort("node_id")
    b = pl.read_parquet(plain / "embeddings" / "product.parquet").sort("node_id")
    np.testing.assert_array_equal(np.stack(a["embedding"].to_numpy()), np.stack(b["embedding"].to_numpy()))
    assert not all((np.stack(a[f"tokens_l{lvl}"].to_numpy()) == np.stack(b[f"tokens_l{lvl}"].to_numpy())).all()
                   for lvl in range(3))  # the text moved some tokens


def test_refresh_blends_a_new_entity_as_export_did(blended: Path, trained_run: Path) -> None:
    """A cold product re-embedded from its content and links and placed as the export placed it
    (what `hir refresh` does), blended with its text as enrich wrote it, gets its exported tokens."""
    codes, cold = refreshed_cold_tokens(blended, trained_run)
    assert (codes[0][:, 0] == np.stack(cold["tokens_l0"].to_numpy())[:, 0]).mean() > 0.9


def test_export_is_redone_when_the_text_weight_changes(blended: Path, trained_run: Path) -> None:
    d = blended

    def export(weight: str) -> dict:
        return run(compose(trained_run, *TINY_DATA, *TINY_MODEL, f"export.token_content={weight}",
                           f"paths.embeddings_dir={d}/embeddings", f"paths.hierarchy_dir={d}/hierarchy", stage="export"))

    mtime = (d / "embeddings" / "product.parquet").stat().st_mtime
    assert export("1.0")["token_content"] == 1.0
    assert (d / "embeddings" / "product.parquet").stat().st_mtime == mtime
    assert export("0.0")["token_content"] == 0.0
    assert (d / "embeddings" / "product.parquet").stat().st_mtime != mtime


def test_widened_keeps_the_tree_shape() -> None:
    from hir.nn import HierarchicalTokenizer

    tok = HierarchicalTokenizer(8, (2, 4, 8), 2, 0.1, 0.2)
    wide = widened(tok, 20)
    assert wide.dim == 20 and wide.levels == tok.levels and wide.top_k == 2 and wide.radius == 0.2


def test_a_served_export_blends_the_full_rank_vectors_and_refresh_follows(trained_run: Path, tmp_path: Path) -> None:
    """At a served dimension (export.dim=8 of rank 16, tokens at the full rank) the blend reads the
    rank-K token vectors (a placed row lifted back), as `hir refresh` does: token_vectors, then
    the blend. The saved tokenizer is K + T wide."""
    from hir.export.project import load_projection, token_vectors

    run(compose(trained_run, *TINY_DATA, *TINY_MODEL, "export.dim=8", "export.token_content=1.0", "force=true",
                f"paths.embeddings_dir={tmp_path}/embeddings", f"paths.hierarchy_dir={tmp_path}/hierarchy",
                stage="export"))
    emb_dir = tmp_path / "embeddings"
    meta = json.loads((emb_dir / "meta.json").read_text())
    assert meta["dim"] == 9 and meta["token_space"] == "full" and meta["token_content"] == 1.0
    emb = Embedder(exported_checkpoint(meta["checkpoint"], emb_dir), trained_run / "graph", trained_run / "content")
    emb.load_tokenizer(tmp_path / "hierarchy" / "tokenizer.pt")
    t = int(emb.store.layout["text_dim"])
    assert emb.tokenizer.dim == 16 + t
    cold, content, links = cold_product_inputs(trained_run, emb_dir)
    text, has = np.stack(content["text_vec"].to_numpy()), content["has_text"].to_numpy()
    full = emb.embed_new("product", text, np.stack(content["attr_vec"].to_numpy()), has, links)
    proj = load_projection(emb_dir, meta, emb.version)
    projected = proj.apply(full, np.zeros(len(full), bool))
    z = place_like_export(emb_dir, emb.store, "product", projected.copy(), text, has)
    codes, _ = emb.tokens(blend(token_vectors(full, projected, z, proj), array_text(text, has, t), t, 1.0))
    assert (codes[0][:, 0] == np.stack(cold["tokens_l0"].to_numpy())[:, 0]).mean() > 0.9
