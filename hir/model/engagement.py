"""The engagement graph: visible user <-> entity pairs with their sampling weights.

Engagement edges are *visible* only from the given splits (training: ``train``). Each visible
(user, entity) pair is one CSR entry in both directions, with the pair's deepest funnel stage
``r`` (0 = shallowest), total count and last timestamp. A context draws a pair with weight

    w = stage_base ** r * 2 ** (-age_days / half_life) * log1p(count)

(deeper, more recent, more repeated first), and each entry carries its stage (1..S), a recency
bucket (1..N_RECENCY, at the quartiles of the visible ages), ``log1p(count)`` and its age over
the visible window. The deep-funnel pairs (deepest stage, visible) are the training targets,
drawn ~ (deep-stage events of the pair) ** ``pair_power``; the val split's deep pairs are the
validation positives.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np
import polars as pl

from hir.data.schema import ENTITY_TYPES
from hir.data.snapshot import Snapshot
from hir.errors import InputError
from hir.model.csr import CSR

N_RECENCY = 4
SECONDS_PER_DAY = 86400.0


@dataclass
class Engagement:
    """What the snapshot's visible engagement gives the store (global node ids)."""

    eng: CSR  # user -> entity and entity -> user
    exposure: np.ndarray  # (n,) float64 visible engagement events per node (popularity)
    deep_pairs: np.ndarray  # (P, 2) int64 (user, entity) visible deep-stage pairs
    deep_weight: np.ndarray  # (P,) float64 their sampling weight, (deep-stage events) ** pair_power
    val_pairs: np.ndarray  # (V, 2) int64 (user, entity) deep-stage edges of the val split
    engaged: np.ndarray  # (T,) int64 nodes with visible engagement (with repeats): the warm ones
    recency_edges: list[float]  # recency bucket boundaries (days)
    half_life: float  # recency decay of the weights (days)


def iso_seconds(value: str) -> float:
    """Seconds since the epoch of an ISO time (the split bounds of a snapshot)."""
    return datetime.fromisoformat(value).timestamp()


def _recency_edges(age_days: np.ndarray) -> list[float]:
    """Bucket boundaries (days) at the 25/50/75% quantiles of visible edge ages."""
    if len(age_days) == 0:
        return [1.0, 7.0, 30.0]
    return [float(x) for x in np.quantile(age_days, [0.25, 0.5, 0.75])]


def span_days(start: str, end: str) -> float:
    """Days between two ISO times (at least 1e-6: ages are fractions of it)."""
    return max((iso_seconds(end) - iso_seconds(start)) / SECONDS_PER_DAY, 1e-6)


def visible_end(snap: Snapshot, visible_splits: tuple[str, ...]) -> str:
    """ISO time the visible engagement ends: ``test_start`` when val is visible, else ``val_start``."""
    bounds = snap.split_bounds
    return bounds["test_start"] if "val" in visible_splits else bounds["val_start"]


def load_engagement(snap: Snapshot, offsets: np.ndarray, visible_splits: tuple[str, ...], stage_base: float,
                    half_life_days: float | None, pair_power: float) -> Engagement:
    """Read every ``user__engages__<type>`` of ``snap`` (module doc).

    Args:
        offsets: (n_types + 1,) global id range per type of ``ENTITY_TYPES``.
        visible_splits: engagement splits the contexts may see.
        stage_base: weight of funnel stage r is ``stage_base ** r``.
        half_life_days: recency decay; None = the median visible edge age.
        pair_power: deep pairs are drawn ~ (deep-stage events) ** pair_power (0 = every pair alike).
    """
    n = int(offsets[-1])
    stage_order = snap.stage_order
    deep_stage = snap.deep_stage
    # contexts see edges up to the end of the visible window
    t_ref = iso_seconds(visible_end(snap, visible_splits))
    span = span_days(snap.split_bounds["min"], visible_end(snap, visible_splits))
    stage_rank = pl.col("stage").replace_strict(stage_order, list(range(len(stage_order))), return_dtype=pl.Int8)

    pairs, deep, val, engaged = [], [], [], []
    for ti, t in enumerate(ENTITY_TYPES):
        scan = snap.engagement(t)
        if scan is None:
            continue
        e = scan.select("src_id", "dst_id", "stage", "split", "count", "last_ts").with_columns(stage_rank.alias("rank"))
        dst_off = int(offsets[ti])
        vis = e.filter(pl.col("split").is_in(list(visible_splits)))
        is_deep = pl.col("stage") == deep_stage
        # one pass over the file: the three queries share its scan
        agg, deep_t, val_t = pl.collect_all([
            vis.group_by("src_id", "dst_id").agg(pl.col("rank").max(), pl.col("count").sum(), pl.col("last_ts").max()),
            vis.filter(is_deep).group_by("src_id", "dst_id").agg(pl.col("count").sum().cast(pl.Float64))
            .sort("src_id", "dst_id").select("src_id", (pl.col("dst_id") + dst_off).alias("dst"), "count"),
            e.filter(is_deep & (pl.col("split") == "val")).select("src_id", (pl.col("dst_id") + dst_off).alias("dst")),
        ])
        pairs.append(agg.with_columns(pl.lit(dst_off).alias("dst_off")))
        deep.append(deep_t.to_numpy())
        val.append(val_t.to_numpy())
        # warm = engaged in the visible splits: at export (train + val) a node first seen in val has
        # a base (the refit on train + val) and an engagement context, as a train node has
        engaged += [agg["src_id"].to_numpy() + offsets[0], agg["dst_id"].to_numpy() + dst_off]
    if not pairs:
        raise InputError(f"{snap.dir / 'edges'}: no user__engages__<type>.parquet; the snapshot has no engagement")

    # Memory: every visible pair is held in several forms while the store is built (at 100M
    # synthetic events, 70M pairs, the load passed 16 GiB). Each form is dropped as soon as the
    # next is made: the polars frame once its columns are numpy, the times once they are ages,
    # the ages once they are buckets and weights; the values are the same arrays as before.
    allp = pl.concat(pairs)
    del pairs
    u = allp["src_id"].to_numpy().astype(np.int64) + offsets[0]
    v = allp["dst_id"].to_numpy().astype(np.int64) + allp["dst_off"].to_numpy()
    rank = allp["rank"].to_numpy().astype(np.int8)
    cnt = allp["count"].to_numpy().astype(np.float64)
    last = allp["last_ts"].dt.epoch("us").to_numpy().astype(np.float64) / 1e6
    del allp
    age_days = np.clip((t_ref - last) / SECONDS_PER_DAY, 0, None)
    del last
    rec_edges = _recency_edges(age_days)
    half_life = float(half_life_days or max(float(np.median(age_days)) if len(age_days) else 1.0, 1e-3))
    weight = stage_base ** rank * np.exp2(-age_days / half_life) * np.log1p(cnt)
    feats = {
        "stage": (rank + 1).astype(np.int8),
        "recency": (np.searchsorted(rec_edges, age_days) + 1).astype(np.int8),
        "count": np.log1p(cnt).astype(np.float32),
        "age": (age_days / span).astype(np.float32),
    }
    del rank, age_days
    exposure = np.zeros(n, np.float64)
    np.add.at(exposure, u, cnt)
    np.add.at(exposure, v, cnt)
    del cnt
    eng = CSR.build_pairs(n, u, v, weight, feats)  # user -> entity and entity -> user
    del weight

    deep_rows = np.concatenate(deep) if deep else np.zeros((0, 3))
    deep_pairs = deep_rows[:, :2].astype(np.int64)
    deep_pairs[:, 0] += offsets[0]
    val_pairs = np.concatenate(val).astype(np.int64) if val else np.zeros((0, 2), np.int64)
    val_pairs[:, 0] += offsets[0]
    return Engagement(eng=eng, exposure=exposure, deep_pairs=deep_pairs,
                      deep_weight=np.maximum(deep_rows[:, 2], 1.0) ** float(pair_power), val_pairs=val_pairs,
                      engaged=np.concatenate(engaged), recency_edges=rec_edges, half_life=half_life)
