"""A full disk, however a library reports it, becomes one line naming what, where, the free
space and the fix; files written through hir.atomic are whole or absent."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest

from hir import space
from hir.atomic import atomic_path, remove_stale_tmp, write_text_atomic
from hir.stages import disk_full_error


def _chained() -> RuntimeError:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/data/x.parquet")
        except OSError as inner:
            raise RuntimeError("write failed") from inner
    except RuntimeError as outer:
        return outer


@pytest.mark.parametrize("err", [
    OSError(errno.ENOSPC, "No space left on device"),
    OSError(errno.EDQUOT, "Disk quota exceeded"),
    sqlite3.OperationalError("database or disk is full"),
    RuntimeError("<MilvusException: (code=1, message=write segment: No space left on device)>"),
    _chained(),
])
def test_every_spelling_of_a_full_disk_is_recognised(err: BaseException) -> None:
    assert space.is_out_of_space(err)


@pytest.mark.parametrize("err", [OSError(errno.EACCES, "Permission denied"), ValueError("bad value"),
                                 sqlite3.OperationalError("no such table: x")])
def test_other_errors_are_not(err: BaseException) -> None:
    assert not space.is_out_of_space(err)


def test_guard_turns_a_full_disk_into_one_line(tmp_path: Path) -> None:
    with pytest.raises(space.OutOfSpace) as info, space.guard("the thing", tmp_path, "v1 serves", "free space"):
        raise sqlite3.OperationalError("database or disk is full")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"out of disk space writing the thing in {tmp_path} (")
    assert "free there); v1 serves. Fix: free space" in msg
    with pytest.raises(ValueError), space.guard("x", tmp_path, "s", "f"):  # other errors pass unchanged
        raise ValueError("not space")


def test_require_free_refuses_before_writing(tmp_path: Path) -> None:
    assert space.require_free("a", tmp_path, 1, "s", "f") > 0
    with pytest.raises(space.OutOfSpace, match=r"not enough disk space to write a in .* about 1024\.0 TB needed"):
        space.require_free("a", tmp_path, 1 << 50, "s", "f")
    assert space.human(1536) == "1.5 KB" and space.human(10) == "10 B"


def test_a_stage_without_its_own_message_names_the_file(tmp_path: Path) -> None:
    cfg = SimpleNamespace(paths={"output_dir": str(tmp_path), "embeddings_dir": str(tmp_path / "embeddings")})
    err = disk_full_error("export", cfg, _chained())
    assert isinstance(err, space.OutOfSpace)
    assert str(err).startswith("out of disk space writing x.parquet in /data (")
    assert "nothing that is served changed" in str(err) and "\n" not in str(err)
    assert disk_full_error("export", cfg, ValueError("x")) is None
    # no file named (polars, torch): the configured path on the fullest disk
    err = disk_full_error("export", cfg, OSError(errno.ENOSPC, "No space left on device"))
    assert str(err).startswith("out of disk space writing the outputs of `hir export` (paths.")


def test_atomic_writes_are_whole_or_absent(tmp_path: Path) -> None:
    target = tmp_path / "meta.json"
    write_text_atomic(target, "old")
    with pytest.raises(OSError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert target.read_text() == "old" and not list(tmp_path.glob(".*.tmp"))
    (tmp_path / ".meta.json.999.tmp").write_text("a killed writer's")
    assert [p.name for p in remove_stale_tmp(tmp_path)] == [".meta.json.999.tmp"]
