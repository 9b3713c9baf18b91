"""The `recommend` retrieval arm ranks test users through hir/funnel/serve.py itself, and each
protocol's list drops exactly that protocol's history."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from hir.data.snapshot import load_snapshot
from hir.funnel.fit import FunnelConfig
from hir.funnel.scorer import ScorerConfig
from hir.funnel.serve import Recommender
from hir.funnel.stage import write_funnel
from hir_evaluation.retrieval.arms.recommend import Recommend
from hir_evaluation.retrieval.data import retrieval_data
from hir_evaluation.retrieval.registry import RetrievalContext
from hir_evaluation.tasks import RetrievalTask

TASK = RetrievalTask(entity_type="product", ks=(3, 5))


@pytest.fixture
def run(tiny_graph: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(tiny_graph, out / "graph")
    config = FunnelConfig(rank=4, discovery=10, popular=5, max_funnel=20,
                         scorer=ScorerConfig(hidden=[8], steps=20, batch=32, checks=2))
    write_funnel(out / "graph", out / "funnel", ["train", "val"], config, seed=0)
    return out


def test_lists_are_the_recommenders_with_each_history_removed(run: Path) -> None:
    snap = load_snapshot(run / "graph")
    data = retrieval_data(snap, TASK, "test", 0)
    ranked = Recommend(batch=2).topk(RetrievalContext(snap, TASK, data, 0), 5)
    assert ranked.full.shape == ranked.masked.shape == (len(data.users), 5)
    expected = Recommender(run / "funnel").recommend(data.users, 5)
    order = np.searchsorted(expected.users, data.users)
    np.testing.assert_array_equal(ranked.full, expected.ids[order])
    seen = data.seen
    for r, u in enumerate(data.users.tolist()):
        kept = [e for e in ranked.masked[r].tolist() if e >= 0]
        assert not any(seen[u, e] for e in kept), "the masked list holds a history entity"
        assert len(set(kept)) == len(kept)


def test_without_funnel_output_the_arm_is_empty_and_says_why(tiny_graph: Path) -> None:
    snap = load_snapshot(tiny_graph)
    data = retrieval_data(snap, TASK, "test", 0)
    ranked = Recommend().topk(RetrievalContext(snap, TASK, data, 0), 5)
    assert (ranked.full == -1).all() and "no funnel output" in ranked.fit["skipped"]


def test_deep_list_drops_only_target_stage_history(run: Path) -> None:
    snap = load_snapshot(run / "graph")
    data = retrieval_data(snap, TASK, "test", 0)
    ranked = Recommend().topk(RetrievalContext(snap, TASK, data, 0), 5)
    assert ranked.deep is not None
    for r, u in enumerate(data.users.tolist()):
        kept = [e for e in ranked.deep[r].tolist() if e >= 0]
        assert not any(data.seen_deep[u, e] for e in kept), "the deep list holds a converted entity"
        # only converted entities are dropped: the rest keep the full list's order
        full = [e for e in ranked.full[r].tolist() if e >= 0 and not data.seen_deep[u, e]]
        assert kept[: len(full)] == full[: len(kept)]
