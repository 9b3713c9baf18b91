"""The open-funnel source: its columns on a hand-built log, and that nothing after ``asof`` (or
after a training view's cut) reaches any feature the scorer reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pytest

from hir.funnel.affinity import COLUMNS as AFFINITY
from hir.funnel.candidates import CYCLE_FEATURES, FEATURES, NEIGHBOUR_FEATURES
from hir.funnel.fit import FunnelConfig, fit_period, training_views, view_candidates, view_sets
from hir.funnel.scorer import ScorerConfig
from hir.funnel.source import open_funnel, plain_order, visible_events

T0 = datetime(2024, 1, 1, tzinfo=UTC)
# stages: 0 view, 1 cart, 2 purchase (target)


def events(rows: list[tuple[int, int, int, float]]) -> pl.DataFrame:
    """(user, entity, stage_rank, day) rows -> snapshot event rows."""
    return pl.DataFrame({
        "user_id": [r[0] for r in rows], "entity_id": [r[1] for r in rows], "entity_type": ["product"] * len(rows),
        "stage_rank": [r[2] for r in rows], "timestamp": [T0 + timedelta(days=r[3]) for r in rows],
        "split": ["train"] * len(rows),
    }).with_columns(pl.col("timestamp").cast(pl.Datetime("us", "UTC")))


LOG = events([
    (0, 10, 0, 1), (0, 10, 1, 2), (0, 10, 1, 3),   # user 0 carted 10 twice, never bought
    (0, 11, 2, 1), (0, 11, 2, 5),                   # ... bought 11 twice
    (1, 10, 2, 4),                                  # user 1 bought 10
    (1, 12, 0, 6),                                  # ... viewed 12
])


def test_columns_on_a_hand_built_log() -> None:
    out = open_funnel(LOG.lazy(), target_rank=2, asof=T0 + timedelta(days=10)).collect()
    row = {(r["user_id"], r["entity_id"]): r for r in out.to_dicts()}
    carted = row[(0, 10)]
    assert (carted["deepest"], carted["gap"], carted["converted"]) == (1, 1, False)
    assert (carted["n_events"], carted["n_deepest"], carted["n_target"]) == (3, 2, 0)
    assert carted["age_days"] == pytest.approx(7.0) and carted["target_age_days"] is None
    bought = row[(0, 11)]
    assert (bought["gap"], bought["converted"], bought["n_target"]) == (0, True, 2)
    assert bought["target_age_days"] == pytest.approx(5.0)
    assert (bought["user_events"], bought["user_entities"]) == (5, 2)
    assert bought["user_last_days"] == pytest.approx(5.0)
    # entity 10: two users, one bought it once
    assert (carted["entity_users"], carted["entity_buyers"], carted["entity_conversion"]) == (2, 1, 0.5)
    assert bought["entity_repeat"] == 1.0 and carted["entity_repeat"] == 0.0


def test_plain_order_puts_deepest_then_most_then_recent_first() -> None:
    out = plain_order(open_funnel(LOG.lazy(), 2, T0 + timedelta(days=10)).collect(), include_converted=True)
    user0 = out.filter(pl.col("user_id") == 0)["entity_id"].to_list()
    assert user0 == [11, 10]
    open_only = plain_order(open_funnel(LOG.lazy(), 2, T0 + timedelta(days=10)).collect(), include_converted=False)
    assert open_only.filter(pl.col("user_id") == 0)["entity_id"].to_list() == [10]


def test_events_after_asof_change_nothing() -> None:
    asof = T0 + timedelta(days=4, hours=12)
    later = pl.concat([LOG, events([(0, 10, 2, 5), (1, 12, 2, 7), (2, 13, 1, 8)])])
    a = open_funnel(visible_events(LOG.lazy(), "product", asof), 2, asof).collect()
    b = open_funnel(visible_events(later.lazy(), "product", asof), 2, asof).collect()
    assert a.equals(b)


def _random_log(seed: int, users: int = 60, entities: int = 40, n: int = 1500, days: int = 60) -> pl.DataFrame:
    gen = np.random.default_rng(seed)
    return events(list(zip(gen.integers(0, users, n).tolist(), gen.integers(0, entities, n).tolist(),
                           gen.integers(0, 3, n).tolist(), gen.uniform(0, days, n).tolist(), strict=True)))


def test_next_period_view_reads_nothing_after_its_cut() -> None:
    """The leak test: every input of a view's candidates is identical whether or not the log
    holds any event after the cut (only the labels differ)."""
    log = _random_log(0)
    config = FunnelConfig(cuts=2, rank=8, discovery=10, popular=5, neighbours=5)
    val_start, test_start = T0 + timedelta(days=40), T0 + timedelta(days=50)
    views = training_views(log, 2, "next_period", val_start, test_start, config, seed=0)
    assert len(views) == 2
    for view, asof, targets in views:
        assert view["timestamp"].max() <= asof
        cut = asof + timedelta(microseconds=1)
        assert targets.height > 0
        truncated = log.filter(pl.col("timestamp") < cut)
        users = np.unique(targets["user_id"].to_numpy())
        a = view_candidates(view, users, asof, 2, 60, 40, config, 0, targets)
        b = view_candidates(truncated, users, asof, 2, 60, 40, config, 0, targets)
        np.testing.assert_array_equal(a.x, b.x)
        np.testing.assert_array_equal(a.y, b.y)
        # the affinity to the user's other items, the repurchase cycles and the neighbours' shares
        # are among the inputs compared (not switched off)
        assert np.abs(a.rows.select(AFFINITY).to_numpy()).sum() > 0
        assert a.rows["cycle_median"].drop_nulls().len() > 0
        assert np.abs(a.x[:, [list(FEATURES).index(n) for n in CYCLE_FEATURES]]).sum() > 0
        assert np.abs(a.x[:, [list(FEATURES).index(n) for n in NEIGHBOUR_FEATURES]]).sum() > 0


def test_the_period_check_keeps_the_val_period_out_of_the_fitted_views() -> None:
    """select=period: the views the scorer is fitted on before the check (every view but the
    latest) are identical, features and targets, whether or not the log holds any event of the val
    period or later; the check view's features read nothing of the val period (only its targets do);
    and the checked fit is fitted on the earlier views alone."""
    log = _random_log(2, n=2500, days=80)
    config = FunnelConfig(cuts=2, rank=8, discovery=10, popular=5, neighbours=5)
    val_start, test_start = T0 + timedelta(days=60), T0 + timedelta(days=70)
    before = log.filter(pl.col("timestamp") < val_start)
    parts, views = view_sets(log, 2, "next_period", val_start, test_start, 60, 40, config, 0, config.cuts + 1)
    assert len(parts) == 3
    assert datetime.fromisoformat(views[0]["asof"]) < val_start <= datetime.fromisoformat(views[0]["asof"]) + timedelta(seconds=1)
    # the val-period events alone label the check view: none of its features change without them
    check_users = parts[0].users
    truncated = view_candidates(before, check_users, datetime.fromisoformat(views[0]["asof"]), 2, 60, 40, config, 0)
    np.testing.assert_array_equal(parts[0].x, truncated.x)
    assert parts[0].y.sum() > 0
    assert np.abs(parts[0].x[:, [list(FEATURES).index(n) for n in NEIGHBOUR_FEATURES]]).sum() > 0
    # the fitted views come out the same from a log that ends at the val start (no view is missing)
    early = training_views(before, 2, "next_period", val_start - (test_start - val_start), val_start, config, 0)
    assert len(early) == 2
    for p, (view, asof, targets) in zip(parts[1:], early, strict=True):
        assert view["timestamp"].max() <= asof < val_start
        assert targets.height > 0 and p.y.sum() > 0
        q = view_candidates(view, p.users, asof, 2, 60, 40, config, 0, targets)
        np.testing.assert_array_equal(p.x, q.x)
        np.testing.assert_array_equal(p.y, q.y)
    scorer_cfg = ScorerConfig(hidden=[8], steps=20, batch=16, checks=4)
    checked, rec, first = fit_period(parts, views, "next_period", scorer_cfg, 0, refit=False)
    assert checked is first and rec["check_view"] == views[0] and rec["refit"] is False
    assert rec["views"] == views[1:], "the checked fit must be fitted on the earlier views only"


def test_denoise_hides_the_conversion_and_keeps_the_cart() -> None:
    log = _random_log(1)
    config = FunnelConfig(drop=0.3, whole=0.0)
    ((view, _, hidden),) = training_views(log, 2, "denoise", T0, T0 + timedelta(days=60), config, seed=0)
    assert hidden.height > 0
    in_view = view.join(hidden, on=["user_id", "entity_id"], how="semi")
    assert (in_view["stage_rank"] < 2).all(), "a hidden pair's conversion reached the view"
    shallow = log.join(hidden, on=["user_id", "entity_id"], how="semi").filter(pl.col("stage_rank") < 2)
    assert in_view.height == shallow.height, "a hidden pair's shallower events must stay"
    # more conversions of the hidden pairs (what the targets are) change no input of any candidate
    extra = hidden.join(log.filter(pl.col("stage_rank") == 2), on=["user_id", "entity_id"], how="inner") \
        .select(log.columns).with_columns(pl.col("timestamp") + timedelta(hours=1))
    ((view_b, _, hidden_b),) = training_views(pl.concat([log, extra]), 2, "denoise", T0, T0 + timedelta(days=60), config, 0)
    assert hidden_b.sort("user_id", "entity_id").equals(hidden.sort("user_id", "entity_id"))
    users = np.unique(hidden["user_id"].to_numpy())
    small = FunnelConfig(rank=8, discovery=10, popular=5, neighbours=5)
    a = view_candidates(view, users, T0 + timedelta(days=61), 2, 60, 40, small, 0, hidden)
    b = view_candidates(view_b, users, T0 + timedelta(days=61), 2, 60, 40, small, 0, hidden_b)
    np.testing.assert_array_equal(a.x, b.x)
    assert a.rows["cycle_median"].drop_nulls().len() > 0, "the compared inputs must hold a repurchase cycle"
    assert a.rows["nbr_share"].sum() > 0, "the compared inputs must hold the neighbours' shares"
    whole = FunnelConfig(drop=0.3, whole=1.0)
    ((view2, _, hidden2),) = training_views(log, 2, "denoise", T0, T0 + timedelta(days=60), whole, seed=0)
    assert view2.join(hidden2, on=["user_id", "entity_id"], how="semi").is_empty()
