"""Repurchase cycles (hir/funnel/cycle.py): the trips, cycles and due ratios of a hand-built
grocery log, and that nothing after the as-of time reaches them."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import numpy as np
import polars as pl
import pytest

from hir.funnel.candidates import CYCLE_FEATURES, FEATURES
from hir.funnel.cycle import DECAYS
from hir.funnel.fit import FunnelConfig, FunnelTables
from hir.funnel.source import open_funnel, visible_events
from tests.funnel.test_source import T0, events

ASOF = T0 + timedelta(days=21)

# user 0 shops on days 0, 3, 7 and 14: milk (1) weekly, coffee (2) fortnightly, a cake (3) once;
# two purchases of milk on day 7 (morning and evening) are one trip. User 1 buys the cake every 10
# days (the cake's typical cycle) and views milk.
LOG = events([
    (0, 1, 2, 0.4), (0, 1, 2, 7.3), (0, 1, 2, 7.8), (0, 1, 2, 14.5),
    (0, 2, 2, 0.4), (0, 2, 2, 14.5),
    (0, 3, 2, 3.6), (0, 4, 1, 15.0),
    (1, 3, 2, 1.0), (1, 3, 2, 11.0), (1, 1, 0, 12.0),
])


def _rows(log: pl.DataFrame, asof: datetime) -> dict[tuple[int, int], dict]:
    out = open_funnel(log.lazy(), 2, asof).collect()
    feats = out.select("user_id", "entity_id", **{n: FEATURES[n] for n in CYCLE_FEATURES})
    return {(r["user_id"], r["entity_id"]): r for r in out.join(feats, on=["user_id", "entity_id"]).to_dicts()}


def test_trips_cycles_and_shares_of_a_hand_built_log() -> None:
    row = _rows(LOG, ASOF)
    milk, coffee, cake = row[(0, 1)], row[(0, 2)], row[(0, 3)]
    assert (milk["n_trips"], milk["cycle_median"], milk["cycle_mean"]) == (3, 7.0, 7.0)
    assert (coffee["n_trips"], coffee["cycle_median"]) == (2, 14.0)
    assert cake["n_trips"] == 1 and cake["cycle_median"] is None and cake["entity_cycle"] == 10.0
    # user 0's trips: days 14, 7, 3, 0 -> k = 0, 1, 2, 3 (the cart of day 15 is no trip)
    for n, r in DECAYS.items():
        assert (milk["user_trips"], milk[f"user_decay_{n}"]) == (4, pytest.approx(1 + r + r**2 + r**3))
        assert milk[f"trip_decay_{n}"] == pytest.approx(1 + r + r**3)
        assert milk[f"trip_share_{n}"] == pytest.approx((1 + r + r**3) / (1 + r + r**2 + r**3))
        # the cake, bought on the user's second trip, weighs less than its plain share
        assert cake[f"trip_share_{n}"] == pytest.approx(r**2 / (1 + r + r**2 + r**3))
    assert milk["trip_share"] == pytest.approx(3 / 4) and cake["trip_share"] == pytest.approx(1 / 4)
    assert milk["user_trip_rate"] == pytest.approx(7 * 4 / 21)
    # milk was last bought on day 14.5 (user 0), the cake on day 11 (user 1): both within 28 days
    assert milk["entity_last_days"] == pytest.approx(6.5) and cake["entity_last_days"] == pytest.approx(10.0)
    assert (milk["entity_recent"], cake["entity_recent"]) == (4, 3)
    # the carted, never bought entity has no trip
    assert row[(0, 4)]["n_trips"] is None and row[(0, 4)]["trip_share"] == 0.0


def test_the_due_item_gets_its_own_cycle_over_its_age() -> None:
    row = _rows(LOG, ASOF)
    milk, coffee, cake = row[(0, 1)], row[(0, 2)], row[(0, 3)]
    # last bought day 14.5, as of day 21: 6.5 days, one weekly cycle -> due; coffee half a cycle
    assert milk["target_age_days"] == pytest.approx(6.5)
    assert milk["log_due"] == pytest.approx(math.log(7.5 / 8.0), abs=1e-5)
    assert coffee["log_due"] == pytest.approx(math.log(7.5 / 15.0), abs=1e-5)
    # the cake was bought once by user 0: the entity's cycle (10 days) stands in
    assert cake["log_due"] == pytest.approx(math.log((21 - 3.6 + 1) / 11.0), abs=1e-5)
    assert cake["has_cycle"] == 0.0 and cake["has_due"] == 1.0
    assert abs(milk["log_due"]) < min(abs(coffee["log_due"]), abs(cake["log_due"]))  # milk is the due one
    # a week later milk is a cycle overdue
    later = _rows(LOG, ASOF + timedelta(days=7))
    assert later[(0, 1)]["log_due"] == pytest.approx(math.log(14.5 / 8.0), abs=1e-5)
    # as of day 35 only the cake's day-11 sale is in the last 28 days
    latest = _rows(LOG, ASOF + timedelta(days=14))[(0, 3)]
    assert latest["entity_recent"] == 1 and latest["entity_last_days"] == pytest.approx(24.0)


def test_purchases_after_asof_change_no_cycle() -> None:
    asof = T0 + timedelta(days=10)
    later = pl.concat([LOG, events([(0, 1, 2, 10.5), (0, 2, 2, 10.5), (1, 3, 2, 10.2)])])
    a = open_funnel(visible_events(LOG.lazy(), "product", asof), 2, asof).collect()
    b = open_funnel(visible_events(later.lazy(), "product", asof), 2, asof).collect()
    assert a.equals(b)
    assert a["cycle_median"].drop_nulls().len() > 0, "the compared rows must hold a cycle"


def test_synthesized_times_switch_the_cycle_inputs_off() -> None:
    for use_time in (True, False):
        config = FunnelConfig(rank=4, discovery=2, popular=2, affinity_context=0, use_time=use_time)
        tables = FunnelTables.of_view(LOG, ASOF, 2, 2, 5, config, seed=0)
        cands = tables.candidates(np.array([0, 1]), config)
        cols = [list(FEATURES).index(n) for n in CYCLE_FEATURES]
        assert (np.abs(cands.x[:, cols]).sum() > 0) == use_time
