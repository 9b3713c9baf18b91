"""Row checks bundled into one GE expectation (hir/validate/bundle.py) fail, count and report
exactly as separate expectations do: both ways of run_checkpoint on planted defects of every
check kind and column dtype (nulls, NaN, Categorical, tz-aware timestamps), compared failure by
failure."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import great_expectations.expectations as gxe
import polars as pl
import pytest

from hir.validate import bundle
from hir.validate.checkpoint import run_checkpoint
from hir.validate.suites import Table, _e, _not_null, flag

T = datetime(2024, 3, 1, tzinfo=UTC)
NAN = float("nan")


def _tables() -> list[Table]:
    """Two tables with a defect for every check (and checks that pass), one clean table, and
    checks that stay separate expectations (mostly < 1, a row condition, the row count)."""
    rows = pl.DataFrame({
        "id": ["a", "b", "c", "d", "e", "f"],
        "ok": [True, False, None, True, False, True],
        "stage": ["view", "cart", "nope", None, "view", "bad"],
        "n": [1, 5, None, 3, 3, -2],
        "x": [0.5, NAN, 1.5, None, -0.1, 1.0],
        "ts": [T, T, datetime(2030, 1, 1, tzinfo=UTC), None, datetime(2000, 1, 1, tzinfo=UTC), T],
        "key": ["k1", "k2", "k2", None, None, "k3"],
        "node": [0, 1, 1, 2, 3, 3],
        "twin": [True, None, False, True, None, True],
        "naive": [datetime(2024, 1, 1)] * 6,
    }).with_columns(pl.col("stage").cast(pl.Categorical), pl.col("ts").cast(pl.Datetime("us", "UTC")))
    checks = [
        *_not_null("n", "x", "stage", "key", "id"),
        flag("ok", "ok", "the flag holds"),
        _e(gxe.ExpectColumnValuesToBeInSet, "stage", "stage known", column="stage", value_set=["view", "cart"]),
        _e(gxe.ExpectColumnValuesToBeInSet, "n", "n is 1, 3 or 5", column="n", value_set=[1, 3, 5]),
        _e(gxe.ExpectColumnValuesToBeBetween, "n", "n in [0, 4]", column="n", min_value=0, max_value=4),
        _e(gxe.ExpectColumnValuesToBeBetween, "n", "n > 1 (strict)", column="n", min_value=1, strict_min=True),
        _e(gxe.ExpectColumnValuesToBeBetween, "n", "n < 5 (strict)", column="n", max_value=5, strict_max=True),
        _e(gxe.ExpectColumnValuesToBeBetween, "x", "x in [0, 1]", column="x", min_value=0.0, max_value=1.0),
        _e(gxe.ExpectColumnValuesToBeBetween, "x", "x <= 10 (passes)", column="x", max_value=10.0),
        _e(gxe.ExpectColumnValuesToBeBetween, "ts", "ts in range", column="ts", min_value=datetime(2020, 1, 1, tzinfo=UTC),
           max_value=datetime(2025, 1, 1, tzinfo=UTC)),
        _e(gxe.ExpectColumnValuesToBeUnique, "key", "unique", column="key"),
        _e(gxe.ExpectColumnValuesToBeUnique, "node", "unique", column="node"),
        _e(gxe.ExpectColumnValuesToBeUnique, "id", "unique (passes)", column="id"),
        # left to GE: pandas cannot compare naive timestamps with aware bounds (GE reports its
        # error), and Polars cannot look for strings among ints (pandas finds none: all fail)
        _e(gxe.ExpectColumnValuesToBeBetween, "naive", "naive ts in range", column="naive",
           min_value=datetime(2020, 1, 1, tzinfo=UTC)),
        _e(gxe.ExpectColumnValuesToBeInSet, "node", "node named", column="node", value_set=["a", "b"]),
        # separate expectations either way
        flag("twin", "twin", "mostly no twin", mostly=0.5),
        _e(gxe.ExpectTableRowCountToEqual, "*", "six rows (passes)", value=6),
        _e(gxe.ExpectTableRowCountToEqual, "*", "seven rows", value=7),
    ]
    clean = pl.DataFrame({"id": ["p", "q"], "v": [1.0, 2.0], "flag": [True, True]})
    shares = pl.DataFrame({"id": ["train", "val"], "share": [0.9, 0.1]})
    from great_expectations.expectations.row_conditions import Column

    return [
        Table("planted", "planted.parquet", rows, checks),
        Table("clean", "clean.parquet", clean, [*_not_null("v"), flag("flag", "v", "positive"),
                                                 _e(gxe.ExpectColumnValuesToBeBetween, "v", "v in [0, 3]", column="v",
                                                    min_value=0.0, max_value=3.0)]),
        Table("shares", "shares.parquet", shares, [
            _e(gxe.ExpectColumnValuesToBeBetween, "share", "train share <= 0.8", column="share", max_value=0.8,
               row_condition=Column("id") == "train"),
            _e(gxe.ExpectColumnValuesToNotBeNull, "share", "not null", column="share"),
        ]),
    ]


def _key(f) -> tuple:
    return (f.table, f.column, f.expectation, f.check, f.observed, tuple(f.examples))


def test_bundled_checks_report_what_separate_expectations_report(tmp_path: Path) -> None:
    bundled = run_checkpoint(_tables(), tmp_path / "b", tmp_path / "bd", n_examples=2)
    separate = run_checkpoint(_tables(), tmp_path / "s", tmp_path / "sd", n_examples=2, bundle_rows=False)
    assert not bundled.success and not separate.success
    assert bundled.evaluated == separate.evaluated == 22 + 3 + 2
    assert sorted(map(_key, bundled.failures)) == sorted(map(_key, separate.failures))
    failed = {(f.table, f.check) for f in separate.failures}
    # every planted defect is among them (not a comparison of two empty lists), nothing else
    assert {c for t, c in failed if t == "planted.parquet"} == {
        "not null", "the flag holds", "stage known", "n is 1, 3 or 5", "n in [0, 4]", "n > 1 (strict)",
        "n < 5 (strict)", "x in [0, 1]", "ts in range", "unique", "seven rows", "naive ts in range", "node named"}
    assert ("shares.parquet", "train share <= 0.8") in failed
    assert not any(t == "clean.parquet" for t, _ in failed)
    # GE ran the bundle: its result names the failing checks as the values of failed_checks
    raw = json.loads((tmp_path / "b" / "gx_checkpoint_result.json").read_text())
    assert "ok: the flag holds" in json.dumps(raw)
    assert (tmp_path / "bd" / "index.html").exists()
    planted = _tables()[0]
    own, rows = bundle.split(planted.expectations, planted.frame)
    assert {e.meta["check"] for e in own} == {"naive ts in range", "node named", "mostly no twin", "six rows (passes)",
                                             "seven rows"}
    assert len(rows) == 17


def test_failed_checks_lists_each_rows_checks() -> None:
    frame = pl.DataFrame({"id": ["a", "b", "c"], "n": [1, None, 9], "f": [True, False, None]})
    exps = [*_not_null("n"), _e(gxe.ExpectColumnValuesToBeBetween, "n", "n <= 5", column="n", max_value=5),
            flag("f", "f", "flag"), flag("f", "f", "mostly", mostly=0.5)]
    own, rows = bundle.split(exps, frame)
    assert [type(e) for e in own] == [gxe.ExpectColumnValuesToBeInSet] and own[0].mostly == 0.5
    out = bundle.with_failed_checks(frame, rows)[bundle.COLUMN].cast(pl.String).to_list()
    assert out == ["", "n: not null; f: flag", "n: n <= 5"]
    with pytest.raises(ValueError, match="failed_checks"):
        bundle.with_failed_checks(frame.with_columns(pl.lit("").alias(bundle.COLUMN)), rows)


@pytest.mark.slow
def test_the_real_suites_report_alike_bundled_or_not(make_run, tmp_path: Path) -> None:
    """Every suite of `hir validate` on the tiny export with planted defects (a NaN, a short
    vector, a duplicate id, stages outside the configured set), both ways. The fast suite has
    the planted frames above, which hold every check kind and dtype these tables use."""
    from hir.data.snapshot import load_snapshot
    from hir.validate import stage

    cfg = make_run("v1", "validate.graph.stages=[view,click,cart]")
    run = Path(cfg.paths.output_dir)
    path = run / "embeddings" / "product.parquet"
    frame = pl.read_parquet(path)
    ids, emb = frame["entity_id"].to_list(), frame["embedding"].to_list()
    emb[3][5] = NAN
    emb[7] = emb[7][:10]
    ids[12] = ids[11]
    frame.with_columns(pl.Series("embedding", emb, dtype=pl.List(pl.Float32)), pl.Series("entity_id", ids)).write_parquet(path)
    snap = load_snapshot(run / "graph")
    emb_meta = json.loads((run / "embeddings" / "meta.json").read_text())
    g = cfg.validate.graph

    def tables() -> list[Table]:  # fresh expectations for each checkpoint (GE binds them to a suite)
        out = stage.graph_tables(snap, stage._stage_set(cfg, snap), datetime(2019, 1, 1, tzinfo=UTC),
                                 datetime(2030, 1, 1, tzinfo=UTC), {k: tuple(v) for k, v in g.split_share.items()},
                                 g.max_quarantine_share)
        return out + stage.embedding_tables(run / "embeddings", emb_meta, snap, int(emb_meta["dim"]), cfg.validate,
                                            None)[0]

    bundled = run_checkpoint(tables(), tmp_path / "b", tmp_path / "bd")
    separate = run_checkpoint(tables(), tmp_path / "s", tmp_path / "sd", bundle_rows=False)
    assert bundled.evaluated == separate.evaluated > 200
    assert sorted(map(_key, bundled.failures)) == sorted(map(_key, separate.failures))
    assert {f.check for f in separate.failures} >= {"all values finite", "length = 64", "unique"}
    assert any(f.table == "graph/events.parquet" and f.column == "stage" for f in separate.failures)
