"""The model learns: on small synthetic data with a planted interest hierarchy, the exported
embeddings retrieve the held-out purchases new to each user far better than popularity does
(each user's train purchases masked from every ranking). A quality assertion, not a timing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from hir.data.snapshot import load_snapshot
from hir.export.stage import run as export
from hir.train.stage import run as train
from hir_evaluation.metrics import recall_ndcg_at_k
from hir_evaluation.retrieval.data import interaction_matrix, retrieval_data
from hir_evaluation.tasks import RetrievalTask
from tests.train.fixtures import compose, single_thread, write_content

# enough purchases that the val and test periods hold purchases new to their users
SMALL_DATA = [
    "data=synthetic", "data.adapter.n_users=400", "data.adapter.n_products=300", "data.adapter.n_events=30000",
    "data.adapter.n_advertisers=12", "data.adapter.n_campaigns=20", "data.adapter.n_coarse=4", "data.adapter.n_fine=3",
    "data.adapter.conversion={view: 0.6, click: 0.5, cart: 0.6, purchase: 0.8}",
]
SMALL_MODEL = [
    "spectral.ranks=[8,16,32]", "model.net.width=16", "model.net.depth=1", "model.net.heads=2",
    "model.net.hierarchy.levels=[4,8,16]", "model.net.hierarchy.top_k=2", "datamodule.batch_size=64", "datamodule.task.users=64",
    "datamodule.seeds_per_epoch=640", "datamodule.embed_batch_size=512", "datamodule.val_candidates=null",
    "model.objective.init_nodes=512", "export.batch_size=512", "trainer.max_epochs=3",
    "trainer.enable_progress_bar=false",
]


def _masked_recall(top_scores: np.ndarray, history, users: np.ndarray, relevant: list[set[int]]) -> float:
    scores = torch.from_numpy(np.ascontiguousarray(top_scores, np.float32))
    h = history[users].tocoo()
    scores[h.row, h.col] = -torch.inf
    top = torch.topk(scores, 20, dim=1).indices.numpy()
    return recall_ndcg_at_k(top, relevant, (20,))["recall@20"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hir.data.prepare import run as prepare

    out = tmp_path_factory.mktemp("learns")
    prepare(compose(out, *SMALL_DATA, stage="prepare"))
    write_content(out / "graph", out / "content")
    with single_thread():
        train(compose(out, *SMALL_DATA, *SMALL_MODEL))
        export(compose(out, *SMALL_DATA, *SMALL_MODEL, stage="export"))
    return out


def test_hir_beats_popularity_on_new_to_user_purchases_by_a_clear_margin(run_dir: Path):
    snap = load_snapshot(run_dir / "graph")
    task = RetrievalTask(entity_type="product", target_stage="purchase", history_stages=("purchase",))
    data = retrieval_data(snap, task, "test", 0, ["train"])
    assert sum(1 for s in data.new_to_user if s) >= 30  # enough users for the comparison to mean something
    history = interaction_matrix(data.history, data.n_users, data.n_items).tocsr()

    def vectors(etype: str, n: int) -> np.ndarray:
        f = pl.read_parquet(run_dir / "embeddings" / f"{etype}.parquet", columns=["node_id", "embedding"])
        out = np.zeros((n, len(f["embedding"][0])), np.float32)
        out[f["node_id"].to_numpy()] = f["embedding"].list.to_array(out.shape[1]).to_numpy()
        return out

    users, items = vectors("user", data.n_users), vectors("product", data.n_items)
    hir = _masked_recall(users[data.users] @ items.T, history, data.users, data.new_to_user)
    pop = np.asarray(history.sum(0)).ravel()
    popularity = _masked_recall(np.tile(pop, (len(data.users), 1)), history, data.users, data.new_to_user)
    print(f"masked new-to-user recall@20: hir {hir:.4f}, popularity {popularity:.4f}")
    assert hir > 1.5 * popularity and hir > popularity + 0.05, (hir, popularity)
