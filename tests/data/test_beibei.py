"""The Beibei (GHCF format) adapter on tiny fabricated files, and the real files when present."""

import gzip
import hashlib
from pathlib import Path

import polars as pl
import pytest

from hir.data.prepare import run
from hir.data.snapshot import load_snapshot
from hir.errors import InputError
from hir.stages import user_error
from tests.conftest import SHARED_DATA

CART = ["0 0 1 2 3", "1 2 4 5", "2 0 5 6", "3 1 3 7"]
BUY = ["0 1 3", "1 4", "2 6", "3 7"]  # every bought pair was carted, as in the release
TEST = ["0 4", "1 2", "2 7", "3 0"]  # (1, 2) was carted before it was bought; the others were not
FILES = {"cart": CART, "train": BUY, "test": TEST}


def _pairs(lines: list[str]) -> list[tuple[int, int]]:
    return sorted((int(line.split()[0]), int(i)) for line in lines for i in line.split()[1:])


def _files(tmp_path: Path, **lines: list[str]) -> dict[str, Path]:
    paths = {}
    for key, default in FILES.items():
        paths[key] = tmp_path / f"{key}.txt.gz"
        paths[key].write_bytes(gzip.compress(("\n".join(lines.get(key, default)) + "\n").encode(), mtime=0))
    return paths


def _prepare(compose, tmp_path: Path, *overrides: str, **lines: list[str]):
    paths = _files(tmp_path, **lines)
    checks = [f"data.adapter.{check}.{key}=null" for check in ("md5", "pairs") for key in FILES]
    cfg = compose("data=beibei", *(f"data.adapter.{key}_path={p}" for key, p in paths.items()), *checks,
                  *overrides, stage="prepare")
    return run(cfg), cfg


def test_two_stages_shipped_test_and_pairs_split_together(compose, tmp_path):
    meta, cfg = _prepare(compose, tmp_path, "data.split.val_fraction=0.2", "data.split.seed=3")
    assert meta["input_rows"] == 13 + 5 + 4 == meta["kept_rows"] and meta["quarantined_rows"] == 0
    assert {k: v["input_rows"] for k, v in meta["sources"].items()} == {"beibei_cart": 13, "beibei_train": 5,
                                                                          "beibei_test": 4}
    assert meta["nodes"] == {"user": 4, "product": 8}
    assert meta["stage_order"] == ["cart", "purchase"] and meta["deep_stage"] == "purchase"
    split = meta["split"]
    assert split["mode"] == "random_pairs_heldout" and split["seed"] == 3 and split["val_fraction"] == 0.2
    assert split["test"] == "shipped file" and split["timestamps"] == "synthesized"
    assert split["pairs"] == 13 + 3  # the train files' pairs, plus the test pairs never carted
    assert not load_snapshot(cfg.paths.graph_dir).real_time  # no trend or recency may be read from them

    ev = pl.read_parquet(f"{cfg.paths.graph_dir}/events.parquet")
    # ids are the files' ids (every id occurs); the test split is the test file exactly, as purchases
    test = ev.filter(pl.col("split") == "test")
    assert sorted(test.select("user_id", "entity_id").rows()) == _pairs(TEST) and set(test["stage"]) == {"purchase"}
    seen = ev.filter(pl.col("split") != "test")
    for stage, lines in (("cart", CART), ("purchase", BUY)):
        assert sorted(seen.filter(pl.col("stage") == stage).select("user_id", "entity_id").rows()) == _pairs(lines)
    # val is round(0.2 * 13) pairs of the train files, and a carted-and-bought pair's two events share a split
    per_pair = seen.group_by("user_id", "entity_id").agg(pl.col("split").n_unique().alias("n"), pl.col("split").first())
    assert per_pair["n"].max() == 1 and (per_pair["split"] == "val").sum() == 3
    assert meta["splits"] == {"train": seen.height - (seen["split"] == "val").sum(),
                              "val": (seen["split"] == "val").sum(), "test": 4}
    edges = pl.read_parquet(f"{cfg.paths.graph_dir}/edges/user__engages__product.parquet")
    assert edges.group_by("stage").len().sort("stage").rows() == [("cart", 13), ("purchase", 5 + 4)]


def test_bad_tokens_are_quarantined_per_file(compose, tmp_path):
    meta, cfg = _prepare(compose, tmp_path, cart=[*CART, "4 2 y 2"])
    assert meta["sources"]["beibei_cart"]["quarantine"] == {"unparseable_item": 1, "duplicate_pair": 1}
    assert meta["sources"]["beibei_train"]["quarantine"] == {}
    q = pl.read_parquet(f"{cfg.paths.graph_dir}/quarantine/beibei_cart.parquet")
    assert q["_row"].to_list() == [5, 5] and q["item"].to_list() == ["y", "2"]


def test_md5_and_count_mismatch_name_the_file(compose, tmp_path):
    with pytest.raises(Exception) as err:  # Hydra's instantiate wraps it; the CLI unwraps it the same way
        _prepare(compose, tmp_path, "data.adapter.md5.cart=" + "0" * 32)
    assert isinstance(user_error(err.value), InputError)
    cart = tmp_path / "cart.txt.gz"
    found = hashlib.md5(cart.read_bytes()).hexdigest()
    message = str(user_error(err.value))
    assert f"beibei cart file: {cart} has md5 {found}, expected {'0' * 32}" in message
    assert "data.adapter.md5.cart=null" in message
    with pytest.raises(Exception) as err:
        _prepare(compose, tmp_path, "data.adapter.pairs.train=6")
    assert "train.txt.gz has 5 (user, item) pairs, expected 6" in str(user_error(err.value))


@pytest.mark.skipif(not (SHARED_DATA / "ghcf_beibei" / "cart.txt.gz").exists(), reason="../shared/data lacks beibei")
def test_real_beibei_matches_the_readme(compose):
    meta = run(compose("data=beibei", stage="prepare"))
    assert meta["nodes"] == {"user": 21716, "product": 7977} and meta["quarantined_rows"] == 0
    assert meta["splits"]["train"] + meta["splits"]["val"] == 282860 + 642622 and meta["splits"]["test"] == 21716
    stages = meta["stages_per_split"]
    assert sum(s.get("cart", 0) for s in stages.values()) == 642622
    assert sum(s.get("purchase", 0) for s in stages.values()) == 282860 + 21716
    # every bought pair was carted: the train files hold 642,622 pairs; 8,191 test pairs were never carted
    assert meta["split"]["pairs"] == 642622 + 8191
