"""The Lightning Trainer of `hir train`: the process set-up, the Trainer with its callbacks and
logger, and what a finished fit reports (``train_metrics.json``)."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from omegaconf import DictConfig

from hir.atomic import remove_stale_tmp
from hir.settings import recorded
from hir.train.callbacks import InitialValidation, ProgressBar, best_checkpoint
from hir.train.checkpoint_io import AtomicCheckpointIO
from hir.train.datamodule import HirDataModule
from hir.train.module import HirModule, resolve_train_parts
from hir.train.stage import COMPARED
from hir_kernels import attention_backend

log = logging.getLogger(__name__)


def is_ddp(cfg: DictConfig) -> bool:
    strategy = cfg.trainer.get("strategy")
    return isinstance(strategy, str) and strategy.startswith("ddp")


def _ddp_relaunch_argv() -> None:
    """Make Lightning's DDP re-launch of this command (one process per extra device) run ``hir train``.

    The ``hir`` command rewrites ``sys.argv`` for Hydra (``["hir <stage>", *overrides, "stage=..."]``),
    which is not a runnable command line; Lightning re-runs ``sys.argv`` for ranks > 0 (adding the
    Hydra run dir). Restore an executable form, always for the train stage (also under ``hir
    pipeline``: the other ranks only train).
    """
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized() or "LOCAL_RANK" in os.environ:
        return
    exe = Path(sys.executable).with_name("hir")
    rest = [a for a in sys.argv[1:] if not a.startswith("stage=")]
    sys.argv = [str(exe), "train", *rest]


def prepare_process(cfg: DictConfig, ckpt_dir: Path) -> None:
    """Before a fit: quiet the teacher's eval-mode warning, make a DDP re-launch runnable, and
    drop the checkpoints of an earlier run when retraining (``force=true`` without ``ckpt_path``)."""
    # the teacher is in eval mode on purpose (no dropout, full ids): not worth a warning per fit
    warnings.filterwarnings("ignore", message=r".*module\(s\) in eval mode at the start of training.*")
    if is_ddp(cfg):
        _ddp_relaunch_argv()
    if cfg.get("ckpt_path") is None and cfg.force and ckpt_dir.exists():
        for old in ckpt_dir.glob("*.ckpt"):
            old.unlink()


def trainer_world(cfg: DictConfig) -> int:
    """Processes the trainer will run (``devices`` x ``num_nodes`` when both are plain ints, else 1)."""
    devices, nodes = cfg.trainer.get("devices", 1), cfg.trainer.get("num_nodes", 1)
    return int(devices) * int(nodes) if isinstance(devices, int) and isinstance(nodes, int) else 1


def build_trainer(cfg: DictConfig, ckpt_dir: Path, monitor: str, planned_steps: int | None = None,
                  batches_per_epoch: int | None = None) -> tuple[L.Trainer, ModelCheckpoint]:
    """``cfg.trainer`` with hir's built-in callbacks (the step-0 point, the best and the last
    checkpoint), ``cfg.callbacks`` and ``cfg.logger``; returns the trainer and its best-checkpoint
    callback. ``planned_steps`` (the training task's schedule, :meth:`hir.model.task.TaskConfig.planned_steps`)
    caps ``max_epochs`` at the epochs of ``batches_per_epoch`` that hold them, unless
    ``trainer.max_steps`` is set, so the warm-up and the cosine decay, planned over the trainer's
    stepping batches, happen inside the run. (As epochs, not ``max_steps``: a run resumed from
    ``last.ckpt`` under ``max_steps`` re-entered the finished epoch's end without its metrics.)"""
    best_cb = ModelCheckpoint(dirpath=str(ckpt_dir), filename="best", monitor=monitor, mode="max", save_top_k=1,
                              auto_insert_metric_name=False, enable_version_counter=False)
    # last.ckpt after every epoch, improved or not: what `ckpt_path=last` resumes from
    last_cb = ModelCheckpoint(dirpath=str(ckpt_dir), filename="last", monitor=None, save_top_k=1, every_n_epochs=1,
                              save_on_train_epoch_end=True, auto_insert_metric_name=False, enable_version_counter=False)
    callbacks = [InitialValidation(ckpt_dir, monitor), best_cb, last_cb]
    if cfg.trainer.get("enable_progress_bar", True):
        callbacks.append(ProgressBar())
    callbacks += [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    logger = instantiate(cfg.logger) if cfg.get("logger") else CSVLogger(save_dir=cfg.paths.output_dir, name="logs",
                                                                         version="train")
    # seeds are sharded by the datamodule itself (deterministic per rank); Lightning must not
    # re-shard. The train loader is rebuilt every epoch: a resumed run's first iterator is otherwise
    # created before the checkpoint's loop state is restored, i.e. with the wrong epoch.
    extra: dict[str, Any] = {}
    if planned_steps and batches_per_epoch and int(cfg.trainer.get("max_steps", -1) or -1) < 0:
        epochs = -(-int(planned_steps) // int(batches_per_epoch))
        extra["max_epochs"] = max(1, min(int(cfg.trainer.max_epochs), epochs))
        if int(planned_steps) < int(batches_per_epoch) and cfg.trainer.get("limit_train_batches") is None:
            # a plan shorter than one epoch (data.train_max_steps below it) is that many batches,
            # not a whole epoch: the schedule is planned over the stepping batches either way
            extra["limit_train_batches"] = int(planned_steps)
    parts = resolve_train_parts(str(cfg.model.get("train_parts", "all")), bool(cfg.model.net.get("transformer")))
    if parts == "none":
        # nothing learns: Lightning runs no batch, and InitialValidation records the step-0 point
        # (validated and saved as init.ckpt) at the fit's end instead of at the first batch
        extra |= {"limit_train_batches": 0, "max_epochs": 1}
    # checkpoints written beside their final name and renamed: a kill leaves a whole last.ckpt
    # (hir/train/checkpoint_io.py); a killed writer's temporary file goes now
    remove_stale_tmp(ckpt_dir)
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=logger, use_distributed_sampler=False,
                          reload_dataloaders_every_n_epochs=1, plugins=[AtomicCheckpointIO()], **extra)
    return trainer, best_cb


def backend_of(trainer: L.Trainer, module: HirModule) -> str:
    """The attention backend the network runs with on the trainer's device."""
    return attention_backend(trainer.strategy.root_device.type, module.net.config["attention_backend"])


def log_setup(trainer: L.Trainer, module: HirModule, dm: HirDataModule) -> None:
    """One line: the network's size and shape, its attention backend, the contexts, the val set."""
    if not trainer.is_global_zero:
        return
    c = module.net.config
    log.info("model: %d parameters, embedding dim %d (spectral rank %d + 1), width %d, %d layers x %d heads, "
             "levels %s; attention backend %s (config %r); contexts %d engagement / %d knowledge tokens + %d "
             "primitives; %d val users (%s)",
             sum(p.numel() for p in module.net.parameters()), module.net.dim, c["base_dim"], c["width"], c["depth"],
             c["heads"], list(c["hierarchy"]["levels"]), backend_of(trainer, module), c["attention_backend"],
             dm.sampler.eng_len, dm.sampler.know_len, c["hierarchy"]["levels"][0] if c["primitive_tokens"] else 0,
             len(dm.val), dm.val.protocol)


def in_dir(path: str | Path, ckpt_dir: Path) -> str:
    """``path`` as ``train_metrics.json`` records it: relative to ``ckpt_dir`` (where every
    checkpoint of a fit is written); a file outside it (none today) keeps its absolute path."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(ckpt_dir.resolve()))
    except ValueError:
        return str(path)


def fit_report(cfg: DictConfig, trainer: L.Trainer, module: HirModule, dm: HirDataModule, best_cb: ModelCheckpoint,
               ckpt_dir: Path, seconds: dict[str, float]) -> dict[str, Any]:
    """What ``train_metrics.json`` records of a finished fit (docs/contracts.md)."""
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if torch.is_tensor(v) and v.numel() == 1}
    # rank 0 writes the closed checkpoint when the correction is rejected; every rank reports its path
    best = best_checkpoint(module.history, module.monitor, ckpt_dir, best_cb, write=trainer.is_global_zero)
    early = next((c for c in trainer.callbacks if isinstance(c, EarlyStopping)), None)
    gate = any(type(c).__name__ == "StopBelowBase" and getattr(c, "stopped", False) for c in trainer.callbacks)
    stopped_by = ("train_parts=none" if module.train_parts == "none" else
                  "below_base" if gate else
                  "early_stopping" if early is not None and early.stopped_epoch > 0 else
                  "max_steps" if trainer.max_steps and 0 < trainer.max_steps <= trainer.global_step else
                  "max_time" if trainer.max_epochs and trainer.current_epoch < trainer.max_epochs else
                  "planned_steps" if dm.task_report.get("planned_epochs") == trainer.max_epochs else "max_epochs")
    return {
        "metrics": metrics,
        "history": module.history,
        "epochs": trainer.current_epoch,
        "global_step": trainer.global_step,
        "parameters": sum(p.numel() for p in module.net.parameters()),
        "attention_backend": backend_of(trainer, module),
        "world_size": trainer.world_size,
        "spectral": dm.spectral_report,
        "task": dm.task_report,
        "monitor": module.monitor,
        # checkpoints recorded relative to ckpt_dir (the metrics file's dir): a moved or copied
        # run dir still names its own (hir.export.embed.recorded_checkpoint reads both forms)
        "best": {**best, "checkpoint": in_dir(best["checkpoint"], ckpt_dir)},
        "stopped_by": stopped_by,
        "seconds": seconds,
        "contexts_per_s": round(module.contexts_seen / max(seconds["fit"], 1e-9), 1),
        "best_checkpoint": in_dir(best["checkpoint"], ckpt_dir),
        "last_checkpoint": "last.ckpt",
        "config": recorded(cfg, COMPARED),  # what a reusing `hir train` compares
    }
