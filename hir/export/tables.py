"""The export's tables: ``embeddings/<type>.parquet`` and ``hierarchy/prototypes.parquet``
(docs/contracts.md)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import numpy as np
import polars as pl

from hir.atomic import write_parquet_atomic
from hir.data.snapshot import Snapshot
from hir.export.embed import Embedder
from hir.export.labels import class_tfidf_labels, member_texts, top_members
from hir.model import GraphStore


def keys_and_texts(snap: Snapshot, store: GraphStore) -> tuple[dict[str, list[str]], list[str | None]]:
    """Each type's keys in node-id order (types with nodes) and every node's text (None without)
    in global-id order."""
    keys: dict[str, list[str]] = {}
    texts: list[str | None] = [None] * store.n_nodes
    for t in store.types:
        lo, hi = store.type_range(t)
        if hi > lo:
            nodes = snap.nodes(t, ["node_id", "key", "text"]).sort("node_id")
            keys[t] = nodes["key"].cast(pl.String).to_list()
            texts[lo:hi] = nodes["text"].to_list()
    return keys, texts


def write_embeddings(emb_dir: Path, embedder: Embedder, keys: dict[str, list[str]], z: np.ndarray,
                     codes: list[np.ndarray], weights: list[np.ndarray], event_ts: datetime, created: datetime) -> None:
    """One ``embeddings/<type>.parquet`` per type of ``keys``: every entity's embedding (z (n, dim),
    global ids), cold-start flag, tokens and weights per level (codes/weights: per level (n, k)),
    model version and timestamps."""
    st = embedder.store
    for t, type_keys in keys.items():
        lo, hi = st.type_range(t)
        frame = pl.DataFrame({
            "entity_id": pl.Series(type_keys, dtype=pl.String),
            "node_id": pl.Series(np.arange(hi - lo), dtype=pl.Int64),
            "entity_type": pl.Series([t] * (hi - lo), dtype=pl.String),
            "embedding": pl.Series(z[lo:hi]).cast(pl.List(pl.Float32)),
            "cold_start": pl.Series(~st.warm[lo:hi], dtype=pl.Boolean),
        })
        for lvl in range(len(codes)):
            frame = frame.with_columns(
                pl.Series(f"tokens_l{lvl}", codes[lvl][lo:hi]).cast(pl.List(pl.Int32)),
                pl.Series(f"weights_l{lvl}", weights[lvl][lo:hi]).cast(pl.List(pl.Float32)),
            )
        write_parquet_atomic(frame.with_columns(
            pl.lit(embedder.version, dtype=pl.String).alias("model_version"),
            pl.lit(event_ts).cast(pl.Datetime("us", "UTC")).alias("event_timestamp"),
            pl.lit(created).cast(pl.Datetime("us", "UTC")).alias("created"),
        ), emb_dir / f"{t}.parquet")


def write_prototypes(path: Path, embedder: Embedder, z: np.ndarray, top1: list[np.ndarray],
                     texts: list[str | None], label_members: int) -> None:
    """``hierarchy/prototypes.parquet``: per level and prototype its parent, vector, a label by
    class-based TF-IDF over the text of all its members (:func:`class_tfidf_labels`), the texts
    of its most probable members (of ``label_members`` entities with text) and its usage (share
    of nodes whose top-1 token it is; top1: per level (n_nodes,))."""
    tokenizer = embedder.tokenizer
    with_text = np.array([i for i, t in enumerate(texts) if t], dtype=np.int64)
    # prototypes live in the direction part of the embedding (without the scale slack)
    # (only the rows with text are candidates: their directions alone, not an (n_nodes, K) array)
    members = [with_text[m] for m in top_members(tokenizer, embedder.semantic_rows(z, with_text),
                                                 np.arange(len(with_text)), label_members)]
    vectors = [v.detach().numpy() for v in tokenizer.vectors()]
    rows = []
    for lvl, k in enumerate(embedder.levels):
        labels = class_tfidf_labels(top1[lvl], k, texts) if len(with_text) else ["(no text)"] * k
        usage = np.bincount(top1[lvl], minlength=k) / max(len(top1[lvl]), 1)
        rows.append(pl.DataFrame({
            "level": pl.Series([lvl] * k, dtype=pl.Int8), "proto_id": pl.Series(np.arange(k), dtype=pl.Int32),
            "parent_id": pl.Series(tokenizer.parents(lvl).numpy(), dtype=pl.Int32),
            "vector": pl.Series(vectors[lvl]).cast(pl.List(pl.Float32)),
            "label": pl.Series(labels, dtype=pl.String),
            "members": pl.Series(member_texts(members[lvl], texts), dtype=pl.List(pl.String)),
            "usage": pl.Series(usage, dtype=pl.Float64),
        }))
    write_parquet_atomic(pl.concat(rows), path)
