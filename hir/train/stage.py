"""`hir train`: graph snapshot + content -> Lightning checkpoints and ``train_metrics.json``.

    hir train                                   # CPU, conf/trainer/cpu.yaml
    hir train trainer=ddp trainer.devices=2     # multi-process (gloo on CPU, nccl on GPU)
    hir train ++ckpt_path=last                  # resume after a crash from checkpoints/last.ckpt
    hir train model.bias.exposure=false         # ablate a bias term
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

# Idle OpenMP threads sleep instead of spinning. The model runs many small ops; with spinning
# threads, two intra-op threads on a busy 2-core machine measured 10x slower per step (4.2 vs
# 0.4 CPU-s). Only effective if torch is not imported yet (the OpenMP runtime reads it at load).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

log = logging.getLogger(__name__)

METRICS_FILE = "train_metrics.json"


def best_checkpoint(history: list[dict[str, float]], monitor: str, ckpt_dir: Path, best_cb: Any) -> dict[str, Any]:
    """The validation point export should use: the best of the step-0 point (``init.ckpt``, the
    spectral base) and the epochs (``best.ckpt``), by ``monitor``; ties go to the earlier one."""
    from hir.train.callbacks import INIT_CHECKPOINT

    points = [h for h in history if monitor in h]
    if not points:
        return {"checkpoint": str(ckpt_dir / "last.ckpt"), "epoch": -1, "score": float("nan")}
    top = max(points, key=lambda h: (h[monitor], -h["step"]))
    init = next((h for h in points if h["epoch"] == -1), None)
    path = ckpt_dir / INIT_CHECKPOINT if top["epoch"] == -1 else Path(best_cb.best_model_path or ckpt_dir / "last.ckpt")
    return {"checkpoint": str(path), "epoch": int(top["epoch"]), "step": int(top["step"]), "score": float(top[monitor]),
            "base_score": float(init[monitor]) if init else None,
            "gain_over_base": float(top[monitor] - init[monitor]) if init else None}


NET_KEYS = ("width", "depth", "heads", "mlp_ratio", "dropout", "base_dropout", "attention_backend",
            "bias", "hierarchy", "primitive_tokens", "transformer", "content")


def net_config(cfg_model: DictConfig | dict, spec: dict[str, Any], base_dim: int) -> dict[str, Any]:
    """The plain keyword arguments of :class:`hir.nn.HirNet`: snapshot sizes, the spectral rank
    and ``model.*`` (:data:`NET_KEYS`)."""
    m = cfg_model if isinstance(cfg_model, dict) else OmegaConf.to_container(cfg_model, resolve=True)
    sizes = {k: spec[k] for k in ("n_types", "n_stages", "content_dim", "n_recency")}
    return {**sizes, "base_dim": int(base_dim), **{k: m[k] for k in NET_KEYS}}


def _container(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def _ddp_relaunch_argv(cfg: DictConfig) -> None:
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


def _is_ddp(cfg: DictConfig) -> bool:
    strategy = cfg.trainer.get("strategy")
    return isinstance(strategy, str) and strategy.startswith("ddp")


def run(cfg: DictConfig) -> dict[str, Any]:
    """Train on ``paths.graph_dir`` + ``paths.content_dir``; returns the final metrics
    (``val/recall@K``, per-level prototype usage/entropy, last losses)."""
    ckpt_dir = Path(cfg.paths.checkpoint_dir)
    metrics_path = ckpt_dir / METRICS_FILE
    ckpt_path = cfg.get("ckpt_path")
    if metrics_path.exists() and not cfg.force and not ckpt_path:
        log.info("trained model exists at %s; reusing it (force=true retrains)", ckpt_dir)
        return json.loads(metrics_path.read_text())["metrics"]

    import lightning as L
    import torch
    from hydra.utils import instantiate
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    from hir.model import SPECTRAL_FILE, SpectralConfig
    from hir.nn import HirNet
    from hir.train.callbacks import InitialValidation, ProgressBar
    from hir.train.datamodule import HirDataModule
    from hir.train.module import HirModule
    from hir_kernels import attention_backend

    # the teacher is in eval mode on purpose (no dropout, full ids): not worth a warning per fit
    warnings.filterwarnings("ignore", message=r".*module\(s\) in eval mode at the start of training.*")
    if _is_ddp(cfg):
        _ddp_relaunch_argv(cfg)
    if ckpt_path is None and cfg.force and ckpt_dir.exists():
        for old in ckpt_dir.glob("*.ckpt"):
            old.unlink()
    m = cfg.model
    t0 = time.perf_counter()
    dm = HirDataModule(cfg.paths.graph_dir, cfg.paths.content_dir, _container(m.graph), _container(m.context),
                       SpectralConfig(**_container(m.spectral)), ckpt_dir / SPECTRAL_FILE, seed=cfg.seed,
                       val_protocol=str(m.val_protocol), reuse_spectral=bool(ckpt_path),
                       pair_entities=float(m.objective.weights.get("contrastive", 0.0)) > 0, **_container(m.data))
    dm.setup("fit")
    t_load = time.perf_counter() - t0
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    store, basis, spectral = dm.store, dm.basis, dm.spectral_report
    net_kw = net_config(m, store.spec, basis.rank)
    net = HirNet(**net_kw)
    module = HirModule(net, net_kw, _container(m.objective), _container(m.optim), list(m.val_k), cfg.seed,
                       data=dm.recipe)
    n_params = sum(p.numel() for p in net.parameters())
    monitor = f"val/recall@{int(m.monitor_k)}"
    best_cb = ModelCheckpoint(dirpath=str(ckpt_dir), filename="best", monitor=monitor, mode="max", save_top_k=1,
                              auto_insert_metric_name=False, enable_version_counter=False)
    # last.ckpt after every epoch, improved or not: what `ckpt_path=last` resumes from
    last_cb = ModelCheckpoint(dirpath=str(ckpt_dir), filename="last", monitor=None, save_top_k=1, every_n_epochs=1,
                              save_on_train_epoch_end=True, auto_insert_metric_name=False, enable_version_counter=False)
    init_cb = InitialValidation(ckpt_dir, monitor)
    callbacks = [init_cb, best_cb, last_cb]
    if cfg.trainer.get("enable_progress_bar", True):
        callbacks.append(ProgressBar())
    callbacks += [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    logger = instantiate(cfg.logger) if cfg.get("logger") else CSVLogger(save_dir=cfg.paths.output_dir, name="logs", version="train")
    # seeds are sharded by the datamodule itself (deterministic per rank); Lightning must not
    # re-shard. The train loader is rebuilt every epoch: a resumed run's first iterator is otherwise
    # created before the checkpoint's loop state is restored, i.e. with the wrong epoch.
    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=logger, use_distributed_sampler=False,
                                     reload_dataloaders_every_n_epochs=1)
    backend = attention_backend(trainer.strategy.root_device.type, m.attention_backend)
    if trainer.is_global_zero:
        log.info("model: %d parameters, embedding dim %d (spectral rank %d + 1), width %d, %d layers x %d heads, "
                 "levels %s; attention backend %s (config %r); contexts %d engagement / %d knowledge tokens + %d "
                 "primitives; %d val users (%s)",
                 n_params, net.dim, basis.rank, m.width, m.depth, m.heads, list(m.hierarchy.levels), backend,
                 m.attention_backend, dm.sampler.eng_len, dm.sampler.know_len,
                 m.hierarchy.levels[0] if m.primitive_tokens else 0, len(dm.val), dm.val.protocol)
    t1 = time.perf_counter()
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path, weights_only=True)
    t_fit = time.perf_counter() - t1
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if torch.is_tensor(v) and v.numel() == 1}
    if trainer.is_global_zero:
        best = best_checkpoint(module.history, monitor, ckpt_dir, best_cb)
        early = next((c for c in trainer.callbacks if isinstance(c, EarlyStopping)), None)
        stopped_by = ("early_stopping" if early is not None and early.stopped_epoch > 0 else
                      "max_time" if trainer.max_epochs and trainer.current_epoch < trainer.max_epochs else "max_epochs")
        report = {
            "metrics": metrics,
            "history": module.history,
            "epochs": trainer.current_epoch,
            "global_step": trainer.global_step,
            "parameters": n_params,
            "attention_backend": backend,
            "world_size": trainer.world_size,
            "spectral": spectral,
            "monitor": monitor,
            "best": best,
            "stopped_by": stopped_by,
            "seconds": {"load_graph": round(t_load - spectral["seconds"], 2), "spectral": spectral["seconds"],
                        "fit": round(t_fit, 2)},
            "contexts_per_s": round(module.contexts_seen / max(t_fit, 1e-9), 1),
            "best_checkpoint": best["checkpoint"],
            "last_checkpoint": str(ckpt_dir / "last.ckpt"),
            "config": {"model": _container(m), "trainer": _container(cfg.trainer)},
        }
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        metrics_path.write_text(json.dumps(report, indent=2))
        log.info("trained in %.1fs (%d steps, stopped by %s); best %s = %.4f at epoch %d (%s; the spectral base "
                 "alone: %s)", t_fit, trainer.global_step, stopped_by, monitor, best["score"], best["epoch"],
                 best["checkpoint"], best.get("base_score"))
        print(f"checkpoints: {ckpt_dir}")
    return metrics
