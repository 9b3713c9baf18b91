"""The evaluation tasks of a dataset (``conf/eval/task/<dataset>.yaml``): :class:`RetrievalTask`
(what is retrieved and counted as relevant, evaluation/retrieval/data.py builds its held-out
sets) and :class:`RankingTask`, the deep-funnel ranking task: which (user, entity, time) rows a
ranker scores and their labels.

Two ranking kinds:

- ``funnel``: every (user, entity) pair with a shallow-stage event (e.g. exposure or view) in
  the period is a candidate at the time of its first such event in a ``window`` bucket; its
  label is whether the pair reaches ``label_stage`` (e.g. purchase) within ``window`` after that
  time (or before the end of the period when ``window`` is null).
- ``next_period``: for each user who buys in the period, candidates are the user's past
  entities, the popular ones and uniformly sampled negatives, all at the period start; the label
  is whether the user reaches ``label_stage`` with the entity during the period.

Rows carry the candidate time ``ts`` so every feature can be computed strictly before it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import polars as pl

from hir.data.snapshot import Snapshot
from hir.errors import HirError

log = logging.getLogger(__name__)

KINDS = ("funnel", "next_period")
CANDIDATE_COLUMNS = ("user_id", "entity_id", "ts", "label", "stage", "split", "cold_entity")


@dataclass(frozen=True)
class RankingTask:
    """One dataset's deep-funnel ranking task.

    Args:
        kind: ``funnel`` or ``next_period`` (see the module doc).
        entity_type: the entity type ranked (``product``).
        candidate_stages: funnel stages whose events make candidates; null = the shallowest
            stage (e.g. exposure or view).
        label_stage: the stage that makes a positive; null = the snapshot's deepest stage.
        window: a Polars duration (``7d``). funnel: the label horizon after the candidate time
            (null = to the end of the period); candidates are deduplicated per (user, entity,
            window bucket). next_period: each split is cut into windows from its start, each a
            period of its own (null = the whole split is one period).
        history_items: next_period: the user's most recent past entities kept as candidates.
        popular_items: next_period: the most bought entities before the period, for every user.
        negatives: next_period: entities sampled uniformly from the catalogue per user.
        max_rows: rows kept per period (a seeded uniform sample above it; 0 = no cap).
        few_events: users with at most this many prior events form the "few events" slice.
    """

    kind: str = "funnel"
    entity_type: str = "product"
    candidate_stages: tuple[str, ...] | None = None
    label_stage: str | None = None
    window: str | None = None
    history_items: int = 50
    popular_items: int = 20
    negatives: int = 20
    max_rows: int = 200_000
    few_events: int = 5

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise HirError(f"eval.task.ranking.kind={self.kind!r}; expected one of {list(KINDS)}")

    def resolve_label_stage(self, snap: Snapshot) -> str:
        stage = self.label_stage or snap.deep_stage
        if stage not in snap.stage_order:
            raise HirError(
                f"eval.task.ranking.label_stage={stage!r} is not a stage of {snap.dataset} "
                f"(stage order {snap.stage_order}); set it to one of them"
            )
        return stage

    def resolve_candidate_stages(self, snap: Snapshot) -> list[str]:
        label = self.resolve_label_stage(snap)
        if self.candidate_stages is None:
            stages = snap.stage_order[:1]
        else:
            stages = list(self.candidate_stages)
        bad = [s for s in stages if s not in snap.stage_order or snap.stage_order.index(s) >= snap.stage_order.index(label)]
        if bad or not stages:
            raise HirError(
                f"eval.task.ranking.candidate_stages={stages} must be non-empty stages shallower than the label stage "
                f"{label!r} in {snap.stage_order}"
            )
        return stages


@dataclass(frozen=True)
class RetrievalTask:
    """Args:
    entity_type: the entity type retrieved.
    target_stage: stage of the held-out test events that count as relevant (null = deepest).
    history_stages: stages whose events before the test period form a user's history and the
        baselines' training data (null = every stage).
    ks: cut-offs; the largest is how many entities each arm retrieves.
    max_users: test users scored (a seeded sample when there are more; 0 = all).
    """

    entity_type: str = "product"
    target_stage: str | None = None
    history_stages: tuple[str, ...] | None = None
    ks: tuple[int, ...] = (10, 20, 50)
    max_users: int = 0


def period_bounds(snap: Snapshot, split: str) -> tuple[datetime, datetime]:
    """[start, end) of a split's period."""
    lo = datetime.fromisoformat(snap.meta["split_bounds"]["min"])
    end = snap.end + timedelta(microseconds=1)
    return {"train": (lo, snap.val_start), "val": (snap.val_start, snap.test_start), "test": (snap.test_start, end)}[split]


def build_candidates(task: RankingTask, snap: Snapshot, split: str, seed: int = 0) -> pl.DataFrame:
    """Candidate rows of one period.

    Returns:
        user_id i64, entity_id i64, ts datetime (candidate time; features must predate it),
        label i8, stage str (slice: deepest pre-label stage of the pair, or ``new``), split str,
        cold_entity bool (the entity's first event falls in this period).
    """
    start, end = period_bounds(snap, split)
    events = snap.events.filter(pl.col("entity_type") == task.entity_type)
    if events.is_empty():
        have = snap.events["entity_type"].unique().to_list()
        raise HirError(f"eval.task.ranking.entity_type={task.entity_type!r} has no events in {snap.dir}; types with events: {have}")
    if task.kind == "funnel":
        rows = _funnel(task, snap, events, start, end)
    else:
        rows = _next_periods(task, snap, events, start, end, seed)
    if task.max_rows and rows.height > task.max_rows:
        # group-bys and joins above return rows in no fixed order: sort first, or the seeded
        # sample picks different rows in every run (measured: the baseline arm's NE moved from
        # 0.4646 to 0.4640 between two evaluations of one completejourney export)
        rows = rows.sort(rows.columns).sample(task.max_rows, seed=seed, shuffle=False)
    first_seen = snap.nodes(task.entity_type).select(pl.col("node_id").alias("entity_id"), "first_seen")
    rows = rows.join(first_seen, on="entity_id", how="left").with_columns(
        pl.lit(split).alias("split"),
        (pl.col("first_seen").fill_null(pl.lit(end, pl.Datetime("us", "UTC"))) >= pl.lit(start, pl.Datetime("us", "UTC")))
        .alias("cold_entity"),
    )
    rows = rows.select(CANDIDATE_COLUMNS).sort("ts", "user_id", "entity_id")
    log.info(
        "%s candidates (%s): %d rows, %d positive (%.2f%%)",
        split, task.kind, rows.height, int(rows["label"].sum()), 100 * float(rows["label"].mean() or 0.0),
    )
    return rows


def _in_period(start: datetime, end: datetime) -> pl.Expr:
    ts = pl.col("timestamp")
    return (ts >= pl.lit(start, pl.Datetime("us", "UTC"))) & (ts < pl.lit(end, pl.Datetime("us", "UTC")))


def _bucket(window: str | None, start: datetime) -> pl.Expr:
    if window is None:
        return pl.lit(start, pl.Datetime("us", "UTC")).alias("bucket")
    return pl.col("timestamp").dt.truncate(window).alias("bucket")


def _stage_name(stage_order: list[str]) -> pl.Expr:
    """``_rank`` (a stage_rank) -> the stage's name."""
    return pl.col("_rank").replace_strict(list(range(len(stage_order))), stage_order, default=None, return_dtype=pl.String)


def _funnel(task: RankingTask, snap: Snapshot, events: pl.DataFrame, start: datetime, end: datetime) -> pl.DataFrame:
    label_stage = task.resolve_label_stage(snap)
    label_rank = snap.stage_order.index(label_stage)
    period = events.filter(_in_period(start, end)).with_columns(_bucket(task.window, start))
    keys = ["user_id", "entity_id", "bucket"]
    cands = (
        period.filter(pl.col("stage").is_in(task.resolve_candidate_stages(snap)))
        .group_by(keys)
        .agg(pl.col("timestamp").min().alias("ts"))
    )
    # slice only (never a feature): the deepest stage short of the label the pair reached in the bucket
    depth = (
        period.filter(pl.col("stage_rank") < label_rank)
        .group_by(keys)
        .agg(pl.col("stage_rank").max().alias("_rank"))
    )
    deep = (
        period.filter(pl.col("stage") == label_stage)
        .select("user_id", "entity_id", pl.col("timestamp").alias("label_ts"))
        .unique()
        .sort("label_ts")
    )
    joined = cands.sort("ts").join_asof(
        deep, left_on="ts", right_on="label_ts", by=["user_id", "entity_id"], strategy="forward",
        check_sortedness=False,  # both sides are sorted by time; polars cannot verify it per group
    )
    hit = pl.col("label_ts").is_not_null()
    if task.window is not None:
        hit = hit & (pl.col("label_ts") < pl.col("ts").dt.offset_by(task.window))
    return (
        joined.with_columns(hit.cast(pl.Int8).alias("label"))
        .join(depth, on=keys, how="left")
        .with_columns(
            _stage_name(snap.stage_order).alias("stage")
        )
        .select("user_id", "entity_id", "ts", "label", "stage")
    )


def _windows(start: datetime, end: datetime, window: str | None) -> list[tuple[datetime, datetime]]:
    """[start, end) cut into consecutive ``window``-long pieces from ``start`` (the last may be shorter)."""
    if window is None:
        return [(start, end)]
    out, lo = [], start
    while lo < end:
        hi = min(pl.select(pl.lit(lo, pl.Datetime("us", "UTC")).dt.offset_by(window)).item(), end)
        if hi <= lo:
            raise HirError(f"eval.task.ranking.window={window!r} is not a positive duration")
        out.append((lo, hi))
        lo = hi
    return out


def _next_periods(
    task: RankingTask, snap: Snapshot, events: pl.DataFrame, start: datetime, end: datetime, seed: int
) -> pl.DataFrame:
    """next_period rows of every ``window`` of the split (the whole split when null); windows
    without returning buyers (the first one of the data) contribute nothing."""
    parts = []
    for i, (lo, hi) in enumerate(_windows(start, end, task.window)):
        part = _next_period(task, snap, events, lo, hi, seed + i)
        if part is not None:
            parts.append(part)
    if not parts:
        raise HirError(
            f"next_period task: no user buying ({task.resolve_label_stage(snap)!r}) in [{start}, {end}) has earlier "
            "history, so there is nothing to rank; take the fit periods from later splits "
            "(eval.ranker_fit_splits=[val]) or use kind=funnel"
        )
    return pl.concat(parts)


def _next_period(
    task: RankingTask, snap: Snapshot, events: pl.DataFrame, start: datetime, end: datetime, seed: int
) -> pl.DataFrame | None:
    """Rows of one period starting at ``start``; None when no buyer of the period has history."""
    label_stage = task.resolve_label_stage(snap)
    history = events.filter(pl.col("timestamp") < pl.lit(start, pl.Datetime("us", "UTC")))
    bought = events.filter(_in_period(start, end) & (pl.col("stage") == label_stage)).select("user_id", "entity_id").unique()
    # sorted: the seeded negatives below are drawn per user in this order
    users = bought.select("user_id").unique().join(history.select("user_id").unique(), on="user_id", how="semi").sort("user_id")
    if users.is_empty():
        return None
    past = (
        history.join(users, on="user_id", how="semi")
        .group_by("user_id", "entity_id")
        .agg(pl.col("timestamp").max().alias("_last"))
        # entity_id breaks ties (one invoice's lines share a timestamp), so head() is reproducible
        .sort(["_last", "entity_id"], descending=[True, False])
        .group_by("user_id", maintain_order=True)
        .head(task.history_items)
        .select("user_id", "entity_id")
    )
    popular = (
        history.filter(pl.col("stage") == label_stage)
        .group_by("entity_id")
        .len()
        .sort(["len", "entity_id"], descending=[True, False])
        .head(task.popular_items)
        .select("entity_id")
    )
    rng = np.random.default_rng(seed)
    n_items = snap.num_nodes(task.entity_type)
    user_ids = users["user_id"].to_numpy()
    sampled = pl.DataFrame(
        {
            "user_id": np.repeat(user_ids, task.negatives),
            "entity_id": rng.integers(0, n_items, size=user_ids.size * task.negatives),
        }
    )
    cands = pl.concat([past, users.join(popular, how="cross"), sampled]).unique()
    prior = history.group_by("user_id", "entity_id").agg(pl.col("stage_rank").max().alias("_rank"))
    return (
        cands.join(bought.with_columns(pl.lit(1, pl.Int8).alias("label")), on=["user_id", "entity_id"], how="left")
        .join(prior, on=["user_id", "entity_id"], how="left")
        .with_columns(
            pl.lit(start, pl.Datetime("us", "UTC")).alias("ts"),
            pl.col("label").fill_null(0),
            pl.when(pl.col("_rank").is_null())
            .then(pl.lit("new"))
            .otherwise(_stage_name(snap.stage_order))
            .alias("stage"),
        )
        .select("user_id", "entity_id", "ts", "label", "stage")
    )
