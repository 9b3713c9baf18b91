"""The retrieval few-events slice (eval.retrieval_few_events): exactly the test users whose history,
the events every arm learns from, has at most that many events, under both protocols."""

from __future__ import annotations

from pathlib import Path

import pytest

from hir.data.snapshot import load_snapshot
from hir_evaluation.metrics import recall_ndcg_at_k
from hir_evaluation.retrieval.arms.popularity import Popularity, popularity_topk
from hir_evaluation.retrieval.data import retrieval_data
from hir_evaluation.retrieval.evaluate import MASKED, evaluate_retrieval
from hir_evaluation.tasks import RetrievalTask
from tests.evaluation.tiny import t, write_snapshot

# users 0-3; train = day 1-3, val = day 4, test = day 5 (tests/evaluation/tiny.py)
EVENTS = [
    # user 0: 2 train events
    (0, 0, "view", t(1)), (0, 0, "purchase", t(1, 1)),
    # user 1: 6 train events on only 2 pairs (the slice counts events, not pairs)
    (1, 3, "view", t(1, 2)), (1, 3, "cart", t(1, 3)), (1, 3, "purchase", t(1, 4)),
    (1, 4, "view", t(2)), (1, 4, "view", t(2, 1)), (1, 4, "purchase", t(2, 2)),
    # user 2: no event before the test period
    # user 3: 3 train events, 2 more in val
    (3, 1, "view", t(3)), (3, 1, "purchase", t(3, 1)), (3, 2, "view", t(3, 2)),
    (3, 2, "purchase", t(4)), (3, 0, "view", t(4, 1)),
    # test: one purchase per user, each new to its user; user 0 also re-buys product 0
    (0, 2, "purchase", t(5)), (0, 0, "purchase", t(5, 1)), (1, 5, "purchase", t(5, 2)),
    (2, 1, "purchase", t(5, 3)), (3, 4, "purchase", t(5, 4)),
]


@pytest.fixture
def snap(tmp_path: Path):
    return load_snapshot(write_snapshot(tmp_path, EVENTS))


@pytest.mark.parametrize(("history_splits", "max_events", "expected"), [
    (["train"], 3, [True, False, True, True]),  # user 3's 3 train events: at the bound
    (["train"], 2, [True, False, True, False]),
    (None, 3, [True, False, True, False]),  # history = train + val: user 3 has 5 events
    (None, 5, [True, False, True, True]),
    (None, 0, [False, False, True, False]),  # only the user without history
])
def test_few_events_selects_the_users_by_history_events(snap, history_splits, max_events, expected) -> None:
    data = retrieval_data(snap, RetrievalTask(), "test", history_splits=history_splits)
    assert data.users.tolist() == [0, 1, 2, 3]
    assert data.few_events(max_events).tolist() == expected


def test_few_events_slice_in_both_protocols(snap) -> None:
    task = RetrievalTask(ks=(1, 3))
    out = evaluate_retrieval(snap, task, {"popularity": Popularity()}, 0, history_splits=["train"], few_events=2)
    full, masked = out["slices"]["few_events"], out[MASKED]["slices"]["few_events"]
    # users 0 and 2 (2 and 0 train events); user 3 (3) and user 1 (6) are out
    assert full["users"] == 2 and masked["users"] == 2 and full["max_events"] == masked["max_events"] == 2
    data = retrieval_data(snap, task, "test", history_splits=["train"])
    ranked = popularity_topk(data, 3)
    # the slice is the protocol's own metric over exactly users 0 and 2
    keep = [0, 2]
    want_full = recall_ndcg_at_k(ranked.full[keep], [data.relevant[i] for i in keep], task.ks)
    want_masked = recall_ndcg_at_k(ranked.masked[keep], [data.new_to_user[i] for i in keep], task.ks)
    for metric in ("recall@1", "recall@3", "ndcg@3"):
        assert full["popularity"][metric] == pytest.approx(want_full[metric])
        assert masked["popularity"][metric] == pytest.approx(want_masked[metric])
    # user 0's re-bought product 0 is relevant in the full protocol only: the two relevance sets differ
    assert data.relevant[0] == {0, 2} and data.new_to_user[0] == {2}
    # without the setting there is no slice
    plain = evaluate_retrieval(snap, task, {"popularity": Popularity()}, 0, history_splits=["train"])
    assert "few_events" not in plain["slices"] and "few_events" not in plain[MASKED]["slices"]
