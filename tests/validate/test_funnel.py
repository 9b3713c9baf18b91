"""The open funnel's suite (hir/validate/funnel.py): the derived flags on hand-built rows, and
`hir validate`'s gate on a real funnel/ of the tiny snapshot and on corrupted copies of it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from hir.validate import stage
from hir.validate.binding import require_funnel
from hir.validate.funnel import funnel_view
from tests.publish.fixtures import funnel_run

T = datetime(2024, 3, 1, tzinfo=UTC)


def _rows(**change: list) -> pl.DataFrame:
    """Four pairs of two users (2 users, 3 entities, 4 stages), every check passing, then ``change``."""
    cols = {
        "user_id": [0, 0, 1, 1], "entity_id": [0, 2, 1, 2], "deepest": [3, 1, 0, 2], "gap": [0, 2, 3, 1],
        "converted": [True, False, False, False], "n_events": [3, 1, 1, 2], "n_deepest": [1, 1, 1, 1],
        "n_target": [1, 0, 0, 0], "age_days": [1.0, 2.0, 0.5, 0.0], "target_age_days": [1.0, None, None, None],
        "user_last_days": [1.0, 1.0, 0.0, 0.0], "pos": [0, 1, 0, 1], "event_timestamp": [T] * 4,
    }
    return pl.DataFrame(cols | change).with_columns(pl.col("event_timestamp").cast(pl.Datetime("us", "UTC")))


def test_flags_catch_each_broken_row() -> None:
    ok = funnel_view(_rows(), 2, 3, 4, T)
    assert ok.select(pl.all_horizontal(pl.col("^.*_ok$"))).to_series().all()
    bad = funnel_view(_rows(user_id=[0, 0, 1, 2], entity_id=[0, 2, 3, 2], converted=[False, False, False, True],
                            pos=[0, 0, 0, 1], deepest=[4, 1, 0, 2]), 2, 3, 4, T + timedelta(seconds=1))
    assert bad["user_ok"].to_list() == [True, True, True, False]
    assert bad["entity_ok"].to_list() == [True, True, False, True]
    assert bad["converted_ok"].to_list() == [False, True, True, False]
    assert bad["pos_ok"].to_list() == [False, False, True, True]
    assert bad["stage_ok"].to_list() == [False, True, True, True]
    assert not bad["ts_ok"].any()


def test_a_valid_funnel_passes_and_is_bound(tiny_graph: Path, tmp_path: Path) -> None:
    cfg = funnel_run(tiny_graph, tmp_path / "ok", "ok")
    stage.run(cfg)
    result = json.loads((tmp_path / "ok" / "validation" / "result.json").read_text())
    assert result["success"]
    assert set(result["funnel"]["files"]) == {"open_funnel.parquet", "meta.json"}
    assert require_funnel(result)["dir"] == str((tmp_path / "ok" / "funnel").resolve())


BREAKS = {
    # each corrupts a copy of the real file one way; the failure names the column
    "gap": (lambda f: f.with_columns(pl.when(pl.col("pos") == 0).then(-1).otherwise(pl.col("gap"))
                                     .cast(pl.Int8).alias("gap")), "gap >= 0"),
    "converted": (lambda f: f.with_columns(~pl.col("converted")), "converted == (n_target > 0)"),
    "pos": (lambda f: f.with_columns(pl.lit(0, pl.Int64).alias("pos")), "pos unique per user"),
    "entity_id": (lambda f: f.with_columns(pl.col("entity_id") + 100_000), "entity_id an entity node id"),
    "user_id": (lambda f: f.with_columns(pl.when(pl.col("pos") == 0).then(None).otherwise(pl.col("user_id"))
                                         .alias("user_id")), "not null"),
    "age_days": (lambda f: f.with_columns(-pl.col("age_days") - 1), "age_days >= 0"),
    "event_timestamp": (lambda f: f.with_columns(pl.col("event_timestamp") + pl.duration(days=1)),
                        "event_timestamp = the export's"),
    "n_target": (lambda f: f.drop("n_target"), "present"),
}


# each case runs the whole validate stage (~7 s): a broken value and a missing column run by
# default, the other breaks with -m slow (test_flags_catch_each_broken_row covers every flag fast)
FAST_BREAKS = ["gap", "n_target"]


@pytest.mark.parametrize("column", [*FAST_BREAKS, *(pytest.param(c, marks=pytest.mark.slow)
                                                    for c in ("converted", "pos", "event_timestamp"))])
def test_the_gate_fails_on_a_broken_funnel(column: str, tiny_graph: Path, tmp_path: Path) -> None:
    cfg = funnel_run(tiny_graph, tmp_path / "bad", "bad")
    path = tmp_path / "bad" / "funnel" / "open_funnel.parquet"
    breaks, check = BREAKS[column]
    breaks(pl.read_parquet(path)).write_parquet(path)
    with pytest.raises(stage.ValidationFailed) as err:
        stage.run(cfg)
    assert f"column {column} | {check}" in str(err.value) or (column == "n_target" and "open_funnel.parquet (columns)"
                                                              in str(err.value))
    result = json.loads((tmp_path / "bad" / "validation" / "result.json").read_text())
    assert not result["success"] and all(f["table"].startswith("funnel/") for f in result["failures"])


def test_every_break_is_caught_by_the_view(tiny_graph: Path) -> None:
    """The breaks the gate test does not run end to end, checked on the view of the real file."""
    from hir.data.snapshot import load_snapshot
    from hir.validate.funnel import funnel_tables
    from tests.publish.fixtures import tiny_funnel

    funnel = tiny_funnel(tiny_graph)
    snap = load_snapshot(tiny_graph)
    asof = datetime.fromisoformat(json.loads((funnel / "meta.json").read_text())["asof"])
    frame = pl.read_parquet(funnel / "open_funnel.parquet")
    n_users, n_products = snap.num_nodes("user"), snap.num_nodes("product")
    clean = funnel_view(frame, n_users, n_products, len(snap.stage_order), asof)
    assert clean.select(pl.all_horizontal(pl.col("^.*_ok$"))).to_series().all()
    assert len(funnel_tables(funnel, snap, asof)) == 2
    for column in ("entity_id", "user_id", "age_days"):
        broken = BREAKS[column][0](frame)
        view = funnel_view(broken, n_users, n_products, len(snap.stage_order), asof)
        if column == "entity_id":
            assert not view["entity_ok"].any()
        elif column == "user_id":
            assert view["user_id"].null_count() > 0
        else:
            assert (view["age_days"] < 0).all()
