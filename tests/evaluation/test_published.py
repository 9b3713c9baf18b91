"""The production path: HIR features through Feast (point-in-time, by the ranker feature service)
and retrieval through Milvus by alias, on a validated and published contract-shaped export."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.conftest import REES46
from tests.evaluation.fixtures import write_content, write_export

MODEL = ["spectral.rank=16", "model.net.hierarchy.levels=[4,16]", "model.net.hierarchy.top_k=2"]
FAST = [
    "eval.ranker.max_steps=60", "eval.ranker.eval_every=20", "eval.bootstrap.resamples=20",
    "eval.retrieval.lightgcn.max_epochs=2", "eval.retrieval.lightgcn.steps_per_epoch=3", "eval.retrieval.itemknn.neighbours=20", "eval.retrieval.gfcf.rank=32",
]


@pytest.mark.slow
@pytest.mark.skipif(not REES46.exists(), reason=f"needs {REES46}")
def test_feast_and_milvus_match_the_files(compose: Callable, tmp_path: Path) -> None:
    from hir.data.prepare import run as prepare
    from hir.data.snapshot import load_snapshot
    from hir.publish.stage import run as publish
    from hir.validate.stage import run as validate
    from hir_evaluation import stage
    from hir_evaluation.sources.hir import from_feast, from_files
    from hir_evaluation.sources.published import load_manifest
    from hir_evaluation.tasks import RankingTask, build_candidates

    base = ["data=rees46", f"publish.store_dir={tmp_path / 'store'}", *MODEL]
    prepare(compose(*base, stage="prepare"))
    write_export(tmp_path / "graph", tmp_path / "embeddings", tmp_path / "hierarchy")
    write_content(tmp_path / "graph", tmp_path / "content")
    validate(compose(*base, stage="validate"))
    publish(compose(*base, stage="publish"))
    manifest = load_manifest(tmp_path / "publish")
    assert manifest is not None

    # Feast's point-in-time join returns exactly what the file reader joins: the same rows covered,
    # the same vectors and tokens
    snap = load_snapshot(tmp_path / "graph")
    task = RankingTask(candidate_stages=("view",))
    rows = pl.concat([build_candidates(task, snap, s) for s in ("train", "val", "test")])
    feast_user, feast_item = from_feast(manifest, snap, rows, "product")
    file_user, file_item = from_files(tmp_path / "embeddings", snap, rows, "product")
    for a, b in ((feast_user, file_user), (feast_item, file_item)):
        assert np.array_equal(a.present, b.present)
        assert a.present.any() and not a.present.all()  # train rows predate the embeddings
        assert np.allclose(a.vectors, b.vectors, atol=1e-6)
        assert np.array_equal(a.tokens[1].ids, b.tokens[1].ids)

    metrics = stage.run(compose(*base, *FAST, "eval.hir_source=published", stage="evaluate"))
    assert metrics["sources"]["ranking_hir"] == "feast" and metrics["sources"]["retrieval_hir"] == "milvus"
    assert metrics["sources"]["fallback"] is False
    assert metrics["model_version"] == manifest["version"]
    assert metrics["retrieval"]["hir"]["recall@20"] is not None
    files = stage.run(compose(*base, *FAST, "eval.hir_source=files", "force=true", stage="evaluate"))
    # HNSW search vs exact search over the same vectors: the same retrieval up to ANN misses
    assert abs(files["retrieval"]["hir"]["recall@50"] - metrics["retrieval"]["hir"]["recall@50"]) < 0.1
    # the masked protocol from Milvus (k + |history| hits, history dropped, ef raised to the limit)
    # agrees with exact masked search over the files
    masked, exact = metrics["retrieval"]["masked_new_to_user"]["hir"], files["retrieval"]["masked_new_to_user"]["hir"]
    assert masked["recall@50"] is not None and abs(masked["recall@50"] - exact["recall@50"]) < 0.05
    # and so does the deep-funnel one (the same hits, only the target-stage history dropped)
    deep, exact_deep = metrics["retrieval"]["deep_funnel"]["hir"], files["retrieval"]["deep_funnel"]["hir"]
    assert deep["hr@50"] is not None and abs(deep["recall@50"] - exact_deep["recall@50"]) < 0.05
    assert files["ranking"]["hir"]["auc"] == pytest.approx(metrics["ranking"]["hir"]["auc"], abs=1e-6)
