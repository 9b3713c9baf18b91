"""The user's open funnel: a point-in-time candidate source of deep-funnel intent.

Discovery (what a user has not engaged with) is what the embeddings serve. Deep-funnel intent is
different: what the user engaged at a shallower stage and has not converted yet (a cart, a save,
a view, a coupon), and, where the domain repeats (groceries, wholesale), what the user converts
again and again. A low-pass user vector smooths exactly this away, so it is kept as its own
source, one row per (user, entity) the user engaged with before ``asof``:

=====================  ===========================================================================
column                 meaning (every count and time reads only events at or before ``asof``)
=====================  ===========================================================================
user_id, entity_id     the pair (dense ids of the snapshot)
deepest                deepest funnel stage reached (stage rank, 0 = shallowest)
gap                    target stage rank - deepest (0 = converted, 1 = one stage short, ...)
converted              the pair reached the target stage (a repeat candidate)
n_events               events of the pair, every stage
n_deepest              events of the pair at its deepest stage
n_target               events of the pair at the target stage
age_days               days from the pair's last event to ``asof``
target_age_days        days from the pair's last target-stage event to ``asof`` (null: never)
user_events            the user's events (every entity of the type)
user_entities          distinct entities the user engaged with
user_last_days         days from the user's last event (any entity) to ``asof``
entity_users           distinct users who engaged with the entity
entity_buyers          distinct users who reached the target stage with it
entity_conversion      entity_buyers / entity_users
entity_repeat          share of the entity's buyers with two or more target-stage events
n_trips, trip_decay_*  the pair's distinct target-stage days and their TIFU-decayed counts
cycle_median,          the median / mean gap in days between those days (the pair's repurchase
cycle_mean             cycle, hir/funnel/cycle.py; null: fewer than two)
user_trips,            the user's trips (distinct target-stage days), their decayed counts and
user_decay_*,          trips per week (hir/funnel/cycle.py; null: the user never converted)
user_trip_rate
entity_cycle           the entity's typical repurchase cycle in days (null: no repeat buyer)
entity_last_days,      days since anyone converted the entity, and its conversions in the last 28
entity_recent          days (is it still traded? hir/funnel/cycle.py; null: never converted)
=====================  ===========================================================================

:func:`open_funnel` is a pure ``LazyFrame -> LazyFrame`` step over the snapshot's
``events.parquet`` rows; the caller chooses the periods it may read (``asof`` and the splits), so
the same function builds a training view (events up to a cut) and the served source (events up
to now) without any future event reaching a row (tests/funnel/test_source.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import polars as pl

from hir.data.schema import TS
from hir.funnel import cycle

DAY_US = 86_400 * 1_000_000
# the columns open_funnel writes, in order (the Feast feature view's schema follows them)
COLUMNS = (
    "user_id", "entity_id", "deepest", "gap", "converted", "n_events", "n_deepest", "n_target",
    "age_days", "target_age_days", "user_events", "user_entities", "user_last_days",
    "entity_users", "entity_buyers", "entity_conversion", "entity_repeat",
    *cycle.PAIR_COLUMNS, *cycle.USER_COLUMNS, *cycle.ENTITY_COLUMNS,
)

# the recency and trip columns (meaningless where the snapshot's times are synthesized: a trip is
# a distinct day)
TIME_COLUMNS = ("age_days", "target_age_days", "user_last_days", *cycle.PAIR_COLUMNS, *cycle.USER_COLUMNS,
                *cycle.ENTITY_COLUMNS)


def _days(later: pl.Expr | datetime, earlier: pl.Expr) -> pl.Expr:
    """Days (float) between two timestamps."""
    later = pl.lit(later, TS) if isinstance(later, datetime) else later
    return ((later - earlier).dt.total_microseconds() / DAY_US).cast(pl.Float32)


def visible_events(
    events: pl.LazyFrame, entity_type: str, asof: datetime, splits: Sequence[str] | None = None
) -> pl.LazyFrame:
    """The events a source built at ``asof`` may read: of ``entity_type``, at or before ``asof``
    and (when given) in ``splits``. Rows: the snapshot's event columns."""
    out = events.filter((pl.col("entity_type") == entity_type) & (pl.col("timestamp") <= pl.lit(asof, TS)))
    if splits is not None:
        out = out.filter(pl.col("split").is_in(list(splits)))
    return out


def open_funnel(events: pl.LazyFrame, target_rank: int, asof: datetime) -> pl.LazyFrame:
    """Every (user, entity) pair of ``events`` with the features of the module table.

    Args:
        events: event rows (``user_id, entity_id, stage_rank, timestamp``), already restricted to
            what may be read at ``asof`` (:func:`visible_events`).
        target_rank: the stage rank of the conversion (the deep stage, e.g. purchase).
        asof: the time the source describes (ages are measured to it).

    Returns:
        One row per pair, columns :data:`COLUMNS`, sorted by (user_id, entity_id).
    """
    ev = events.select("user_id", "entity_id", "stage_rank", "timestamp")
    is_target = pl.col("stage_rank") >= target_rank
    pairs = ev.group_by("user_id", "entity_id").agg(
        pl.col("stage_rank").max().alias("deepest"),
        pl.len().cast(pl.Int32).alias("n_events"),
        (pl.col("stage_rank") == pl.col("stage_rank").max()).sum().cast(pl.Int32).alias("n_deepest"),
        is_target.sum().cast(pl.Int32).alias("n_target"),
        pl.col("timestamp").max().alias("last_ts"),
        pl.col("timestamp").filter(is_target).max().alias("last_target_ts"),
    )
    return (
        pairs.join(user_stats(ev, asof, target_rank), on="user_id").join(entity_stats(ev, target_rank, asof), on="entity_id")
        .join(cycle.pair_cycles(ev, target_rank), on=["user_id", "entity_id"], how="left")
        .with_columns(
            (pl.lit(target_rank) - pl.col("deepest")).clip(lower_bound=0).cast(pl.Int8).alias("gap"),
            (pl.col("n_target") > 0).alias("converted"),
            _days(asof, pl.col("last_ts")).alias("age_days"),
            _days(asof, pl.col("last_target_ts")).alias("target_age_days"),
            pl.col("deepest").cast(pl.Int8),
        )
        .select(COLUMNS)
        .sort("user_id", "entity_id")
    )


def user_stats(events: pl.LazyFrame, asof: datetime, target_rank: int) -> pl.LazyFrame:
    """Per user: ``user_events``, ``user_entities``, ``user_last_days`` and the trip columns of
    :data:`hir.funnel.cycle.USER_COLUMNS` (module table)."""
    return events.group_by("user_id").agg(
        pl.len().cast(pl.Int32).alias("user_events"),
        pl.col("entity_id").n_unique().cast(pl.Int32).alias("user_entities"),
        pl.col("timestamp").max().alias("user_last_ts"),
    ).select("user_id", "user_events", "user_entities", _days(asof, pl.col("user_last_ts")).alias("user_last_days")) \
        .join(cycle.user_trips(events, target_rank, asof), on="user_id", how="left")


def entity_stats(events: pl.LazyFrame, target_rank: int, asof: datetime) -> pl.LazyFrame:
    """Per entity: ``entity_users``, ``entity_buyers``, ``entity_conversion``, ``entity_repeat``
    and :data:`hir.funnel.cycle.ENTITY_COLUMNS` (module table), from the event rows ``events``."""
    per_pair = events.group_by("user_id", "entity_id").agg(
        (pl.col("stage_rank") >= target_rank).sum().alias("n_target"))
    return per_pair.group_by("entity_id").agg(
        pl.len().cast(pl.Int32).alias("entity_users"),
        (pl.col("n_target") > 0).sum().cast(pl.Int32).alias("entity_buyers"),
        (pl.col("n_target") > 1).sum().cast(pl.Int32).alias("entity_repeaters"),
    ).select(
        "entity_id", "entity_users", "entity_buyers",
        (pl.col("entity_buyers") / pl.col("entity_users")).cast(pl.Float32).alias("entity_conversion"),
        (pl.col("entity_repeaters") / pl.col("entity_buyers").clip(lower_bound=1)).cast(pl.Float32).alias("entity_repeat"),
    ).join(cycle.entity_cycles(cycle.pair_cycles(events, target_rank)), on="entity_id", how="left") \
        .join(cycle.entity_recency(events, target_rank, asof), on="entity_id", how="left")


def plain_order(source: pl.DataFrame, include_converted: bool) -> pl.DataFrame:
    """The non-learned ordering of a user's open funnel (the reference the scorer must beat):
    deepest stage first (converted pairs, when included, lead: the repeat reference), then the
    most events at that stage, then the most recent, then the entity most converted by others.
    Returns ``source`` sorted, with a per-user ``pos`` (0 = first)."""
    rows = source if include_converted else source.filter(~pl.col("converted"))
    return (
        rows.sort(
            ["user_id", "deepest", "n_deepest", "age_days", "entity_buyers", "entity_id"],
            descending=[False, True, True, False, True, False],
            nulls_last=True,
        )
        .with_columns(pl.int_range(pl.len()).over("user_id").alias("pos"))
    )
