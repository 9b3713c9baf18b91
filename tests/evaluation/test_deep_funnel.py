"""The deep-funnel protocol (GHCF / EHCF / CRGCN): only the user's target-stage history is masked,
so a carted-not-bought item stays rankable; its repeat / explore slices partition the held-out
entities; HR@K; the per-user file; the cache keeps the deep list.

The hand-built snapshot (tests/evaluation/tiny.py's writer, other events), products 0-5:
- user 0: train views + purchases 0, carts 1 without buying; test purchases 1 (carted before:
  repeat) and 2 (new: explore).
- user 1: train purchases 3 and views 4; test purchases 5 (new: explore).
- user 2: train carts 4, purchases 3 and 0; test purchases 3 again (bought before: repeat, and
  masked by the protocol, so no arm can retrieve it).
- user 3: train views 1; no test purchase (not scored).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hir.data.snapshot import load_snapshot
from hir_evaluation.cache import FitCache
from hir_evaluation.metrics import hit_per_user, recall_ndcg_at_k, recall_per_user
from hir_evaluation.report.plots import repeat_explore_bars
from hir_evaluation.report.render import clean, markdown
from hir_evaluation.retrieval.arms.itemknn import ItemKNN, itemknn_topk
from hir_evaluation.retrieval.arms.popularity import Popularity, popularity_topk
from hir_evaluation.retrieval.arms.repeat import Repeat, repeat_topk
from hir_evaluation.retrieval.data import RetrievalData, retrieval_data
from hir_evaluation.retrieval.evaluate import DEEP, arm_key, evaluate_retrieval
from hir_evaluation.retrieval.rank import Ranked, score_arm
from hir_evaluation.tasks import RetrievalTask
from tests.evaluation.tiny import t, write_snapshot

EVENTS = [
    # train
    (0, 0, "view", t(1)), (0, 0, "purchase", t(1, 1)), (0, 1, "view", t(1, 2)), (0, 1, "cart", t(1, 3)),
    (1, 3, "purchase", t(2)), (1, 4, "view", t(2, 1)),
    (2, 4, "cart", t(2, 2)), (2, 3, "purchase", t(2, 3)), (2, 0, "purchase", t(2, 4)),
    (3, 1, "view", t(3)),
    # val
    (1, 3, "view", t(4)),
    # test
    (0, 1, "purchase", t(5)), (0, 2, "purchase", t(5, 1)), (1, 5, "purchase", t(5, 2)), (2, 3, "purchase", t(5, 3)),
]
K = 6


@pytest.fixture
def data(tmp_path: Path) -> RetrievalData:
    return retrieval_data(load_snapshot(write_snapshot(tmp_path, EVENTS)), RetrievalTask(ks=(1, 3)), "test")


def _row(m: np.ndarray, row: int) -> set[int]:
    return set(m[row][m[row] >= 0].tolist())


def test_carted_not_bought_is_rankable_under_deep_funnel_only(data: RetrievalData) -> None:
    assert data.users.tolist() == [0, 1, 2]
    assert data.relevant == [{1, 2}, {5}, {3}]
    assert data.new_to_user == [{2}, {5}, set()] and data.repeat == [{1}, set(), {3}]
    # the deep mask: past purchases only; the history mask: every stage
    assert [set(np.flatnonzero(r).tolist()) for r in data.seen_deep.toarray()] == [{0}, {3}, {0, 3}, set()]
    assert [set(np.flatnonzero(r).tolist()) for r in data.seen.toarray()] == [{0, 1}, {3, 4}, {0, 3, 4}, {1}]
    for ranked in (popularity_topk(data, K), itemknn_topk(data, K, neighbours=0)):
        assert ranked.deep is not None and ranked.masked is not None
        # user 0's carted product 1: in the deep list, never in the masked one; the bought 0 in neither
        assert 1 in _row(ranked.deep, 0) and 1 not in _row(ranked.masked, 0)
        assert 0 not in _row(ranked.deep, 0) | _row(ranked.masked, 0)
        for u in range(3):
            assert not _row(ranked.deep, u) & set(np.flatnonzero(data.seen_deep[data.users[u]].toarray()).tolist())
            assert not _row(ranked.masked, u) & set(np.flatnonzero(data.seen[data.users[u]].toarray()).tolist())
        scores = score_arm(ranked, data, (1, 3))
        # masked: user 0's only new item is 2; deep: both of user 0's purchases can be retrieved
        assert scores["masked_new_to_user"]["users"] == 2.0 and scores["deep_funnel"]["users"] == 3.0
    # repeat: the history without past purchases, most frequent first (carted 1: view + cart = 2 events)
    rep = repeat_topk(data, K)
    assert rep.masked is None and rep.deep is not None
    assert rep.deep[:, :2].tolist() == [[1, -1], [4, -1], [4, -1]]
    assert rep.full[0, :2].tolist() == [0, 1]  # 0: view + purchase, 1: view + cart; ties by id


def test_repeat_and_explore_split_every_hit_exactly(data: RetrievalData) -> None:
    for ranked in (popularity_topk(data, K), itemknn_topk(data, K, neighbours=0), repeat_topk(data, K)):
        for top in (ranked.full, ranked.deep):
            for k in (1, 3, K):
                hits = [recall_per_user(top, sets, k) * [len(s) for s in sets]
                        for sets in (data.relevant, data.repeat, data.new_to_user)]
                all_, rep, exp = (np.nan_to_num(h) for h in hits)
                assert np.array_equal(all_, rep + exp), (k, all_, rep, exp)
    for r, rep, new in zip(data.relevant, data.repeat, data.new_to_user, strict=True):
        assert rep | new == r and not rep & new


def test_slices_and_hit_ratio_on_a_hand_case() -> None:
    history = pl.DataFrame({"user_id": [0], "entity_id": [0], "n": [1.0]})
    data = RetrievalData(users=np.array([0, 1]), relevant=[{1, 2}, {4}], new_to_user=[{2}, {4}],
                         item_cold=[set(), set()], history=history, n_users=2, n_items=6)
    full = np.array([[0, 3, 1], [4, 0, 3]])
    deep = np.array([[1, 5, 2], [0, 3, 4]])
    out = score_arm(Ranked(full, None, deep=deep), data, (1, 3))
    assert data.repeat == [{1}, set()]
    # user 0: 1 of 2 at rank 1, both by rank 3; user 1: its one at rank 3
    assert out["deep_funnel"] == pytest.approx({"users": 2.0, "recall@1": 0.25, "hr@1": 0.5, "recall@3": 1.0,
                                                "hr@3": 1.0, "ndcg@1": 0.5,
                                                "ndcg@3": ((1 + 1 / 2) / (1 + 1 / np.log2(3)) + 1 / 2) / 2})
    assert out["deep_repeat"]["users"] == 1.0 and out["deep_repeat"]["recall@1"] == 1.0
    assert out["deep_explore"]["users"] == 2.0 and out["deep_explore"]["hr@1"] == 0.0
    assert out["deep_explore"]["recall@3"] == 1.0
    assert out["repeat"]["recall@3"] == 1.0 and out["new_to_user"]["recall@3"] == 0.5  # the full list's slices
    assert "hr@1" not in out["all"]  # HR only where asked for
    # HR counts a user once, however many of its items are hit; recall divides by the relevant count
    two = recall_ndcg_at_k(np.array([[7, 9, -1]]), [{7, 8}], (1, 3), hit_ratio=True)
    assert two["hr@1"] == 1.0 and two["recall@1"] == 0.5
    assert hit_per_user(np.array([[7, 9], [1, 2]]), [{9}, set()], 1).tolist()[0] == 0.0
    assert np.isnan(hit_per_user(np.array([[7, 9], [1, 2]]), [{9}, set()], 2)[1])
    assert out.keys() >= {"deep_funnel", "deep_repeat", "deep_explore"}
    assert "deep_funnel" not in score_arm(Ranked(full, None), data, (1, 3))  # no deep list: no deep keys


def test_evaluate_reports_the_protocol_its_slices_and_per_user_values(tmp_path: Path) -> None:
    snap = load_snapshot(write_snapshot(tmp_path, EVENTS))
    arms = {"popularity": Popularity(), "itemknn": ItemKNN(neighbours=0), "repeat": Repeat()}
    path = tmp_path / "users.parquet"
    ks = (1, 3, 10, 20)
    ret = clean(evaluate_retrieval(snap, RetrievalTask(ks=ks), arms, 0, per_user_path=path))
    deep = ret[DEEP]
    assert "purchase" in deep["protocol"] and deep["users"] == 3
    assert deep["slices"]["repeat"]["users"] == 2 and deep["slices"]["explore"]["users"] == 2
    # repeat: user 0's carted 1 first (hit), user 2's bought 3 is masked (miss), user 1 has only 4
    assert deep["repeat"]["hr@1"] == pytest.approx(1 / 3) and deep["slices"]["repeat"]["repeat"]["recall@1"] == 0.5
    assert deep["slices"]["explore"]["repeat"]["recall@3"] == 0.0
    assert set(deep["best"]) == {f"{m}@{k}" for m in ("recall", "ndcg", "hr") for k in ks}
    # popularity (0, 1, 3 tie at 3 events, then 4): user 0's deep list starts with the carted 1
    assert deep["popularity"]["hr@1"] == pytest.approx(1 / 3) and deep["best"]["hr@1"] == "popularity"
    assert ret["slices"]["repeat"]["users"] == 2 and ret["slices"]["repeat"]["repeat"]["recall@3"] == 1.0
    users = pl.read_parquet(path)
    assert users["user_id"].to_list() == [0, 1, 2]
    assert users["n_repeat"].to_list() == [1, 0, 1] and users["n_explore"].to_list() == [1, 1, 0]
    assert users["repeat_share"].to_list() == [0.5, 0.0, 1.0]
    assert users["repeat__deep_hr@10"].to_list() == [1.0, 0.0, 0.0]
    assert users["repeat__deep@20"].to_list() == [0.5, 0.0, 0.0]
    assert {f"{a}__deep{s}@{k}" for a in arms for s, k in (("", 10), ("", 20), ("_hr", 20), ("_repeat", 20),
                                                          ("_explore", 20))} <= set(users.columns)
    assert users["repeat__deep_repeat@20"][0] == 1.0 and np.isnan(users["repeat__deep_repeat@20"][1])
    assert users["repeat__deep_repeat@20"][2] == 0.0  # user 2's bought 3 is masked
    # the per-user values average to the reported ones
    assert np.nanmean(users["itemknn__deep@20"].to_numpy()) == pytest.approx(deep["itemknn"]["recall@20"])
    assert "repeat" not in users.columns  # no masked list, no masked column
    md = markdown({"dataset": "tiny", "retrieval": ret, "ranking": {}, "diagnostics": {}, "sources": {}}, {})
    assert "### Retrieval, deep funnel" in md and "| arm | all recall@20 | repeat recall@20 |" in md
    assert "deep/repeat" in md and "deep/explore" in md
    assert repeat_explore_bars(ret).startswith(b"\x89PNG")


def test_the_cache_keeps_the_deep_list_and_keys_on_the_target_stage(data: RetrievalData, tmp_path: Path) -> None:
    ranked = popularity_topk(data, K)
    task = RetrievalTask(ks=(1, 3))
    key = arm_key("popularity", Popularity(), K, 0, task, data, None, None)
    cache = FitCache(tmp_path, "ef" * 32)
    cache.put("retrieval", "popularity", key, ranked)
    back = cache.get("retrieval", "popularity", key)
    assert back.deep is not None and np.array_equal(back.deep, ranked.deep)
    assert np.array_equal(back.masked, ranked.masked) and np.array_equal(back.full, ranked.full)
    # another target stage's mask is another deep list: never served from this entry
    other = RetrievalData(users=data.users, relevant=data.relevant, new_to_user=data.new_to_user,
                          item_cold=data.item_cold, history=data.history, n_users=data.n_users,
                          n_items=data.n_items, deep_history=data.history)
    assert arm_key("popularity", Popularity(), K, 0, task, other, None, None) != key
