from datetime import UTC, datetime

import polars as pl

from hir.data.edges import write_engagement_edges
from hir.data.schema import TS


def _events(tmp_path):
    n = 200
    df = pl.DataFrame(
        {
            "user_id": [i % 17 for i in range(n)],
            "entity_type": ["product" if i % 5 else "campaign" for i in range(n)],
            "entity_id": [i % 7 for i in range(n)],
            "stage_rank": pl.Series([i % 3 for i in range(n)], dtype=pl.Int8),
            "split": ["train" if i < 150 else "test" for i in range(n)],
            "timestamp": pl.Series([datetime(2024, 1, 1, tzinfo=UTC).replace(minute=i % 60) for i in range(n)], dtype=TS),
            "value": [float(i) for i in range(n)],
        }
    )
    path = tmp_path / "events.parquet"
    df.write_parquet(path)
    return path, df


def test_bucketed_edges_equal_single_pass_and_stay_sorted(tmp_path):
    path, df = _events(tmp_path)
    order = ["view", "cart", "purchase"]
    (tmp_path / "one").mkdir()
    (tmp_path / "many").mkdir()
    one = write_engagement_edges(path, tmp_path / "one", 17, df.height, order)
    many = write_engagement_edges(path, tmp_path / "many", 17, df.height, order, bucket_events=30)
    assert one == many and set(one) == {"user__engages__product", "user__engages__campaign"}
    for name in one:
        a = pl.read_parquet(tmp_path / "one" / f"{name}.parquet")
        b = pl.read_parquet(tmp_path / "many" / f"{name}.parquet")
        key = ["src_id", "dst_id", "stage", "split"]
        assert a.sort(key).equals(b.sort(key))
        packed = (b["src_id"] * (1 << 32) + b["dst_id"]).to_list()
        assert packed == sorted(packed)
        assert set(b["stage"]) <= set(order)
    total = sum(pl.read_parquet(tmp_path / "many" / f"{n}.parquet")["count"].sum() for n in many)
    assert total == df.height
    assert not (tmp_path / "_tmp_edges").exists()
