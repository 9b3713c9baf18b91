"""Files that are either complete or absent: write under a temporary name, then rename.

Stages reuse outputs that exist (``force=true`` redoes them), so a file that a kill or a full disk
cut short must never sit under its final name. ``os.replace`` within one directory is atomic on
POSIX filesystems: a reader (or the next run) sees the old file, the new one, or none, never a
torn one. The temporary name ends in ``.tmp`` so no stage's ``*.parquet`` / ``*.json`` glob sees it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def tmp_name(path: Path) -> Path:
    """``dir/.name.<pid>.tmp``: beside ``path`` (same filesystem, so the rename is atomic)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


@contextmanager
def atomic_path(path: str | Path, fsync: bool = True) -> Iterator[Path]:
    """Yield a temporary path to write; on success it becomes ``path`` (fsynced first, so a
    power cut cannot leave an empty file under the final name), on any error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(path)
    try:
        yield tmp
        if fsync and tmp.is_file():
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    """``Path(path).write_text(text)``, complete or not at all."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_parquet_atomic(frame: Any, path: str | Path, **kwargs: Any) -> None:
    """A polars DataFrame or pyarrow Table to ``path`` (parquet), complete or not at all."""
    with atomic_path(path) as tmp:
        if hasattr(frame, "write_parquet"):
            frame.write_parquet(tmp, **kwargs)
        else:
            import pyarrow.parquet as pq

            pq.write_table(frame, tmp, **kwargs)


def remove_stale_tmp(directory: str | Path) -> list[Path]:
    """Delete ``.*.tmp`` files a killed writer left in ``directory`` (not recursive); returns them."""
    directory = Path(directory)
    stale = sorted(directory.glob(".*.tmp")) if directory.is_dir() else []
    for p in stale:
        p.unlink(missing_ok=True)
    return stale
