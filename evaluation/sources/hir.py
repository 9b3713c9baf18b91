"""HIR features for ranking rows: user and entity embeddings and Bag-of-Meaning tokens, joined
point-in-time (an embedding row stamped ``event_timestamp`` serves only rows with ``ts`` at or
after it).

Two readers, same output: :func:`from_feast` (the published version: `get_historical_features`
with the ranker feature service, the production path) and :func:`from_files` (the export's
``embeddings/<type>.parquet``, used only when nothing is published; the caller logs it as a fallback).
"""

from __future__ import annotations

import json
import logging
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from hir.data.snapshot import Snapshot
from hir.errors import InputError

log = logging.getLogger(__name__)
TS = pl.Datetime("us", "UTC")


@dataclass
class TokenBag:
    """Weighted top-k token ids of one hierarchy level for every row.

    ids: (n, k) int64 in [0, vocab) (padding rows use weight 0); weights: (n, k) float32.
    """

    ids: np.ndarray
    weights: np.ndarray
    vocab: int


@dataclass
class HirSide:
    """HIR features of one side (user or entity) for n rows.

    vectors: (n, d) float32, zeros where missing; present: (n,) bool (a published row existed at
    or before the row's time); tokens: one TokenBag (n, k) per hierarchy level, coarsest first.
    """

    vectors: np.ndarray
    present: np.ndarray
    tokens: list[TokenBag]


def token_levels(columns: list[str]) -> int:
    """How many ``tokens_l<k>`` columns a frame has (they must be 0..L-1)."""
    levels = sorted(int(m.group(1)) for c in columns if (m := re.fullmatch(r"(?:.*__)?tokens_l(\d+)", c)))
    if levels != list(range(len(levels))):
        raise InputError(f"token columns must be tokens_l0..tokens_l<L-1>; found levels {levels}")
    return len(levels)


def side_from_frame(frame: pl.DataFrame, prefix: str, levels: int, vocab: list[int] | None = None) -> HirSide:
    """Arrays from a row-aligned frame with ``{prefix}embedding``, ``{prefix}tokens_l<k>``,
    ``{prefix}weights_l<k>`` list columns (null = no features for that row)."""
    emb = frame[f"{prefix}embedding"]
    present = emb.is_not_null().to_numpy()
    dims = emb.drop_nulls().list.len().unique().to_list()
    if len(dims) > 1:
        raise InputError(f"{prefix}embedding has vectors of different lengths {sorted(dims)}")
    dim = int(dims[0]) if dims else 1
    vectors = np.zeros((frame.height, dim), dtype=np.float32)
    if present.any():
        vectors[present] = emb.drop_nulls().cast(pl.List(pl.Float32)).list.to_array(dim).to_numpy()
    bags = []
    for k in range(levels):
        tok, wts = frame[f"{prefix}tokens_l{k}"], frame[f"{prefix}weights_l{k}"]
        width = int(tok.list.len().max() or 1)
        # (n, k) with zero-weight padding: EmbeddingBag ignores slots whose weight is 0
        ids = np.stack([tok.list.get(j, null_on_oob=True).fill_null(0).to_numpy() for j in range(width)], 1)
        weights = np.stack([wts.list.get(j, null_on_oob=True).fill_null(0.0).to_numpy() for j in range(width)], 1)
        size = vocab[k] if vocab and k < len(vocab) else int(ids.max(initial=0)) + 1
        if ids.max(initial=0) >= size:
            raise InputError(f"{prefix}tokens_l{k} has token {int(ids.max())} >= the level's vocabulary {size}")
        bags.append(TokenBag(ids.astype(np.int64), weights.astype(np.float32), int(size)))
    return HirSide(vectors, present, bags)


def _keyed_rows(snap: Snapshot, rows: pl.DataFrame, entity_type: str) -> pl.DataFrame:
    """rows + ``user_key``/``entity_key`` (the original ids), row order kept in ``_row``."""
    users = snap.nodes("user").select(pl.col("node_id").alias("user_id"), pl.col("key").alias("user_key"))
    items = snap.nodes(entity_type).select(pl.col("node_id").alias("entity_id"), pl.col("key").alias("entity_key"))
    return (
        rows.select("user_id", "entity_id", "ts")
        .with_row_index("_row")
        .join(users, on="user_id", how="left")
        .join(items, on="entity_id", how="left")
        .sort("_row")
    )


# ---- export files (fallback) ------------------------------------------------------------------


def read_embeddings(emb_dir: Path, entity_type: str) -> pl.DataFrame:
    path = Path(emb_dir) / f"{entity_type}.parquet"
    if not path.exists():
        raise InputError(
            f"{path} is missing: no exported {entity_type} embeddings; run `hir export` (or `hir pipeline`) first, "
            "or set eval.require_hir=false to evaluate the baselines alone"
        )
    frame = pl.read_parquet(path)
    need = ["entity_id", "embedding", "event_timestamp"]
    missing = [c for c in need if c not in frame.columns]
    if missing:
        raise InputError(f"{path} lacks columns {missing} required by docs/contracts.md (has {frame.columns})")
    return frame


def embeddings_meta(emb_dir: Path) -> dict[str, Any]:
    path = Path(emb_dir) / "meta.json"
    return json.loads(path.read_text()) if path.exists() else {}


def from_files(emb_dir: Path, snap: Snapshot, rows: pl.DataFrame, entity_type: str) -> tuple[HirSide, HirSide]:
    """(user, entity) HIR features of ``rows`` from ``embeddings/<type>.parquet``, point-in-time."""
    keyed = _keyed_rows(snap, rows, entity_type)
    vocab = embeddings_meta(emb_dir).get("levels")
    sides = []
    for side, etype in (("user", "user"), ("entity", entity_type)):
        emb = read_embeddings(emb_dir, etype).with_columns(pl.col("entity_id").cast(pl.String))
        levels = token_levels(emb.columns)
        cols = ["embedding", *[f"{p}_l{k}" for k in range(levels) for p in ("tokens", "weights")]]
        emb = emb.select(pl.col("entity_id").alias(f"{side}_key"), pl.col("event_timestamp").cast(TS), *cols)
        joined = (
            keyed.sort("ts")
            .join_asof(
                emb.sort("event_timestamp"), left_on="ts", right_on="event_timestamp", by=f"{side}_key",
                strategy="backward", check_sortedness=False,
            )
            .sort("_row")
        )
        sides.append(side_from_frame(joined, "", levels, vocab))
    return sides[0], sides[1]


# ---- Feast (the published version) --------------------------------------------------------------


def from_feast(manifest: dict[str, Any], snap: Snapshot, rows: pl.DataFrame, entity_type: str) -> tuple[HirSide, HirSide]:
    """(user, entity) HIR features through Feast's point-in-time join, by the ranker feature service.

    The service projects every view under its entity type's name (``product__embedding``); the
    entity dataframe carries the user's and the entity's original ids and each row's time.
    Views of other entity types in the service get null keys (their columns are dropped).
    """
    with warnings.catch_warnings():  # feast's own import-time pydantic notices (STACK.md section 5)
        warnings.simplefilter("ignore", UserWarning)
        from feast import FeatureStore

    feast_cfg = manifest["feast"]
    store = FeatureStore(repo_path=str(feast_cfg["repo_path"]))
    service = store.get_feature_service(feast_cfg["feature_service"])
    keyed = _keyed_rows(snap, rows, entity_type)
    frame: dict[str, Any] = {"event_timestamp": keyed["ts"].to_pandas()}
    wanted = {"user": "user", entity_type: "entity"}
    for proj in service.feature_view_projections:
        view = store.get_feature_view(proj.name)
        etype = proj.name_alias or proj.name
        for join_key in view.join_keys:
            if etype in wanted:
                frame[join_key] = keyed[f"{wanted[etype]}_key"].cast(pl.String).to_pandas()
            else:
                frame.setdefault(join_key, None)
    import pandas as pd

    entity_df = pd.DataFrame(frame)
    entity_df["_row"] = np.arange(len(entity_df))
    with warnings.catch_warnings():  # duckdb's fetch_arrow_table deprecation, inside feast
        warnings.simplefilter("ignore", DeprecationWarning)
        job = store.get_historical_features(entity_df=entity_df, features=service, full_feature_names=True)
        # arrow, not pandas: list columns stay columnar (to_df makes one Python object per cell)
        out = pl.from_arrow(job.to_arrow()).sort("_row")
    if out.height != keyed.height:
        raise InputError(f"feast returned {out.height} rows for {keyed.height} entity rows; the offline store must keep every row (use duckdb)")
    sides = []
    for etype in ("user", entity_type):
        prefix = f"{etype}__"
        levels = token_levels([c for c in out.columns if c.startswith(prefix)])
        if f"{prefix}embedding" not in out.columns:
            raise InputError(
                f"feature service {feast_cfg['feature_service']!r} has no {prefix}embedding column "
                f"(columns {sorted(out.columns)}); republish with a {etype} view"
            )
        sides.append(side_from_frame(out, prefix, levels, manifest.get("levels")))
    return sides[0], sides[1]
