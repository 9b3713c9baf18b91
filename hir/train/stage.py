"""`hir train`: graph snapshot + content -> Lightning checkpoints and ``train_metrics.json``.

    hir train                                   # CPU, conf/trainer/cpu.yaml
    hir train trainer=ddp trainer.devices=2     # multi-process (gloo on CPU, nccl on GPU)
    hir train ++ckpt_path=last                  # resume after a crash from checkpoints/last.ckpt
    hir train model.net.transformer=true        # train the user correction too (off by default)
    hir train model.net.bias.exposure=false     # ablate a bias term (a transformer's: with it on)
    hir train model.net.transformer=true model.train_parts=correction \
        model.warm_start=outputs/<data>/<run>/checkpoints   # the correction alone, on a trained model
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict

from hir.atomic import write_text_atomic
from hir.settings import changed, file_digests, log_reuse, recorded

# Idle OpenMP threads sleep instead of spinning. The model runs many small ops; with spinning
# threads, two intra-op threads on a busy 2-core machine measured 10x slower per step (4.2 vs
# 0.4 CPU-s). Only effective if torch is not imported yet (the OpenMP runtime reads it at load).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

log = logging.getLogger(__name__)

METRICS_FILE = "train_metrics.json"
LAST = "last.ckpt"


# what a training records of its config (train_metrics.json ``config``) and is compared on reuse;
# keys below change where or how fast it runs, or where it reads from, not what it learns
# (datamodule.spectral is spectral.* again)
COMPARED = ("model", "datamodule", "spectral", "trainer")
NOT_COMPARED = ("datamodule.spectral", "datamodule.graph_dir", "datamodule.content_dir", "datamodule.num_workers",
                "datamodule.pin_memory", "datamodule.persistent_workers", "datamodule.embed_batch_size", "trainer.accelerator",
                "trainer.devices", "trainer.num_nodes", "trainer.log_every_n_steps", "trainer.num_sanity_val_steps",
                "trainer.enable_progress_bar", "trainer.enable_model_summary", "trainer.default_root_dir")


def train_inputs(cfg: DictConfig) -> dict[str, str | None]:
    """What a training reads (train_metrics.json ``inputs``): the digests of the snapshot's and the
    content's meta.json (:func:`hir.settings.file_digests`)."""
    return file_digests({"graph": Path(cfg.paths.graph_dir) / "meta.json",
                         "content": Path(cfg.paths.content_dir) / "meta.json"})


def run(cfg: DictConfig) -> dict[str, Any]:
    """Train on ``paths.graph_dir`` + ``paths.content_dir``; returns the final metrics
    (``val/recall@K``, per-level prototype usage/entropy, last losses)."""
    ckpt_dir = Path(cfg.paths.checkpoint_dir)
    metrics_path = ckpt_dir / METRICS_FILE
    if metrics_path.exists() and not cfg.force and not cfg.get("ckpt_path"):
        report = json.loads(metrics_path.read_text())
        differ = changed(report.get("config", {}), recorded(cfg, COMPARED), NOT_COMPARED)
        had = report.get("inputs")
        differ += [f"{name}: another {name}/meta.json" for name, now in train_inputs(cfg).items()
                   if had is not None and had.get(name) != now]
        # reused all the same (a stage reuses what exists, docs/operations.md), but never silently
        log_reuse(log, "trained model", ckpt_dir, differ, "retrains")
        return report["metrics"]
    if not metrics_path.exists() and not cfg.force and cfg.get("ckpt_path") is None and (ckpt_dir / LAST).exists():
        # an earlier run of this dir stopped before finishing (killed, out of space): go on from
        # its last epoch; Lightning writes last.ckpt atomically, so it is whole or absent
        log.warning("%s exists without %s: an earlier training here was interrupted; resuming from it "
                    "(force=true starts over)", ckpt_dir / LAST, METRICS_FILE)
        cfg = cfg.copy()
        with open_dict(cfg):
            cfg.ckpt_path = str(ckpt_dir / LAST)

    # retraining: the old marker goes first, so a kill below never leaves it describing new checkpoints
    metrics_path.unlink(missing_ok=True)
    inputs = train_inputs(cfg)  # what this training reads, before it reads it
    import lightning as L
    from hydra.utils import instantiate

    from hir.model import SPECTRAL_FILE
    from hir.train import warm
    from hir.train.module import resolve_train_parts
    from hir.train.trainer import build_trainer, fit_report, is_ddp, log_setup, prepare_process, trainer_world

    prepare_process(cfg, ckpt_dir)
    warm_start = cfg.model.get("warm_start")
    warm_ckpt = None
    if warm_start and not cfg.get("ckpt_path"):  # (a resumed run has its own weights and basis)
        warm_ckpt = warm.resolve(warm_start)
        warm.copy_spectral(warm_ckpt, ckpt_dir / SPECTRAL_FILE, SPECTRAL_FILE)
    t0 = time.perf_counter()
    # the snapshot, its val set and spectral base: the network's sizes come from them
    # DDP: the data is laid out once per machine as memory-mapped files that every rank maps
    # (hir.train.datamodule.shared_state); one process builds it in memory, as always
    mapped = mapped_dir(cfg) if is_ddp(cfg) and trainer_world(cfg) > 1 else None
    # nothing trains (model.train_parts resolves to none): no batch reads the training task, so
    # it is not cut (a second store and spectral fit)
    parts = resolve_train_parts(str(cfg.model.get("train_parts", "all")), bool(cfg.model.net.get("transformer")))
    trains = parts != "none"
    dm = instantiate(cfg.datamodule, spectral_file=str(ckpt_dir / SPECTRAL_FILE),
                     reuse_spectral=bool(cfg.get("ckpt_path")) or warm_ckpt is not None,
                     mapped_dir=None if mapped is None else str(mapped), task_view=trains)
    dm.setup("fit")
    t_data = time.perf_counter() - t0
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    module = instantiate(cfg.model, net=dm.net_sizes, data=dm.recipe)
    if warm_ckpt is not None:
        warm.load_weights(module, warm_ckpt, module.net.config)
    if not module.net.use_transformer:
        # what export still needs from training when the engagement view is the base alone
        log.info("model.net.transformer=false (the default): the engagement view is the spectral base; training "
                 "fits what export needs besides it: the knowledge view (entities and users without a base, "
                 "`hir refresh`), the scale heads and the prototypes")
    trainer, best_cb = build_trainer(cfg, ckpt_dir, module.monitor, dm.task_report.get("planned_steps"),
                                     dm.batches_per_epoch(trainer_world(cfg)))
    dm.task_report["planned_epochs"] = trainer.max_epochs
    log_setup(trainer, module, dm)
    t1 = time.perf_counter()
    trainer.fit(module, datamodule=dm, ckpt_path=cfg.get("ckpt_path"), weights_only=True)
    seconds = {"load_graph": round(t_data - dm.spectral_report["seconds"] - dm.task_report["seconds"], 2),
               "spectral": dm.spectral_report["seconds"], "task": dm.task_report["seconds"],
               "fit": round(time.perf_counter() - t1, 2)}
    report = fit_report(cfg, trainer, module, dm, best_cb, ckpt_dir, seconds)
    report["inputs"] = inputs
    if trainer.is_global_zero:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        # atomic: train_metrics.json marks a finished training (reused unless force)
        write_text_atomic(metrics_path, json.dumps(report, indent=2))
        best = report["best"]
        log.info("trained in %.1fs (%d steps, stopped by %s); best %s = %.4f at epoch %d (%s; the spectral base "
                 "alone: %s)", seconds["fit"], trainer.global_step, report["stopped_by"], module.monitor, best["score"],
                 best["epoch"], ckpt_dir / best["checkpoint"], best.get("base_score"))
        if module.net.use_transformer:
            from hir.model.gate import gate_line

            log.info("the correction's evidence gate (export applies it): %s", gate_line(best.get("gate") or {}))
        print(f"checkpoints: {ckpt_dir}")
    if mapped is not None and trainer.local_rank == 0:
        # a finished training is reused, not resumed: its layout has no further reader (a rank
        # still mapping it keeps its pages until it exits)
        shutil.rmtree(mapped, ignore_errors=True)
        with contextlib.suppress(OSError):  # (another node's layout may still be there)
            mapped.parent.rmdir()
    return report["metrics"]


def mapped_dir(cfg: DictConfig) -> Path:
    """Where a DDP training lays its data out for the ranks of this machine (one directory per
    node: ``NODE_RANK``, so nodes sharing a filesystem do not collide)."""
    return Path(cfg.paths.output_dir) / "train_data" / f"node{int(os.environ.get('NODE_RANK', 0))}"
