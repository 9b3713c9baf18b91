"""A user's candidate set: the open funnel, discovery neighbours and popular entities, one row per
(user, entity) with every feature the scorer reads and the source(s) it came from.

Rows (``build_candidates``): ``user_id, entity_id, in_funnel, in_discovery, in_popular``, the open
funnel's pair columns (null-filled with 0 for an entity the user never engaged with), the
entity's and the user's statistics, ``disc_pos`` / ``disc_score`` (position and score in the
discovery list) and ``pop_pos``. :func:`feature_matrix` turns them into the scorer's (n, F)
float32 inputs, named by :data:`FEATURES`.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from hir.funnel.affinity import COLUMNS as AFFINITY
from hir.funnel.cycle import DECAYS
from hir.funnel.source import plain_order

# stages deeper than this many below the target share one indicator
MAX_GAP = 3


def _log(name: str) -> pl.Expr:
    return pl.col(name).cast(pl.Float32).fill_null(0.0).clip(lower_bound=0.0).log1p()


# the pair's repurchase cycle in days: the user's own, else the entity's typical one (a user who
# converted the entity once has no cycle of its own)
_CYCLE = pl.coalesce(pl.col("cycle_median"), pl.col("entity_cycle")).cast(pl.Float32)
# "is it due?": log((days since the last conversion + 1) / (cycle + 1)), 0 = one cycle ago; the
# log keeps a weekly item 3 cycles late and a monthly one 3 cycles late equally far from due, the
# clip bounds the pairs whose cycle is a day and whose last purchase was months ago
_DUE = ((pl.col("target_age_days").cast(pl.Float32) + 1.0) / (_CYCLE + 1.0)).log().clip(-3.0, 3.0)


# the scorer's inputs, in order (name -> expression over a candidate frame)
FEATURES: dict[str, pl.Expr] = {
    "in_funnel": pl.col("in_funnel").cast(pl.Float32),
    "converted": pl.col("converted").fill_null(False).cast(pl.Float32),
    **{f"gap_{g}": ((pl.col("gap") == g) & pl.col("in_funnel") & ~pl.col("converted").fill_null(False))
       .fill_null(False).cast(pl.Float32) for g in range(1, MAX_GAP)},
    f"gap_{MAX_GAP}+": ((pl.col("gap") >= MAX_GAP) & pl.col("in_funnel")).fill_null(False).cast(pl.Float32),
    "log_events": _log("n_events"),
    "log_deepest": _log("n_deepest"),
    "log_target": _log("n_target"),
    "log_age": _log("age_days"),
    "has_target_age": pl.col("target_age_days").is_not_null().cast(pl.Float32),
    "log_target_age": _log("target_age_days"),
    "log_user_events": _log("user_events"),
    "log_user_entities": _log("user_entities"),
    "log_user_last": _log("user_last_days"),
    "log_entity_users": _log("entity_users"),
    "log_entity_buyers": _log("entity_buyers"),
    "entity_conversion": pl.col("entity_conversion").fill_null(0.0).cast(pl.Float32),
    "entity_repeat": pl.col("entity_repeat").fill_null(0.0).cast(pl.Float32),
    "in_discovery": pl.col("in_discovery").cast(pl.Float32),
    "log_disc_pos": _log("disc_pos"),
    "disc_score": pl.col("disc_score").fill_null(0.0).cast(pl.Float32),
    "base_score": pl.col("base_score").fill_null(0.0).cast(pl.Float32),
    "base_rank": (pl.col("base_score").rank("ordinal", descending=True).over("user_id")).cast(pl.Float32).log1p(),
    "in_popular": pl.col("in_popular").cast(pl.Float32),
    "log_pop_pos": _log("pop_pos"),
    # repurchase cycles (hir/funnel/cycle.py; all 0 where the times are synthesized)
    "trip_share": (pl.col("n_trips") / pl.col("user_trips")).fill_null(0.0).cast(pl.Float32),
    **{f"trip_share_{n}": (pl.col(f"trip_decay_{n}") / pl.col(f"user_decay_{n}")).fill_null(0.0).cast(pl.Float32)
       for n in DECAYS},
    "log_trips": _log("n_trips"),
    "has_cycle": pl.col("cycle_median").is_not_null().cast(pl.Float32),
    "log_cycle": _CYCLE.fill_null(0.0).log1p(),
    "log_entity_cycle": _log("entity_cycle"),
    "has_due": _DUE.is_not_null().cast(pl.Float32),
    "log_due": _DUE.fill_null(0.0),
    "log_user_trips": _log("user_trips"),
    "log_trip_rate": _log("user_trip_rate"),
    "log_entity_last": _log("entity_last_days"),
    "log_entity_recent": _log("entity_recent"),
    # affinity to the user's other items (hir/funnel/affinity.py; all 0 when switched off)
    **{c: pl.col(c).fill_null(0.0).cast(pl.Float32) for c in AFFINITY if not c.startswith("ctx_")},
    **{f"log_{c}": _log(c) for c in AFFINITY if c.startswith("ctx_")},
    # what the user's nearest users buy (hir/funnel/neighbours.py; 0 when switched off): the share
    # and its within-user rank as 1 / rank (0 where no neighbour buys the candidate)
    "nbr_share": pl.col("nbr_share").fill_null(0.0).cast(pl.Float32),
    "nbr_inv_rank": pl.when(pl.col("nbr_share") > 0)
    .then(1.0 / pl.col("nbr_share").rank("min", descending=True).over("user_id")).otherwise(0.0).cast(pl.Float32),
}


# the repurchase-cycle and trade-recency inputs above (benchmarks/funnel.py's ``no_cycle`` arm
# zeroes them)
CYCLE_FEATURES = ("trip_share", *(f"trip_share_{n}" for n in DECAYS), "log_trips", "has_cycle", "log_cycle", "log_entity_cycle",
                  "has_due", "log_due", "log_user_trips", "log_trip_rate", "log_entity_last", "log_entity_recent")
# the neighbour inputs (``no_nbr`` zeroes them)
NEIGHBOUR_FEATURES = ("nbr_share", "nbr_inv_rank")


def build_candidates(
    source: pl.DataFrame,
    users: np.ndarray,
    disc_ids: np.ndarray,
    disc_scores: np.ndarray,
    popular: np.ndarray,
    entities: pl.DataFrame,
    user_table: pl.DataFrame,
    max_funnel: int,
) -> pl.DataFrame:
    """Every candidate of ``users``.

    Args:
        source: open-funnel rows (:func:`hir.funnel.source.open_funnel`).
        users: (U,) user ids.
        disc_ids, disc_scores: (U, D) discovery lists of ``users`` (-1 = empty slot), best first.
        popular: (P,) popular entity ids, most popular first.
        entities: per-entity statistics (:func:`hir.funnel.source.entity_stats`).
        user_table: per-user statistics (:func:`hir.funnel.source.user_stats`).
        max_funnel: the user's open-funnel pairs kept, in the plain order (deepest and most recent first).
    """
    ids = pl.DataFrame({"user_id": users.astype(np.int64)})
    funnel = (
        plain_order(source.join(ids, on="user_id", how="semi"), include_converted=True)
        .filter(pl.col("pos") < max_funnel)
        .drop("pos", *[c for c in entities.columns if c != "entity_id"], *[c for c in user_table.columns if c != "user_id"])
        .with_columns(pl.lit(True).alias("in_funnel"))
    )
    d = disc_ids.shape[1]
    disc = pl.DataFrame({
        "user_id": np.repeat(users.astype(np.int64), d),
        "entity_id": disc_ids.reshape(-1),
        "disc_pos": np.tile(np.arange(1, d + 1, dtype=np.int32), len(users)),
        "disc_score": disc_scores.reshape(-1).astype(np.float32),
    }).filter(pl.col("entity_id") >= 0).with_columns(pl.lit(True).alias("in_discovery"))
    pop = ids.join(pl.DataFrame({"entity_id": popular.astype(np.int64),
                                 "pop_pos": np.arange(1, len(popular) + 1, dtype=np.int32)}), how="cross") \
        .with_columns(pl.lit(True).alias("in_popular"))
    out = (
        funnel.join(disc, on=["user_id", "entity_id"], how="full", coalesce=True)
        .join(pop, on=["user_id", "entity_id"], how="full", coalesce=True)
        .join(entities, on="entity_id", how="left")
        .join(user_table, on="user_id", how="left")
        .with_columns(pl.col("in_funnel", "in_discovery", "in_popular").fill_null(False))
    )
    # popular entities the user already engaged with were dropped from the funnel cap: keep the
    # pair's history facts off them (they come from `source` only when in the funnel)
    return out.sort("user_id", "entity_id")


def feature_matrix(candidates: pl.DataFrame) -> np.ndarray:
    """(n, F) float32 scorer inputs of ``candidates`` (columns :data:`FEATURES`)."""
    return candidates.select(**FEATURES).to_numpy().astype(np.float32)
