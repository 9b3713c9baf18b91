"""The split of the canonical events, decided once before any engine builds the snapshot.

Four modes, chosen by what the dataset gives (``RawDataset.has_timestamps``, ``RawDataset.heldout``):

- ``temporal``: real timestamps; val/test are the last ``val_fraction``/``test_fraction`` of
  events by time, or start at the configured ``val_start``/``test_start``.
- ``temporal_heldout``: real timestamps and a shipped test file. The test split is that file,
  exactly; ``test_start`` is its earliest event, and every event of the train file must be
  earlier (else the files are not a temporal split: an error says so). Val is the latest
  ``val_fraction`` of the train file's events by time, so the split stays temporal.
- ``random_pairs``: no timestamps. A seeded random split of the (user, entity) *pairs*: every
  event of a pair lands in the same split, so a user's repeated engagement with one item never
  straddles train and test (that would leak the answer). ``val_fraction``/``test_fraction`` are
  shares of the pairs.
- ``random_pairs_heldout``: no timestamps and a shipped test file: test is that file, exactly;
  val is a seeded ``val_fraction`` of the train file's pairs.

Without timestamps the snapshot still has them (the contract, training's recency buckets and
evaluation's periods need them): each event gets a seeded random time inside its split's window
of a synthetic calendar that starts at ``synthetic_start`` and spans ``synthetic_days``, with
windows train < val < test in that order, each as long as its share of the events. The split
bounds are those window edges, so every later stage sees a consistent temporal split; the times
carry no order information. ``meta.json`` records all of this under ``split``.

Randomness comes from numpy's PCG64 seeded with ``seed`` over pairs in sorted key order and
events in input order, so a seed gives the same split on every machine and either engine.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import polars as pl

from hir.data import steps
from hir.data.schema import TS
from hir.errors import InputError

log = logging.getLogger(__name__)

PAIR = ["user_key", "entity_type", "entity_key"]
MODES = ("temporal", "temporal_heldout", "random_pairs", "random_pairs_heldout")


@dataclass(frozen=True)
class SplitSpec:
    """``data.split`` of the config.

    Args:
        val_fraction: share of events (temporal) or pairs (random) for val.
        test_fraction: share for test; unused when the dataset ships its test file.
        val_start: temporal only: ISO date val starts (with ``test_start``; overrides fractions).
        test_start: temporal only: ISO date test starts.
        seed: seed of the random split and of synthesized times (the data's own seed, so a
            training-seed sweep keeps the split).
        synthetic_start: ISO date the synthesized calendar starts (no timestamps only).
        synthetic_days: length of that calendar in days.
    """

    val_fraction: float = 0.1
    test_fraction: float = 0.1
    val_start: str | None = None
    test_start: str | None = None
    seed: int = 0
    synthetic_start: str = "2000-01-01"
    synthetic_days: float = 100.0

    @classmethod
    def from_config(cls, cfg: Any) -> SplitSpec:
        """From a ``data.split`` mapping; keys it lacks keep their defaults."""
        fields = set(cls.__dataclass_fields__)
        given = {k: cfg[k] for k in cfg if k in fields and cfg[k] is not None}
        unknown = sorted(set(cfg) - fields)
        if unknown:
            raise InputError(f"data.split has unknown keys {unknown}; expected some of {sorted(fields)}")
        return cls(**given)


@dataclass
class SplitPlan:
    """Canonical events with a timestamp on every row and the split bounds to label them by.

    ``bounds`` has ``val_start``, ``test_start``, ``min`` and ``max``; ``info`` goes to
    ``meta.json`` as ``split``.
    """

    events: pl.LazyFrame
    bounds: dict[str, datetime]
    info: dict[str, Any] = field(default_factory=dict)


def plan(
    events: pl.LazyFrame,
    spec: SplitSpec,
    has_timestamps: bool = True,
    heldout: pl.LazyFrame | None = None,
    sources: tuple[str, str] = ("events", "heldout test events"),
) -> SplitPlan:
    """Decide the split (see the module doc); ``sources`` name the two files in errors."""
    if heldout is not None and heldout.select(pl.len()).collect().item() == 0:
        raise InputError(
            f"the shipped test file ({sources[1]}) has no event rows that survived validation; see its quarantine"
        )
    if has_timestamps and heldout is None:
        return _temporal(events, spec)
    if has_timestamps:
        return _temporal_heldout(events, heldout, spec, sources)
    return _random_pairs(events, heldout, spec)


def _temporal(events: pl.LazyFrame, spec: SplitSpec) -> SplitPlan:
    if spec.val_start and spec.test_start:
        row = events.select(pl.col("timestamp").min().alias("min"), pl.col("timestamp").max().alias("max"))
        bounds = row.collect(engine="streaming").row(0, named=True)
        for name, value in (("val_start", spec.val_start), ("test_start", spec.test_start)):
            bounds[name] = _utc(datetime.fromisoformat(value))
        info = {"mode": "temporal", "val_start": spec.val_start, "test_start": spec.test_start}
    else:
        bounds = steps.split_bounds_from_quantiles(events, spec.val_fraction, spec.test_fraction)
        info = {"mode": "temporal", "val_fraction": spec.val_fraction, "test_fraction": spec.test_fraction}
    return SplitPlan(events, bounds, info | {"timestamps": "source"})


def _temporal_heldout(
    events: pl.LazyFrame, heldout: pl.LazyFrame, spec: SplitSpec, sources: tuple[str, str]
) -> SplitPlan:
    if not 0 <= spec.val_fraction < 1:
        raise InputError(f"data.split.val_fraction={spec.val_fraction} must be in [0, 1)")
    ts = pl.col("timestamp")
    train = events.select(ts.min().alias("min"), ts.max().alias("max"), ts.cast(pl.Int64).quantile(
        1 - spec.val_fraction, "higher").cast(TS).alias("val_start")).collect().row(0, named=True)
    test = heldout.select(ts.min().alias("min"), ts.max().alias("max")).collect().row(0, named=True)
    if train["max"] >= test["min"]:
        raise InputError(
            f"the shipped test file ({sources[1]}) starts at {test['min']} but the train file ({sources[0]}) has "
            f"events until {train['max']}: with timestamps the test file must come after the train file. If the "
            "files are not a temporal split, drop the timestamps (data.columns.timestamp=null): val is then a "
            "seeded random share of the train pairs and the times are synthesized"
        )
    val_start = train["val_start"] if spec.val_fraction > 0 else test["min"]
    bounds = {"min": train["min"], "max": test["max"], "val_start": val_start, "test_start": test["min"]}
    info = {"mode": "temporal_heldout", "val_fraction": spec.val_fraction, "test": "shipped file", "timestamps": "source"}
    return SplitPlan(pl.concat([events, heldout], how="vertical_relaxed"), bounds, info)


def _random_pairs(events: pl.LazyFrame, heldout: pl.LazyFrame | None, spec: SplitSpec) -> SplitPlan:
    test_fraction = 0.0 if heldout is not None else spec.test_fraction
    if not (0 <= spec.val_fraction < 1 and 0 <= test_fraction < 1 and spec.val_fraction + test_fraction < 1):
        raise InputError(
            f"data.split fractions val={spec.val_fraction}, test={test_fraction} must be in [0, 1) with val+test < 1"
        )
    if heldout is None and test_fraction == 0:
        raise InputError("data.split.test_fraction must be > 0 when the dataset ships no test file")
    frame = events.collect()
    split = random_pair_split(frame.select(PAIR), spec.val_fraction, test_fraction, spec.seed)
    frame = frame.with_columns(split.alias("_split"))
    if heldout is not None:
        frame = pl.concat([frame, heldout.collect().with_columns(pl.lit("test").alias("_split"))], how="vertical_relaxed")
    timestamps, bounds = synthesize_timestamps(frame["_split"], spec)
    frame = frame.with_columns(timestamps.alias("timestamp")).drop("_split")
    pairs = frame.select(PAIR).n_unique()
    info = {
        "mode": "random_pairs_heldout" if heldout is not None else "random_pairs",
        "unit": "(user, entity) pair",
        "seed": spec.seed,
        "val_fraction": spec.val_fraction,
        "test_fraction": test_fraction if heldout is None else None,
        "test": "shipped file" if heldout is not None else "random pairs",
        "pairs": pairs,
        "timestamps": "synthesized",
        "synthetic_start": spec.synthetic_start,
        "synthetic_days": spec.synthetic_days,
    }
    log.info(
        "no timestamps: %s split of %d pairs (seed %d); times synthesized in windows train < %s <= val < %s <= test",
        info["mode"], pairs, spec.seed, bounds["val_start"].isoformat(), bounds["test_start"].isoformat(),
    )
    return SplitPlan(frame.lazy(), bounds, info)


def random_pair_split(pairs: pl.DataFrame, val_fraction: float, test_fraction: float, seed: int) -> pl.Series:
    """``split`` per row of ``pairs`` (one row per event, columns of :data:`PAIR`): the distinct
    pairs, in sorted key order, are shuffled with ``seed``; the first ``round(test_fraction * P)``
    are test, the next ``round(val_fraction * P)`` val, the rest train."""
    distinct = pairs.unique().sort(PAIR)
    n = distinct.height
    n_test, n_val = round(test_fraction * n), round(val_fraction * n)
    rank = np.empty(n, np.int64)
    rank[np.random.default_rng(seed).permutation(n)] = np.arange(n)
    label = np.where(rank < n_test, "test", np.where(rank < n_test + n_val, "val", "train"))
    distinct = distinct.with_columns(pl.Series("_split", label))
    return pairs.join(distinct, on=PAIR, how="left", maintain_order="left")["_split"]


def synthesize_timestamps(split: pl.Series, spec: SplitSpec) -> tuple[pl.Series, dict[str, datetime]]:
    """A seeded random time per event inside its split's window, and the window edges as bounds.

    The calendar ``[synthetic_start, + synthetic_days)`` is cut into train, val and test windows
    in that order, each as long as its share of the events.
    """
    labels = split.to_numpy()
    n = len(labels)
    start = _utc(datetime.fromisoformat(spec.synthetic_start))
    span_us = int(spec.synthetic_days * 86_400e6)
    if span_us <= n:
        raise InputError(f"data.split.synthetic_days={spec.synthetic_days} is too short for {n} events")
    counts = {s: int((labels == s).sum()) for s in ("train", "val", "test")}
    length = {s: span_us * c // max(n, 1) for s, c in counts.items()}
    offset = {"train": 0, "val": length["train"], "test": length["train"] + length["val"]}
    u = np.random.default_rng([spec.seed, 1]).random(n)
    us = np.zeros(n, np.int64)
    for s in ("train", "val", "test"):
        mask = labels == s
        us[mask] = offset[s] + np.floor(u[mask] * length[s]).astype(np.int64)
    base = int((start - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(microseconds=1))
    times = pl.Series("timestamp", us + base).cast(pl.Datetime("us")).dt.replace_time_zone("UTC")
    bounds = {
        "min": start,
        "max": start + timedelta(microseconds=span_us),
        "val_start": start + timedelta(microseconds=offset["val"]),
        "test_start": start + timedelta(microseconds=offset["test"]),
    }
    if n:
        bounds["min"], bounds["max"] = times.min(), times.max()
    return times, bounds


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value
