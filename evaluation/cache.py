"""Baseline fits cached across runs: the fits of `hir evaluate` that do not depend on the HIR
export (the ranking baseline and content arms; the popularity, item-kNN, LightGCN, GF-CF, content
and repeat retrieval arms) are stored under the snapshot's hash, so a second evaluation of the
same snapshot (another run of the pipeline, a sweep cell, ``force=true``) reuses them and says so.

Layout: ``<eval.cache.dir>/<snapshot hash>/<kind>-<arm>-<key>.pkl``. The snapshot hash is the
sha256 of every file of ``graph/`` (its quarantine left out), so two prepares that wrote the same
snapshot share one folder. The key is a sha256 of everything the fit reads besides the snapshot:
the arm's class and settings and, for a ranking fit, the feature arrays, labels, rows, seeds and
the ranker recipe themselves (so a changed feature can never be served a stale fit). A cache
file is written to a temporary name and renamed, so a killed run leaves no half-written entry.
Deleting the folder only costs time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pickle
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

# bump when the pickled payloads change shape (2: retrieval's Ranked carries the deep-funnel list,
# which a format-1 entry lacks: unpickled, it would read as "no deep list")
FORMAT = 2


# meta.json keys that say when and how fast a prepare ran, not what it wrote
VOLATILE_META = ("created", "timings_s")


def snapshot_hash(graph_dir: Path) -> str:
    """sha256 (hex) of the snapshot's files: paths relative to ``graph_dir`` and their bytes, in
    path order; ``quarantine/`` and temporary folders are left out (nothing evaluate reads), and so
    are meta.json's ``created`` and ``timings_s``, so two prepares of the same data (a second run
    directory) share one hash."""
    h = hashlib.sha256()
    graph_dir = Path(graph_dir)
    files = sorted(p for p in graph_dir.rglob("*") if p.is_file()
                   and not {"quarantine", "_tmp"} & set(p.relative_to(graph_dir).parts))
    for path in files:
        rel = path.relative_to(graph_dir)
        h.update(str(rel).encode() + b"\0")
        if str(rel) == "meta.json":
            meta = json.loads(path.read_text())
            h.update(json.dumps({k: v for k, v in meta.items() if k not in VOLATILE_META}, sort_keys=True).encode())
            continue
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def _feed(h: Any, obj: Any) -> None:
    """Hash ``obj`` into ``h``: arrays by dtype, shape and bytes; dataclasses, mappings and
    sequences recursively; anything else by its JSON (or repr)."""
    if isinstance(obj, np.ndarray):
        h.update(f"nd{obj.dtype.str}{obj.shape}".encode())
        h.update(np.ascontiguousarray(obj).tobytes())
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        h.update(f"dc{type(obj).__module__}.{type(obj).__qualname__}".encode())
        _feed(h, {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})
    elif isinstance(obj, dict):
        h.update(b"{")
        for k in sorted(obj, key=str):
            h.update(str(k).encode() + b":")
            _feed(h, obj[k])
        h.update(b"}")
    elif isinstance(obj, list | tuple):
        h.update(b"[")
        for v in obj:
            _feed(h, v)
        h.update(b"]")
    else:
        h.update(json.dumps(obj, sort_keys=True, default=repr).encode())


def fit_key(*parts: Any) -> str:
    """sha256 (hex) of ``parts`` (see :func:`_feed`)."""
    h = hashlib.sha256(f"hir-eval-cache-{FORMAT}".encode())
    for part in parts:
        _feed(h, part)
    return h.hexdigest()


class FitCache:
    """The cached fits of one snapshot.

    Args:
        root: ``eval.cache.dir`` (default ``<paths.cache_dir>/eval``).
        snapshot: the snapshot's hash (:func:`snapshot_hash`).
        enabled: ``eval.cache.enabled``; off, nothing is read or written.
    """

    def __init__(self, root: Path, snapshot: str, enabled: bool = True) -> None:
        self.dir = Path(root) / snapshot[:16]
        self.snapshot, self.enabled = snapshot, enabled
        self.reused: list[str] = []
        self.stored: list[str] = []
        # fits a second process of this evaluation stored (evaluation/retrieval/background.py)
        self.parallel: set[str] = set()

    def _path(self, kind: str, arm: str, key: str) -> Path:
        return self.dir / f"{kind}-{arm}-{key[:20]}.pkl"

    def get(self, kind: str, arm: str, key: str) -> Any | None:
        """The cached payload of ``arm``'s ``kind`` fit under ``key``, or None (logged when reused)."""
        path = self._path(kind, arm, key)
        if not self.enabled or not path.exists():
            return None
        try:
            with path.open("rb") as fh:
                payload = pickle.load(fh)
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError) as err:
            log.warning("evaluate cache: %s is unreadable (%s); fitting %s again", path, err, arm)
            return None
        if f"{kind}/{arm}" in self.parallel:
            log.info("evaluate cache: taking the %s fit of %s made in parallel by this evaluation", kind, arm)
            self.stored.append(f"{kind}/{arm}")
            return payload
        self.reused.append(f"{kind}/{arm}")
        log.info("evaluate cache: reusing the %s fit of %s from %s (snapshot %s; eval.cache.enabled=false refits)",
                 kind, arm, path, self.snapshot[:12])
        return payload

    def put(self, kind: str, arm: str, key: str, payload: Any) -> None:
        """Store ``payload`` atomically (a temporary name, then a rename)."""
        if not self.enabled:
            return
        path = self._path(kind, arm, key)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            with tmp.open("wb") as fh:
                pickle.dump(payload, fh, protocol=pickle.HIGHEST_PROTOCOL)
            tmp.replace(path)
        except OSError as err:  # a cache that cannot be written costs time, never the evaluation
            log.warning("evaluate cache: could not write %s (%s); the fit is not cached", path, err)
            return
        self.stored.append(f"{kind}/{arm}")

    def record(self) -> dict[str, Any]:
        """metrics.json's ``cache``: where, for which snapshot, what was reused and what stored."""
        return {"enabled": self.enabled, "dir": str(self.dir), "snapshot": self.snapshot,
                "reused": list(self.reused), "stored": list(self.stored),
                "fitted_in_parallel": sorted(self.parallel & set(self.stored))}


def cacheable(needs: Iterable[str]) -> bool:
    """An arm's fit is cached when it reads nothing of the HIR export."""
    return "hir" not in set(needs)
