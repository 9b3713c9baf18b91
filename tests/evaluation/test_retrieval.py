"""Retrieval baselines against brute force, LightGCN against PyG's own propagation, held-out sets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from torch_geometric.nn import LightGCN as PygLightGCN

from hir.data.snapshot import load_snapshot
from hir_evaluation.retrieval.arms.itemknn import item_neighbours, itemknn_topk
from hir_evaluation.retrieval.arms.lightgcn import fit_lightgcn, propagate, propagation_graph
from hir_evaluation.retrieval.arms.popularity import popularity_topk
from hir_evaluation.retrieval.arms.repeat import repeat_topk
from hir_evaluation.retrieval.data import RetrievalData, interaction_matrix, retrieval_data
from hir_evaluation.retrieval.rank import inner_product_scores, rank_dense
from hir_evaluation.tasks import RetrievalTask
from tests.evaluation.fixtures import shipped_arm


def _data(history: pl.DataFrame, n_users: int, n_items: int, relevant: list[set[int]] | None = None) -> RetrievalData:
    rel = relevant or [set() for _ in range(n_users)]
    return RetrievalData(users=np.arange(n_users), relevant=rel, new_to_user=rel, item_cold=rel,
                         history=history, n_users=n_users, n_items=n_items)


def _random_history(seed: int, n_users: int = 30, n_items: int = 40, n: int = 250) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    return pl.DataFrame({"user_id": rng.integers(0, n_users, n), "entity_id": rng.integers(0, n_items, n)}).group_by(
        "user_id", "entity_id").agg(pl.len().cast(pl.Float64).alias("n"))


def _brute_scores(history: pl.DataFrame, n_users: int, n_items: int, k: int | None) -> np.ndarray:
    x = interaction_matrix(history, n_users, n_items).toarray().astype(np.float64)
    deg = x.sum(0)
    cos = (x.T @ x) / np.sqrt(np.outer(np.maximum(deg, 1), np.maximum(deg, 1)))
    if k is not None:  # keep each item's k most similar items
        for i in range(n_items):
            if (cos[i] > 0).sum() > k:
                cos[i, np.argsort(-cos[i])[k:]] = 0
    scores = x @ cos
    scores[:, deg == 0] = -np.inf
    return scores


@pytest.mark.parametrize("neighbours", [0, 40])
def test_itemknn_matches_brute_force(neighbours: int) -> None:
    # 40 neighbours = every item: the pruned path must then equal the full neighbourhood
    history = _random_history(0)
    top = itemknn_topk(_data(history, 30, 40), 5, neighbours=neighbours).full
    brute = _brute_scores(history, 30, 40, None)
    for u in range(30):
        # compare scores, not ids: ties may be broken either way
        assert np.allclose(np.sort(brute[u, top[u]])[::-1], np.sort(brute[u])[::-1][:5], atol=1e-5)


def test_item_neighbours_keep_the_k_most_similar() -> None:
    history = _random_history(1)
    x = interaction_matrix(history, 30, 40)
    sim = item_neighbours(x, 3, chunk=7).toarray()
    dense = x.toarray().astype(np.float64)
    deg = dense.sum(0)
    cos = (dense.T @ dense) / np.sqrt(np.outer(np.maximum(deg, 1), np.maximum(deg, 1)))
    for i in range(40):
        kept = np.sort(sim[i][sim[i] > 0])[::-1]
        assert len(kept) == min(3, (cos[i] > 0).sum())
        assert np.allclose(kept, np.sort(cos[i])[::-1][: len(kept)], atol=1e-6)  # ties: values, not ids


def test_popularity_and_repeat() -> None:
    history = pl.DataFrame({"user_id": [0, 0, 1, 1, 2], "entity_id": [3, 1, 3, 2, 3], "n": [1.0, 5.0, 1.0, 1.0, 2.0]})
    data = _data(history, 4, 5)
    pop = popularity_topk(data, 3)
    assert pop.full[0].tolist() == [1, 3, 2]  # by event count: 5, 4, 1
    # masked: the most popular entities the user has not had (entity 0 and 4 have no history)
    assert pop.masked.tolist() == [[2, -1, -1], [1, -1, -1], [1, 2, -1], [1, 3, 2]]
    rep = repeat_topk(data, 2)
    assert rep.full[0].tolist() == [1, 3] and rep.full[2].tolist() == [3, -1] and rep.full[3].tolist() == [-1, -1]
    assert rep.masked is None  # every entity it ranks is masked


def test_inner_product_ranking_masks_items_and_history() -> None:
    users = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    items = np.array([[1, 0], [0.9, 0.1], [0, 1]], dtype=np.float32)
    seen = interaction_matrix(pl.DataFrame({"user_id": [0], "entity_id": [0]}), 2, 3)
    ranked = rank_dense(inner_product_scores(users, items), np.array([0, 1]), 2, seen)
    assert ranked.full.tolist() == [[0, 1], [2, 1]] and ranked.masked.tolist() == [[1, 2], [2, 1]]
    ranked = rank_dense(inner_product_scores(users, items, np.array([False, True, True])), np.array([0]), 2, None)
    assert ranked.full.tolist() == [[1, 2]] and ranked.masked is None


def test_propagation_equals_pyg_lightgcn() -> None:
    # users 0-3, items 0-3 (nodes 4-7); user 3 and item 3 have no edge (left out of the sparse products)
    u, i = np.array([0, 0, 1, 2, 2]), np.array([0, 1, 1, 2, 0])
    graph = propagation_graph(u, i, 4)
    assert graph.nodes.tolist() == [0, 1, 2, 4, 5, 6]
    model = PygLightGCN(8, 4, 2, normalize=False)
    reference = PygLightGCN(8, 4, 2)  # PyG's own gcn_norm over an edge index
    reference.load_state_dict(model.state_dict())
    edge_index = torch.tensor(np.stack([np.concatenate([u, i + 4]), np.concatenate([i + 4, u])]))
    assert torch.allclose(propagate(model, graph), reference.get_embedding(edge_index), atol=1e-6)
    # and the custom backward is the true gradient (A symmetric): d/dE sum(α0 E + α1 A E) = α0 + α1 Aᵀ 1
    model1 = PygLightGCN(8, 4, 1, normalize=False)
    propagate(model1, graph).sum().backward()
    dense = torch.zeros(8, 8)
    dense[graph.nodes[:, None], graph.nodes[None, :]] = graph.adj.to_dense()
    expected = 0.5 * torch.ones(8, 4) + 0.5 * dense.T @ torch.ones(8, 4)
    assert torch.allclose(model1.embedding.weight.grad, expected, atol=1e-6)


def test_lightgcn_learns_planted_communities() -> None:
    # two communities: users 0-19 buy items 0-19, users 20-39 buy items 20-39
    rng = np.random.default_rng(0)
    users = rng.integers(0, 40, 600)
    items = rng.integers(0, 20, 600) + 20 * (users >= 20)
    history = pl.DataFrame({"user_id": users, "entity_id": items}).unique().with_columns(pl.lit(1.0).alias("n"))
    held = [set(range(20)) if u < 20 else set(range(20, 40)) for u in range(40)]
    data = _data(history, 40, 40, held)
    cfg = shipped_arm("retrieval", "lightgcn", dim=8, layers=2, lr=0.05, batch_size=256, steps_per_epoch=10,
                      max_epochs=5, patience=5, max_seconds=30)
    res = fit_lightgcn(data, data, data, 10, cfg, seed=0)
    same = np.mean([np.mean([(t < 20) == (u < 20) for t in res.ranked.full[u]]) for u in range(40)])
    assert same > 0.9
    # masked: the user's own community entities they have not bought yet come first
    bought = history.group_by("user_id").agg("entity_id").sort("user_id")["entity_id"].to_list()
    unbought = [held[u] - set(bought[u]) for u in range(40)]
    found = np.mean([len(unbought[u] & set(res.ranked.masked[u].tolist())) / min(10, len(unbought[u]))
                     for u in range(40)])
    assert found > 0.9
    assert not any(set(bought[u]) & set(res.ranked.masked[u].tolist()) for u in range(40))
    assert res.best_val_recall > 0.4
    # the curve has one entry per epoch; the selected epoch is the best masked val recall on it
    assert [c["epoch"] for c in res.curve] == list(range(1, res.epochs + 1))
    best = max(res.curve, key=lambda c: c["val_recall@20"])
    assert res.best_epoch == best["epoch"] and res.best_val_recall == best["val_recall@20"]
    assert res.stopped_by in ("patience", "max_epochs") and res.stopped_by_budget == (res.stopped_by != "patience")


def test_retrieval_data_slices(tiny_graph: Path) -> None:
    snap = load_snapshot(tiny_graph)
    data = retrieval_data(snap, RetrievalTask(), "test")
    # test purchases: (0, 2) and (1, 3); product 3 was user 1's before, product 2 is new to user 0
    assert data.users.tolist() == [0, 1]
    assert data.relevant == [{2}, {3}]
    assert data.new_to_user == [{2}, set()]
    assert data.item_cold == [set(), set()]  # product 5 (cold) is only viewed
    assert set(data.history["user_id"].to_list()) == {0, 1, 2, 3}


def test_lightgcn_stops_where_its_curve_turns_over() -> None:
    """The completejourney curve of 2026-12-02 (masked val recall@20 per check): best at check 6;
    patience alone runs to check 11, the decline rule stops at check 9 with the same best check;
    a flat, noisy stretch (dips under 4%) waits the full patience."""
    from hir_evaluation.retrieval.arms.lightgcn import LightGCN, plateau_stop

    cfg = LightGCN(dim=8, layers=1, lr=0.01, lambda_reg=0.0, init_std=0.1, batch_size=8, steps_per_epoch=1,
                   max_epochs=40, patience=5, min_epochs=5, max_seconds=30, threads=1, decline=0.04, decline_checks=2)
    curve = [0.0240, 0.0242, 0.0238, 0.0246, 0.0254, 0.0267, 0.0262, 0.0250, 0.0253, 0.0246, 0.0237]

    def stop_at(recalls: list[float], c: LightGCN) -> tuple[int, str] | None:
        for n in range(1, len(recalls) + 1):
            seen = recalls[:n]
            bad = n - 1 - max(range(n), key=lambda i: (seen[i], -i))
            if n >= c.min_epochs and (why := plateau_stop(seen, bad, c)):
                return n, why
        return None

    assert stop_at(curve, cfg) == (9, "decline")
    assert stop_at(curve, LightGCN(**{**cfg.__dict__, "decline": 0.0})) == (11, "patience")
    flat = [0.050, 0.052, 0.053, 0.051, 0.0515, 0.052, 0.0512, 0.0518, 0.0525, 0.0529]  # never 4% under 0.053
    assert stop_at(flat, cfg) == (8, "patience")
