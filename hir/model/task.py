"""The learner's training task: a view of the train split and targets the view never saw.

The learner is trained as it is tested. Test asks: from everything visible before the test
period, which entities will a user engage with next that it has not engaged with before? The
training task asks the same question inside the train split, so that nothing the network reads
contains its answer:

- ``next_period`` (data with real time, split modes ``temporal*``): a cut-off ``t_k`` one
  window ``W`` before the val split (``W`` = the val period's length unless set). The *view* is
  every train *event* at or before ``t_k``, aggregated into engagement rows as prepare does (so
  a pair's repeats, later stages and counts after the cut are not in it); the *targets* are the
  deep-stage engagements in ``(t_k, t_k + W]`` of pairs new to the user (first engaged after
  ``t_k``). The base, the contexts and the masked items all come from the view.
- ``denoise`` (no real time: ``random_pairs*`` splits, or too few next-period targets): a
  seeded share ``drop`` of the train *pairs* (every event of a pair, by a hash of the pair, so
  removing one pair never moves another) is hidden; the view is the rest, the targets are the
  hidden pairs' deep-stage engagements (the EDLAE / Mult-DAE objective, over the masked catalogue).

The task is a :class:`TaskSnapshot`: the snapshot with its engagement relabelled (view ->
``train``, targets -> ``val``, everything else -> ``test``) and its split bounds moved to the
cut-off, so :func:`hir.model.load_graph` builds the view's store and
:func:`hir.model.validation_set` its targets, exactly as for the real val split. Because the view
holds no event of a target pair, removing a target pair from the snapshot changes the labels and
nothing else, and removing every train event after the cut changes no input at all
(tests/model/test_task.py proves both).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import polars as pl

from hir.data.schema import ENTITY_TYPES
from hir.data.snapshot import Snapshot
from hir.errors import HirError

KINDS = ("auto", "next_period", "denoise")
TEMPORAL_MODES = ("temporal", "temporal_heldout")


@dataclass
class TaskConfig:
    """How the training task is cut (``datamodule.task``).

    kind: ``next_period``, ``denoise`` or ``auto`` (next_period on data with real time when it
    yields at least ``min_targets`` target pairs, else denoise); window_days: W of next_period
    (None = the val period's length); drop: the share of train pairs denoise hides;
    min_targets: fewest target pairs a next-period cut must give; users: target users per
    batch (sampled uniformly: the test averages per user); passes: planned passes over the
    target users (sizes the schedule: warm-up and decay happen inside it); min_steps, max_steps:
    bounds of the planned optimiser steps.
    """

    kind: str = "auto"
    window_days: float | None = None
    drop: float = 0.2
    min_targets: int = 500
    users: int = 256
    passes: float = 20.0
    min_steps: int = 200
    max_steps: int = 2000

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise HirError(f"datamodule.task.kind={self.kind!r}; expected one of {list(KINDS)}")
        if not 0.0 < float(self.drop) < 1.0:
            raise HirError(f"datamodule.task.drop={self.drop}; expected a share in (0, 1), e.g. 0.2")

    def planned_steps(self, n_target_users: int) -> int:
        """Optimiser steps of the schedule: ``passes`` over the target users, within the bounds."""
        steps = round(float(self.passes) * n_target_users / max(int(self.users), 1))
        return int(min(max(steps, int(self.min_steps)), int(self.max_steps)))


def _iso(t: datetime) -> str:
    return t.isoformat()


class TaskSnapshot(Snapshot):
    """``snap`` with its engagement relabelled into the task's splits (module doc).

    Args:
        snap: the real snapshot.
        kind: ``next_period`` or ``denoise``.
        cut, window_end: next_period's ``t_k`` and ``t_k + W``.
        drop, seed: denoise's hidden share and the seed of its pair hash.
    """

    def __init__(self, snap: Snapshot, kind: str, cut: datetime | None = None, window_end: datetime | None = None,
                 drop: float = 0.2, seed: int = 0) -> None:
        bounds = dict(snap.split_bounds)
        if kind == "next_period":
            bounds["val_start"], bounds["test_start"] = _iso(cut), _iso(window_end)
        meta = {**snap.meta, "split_bounds": bounds, "task": {"kind": kind}}
        super().__init__(snap.dir, meta)
        self.real, self.kind, self.cut, self.window_end = snap, kind, cut, window_end
        self.drop, self.seed = float(drop), int(seed)

    def engagement(self, entity_type: str) -> pl.LazyFrame | None:
        scan = self.real.engagement(entity_type)
        if scan is None:
            return None
        if self.kind == "next_period":
            return self._next_period(entity_type)
        train = pl.col("split") == "train"
        # denoise: a pair is hidden by a hash of (type, user, entity) alone, so no pair's
        # membership depends on any other pair of the snapshot
        t = ENTITY_TYPES.index(entity_type)  # types hash apart even where their ids coincide
        h = pl.struct(pl.col("src_id"), pl.col("dst_id")).hash(seed=self.seed * 1009 + t)
        hidden = (h % 1_000_003).cast(pl.Float64) / 1_000_003 < self.drop
        split = pl.when(train & ~hidden).then(pl.lit("train")).when(train).then(pl.lit("val")).otherwise(pl.lit("test"))
        return scan.with_columns(split.alias("split"))

    def _next_period(self, entity_type: str) -> pl.LazyFrame:
        """next_period's engagement rows, rebuilt from the snapshot's events as prepare builds
        them (one row per (user, entity, stage, split): count, first and last time, value sum;
        :func:`hir.data.steps.aggregate_edges`), with each *event* labelled:

        - ``train`` (the view): train events at or before the cut. A pair's repeats, later stages
          and counts inside the target window are not the view's: an edge row of the real snapshot
          totals the whole train period, so relabelling rows would carry them into the view (at
          age 0, in the newest recency bucket, moving the bucket edges, the half-life, the exposure
          and the trend factor);
        - ``val`` (the targets): train events in ``(cut, window_end]`` of pairs new to the user (no
          train event at or before the cut, of any stage);
        - ``test``: everything else (the window's events of view pairs, the real val and test).
        """
        ts = pl.Datetime("us", "UTC")
        cut = pl.lit(self.cut).cast(ts)
        end = pl.lit(self.window_end).cast(ts)
        events = (self.real.scan_events().filter(pl.col("entity_type") == entity_type)
                  .select(pl.col("user_id").alias("src_id"), pl.col("entity_id").alias("dst_id"),
                          pl.col("stage").cast(pl.String), pl.col("split").cast(pl.String),
                          pl.col("timestamp").cast(ts), pl.col("value").cast(pl.Float64)))
        train = pl.col("split") == "train"
        before = train & (pl.col("timestamp") <= cut)
        seen = before.any().over("src_id", "dst_id")  # the pair is in the view
        split = (pl.when(before).then(pl.lit("train"))
                 .when(train & ~seen & (pl.col("timestamp") <= end)).then(pl.lit("val"))
                 .otherwise(pl.lit("test")))
        return (events.with_columns(split.alias("split"))
                .group_by("src_id", "dst_id", "stage", "split")
                .agg(pl.len().cast(pl.UInt32).alias("count"), pl.col("timestamp").min().alias("first_ts"),
                     pl.col("timestamp").max().alias("last_ts"), pl.col("value").sum().alias("value"))
                .sort("src_id", "dst_id", "stage", "split"))


def count_targets(task: TaskSnapshot, deep_stage: str) -> int:
    """Deep-stage target rows of a task snapshot (its relabelled ``val`` split)."""
    total = 0
    for t in task.engaged_types():
        scan = task.engagement(t)
        total += int(scan.filter((pl.col("split") == "val") & (pl.col("stage") == deep_stage)).select(pl.len())
                     .collect().item())
    return total


def task_snapshot(snap: Snapshot, config: TaskConfig, seed: int) -> tuple[TaskSnapshot, dict[str, Any]]:
    """The training task of ``snap`` (module doc) and a report of how it was cut: ``kind``, the
    cut-off and window (next_period), the hidden share (denoise), target rows, and why
    ``auto`` chose what it chose."""
    mode = str((snap.meta.get("split") or {}).get("mode", ""))
    report: dict[str, Any] = {"split_mode": mode or None}
    kind = config.kind
    if kind in ("auto", "next_period"):
        if mode and mode not in TEMPORAL_MODES:
            if kind == "next_period":
                raise HirError(f"datamodule.task.kind=next_period needs real event times, but {snap.meta_path} has "
                               f"split mode {mode!r}; use datamodule.task.kind=denoise (or auto)")
            report["why"] = f"split mode {mode!r} has no real time"
            kind = "denoise"
        else:
            val_start, test_start = snap.val_start, snap.test_start
            w = timedelta(days=float(config.window_days)) if config.window_days else test_start - val_start
            cut = val_start - w
            task = TaskSnapshot(snap, "next_period", cut, val_start)
            n = count_targets(task, snap.deep_stage)
            report |= {"cut": _iso(cut), "window_days": round(w.total_seconds() / 86400, 3), "targets": n}
            if n >= int(config.min_targets) or kind == "next_period":
                return task, report | {"kind": "next_period"}
            report["why"] = f"next_period gave {n} target rows < datamodule.task.min_targets={config.min_targets}"
            kind = "denoise"
    task = TaskSnapshot(snap, "denoise", drop=config.drop, seed=seed)
    return task, report | {"kind": "denoise", "drop": float(config.drop), "targets": count_targets(task, snap.deep_stage)}
