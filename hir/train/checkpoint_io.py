"""Checkpoints that are whole or absent, written beside their final name.

Lightning 2.6 saves through an fsspec transaction whose temporary file is made by
``tempfile.mkstemp()`` in the system temp dir, then moved. When checkpoints live on another
filesystem than /tmp, that move is a copy into the final name: a kill during it leaves a torn
``last.ckpt`` (and the resume after it fails to load), and a full /tmp stops training although
the checkpoint disk has room. This plugin writes ``.<name>.<pid>.tmp`` beside the checkpoint and
renames it (:func:`hir.atomic.atomic_path`), so `hir train` resumes from a whole ``last.ckpt``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from hir.atomic import atomic_path


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose ``save_checkpoint`` is write-temporary + fsync + rename."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"AtomicCheckpointIO takes no storage_options (got {storage_options!r})")
        with atomic_path(path) as tmp, tmp.open("wb") as fh:
            torch.save(checkpoint, fh)
