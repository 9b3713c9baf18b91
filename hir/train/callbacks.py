"""Callbacks for `hir train` beyond Lightning's own (add them under ``callbacks:`` in the config)."""

from __future__ import annotations

import logging
import os
import signal

import lightning as L
from lightning.pytorch.callbacks import Callback

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
