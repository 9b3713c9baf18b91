"""prepare.engine=spark gives the Polars engine's snapshot, and the users' fold-in as a Spark job
gives the Polars fold-in's file (local[2]; one module, so one process's Py4J gateway serves both)."""

import os
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hir.data.compare import snapshot_differences, table_difference
from hir.data.prepare import run

HAVE_JAVA = shutil.which("java") is not None or bool(os.environ.get("JAVA_HOME"))
pytestmark = pytest.mark.skipif(not HAVE_JAVA, reason="no Java on PATH or JAVA_HOME: Spark needs Java 17+")
pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'hir[spark]')")

TINY = ["data=synthetic", "data.adapter.n_users=120", "data.adapter.n_products=150", "data.adapter.n_advertisers=8",
        "data.adapter.n_campaigns=12", "data.adapter.n_events=3000", "data.adapter.dirty_rows=20"]


def test_spark_snapshot_equals_polars(compose, tmp_path):
    polars_meta = run(compose(*TINY, stage="prepare", output_dir=tmp_path / "polars"))
    cfg = compose(*TINY, "prepare.engine=spark", "prepare.spark.master='local[2]'", "prepare.spark.shuffle_partitions=4",
                  stage="prepare", output_dir=tmp_path / "spark")
    spark_meta = run(cfg)
    assert spark_meta["engine"] == "spark" and polars_meta["engine"] == "polars"
    assert polars_meta["quarantined_rows"] > 0 and len(polars_meta["edges"]) >= 6
    pg, sg = tmp_path / "polars" / "graph", tmp_path / "spark" / "graph"
    assert snapshot_differences(pg, sg) == []
    # the contract's order: each relation's edges sorted by (src_id, dst_id)
    edges = pl.read_parquet(sg / "edges" / "user__engages__product.parquet")
    assert edges.select((pl.col("src_id") * (1 << 32) + pl.col("dst_id")).diff().min()).item() >= 0


def test_table_difference_sees_a_changed_row():
    a = pl.DataFrame({"k": [1, 2, 3], "v": [0.5, 1.0, 2.0]})
    assert table_difference(a, a.reverse()) is None
    assert "rows differ" in table_difference(a, a.with_columns(k=pl.Series([1, 2, 4])))
    assert "values of v" in table_difference(a, a.with_columns(v=pl.Series([0.5, 1.0, 2.1])))
    assert table_difference(a, a.with_columns(v=pl.Series([0.5, 1.0, 2.0 + 1e-12]))) is None


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.train.fixtures import tiny_snapshot

    return tiny_snapshot(tmp_path_factory.mktemp("spark_foldin"))


def test_the_spark_fold_in_is_the_polars_one(tiny: Path, tmp_path: Path) -> None:
    """hir/model/spark_foldin.py against hir/model/foldin.py (the whole completejourney snapshot:
    tests/model/test_foldin.py, -m slow)."""
    from hir.data.snapshot import load_snapshot
    from hir.data.spark_options import SparkOptions
    from hir.model import Filter, load_graph
    from hir.model.foldin import write_user_base
    from hir.model.spark_foldin import spark_write_user_base
    from hir.model.spectral import fit_spectral
    from tests.model.test_foldin import read_user_base
    from tests.train.fixtures import graph_options

    train = load_graph(tiny / "graph", tiny / "content", ("train",), **graph_options())
    # a sampled basis, a rotated frame and a user half-life, on the wider window (train + val):
    # columns the basis never saw are folded in through its sampled users
    basis = fit_spectral(train, 8, 4.0, 4, 0, Filter(beta=0.4, response="cheby", ideal_weight=0.3, user_half_life=5.0),
                         sample_users=0.5)
    q, _ = np.linalg.qr(np.random.default_rng(1).standard_normal((basis.rank, basis.rank)))
    basis = replace(basis, frame=q.astype(np.float32))
    snap = load_snapshot(tiny / "graph")
    splits = ("train", "val")
    n = spark_write_user_base(snap, splits, basis, tmp_path / "spark" / "user.parquet",
                              SparkOptions(master="local[2]", shuffle_partitions=2), partitions=2)
    write_user_base(snap, splits, basis, tmp_path / "polars.parquet", bucket_users=7)
    (ids_s, emb_s), (ids_p, emb_p) = read_user_base(tmp_path / "spark" / "user.parquet"), read_user_base(tmp_path / "polars.parquet")
    assert n == len(ids_p) and np.array_equal(ids_s, ids_p)
    assert np.abs(emb_p).sum() > 0 and (np.abs(emb_p).sum(1) == 0).any() == (np.abs(emb_s).sum(1) == 0).any()
    np.testing.assert_allclose(emb_s, emb_p, rtol=1e-4, atol=1e-6)
    assert pl.read_parquet_schema(tmp_path / "spark" / "user.parquet") == pl.read_parquet_schema(tmp_path / "polars.parquet")
    assert [p.name for p in (tmp_path / "spark").iterdir()] == ["user.parquet"]  # the local work dir is dropped


class _Builder:
    """A SparkSession builder whose first starts fail with ``errors`` in turn."""

    def __init__(self, *errors: str) -> None:
        self.errors, self.calls = list(errors), 0

    def getOrCreate(self):  # pyspark's name
        self.calls += 1
        if self.errors:
            raise RuntimeError(self.errors.pop(0))
        return "session"


def test_a_gateway_that_exits_at_start_is_started_once_more(monkeypatch):
    from hir.data import spark as engine

    monkeypatch.setattr(engine.time, "sleep", lambda s: None)
    once = _Builder("[JAVA_GATEWAY_EXITED] Java gateway process exited before sending its port number.")
    assert engine.SparkBuild._start(once) == "session" and once.calls == 2
    twice = _Builder(*["[JAVA_GATEWAY_EXITED] exited"] * 2)
    with pytest.raises(RuntimeError, match="JAVA_GATEWAY_EXITED"):
        engine.SparkBuild._start(twice)
    other = _Builder("some other failure")  # not retried: only the gateway's exit at start is
    with pytest.raises(RuntimeError, match="other failure"):
        engine.SparkBuild._start(other)
    assert other.calls == 1
