"""Token trees fitted beyond the refit (hir/export/fits.py; export.hierarchy_fit=coengage, bottomup)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from hir.export.content_tokens import blend, store_text
from hir.export.embed import Embedder
from hir.export.fits import bottomup_tokens, coengage_refine, fit_tree, follow_tokens, group_balanced, top1_of
from hir.export.recorded import exported_checkpoint
from hir.export.stage import run
from hir.nn import HierarchicalTokenizer
from tests.export.fixtures import refreshed_cold_tokens
from tests.train.fixtures import TINY_DATA, TINY_MODEL, compose


def test_refinement_moves_an_entity_to_its_users_token_within_its_parent() -> None:
    # users 0-2 engage entities 0-3, users 3-5 entities 4-7; entity 3 starts in the other
    # interest's tokens and has history, entity 8 has none
    users = np.array([u for u in range(6) for _ in range(4)])
    ents = np.array([e for u in range(6) for e in (range(4) if u < 3 else range(4, 8))])
    coarse = np.array([0, 0, 0, 1, 1, 1, 1, 1, 1])
    fine = np.array([0, 1, 0, 2, 3, 2, 3, 2, 3])  # children of 0: 0, 1; of 1: 2, 3
    out = coengage_refine([coarse, fine], (2, 4), (users, ents), 6, 9)
    assert out[0][3] == 0 and out[0][8] == 1  # moved to its users' token; no history: kept
    assert (out[1] // 2 == out[0]).all()  # the tree holds
    assert out[1][3] in (0, 1)


def test_balanced_groups_are_equal_and_follow_the_points() -> None:
    rng = np.random.default_rng(0)
    centres = np.eye(4)[rng.permutation(np.repeat(np.arange(4), 4))]  # 16 points, 4 directions
    a = group_balanced(centres + 0.01 * rng.normal(size=centres.shape), np.ones(16), 4, seed=0)
    assert sorted(np.bincount(a).tolist()) == [4, 4, 4, 4]
    for g in range(4):  # each group holds one direction's points
        assert len({int(np.argmax(c)) for c in centres[a == g]}) == 1


def test_bottomup_tree_groups_fine_tokens_its_users_engage_together() -> None:
    # 4 directions x 10 entities; users 0-9 engage directions 0 and 1, users 10-19 directions 2 and 3
    rng = np.random.default_rng(1)
    d = np.repeat(np.eye(4), 10, axis=0) + 0.05 * rng.normal(size=(40, 4))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    users = np.array([u for u in range(20) for _ in range(6)])
    rows = np.array([e for u in range(20) for e in rng.choice(np.arange(20) if u < 10 else np.arange(20, 40), 6,
                                                                 replace=False)])
    t0, t1, t2 = bottomup_tokens(d, (2, 4, 8), (users, rows), 20, seed=0)
    assert (t1 // 2 == t0).all() and (t2 // 2 == t1).all()  # the tree: children of p are 2p, 2p + 1
    assert len(set(t0[:20])) == 1 and len(set(t0[20:])) == 1 and t0[0] != t0[20]
    assert len(set(t1[:10])) == 1 and t1[0] != t1[10]  # level 1 is the four directions


def test_export_with_a_fitted_tree_gives_the_saved_tokenizers_tokens(trained_run: Path, tmp_path: Path) -> None:
    for fit in ("coengage", "bottomup"):
        check_export(trained_run, tmp_path / fit, fit)


def check_export(trained_run: Path, tmp_path: Path, fit: str) -> None:
    # the collaborative directions alone (export.token_content=0): the blend is tested in test_content_tokens.py
    run(compose(trained_run, *TINY_DATA, *TINY_MODEL, f"export.hierarchy_fit={fit}", "export.token_content=0", "force=true",
                f"paths.embeddings_dir={tmp_path}/embeddings", f"paths.hierarchy_dir={tmp_path}/hierarchy",
                stage="export"))
    sg = json.loads((tmp_path / "hierarchy" / "supergraph.json").read_text())
    assert sg["hierarchy_fit"] == fit and sg["heldout"]["tokens"]
    products = pl.read_parquet(tmp_path / "embeddings" / "product.parquet")
    # the saved tokenizer gives exactly the exported tokens (what `hir refresh` relies on)
    meta = json.loads((tmp_path / "embeddings" / "meta.json").read_text())
    emb = Embedder(exported_checkpoint(meta["checkpoint"], tmp_path / "embeddings"), trained_run / "graph", trained_run / "content")
    emb.load_tokenizer(tmp_path / "hierarchy" / "tokenizer.pt")
    codes, _ = emb.tokens(np.stack(products["embedding"].to_numpy()))
    for lvl in range(3):
        assert (codes[lvl] == np.stack(products[f"tokens_l{lvl}"].to_numpy())).all()


def test_bottomup_refuses_fewer_entities_than_level_one_tokens() -> None:
    with pytest.raises(ValueError, match=r"3 warm entities for 4 level-1 tokens; set export.hierarchy_fit=entities"):
        bottomup_tokens(np.eye(3), (2, 4), (np.zeros(0, np.int64), np.zeros(0, np.int64)), 1, seed=0)


def test_a_tree_with_a_free_finest_level_settles_its_children_on_their_members() -> None:
    """fit_tree on a tree whose finest level is free (export.hierarchy_free_levels=1): the settled
    tokens are the tokenizer's own (what tokenizer.pt gives), each finest prototype is the unit
    mean of its members (the bound no longer clips it) and keeps its one parent."""
    rng = np.random.default_rng(0)
    d = np.repeat(np.eye(8), 12, axis=0) + 0.3 * rng.normal(size=(96, 8))
    d = (d / np.linalg.norm(d, axis=1, keepdims=True)).astype(np.float32)
    users = np.repeat(np.arange(24), 8)
    rows = np.concatenate([rng.choice(np.arange(48) if u < 12 else np.arange(48, 96), 8, replace=False)
                           for u in range(24)])
    for free in (0, 1):
        tok = HierarchicalTokenizer(8, (2, 4, 16), 2, 0.05, 0.2, free_levels=free)
        tok.init_from_data(torch.from_numpy(d), generator=torch.Generator().manual_seed(0))
        settled = fit_tree(tok, d, "coengage", (users, rows), 24, seed=0)
        again = top1_of(tok, d)
        for lvl in range(3):
            assert (settled[lvl] == again[lvl]).all(), (free, lvl)
        follow_tokens(tok, d, settled)  # one more settling step: prototypes <- their members' mean
        fine = tok.vectors()[2].detach().numpy()
        used = np.unique(settled[2])
        mean = np.stack([d[settled[2] == j].mean(0) for j in used])
        at_mean = np.allclose(fine[used], mean / np.linalg.norm(mean, axis=1, keepdims=True), atol=1e-5)
        assert at_mean is bool(free), free  # bounded, a child cannot reach its members' mean here
        assert (tok.parents(2) == torch.arange(16) // 4).all()


@pytest.fixture(scope="module")
def free_export(trained_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An export whose tree has its finest level free of the bound, in the default blended token space."""
    d = tmp_path_factory.mktemp("free")
    run(compose(trained_run, *TINY_DATA, *TINY_MODEL, "export.hierarchy_free_levels=1", "export.token_content=1.0",
                "force=true", f"paths.embeddings_dir={d}/embeddings", f"paths.hierarchy_dir={d}/hierarchy",
                stage="export"))
    return d


def test_free_levels_export_is_a_tree_and_the_saved_tokenizer_reads_its_tokens(free_export: Path,
                                                                                trained_run: Path) -> None:
    """Every exported row (warm and cold, every type) gets from hierarchy/tokenizer.pt exactly its
    exported tokens at every level, and every prototype below level 0 has one parent."""
    meta = json.loads((free_export / "embeddings" / "meta.json").read_text())
    assert meta["hierarchy_free_levels"] == 1
    emb = Embedder(exported_checkpoint(meta["checkpoint"], free_export / "embeddings"), trained_run / "graph", trained_run / "content")
    emb.load_tokenizer(free_export / "hierarchy" / "tokenizer.pt")
    assert emb.tokenizer.free_levels == 1
    st, t = emb.store, int(emb.store.layout["text_dim"])
    for etype in ("product", "user", "advertiser"):
        frame = pl.read_parquet(free_export / "embeddings" / f"{etype}.parquet").sort("node_id")
        lo = st.type_range(etype)[0]
        z = np.stack(frame["embedding"].to_numpy())
        codes, _ = emb.tokens(blend(z, lambda rows, lo=lo: store_text(st)(lo + rows), t, 1.0))
        for lvl in range(3):
            assert (codes[lvl] == np.stack(frame[f"tokens_l{lvl}"].to_numpy())).all(), (etype, lvl)
    protos = pl.read_parquet(free_export / "hierarchy" / "prototypes.parquet")
    levels = emb.levels
    for lvl in range(1, len(levels)):
        level = protos.filter(pl.col("level") == lvl)
        assert level.height == levels[lvl] and level["proto_id"].n_unique() == levels[lvl]
        assert level["parent_id"].is_between(0, levels[lvl - 1] - 1).all()
        assert (level["parent_id"].value_counts()["count"] == levels[lvl] // levels[lvl - 1]).all()


def test_refresh_gives_a_new_entity_its_export_tokens_under_free_levels(free_export: Path, trained_run: Path) -> None:
    """A cold product embedded from its content and links and placed as the export placed it (what
    `hir refresh` does with the saved tokenizer) gets the tokens the export gave it."""
    codes, cold = refreshed_cold_tokens(free_export, trained_run)
    for lvl in range(3):
        assert (codes[lvl][:, 0] == np.stack(cold[f"tokens_l{lvl}"].to_numpy())[:, 0]).mean() > 0.9, lvl


def test_free_levels_are_refused_on_the_checkpoint_tree_and_redo_the_export(free_export: Path,
                                                                             trained_run: Path) -> None:
    from hydra.utils import instantiate

    cfg = compose(trained_run, *TINY_DATA, *TINY_MODEL, "export.hierarchy_free_levels=1",
                  "export.hierarchy_fit=checkpoint", "export.token_content=0", stage="export")
    with pytest.raises(Exception, match="hierarchy_free_levels=1 needs a tree fitted at export"):
        instantiate(cfg.export)
    d = free_export

    def export(free: int) -> dict:
        return run(compose(trained_run, *TINY_DATA, *TINY_MODEL, f"export.hierarchy_free_levels={free}",
                           "export.token_content=1.0", f"paths.embeddings_dir={d}/embeddings",
                           f"paths.hierarchy_dir={d}/hierarchy", stage="export"))

    mtime = (d / "embeddings" / "product.parquet").stat().st_mtime
    assert export(1)["hierarchy_free_levels"] == 1
    assert (d / "embeddings" / "product.parquet").stat().st_mtime == mtime  # reused
    assert export(0)["hierarchy_free_levels"] == 0
    assert (d / "embeddings" / "product.parquet").stat().st_mtime != mtime


def test_an_export_of_another_hierarchy_fit_is_not_reused(tmp_path: Path) -> None:
    from hir.export.embed import checkpoint_version
    from hir.export.stage import reusable

    ckpt = tmp_path / "last.ckpt"
    ckpt.write_bytes(b"weights")
    meta = {"model_version": checkpoint_version(ckpt), "export_dim": None, "projection": None,
            "token_content": 1.0, "hierarchy_free_levels": 0, "hierarchy_fit": "coengage"}
    path = tmp_path / "meta.json"
    path.write_text(json.dumps(meta))
    settings = {"token_content": 1.0, "hierarchy_free_levels": 0}
    assert reusable(path, ckpt, False, None, "full", dict(settings, hierarchy_fit="coengage")) == meta
    assert reusable(path, ckpt, False, None, "full", dict(settings, hierarchy_fit="bottomup")) is None  # the tokens differ: redo
    path.write_text(json.dumps({k: v for k, v in meta.items() if k != "hierarchy_fit"}))
    assert reusable(path, ckpt, False, None, "full", dict(settings, hierarchy_fit="bottomup")) is not None  # written before it was recorded


def test_children_from_more_seedings_are_the_best_of_them_and_a_change_redoes_the_export(tmp_path: Path) -> None:
    from hir.export.embed import checkpoint_version
    from hir.export.hierarchy import refit_tokenizer
    from hir.export.stage import reusable
    from hir.nn.hierarchy import kmeans

    # three well-separated parents, each with two sub-clusters; seedings differ, the best is kept
    gen = np.random.default_rng(0)
    centres = gen.normal(size=(3, 8)) * 5
    x = np.concatenate([c + s * gen.normal(size=(40, 8)) for c in centres for s in (0.3, 0.3)]).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    tree = HierarchicalTokenizer(8, (3, 6), 1, 0.1, 0.2)
    one = refit_tokenizer(tree, x, seed=1, child_n_init=1)
    five = refit_tokenizer(tree, x, seed=1, child_n_init=5)
    assert torch.equal(one.root, five.root)  # level 0 is the same best-of-10 either way
    assert torch.equal(five.vectors()[1], refit_tokenizer(tree, x, seed=1, child_n_init=5).vectors()[1])  # seeded
    assert not torch.equal(one.vectors()[1], five.vectors()[1])  # the setting reaches the children
    assert torch.equal(one.vectors()[1], refit_tokenizer(tree, x, seed=1).vectors()[1])  # 1 is the old default
    # kmeans' best of n seedings never has a larger inertia than its first seeding alone
    pts = torch.from_numpy(x[:80])

    def sse(c: torch.Tensor) -> float:
        return float(torch.cdist(pts, c).min(dim=1).values.pow(2).sum())

    assert sse(kmeans(pts, 3, 25, torch.Generator().manual_seed(0), 4)) <= sse(
        kmeans(pts, 3, 25, torch.Generator().manual_seed(0), 1)) + 1e-6
    # a recorded n other than the one asked for re-exports; a meta.json from before it meant 1
    ckpt = tmp_path / "last.ckpt"
    ckpt.write_bytes(b"weights")
    meta = {"model_version": checkpoint_version(ckpt), "export_dim": None, "projection": None,
            "hierarchy_fit": "coengage", "hierarchy_child_n_init": 5}
    path = tmp_path / "meta.json"
    path.write_text(json.dumps(meta))
    fit = {"hierarchy_fit": "coengage"}
    assert reusable(path, ckpt, False, None, "full", dict(fit, hierarchy_child_n_init=5)) == meta
    assert reusable(path, ckpt, False, None, "full", dict(fit, hierarchy_child_n_init=1)) is None
    path.write_text(json.dumps({k: v for k, v in meta.items() if k != "hierarchy_child_n_init"}))
    assert reusable(path, ckpt, False, None, "full", dict(fit, hierarchy_child_n_init=1)) is not None
    assert reusable(path, ckpt, False, None, "full", dict(fit, hierarchy_child_n_init=5)) is None


def test_an_export_under_other_settings_is_not_reused(tmp_path: Path) -> None:
    """Every export setting that shapes the outputs, and the seed, are in the digest meta.json
    records; how many nodes are embedded at a time and how the checkpoint is named are not. A
    meta.json written before the digest was recorded is judged on its token settings alone."""
    from hir.export.embed import checkpoint_version
    from hir.export.stage import reusable, settings_digest

    export = {"checkpoint": "best", "batch_size": 2048, "val_pairs": 2.0e9,
              "cold": {"method": "content_knn", "k": 20, "boosts": [1.0, 1.5]}, "cold_users": {"method": "recent"}}
    digest = settings_digest(export, 42)
    assert digest == settings_digest(dict(export, batch_size=64, checkpoint="/runs/a/checkpoints/best.ckpt"), 42)
    for other in (dict(export, val_pairs=1.0e6), dict(export, cold=dict(export["cold"], boosts=[1.0])),
                  dict(export, cold_users={"method": "knowledge"})):
        assert settings_digest(other, 42) != digest
    assert settings_digest(export, 43) != digest

    ckpt = tmp_path / "best.ckpt"
    ckpt.write_bytes(b"weights")
    meta = {"model_version": checkpoint_version(ckpt), "export_dim": None, "projection": None, "settings_digest": digest}
    path = tmp_path / "meta.json"
    path.write_text(json.dumps(meta))
    assert reusable(path, ckpt, False, None, "full", {}, digest) == meta
    assert reusable(path, ckpt, False, None, "full", {}, settings_digest(export, 43)) is None
    path.write_text(json.dumps({k: v for k, v in meta.items() if k != "settings_digest"}))
    assert reusable(path, ckpt, False, None, "full", {}, settings_digest(export, 43)) is not None
