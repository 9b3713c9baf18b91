"""Out of disk space: how hir recognises it, the one line it becomes, and the check before a write.

A full disk shows up differently in every library hir writes through: ``OSError(ENOSPC)`` from
Python, pyarrow and torch, ``sqlite3.OperationalError: database or disk is full`` from Feast's
SQLite registry and online store, a gRPC error carrying "No space left on device" from Milvus
Lite. :func:`is_out_of_space` knows them all; :func:`guard` turns one into :class:`OutOfSpace`,
a :class:`~hir.errors.HirError`, so the `hir` command prints one line and exits 2::

    hir publish: out of disk space writing the Feast online store (materialize of 'v2') in
    /srv/serving/feast (12.0 MB free there); the live version 'v1' is unchanged and serving,
    and the failed attempt's partial writes were removed. Fix: free space on that disk or set
    publish.store_dir to a larger one, then run the same command again
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hir.errors import HirError

# how the libraries hir writes through spell a full disk (lower case)
MARKERS = ("no space left on device", "database or disk is full", "disk quota exceeded", "sqlite_full",
           "not enough space", "disk is full")
ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def is_out_of_space(err: BaseException | None) -> bool:
    """Whether ``err`` or anything in its cause/context chain is a full disk."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in ERRNOS:
            return True
        if any(m in str(err).lower() for m in MARKERS):
            return True
        err = err.__cause__ or err.__context__
    return False


def free_bytes(path: str | Path) -> int:
    """Free bytes on the filesystem that holds ``path`` (or its nearest existing parent)."""
    p = Path(path).resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def human(n: float) -> str:
    """``1536`` -> ``1.5 KB`` (powers of 1024, one decimal)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def failed_file(err: BaseException | None) -> str | None:
    """The file named by the first ``OSError`` in ``err``'s chain that names one."""
    while err is not None:
        if isinstance(err, OSError) and err.filename:
            return str(err.filename)
        err = err.__cause__ or err.__context__
    return None


class OutOfSpace(HirError):
    """A write stopped by a full disk. The message says what was being written, where, the free
    space there, what is still served, and the fix; ``need`` is set when a check refused early."""

    def __init__(self, what: str, where: str | Path, served: str, fix: str, need: int | None = None) -> None:
        self.what, self.where, self.served, self.fix, self.need = what, str(where), served, fix, need
        # a server URL (Milvus, Redis) has no local filesystem to measure
        self.free = None if "://" in self.where else free_bytes(where)
        free = f"{human(self.free)} free there" if self.free is not None else "free space unknown: a server"
        needed = f", about {human(need)} needed" if need is not None else ""
        verb = "not enough disk space to write" if need is not None else "out of disk space writing"
        super().__init__(f"{verb} {what} in {where} ({free}{needed}); {served}. Fix: {fix}")


@contextmanager
def guard(what: str, where: str | Path, served: str, fix: str) -> Iterator[None]:
    """Turn a full disk inside the block into :class:`OutOfSpace` (other errors pass unchanged)."""
    try:
        yield
    except HirError:
        raise
    except Exception as err:
        if is_out_of_space(err):
            raise OutOfSpace(what, where, served, fix) from err
        raise


def require_free(what: str, where: str | Path, need: int, served: str, fix: str) -> int:
    """Refuse before writing when ``where``'s filesystem has less than ``need`` bytes free;
    returns the free bytes."""
    free = free_bytes(where)
    if free < need:
        raise OutOfSpace(what, where, served, fix, need=need)
    return free
