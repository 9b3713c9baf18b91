"""The split policy: seeded random pairs with synthesized times, shipped test files, temporal."""

from datetime import UTC, datetime

import polars as pl
import pytest

from hir.data import split as sp
from hir.data.schema import TS
from hir.errors import InputError


def _pairs(n_users: int = 30, per_user: int = 7, repeats: int = 3) -> pl.DataFrame:
    rows = [(f"u{u}", "product", f"i{(u * 3 + k) % 50}") for u in range(n_users) for k in range(per_user)]
    return pl.DataFrame(rows * repeats, schema=sp.PAIR, orient="row")


def test_random_pair_split_keeps_each_pair_in_one_split_with_exact_shares():
    pairs = _pairs()
    split = sp.random_pair_split(pairs, 0.2, 0.1, seed=3)
    labelled = pairs.with_columns(split.alias("split"))
    per_pair = labelled.group_by(sp.PAIR).agg(pl.col("split").n_unique().alias("k"), pl.col("split").first())
    assert per_pair["k"].max() == 1  # a pair's repeated events never straddle two splits
    counts = dict(per_pair.group_by("split").len().iter_rows())
    n = per_pair.height
    assert counts == {"test": round(0.1 * n), "val": round(0.2 * n), "train": n - round(0.1 * n) - round(0.2 * n)}


def test_random_pair_split_is_seeded_and_independent_of_row_order():
    pairs = _pairs()
    a = pairs.with_columns(sp.random_pair_split(pairs, 0.2, 0.2, seed=1).alias("s"))
    shuffled = pairs.sample(fraction=1.0, shuffle=True, seed=5)
    b = shuffled.with_columns(sp.random_pair_split(shuffled, 0.2, 0.2, seed=1).alias("s"))
    c = pairs.with_columns(sp.random_pair_split(pairs, 0.2, 0.2, seed=2).alias("s"))
    key = [*sp.PAIR, "s"]
    assert a.unique().sort(key).equals(b.unique().sort(key))
    assert not a["s"].equals(c["s"])


def test_synthesized_times_fall_in_their_split_window_in_order():
    labels = pl.Series(["train"] * 70 + ["val"] * 10 + ["test"] * 20)
    spec = sp.SplitSpec(seed=4, synthetic_start="2001-02-03", synthetic_days=10)
    ts, bounds = sp.synthesize_timestamps(labels, spec)
    df = pl.DataFrame({"split": labels, "timestamp": ts})
    val_start, test_start = bounds["val_start"], bounds["test_start"]
    assert df.filter(pl.col("split") == "train")["timestamp"].max() < val_start
    val = df.filter(pl.col("split") == "val")["timestamp"]
    assert val.min() >= val_start and val.max() < test_start
    assert df.filter(pl.col("split") == "test")["timestamp"].min() >= test_start
    # windows as long as their share of the events: train 70% of 10 days
    assert (val_start - datetime(2001, 2, 3, tzinfo=UTC)).total_seconds() == pytest.approx(7 * 86400, rel=1e-6)
    again, _ = sp.synthesize_timestamps(labels, spec)
    assert again.equals(ts)


def _events(keys: list[tuple[str, str]], hours: list[int] | None) -> pl.LazyFrame:
    ts = [datetime(2024, 1, 1, h, tzinfo=UTC) for h in hours] if hours else [None] * len(keys)
    return pl.LazyFrame(
        {"user_key": [u for u, _ in keys], "entity_type": "product", "entity_key": [i for _, i in keys],
         "timestamp": pl.Series(ts, dtype=TS)}
    )


def test_heldout_with_timestamps_is_temporal_and_refuses_overlapping_files():
    train = _events([("u1", "a"), ("u1", "b"), ("u2", "a"), ("u2", "c"), ("u3", "b")], [1, 2, 3, 4, 5])
    test = _events([("u1", "c"), ("u2", "b")], [7, 8])
    plan = sp.plan(train, sp.SplitSpec(val_fraction=0.2), True, test)
    assert plan.info["mode"] == "temporal_heldout"
    assert plan.bounds["test_start"].hour == 7 and plan.bounds["val_start"].hour == 5
    overlapping = _events([("u1", "c")], [4])
    with pytest.raises(InputError, match=r"test file \(heldout test events\) starts at .*data\.columns\.timestamp=null"):
        sp.plan(train, sp.SplitSpec(val_fraction=0.2), True, overlapping)


def test_heldout_without_timestamps_is_the_test_split_exactly():
    train = _events([(f"u{k % 4}", f"i{k}") for k in range(40)], None)
    test = _events([("u1", "z1"), ("u2", "z2"), ("u2", "z2")], None)
    plan = sp.plan(train, sp.SplitSpec(val_fraction=0.25, seed=9), False, test)
    out = plan.events.collect()
    b = plan.bounds
    labelled = out.with_columns(
        pl.when(pl.col("timestamp") >= b["test_start"]).then(pl.lit("test"))
        .when(pl.col("timestamp") >= b["val_start"]).then(pl.lit("val")).otherwise(pl.lit("train")).alias("split")
    )
    got = labelled.filter(pl.col("split") == "test").select("user_key", "entity_key").sort("user_key")
    assert got.rows() == [("u1", "z1"), ("u2", "z2"), ("u2", "z2")]
    assert labelled.filter(pl.col("split") == "val").height == 10  # 25% of the 40 train pairs
    assert plan.info["mode"] == "random_pairs_heldout" and plan.info["seed"] == 9


def test_empty_heldout_and_bad_fractions_are_refused():
    train = _events([("u1", "a")], None)
    with pytest.raises(InputError, match="no event rows"):
        sp.plan(train, sp.SplitSpec(), False, _events([], None).head(0))
    with pytest.raises(InputError, match="fractions"):
        sp.plan(train, sp.SplitSpec(val_fraction=0.6, test_fraction=0.5), False, None)
    with pytest.raises(InputError, match="unknown keys"):
        sp.SplitSpec.from_config({"val_fraction": 0.1, "seeed": 3})
