"""The report's "why this?": for a few test pairs a ranker scored highest, the Bag-of-Meaning
tokens the user and the entity share, as `hir explain` computes them (hir/publish/explain.py):
read from the Feast online store of the evaluated version when it is published, else from the
export files (noted)."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

import polars as pl

from hir.data.snapshot import Snapshot
from hir.errors import HirError
from hir.publish.explain import Bag, explain, shared_tokens
from hir_evaluation.sources.hir import read_embeddings, token_levels

log = logging.getLogger(__name__)


def _file_bags(emb_dir: Path, entity_type: str, key: str) -> dict[int, Bag]:
    frame = read_embeddings(emb_dir, entity_type).filter(pl.col("entity_id").cast(pl.String) == key)
    if frame.is_empty():
        raise HirError(f"no {entity_type} {key!r} in {emb_dir / f'{entity_type}.parquet'}")
    levels = token_levels(frame.columns)
    return {k: [(int(t), float(w)) for t, w in zip(frame[f"tokens_l{k}"][0], frame[f"weights_l{k}"][0])]
            for k in range(levels)}


def _file_labels(hierarchy_dir: Path) -> dict[int, list[str]] | None:
    path = hierarchy_dir / "prototypes.parquet"
    if not path.exists():
        return None
    protos = pl.read_parquet(path, columns=["level", "proto_id", "label"]).sort("level", "proto_id")
    return {int(lvl): part["label"].to_list() for (lvl,), part in protos.group_by("level", maintain_order=True)}


def explain_pairs(snap: Snapshot, entity_type: str, pairs: list[dict[str, Any]], manifest: dict[str, Any] | None,
                  emb_dir: Path, hierarchy_dir: Path) -> list[dict[str, Any]]:
    """``pairs`` (dense ``user_id``, ``entity_id``, ``score``, ``label``, ``arm``) with their keys,
    the entity's text and the explanation (:meth:`hir.publish.explain.Explanation.to_dict`);
    ``source`` says where the tokens were read (``feast`` or ``files``)."""
    users = snap.nodes("user").select("node_id", "key")
    items = snap.nodes(entity_type).select("node_id", "key", *(["text"] if "text" in snap.nodes(entity_type).columns
                                                                   else []))
    labels = None if manifest is not None else _file_labels(hierarchy_dir)
    out = []
    for pair in pairs:
        user_key = str(users.filter(pl.col("node_id") == pair["user_id"])["key"][0])
        item = items.filter(pl.col("node_id") == pair["entity_id"])
        entity_key = str(item["key"][0])
        entry = pair | {"user": user_key, "entity": entity_key,
                        "entity_text": item["text"][0] if "text" in item.columns else None}
        try:
            if manifest is not None:
                entry |= {"source": "feast", "explanation": explain(user_key, entity_key, entity_type,
                                                                    manifest=manifest).to_dict()}
            else:
                user, entity = _file_bags(emb_dir, "user", user_key), _file_bags(emb_dir, entity_type, entity_key)
                shared, overlap = shared_tokens(user, entity, labels)
                entry |= {"source": "files", "explanation": {
                    "shared": [asdict(t) | {"weight": t.weight} for t in shared], "overlap": overlap}}
        except HirError as err:  # a pair the store cannot explain is reported, never dropped silently
            log.warning("explanation of %s/%s failed: %s", user_key, entity_key, err)
            entry |= {"source": None, "error": str(err)}
        out.append(entry)
    return out
