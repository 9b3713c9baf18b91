"""`hir refresh` finds the model of the live version (hir.publish.refresh.model_source) in a run dir
that was moved after the export, whichever form its meta.json records the checkpoint in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from hir.publish.refresh import model_source


@pytest.mark.parametrize("form", ["relative", "absolute (older exports)"])
def test_a_moved_run_dir_still_refreshes(tmp_path: Path, form: str) -> None:
    run = tmp_path / "run"
    for sub in ("graph", "content", "checkpoints", "embeddings"):
        (run / sub).mkdir(parents=True)
    (run / "checkpoints" / "best.ckpt").touch()
    recorded = "../checkpoints/best.ckpt" if form == "relative" else str(run / "checkpoints" / "best.ckpt")
    (run / "embeddings" / "meta.json").write_text(json.dumps({"checkpoint": recorded}))
    moved = run.rename(tmp_path / "moved")
    want = {"graph_dir": moved / "graph", "content_dir": moved / "content",
            "checkpoint": moved / "checkpoints" / "best.ckpt"}
    # refresh.run_dir=<the run dir now>
    cfg = OmegaConf.create({"refresh": {"run_dir": str(moved)}})
    assert model_source(cfg, {"version": "v1", "source": {}}) == want
    # a manifest that names the export dir only: the checkpoint from its meta.json
    cfg = OmegaConf.create({"refresh": {"run_dir": None}})
    assert model_source(cfg, {"version": "v1", "source": {"embeddings_dir": str(moved / "embeddings")}}) == want
