"""`hir train trainer=ddp trainer.devices=2`: data-parallel training on CPU (gloo).

The fast tests check, in this process, what the two-process run relies on: the Trainer that
``trainer=ddp`` builds, the datamodule's deterministic and disjoint shards of each epoch's seeds,
and the command line Lightning re-launches for rank 1. The ``slow`` test runs two real CPU
processes through the `hir` command (Lightning re-launches it for rank 1 inside the same Hydra
run dir)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.strategies import DDPStrategy

from hir import cli, stages
from hir.train.datamodule import HirDataModule
from hir.train.trainer import build_trainer, prepare_process
from tests.conftest import ROOT, run_hir
from tests.train.fixtures import TINY_MODEL, compose

DDP = ["trainer=ddp", "trainer.devices=2"]


def test_ddp_trainer(tmp_path: Path) -> None:
    cfg = compose(tmp_path, "data=synthetic", *TINY_MODEL, *DDP)
    assert (cfg.trainer.strategy, cfg.trainer.devices, cfg.trainer.num_nodes, cfg.trainer.accelerator) == ("ddp", 2, 1, "auto")
    assert compose(tmp_path, "data=synthetic").trainer.get("strategy") is None  # the default: one process
    trainer, _ = build_trainer(cfg, tmp_path / "checkpoints", "val/recall@20")
    assert isinstance(trainer.strategy, DDPStrategy)
    assert trainer.world_size == 2 and trainer.num_devices == 2 and trainer.num_nodes == 1
    # one process per device, started by re-running this command (not spawned from a pickle)
    assert type(trainer.strategy.launcher).__name__ == "_SubprocessScriptLauncher"
    assert trainer.strategy._get_process_group_backend() == ("nccl" if torch.cuda.is_available() else "gloo")
    # the datamodule shards the seeds itself; the loader is rebuilt every epoch (resume-safe)
    assert trainer._accelerator_connector.use_distributed_sampler is False
    assert trainer.reload_dataloaders_every_n_epochs == 1


def _batches(dm: HirDataModule, rank: int, world: int, step: int = 0) -> list[dict[str, Any]]:
    """The train loader's batches for ``rank`` of ``world`` at global step ``step``."""
    dm.trainer = SimpleNamespace(global_rank=rank, world_size=world, global_step=step, accumulate_grad_batches=1)
    try:
        return list(dm.train_dataloader())
    finally:
        dm.trainer = None


def _seeds(batch: dict[str, Any]) -> list[int]:
    """The batch's seeds after its pair users."""
    return batch["seeds"][int(batch["n_users"]):].tolist()


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return torch.equal(a, b)


def test_seeds_are_sharded_by_rank(tiny_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = compose(tmp_path, "data=synthetic", *TINY_MODEL, *DDP, f"paths.graph_dir={tiny_run / 'graph'}",
                  f"paths.content_dir={tiny_run / 'content'}")
    dm = instantiate(cfg.datamodule, spectral_file=str(tmp_path / "spectral.npz"))
    dm.setup("fit")
    with caplog.at_level(logging.INFO, logger="hir.train.datamodule"):
        single = _batches(dm, 0, 1)
        ranks = [_batches(dm, r, 2) for r in (0, 1)]
    # each rank draws its own shard of the seeds: both say so, with the same batch count;
    # 192 seeds / 48 per batch = 4 global batches -> 2 steps per rank and epoch
    assert "train: 4 batches per epoch per rank (rank 0 of 1)" in caplog.text
    assert "train: 2 batches per epoch per rank (rank 0 of 2)" in caplog.text
    assert "train: 2 batches per epoch per rank (rank 1 of 2)" in caplog.text
    assert [len(b) for b in ranks] == [2, 2] and len(single) == 4
    # rank r takes global batches r, r + 2: together exactly one process's epoch, nothing twice
    for r in (0, 1):
        for i, batch in enumerate(ranks[r]):
            assert _equal(batch, single[2 * i + r]), (r, i)
    shard = [{s for b in ranks[r] for s in _seeds(b)} for r in (0, 1)]
    assert not shard[0] & shard[1]
    assert shard[0] | shard[1] == {s for b in single for s in _seeds(b)}
    assert len(shard[0]) == len(shard[1]) == 2 * 48
    # deterministic: rank 1 rebuilt draws the same batches
    assert all(_equal(a, b) for a, b in zip(ranks[1], _batches(dm, 1, 2), strict=True))
    # the next epoch (read from the global step, as after a resume) is a new draw, sharded alike
    later = [_batches(dm, r, 2, step=2) for r in (0, 1)]
    assert {s for b in later[0] for s in _seeds(b)} != shard[0]
    single_later = _batches(dm, 0, 1, step=4)
    for r in (0, 1):
        assert all(_equal(b, single_later[2 * i + r]) for i, b in enumerate(later[r]))
    # validation is sharded too: rank r embeds every other batch of the one-process embedding
    val = {}
    dm.embed_batch_size = 16  # several batches of the tiny val set
    for r, w in ((0, 1), (0, 2), (1, 2)):
        dm.trainer = SimpleNamespace(global_rank=r, world_size=w)
        val[r, w] = list(dm.val_dataloader())
    dm.trainer = None
    assert len(val[0, 1]) >= 2 and len(val[0, 2]) + len(val[1, 2]) == len(val[0, 1])
    for r in (0, 1):
        assert all(_equal(b, val[0, 1][2 * i + r]) for i, b in enumerate(val[r, 2]))


def test_rank_one_relaunches_hir_train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`hir pipeline ... trainer=ddp` rewrites sys.argv for Hydra; before the fit it is made a
    runnable `hir train` command, which Lightning re-runs for rank 1 in the same Hydra run dir."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from lightning.fabric.strategies.launchers.subprocess_script import _hydra_subprocess_cmd

    run = tmp_path / "run"
    overrides = ["data=synthetic", *TINY_MODEL, *DDP]
    stages.register_resolvers()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        hydra_cfg = hydra_compose("config", overrides=[*overrides, f"hydra.run.dir={run}"], return_hydra_config=True)
    monkeypatch.setattr(HydraConfig.instance(), "cfg", HydraConfig.instance().cfg)  # restored after the test
    HydraConfig.instance().set_config(hydra_cfg)  # as in a `hir` run
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None)  # run as the `hir` console script
    monkeypatch.setenv("OMP_WAIT_POLICY", os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))  # cli.main sets it
    launched: dict[str, Any] = {}

    def entry(stage: str):
        def _main() -> None:
            launched[stage] = list(sys.argv)
            cfg = compose(run, *overrides, stage=stage)
            prepare_process(cfg, run / "checkpoints")
            launched["after"] = list(sys.argv)
        return _main

    monkeypatch.setattr(stages, "_hydra_entry", entry)
    cli.main(["pipeline", *overrides])
    # what Hydra parses: the stage as argv[0], not a runnable command
    assert launched["pipeline"] == ["hir pipeline", *overrides, "stage=pipeline"]
    exe = str(Path(sys.executable).with_name("hir"))
    assert launched["after"] == [exe, "train", *overrides]  # the other ranks only train
    command, cwd = _hydra_subprocess_cmd(local_rank=1)
    assert command == [sys.executable, exe, "train", *overrides, f'hydra.run.dir="{run}"',
                       "hydra.job.name=train_ddp_process_1", "hydra.output_subdir=null"]
    assert cwd == os.getcwd()
    # that command is `hir train` with the same overrides, in the same run dir
    cli.main(command[2:])
    assert launched["train"] == ["hir train", *overrides, f'hydra.run.dir="{run}"', "hydra.job.name=train_ddp_process_1",
                                 "hydra.output_subdir=null", "stage=train"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        child = hydra_compose("config", overrides=launched["train"][1:], return_hydra_config=True)
    assert (child.stage, child.trainer.strategy, child.hydra.run.dir) == ("train", "ddp", str(run))
    assert (child.hydra.job.name, child.hydra.output_subdir) == ("train_ddp_process_1", None)  # its own log file
    # rank 1 itself (LOCAL_RANK set by the launcher) keeps its command line
    monkeypatch.setenv("LOCAL_RANK", "1")
    sys.argv = ["hir train", *overrides, "stage=train"]
    prepare_process(compose(run, *overrides), run / "checkpoints")
    assert sys.argv == ["hir train", *overrides, "stage=train"]


@pytest.mark.slow
def test_ddp_two_cpu_processes(tiny_run: Path, tmp_path: Path):
    run = tmp_path / "run"
    for sub in ("graph", "content"):
        shutil.copytree(tiny_run / sub, run / sub)
    res = run_hir("train", "data=synthetic", f"hydra.run.dir={run}", f"paths.cache_dir={run}/.cache", *TINY_MODEL,
                  *DDP, cwd=tmp_path, timeout=240)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-4000:]
    rank1 = (run / "train_ddp_process_1.log").read_text()
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in log + rank1
    # each rank draws its own shard of the seeds: both say so, with the same batch count
    assert "batches per epoch per rank (rank 0 of 2)" in log
    assert "batches per epoch per rank (rank 1 of 2)" in log + rank1
    # the data was laid out once, by a child process of rank 0, and both ranks mapped it: rank 1
    # neither loaded the graph nor fitted a base; the layout goes when the training is done
    assert "by a child process" in log and "(layout) spectral base" in log
    assert "[hir.model.store]" not in rank1 and "[hir.model.spectral]" not in rank1
    assert not (run / "train_data").exists()
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


def test_a_plan_shorter_than_an_epoch_trains_that_many_batches(tmp_path: Path) -> None:
    cfg = compose(tmp_path, "data=synthetic", *TINY_MODEL)
    # data.train_max_steps below one epoch (completejourney: 50 of 100 batches): that many batches
    trainer, _ = build_trainer(cfg, tmp_path / "checkpoints", "val/recall@20", planned_steps=50, batches_per_epoch=100)
    assert trainer.max_epochs == 1 and trainer.limit_train_batches == 50
    # a plan of whole epochs, or more than one, runs whole epochs (the last one rounded up)
    for planned, epochs in ((100, 1), (250, 3)):
        trainer, _ = build_trainer(cfg, tmp_path / "checkpoints", "val/recall@20", planned_steps=planned,
                                   batches_per_epoch=100)
        assert trainer.max_epochs == min(epochs, int(cfg.trainer.max_epochs)) and trainer.limit_train_batches == 1.0
    # a limit the user set wins (the learner benchmark's untrained arm: one batch)
    cfg = compose(tmp_path, "data=synthetic", *TINY_MODEL, "+trainer.limit_train_batches=1")
    trainer, _ = build_trainer(cfg, tmp_path / "checkpoints", "val/recall@20", planned_steps=50, batches_per_epoch=100)
    assert trainer.limit_train_batches == 1
