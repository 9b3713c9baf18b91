"""Train the deep-funnel scorer as it is served, and rank a user's candidates with it.

The scorer is trained on *views*: events up to a cut-off, with the target-stage events after it as
the targets, exactly the shape of serving (everything up to now, the next conversions unknown):

- ``next_period`` (data with real time): cuts at the val start and ``cuts - 1`` more, one period
  (test start - val start) apart before it; the view at each cut is every visible event at or
  before it, the targets the target-stage events of the period after it (repeats included: the
  open funnel serves them).
- ``denoise`` (no real time, e.g. beibei's random carve-out): one view, every visible event
  except the target-stage events of a hashed share ``drop`` of the converted pairs, which are the
  targets; their shallower events stay, as a cart stays when its purchase has not happened yet.

Either way no event of the target period reaches a candidate's features (tests/funnel).

How the fit is checked (``select``; the check picks the MLP's step or the trees' count):

- ``holdout``: a share of the training views' users, never fitted, at the same cuts.
- ``period`` (``next_period`` only; ``denoise`` has no later period and keeps ``holdout``): the
  views move one period back (cuts at the val start minus 1..``cuts`` periods) and the check is
  the view at the val start, its targets the val period: the same users, one period later, as
  test is to the served fit. With ``refit`` the scorer is then refitted, at the chosen step, on
  the ``cuts`` latest views (the val view included), so it learns from the freshest period;
  without, the checked fit is kept. No view reads an event at or after the test start.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import polars as pl
import scipy.sparse as sp

from hir.funnel.affinity import COLUMNS as AFFINITY
from hir.funnel.affinity import context_affinity, user_context
from hir.funnel.boost import BoostedScorer, fit_boosted
from hir.funnel.candidates import FEATURES, build_candidates, feature_matrix
from hir.funnel.discovery import ViewBase
from hir.funnel.head import Context
from hir.funnel.neighbours import COLUMNS as NEIGHBOUR
from hir.funnel.neighbours import neighbour_share
from hir.funnel.scorer import CheckSet, FunnelScorer, ScorerConfig, fit_scorer
from hir.funnel.source import TIME_COLUMNS, entity_stats, open_funnel, user_stats

log = logging.getLogger(__name__)
TASKS = ("auto", "next_period", "denoise")
SCORERS = ("mlp", "gbdt")
SELECTS = ("holdout", "period")


@dataclass
class FunnelConfig:
    """task: how training views are cut (module doc); cuts: next_period views; drop: the share of
    converted pairs denoise hides; select, refit: how the fit is checked and whether it is refitted
    after a period check (module doc); whole: the share of those
    that lose every event (a conversion with no shallower engagement before it), the rest lose only
    their target-stage events; max_funnel, discovery, popular: candidates per user from each
    source; affinity_context: the user's pairs a candidate's affinity features compare it with
    (hir/funnel/affinity.py; 0 = off, the features read 0); neighbours, neighbour_decay: the
    nearest users whose time-decayed item shares make ``nbr_share`` and TIFU's per-trip decay of
    those shares (hir/funnel/neighbours.py; 0 = off, the features read 0); use_time: read the recency features (false on data whose times are synthesized: a
    random carve-out's made-up times carry no signal, only the adapter's artefacts); rank, ideal: the discovery view base (GF-CF's filter); max_train_users: training
    users sampled per view (0 = all); scorer: the scorer's fit."""

    task: str = "auto"
    cuts: int = 2
    select: str = "period"
    refit: bool = True
    drop: float = 0.2
    whole: float = 0.0
    max_funnel: int = 200
    discovery: int = 100
    popular: int = 50
    rank: int = 256
    ideal: float = 0.3
    max_train_users: int = 20000
    use_time: bool = True
    affinity_context: int = 100
    neighbours: int = 0
    neighbour_decay: float = 0.97
    scorer: ScorerConfig = field(default_factory=ScorerConfig)


@dataclass
class Candidates:
    """One view's candidate rows and their scorer inputs: ``rows`` (n rows, sorted by user),
    ``x`` (n, F), ``y`` (n,) targets, ``offsets`` (U + 1,), ``total`` (U,) targets per user,
    ``users`` (U,); ``context``: the target-aware head's inputs (None when the scorer has no head)."""

    rows: pl.DataFrame
    x: np.ndarray
    y: np.ndarray
    offsets: np.ndarray
    total: np.ndarray
    users: np.ndarray
    context: Context | None = None


def pair_matrix(pairs: pl.DataFrame, n_users: int, n_entities: int) -> sp.csr_matrix:
    """Binary (n_users, n_entities) CSR of ``pairs`` (``user_id, entity_id``)."""
    pairs = pairs.select("user_id", "entity_id").unique()
    return sp.csr_matrix((np.ones(pairs.height, np.float32), (pairs["user_id"].to_numpy(), pairs["entity_id"].to_numpy())),
                         shape=(n_users, n_entities))


def view_candidates(view: pl.DataFrame, users: np.ndarray, asof: datetime, target_rank: int, n_users: int,
                    n_entities: int, config: FunnelConfig, seed: int, targets: pl.DataFrame | None = None) -> Candidates:
    """The candidates of ``users`` from the events ``view`` (nothing after ``asof`` may be in it),
    labelled by ``targets`` (``user_id, entity_id``; None: unlabelled)."""
    tables = FunnelTables.of_view(view, asof, target_rank, n_users, n_entities, config, seed)
    return tables.candidates(users, config, targets=targets)


def view_weights(view: pl.DataFrame, target_rank: int) -> pl.DataFrame:
    """(user_id, entity_id, w) of the view base: each pair weighted 2 ** (deepest stage - target)."""
    return view.group_by("user_id", "entity_id").agg(pl.col("stage_rank").max().alias("r")) \
        .with_columns((2.0 ** (pl.col("r") - target_rank).cast(pl.Float32)).alias("w"))


@dataclass
class FunnelTables:
    """What a scorer's candidates are built from, at one as-of time: ``source`` (open-funnel pairs,
    :func:`open_funnel`), ``entities`` and ``users`` (statistics), ``base`` (the view base) and
    ``popular`` (entity ids, most converted first). Built from a view's events for training
    (:meth:`of_view`) or read from ``funnel/`` for serving (hir/funnel/serve.py)."""

    source: pl.DataFrame
    entities: pl.DataFrame
    users: pl.DataFrame
    base: ViewBase
    popular: np.ndarray
    use_time: bool = True

    @classmethod
    def of_view(cls, view: pl.DataFrame, asof: datetime, target_rank: int, n_users: int, n_entities: int,
                config: FunnelConfig, seed: int) -> FunnelTables:
        lazy = view.lazy()
        entities = entity_stats(lazy, target_rank, asof).collect()
        weight = view_weights(view, target_rank)
        return cls(
            source=open_funnel(lazy, target_rank, asof).collect(),
            entities=entities,
            users=user_stats(lazy, asof, target_rank).collect(),
            base=ViewBase.fit(weight, n_users, n_entities, config.rank, config.ideal, seed),
            popular=popular_entities(entities, config.popular),
            use_time=config.use_time,
        )

    def history(self, users: np.ndarray, n_users: int, n_entities: int) -> sp.csr_matrix:
        """(n_users, n_entities) CSR of the pairs of ``users`` (what discovery masks)."""
        return pair_matrix(self.source.join(pl.DataFrame({"user_id": users.astype(np.int64)}), on="user_id", how="semi"),
                           n_users, n_entities)

    def base_discovery(self, users: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
        """(len(users), d) ids and scores of the view base's top ``d`` new to each of ``users``
        (their history masked): the discovery source when no other is given."""
        return self.base.topk(users, self.history(users, *self.base_shape), d)

    def candidates(self, users: np.ndarray, config: FunnelConfig, targets: pl.DataFrame | None = None,
                   discovery: tuple[np.ndarray, np.ndarray] | None = None) -> Candidates:
        """The candidates of ``users`` (sorted ids); ``discovery``: (U, D) ids and scores of
        another discovery source (an ANN search), else the view base's new-to-user top D."""
        if discovery is None:
            discovery = self.base_discovery(users, config.discovery)
        rows = build_candidates(self.source, users, discovery[0], discovery[1], self.popular, self.entities, self.users,
                                config.max_funnel)
        # the user-entity affinity of every candidate, history ones included (discovery masks
        # them): how a cart fits the rest of the user's engagement
        rows = rows.with_columns(pl.Series("base_score", self.base.pair_scores(rows["user_id"].to_numpy(),
                                                                               rows["entity_id"].to_numpy())))
        if config.affinity_context > 0:
            rows = pl.concat([rows, context_affinity(rows, self.source, self.base.entities, config.affinity_context,
                                                     self.use_time)], how="horizontal")
        else:
            rows = rows.with_columns(pl.lit(0.0, pl.Float32).alias(c) for c in AFFINITY)
        if config.neighbours > 0:
            # what the user's nearest users (by time-decayed item shares) buy
            rows = pl.concat([rows, neighbour_share(rows, self.source, *self.base_shape, config.neighbours,
                                                    config.neighbour_decay, self.use_time)], how="horizontal")
        else:
            rows = rows.with_columns(pl.lit(0.0, pl.Float32).alias(c) for c in NEIGHBOUR)
        if not self.use_time:
            rows = rows.with_columns(pl.lit(None, pl.Float32).alias(c) for c in TIME_COLUMNS)
        if targets is not None:
            tgt = targets.select("user_id", "entity_id").unique()
            rows = rows.join(tgt.with_columns(pl.lit(1.0, pl.Float32).alias("y")), on=["user_id", "entity_id"], how="left")
            total = tgt.group_by("user_id").len()
        else:
            rows = rows.with_columns(pl.lit(None, pl.Float32).alias("y"))
            total = pl.DataFrame({"user_id": [], "len": []}, schema={"user_id": pl.Int64, "len": pl.UInt32})
        rows = rows.with_columns(pl.col("y").fill_null(0.0)).sort("user_id", "entity_id")
        counts = rows.group_by("user_id", maintain_order=True).len()
        offsets = np.concatenate([[0], np.cumsum(counts["len"].to_numpy())]).astype(np.int64)
        tot = counts.join(total.rename({"len": "t"}), on="user_id", how="left")["t"].fill_null(0).to_numpy()
        users = counts["user_id"].to_numpy()
        context = None
        if config.scorer.heads:
            ctx = user_context(self.source, users, config.scorer.context)
            context = Context.of(rows, offsets, users, ctx, self.base.entities, self.use_time)
        return Candidates(rows, feature_matrix(rows), rows["y"].to_numpy().astype(np.float32), offsets,
                          tot.astype(np.float32), users, context)

    @property
    def base_shape(self) -> tuple[int, int]:
        return self.base.users.shape[0], self.base.entities.shape[0]


def popular_entities(entities: pl.DataFrame, n: int) -> np.ndarray:
    """The ``n`` entities with the most converting users (then the most users), ids ascending on ties."""
    return entities.sort(["entity_buyers", "entity_users", "entity_id"], descending=[True, True, False]) \
        ["entity_id"].head(n).to_numpy()


def _hashed(pairs: pl.DataFrame, share: float, seed: int) -> pl.Expr:
    """True for a seeded share of (user_id, entity_id) pairs, by a hash of the pair."""
    h = pl.struct("user_id", "entity_id").hash(seed=seed)
    return (h % 1_000_003) < int(share * 1_000_003)


def training_views(events: pl.DataFrame, target_rank: int, kind: str, val_start: datetime, test_start: datetime,
                   config: FunnelConfig, seed: int, n_views: int | None = None,
                   ) -> list[tuple[pl.DataFrame, datetime, pl.DataFrame]]:
    """(view events, asof, target pairs) of every training view (module doc), latest first.
    ``events``: the visible events (before the test period) of the entity type; ``n_views``:
    next_period cuts (default ``config.cuts``; the period check asks one more)."""
    if kind == "next_period":
        period = test_start - val_start
        out = []
        for i in range(config.cuts if n_views is None else n_views):
            cut = val_start - i * period
            view = events.filter(pl.col("timestamp") < cut)
            nxt = events.filter((pl.col("timestamp") >= cut) & (pl.col("timestamp") < cut + period)
                                & (pl.col("stage_rank") >= target_rank))
            if view.height and nxt.height:
                out.append((view, cut - timedelta(microseconds=1), nxt.select("user_id", "entity_id").unique()))
        return out
    converted = events.filter(pl.col("stage_rank") >= target_rank).select("user_id", "entity_id").unique()
    hidden = converted.filter(_hashed(converted, config.drop, seed))
    whole = hidden.filter(_hashed(hidden, config.whole, seed + 1))
    deep_of_hidden = events.join(hidden, on=["user_id", "entity_id"], how="semi").filter(pl.col("stage_rank") >= target_rank)
    view = events.join(deep_of_hidden.select("user_id", "entity_id", "stage_rank", "timestamp"),
                       on=["user_id", "entity_id", "stage_rank", "timestamp"], how="anti") \
        .join(whole, on=["user_id", "entity_id"], how="anti")
    return [(view, test_start - timedelta(microseconds=1), hidden)]


def choose_task(kind: str, split_mode: str) -> str:
    """``auto`` -> next_period on data with real time (temporal split modes), else denoise."""
    if kind not in TASKS:
        raise ValueError(f"funnel.task={kind!r}; expected one of {list(TASKS)}")
    if kind != "auto":
        return kind
    return "next_period" if split_mode.startswith("temporal") else "denoise"


@dataclass
class FunnelModel:
    """A trained scorer and how its candidates are built."""

    scorer: FunnelScorer | BoostedScorer
    config: FunnelConfig
    target_rank: int
    record: dict[str, Any]

    def rank(self, cands: Candidates, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(U, k) entity ids and scores per user of ``cands.users`` (best first; -1 = empty)."""
        return top_per_user(cands, self.score(cands), k)

    def score(self, cands: Candidates) -> np.ndarray:
        """(n,) scores of every candidate row."""
        return score_candidates(self.scorer, cands)


def score_candidates(scorer: FunnelScorer | BoostedScorer, cands: Candidates) -> np.ndarray:
    """(n,) scores of every row of ``cands`` by either kind of scorer."""
    if isinstance(scorer, BoostedScorer):
        return scorer.score(cands.x, offsets=cands.offsets)
    return scorer.score(cands.x, cands.context)


def top_per_user(cands: Candidates, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(U, k) entity ids and scores of each user's highest-scoring candidates."""
    ent = cands.rows["entity_id"].to_numpy()
    ids = np.full((len(cands.users), k), -1, np.int64)
    vals = np.full((len(cands.users), k), -np.inf, np.float32)
    for r in range(len(cands.users)):
        lo, hi = cands.offsets[r], cands.offsets[r + 1]
        order = np.argsort(-scores[lo:hi], kind="stable")[:k]
        ids[r, : len(order)] = ent[lo:hi][order]
        vals[r, : len(order)] = scores[lo:hi][order]
    return ids, vals


@dataclass
class TrainingSet:
    """Every training view's candidates, concatenated: ``x`` (n, F), ``y`` (n,), ``offsets`` (G + 1,)
    and ``total`` (G,) per group (a user in a view), ``context`` (the head's inputs, or None) and
    ``record`` (the task, the views, the reachable share of targets)."""

    x: np.ndarray
    y: np.ndarray
    offsets: np.ndarray
    total: np.ndarray
    context: Context | None
    record: dict[str, Any]


def view_sets(events: pl.DataFrame, target_rank: int, kind: str, val_start: datetime, test_start: datetime,
              n_users: int, n_entities: int, config: FunnelConfig, seed: int, n_views: int | None = None,
              ) -> tuple[list[Candidates], list[dict[str, Any]]]:
    """The candidates of every training view (:func:`training_views`, latest first) and a record
    of each (as-of time, users, targets)."""
    views = training_views(events, target_rank, kind, val_start, test_start, config, seed, n_views)
    if not views:
        raise ValueError(f"funnel task {kind}: no view with next-period {target_rank=} targets; "
                         "set funnel.task=denoise")
    gen = np.random.default_rng(seed)
    parts, record = [], []
    for view, asof, targets in views:
        users = np.unique(targets["user_id"].to_numpy())
        if config.max_train_users and len(users) > config.max_train_users:
            users = np.sort(gen.choice(users, config.max_train_users, replace=False))
        parts.append(view_candidates(view, users, asof, target_rank, n_users, n_entities, config, seed, targets))
        record.append({"asof": asof.isoformat(), "users": len(np.unique(targets["user_id"].to_numpy())),
                       "targets": targets.height})
        log.info("funnel view at %s: %d users, %d candidates, %.1f%% of targets reachable", asof, len(users),
                 parts[-1].rows.height, 100 * parts[-1].y.sum() / max(parts[-1].total.sum(), 1))
    return parts, record


def concat_views(parts: list[Candidates], kind: str, views: list[dict[str, Any]]) -> TrainingSet:
    """One training set of the views' candidates ``parts`` (their groups in order)."""
    y = np.concatenate([p.y for p in parts])
    total = np.concatenate([p.total for p in parts])
    offsets, start = [np.zeros(1, np.int64)], 0
    for p in parts:
        offsets.append(p.offsets[1:] + start)
        start += p.offsets[-1]
    context = Context.concat([p.context for p in parts]) if all(p.context is not None for p in parts) else None
    record = {"task": kind, "views": views, "reachable": float(y.sum() / max(total.sum(), 1)), "features": list(FEATURES)}
    return TrainingSet(np.concatenate([p.x for p in parts]), y, np.concatenate(offsets), total, context, record)


def training_set(events: pl.DataFrame, target_rank: int, split_mode: str, val_start: datetime, test_start: datetime,
                 n_users: int, n_entities: int, config: FunnelConfig, seed: int) -> TrainingSet:
    """The scorer's training candidates from the training views of ``events`` (the visible events
    of the entity type: every row before the test period)."""
    kind = choose_task(config.task, split_mode)
    parts, views = view_sets(events, target_rank, kind, val_start, test_start, n_users, n_entities, config, seed)
    return concat_views(parts, kind, views)


def fit_training_set(train: TrainingSet, config: ScorerConfig, seed: int, check_set: CheckSet | None = None,
                     stop_at: int | None = None) -> tuple[FunnelScorer | BoostedScorer, dict[str, Any]]:
    """The scorer of ``config.kind`` fitted on ``train`` and the record of its fit (``check_set``,
    ``stop_at``: :func:`hir.funnel.scorer.fit_scorer`)."""
    if config.kind not in SCORERS:
        raise ValueError(f"funnel.config.scorer.kind={config.kind!r}; expected one of {list(SCORERS)}")
    if config.kind == "gbdt":
        if config.heads:
            raise ValueError("funnel.config.scorer.heads > 0 is the MLP's target-aware head; set heads=0 with kind=gbdt")
        return fit_boosted(train.x, train.y, train.offsets, train.total, config, seed, list(train.record["features"]),
                           check_set, stop_at)
    return fit_scorer(train.x, train.y, train.offsets, train.total, config, seed, train.context, check_set, stop_at)


def check_set(cands: Candidates) -> CheckSet:
    """The check inputs of one view's candidates."""
    return CheckSet(cands.x, cands.y, cands.offsets, cands.total, cands.context)


def fit_period(parts: list[Candidates], views: list[dict[str, Any]], kind: str, config: ScorerConfig, seed: int,
               refit: bool, refit_all: bool = False,
               ) -> tuple[FunnelScorer | BoostedScorer, dict[str, Any], FunnelScorer | BoostedScorer]:
    """The period check (module doc): fit on the views ``parts[1:]``, check on ``parts[0]`` (the
    latest view, its targets the val period), then refit on ``parts[:-1]`` (``refit_all``: on
    every view) at the chosen step (``refit``) or keep the checked fit. ``parts``: ``cuts + 1``
    views, latest first. Returns the scorer, its record and the checked fit (the scorer itself
    without ``refit``)."""
    if len(parts) < 2:
        raise ValueError(f"funnel.config.select=period needs a view before the val one; got {len(parts)} "
                         "(no earlier period with conversions: set funnel.config.select=holdout)")
    early = concat_views(parts[1:], kind, views[1:])
    scorer, record = fit_training_set(early, config, seed, check_set=check_set(parts[0]))
    record = record | {"select": "period", "check_view": views[0]}
    if not refit:
        return scorer, record | early.record | {"refit": False}, scorer
    n = len(parts) if refit_all else len(parts) - 1
    late = concat_views(parts[:n], kind, views[:n])
    refitted, rec = fit_training_set(late, config, seed, stop_at=max(int(record["best_step"]), 1))
    return refitted, record | late.record | {"refit": True, "refit_fit": rec}, scorer


def fit_funnel(events: pl.DataFrame, target_rank: int, split_mode: str, val_start: datetime, test_start: datetime,
               n_users: int, n_entities: int, config: FunnelConfig, seed: int) -> FunnelModel:
    """Train the scorer on the training views of ``events``, checked as ``config.select`` says."""
    if config.select not in SELECTS:
        raise ValueError(f"funnel.config.select={config.select!r}; expected one of {list(SELECTS)}")
    kind = choose_task(config.task, split_mode)
    if config.select == "period" and kind == "next_period":
        parts, views = view_sets(events, target_rank, kind, val_start, test_start, n_users, n_entities, config, seed,
                                 config.cuts + 1)
        if len(parts) > 1:
            scorer, record, _ = fit_period(parts, views, kind, config.scorer, seed, config.refit)
            return FunnelModel(scorer, config, target_rank, record)
        # a log too short for a view before the val one: the val view's held-out users check it
        log.warning("funnel: no conversions before %s to fit on ahead of the val period; checked on held-out users",
                    views[0]["asof"])
        train = concat_views(parts, kind, views)
        scorer, record = fit_training_set(train, config.scorer, seed)
        return FunnelModel(scorer, config, target_rank, record | train.record | {"select": "holdout (one view)"})
    train = training_set(events, target_rank, split_mode, val_start, test_start, n_users, n_entities, config, seed)
    scorer, record = fit_training_set(train, config.scorer, seed)
    return FunnelModel(scorer, config, target_rank, record | train.record | {"select": "holdout"})
