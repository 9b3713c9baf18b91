"""Token trees fitted beyond the refit (hir/export/fits.py; export.hierarchy_fit=coengage, bottomup)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hir.export.embed import Embedder
from hir.export.fits import bottomup_tokens, coengage_refine, group_balanced
from hir.export.stage import run
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
    emb = Embedder(meta["checkpoint"], trained_run / "graph", trained_run / "content")
    emb.load_tokenizer(tmp_path / "hierarchy" / "tokenizer.pt")
    codes, _ = emb.tokens(np.stack(products["embedding"].to_numpy()))
    for lvl in range(3):
        assert (codes[lvl] == np.stack(products[f"tokens_l{lvl}"].to_numpy())).all()


def test_bottomup_refuses_fewer_entities_than_level_one_tokens() -> None:
    with pytest.raises(ValueError, match=r"3 warm entities for 4 level-1 tokens; set export.hierarchy_fit=entities"):
        bottomup_tokens(np.eye(3), (2, 4), (np.zeros(0, np.int64), np.zeros(0, np.int64)), 1, seed=0)
