"""A stand-in for `hir export` in tests: writes ``embeddings/`` exactly per docs/contracts.md.

For every entity type of a prepared snapshot (``graph/meta.json`` -> ``nodes``) it writes
``embeddings/<type>.parquet`` with one row per node: a random unit vector, ``top_k`` distinct
tokens per level drawn from that level's vocabulary with weights that sum to 1, the snapshot's
cold-start flag, and ``embeddings/meta.json``. ``noise`` > 0 perturbs the vectors of the same
``seed`` (a "retrained" version close to the first, for drift tests).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

TS = pl.Datetime("us", "UTC")


def _tokens(rng: np.random.Generator, n: int, vocab: int, k: int) -> np.ndarray:
    """(n, k) int32, distinct per row: the first k of a random permutation of the vocabulary."""
    return np.argsort(rng.random((n, vocab)), axis=1)[:, :k].astype(np.int32)


def _weights(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """(n, k) float32, positive, descending, rows sum to 1 (within float32 rounding)."""
    w = np.sort(rng.random((n, k)) + 0.05, axis=1)[:, ::-1]
    return (w / w.sum(axis=1, keepdims=True)).astype(np.float32)


def contract_rows(keys: pl.Series, node_ids: pl.Series, cold: pl.Series, etype: str, *, dim: int,
                  levels: Sequence[int], top_k: int, version: str, seed: Sequence[int], noise: float = 0.0,
                  created: datetime) -> pl.DataFrame:
    """One embeddings/<type>.parquet frame (docs/contracts.md) for the given entities."""
    n = len(keys)
    emb = np.random.default_rng(list(seed)).normal(size=(n, dim)).astype(np.float32)
    if noise:
        emb += np.random.default_rng([*seed, 1]).normal(scale=noise, size=(n, dim)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    cols: dict[str, Any] = {
        "entity_id": keys.cast(pl.String),
        "node_id": node_ids.cast(pl.Int64),
        "entity_type": pl.Series([etype] * n, dtype=pl.String),
        "embedding": pl.Series(emb).cast(pl.List(pl.Float32)),
        "cold_start": cold,
    }
    tok_rng = np.random.default_rng([*seed, 2])
    for level, vocab in enumerate(levels):
        cols[f"tokens_l{level}"] = pl.Series(_tokens(tok_rng, n, vocab, top_k)).cast(pl.List(pl.Int32))
        cols[f"weights_l{level}"] = pl.Series(_weights(tok_rng, n, top_k)).cast(pl.List(pl.Float32))
    return pl.DataFrame(cols).with_columns(
        pl.lit(version).alias("model_version"),
        pl.lit(created, TS).alias("event_timestamp"),
        pl.lit(created, TS).alias("created"),
    )


def write_export(
    graph_dir: Path,
    out_dir: Path,
    *,
    dim: int = 64,
    levels: Sequence[int] = (16, 128),
    top_k: int = 4,
    version: str = "v1",
    seed: int = 0,
    noise: float = 0.0,
    created: datetime | None = None,
    types: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Write ``out_dir/<type>.parquet`` and ``out_dir/meta.json``; returns the meta dict.

    Args:
        graph_dir: a prepared snapshot (``graph/``).
        out_dir: the ``embeddings/`` dir to write.
        dim: embedding width; vectors are (n, dim) float32, L2-normalised.
        levels: vocabulary size per hierarchy level, coarsest first.
        top_k: tokens per level per entity.
        version: ``model_version``.
        seed: vectors and tokens are a function of (seed, entity type).
        noise: std of Gaussian noise added to the seed's unit-variance vectors before they are
            normalised (0.3 gives a cosine of about 0.96 to the noiseless version).
        created: ``created``/``event_timestamp`` of every row (default: now).
        types: entity types to write (default: every type of the snapshot).
    """
    meta = json.loads((graph_dir / "meta.json").read_text())
    test_start = datetime.fromisoformat(meta["split_bounds"]["test_start"])
    created = created or datetime.now(UTC).replace(microsecond=0)
    out_dir.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    for t_idx, etype in enumerate(sorted(types or meta["nodes"])):
        nodes = pl.read_parquet(graph_dir / "nodes" / f"{etype}.parquet").sort("node_id")
        # as in prepare's meta.json: first event in the test period (never seen -> not cold)
        cold = (nodes["first_seen"] >= test_start).fill_null(False)
        frame = contract_rows(nodes["key"], nodes["node_id"], cold, etype, dim=dim, levels=levels, top_k=top_k,
                              version=version, seed=[seed, t_idx], noise=noise, created=created)
        frame.write_parquet(out_dir / f"{etype}.parquet")
        counts[etype] = frame.height
    out = {
        "model_version": version, "dim": dim, "levels": list(levels), "top_k": top_k,
        "counts": counts, "created": created.isoformat(),
    }
    (out_dir / "meta.json").write_text(json.dumps(out, indent=2))
    return out
