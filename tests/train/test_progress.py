"""The train progress bar shows no ``v_num`` (the stock bar prints the fixed logger version's
last four letters, ``v_num: rain``)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger

from hir.train.callbacks import ProgressBar


def test_bar_has_no_version(tmp_path: Path):
    def metrics(bar: TQDMProgressBar) -> dict:
        trainer = L.Trainer(logger=CSVLogger(tmp_path, name="logs", version="train"), callbacks=[bar],
                            accelerator="cpu", devices=1)
        return bar.get_metrics(trainer, L.LightningModule())

    assert metrics(TQDMProgressBar()).get("v_num") == "rain"  # what users saw
    assert "v_num" not in metrics(ProgressBar())
