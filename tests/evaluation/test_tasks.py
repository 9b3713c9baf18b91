"""Ranking candidates and labels on the hand-built snapshot (tests/evaluation/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hir.data.snapshot import load_snapshot
from hir.errors import HirError
from hir_evaluation.ranking.features import baseline_inputs, prior_stats
from hir_evaluation.tasks import RankingTask, build_candidates


def _labels(rows: pl.DataFrame) -> dict[tuple[int, int], int]:
    return {(u, e): int(y) for u, e, y in rows.select("user_id", "entity_id", "label").iter_rows()}


def test_funnel_labels_per_period(tiny_graph: Path) -> None:
    snap = load_snapshot(tiny_graph)
    task = RankingTask(candidate_stages=("view",))
    train = build_candidates(task, snap, "train")
    assert _labels(train) == {(0, 0): 1, (0, 1): 0, (1, 0): 0, (1, 3): 1, (2, 3): 0, (2, 4): 1, (3, 1): 0}
    # the deepest pre-label stage is a slice, not a feature: (2, 4) went through the cart
    assert train.filter((pl.col("user_id") == 2) & (pl.col("entity_id") == 4))["stage"].item() == "cart"
    # (0, 1) is viewed in train but bought in val: the label never crosses a period
    assert _labels(build_candidates(task, snap, "val")) == {(0, 1): 1, (1, 4): 0, (3, 2): 1}
    test = build_candidates(task, snap, "test")
    assert _labels(test) == {(0, 2): 1, (1, 5): 0, (1, 3): 1, (2, 0): 0, (3, 4): 0}
    assert test.filter(pl.col("cold_entity"))["entity_id"].to_list() == [5]


def test_capped_candidates_do_not_depend_on_row_order(tiny_graph: Path, monkeypatch) -> None:
    import hir_evaluation.tasks as tasks

    snap = load_snapshot(tiny_graph)
    task = RankingTask(candidate_stages=("view",))
    full = tasks._funnel(task, snap, snap.events.filter(pl.col("entity_type") == "product"), *tasks.period_bounds(snap, "train"))
    capped = RankingTask(candidate_stages=("view",), max_rows=full.height - 3)
    runs = []
    for order_seed in (1, 2, 3):
        # the same rows in another order, as an unordered group-by may return them
        monkeypatch.setattr(tasks, "_funnel", lambda *a, s=order_seed, **k: full.sample(fraction=1.0, shuffle=True, seed=s))
        runs.append(build_candidates(capped, snap, "train", seed=0))
    assert runs[0].height == full.height - 3
    assert runs[0].equals(runs[1]) and runs[0].equals(runs[2])


def test_funnel_window_limits_the_label_horizon(tiny_graph: Path) -> None:
    snap = load_snapshot(tiny_graph)
    hour = build_candidates(RankingTask(candidate_stages=("view",), window="30m"), snap, "train")
    # every train purchase follows its view by >= 1 hour
    assert hour["label"].sum() == 0
    day = build_candidates(RankingTask(candidate_stages=("view",), window="1d"), snap, "train")
    assert day["label"].sum() == 3


def test_next_period_candidates(tiny_graph: Path) -> None:
    snap = load_snapshot(tiny_graph)
    task = RankingTask(kind="next_period", history_items=10, popular_items=1, negatives=0)
    rows = build_candidates(task, snap, "test")
    # buyers in test with history: users 0 and 1; past products + the most bought product (0)
    assert sorted(set(rows["user_id"].to_list())) == [0, 1]
    assert _labels(rows) == {(0, 0): 0, (0, 1): 0, (1, 0): 0, (1, 3): 1, (1, 4): 0}
    assert set(rows["ts"].to_list()) == {snap.test_start}
    assert rows.filter(pl.col("entity_id") == 3)["stage"].item() == "purchase"  # its prior depth


def test_task_errors_name_the_fix(tiny_graph: Path) -> None:
    snap = load_snapshot(tiny_graph)
    with pytest.raises(HirError, match="label_stage='click'"):
        build_candidates(RankingTask(label_stage="click"), snap, "test")
    with pytest.raises(HirError, match="shallower than the label stage"):
        build_candidates(RankingTask(candidate_stages=("purchase",)), snap, "test")
    with pytest.raises(HirError, match="expected one of"):
        RankingTask(kind="pairs")


def test_prior_stats_use_only_strictly_earlier_events(tiny_graph: Path) -> None:
    snap = load_snapshot(tiny_graph)
    rows = build_candidates(RankingTask(candidate_stages=("view",)), snap, "test")
    x = baseline_inputs(snap, rows, "product", "purchase")
    i = rows.with_row_index().filter((pl.col("user_id") == 1) & (pl.col("entity_id") == 3))["index"].item()
    feats = dict(zip(x.dense_names, np.expm1(x.dense[i])))
    # user 1 before its test view of product 3 (at day 5 03:00): 5 events, the view itself excluded
    assert feats["user_n"] == pytest.approx(5)
    assert feats["pair_n"] == pytest.approx(2) and feats["pair_deep_n"] == pytest.approx(1)
    assert feats["pair_deep_age_h"] == pytest.approx(3 * 24 + 2)  # last purchase day 2 01:00
    assert feats["log_price"] == pytest.approx(0.9)  # attr_price of p3
    # ids: 0 is kept for unknown; the category root is "food" for every product
    assert x.sparse[:, x.sparse_names.index("category_root")].tolist() == [1] * rows.height


def test_prior_stats_ties_and_absence() -> None:
    ts = pl.Datetime("us", "UTC")
    events = pl.DataFrame({"k": [1, 1, 1, 2], "timestamp": [10, 10, 20, 5]}).with_columns(
        (pl.col("timestamp") * 3_600_000_000).cast(ts))
    rows = pl.DataFrame({"_row": [0, 1, 2, 3], "k": [1, 1, 1, 3], "ts": [10, 11, 25, 30]}).with_columns(
        (pl.col("ts") * 3_600_000_000).cast(ts)).with_columns(pl.col("_row").cast(pl.UInt32))
    out = prior_stats(events, rows, ["k"], "x").sort("_row")
    assert out["x_n"].to_list() == [0, 2, 3, 0]  # two events at hour 10 count together, after 10 only
    assert out["x_age_h"].to_list()[1:3] == [1.0, 5.0]


def test_next_period_windows_skip_periods_without_history(tiny_graph: Path) -> None:
    from tests.evaluation.tiny import t

    snap = load_snapshot(tiny_graph)
    task = RankingTask(kind="next_period", window="1d", history_items=10, popular_items=1, negatives=0)
    rows = build_candidates(task, snap, "train")
    # day 1 has no history; on day 2 only user 1 buys and was seen before; day 3 has no purchase
    assert set(rows["ts"].to_list()) == {t(2)}
    assert rows["user_id"].unique().to_list() == [1]
    with pytest.raises(HirError, match="nothing to rank"):
        build_candidates(RankingTask(kind="next_period"), snap, "train")


def test_affinity_is_the_cosine_and_zero_where_a_side_is_missing() -> None:
    from hir_evaluation.ranking.features import affinity

    u = np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 0.0]], np.float32)
    e = np.array([[1.0, 1.0], [0.0, -3.0], [1.0, 0.0]], np.float32)
    np.testing.assert_allclose(affinity(u, e), [np.sqrt(0.5), 0.0, 0.0], rtol=1e-6)
    assert affinity(u, e).dtype == np.float32


def test_next_period_candidates_are_reproducible(tiny_graph: Path) -> None:
    snap = load_snapshot(tiny_graph)
    task = RankingTask(kind="next_period", negatives=3, history_items=1)
    runs = [build_candidates(task, snap, "test", seed=5) for _ in range(4)]
    assert runs[0].height > 0
    assert all(runs[0].equals(r) for r in runs[1:])
