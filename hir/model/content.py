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
# content rows read from a file at a time (load_content): its float32 work is ~100-200 MB (at 100M
# synthetic events, 65,536 rows held 1.1 GiB less than 262,144 and took 32 s against 45)
CHUNK_ROWS = 65_536


def load_content(content_dir: Path, types: tuple[str, ...], counts: dict[str, int],
                 chunk_rows: int = CHUNK_ROWS) -> tuple[np.ndarray, dict[str, Any]]:
    """``content/<type>.parquet`` -> (n, D) float16 rows in global-id order and the layout.

    Layout: text vector (shared width) | image vector (if any) | one attr block per type | has_text.
    A type without a content file gets zero rows (logged).

    Memory: the (n, D) float16 output plus one block of ``chunk_rows`` rows and its float32 work.
    It streams because a content file can outweigh the rows kept from it: at 100M synthetic events
    the product file alone (3M rows of 384-d float32 text vectors, 4.6 GB) read whole set the graph
    load's peak. The widths come from a scan of each file's list lengths; each file is then read
    ``chunk_rows`` rows at a time, in file order, by polars' streaming engine (``collect_batches``,
    marked unstable; pyproject.toml pins polars), and each block is converted and written into
    place, so no whole-file frame is held. Every row is computed alone, so the rows are the same
    whatever the block. pyarrow's ``iter_batches`` held more (its allocator keeps what the batches
    used: docs/scale.md, 100M).
    """
    import pyarrow.parquet as pq

    paths: dict[str, Path] = {}
    columns: dict[str, set[str]] = {}
    for t in types:
        path = content_dir / f"{t}.parquet"
        if counts.get(t, 0) == 0:
            continue
        if not path.exists():
            log.warning("no content for %s (%s); its tokens carry ids and graph context only", t, path)
            continue
        columns[t] = set(pq.read_schema(path).names)
        missing = {"node_id", "has_text", "text_vec", "attr_vec"} - columns[t]
        if missing:
            raise InputError(f"{path}: missing columns {sorted(missing)}; expected the enrich contract (docs/contracts.md)")
        paths[t] = path
    if not paths:
        raise InputError(f"{content_dir}: no content/<type>.parquet files; run `hir enrich` first")

    widths: dict[str, dict[str, int]] = {}
    for t, path in paths.items():
        present = [c for c in ("text_vec", "image_vec", "attr_vec") if c in columns[t]]
        got = pl.scan_parquet(path).select(pl.col(c).list.len().max() for c in present).collect()
        widths[t] = {c: int(got[c][0] or 0) if got.height else 0 for c in present}

    def width(t: str, col: str) -> int:
        return widths[t].get(col, 0)

    text_dim = max(width(t, "text_vec") for t in paths)
    image_dim = max(width(t, "image_vec") for t in paths)
    attr_dims = {t: width(t, "attr_vec") for t in paths}
    attr_off, cursor = {}, text_dim + image_dim
    for t in types:
        attr_off[t] = cursor
        cursor += attr_dims.get(t, 0)
    dim = cursor + 1
    layout = {"text_dim": text_dim, "image_dim": image_dim, "attr_dims": attr_dims, "attr_offsets": attr_off, "dim": dim}
    offsets = np.cumsum([0] + [counts.get(t, 0) for t in types])
    out = np.zeros((int(offsets[-1]), dim), dtype=np.float16)
    for ti, t in enumerate(types):
        if t not in paths:
            continue
        cols = [c for c in ("node_id", "has_text", "text_vec", "image_vec", "attr_vec") if c in columns[t]]
        for df in pl.scan_parquet(paths[t]).select(cols).collect_batches(chunk_size=chunk_rows):
            ids = df["node_id"].to_numpy()
            if len(ids) and (ids.min() < 0 or ids.max() >= counts[t]):
                raise InputError(f"{content_dir / t}.parquet: node_id outside 0..{counts[t] - 1}; content is from "
                                 "another snapshot")

            def block(col: str, df: pl.DataFrame = df, t: str = t) -> np.ndarray | None:
                w = width(t, col)
                if w == 0:
                    return None
                try:
                    return df[col].list.to_array(w).to_numpy().astype(np.float32)
                except Exception as err:  # ragged or null lists
                    raise InputError(f"{content_dir / t}.parquet: {col} must hold equal-length vectors ({err})") from err

            try:
                out[offsets[ti] + ids] = content_rows(layout, t, block("text_vec"), block("attr_vec"),
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
