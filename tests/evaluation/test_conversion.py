"""The conversion task (beibei's deep-funnel question): of the entities a user carted before the
test period and never bought, which does the user buy in it? Rows, labels, and that no feature
an arm reads can see a label."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from hir.data.snapshot import load_snapshot
from hir_evaluation.ranking.features import baseline_inputs
from hir_evaluation.sources.hir import from_files
from hir_evaluation.tasks import RankingTask, build_candidates
from tests.evaluation.fixtures import write_export
from tests.evaluation.tiny import TEST_START, t, write_snapshot

TASK = RankingTask(kind="conversion", candidate_stages=("cart",), label_stage="purchase", crossfit=True)

# (user, product, stage, time); train = day 1-3, val = day 4, test = day 5 (tests/evaluation/tiny.py)
HISTORY = [
    (0, 0, "cart", t(1)), (0, 0, "purchase", t(1, 1)),   # bought before the test: no row
    (0, 1, "view", t(1, 2)), (0, 1, "cart", t(2)),       # carted, not bought: a row
    (1, 2, "cart", t(2, 1)),                              # a row
    (1, 3, "view", t(2, 2)), (1, 3, "cart", t(3)),       # a row
    (2, 4, "view", t(2, 3)),                              # viewed only: never a candidate
    (3, 1, "cart", t(3, 1)), (3, 1, "purchase", t(4)),   # bought in val, before the test: no row
    (2, 2, "cart", t(4, 2)),                              # carted in val: a row
    (3, 3, "view", t(4, 3)),
]
# the test period: the labels. (0, 1) is bought at the very first instant of the test period, so
# a feature that read events "at or before" the row's time would see it
BUYS_A = [(0, 1, "purchase", TEST_START), (1, 3, "purchase", t(5, 2)), (2, 4, "purchase", t(5, 3)),
          (1, 2, "cart", t(5, 4)), (3, 3, "view", t(5, 5))]
# the same history, other buys: every row's label changes but (1, 3)'s
BUYS_B = [(1, 2, "purchase", TEST_START), (2, 2, "purchase", t(5, 1)), (1, 3, "purchase", t(5, 2)),
          (0, 1, "view", t(5, 4)), (3, 3, "view", t(5, 5))]


def _labels(rows: pl.DataFrame) -> dict[tuple[int, int], int]:
    return {(u, e): int(y) for u, e, y in rows.select("user_id", "entity_id", "label").iter_rows()}


def test_rows_are_carted_unbought_pairs_labelled_by_a_test_buy(tmp_path: Path) -> None:
    snap = load_snapshot(write_snapshot(tmp_path, HISTORY + BUYS_A))
    rows = build_candidates(TASK, snap, "test")
    assert _labels(rows) == {(0, 1): 1, (1, 2): 0, (1, 3): 1, (2, 2): 0}
    assert set(rows["ts"].to_list()) == {snap.test_start}  # every row at the period start
    assert set(rows["stage"].to_list()) == {"cart"}
    # nothing precedes the train period, so it has no rows; val's rows are train carts bought in val
    assert build_candidates(TASK, snap, "train").height == 0
    assert _labels(build_candidates(TASK, snap, "val")) == {(0, 1): 0, (1, 2): 0, (1, 3): 0, (3, 1): 1}


def test_no_feature_sees_a_label(tmp_path: Path) -> None:
    """Two snapshots with one history and different test buys: the rows are the same, their labels
    differ, and every feature the arms read (the baseline's counts, recency, price and ids, the
    HIR vectors and tokens of an export that saw train + val) is identical, bit for bit."""
    built = {}
    for name, buys in (("a", BUYS_A), ("b", BUYS_B)):
        root = tmp_path / name
        graph = write_snapshot(root, HISTORY + buys)
        snap = load_snapshot(graph)
        write_export(graph, root / "embeddings", event_timestamp=snap.test_start)
        rows = build_candidates(TASK, snap, "test")
        base = baseline_inputs(snap, rows, "product", "purchase")
        user, entity = from_files(root / "embeddings", snap, rows, "product")
        built[name] = (rows, base, user, entity)
    (rows_a, base_a, user_a, entity_a), (rows_b, base_b, user_b, entity_b) = built["a"], built["b"]
    assert rows_a.select("user_id", "entity_id", "ts").equals(rows_b.select("user_id", "entity_id", "ts"))
    assert (rows_a["label"] != rows_b["label"]).sum() == 3
    assert base_a.dense_names == base_b.dense_names
    assert np.array_equal(base_a.dense, base_b.dense) and np.array_equal(base_a.sparse, base_b.sparse)
    for a, b in ((user_a, user_b), (entity_a, entity_b)):
        assert a.present.all()  # the export is stamped at the period start: every row gets it
        assert np.array_equal(a.vectors, b.vectors)
        assert all(np.array_equal(x.ids, y.ids) and np.array_equal(x.weights, y.weights)
                   for x, y in zip(a.tokens, b.tokens))
    # and the baseline does read the history: the pair's own cart is counted
    pair_n = base_a.dense[:, base_a.dense_names.index("pair_n")]
    assert (np.expm1(pair_n) >= 1 - 1e-6).all()
