"""Stand-ins for the enrich and export stages, shaped exactly per docs/contracts.md, for tests
(and for developing `hir evaluate` before a trained model exists).

Unlike random vectors, these carry real signal, so the evaluation's arms can be told apart:
embeddings are a truncated SVD of the train-period user-entity matrix, tokens are each entity's
nearest prototypes (random unit directions, a 2-level tree), content vectors hash the entity's
words into a fixed random projection.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import scipy.sparse as sp

TS = pl.Datetime("us", "UTC")
EVAL_CONFIG = Path(__file__).resolve().parents[2] / "conf" / "eval" / "default.yaml"


def shipped_arm(registry: str, name: str, **settings: Any) -> Any:
    """The arm ``name`` of ``eval.<registry>`` (ranking / retrieval) as conf/eval/default.yaml
    ships it, with ``settings`` changed (tests shrink budgets; the defaults live in the YAML only)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    spec = OmegaConf.load(EVAL_CONFIG)[registry][name]
    return instantiate(OmegaConf.merge(spec, settings), _convert_="all")


def _svd_embeddings(graph_dir: Path, dim: int, seed: int) -> dict[str, np.ndarray]:
    """(n, dim) L2-normalised vectors for users and every engaged type from train-period edges."""
    meta = json.loads((graph_dir / "meta.json").read_text())
    events = pl.read_parquet(graph_dir / "events.parquet").filter(pl.col("split") == "train")
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    user_parts = []
    for etype in sorted(meta["nodes"]):
        if etype == "user":
            continue
        n_items = meta["nodes"][etype]
        ev = events.filter(pl.col("entity_type") == etype).select("user_id", "entity_id").unique()
        if ev.is_empty():
            out[etype] = rng.normal(size=(n_items, dim))
            continue
        x = sp.csr_matrix(
            (np.ones(ev.height), (ev["user_id"].to_numpy(), ev["entity_id"].to_numpy())),
            shape=(meta["nodes"]["user"], n_items),
        )
        k = max(1, min(dim, min(x.shape) - 1))
        u, s, vt = sp.linalg.svds(x.astype(np.float64), k=k, random_state=seed)
        items = np.zeros((n_items, dim))
        items[:, :k] = vt.T * np.sqrt(s)
        users = np.zeros((x.shape[0], dim))
        users[:, :k] = u * np.sqrt(s)
        # entities and users without train events get small noise so every vector has a norm
        items += 1e-3 * rng.normal(size=items.shape)
        out[etype] = items
        user_parts.append(users)
    out["user"] = np.sum(user_parts, axis=0) + 1e-3 * rng.normal(size=(meta["nodes"]["user"], dim))
    return {t: (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32) for t, v in out.items()}


def _prototypes(dim: int, levels: Sequence[int], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng([seed, 99])
    protos = []
    for size in levels:
        p = rng.normal(size=(size, dim))
        protos.append(p / np.linalg.norm(p, axis=1, keepdims=True))
    return protos


def write_export(
    graph_dir: Path,
    emb_dir: Path,
    hierarchy_dir: Path | None = None,
    *,
    dim: int = 16,
    levels: Sequence[int] = (4, 16),
    top_k: int = 2,
    seed: int = 0,
    version: str = "fixture-v1",
    event_timestamp: datetime | None = None,
) -> dict[str, Any]:
    """Write ``embeddings/<type>.parquet`` + meta.json (and ``hierarchy/`` when given).

    ``event_timestamp`` defaults to the snapshot's val_start: the embeddings encode the train
    period only, so they are valid from its end (point-in-time joins serve later rows).
    """
    meta = json.loads((graph_dir / "meta.json").read_text())
    stamp = event_timestamp or datetime.fromisoformat(meta["split_bounds"]["val_start"])
    test_start = datetime.fromisoformat(meta["split_bounds"]["test_start"])
    created = datetime.now(UTC).replace(microsecond=0)
    emb_dir.mkdir(parents=True, exist_ok=True)
    vectors = _svd_embeddings(graph_dir, dim, seed)
    protos = _prototypes(dim, levels, seed)
    usage: list[np.ndarray] = [np.zeros(s) for s in levels]
    counts = {}
    for etype, emb in vectors.items():
        nodes = pl.read_parquet(graph_dir / "nodes" / f"{etype}.parquet").sort("node_id")
        cols: dict[str, Any] = {
            "entity_id": nodes["key"].cast(pl.String),
            "node_id": nodes["node_id"],
            "entity_type": pl.Series([etype] * nodes.height, dtype=pl.String),
            "embedding": pl.Series(emb).cast(pl.List(pl.Float32)),
            "cold_start": (nodes["first_seen"] >= test_start).fill_null(False),
        }
        for level, p in enumerate(protos):
            sims = emb @ p.T
            top = np.argsort(-sims, axis=1)[:, :top_k]
            w = np.exp(np.take_along_axis(sims, top, axis=1) * 5)
            w = w / w.sum(1, keepdims=True)
            cols[f"tokens_l{level}"] = pl.Series(top.astype(np.int32)).cast(pl.List(pl.Int32))
            cols[f"weights_l{level}"] = pl.Series(w.astype(np.float32)).cast(pl.List(pl.Float32))
            np.add.at(usage[level], top[:, 0], 1)
        pl.DataFrame(cols).with_columns(
            pl.lit(version).alias("model_version"),
            pl.lit(stamp, TS).alias("event_timestamp"),
            pl.lit(created, TS).alias("created"),
        ).write_parquet(emb_dir / f"{etype}.parquet")
        counts[etype] = nodes.height
    out = {"model_version": version, "dim": dim, "levels": list(levels), "top_k": top_k, "counts": counts}
    (emb_dir / "meta.json").write_text(json.dumps(out, indent=2))
    if hierarchy_dir is not None:
        hierarchy_dir.mkdir(parents=True, exist_ok=True)
        rows = []
        for level, p in enumerate(protos):
            for i, vec in enumerate(p):
                parent = -1 if level == 0 else int(np.argmax(protos[level - 1] @ vec))
                rows.append({"level": level, "proto_id": i, "parent_id": parent, "vector": vec.astype(np.float32).tolist(),
                             "label": f"prototype {level}.{i}", "usage": float(usage[level][i] / usage[level].sum())})
        pl.DataFrame(rows).with_columns(
            pl.col("level").cast(pl.Int8), pl.col("proto_id").cast(pl.Int32), pl.col("parent_id").cast(pl.Int32),
            pl.col("vector").cast(pl.List(pl.Float32)),
        ).write_parquet(hierarchy_dir / "prototypes.parquet")
        (hierarchy_dir / "supergraph.json").write_text(json.dumps({
            "raw_density": 0.001, "levels": [{"level": k, "density": 0.001 * (10 - 4 * k)} for k in range(len(levels))]
        }))
    return out


def write_content(graph_dir: Path, content_dir: Path, dim: int = 32, types: Sequence[str] = ("product",)) -> None:
    """``content/<type>.parquet``: each word of an entity's text maps to a fixed random vector
    (seeded by the word's crc32); the text vector is their normalised sum (zeros without text)."""
    content_dir.mkdir(parents=True, exist_ok=True)
    for etype in types:
        nodes = pl.read_parquet(graph_dir / "nodes" / f"{etype}.parquet").sort("node_id")
        vecs, has = [], []
        for text in nodes["text"].to_list():
            words = (text or "").lower().replace(">", " ").replace(",", " ").split()
            v = np.zeros(dim)
            for w in words:
                v += np.random.default_rng(zlib.crc32(w.encode())).normal(size=dim)
            norm = np.linalg.norm(v)
            has.append(norm > 0)
            vecs.append((v / norm if norm > 0 else v).astype(np.float32))
        pl.DataFrame({
            "node_id": nodes["node_id"],
            "has_text": has,
            "text_vec": pl.Series(np.stack(vecs)).cast(pl.List(pl.Float32)),
            "attr_vec": pl.Series(np.zeros((nodes.height, 2), dtype=np.float32)).cast(pl.List(pl.Float32)),
            "content_hash": [f"{zlib.crc32((t or '').encode()):08x}" for t in nodes["text"].to_list()],
        }).write_parquet(content_dir / f"{etype}.parquet")
    (content_dir / "meta.json").write_text(json.dumps({"encoder": "fixture-hash", "text_dim": dim}))
