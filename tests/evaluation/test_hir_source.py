"""HIR features for ranking rows are joined point-in-time; content blocks respect the cutoff."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hir.data.snapshot import load_snapshot
from hir.errors import InputError
from hir_evaluation.ranking.arms.content import content_blocks
from hir_evaluation.ranking.arms.hir import vector_blocks
from hir_evaluation.ranking.arms.hir_tokens import shared_weight
from hir_evaluation.sources.hir import from_files
from hir_evaluation.tasks import RankingTask, build_candidates
from tests.evaluation.fixtures import write_content
from tests.evaluation.tiny import TEST_START, VAL_START

TS = pl.Datetime("us", "UTC")


def _write_versions(emb_dir: Path, etype: str, keys: list[str]) -> None:
    """Two versions per entity: stamped val_start (vector [1, 0]) and test_start (vector [0, 1])."""
    rows = []
    for stamp, vec, tok in ((VAL_START, [1.0, 0.0], 0), (TEST_START, [0.0, 1.0], 1)):
        for k in keys:
            rows.append({"entity_id": k, "embedding": vec, "tokens_l0": [tok, 2], "weights_l0": [0.75, 0.25],
                         "event_timestamp": stamp})
    emb_dir.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(rows).with_columns(
        pl.col("embedding").cast(pl.List(pl.Float32)), pl.col("tokens_l0").cast(pl.List(pl.Int32)),
        pl.col("weights_l0").cast(pl.List(pl.Float32)), pl.col("event_timestamp").cast(TS),
    ).write_parquet(emb_dir / f"{etype}.parquet")


def test_files_point_in_time(tiny_graph: Path, tmp_path: Path) -> None:
    snap = load_snapshot(tiny_graph)
    emb = tmp_path / "embeddings"
    _write_versions(emb, "user", [f"u{i}" for i in range(4)])
    _write_versions(emb, "product", [f"p{i}" for i in range(5)])  # p5 (cold) was never exported
    task = RankingTask(candidate_stages=("view",))
    rows = pl.concat([build_candidates(task, snap, s) for s in ("train", "val", "test")])
    user, entity = from_files(emb, snap, rows, "product")
    split = rows["split"].to_numpy()
    # train rows predate every version: no features; val rows see v1; test rows see v2
    assert not user.present[split == "train"].any()
    assert np.allclose(user.vectors[split == "val"], [1.0, 0.0])
    assert np.allclose(user.vectors[split == "test"], [0.0, 1.0])
    cold = (rows["entity_id"] == 5).to_numpy()
    assert not entity.present[cold].any() and np.allclose(entity.vectors[cold], 0.0)
    bag = user.tokens[0]
    assert bag.vocab == 3
    assert bag.ids[split == "test"].tolist()[0] == [1, 2]
    assert np.allclose(bag.weights[split == "train"], 0.0)  # padding rows weigh nothing
    dense, vectors = vector_blocks(user, user)
    assert set(dense) == {"has_hir_user", "has_hir_entity", "hir_affinity"} and set(vectors) == {"hir_user", "hir_entity"}
    # a bag shares with itself Σ w² on present rows (0.75² + 0.25²), nothing on padding rows
    shared = shared_weight(bag, bag)
    assert np.allclose(shared[split == "test"], 0.75**2 + 0.25**2) and np.allclose(shared[split == "train"], 0.0)


def test_missing_export_names_the_fix(tiny_graph: Path, tmp_path: Path) -> None:
    snap = load_snapshot(tiny_graph)
    rows = build_candidates(RankingTask(candidate_stages=("view",)), snap, "test")
    with pytest.raises(InputError, match="run `hir export`"):
        from_files(tmp_path / "nowhere", snap, rows, "product")


def test_content_profile_cutoff(tiny_graph: Path, tmp_path: Path) -> None:
    snap = load_snapshot(tiny_graph)
    write_content(tiny_graph, tmp_path / "content", dim=8)
    rows = pl.concat([build_candidates(RankingTask(candidate_stages=("view",)), snap, s) for s in ("train", "test")])
    dense, vectors = content_blocks(snap, tmp_path / "content", rows, "product", snap.val_start, None)
    split = rows["split"].to_numpy()
    assert dense["has_content_user"][split == "train"].sum() == 0  # before the cutoff: no profile
    assert dense["has_content_user"][split == "test"].all()
    no_text = (rows["entity_id"] == 5).to_numpy()  # p5 has no text
    assert dense["has_content_entity"][no_text].sum() == 0
    assert np.allclose(np.linalg.norm(vectors["content_entity"][~no_text], axis=1), 1.0, atol=1e-5)
