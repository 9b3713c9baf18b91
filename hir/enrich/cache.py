"""On-disk vector cache shared across runs: ``sha256(encoder id + content) -> float32 vector``.

Layout: ``<root>/<encoder slug>/encoder.json`` (the full encoder id and its dim) and
``<root>/<encoder slug>/shard-*.parquet`` (columns ``key`` str, ``vec`` list<f32>). Each run
that encodes something appends one shard; shards are written to a temporary name and renamed,
so a reader never sees half a file and parallel runs (Hydra multirun) never overwrite each
other. Past ``max_shards`` the shards are merged into one. A vector is a pure function of its
key, so duplicate keys across shards are harmless and a shard that disappears between listing
and reading (merged by another process) only costs a re-encode.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import polars as pl

from hir.errors import HirError

log = logging.getLogger(__name__)


class Encoder(Protocol):
    """What the enrich stage needs from a text or image encoder.

    ``name`` identifies the encoder and its weights (it keys the cache, so it must change when
    the vectors would); ``dim`` is the output width; ``encode`` maps n inputs (texts, or image
    paths) to an ``(n, dim)`` float32 array.
    """

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def encode(self, items: Sequence) -> np.ndarray: ...


def sha256_hex(*parts: str | bytes) -> str:
    """Hex sha256 of the parts, each prefixed with its length so ("ab", "c") != ("a", "bc")."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def _slug(encoder_id: str) -> str:
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", encoder_id)[:60].strip("_")
    return f"{readable}-{sha256_hex(encoder_id)[:12]}"


class VectorCache:
    """Vectors of one encoder, addressed by ``key(content)``.

    Args:
        root: cache root (``<paths.cache_dir>/content``); created on first write.
        encoder_id: the encoder's ``name``; part of every key and of the directory name.
        max_shards: merge the shards into one when a write would leave more than this many.
    """

    def __init__(self, root: str | Path, encoder_id: str, max_shards: int = 16) -> None:
        self.encoder_id = encoder_id
        self.dir = Path(root) / _slug(encoder_id)
        self.max_shards = max_shards

    def __repr__(self) -> str:
        return f"VectorCache({self.dir}, shards={len(self._shards())})"

    def key(self, content: str | bytes) -> str:
        """The cache key of one text (or one image's digest) under this encoder."""
        return sha256_hex(self.encoder_id, content)

    @property
    def dim(self) -> int | None:
        """The vector width recorded by the first write, or None for an empty cache."""
        meta = self.dir / "encoder.json"
        return int(json.loads(meta.read_text())["dim"]) if meta.exists() else None

    def _shards(self) -> list[Path]:
        return sorted(self.dir.glob("shard-*.parquet"))

    def lookup(self, keys: Sequence[str], dim: int) -> tuple[np.ndarray, np.ndarray]:
        """Vectors for ``keys``: ``(vectors (n, dim) float32, found (n,) bool)``; rows not found
        are zeros."""
        vectors = np.zeros((len(keys), dim), dtype=np.float32)
        found = np.zeros(len(keys), dtype=bool)
        if not keys:
            return vectors, found
        wanted = pl.DataFrame({"key": list(keys)}).with_row_index("i")
        for shard in self._shards():
            remaining = wanted.filter(~pl.Series(found[wanted["i"].to_numpy()]))
            if remaining.is_empty():
                break
            try:
                hits = pl.scan_parquet(shard).join(remaining.lazy(), on="key", how="inner").collect()
            except FileNotFoundError:  # merged away by a concurrent run since we listed it
                continue
            if hits.is_empty():
                continue
            widths = hits["vec"].list.len().unique().to_list()
            if widths != [dim]:
                raise HirError(
                    f"content cache {shard} holds vectors of width {widths} but encoder "
                    f"{self.encoder_id!r} gives {dim}-d; delete {self.dir} to rebuild it"
                )
            block = hits["vec"].cast(pl.Array(pl.Float32, dim)).to_numpy()
            idx = hits["i"].to_numpy()
            vectors[idx] = block
            found[idx] = True
        return vectors, found

    def put(self, keys: Sequence[str], vectors: np.ndarray) -> None:
        """Store ``vectors`` (n, dim) under ``keys`` as one new shard (atomic rename)."""
        if len(keys) == 0:
            return
        assert vectors.ndim == 2 and vectors.shape[0] == len(keys), (vectors.shape, len(keys))
        self.dir.mkdir(parents=True, exist_ok=True)
        meta = self.dir / "encoder.json"
        if not meta.exists():
            _atomic_write_text(meta, json.dumps({"encoder": self.encoder_id, "dim": int(vectors.shape[1])}))
        frame = pl.DataFrame(
            {"key": list(keys), "vec": pl.Series(vectors.astype(np.float32, copy=False)).cast(pl.List(pl.Float32))}
        )
        _atomic_write_parquet(frame, self.dir / f"shard-{uuid.uuid4().hex}.parquet")
        if len(self._shards()) > self.max_shards:
            self.compact()

    def compact(self) -> None:
        """Merge every shard into one (deduplicated by key)."""
        shards = self._shards()
        if len(shards) < 2:
            return
        parts = []
        for shard in shards:
            try:
                parts.append(pl.read_parquet(shard))
            except FileNotFoundError:
                continue
        merged = pl.concat(parts).unique("key", keep="first", maintain_order=True)
        _atomic_write_parquet(merged, self.dir / f"shard-{uuid.uuid4().hex}.parquet")
        for shard in shards:
            shard.unlink(missing_ok=True)
        log.info("content cache %s: merged %d shards (%d vectors)", self.dir, len(shards), merged.height)


def _atomic_write_parquet(frame: pl.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    frame.write_parquet(tmp)
    tmp.replace(path)


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
