"""`hir train trainer=ddp trainer.devices=2`: two CPU processes (gloo) through the real CLI;
Lightning re-launches the command for rank 1 inside the same Hydra run dir."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
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
    rank1 = (run / "train_ddp_process_1.log").read_text()
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in log + rank1
    # each rank draws its own shard of the seeds: both say so, with the same batch count
    assert "batches per epoch per rank (rank 0 of 2)" in log
    assert "batches per epoch per rank (rank 1 of 2)" in log + rank1
    report = json.loads((run / "checkpoints" / "train_metrics.json").read_text())
    assert report["world_size"] == 2
    # seeds are sharded: 192 seeds / 48 per batch = 4 global batches -> 2 steps per rank and epoch
    assert report["global_step"] == 4
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 4
    # the synchronised steps moved the weights away from the step-0 model, and kept them finite
    init = torch.load(run / "checkpoints" / "init.ckpt", weights_only=True)["state_dict"]
    trained = ckpt["state_dict"]
    assert set(init) == set(trained)
    assert all(torch.isfinite(v).all() for v in trained.values() if v.is_floating_point())
    moved = [k for k in init if init[k].is_floating_point() and not torch.equal(init[k], trained[k])]
    assert len(moved) >= len(init) // 4, moved
    # the validation figure is the last history point's, recomputed on rank 0's full val set
    assert report["metrics"]["val/recall@20"] == pytest.approx(report["history"][-1]["val/recall@20"], abs=1e-6)
