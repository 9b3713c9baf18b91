"""Callbacks for `hir train` beyond Lightning's own: the step-0 validation point (built in), the
choice of the checkpoint export uses, and fault injection (add it under ``callbacks:`` in the config)."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, TQDMProgressBar

from hir.atomic import atomic_path
from hir.model import INIT_CHECKPOINT
from hir.model.gate import CLOSED, compact
from hir.nn.net import close_correction

log = logging.getLogger(__name__)



class CrashAfterEpoch(Callback):
    """Fault injection: SIGKILL this process when epoch ``epoch + 1`` starts, i.e. right after
    epoch ``epoch`` finished and its checkpoint was written. For crash-recovery drills and the
    resume test::

        hir train +callbacks.crash._target_=hir.train.callbacks.CrashAfterEpoch +callbacks.crash.epoch=0
        hir train ++ckpt_path=last     # picks up from checkpoints/last.ckpt

    Args:
        epoch: the last epoch to complete before the kill.
    """

    def __init__(self, epoch: int = 0) -> None:
        self.epoch = int(epoch)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == self.epoch + 1:
            log.warning("CrashAfterEpoch: killing rank %d after epoch %d", trainer.global_rank, self.epoch)
            os.kill(os.getpid(), signal.SIGKILL)


class InitialValidation(Callback):
    """Validates the model before its first step and saves it as ``init.ckpt``.

    At step 0 the engagement view is exactly the spectral base (the transformer's corrections
    start at zero), so this point is what training must beat: it joins the validation history
    (epoch -1) and competes for the best checkpoint that export uses. Skipped on resume. A fit
    that runs no batch (``model.train_parts=none``: Lightning then skips the train start) records
    it at the fit's end, after the module's own fit start initialised the prototypes.

    Args:
        dirpath: the checkpoint directory.
        monitor: the metric compared (default ``val/recall@20``).
    """

    def __init__(self, dirpath: str | Path, monitor: str = "val/recall@20") -> None:
        self.dirpath, self.monitor = Path(dirpath), monitor
        self.score: float | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        self._record(trainer, pl_module)

    def on_fit_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        # no batch ran and no step-0 point exists yet (a resumed run brought its own)
        if self.score is None and not any(h.get("epoch") == -1 for h in pl_module.history):
            self._record(trainer, pl_module)

    def _record(self, trainer: L.Trainer, pl_module: Any) -> None:
        if trainer.global_step > 0 or not len(trainer.datamodule.val):
            return
        metrics = pl_module.validate_now()
        pl_module.history.append({"epoch": -1, "step": 0, **metrics, "gate": dict(pl_module.evidence_gate)})
        self.score = float(metrics[self.monitor])
        log.info("step 0 (spectral base, no correction yet): %s", {k: round(v, 4) for k, v in metrics.items()})
        if trainer.is_global_zero:
            self.dirpath.mkdir(parents=True, exist_ok=True)
            # the keys export reads (hir.export.embed.load_checkpoint), nothing of the loops
            with atomic_path(self.dirpath / INIT_CHECKPOINT) as tmp, tmp.open("wb") as fh:  # whole or absent
                torch.save({"state_dict": pl_module.state_dict(), "hyper_parameters": dict(pl_module.hparams),
                            "hir_history": list(pl_module.history)}, fh)


class StopBelowBase(Callback):
    """Stops training when none of its first ``checks`` validations beat the step-0 base (the
    paired gain over the base's per-user recall, ``val/gain_over_base``, is not positive): a
    learner that cannot beat its base early spends no more time (export then takes the base).
    With a correction the gain is the evidence-gated model's (the correction only for the users
    it helps on val), so training that helps sparse users is not stopped for the crowd.

    Args:
        checks: validations (after step 0) to wait for a gain.
    """

    def __init__(self, checks: int = 2) -> None:
        self.checks = int(checks)
        self.stopped = False

    def on_validation_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        epochs = [h for h in pl_module.history if h.get("epoch", -1) >= 0 and "val/gain_over_base" in h]
        if len(epochs) >= self.checks and not any(h["val/gain_over_base"] > 0 for h in epochs):
            log.info("no validation of the first %d beat the spectral base; stopping (export takes the base)",
                     len(epochs))
            trainer.should_stop = self.stopped = True


# the trained checkpoint with its correction closed: what export takes when the correction is rejected
CLOSED_CHECKPOINT = "closed.ckpt"


def write_closed_checkpoint(trained: Path, out: Path) -> None:
    """``trained`` (a Lightning checkpoint of a fit) with the correction's gate at 0
    (:func:`hir.nn.net.close_correction`), written atomically to ``out`` with the keys export reads
    (as ``init.ckpt``): the engagement view is the spectral base, and the knowledge view, the
    prototypes and the scale heads are the trained ones."""
    ckpt = torch.load(trained, map_location="cpu", weights_only=True)
    with atomic_path(out) as tmp, tmp.open("wb") as fh:  # whole or absent
        torch.save({"state_dict": close_correction(ckpt["state_dict"]), "hyper_parameters": ckpt["hyper_parameters"],
                    "hir_history": list(ckpt.get("hir_history", [])), "closed_from": trained.name}, fh)


def best_checkpoint(history: list[dict[str, float]], monitor: str, ckpt_dir: Path, best_cb: ModelCheckpoint,
                    write: bool = True) -> dict[str, Any]:
    """The validation point export should use: the best epoch by ``monitor`` (``best.ckpt``,
    ``best_cb``'s) only when it beats the step-0 base by more than the paired noise (the lower end
    of its paired-bootstrap 95% interval over val users, ``val/gain_lo``, is above 0) and its
    evidence gate is open for some users. With a correction, ``monitor`` and the gain are the
    *gated* model's (:meth:`hir.train.module.HirModule.val_metrics`): the correction for the users
    it helps on val, the base for the others; so a correction that helps sparse users is kept for
    them rather than rejected for the crowd.

    Otherwise the correction is rejected, and only the correction: export takes the best epoch's
    checkpoint with the correction's gate closed (``closed.ckpt``, written here when ``write``,
    :func:`write_closed_checkpoint`), whose engagement view is the spectral base (export refits it
    on every visible split) and whose knowledge view (the cold and rare path), prototypes and
    scale heads are trained. (``init.ckpt`` would compare a trained base arm with an untrained
    knowledge view.) Without a trained epoch, the step-0 point (``init.ckpt``).

    Returns its ``checkpoint``, ``epoch``, ``step``, ``score`` (the validation of the correction
    taken: the step-0 point's when it is rejected), the step-0 ``base_score``, the
    ``gain_over_base`` with its interval, ``closed_from`` (the epoch whose trained weights a closed
    checkpoint holds) and ``why``."""
    points = [h for h in history if monitor in h]
    if not points:
        return {"checkpoint": str(ckpt_dir / "last.ckpt"), "epoch": -1, "score": float("nan")}
    init = next((h for h in points if h["epoch"] == -1), None)
    epochs = [h for h in points if h["epoch"] >= 0]
    top = max(epochs, key=lambda h: (h[monitor], -h["step"])) if epochs else None
    # the top epoch's evidence gate (hir.model.gate; absent in an older history: no gate): closed
    # means the correction helps no val users beyond the noise, so it is rejected
    top_gate = (top or {}).get("gate") or {}
    gate_closed = top_gate.get("max_events") == CLOSED
    beats = top is not None and (init is None or (top.get("val/gain_lo", -1.0) > 0 and not gate_closed))
    pick = top if beats else (init or top)
    trained = Path(best_cb.best_model_path or ckpt_dir / "last.ckpt")
    path = trained if pick is top else ckpt_dir / INIT_CHECKPOINT
    out: dict[str, Any] = {}
    if pick is not top and top is not None and trained.exists():
        path = ckpt_dir / CLOSED_CHECKPOINT
        if write:
            write_closed_checkpoint(trained, path)
        out["closed_from"] = {"checkpoint": trained.name, "epoch": int(top["epoch"]), "step": int(top["step"])}
    why = ("no step-0 point to compare with" if init is None else
           "beats the base beyond the paired noise" if beats else
           "the evidence gate is closed: the correction helps no val users beyond the noise; it is closed, "
           "the rest of the best epoch kept" if gate_closed and "closed_from" in out else
           "no epoch beats the base beyond the paired noise (val/gain_lo <= 0): the correction is closed, "
           "the rest of the best epoch kept" if "closed_from" in out else
           "no epoch beats the base beyond the paired noise (val/gain_lo <= 0)")
    out |= {"checkpoint": str(path), "epoch": int(pick["epoch"]), "step": int(pick["step"]), "score": float(pick[monitor]),
            "base_score": float(init[monitor]) if init else None, "why": why}
    if top is not None:
        out["best_epoch"] = {"epoch": int(top["epoch"]), "score": float(top[monitor]),
                             **{k: top[k] for k in ("val/gain_over_base", "val/gain_lo", "val/gain_hi") if k in top}}
    out["gain_over_base"] = float(pick[monitor] - init[monitor]) if init else None
    # what export applies (it reads the checkpoint's own ``hir_gate``): the users the correction reaches
    out["gate"] = compact(top_gate) if pick is top else {"max_events": CLOSED}
    return out


class ProgressBar(TQDMProgressBar):
    """Lightning's bar without ``v_num``: the logger's version is a fixed name (``train``), whose
    last four letters the stock bar prints as ``v_num: rain``, a figure no one can act on."""

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics
