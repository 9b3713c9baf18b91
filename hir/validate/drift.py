"""Drift of a new export against the version that is live now, on the entity ids both share.

Per shared id: the cosine between the two embeddings and, per level, the Jaccard overlap of
the two token sets. Caveat worth knowing before setting a gate: two independently trained
models have unaligned spaces (any rotation is as good), so a cosine near 0 after a full retrain
is expected; the gates are meant for refreshes and fine-tunes of one model.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from hir.validate.views import as_lists


def _matrix(frame: pl.DataFrame, col: str) -> np.ndarray:
    """A list<f32> column of equal-length rows as (n, dim) float64 (NaN rows when lengths differ)."""
    lens = frame[col].list.len()
    dim = int(lens.max() or 0)
    if frame.height == 0 or lens.min() != dim or frame[col].null_count():
        out = np.full((frame.height, max(dim, 1)), np.nan)
        for i, v in enumerate(frame[col].to_list()):
            if v is not None and len(v) == dim:
                out[i] = v
        return out
    return frame[col].list.to_array(dim).to_numpy().astype(np.float64)


def drift_view(current: pl.DataFrame, previous: pl.DataFrame, n_levels: int) -> pl.DataFrame:
    """Rows for ids present in both versions.

    Args:
        current, previous: embedding tables with ``entity_id``, ``embedding`` (dim,) and
            ``tokens_l<k>``; the two dims may differ (then ``cosine`` is null).
        n_levels: levels to compare (levels missing on either side are skipped).

    Returns:
        ``id``, ``cosine`` (f64, null when undefined) and ``jaccard_l<k>`` (f64 in [0, 1]).
    """
    cur, prev = as_lists(current), as_lists(previous)
    levels = [k for k in range(n_levels) if f"tokens_l{k}" in cur.columns and f"tokens_l{k}" in prev.columns]
    keep = ["entity_id", "embedding", *[f"tokens_l{k}" for k in levels]]
    both = cur.select(keep).join(prev.select(keep), on="entity_id", how="inner", suffix="_prev")
    a, b = _matrix(both, "embedding"), _matrix(both, "embedding_prev")
    if a.shape[1] == b.shape[1]:
        with np.errstate(invalid="ignore", divide="ignore"):
            cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    else:
        cos = np.full(both.height, np.nan)
    out = both.select(pl.col("entity_id").alias("id")).with_columns(
        pl.Series("cosine", cos, dtype=pl.Float64).fill_nan(None)
    )
    for k in levels:
        t, p = pl.col(f"tokens_l{k}"), pl.col(f"tokens_l{k}_prev")
        union = t.list.set_union(p).list.len()
        jac = pl.when(union > 0).then(t.list.set_intersection(p).list.len() / union).otherwise(1.0)
        out = out.with_columns(both.select(jac.cast(pl.Float64).alias(f"jaccard_l{k}")).to_series())
    return out


def drift_summary(view: pl.DataFrame, n_current: int) -> dict[str, float | int | None]:
    """Shared-id count and share, mean cosine and mean Jaccard per level (None when no rows)."""
    out: dict[str, float | int | None] = {
        "shared_ids": view.height,
        "shared_share": round(view.height / n_current, 6) if n_current else None,
    }
    for col in view.columns:
        if col == "id":
            continue
        mean = view[col].mean() if view.height else None
        out[f"mean_{col}"] = None if mean is None else round(float(mean), 6)
    return out
