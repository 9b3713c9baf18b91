"""How a run's files record a checkpoint: relative to their own dir, so a run dir that was moved or
copied (a removed git worktree, a run copied elsewhere) still resolves to its own files; and how a
reader resolves both that form and the absolute paths older files hold.

    train_metrics.json  best_checkpoint "best.ckpt"                (relative to checkpoints/)
    embeddings/meta.json  checkpoint "../checkpoints/best.ckpt"    (relative to embeddings/)

Plain paths only (no torch): `hir publish` and `hir refresh` read them too.
"""

from __future__ import annotations

import os
from pathlib import Path

from hir.errors import InputError


def recorded_checkpoint(recorded: str, metrics: Path) -> Path:
    """A checkpoint as ``metrics`` (a ``train_metrics.json``) records it -> its file.

    `hir train` records it relative to the checkpoint dir, the metrics file's own, so a run dir
    that was moved or copied (a removed git worktree, a run copied elsewhere) still resolves to
    its own files. Files written before recorded the absolute path where the run was trained: the
    checkpoint of that name beside the metrics file is the one train wrote with it (checkpoints
    and metrics go to one dir), so it is taken when present, and the recorded path otherwise.
    """
    path = Path(recorded)
    if not path.is_absolute():
        return metrics.parent / path
    beside = metrics.parent / path.name
    if beside.exists():
        return beside
    if path.exists():
        return path
    raise InputError(f"{metrics} records the checkpoint {path}, which does not exist, and {beside} does not either; "
                     "retrain (`hir train force=true`) or set export.checkpoint=PATH")


def record_checkpoint(ckpt: Path, emb_dir: Path) -> str:
    """The checkpoint ``ckpt`` an export in ``emb_dir`` was made from, as its ``meta.json`` records
    it: relative to ``emb_dir`` (``../checkpoints/best.ckpt``) when it lies in the run dir, the
    export dir's parent, which moves with it; absolute otherwise (``export.checkpoint=PATH`` of
    another run: moving this run does not move that one)."""
    ckpt, emb_dir = Path(ckpt).resolve(), Path(emb_dir).resolve()
    if not ckpt.is_relative_to(emb_dir.parent):
        return str(ckpt)
    return os.path.relpath(ckpt, emb_dir)


def exported_checkpoint(recorded: str, emb_dir: Path) -> Path:
    """The checkpoint an export's ``meta.json`` (in ``emb_dir``) records -> its file.

    A relative path (:func:`record_checkpoint`) is taken from ``emb_dir``, wherever the run dir
    is now. An absolute one (exports written before, or a checkpoint outside the run dir) is
    taken when it exists; when it does not (the run dir was moved), the file of that name in the
    run's ``checkpoints/``, where `hir train` writes them, when that exists. Otherwise the
    recorded path, for the caller to report missing."""
    path = Path(recorded)
    if not path.is_absolute():
        return (Path(emb_dir) / path.parent).resolve() / path.name
    own = Path(emb_dir).parent / "checkpoints" / path.name
    return own if not path.exists() and own.exists() else path
