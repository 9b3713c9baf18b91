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
