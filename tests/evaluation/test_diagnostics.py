"""Representation diagnostics on hand-built token tables."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hir.data.snapshot import load_snapshot
from hir_evaluation.report import diagnostics as diag


def _frame(tokens: list[list[int]], weights: list[list[float]] | None = None, key: str = "p") -> pl.DataFrame:
    n = len(tokens)
    weights = weights or [[1.0] + [0.0] * (len(t) - 1) for t in tokens]
    return pl.DataFrame({
        "entity_id": [f"{key}{i}" for i in range(n)], "node_id": list(range(n)),
        "embedding": [[float(i), 1.0] for i in range(n)],
        "tokens_l0": tokens, "weights_l0": weights,
    }).with_columns(pl.col("tokens_l0").cast(pl.List(pl.Int32)), pl.col("weights_l0").cast(pl.List(pl.Float32)))


def test_top1_follows_the_weights() -> None:
    f = _frame([[3, 1], [2, 0]], [[0.2, 0.8], [0.9, 0.1]])
    assert diag.top1(f, 0).tolist() == [1, 2]


def test_token_usage() -> None:
    f = _frame([[0], [0], [1], [1]])
    (level,) = diag.token_usage({"product": f}, vocab=[4])
    assert level["used"] == 2 and level["used_fraction"] == 0.5
    assert level["perplexity"] == pytest.approx(2.0)
    assert level["counts"] == [2, 2, 0, 0]


def test_taxonomy_and_nmi(tiny_graph: Path) -> None:
    snap = load_snapshot(tiny_graph)
    labels = diag.taxonomy_labels(snap, "product")
    assert labels["taxonomy_d1"].tolist() == [0] * 6  # the root "food"
    assert labels["taxonomy_d2"].tolist() == [1, 1, 1, 2, 2, 2]
    perfect = _frame([[7], [7], [7], [4], [4], [4]])
    assert diag.nmi_table(perfect, labels)["l0"]["taxonomy_d2"] == pytest.approx(1.0)
    mixed = _frame([[7], [4], [7], [4], [7], [4]])
    assert diag.nmi_table(mixed, labels)["l0"]["taxonomy_d2"] < 0.1


def test_stability_is_invariant_to_prototype_renaming() -> None:
    a = _frame([[0, 1], [1, 2], [2, 0], [0, 2]], [[0.7, 0.3]] * 4)
    rename = {0: 5, 1: 3, 2: 4}
    b = a.with_columns(pl.col("tokens_l0").list.eval(pl.element().replace_strict(rename)).cast(pl.List(pl.Int32)))
    (same,) = diag.token_stability(a, b)
    assert same["jaccard"] == pytest.approx(1.0) and same["top1_agreement"] == 1.0 and same["nmi"] == pytest.approx(1.0)
    c = a.with_columns(pl.Series("tokens_l0", [[0, 1], [0, 1], [0, 1], [0, 1]], dtype=pl.List(pl.Int32)))
    (diff,) = diag.token_stability(a, c)
    assert diff["jaccard"] < 1.0


def test_supergraph_and_prototypes(tmp_path: Path) -> None:
    (tmp_path / "supergraph.json").write_text(json.dumps({"raw_density": 0.01, "levels": [{"level": 0, "density": 0.5}]}))
    assert diag.supergraph_gain(tmp_path)["levels"][0]["gain"] == pytest.approx(50.0)
    pl.DataFrame({"level": [0, 0, 1], "proto_id": [0, 1, 0], "parent_id": [-1, -1, 0], "label": ["a", "b", "c"],
                  "usage": [0.2, 0.8, 1.0]}).write_parquet(tmp_path / "prototypes.parquet")
    top = diag.top_prototypes(tmp_path, 1)
    assert [(p["level"], p["label"]) for p in top] == [(0, "b"), (1, "c")]
    assert diag.supergraph_gain(tmp_path / "missing") is None


def test_embedding_map_shape() -> None:
    f = _frame([[i % 3] for i in range(50)])
    pts = diag.embedding_map(f, 20, seed=0)
    assert len(pts["x"]) == 20 and set(pts["token"]) <= {0, 1, 2}
    assert np.isfinite(pts["y"]).all()


def test_supergraph_table_sets_the_kmeans_reference_beside_the_learned_tokens():
    from evaluation.report.render import diagnostics_md

    level = {"level": 0, "prototypes": 8, "density": 0.5, "gain": 2.0, "random_gain": 2.1, "concentration": 0.95,
             "taxonomy_nmi": {"taxonomy_d1": 0.1, "taxonomy_d2": 0.2}}
    ref = {"levels": [{"level": 0, "prototypes": 8, "concentration": 0.97,
                       "taxonomy_nmi": {"taxonomy_d1": 0.11, "taxonomy_d2": 0.25}}]}
    md = diagnostics_md({"supergraph": {"raw_density": 0.25, "levels": [level], "kmeans_reference": ref,
                                        "hierarchy_fit": "entities"}})
    assert "| level | prototypes | density | gain over raw | random gain | concentration | k-means concentration " \
           "| NMI taxonomy_d2 | k-means NMI taxonomy_d2 |" in md
    assert "| 0 | 8 | 0.500000 | 2.0 | 2.1 | 0.950 | 0.970 | 0.200 | 0.250 |" in md and "entities prototypes" in md
    # an export without the reference (older runs) keeps the old table
    plain = diagnostics_md({"supergraph": {"raw_density": 0.25, "levels": [{**level, "taxonomy_nmi": {}}]}})
    assert "| level | prototypes | density | gain over raw | random gain | concentration |\n" in plain


def test_level0_tokens_carry_label_members_and_taxonomy_purity(tiny_graph: Path, tmp_path: Path) -> None:
    from evaluation.report.render import diagnostics_md

    snap = load_snapshot(tiny_graph)
    labels = diag.taxonomy_labels(snap, "product")
    labels["taxonomy_d1"] = labels["taxonomy_d2"]  # two top-level classes, 1 1 1 2 2 2
    pl.DataFrame({"level": [0, 0], "proto_id": [0, 1], "parent_id": [-1, -1], "label": ["milk · white", "tea"],
                  "members": [["whole milk", "skim | milk"], ["green tea"]], "usage": [0.5, 0.5]},
                 schema_overrides={"level": pl.Int8}).write_parquet(tmp_path / "prototypes.parquet")
    frame = _frame([[0], [0], [0], [0], [1], [1]])  # token 0 holds 3 of class 1 and one of class 2
    rows = diag.level0_tokens(tmp_path, frame, labels, snap, "product")
    assert [r["label"] for r in rows] == ["milk · white", "tea"]
    assert rows[0]["purity"] == pytest.approx(0.75) and rows[1]["purity"] == 1.0
    md = diagnostics_md({"level0_tokens": rows})
    assert "| 0 | 0.500 | milk · white | whole milk / skim / milk | 0.750 |" in md


def test_heldout_table_sets_kmeans_and_popularity_beside_the_tokens() -> None:
    from evaluation.report.render import diagnostics_md

    row = {"level": 0, "concentration": 0.9, "random_sd": 0.01, "log_loss": 1.5, "log_loss_popularity": 2.0,
           "recall@5": 0.8, "recall@5_popularity": 0.6, "coverage": 0.7, "random_coverage": 0.6}
    held = {"test_pairs": 100, "raw_coverage": 0.1, "tokens": [row],
            "kmeans_reference": [{**row, "concentration": 0.95, "log_loss": 1.6, "recall@5": 0.75, "coverage": 0.65}]}
    md = diagnostics_md({"supergraph": {"levels": [], "heldout": held}})
    assert "| 0 | 0.900 | 0.950 | 0.500 | 0.400 | 0.800 | 0.600 | 0.750 | 0.600 | 0.700 | 0.650 |" in md
    assert "test period's 100 user-entity pairs" in md


def test_supergraph_table_sets_purity_per_level_against_its_depth():
    from evaluation.report.render import diagnostics_md

    def level(lvl: int, purity: float) -> dict:
        return {"level": lvl, "prototypes": 8, "density": 0.5, "gain": 2.0, "random_gain": 2.1, "concentration": 0.9,
                "taxonomy_nmi": {"taxonomy_d1": 0.1, "taxonomy_d2": 0.2},
                "taxonomy_purity": {"taxonomy_d1": purity, "taxonomy_d2": purity / 2}}
    ref = {"levels": [{**level(0, 0.7), "concentration": 0.95}, {**level(1, 0.6), "concentration": 0.95}]}
    md = diagnostics_md({"supergraph": {"raw_density": 0.25, "levels": [level(0, 0.8), level(1, 0.5)],
                                        "kmeans_reference": ref}})
    assert "| purity (depth) | k-means purity |" in md
    assert "| 0.800 (d1) | 0.700 |" in md  # the coarsest level against depth 1
    assert "| 0.250 (d2) | 0.300 |" in md  # the finest against the deepest

