"""`hir export`: checkpoint + snapshot -> ``embeddings/<type>.parquet`` and ``hierarchy/``.

Every entity of every type gets a row: its universal embedding (engagement view when it has train
engagement, knowledge view alone otherwise, flagged ``cold_start``), its Bag-of-Meaning (top-k
tokens and renormalised weights per level), the model version and timestamps
(docs/contracts.md). ``hierarchy/`` holds the prototypes with readable labels and usage, and the
super-graph density statistics.
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from hir.errors import InputError

# sleeping OpenMP threads, as in the train stage (set before torch loads)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

log = logging.getLogger(__name__)

META_FILE = "meta.json"


def resolve_checkpoint(cfg: DictConfig) -> Path:
    """``model.export.checkpoint``: ``best`` (the best validation point `hir train` recorded in
    ``train_metrics.json``), ``last``, or a path."""
    choice = str(cfg.model.export.checkpoint)
    ckpt_dir = Path(cfg.paths.checkpoint_dir)
    if choice == "best":
        metrics = ckpt_dir / "train_metrics.json"
        if not metrics.exists():
            raise InputError(f"{metrics} does not exist; run `hir train` first (or set model.export.checkpoint=PATH)")
        return Path(json.loads(metrics.read_text())["best_checkpoint"])
    return ckpt_dir / "last.ckpt" if choice == "last" else Path(choice)


def run(cfg: DictConfig) -> dict[str, Any]:
    """Export embeddings + tokens for every snapshot entity; returns counts, version, stats."""
    import numpy as np
    import polars as pl
    from omegaconf import OmegaConf

    from hir.export.cold import place_cold
    from hir.export.embed import Embedder, checkpoint_version
    from hir.export.labels import label_prototypes, top_members
    from hir.export.supergraph import engagement_pairs, planted_recovery, supergraph_stats
    from hir.model import validation_set

    emb_dir, hier_dir = Path(cfg.paths.embeddings_dir), Path(cfg.paths.hierarchy_dir)
    graph_dir = Path(cfg.paths.graph_dir)
    ckpt = resolve_checkpoint(cfg)
    meta_path = emb_dir / META_FILE
    if meta_path.exists() and not cfg.force and ckpt.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("model_version") == checkpoint_version(ckpt):
            log.info("embeddings of model %s exist at %s; reusing them (force=true re-exports)", meta["model_version"], emb_dir)
            return meta
    ex = cfg.model.export
    t0 = time.perf_counter()
    embedder = Embedder(ckpt, graph_dir, cfg.paths.content_dir, tuple(ex.visible_splits))
    st = embedder.store
    z = embedder.embed_snapshot(int(ex.batch_size), int(cfg.seed))
    if not np.isfinite(z).all():
        raise RuntimeError(f"non-finite embeddings from {ckpt}: the checkpoint is corrupt or training diverged")
    # cold entities with text: placed by their content neighbours (hir.export.cold)
    valset = validation_set(st, None, int(cfg.seed), "masked_new") if len(st.val_pairs) else None
    z, cold_report = place_cold(z, st, valset, OmegaConf.to_container(ex.cold, resolve=True))
    t_embed = time.perf_counter() - t0
    codes, weights = embedder.tokens(z)
    levels = embedder.levels
    created = datetime.now(UTC)
    event_ts = datetime.fromisoformat(st.visible_end)
    emb_dir.mkdir(parents=True, exist_ok=True)
    hier_dir.mkdir(parents=True, exist_ok=True)

    keys: dict[str, list[str]] = {}
    texts: list[str | None] = [None] * st.n_nodes
    counts, cold_counts = {}, {}
    for t in st.types:
        lo, hi = st.type_range(t)
        if hi == lo:
            continue
        nodes = embedder.snapshot.nodes(t, ["node_id", "key", "text"]).sort("node_id")
        keys[t] = nodes["key"].cast(pl.String).to_list()
        texts[lo:hi] = nodes["text"].to_list()
        cold = ~st.warm[lo:hi]
        frame = pl.DataFrame({
            "entity_id": pl.Series(keys[t], dtype=pl.String),
            "node_id": pl.Series(nodes["node_id"].to_numpy(), dtype=pl.Int64),
            "entity_type": pl.Series([t] * (hi - lo), dtype=pl.String),
            "embedding": pl.Series(z[lo:hi]).cast(pl.List(pl.Float32)),
            "cold_start": pl.Series(cold, dtype=pl.Boolean),
        })
        for lvl in range(len(levels)):
            frame = frame.with_columns(
                pl.Series(f"tokens_l{lvl}", codes[lvl][lo:hi]).cast(pl.List(pl.Int32)),
                pl.Series(f"weights_l{lvl}", weights[lvl][lo:hi]).cast(pl.List(pl.Float32)),
            )
        frame = frame.with_columns(
            pl.lit(embedder.version, dtype=pl.String).alias("model_version"),
            pl.lit(event_ts).cast(pl.Datetime("us", "UTC")).alias("event_timestamp"),
            pl.lit(created).cast(pl.Datetime("us", "UTC")).alias("created"),
        )
        frame.write_parquet(emb_dir / f"{t}.parquet")
        counts[t], cold_counts[t] = hi - lo, int(cold.sum())

    top1 = [c[:, 0].astype(np.int64) for c in codes]
    with_text = np.array([i for i, t in enumerate(texts) if t], dtype=np.int64)
    # prototypes live in the direction part of the embedding (without the scale slack)
    members = top_members(embedder.net.tokenizer, embedder.semantic(z), with_text, int(ex.label_members))
    vectors = [v.detach().numpy() for v in embedder.net.tokenizer.vectors()]
    proto_rows = []
    for lvl, k in enumerate(levels):
        labels = label_prototypes(members[lvl], texts) if len(with_text) else ["(no text)"] * k
        usage = np.bincount(top1[lvl], minlength=k) / max(len(top1[lvl]), 1)
        parents = embedder.net.tokenizer.parents(lvl).numpy()
        proto_rows.append(pl.DataFrame({
            "level": pl.Series([lvl] * k, dtype=pl.Int8), "proto_id": pl.Series(np.arange(k), dtype=pl.Int32),
            "parent_id": pl.Series(parents, dtype=pl.Int32), "vector": pl.Series(vectors[lvl]).cast(pl.List(pl.Float32)),
            "label": pl.Series(labels, dtype=pl.String), "usage": pl.Series(usage, dtype=pl.Float64),
        }))
    pl.concat(proto_rows).write_parquet(hier_dir / "prototypes.parquet")

    users, ents = engagement_pairs(embedder.snapshot, st.offsets)
    engaged = np.unique(st.node_type[ents]) if len(ents) else np.zeros(0, np.int64)
    n_ent = int(np.isin(st.node_type, engaged).sum())
    sg = supergraph_stats(users, ents, int(st.offsets[1] - st.offsets[0]), n_ent, top1, levels)
    (hier_dir / "supergraph.json").write_text(json.dumps(sg, indent=2))
    planted = planted_recovery(embedder.snapshot, keys, st.offsets, top1)

    norms = np.linalg.norm(z, axis=1)
    meta = {
        "model_version": embedder.version,
        "checkpoint": str(ckpt),
        "dim": embedder.dim,
        "levels": list(levels),
        "top_k": [int(c.shape[1]) for c in codes],
        "counts": counts,
        "cold_start": cold_counts,
        "event_timestamp": event_ts.isoformat(),
        "created": created.isoformat(),
        "visible_splits": list(ex.visible_splits),
        "norm_min": float(norms.min()), "norm_max": float(norms.max()),
        "supergraph_gain": {f"l{s['level']}": s["gain"] for s in sg["levels"]},
        "cold_placement": cold_report,
        "seconds": {"embed": round(t_embed, 2), "total": round(time.perf_counter() - t0, 2)},
    }
    if planted:
        meta["planted_hierarchy"] = planted
    meta_path.write_text(json.dumps(meta, indent=2))
    log.info("exported %s (cold start %s) as model %s in %.1fs; super-graph density gain %s%s",
             counts, cold_counts, embedder.version, meta["seconds"]["total"],
             {k: round(v or 0, 1) for k, v in meta["supergraph_gain"].items()},
             f"; planted-hierarchy NMI {planted.get('product', planted.get('all'))}" if planted else "")
    print(f"embeddings: {emb_dir}\nhierarchy: {hier_dir}")
    return meta
