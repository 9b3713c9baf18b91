"""The generic adapter: every class of bad input is either a clear error or a counted quarantine."""

import gzip
import json

import polars as pl
import pytest

from hir.data.adapters import events_csv
from hir.data.prepare import build_snapshot
from hir.data.raw import Quarantine
from hir.data.split import SplitSpec
from hir.errors import InputError

SPLIT = SplitSpec(val_fraction=0.2, test_fraction=0.2)

COLS = {"user": "uid", "item": "iid", "stage": "behavior", "timestamp": "ts"}
STAGES = {"pv": "view", "fav": "save", "cart": "cart", "buy": "purchase"}
GOOD = [
    "uid,iid,behavior,ts,qty",
    "u1,i1,pv,1570000000,1",
    "u1,i1,buy,1570000100,2",
    "u2,i2,pv,2019-10-01T00:05:00Z,1",
    "u2,i1,fav,2019-10-01 00:06:00,1",
    "u3,i2,cart,1570000500,1",
]


def _prepare(tmp_path, lines, **kw):
    path = tmp_path / "events.csv"
    path.write_text("\n".join(lines) + "\n")
    q = Quarantine(tmp_path / "graph" / "quarantine")
    args = {"columns": COLS, "stages": STAGES} | kw
    raw = events_csv.load(q, str(path), **args)
    meta = build_snapshot(raw, q, tmp_path / "graph", "events_csv", SPLIT)
    return meta, tmp_path / "graph"


def test_good_file_builds_a_reconciled_snapshot(tmp_path):
    meta, graph = _prepare(tmp_path, GOOD)
    assert meta["input_rows"] == 5 == meta["kept_rows"] and meta["quarantined_rows"] == 0
    assert meta["stage_order"] == ["view", "save", "cart", "purchase"]
    assert meta["nodes"] == {"user": 3, "product": 2}
    ev = pl.read_parquet(graph / "events.parquet")
    assert ev.height == 5 and set(ev["split"]) <= {"train", "val", "test"}
    assert (graph / "edges" / "user__engages__product.parquet").exists()


def test_bad_rows_are_quarantined_with_reasons_and_counted(tmp_path):
    bad = [
        "u4,i1,pv,not-a-time,1",  # unparseable timestamp
        "u4,i1,pv,1800-01-01,1",  # out of range
        "u4,i1,pv,1570000000,nan",  # NaN quantity
        "u4,i1,pv,1570000000,-3",  # negative quantity
        ",i1,pv,1570000000,1",  # missing user
        "u1,i1,pv,1570000000,1",  # duplicate of row 1
        "u5,i1,,1570000000,1",  # missing stage
    ]
    meta, graph = _prepare(tmp_path, GOOD + bad, columns=COLS | {"quantity": "qty"})
    assert meta["input_rows"] == 12
    assert meta["kept_rows"] == 5 and meta["quarantined_rows"] == 7
    assert meta["input_rows"] == meta["kept_rows"] + meta["quarantined_rows"]
    reasons = meta["sources"]["events"]["quarantine"]
    assert reasons == {
        "unparseable_timestamp": 1, "timestamp_out_of_range": 1, "non_finite_qty": 1,
        "negative_quantity": 1, "missing_user": 1, "duplicate_row": 1, "missing_stage": 1,
    }
    qdf = pl.read_parquet(graph / "quarantine" / "events.parquet")
    assert qdf.height == 7 and {"_row", "_reason", "_source"} <= set(qdf.columns)
    assert qdf.filter(pl.col("_reason") == "duplicate_row")["_row"].to_list() == [11]


def test_missing_column_names_the_column_and_role(tmp_path):
    lines = [line.rsplit(",", 2)[0] for line in GOOD]  # drop ts and qty
    lines[0] = "uid,iid,behavior"
    with pytest.raises(InputError, match=r"no column 'ts' \(mapped by data.columns.timestamp\)"):
        _prepare(tmp_path, lines)


def test_unmapped_stage_lists_the_values_seen(tmp_path):
    with pytest.raises(InputError) as err:
        _prepare(tmp_path, [*GOOD, "u9,i1,share,1570000000,1"])
    msg = str(err.value)
    assert "'share' (1 rows)" in msg and "data.stages" in msg and "'pv'" in msg


def test_custom_stage_needs_an_order(tmp_path):
    with pytest.raises(InputError, match=r"data\.stage_order"):
        _prepare(tmp_path, [*GOOD, "u9,i1,share,1570000000,1"], stages=STAGES | {"share": "share"})
    meta, _ = _prepare(
        tmp_path, [*GOOD, "u9,i1,share,1570000000,1"], stages=STAGES | {"share": "share"},
        stage_order=["view", "share", "save", "cart", "purchase"],
    )
    assert meta["deep_stage"] == "purchase" and meta["stages"]["share"] == 1


def test_entities_file_unknown_ids_and_taxonomy(tmp_path):
    ents = tmp_path / "items.csv"
    ents.write_text("iid,title,cat,color\ni1,red shoe,fashion.shoes,red\ni2,blue hat,fashion.hats,blue\ni2,dup,x,y\n")
    meta, graph = _prepare(
        tmp_path, [*GOOD, "u7,i9,pv,1570000000,1"], entities_path=str(ents),
        entity_columns={"key": "iid", "text": "title", "category": "cat"}, category_separator=".",
    )
    assert meta["sources"]["events"]["quarantine"] == {"unknown_item": 1}
    assert meta["entity_sources"]["entities_items"]["quarantine"] == {"duplicate_key": 1}
    products = pl.read_parquet(graph / "nodes" / "product.parquet")
    assert products.filter(pl.col("key") == "i1")["text"].item() == "red shoe"
    assert "attr_color" in products.columns
    cats = pl.read_parquet(graph / "nodes" / "category.parquet")
    assert set(cats["key"]) == {"fashion", "fashion.shoes", "fashion.hats"}
    assert meta["edges"]["category__child_of__category"] == 2


def test_non_utf8_row_is_quarantined(tmp_path):
    path = tmp_path / "events.csv"
    path.write_bytes(("\n".join(GOOD) + "\n").encode() + b"u\xff9,i1,pv,1570000000,1\n")
    q = Quarantine(tmp_path / "q")
    raw = events_csv.load(q, str(path), columns=COLS, stages=STAGES)
    build_snapshot(raw, q, tmp_path / "g", "x", SPLIT)
    assert q.events["events"].reasons == {"non_utf8_text": 1}


def test_parquet_input_and_gzip_csv(tmp_path):
    df = pl.read_csv(("\n".join(GOOD) + "\n").encode())
    df.write_parquet(tmp_path / "ev.parquet")
    q = Quarantine(tmp_path / "q")
    raw = events_csv.load(q, str(tmp_path / "ev.parquet"), columns=COLS, stages=STAGES)
    meta = build_snapshot(raw, q, tmp_path / "g", "x", SPLIT)
    assert meta["kept_rows"] == 5
    gz = tmp_path / "ev.csv.gz"
    gz.write_bytes(gzip.compress(("\n".join(GOOD) + "\n").encode()))
    q2 = Quarantine(tmp_path / "q2")
    raw2 = events_csv.load(q2, str(gz), columns=COLS, stages=STAGES)
    meta2 = build_snapshot(raw2, q2, tmp_path / "g2", "x", SPLIT)
    assert json.dumps(meta2["stages"]) == json.dumps(meta["stages"])
