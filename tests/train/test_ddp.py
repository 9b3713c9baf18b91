"""`hir train trainer=ddp trainer.devices=2`: two CPU processes (gloo) through the real CLI;
Lightning re-launches the command for rank 1 inside the same Hydra run dir."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from tests.conftest import run_hir
from tests.train.fixtures import TINY_MODEL


def test_ddp_two_cpu_processes(tiny_run: Path, tmp_path: Path):
    run = tmp_path / "run"
    for sub in ("graph", "content"):
        shutil.copytree(tiny_run / sub, run / sub)
    res = run_hir("train", "data=synthetic", f"hydra.run.dir={run}", f"paths.cache_dir={run}/.cache", *TINY_MODEL,
                  "trainer=ddp", "trainer.devices=2", cwd=tmp_path, timeout=240)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-4000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in log + (run / "train_ddp_process_1.log").read_text()
    report = json.loads((run / "checkpoints" / "train_metrics.json").read_text())
    assert report["world_size"] == 2
    # seeds are sharded: 192 seeds / 48 per batch = 4 global batches -> 2 steps per rank and epoch
    assert report["global_step"] == 4
    assert 0 <= report["metrics"]["val/recall@20"] <= 1
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 4
