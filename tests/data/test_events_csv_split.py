"""events_csv without timestamps, with a shipped test file, and the stage mapping as the user gives it."""

import json

import polars as pl
import pytest
from omegaconf import OmegaConf

from hir.data.adapters import events_csv
from hir.data.prepare import build_snapshot, run
from hir.data.raw import Quarantine
from hir.data.split import SplitSpec
from hir.errors import InputError

COLS = {"user": "uid", "item": "iid", "stage": "behavior", "timestamp": None}
STAGES = {"pv": "view", "buy": "purchase"}


def _write(path, rows, header="uid,iid,behavior"):
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def _rows(n_users=12, items=5, repeat=2):
    return [f"u{u},i{(u + k) % 9},{'buy' if k % 3 == 0 else 'pv'}" for u in range(n_users) for k in range(items)] * repeat


def _snapshot(tmp_path, path, split, **kw):
    q = Quarantine(tmp_path / "graph" / "quarantine")
    raw = events_csv.load(q, str(path), **({"columns": COLS, "stages": STAGES} | kw))
    return build_snapshot(raw, q, tmp_path / "graph", "events_csv", split), tmp_path / "graph"


def _check_split_matches_bounds(graph, meta):
    ev = pl.read_parquet(graph / "events.parquet")
    b = {k: pl.lit(v).str.to_datetime(time_zone="UTC") for k, v in meta["split_bounds"].items()}
    expected = (
        pl.when(pl.col("timestamp") >= b["test_start"]).then(pl.lit("test"))
        .when(pl.col("timestamp") >= b["val_start"]).then(pl.lit("val")).otherwise(pl.lit("train"))
    )
    assert ev.select((pl.col("split") == expected).all()).item(), "split disagrees with timestamps and bounds"
    return ev


def test_no_timestamps_gives_a_seeded_random_pair_split_with_consistent_times(tmp_path):
    path = _write(tmp_path / "ev.csv", _rows())
    meta, graph = _snapshot(tmp_path, path, SplitSpec(val_fraction=0.2, test_fraction=0.2, seed=5))
    assert meta["input_rows"] == meta["kept_rows"] == 120  # repeated rows are repeat engagement, not duplicates
    assert meta["split"]["mode"] == "random_pairs" and meta["split"]["seed"] == 5
    assert meta["split"]["timestamps"] == "synthesized" and meta["split"]["unit"] == "(user, entity) pair"
    ev = _check_split_matches_bounds(graph, meta)
    per_pair = ev.group_by("user_id", "entity_id").agg(pl.col("split").n_unique())
    assert per_pair["split"].max() == 1
    pairs = meta["split"]["pairs"]
    test_pairs = ev.filter(pl.col("split") == "test").select("user_id", "entity_id").n_unique()
    assert test_pairs == round(0.2 * pairs)
    again, _ = _snapshot(tmp_path / "again", path, SplitSpec(val_fraction=0.2, test_fraction=0.2, seed=5))
    assert again["splits"] == meta["splits"] and again["split_bounds"] == meta["split_bounds"]


def test_shipped_test_file_is_the_test_split_exactly(tmp_path):
    train = _write(tmp_path / "train.csv", _rows())
    test_rows = ["u1,i8,buy", "u2,i7,pv", "u2,i7,pv", "u30,i99,buy"]
    test = _write(tmp_path / "test.csv", test_rows)
    meta, graph = _snapshot(tmp_path, train, SplitSpec(val_fraction=0.25, seed=1), test_path=str(test))
    assert meta["split"]["mode"] == "random_pairs_heldout" and meta["split"]["test"] == "shipped file"
    assert meta["splits"]["test"] == 4 and meta["splits"]["train"] + meta["splits"]["val"] == 120
    assert set(meta["sources"]) == {"events", "test_events"} and meta["input_rows"] == 124
    ev = _check_split_matches_bounds(graph, meta)
    users = pl.read_parquet(graph / "nodes" / "user.parquet").select(pl.col("node_id").alias("user_id"), "key")
    items = pl.read_parquet(graph / "nodes" / "product.parquet").select(pl.col("node_id").alias("entity_id"),
                                                                        pl.col("key").alias("item"))
    got = (ev.filter(pl.col("split") == "test").join(users, on="user_id").join(items, on="entity_id")
           .select(pl.format("{},{},{}", "key", "item", pl.col("stage").replace({"view": "pv", "purchase": "buy"}))))
    assert sorted(got.to_series().to_list()) == sorted(test_rows)
    # val: a quarter of the train file's pairs, and every test user-item is cold only where it is new
    val_pairs = ev.filter(pl.col("split") == "val").select("user_id", "entity_id").n_unique()
    train_pairs = ev.filter(pl.col("split") != "test").select("user_id", "entity_id").n_unique()
    assert val_pairs == round(0.25 * train_pairs)
    assert meta["cold_start"] == {"user": 1, "product": 1}  # u30 and i99 exist only in the test file


def test_shipped_test_file_with_timestamps_stays_temporal(tmp_path):
    cols = COLS | {"timestamp": "ts"}
    train = _write(tmp_path / "train.csv", [f"u{k % 3},i{k % 4},pv,{1570000000 + k}" for k in range(20)],
                   "uid,iid,behavior,ts")
    test = _write(tmp_path / "test.csv", ["u1,i1,buy,1570001000", "u2,i3,buy,1570002000"], "uid,iid,behavior,ts")
    meta, graph = _snapshot(tmp_path, train, SplitSpec(val_fraction=0.2), columns=cols, test_path=str(test))
    assert meta["split"]["mode"] == "temporal_heldout" and meta["split"]["timestamps"] == "source"
    assert meta["splits"] == {"train": 16, "val": 4, "test": 2}
    _check_split_matches_bounds(graph, meta)
    early = _write(tmp_path / "early.csv", ["u1,i1,buy,1570000005"], "uid,iid,behavior,ts")
    with pytest.raises(InputError, match=r"early\.csv\) starts at .* train file \(.*train\.csv\)"):
        _snapshot(tmp_path / "x", train, SplitSpec(val_fraction=0.2), columns=cols, test_path=str(early))


def test_a_given_stage_mapping_replaces_the_default_and_refuses_unmapped_values(compose, tmp_path):
    cfg = compose("data=events_csv", "data.stages={pv: view, buy: purchase}", stage="prepare")
    assert OmegaConf.to_container(cfg.data.stages) == {"pv": "view", "buy": "purchase"}
    # a new raw name is a plain mapping entry, not a Hydra "not in struct" error
    cfg = compose("data=events_csv", "data.stages={collect: save, pv: view}", stage="prepare")
    assert OmegaConf.to_container(cfg.data.adapter.stages) == {"collect": "save", "pv": "view"}
    path = _write(tmp_path / "ev.csv", ["u1,i1,pv", "u1,i2,click", "u2,i1,collect"])
    with pytest.raises(InputError) as err:
        _snapshot(tmp_path, path, SplitSpec(), stages={"pv": "view", "buy": "purchase"})
    msg = str(err.value)
    assert "'click' (1 rows)" in msg and "'collect' (1 rows)" in msg and "Values seen: ['click', 'collect', 'pv']" in msg


def test_without_a_mapping_the_known_stage_names_apply_and_the_log_says_so(tmp_path, caplog):
    path = _write(tmp_path / "ev.csv", ["u1,i1,view", "u1,i2,click", "u2,i1,purchase", "u3,i2,view"])
    caplog.set_level("INFO")
    meta, _ = _snapshot(tmp_path, path, SplitSpec(val_fraction=0.25, test_fraction=0.25), stages=None)
    assert meta["stage_order"] == ["view", "click", "purchase"]
    assert "data.stages is not set" in caplog.text
    assert "pv->view" in caplog.text
    with pytest.raises(InputError, match=r"'share' \(1 rows\)"):
        _snapshot(tmp_path / "b", _write(tmp_path / "b.csv", ["u1,i1,share"]), SplitSpec(), stages=None)


def test_all_rows_quarantined_names_the_file_the_reason_the_column_and_values(compose, tmp_path):
    lines = ["uid,iid,behavior,ts", *[f"u{k},i{k},pv,{k % 7}x" for k in range(120)]]
    path = tmp_path / "events.csv"
    path.write_text("\n".join(lines) + "\n")
    cfg = compose("data=events_csv", f"data.path={path}", "data.columns.user=uid", "data.columns.item=iid",
                  "data.columns.stage=behavior", "data.columns.timestamp=ts", "data.stages={pv: view}", stage="prepare")
    with pytest.raises(InputError) as err:
        run(cfg)
    msg = str(err.value)
    assert f"{path}: all 120 rows quarantined: 120 unparseable timestamp in column 'ts' (values like '0x', '1x', '2x')" in msg
    assert "are the columns mapped right" in msg.lower()


def test_meta_json_records_the_split(tmp_path):
    path = _write(tmp_path / "ev.csv", _rows())
    meta, graph = _snapshot(tmp_path, path, SplitSpec(val_fraction=0.1, test_fraction=0.3, seed=2))
    written = json.loads((graph / "meta.json").read_text())
    assert written["split"] == meta["split"]
    assert written["split"]["val_fraction"] == 0.1 and written["split"]["test_fraction"] == 0.3
