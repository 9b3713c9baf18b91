"""Content rows: each node's text, image and attribute vectors (enrich's ``content/``) as one
float16 row, in global-id order.

Row layout (the same for every type, so one projection reads them all)::

    text vector (shared width) | image vector (if any) | one attribute block per type | has_text

A type's attribute block has norm ``ATTR_NORM`` next to the unit-norm text vector (text carries
more meaning). :func:`content_rows` is shared by the snapshot loader and by embedding entities
that are not in the snapshot (``hir refresh``), so both see the same rows.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from hir.errors import InputError

log = logging.getLogger(__name__)

# norm of a node's attribute block next to its unit-norm text vector (text carries more meaning)
ATTR_NORM = 0.5


def load_content(content_dir: Path, types: tuple[str, ...], counts: dict[str, int]) -> tuple[np.ndarray, dict[str, Any]]:
    """``content/<type>.parquet`` -> (n, D) float16 rows in global-id order and the layout.

    Layout: text vector (shared width) | image vector (if any) | one attr block per type | has_text.
    A type without a content file gets zero rows (logged).
    """
    frames: dict[str, pl.DataFrame] = {}
    for t in types:
        path = content_dir / f"{t}.parquet"
        if counts.get(t, 0) == 0:
            continue
        if not path.exists():
            log.warning("no content for %s (%s); its tokens carry ids and graph context only", t, path)
            continue
        df = pl.read_parquet(path)
        missing = {"node_id", "has_text", "text_vec", "attr_vec"} - set(df.columns)
        if missing:
            raise InputError(f"{path}: missing columns {sorted(missing)}; expected the enrich contract (docs/contracts.md)")
        frames[t] = df.sort("node_id")
    if not frames:
        raise InputError(f"{content_dir}: no content/<type>.parquet files; run `hir enrich` first")

    def width(df: pl.DataFrame, col: str) -> int:
        if col not in df.columns or df.height == 0:
            return 0
        return int(df[col].list.len().max() or 0)

    text_dim = max(width(df, "text_vec") for df in frames.values())
    image_dim = max(width(df, "image_vec") for df in frames.values())
    attr_dims = {t: width(df, "attr_vec") for t, df in frames.items()}
    attr_off, cursor = {}, text_dim + image_dim
    for t in types:
        attr_off[t] = cursor
        cursor += attr_dims.get(t, 0)
    dim = cursor + 1
    layout = {"text_dim": text_dim, "image_dim": image_dim, "attr_dims": attr_dims, "attr_offsets": attr_off, "dim": dim}
    offsets = np.cumsum([0] + [counts.get(t, 0) for t in types])
    out = np.zeros((int(offsets[-1]), dim), dtype=np.float16)
    for ti, t in enumerate(types):
        if t not in frames:
            continue
        df = frames[t]
        ids = df["node_id"].to_numpy()
        if len(ids) and (ids.min() < 0 or ids.max() >= counts[t]):
            raise InputError(f"{content_dir / t}.parquet: node_id outside 0..{counts[t] - 1}; content is from another snapshot")
        rows = offsets[ti] + ids

        def block(col: str, df: pl.DataFrame = df, t: str = t) -> np.ndarray | None:
            w = width(df, col)
            if w == 0:
                return None
            try:
                return df[col].list.to_array(w).to_numpy().astype(np.float32)
            except Exception as err:  # ragged or null lists
                raise InputError(f"{content_dir / t}.parquet: {col} must hold equal-length vectors ({err})") from err

        try:
            out[rows] = content_rows(layout, t, block("text_vec"), block("attr_vec"),
                                     df["has_text"].fill_null(False).to_numpy(), block("image_vec"))
        except ValueError as err:
            raise InputError(f"{content_dir / t}.parquet: {err}") from err
    return out, layout


def content_rows(layout: dict[str, Any], etype: str, text: np.ndarray | None, attr: np.ndarray | None,
                 has_text: np.ndarray, image: np.ndarray | None = None) -> np.ndarray:
    """One entity type's vectors -> (n, layout dim) float16 content rows (see :func:`load_content`).

    Shared by the snapshot loader and by embedding new entities, so both see the same rows.
    """
    n = len(has_text)
    out = np.zeros((n, layout["dim"]), dtype=np.float32)
    td, idim = layout["text_dim"], layout["image_dim"]
    ad, ao = layout["attr_dims"].get(etype, 0), layout["attr_offsets"].get(etype, 0)
    for name, arr, lo, width in (("text_vec", text, 0, td), ("image_vec", image, td, idim), ("attr_vec", attr, ao, ad)):
        if arr is None or width == 0 or arr.size == 0:
            continue
        if arr.shape != (n, width):
            raise ValueError(f"{name} has shape {arr.shape}, expected ({n}, {width})")
        if name == "attr_vec":
            # one-hot attribute encodings would outweigh the unit-norm text vector in the content
            # projection's input geometry; each row's attribute block gets norm ATTR_NORM
            arr = ATTR_NORM * arr / np.maximum(np.linalg.norm(arr, axis=1, keepdims=True), 1e-6)
        out[:, lo:lo + width] = arr
    out[:, -1] = np.asarray(has_text, dtype=np.float32)
    return out.astype(np.float16)
