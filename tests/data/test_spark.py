"""prepare.engine=spark gives the Polars engine's snapshot (local[2], a session the test starts)."""

import os
import shutil

import polars as pl
import pytest

from hir.data.prepare import run

HAVE_JAVA = shutil.which("java") is not None or bool(os.environ.get("JAVA_HOME"))
pytestmark = pytest.mark.skipif(not HAVE_JAVA, reason="no Java on PATH or JAVA_HOME: Spark needs Java 17+")
pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'hir[spark]')")

TINY = ["data=synthetic", "data.adapter.n_users=120", "data.adapter.n_products=150", "data.adapter.n_advertisers=8",
        "data.adapter.n_campaigns=12", "data.adapter.n_events=3000", "data.adapter.dirty_rows=20"]
COUNTS = ("input_rows", "kept_rows", "quarantined_rows", "events", "nodes", "edges", "stages", "splits",
          "stages_per_split", "split_bounds", "cold_start", "category_levels")


def _sorted(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(df.columns)


def _equal(a: pl.DataFrame, b: pl.DataFrame, what: str) -> None:
    assert a.schema == b.schema, f"{what}: {a.schema} != {b.schema}"
    a, b = _sorted(a), _sorted(b)
    floats = [c for c, t in a.schema.items() if t == pl.Float64]
    exact = [c for c in a.columns if c not in floats]
    assert a.select(exact).equals(b.select(exact)), what
    for c in floats:  # sums of event values: Spark adds in another order
        assert ((a[c] - b[c]).abs() <= 1e-9 * (1 + b[c].abs())).all(), f"{what}.{c}"


def test_spark_snapshot_equals_polars(compose, tmp_path):
    polars_meta = run(compose(*TINY, stage="prepare", output_dir=tmp_path / "polars"))
    cfg = compose(*TINY, "prepare.engine=spark", "prepare.spark.master='local[2]'", "prepare.spark.shuffle_partitions=4",
                  stage="prepare", output_dir=tmp_path / "spark")
    spark_meta = run(cfg)
    assert spark_meta["engine"] == "spark" and polars_meta["engine"] == "polars"
    assert polars_meta["quarantined_rows"] > 0  # the quarantine ran before either engine
    for key in COUNTS:
        assert spark_meta[key] == polars_meta[key], key
    pg, sg = tmp_path / "polars" / "graph", tmp_path / "spark" / "graph"
    for kind in ("nodes", "edges"):
        names = sorted(p.name for p in (pg / kind).glob("*.parquet"))
        assert names == sorted(p.name for p in (sg / kind).glob("*.parquet"))
        for name in names:
            _equal(pl.read_parquet(pg / kind / name), pl.read_parquet(sg / kind / name), f"{kind}/{name}")
    _equal(pl.read_parquet(pg / "events.parquet"), pl.read_parquet(sg / "events.parquet"), "events")
    # the contract's order: each relation's edges sorted by (src_id, dst_id)
    edges = pl.read_parquet(sg / "edges" / "user__engages__product.parquet")
    assert edges.select((pl.col("src_id") * (1 << 32) + pl.col("dst_id")).diff().min()).item() >= 0
