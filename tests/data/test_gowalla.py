"""The Gowalla (LightGCN format) adapter on tiny fabricated files, and the real files when present."""

import hashlib
import json
from pathlib import Path

import polars as pl
import pytest

from hir.data.prepare import run
from hir.errors import InputError
from hir.stages import user_error
from tests.conftest import SHARED_DATA

TRAIN = ["0 0 1 2 3", "1 2 4 5", "2 0 5 6 7 8", "3 1 3"]
TEST = ["0 4 8", "1 0", "2 3", "3 9"]


def _files(tmp_path, train=TRAIN, test=TEST):
    (tmp_path / "train.txt").write_text("\n".join(train) + "\n")
    (tmp_path / "test.txt").write_text("\n".join(test) + "\n")
    return tmp_path / "train.txt", tmp_path / "test.txt"


def _prepare(compose, tmp_path, *overrides, train=TRAIN, test=TEST):
    tr, te = _files(tmp_path, train, test)
    cfg = compose("data=gowalla", f"data.adapter.train_path={tr}", f"data.adapter.test_path={te}",
                  "data.adapter.md5.train=null", "data.adapter.md5.test=null", "data.adapter.pairs.train=null",
                  "data.adapter.pairs.test=null", *overrides, stage="prepare")
    return run(cfg), cfg


def test_counts_exact_test_split_and_meta(compose, tmp_path):
    meta, cfg = _prepare(compose, tmp_path, "data.split.val_fraction=0.2", "data.split.seed=3")
    assert meta["input_rows"] == 14 + 5 == meta["kept_rows"] and meta["quarantined_rows"] == 0
    assert meta["sources"]["gowalla_train"]["input_rows"] == 14 and meta["sources"]["gowalla_test"]["input_rows"] == 5
    assert meta["nodes"] == {"user": 4, "product": 10}
    assert meta["stage_order"] == ["checkin"] and meta["deep_stage"] == "checkin"
    assert meta["splits"] == {"train": 11, "val": 3, "test": 5}  # val = round(0.2 * 14) train pairs
    split = meta["split"]
    assert split["mode"] == "random_pairs_heldout" and split["seed"] == 3 and split["val_fraction"] == 0.2
    assert split["test"] == "shipped file" and split["timestamps"] == "synthesized"
    graph = cfg.paths.graph_dir
    ev = pl.read_parquet(f"{graph}/events.parquet")
    # ids are the file's ids (every id occurs), and the test split is test.txt exactly
    test = sorted((int(line.split()[0]), int(i)) for line in TEST for i in line.split()[1:])
    assert sorted(ev.filter(pl.col("split") == "test").select("user_id", "entity_id").rows()) == test
    train = sorted((int(line.split()[0]), int(i)) for line in TRAIN for i in line.split()[1:])
    assert sorted(ev.filter(pl.col("split") != "test").select("user_id", "entity_id").rows()) == train
    assert json.loads(Path(f"{graph}/meta.json").read_text())["split"] == split
    edges = pl.read_parquet(f"{graph}/edges/user__engages__product.parquet")
    assert edges.height == 19 and set(edges["stage"]) == {"checkin"}


def test_bad_tokens_are_quarantined_with_their_line(compose, tmp_path):
    meta, cfg = _prepare(compose, tmp_path, train=[*TRAIN, "4 7 x 7"])
    assert meta["sources"]["gowalla_train"]["quarantine"] == {"unparseable_item": 1, "duplicate_pair": 1}
    q = pl.read_parquet(f"{cfg.paths.graph_dir}/quarantine/gowalla_train.parquet")
    assert q["_row"].to_list() == [5, 5] and q["item"].to_list() == ["x", "7"]


def test_md5_and_count_mismatch_name_the_file(compose, tmp_path):
    tr, _ = _files(tmp_path)
    good = hashlib.md5(tr.read_bytes()).hexdigest()
    with pytest.raises(Exception) as err:  # Hydra's instantiate wraps it; the CLI unwraps it the same way
        _prepare(compose, tmp_path, "data.adapter.md5.train=" + "0" * 32)
    assert isinstance(user_error(err.value), InputError)
    assert "train.txt has md5 " + good + ", expected " + "0" * 32 in str(user_error(err.value))
    with pytest.raises(Exception) as err:
        _prepare(compose, tmp_path, f"data.adapter.md5.train={good}", "data.adapter.pairs.test=6")
    assert "test.txt has 5 (user, item) pairs, expected 6" in str(user_error(err.value))


@pytest.mark.skipif(not (SHARED_DATA / "gowalla_lightgcn" / "train.txt").exists(), reason="../shared/data lacks gowalla")
def test_real_gowalla_matches_the_readme(compose):
    meta = run(compose("data=gowalla", stage="prepare"))
    assert meta["nodes"] == {"user": 29858, "product": 40981}
    assert meta["splits"]["train"] + meta["splits"]["val"] == 810128 and meta["splits"]["test"] == 217242
    assert meta["edges"]["user__engages__product"] == 1027370
