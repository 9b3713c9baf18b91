"""Objects whose arrays live in memory-mapped ``.npy`` files: laid out once, mapped by every process.

A DDP rank's data (the GraphStore, the task view's store, their spectral bases, the val sets,
the context samplers) is identical on every rank of a machine. :func:`save_mapped` writes such
an object once: each numpy array of at least ``MIN_BYTES`` goes to its own ``.npy`` file and the
rest of the object (dataclasses, dicts, small arrays) to ``objects.pkl``, which names the files.
:func:`load_mapped` rebuilds the object with every large array ``np.load(..., mmap_mode="r")``:
the pages are the page cache's, shared by every process that maps them, so a machine holds one
copy however many ranks read it, and a rank only faults in the pages it touches.

The arrays are read-only (a write raises ``ValueError: assignment destination is read-only``),
and equal bit for bit to the ones saved (``.npy`` stores the raw buffer). An array referenced
twice is saved once and loaded as one object; equal arrays (same dtype, shape and bytes) share
one file.

    save_mapped({"store": store, "base": base}, "cache/train")   # once, before the ranks start
    state = load_mapped("cache/train")                           # every rank
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np

# arrays under one page stay inside objects.pkl (a file and a mapping per small array cost
# more than they share; a val set's thousands of per-user index arrays are such)
MIN_BYTES = 1 << 12
OBJECTS = "objects.pkl"
DONE = "done.json"


class _Pickler(pickle.Pickler):
    """Pickles an object graph, writing each large numpy array to ``<dir>/<i>.npy`` instead."""

    def __init__(self, file: io.BufferedWriter, directory: Path, min_bytes: int) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.directory, self.min_bytes = directory, min_bytes
        self.saved: dict[int, tuple[str, np.ndarray]] = {}  # id -> (file, the array, kept alive)
        self.by_content: dict[tuple[str, tuple[int, ...], bytes], str] = {}  # (dtype, shape, digest) -> file

    def persistent_id(self, obj: Any) -> str | None:
        if type(obj) is not np.ndarray and not isinstance(obj, np.memmap):
            return None
        if obj.dtype.hasobject or obj.nbytes < self.min_bytes:
            return None
        hit = self.saved.get(id(obj))
        if hit is None:
            # equal arrays that are different objects (the task view's content rows are the train
            # store's) share one file, so their pages are mapped once
            key = (obj.dtype.str, obj.shape, hashlib.blake2b(np.ascontiguousarray(obj).data, digest_size=16).digest())
            name = self.by_content.get(key)
            if name is None:
                name = self.by_content[key] = f"{len(self.by_content)}.npy"
                # np.save writes the raw buffer (C order; a strided view is written as its copy)
                np.save(self.directory / name, obj, allow_pickle=False)
            hit = self.saved[id(obj)] = (name, obj)
        return hit[0]


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BufferedReader, directory: Path) -> None:
        super().__init__(file)
        self.directory = directory
        self.loaded: dict[str, np.ndarray] = {}

    def persistent_load(self, pid: Any) -> np.ndarray:
        if pid not in self.loaded:
            # a plain ndarray view of the read-only map (the map stays alive as its base)
            self.loaded[pid] = np.load(self.directory / str(pid), mmap_mode="r", allow_pickle=False).view(np.ndarray)
        return self.loaded[pid]


def save_mapped(obj: Any, directory: str | Path, fingerprint: dict[str, Any] | None = None,
                min_bytes: int = MIN_BYTES) -> dict[str, Any]:
    """Write ``obj`` (any picklable object graph holding numpy arrays) under ``directory``: each
    array of at least ``min_bytes`` to its own file, the rest inside ``objects.pkl``.

    ``done.json`` is written last (``fingerprint`` and the files' sizes): a directory without it
    is incomplete (a killed writer) and :func:`mapped_ready` says so. Returns what it records.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / DONE).unlink(missing_ok=True)
    for old in d.glob("*.npy"):
        old.unlink()
    with (d / OBJECTS).open("wb") as fh:
        p = _Pickler(fh, d, min_bytes)
        p.dump(obj)
    files = {name: a for name, a in p.saved.values()}
    done = {"fingerprint": _plain(fingerprint), "arrays": len(p.saved), "files": len(files),
            "array_bytes": int(sum(a.nbytes for a in files.values())),
            "objects_bytes": (d / OBJECTS).stat().st_size}
    tmp = d / f"{DONE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(done, indent=1))
    tmp.replace(d / DONE)
    return done


def mapped_ready(directory: str | Path, fingerprint: dict[str, Any] | None = None) -> bool:
    """Whether ``directory`` holds a complete layout written with ``fingerprint``."""
    f = Path(directory) / DONE
    if not f.exists():
        return False
    return json.loads(f.read_text()).get("fingerprint", {}) == _plain(fingerprint)


def _plain(fingerprint: dict[str, Any] | None) -> dict[str, Any]:
    """``fingerprint`` as JSON reads it back (paths and other values as their ``str``)."""
    return json.loads(json.dumps(fingerprint or {}, default=str))


def load_mapped(directory: str | Path) -> Any:
    """The object :func:`save_mapped` wrote, its large arrays mapped read-only from their files."""
    d = Path(directory)
    if not (d / DONE).exists():
        raise FileNotFoundError(f"{d}: no {DONE}; the layout is missing or incomplete (a writer was killed?): "
                                "delete the directory and lay it out again")
    with (d / OBJECTS).open("rb") as fh:
        return _Unpickler(fh, d).load()
