"""Repurchase cycles: when a user is *due* to convert an entity again.

Grocery and wholesale logs repeat, and what orders a user's repeats is less how often the user
bought an entity than whether it is due now (TIFU-KNN, SIGIR'20; ReCANet, SIGIR'22; the next-basket
reality check, TOIS 2023). The open funnel's counts and last times cannot say that: a cycle needs
the times of every conversion. This module reads them once, at the grain of a *trip* (a distinct
day on which the user reached the target stage; a grocery basket), every time at or before the
source's as-of time (the caller filters, :func:`hir.funnel.source.visible_events`)::

    D_u        the user's trip days, k_u(d) = trips of u after day d (0 = the last trip)
    D_ue       the days among D_u on which u converted e
    n_trips    |D_ue|                                 (pair)
    cycle_*    median / mean of the gaps between consecutive days of D_ue, in days (null: < 2 trips)
    trip_decay_<r>  sum_{d in D_ue} r ** k_u(d)       (pair; TIFU's time-decayed frequency, r in DECAYS)
    user_trips |D_u|,  user_decay_<r> = sum_{d in D_u} r ** k_u(d)
    user_trip_rate  |D_u| per week of the user's span: 7 |D_u| / max(asof - min D_u, 7 days)
    entity_cycle    median of ``cycle_median`` over the entity's pairs with one (the item's typical
                    cycle, the fallback for a user who converted it once)
    entity_last_days  days from the entity's last conversion by anyone to ``asof``
    entity_recent     the entity's conversions (events) in the ``RECENT_DAYS`` before ``asof``

The last two say whether the entity is still traded: a user's weekly item that nobody has bought
for a month has been delisted or is out of season (on completejourney a repeat pair whose entity
nobody bought in the last 30 days converts at a quarter to a third of the rate of one bought
yesterday, at the same trip share); against ``entity_buyers`` (the whole history)
``entity_recent`` is a trend.

The scorer reads ratios of them (:data:`hir.funnel.candidates.FEATURES`): ``trip_share`` =
n_trips / user_trips, ``trip_share_<r>`` = trip_decay_<r> / user_decay_<r> and the *due* ratio
target_age_days / cycle (the user's own cycle, else the entity's). The ratio is formed there, not
stored, so a served source whose ages are shifted to the request time (hir/funnel/serve.py) stays
right. Every column reads only events of its input, so nothing after the as-of time reaches it
(tests/funnel/test_cycle.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl

from hir.data.schema import TS

DAY_US = 86_400 * 1_000_000
# TIFU-KNN's within-user decay per basket, named by its percent; tuned values sit in 0.9-1 on
# grocery logs. Two memories, as the best one follows the target period's length: 0.9 halves a
# trip's weight after 7 later trips (a few weeks of a weekly shopper), 0.97 after 23; alone, the
# share at 0.95-0.98 orders completejourney's 35-day repeats best, 0.9 only as well as the count
DECAYS = {"90": 0.9, "97": 0.97}
PAIR_COLUMNS = ("n_trips", "cycle_median", "cycle_mean", *(f"trip_decay_{n}" for n in DECAYS))
USER_COLUMNS = ("user_trips", *(f"user_decay_{n}" for n in DECAYS), "user_trip_rate")
# four weeks: a month of grocery or wholesale trade, shorter than any target period measured
RECENT_DAYS = 28
ENTITY_COLUMNS = ("entity_cycle", "entity_last_days", "entity_recent")
# the float32 ones (the trip counts are int32)
FLOAT_COLUMNS = tuple(c for c in (*PAIR_COLUMNS, *USER_COLUMNS, *ENTITY_COLUMNS) if c not in ("n_trips", "user_trips", "entity_recent"))


def _trips(events: pl.LazyFrame, target_rank: int) -> pl.LazyFrame:
    """(user_id, entity_id, day, k): the distinct target-stage days of each pair, with the user's
    trips after that day ``k``."""
    days = events.filter(pl.col("stage_rank") >= target_rank).select(
        "user_id", "entity_id", pl.col("timestamp").dt.truncate("1d").alias("day")).unique()
    user_days = days.select("user_id", "day").unique().with_columns(
        (pl.col("day").rank("dense", descending=True).over("user_id") - 1).cast(pl.Int32).alias("k"))
    return days.join(user_days, on=["user_id", "day"])


def pair_cycles(events: pl.LazyFrame, target_rank: int) -> pl.LazyFrame:
    """Per (user, entity) converted at least once: :data:`PAIR_COLUMNS` (module doc)."""
    # one sort and a shift instead of a sort per group (5x faster on completejourney): the gap to
    # the pair's previous trip, null on the pair's first
    same = (pl.col("user_id") == pl.col("user_id").shift(1)) & (pl.col("entity_id") == pl.col("entity_id").shift(1))
    trips = _trips(events, target_rank).sort("user_id", "entity_id", "day").with_columns(
        pl.when(same).then((pl.col("day") - pl.col("day").shift(1)).dt.total_microseconds() / DAY_US).alias("gap"))
    gap = pl.col("gap").drop_nulls()
    return trips.group_by("user_id", "entity_id").agg(
        pl.len().cast(pl.Int32).alias("n_trips"),
        gap.median().cast(pl.Float32).alias("cycle_median"),
        gap.mean().cast(pl.Float32).alias("cycle_mean"),
        *[(pl.lit(r) ** pl.col("k")).sum().cast(pl.Float32).alias(f"trip_decay_{n}") for n, r in DECAYS.items()],
    )


def user_trips(events: pl.LazyFrame, target_rank: int, asof: datetime) -> pl.LazyFrame:
    """Per user with a target-stage event: :data:`USER_COLUMNS` (module doc)."""
    user_days = _trips(events, target_rank).select("user_id", "day", "k").unique()
    span = ((pl.lit(asof, TS) - pl.col("first")).dt.total_microseconds() / DAY_US).clip(lower_bound=7.0)
    return user_days.group_by("user_id").agg(
        pl.len().cast(pl.Int32).alias("user_trips"),
        *[(pl.lit(r) ** pl.col("k")).sum().cast(pl.Float32).alias(f"user_decay_{n}") for n, r in DECAYS.items()],
        pl.col("day").min().alias("first"),
    ).select("user_id", "user_trips", *(f"user_decay_{n}" for n in DECAYS),
             (7.0 * pl.col("user_trips") / span).cast(pl.Float32).alias("user_trip_rate"))


def entity_cycles(pairs: pl.LazyFrame) -> pl.LazyFrame:
    """Per entity with a repeat buyer: ``entity_cycle`` from :func:`pair_cycles`' rows."""
    return pairs.filter(pl.col("cycle_median").is_not_null()).group_by("entity_id").agg(
        pl.col("cycle_median").median().cast(pl.Float32).alias("entity_cycle"))


def entity_recency(events: pl.LazyFrame, target_rank: int, asof: datetime) -> pl.LazyFrame:
    """Per entity with a target-stage event: ``entity_last_days`` and ``entity_recent`` (module doc)."""
    t = pl.col("timestamp")
    return events.filter(pl.col("stage_rank") >= target_rank).group_by("entity_id").agg(
        ((pl.lit(asof, TS) - t.max()).dt.total_microseconds() / DAY_US).cast(pl.Float32).alias("entity_last_days"),
        (t > pl.lit(asof, TS) - timedelta(days=RECENT_DAYS)).sum().cast(pl.Int32).alias("entity_recent"),
    )
