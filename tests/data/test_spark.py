"""prepare.engine=spark gives the Polars engine's snapshot (local[2], a session the test starts)."""

import os
import shutil

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
