"""The users' fold-in (:mod:`hir.model.foldin`) as a Spark job over the snapshot's edge files (issue 35).

The same two passes, each a Spark job on the executors; what crosses to them is the basis's
entity side, broadcast (``entities x rank``), never a user-side matrix:

1. the entity frame: every visible column's degree (one group-by over the visible pairs); a
   column the basis was not fit on is folded in through the basis's users, each partition summing
   its pairs' share of ``V[e] = (w D_u^-1/2 R[:, e] d_e^-1/2)^T U / s`` (``U`` broadcast: the
   basis's rows, a sample of users when it was fit on one), and the driver adding the partitions'
   sums;
2. the users: the visible pairs joined to every user id, hash-partitioned by user, each partition
   computing ``r~_u D^-b V g(s)`` (``@ frame``) for its users. Spark writes the part files, sorted
   by user, and the driver streams them into one Parquet file (``node_id`` int64, ``embedding``
   fixed-size list of float32), the file :func:`hir.model.foldin.write_user_base` writes.

The result equals the Polars path to float tolerance (tests/model/test_spark_foldin.py). Where
Spark runs is ``prepare.spark`` (:class:`hir.data.spark_options.SparkOptions`): ``local[2]`` here,
a cluster by configuration alone.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import scipy.sparse as sp

from hir.data.schema import ENTITY_TYPES, engage_relation
from hir.data.snapshot import Snapshot
from hir.data.spark import SparkBuild
from hir.data.spark_options import SparkOptions
from hir.errors import InputError
from hir.model.engagement import SECONDS_PER_DAY, iso_seconds, visible_end
from hir.model.filters import user_filter
from hir.model.foldin import USER, EntityFrame, offsets_of
from hir.model.spectral import SpectralBasis


def visible_pairs(spark: Any, snap: Snapshot, visible_splits: Sequence[str], stage_base: float,
                  user_half_life: float = 0.0) -> Any:
    """Spark frame of the visible (user, entity) pairs: ``src_id`` (user id), ``dst`` (global
    entity id), ``w`` = ``stage_base ** (r - S)`` of the pair's deepest visible stage (the SVD's
    and the entity side's weight) and ``wu``, the user's row weight: ``w`` times ``2^(-age / H)``
    with a user half-life H, else ``w`` (as :func:`hir.model.foldin.iter_pairs` gives them)."""
    from pyspark.sql import functions as F

    offsets = offsets_of(snap)
    stages = snap.stage_order
    rank = F.create_map(*[x for i, s in enumerate(stages) for x in (F.lit(s), F.lit(i + 1))])
    frames = []
    for i, t in enumerate(ENTITY_TYPES):
        path = snap.edge_path(engage_relation(t))
        if not path.exists():
            continue
        agg = [F.max(rank[F.col("stage")]).alias("r"), F.max(F.unix_micros("last_ts")).alias("last_us")]
        frames.append(spark.read.parquet(str(path.resolve()))
                      .filter(F.col("split").isin(list(visible_splits)))
                      .groupBy("src_id", "dst_id").agg(*agg)
                      .select(F.col("src_id").cast("long"), (F.col("dst_id").cast("long") + int(offsets[i])).alias("dst"),
                              "r", "last_us"))
    if not frames:
        raise InputError(f"{snap.dir / 'edges'}: no user__engages__<type>.parquet; the snapshot has no engagement")
    pairs = frames[0]
    for f in frames[1:]:
        pairs = pairs.unionByName(f)
    w = F.pow(F.lit(float(stage_base)), F.col("r").cast("double") - len(stages))
    wu = w
    if user_half_life > 0:  # the ages of hir.model.engagement (clipped at the window's end)
        t_ref = iso_seconds(visible_end(snap, tuple(visible_splits)))
        age = F.greatest((F.lit(t_ref) - F.col("last_us").cast("double") / 1e6) / SECONDS_PER_DAY, F.lit(0.0))
        wu = w * F.pow(F.lit(2.0), -age / float(user_half_life))
    return pairs.select("src_id", "dst", w.alias("w"), wu.alias("wu"))


def _new_columns(pairs: Any, basis: SpectralBasis, deg: np.ndarray, new: np.ndarray, n_users: int) -> np.ndarray:
    """(len(new), K) float64 fold-in of the columns the basis was not fit on: each partition sums
    ``w / sqrt(d_u) * row_weight * U[u]`` per new column over its pairs; the driver adds them."""
    from pyspark.sql import functions as F

    spark = pairs.sparkSession
    k = basis.rank
    slot = np.full(len(deg), -1, np.int64)
    slot[new] = np.arange(len(new))
    pos = np.full(n_users, -1, np.int64)
    rows = np.arange(len(basis.u)) if basis.rows is None else basis.rows
    pos[rows] = np.arange(len(rows))
    row_w = np.ones(len(rows)) if basis.row_weight is None else basis.row_weight.astype(np.float64)
    bc = spark.sparkContext.broadcast((len(new), slot, pos, row_w, basis.u))
    du = pairs.groupBy("src_id").agg(F.sum("w").alias("du"))
    joined = pairs.join(du, "src_id")

    def partial(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        n_new, slot_, pos_, row_w_, u_ = bc.value
        acc: np.ndarray | None = None
        for b in batches:
            user = b.column("src_id").to_numpy()
            dst = b.column("dst").to_numpy()
            p, s = pos_[user], slot_[dst]
            sel = (p >= 0) & (s >= 0)
            if not sel.any():
                continue
            coef = (b.column("w").to_numpy()[sel] / np.sqrt(np.maximum(b.column("du").to_numpy()[sel], 1e-12))
                    * row_w_[p[sel]])
            if acc is None:
                acc = np.zeros((n_new, u_.shape[1]), np.float64)
            np.add.at(acc, s[sel], coef[:, None] * u_[p[sel]].astype(np.float64))
        if acc is not None:
            hit = np.flatnonzero(np.abs(acc).sum(1) > 0)
            vec = pa.ListArray.from_arrays(pa.array(np.arange(len(hit) + 1) * acc.shape[1], pa.int32()),
                                           pa.array(acc[hit].ravel(), pa.float64()))
            yield pa.record_batch([pa.array(hit, pa.int64()), vec], names=["slot", "vec"])

    acc = np.zeros((len(new), k), np.float64)
    table = joined.mapInArrow(partial, "slot long, vec array<double>").toArrow()
    if table.num_rows:
        got = np.asarray(table.column("vec").combine_chunks().flatten()).reshape(-1, k)
        np.add.at(acc, table.column("slot").to_numpy(), got)
    bc.unpersist()
    return acc


def spark_entity_frame(pairs: Any, basis: SpectralBasis, n: int, n_users: int) -> EntityFrame:
    """Pass 1 (module doc) on Spark: :func:`hir.model.foldin.entity_frame`'s result."""
    from pyspark.sql import functions as F

    deg = np.zeros(n, np.float64)
    t = pairs.groupBy("dst").agg(F.sum("w").alias("d")).toArrow()
    deg[t.column("dst").to_numpy()] = t.column("d").to_numpy()
    item_v, known, deg_fit = basis.fit_columns(n)
    new = np.flatnonzero(~known & (deg > 0))
    if len(new):
        acc = _new_columns(pairs, basis, deg, new, n_users)
        item_v[new] = (acc / np.sqrt(deg[new])[:, None] / np.maximum(basis.sigma, 1e-12)[None, :]).astype(np.float32)
        deg_fit[new] = deg[new]
    return EntityFrame(item_v, deg_fit, known | (deg > 0))


def spark_write_user_base(snap: Snapshot, visible_splits: Sequence[str], basis: SpectralBasis, path: Path | str,
                          options: SparkOptions | None = None, partitions: int | None = None) -> int:
    """Every user's base, computed on Spark (module doc), written to one Parquet file at ``path``
    (``node_id`` int64 ascending, ``embedding`` fixed-size list of float32, a zero row for a user
    without visible engagement); returns the users written.

    Args:
        options: where Spark runs (``prepare.spark``; None: ``local[2]``, work dir beside ``path``).
        partitions: user partitions of pass 2 (None: Spark's shuffle default).
    """
    from pyspark.sql import functions as F

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    offsets = offsets_of(snap)
    n = int(offsets[-1])
    n_users = int(offsets[USER + 1] - offsets[USER])
    f = basis.filter
    local = tempfile.TemporaryDirectory(dir=path.parent, prefix="_spark_foldin")  # the default work dir
    build = SparkBuild(options or SparkOptions(app_name="hir-foldin"), Path(local.name))
    try:
        spark = build.spark
        # one read of the edge files: the stage weight for the entity side, the decayed one for the users
        pairs = visible_pairs(spark, snap, visible_splits, basis.stage_base, f.user_half_life).cache()
        frame = spark_entity_frame(pairs, basis, n, n_users)
        inv = np.where(frame.ent, np.power(np.maximum(frame.deg, 1e-12), -f.beta), 0.0)
        scaled = frame.item_v * inv[:, None].astype(np.float32)  # (n, K) D^-b V: broadcast once
        g = user_filter(basis.sigma, f.response, f.ideal_weight)
        bc = spark.sparkContext.broadcast((scaled, g, basis.frame))
        users = spark.range(n_users).select(F.col("id").alias("src_id"))
        rows = users.join(pairs.select("src_id", "dst", "wu"), "src_id", "left")
        rows = rows.repartition(partitions, "src_id") if partitions else rows.repartition("src_id")
        k = basis.rank

        def fold(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            scaled_, g_, q_ = bc.value
            got = [b for b in batches if b.num_rows]
            if not got:
                return
            t = pa.Table.from_batches(got).combine_chunks()
            user = t.column("src_id").to_numpy()
            ids, row = np.unique(user, return_inverse=True)
            has = np.asarray(pc.is_valid(t.column("dst")))  # False: a user without visible pairs (zero row)
            dst = np.asarray(pc.fill_null(t.column("dst"), 0))
            w = np.asarray(pc.fill_null(t.column("wu"), 0.0))
            r = sp.csr_matrix((w[has], (row[has], dst[has])), shape=(len(ids), scaled_.shape[0]))
            out = np.asarray(r @ scaled_, np.float32) * g_[None, :]
            if q_ is not None:
                out = out @ q_
            out = out.astype(np.float32)
            emb = pa.ListArray.from_arrays(pa.array(np.arange(len(ids) + 1) * k, pa.int32()),
                                           pa.array(out.ravel(), pa.float32()))
            yield pa.record_batch([pa.array(ids, pa.int64()), emb], names=["node_id", "embedding"])

        out = rows.mapInArrow(fold, "node_id long, embedding array<float>").orderBy("node_id")
        out.write.mode("overwrite").parquet(build.uri("user_base"))
        pairs.unpersist()
        bc.unpersist()
        schema = pa.schema([("node_id", pa.int64()), ("embedding", pa.list_(pa.float32(), k))])
        written = build.assemble("user_base", path, schema)
    finally:
        build.stop()
        local.cleanup()
    if written != n_users:
        raise RuntimeError(f"{path}: the Spark fold-in wrote {written} users, expected {n_users}")
    return written
