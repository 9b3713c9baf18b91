"""`hir prepare` reuses an existing snapshot whatever the settings (docs/operations.md), but a
snapshot prepared under other data settings is never reused silently: the warning names them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hir.data import prepare
from tests.publish.fixtures import compose_at


def test_a_snapshot_reused_under_other_settings_says_which(tiny_graph: Path, tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    run = tmp_path / "elsewhere" / "run"  # another place: its cache and data paths differ, and do not count
    shutil.copytree(tiny_graph, run / "graph")
    recorded = json.loads((run / "graph" / "meta.json").read_text())["settings"]["data"]
    assert recorded["name"] == "synthetic" and recorded["split"]["val_fraction"] == 0.1
    with caplog.at_level("INFO", logger="hir.data.prepare"):
        assert prepare.run(compose_at(run, stage="prepare"))["settings"]["data"] == recorded
    assert "reusing it" in caplog.text and "other settings" not in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="hir.data.prepare"):
        prepare.run(compose_at(run, "data.split.val_fraction=0.2", "data.adapter.n_users=300", stage="prepare"))
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1, warned
    assert "data.split.val_fraction: 0.1 -> 0.2" in warned[0] and "data.adapter.n_users: 200 -> 300" in warned[0]
    assert "cache_dir" not in warned[0] and "force=true" in warned[0]


def test_a_source_file_changed_since_the_snapshot_is_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from tests.data.test_events_csv import GOOD

    csv = tmp_path / "events.csv"
    csv.write_text("\n".join(GOOD) + "\n")
    data = ("data=events_csv", f"data.path={csv}", "data.columns.user=uid", "data.columns.item=iid",
            "data.columns.stage=behavior", "data.columns.timestamp=ts",
            "data.stages={pv: view, fav: save, cart: cart, buy: purchase}",
            "data.split.val_fraction=0.2", "data.split.test_fraction=0.2")
    meta = prepare.run(compose_at(tmp_path / "run", stage="prepare", data=data))
    assert meta["sources"]["events"]["bytes"] == csv.stat().st_size
    with caplog.at_level("INFO", logger="hir.data.prepare"):
        prepare.run(compose_at(tmp_path / "run", stage="prepare", data=data))
    assert "reusing it" in caplog.text and "other files" not in caplog.text
    csv.write_text("\n".join([*GOOD, "u9,i2,buy,1570000900,1"]) + "\n")  # the same path, new rows
    caplog.clear()
    with caplog.at_level("INFO", logger="hir.data.prepare"):
        prepare.run(compose_at(tmp_path / "run", stage="prepare", data=data))
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and f"source file {csv} (" in warned[0] and "bytes)" in warned[0], warned
