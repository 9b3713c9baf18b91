"""The co-engagement refinement of the token tree (export.hierarchy_fit=coengage)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from hir.export.hierarchy import coengage_refine, force_top1
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


def test_force_top1_puts_the_refined_token_first() -> None:
    codes = [np.array([[5, 6, 7], [5, 6, 7], [5, 6, 7]])]
    got = force_top1(codes, [np.array([7, 9, 5])], np.array([0, 1]))[0]
    assert got.tolist() == [[7, 5, 6], [9, 5, 6], [5, 6, 7]]


def test_export_with_coengage_keeps_the_refined_tokens_and_a_tree(trained_run: Path, tmp_path: Path) -> None:
    run(compose(trained_run, *TINY_DATA, *TINY_MODEL, "export.hierarchy_fit=coengage", "force=true",
                f"paths.embeddings_dir={tmp_path}/embeddings", f"paths.hierarchy_dir={tmp_path}/hierarchy",
                stage="export"))
    sg = json.loads((tmp_path / "hierarchy" / "supergraph.json").read_text())
    assert sg["hierarchy_fit"] == "coengage" and sg["heldout"]["tokens"]
    products = pl.read_parquet(tmp_path / "embeddings" / "product.parquet")
    top = [products[f"tokens_l{lvl}"].list.first().to_numpy() for lvl in range(3)]
    warm = ~products["cold_start"].to_numpy()
    for lvl in (1, 2):  # levels (2, 4, 8): each token's parent is token // 2
        assert (top[lvl][warm] // 2 == top[lvl - 1][warm]).all()
