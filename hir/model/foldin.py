"""Every user's base vector in a streaming pass over the snapshot's edge files (issue 35).

A user's base is the fold-in of its own row (:mod:`hir.model.spectral`)::

    b_u = r_u D^-b V diag(g(s))          (then ``@ frame`` when the basis has one)

so it needs the entity side (``V``, the degrees, ``g``: ``entities x rank``) and nothing of any
other user. This module reads ``user__engages__<type>.parquet`` by user-id bucket (prepare
writes them sorted by ``(src_id, dst_id)``, so a bucket is a contiguous slice the scan's
row-group statistics find), and memory is ``entities x rank`` plus one bucket's pairs, whatever
the number of users. Two passes:

1. :func:`entity_frame`: the entity side on the visible window. Columns the basis was fit on
   keep their fit-time vector and degree; a column new in the window is folded in through the
   basis's users (``V[e] = (w D_u^-1/2 R[:, e] d_e^-1/2)^T U / s`` over ``basis.rows``, the
   sampled users, or all), its degree summed over every user.
2. :func:`iter_user_base`: the users' vectors, one bucket at a time (:func:`write_user_base`
   writes them to a parquet file).

The result equals the in-memory :meth:`SpectralBasis.base_for` rows of the users
(tests/model/test_foldin.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import scipy.sparse as sp

from hir.data.schema import ENTITY_TYPES
from hir.data.snapshot import Snapshot
from hir.errors import InputError
from hir.model.engagement import SECONDS_PER_DAY, iso_seconds, visible_end
from hir.model.filters import user_filter
from hir.model.spectral import SpectralBasis

USER = ENTITY_TYPES.index("user")


@dataclass
class EntityFrame:
    """The entity side of the fold-in: item_v (n, K) float32 singular vectors of every visible
    column, deg (n,) float64 their degree (fit-time for the basis's columns), ent (n,) bool has a
    vector."""

    item_v: np.ndarray
    deg: np.ndarray
    ent: np.ndarray


def offsets_of(snap: Snapshot) -> np.ndarray:
    """(n_types + 1,) global id ranges per type of ``ENTITY_TYPES`` (as :func:`hir.model.load_graph`)."""
    counts = snap.node_counts
    return np.cumsum([0] + [counts[t] for t in ENTITY_TYPES]).astype(np.int64)


def iter_pairs(snap: Snapshot, visible_splits: Sequence[str], stage_base: float,
               bucket_users: int, user_half_life: float = 0.0,
               ) -> Iterator[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]]:
    """The visible (user, entity) pairs, one user bucket at a time.

    Yields ``(lo, hi, user, dst, weight)``: the bucket's user ids ``[lo, hi)``; (P,) int64 user
    ids, (P,) int64 global entity ids, (P,) float64 ``stage_base ** (r - S)`` of the pair's
    deepest visible stage r (1..S), one row per pair, as :func:`hir.model.spectral.engagement_matrix`
    (with ``user_half_life`` H > 0 days: times ``2^(-age / H)``, age from the pair's last visible
    event to the end of the visible window, the users' decayed rows).
    """
    if bucket_users < 1:
        raise ValueError(f"bucket_users={bucket_users}; expected >= 1 users per bucket")
    offsets = offsets_of(snap)
    n_users = int(offsets[USER + 1] - offsets[USER])
    stages = snap.stage_order
    rank = pl.col("stage").replace_strict(stages, list(range(1, len(stages) + 1)), return_dtype=pl.Int64)
    scans = [(int(offsets[i]), snap.engagement(t)) for i, t in enumerate(ENTITY_TYPES)]
    scans = [(off, s) for off, s in scans if s is not None]
    if not scans:
        raise InputError(f"{snap.dir / 'edges'}: no user__engages__<type>.parquet; the snapshot has no engagement")
    vis = pl.col("split").is_in(list(visible_splits))
    decay = user_half_life > 0
    aggs = [rank.max().alias("r")] + ([pl.col("last_ts").max().dt.epoch("us").alias("last_us")] if decay else [])
    t_ref = iso_seconds(visible_end(snap, tuple(visible_splits))) if decay else 0.0
    for lo in range(0, n_users, bucket_users):
        hi = min(lo + bucket_users, n_users)
        frames = [s.filter((pl.col("src_id") >= lo) & (pl.col("src_id") < hi) & vis)
                  .group_by("src_id", "dst_id").agg(*aggs)
                  .select(pl.col("src_id").cast(pl.Int64), (pl.col("dst_id").cast(pl.Int64) + off).alias("dst"),
                          pl.exclude("src_id", "dst_id"))
                  for off, s in scans]
        got = pl.concat(pl.collect_all(frames))
        r = got["r"].to_numpy().astype(np.float64)
        w = np.power(float(stage_base), r - len(stages))
        if decay:  # the ages of hir.model.engagement.load_engagement (clipped at the window's end)
            age = np.clip((t_ref - got["last_us"].to_numpy().astype(np.float64) / 1e6) / SECONDS_PER_DAY, 0, None)
            w = w * np.exp2(-age / float(user_half_life))
        yield lo, hi, got["src_id"].to_numpy(), got["dst"].to_numpy(), w


def entity_frame(snap: Snapshot, visible_splits: Sequence[str], basis: SpectralBasis,
                 bucket_users: int = 100_000) -> EntityFrame:
    """Pass 1 (module doc): every visible column's singular vector and degree, from the basis and
    streaming passes: the degrees, then, only when the window has columns the basis was not fit
    on, their fold-in through the basis's users (memory: ``entities x rank`` plus one bucket)."""
    offsets = offsets_of(snap)
    n, k = int(offsets[-1]), basis.rank
    deg = np.zeros(n, np.float64)
    for _, _, _, dst, w in iter_pairs(snap, visible_splits, basis.stage_base, bucket_users):
        deg += np.bincount(dst, weights=w, minlength=n)
    item_v, known, deg_fit = basis.fit_columns(n)
    new = np.flatnonzero(~known & (deg > 0))
    if len(new):
        # V[e] = sum over the basis's users of w D_u^-1/2 R[u, e] U[u] / (d_e^1/2 s): one more pass
        slot = np.full(n, -1, np.int64)
        slot[new] = np.arange(len(new))
        acc = np.zeros((len(new), k), np.float64)
        n_users = int(offsets[USER + 1] - offsets[USER])
        pos = np.full(n_users, -1, np.int64)  # user id -> row of U
        rows = np.arange(len(basis.u)) if basis.rows is None else basis.rows
        pos[rows] = np.arange(len(rows))
        row_w = np.ones(len(rows)) if basis.row_weight is None else basis.row_weight.astype(np.float64)
        for lo, hi, user, dst, w in iter_pairs(snap, visible_splits, basis.stage_base, bucket_users):
            du = np.bincount(user - lo, weights=w, minlength=hi - lo)
            p = pos[user]
            sel = (p >= 0) & (slot[dst] >= 0)
            if sel.any():
                coef = w[sel] / np.sqrt(np.maximum(du[user[sel] - lo], 1e-12)) * row_w[p[sel]]
                np.add.at(acc, slot[dst[sel]], coef[:, None] * basis.u[p[sel]].astype(np.float64))
        vn = acc / np.sqrt(deg[new])[:, None] / np.maximum(basis.sigma, 1e-12)[None, :]
        item_v[new] = vn.astype(np.float32)
        deg_fit[new] = deg[new]
    return EntityFrame(item_v, deg_fit, known | (deg > 0))


def iter_user_base(snap: Snapshot, visible_splits: Sequence[str], basis: SpectralBasis,
                   frame: EntityFrame | None = None,
                   bucket_users: int = 100_000) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Pass 2 (module doc): ``(user_ids (B,) int64, vectors (B, K) float32)`` per bucket of user
    ids, every user of the snapshot (a user without visible engagement: a zero row)."""
    own = frame is None  # a frame built here is scaled in place (no second (n, K) copy)
    frame = frame or entity_frame(snap, visible_splits, basis, bucket_users)
    f = basis.filter
    inv = np.where(frame.ent, np.power(np.maximum(frame.deg, 1e-12), -f.beta), 0.0)
    scaled = frame.item_v if own else frame.item_v.copy()
    scaled *= inv[:, None].astype(np.float32)  # (n, K) D^-b V, computed once
    g = user_filter(basis.sigma, f.response, f.ideal_weight)
    n = len(frame.deg)
    for lo, hi, user, dst, w in iter_pairs(snap, visible_splits, basis.stage_base, bucket_users,
                                           f.user_half_life):
        r = sp.csr_matrix((w, (user - lo, dst)), shape=(hi - lo, n))
        out = np.asarray(r @ scaled, np.float32) * g[None, :]
        if basis.frame is not None:
            out = out @ basis.frame
        yield np.arange(lo, hi, dtype=np.int64), out.astype(np.float32)


def write_user_base(snap: Snapshot, visible_splits: Sequence[str], basis: SpectralBasis, path: Path | str,
                    bucket_users: int = 100_000) -> int:
    """Write every user's base (``node_id`` int64, ``embedding`` list[float32]) to one parquet
    file, a row group per bucket; returns the users written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    writer: pq.ParquetWriter | None = None
    try:
        for ids, vec in iter_user_base(snap, visible_splits, basis, bucket_users=bucket_users):
            emb = pa.FixedSizeListArray.from_arrays(pa.array(vec.ravel(), pa.float32()), vec.shape[1])
            table = pa.table({"node_id": pa.array(ids), "embedding": emb})
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema)
            writer.write_table(table)
            written += len(ids)
    finally:
        if writer is not None:
            writer.close()
    return written
