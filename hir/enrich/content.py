"""Entity rows -> content vectors: the one code path that both ``hir enrich`` (every snapshot
entity) and ``hir refresh`` (new entities from a delta file) go through, so an entity gets the
same vectors either way.

An input frame holds ``key`` (or ``node_id``), ``text`` (optional; null/empty = no text),
``attr_*`` columns, and optionally an image path column (``attr_image`` or ``image_path``).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from hir.enrich.attributes import IMAGE_COLUMNS, AttributeEncoder
from hir.enrich.cache import Encoder, VectorCache, sha256_hex
from hir.errors import HirError, InputError

log = logging.getLogger(__name__)

ATTR_ENCODERS_FILE = "attr_encoders.json"
META_FILE = "meta.json"


@dataclass
class EncodeStats:
    """Counts for one encoded frame (reported per entity type in content/meta.json)."""

    entities: int = 0
    text_dim: int = 0
    attr_dim: int = 0
    image_dim: int = 0
    with_text: int = 0
    distinct_texts: int = 0
    text_cache_hits: int = 0
    text_cache_misses: int = 0
    with_image: int = 0
    missing_images: int = 0
    distinct_images: int = 0
    image_cache_hits: int = 0
    image_cache_misses: int = 0
    text_s: float = 0.0
    image_s: float = 0.0


def clean_text(frame: pl.DataFrame) -> pl.Series:
    """The frame's ``text`` stripped, empty -> null (all null when the column is absent)."""
    if "text" not in frame.columns:
        return pl.Series("text", [None] * frame.height, dtype=pl.String)
    v = pl.col("text").cast(pl.String).str.strip_chars()
    return frame.select(pl.when(v == "").then(None).otherwise(v).alias("text")).to_series()


def image_column(frame: pl.DataFrame) -> str | None:
    """The frame's image-path column, if it has one."""
    return next((c for c in IMAGE_COLUMNS if c in frame.columns), None)


def _encoder_dim(encoder: Encoder, cache: VectorCache) -> int:
    # the cache knows the width without loading the model (warm runs never load it)
    return cache.dim or encoder.dim


def encode_cached(
    contents: list[str], items: list[Any], encoder: Encoder, cache: VectorCache
) -> tuple[np.ndarray, int, int]:
    """Vectors for distinct ``contents`` (what keys the cache: a text, or an image digest);
    ``items`` are what the encoder reads (the text itself, or the image path).

    Returns ``(vectors (n, dim) float32, hits, misses)``; misses are encoded and stored.
    """
    keys = [cache.key(c) for c in contents]
    if not keys:
        return np.zeros((0, _encoder_dim(encoder, cache)), dtype=np.float32), 0, 0
    vectors, found = cache.lookup(keys, _encoder_dim(encoder, cache))
    miss = np.flatnonzero(~found)
    if miss.size:
        fresh = encoder.encode([items[i] for i in miss])
        if fresh.shape != (miss.size, vectors.shape[1]):
            raise HirError(f"encoder {encoder.name!r} returned {fresh.shape}, expected ({miss.size}, {vectors.shape[1]})")
        vectors[miss] = fresh
        cache.put([keys[i] for i in miss], fresh)
    return vectors, int(found.sum()), int(miss.size)


def encode_texts(texts: pl.Series, encoder: Encoder, cache: VectorCache, stats: EncodeStats) -> np.ndarray:
    """``texts`` (n, nullable) -> ``(n, dim)`` float32, zeros where null. Each distinct text is
    looked up / encoded once."""
    t0 = time.perf_counter()
    distinct = texts.drop_nulls().unique(maintain_order=True).to_list()
    vectors, stats.text_cache_hits, stats.text_cache_misses = encode_cached(distinct, distinct, encoder, cache)
    index = {t: i for i, t in enumerate(distinct)}
    rows = texts.to_list()
    has = np.array([t is not None for t in rows], dtype=bool)
    out = np.zeros((len(rows), vectors.shape[1]), dtype=np.float32)
    out[has] = vectors[[index[t] for t in rows if t is not None]]
    stats.with_text, stats.distinct_texts = int(has.sum()), len(distinct)
    stats.text_s = time.perf_counter() - t0
    return out


def encode_images(
    paths: pl.Series, encoder: Encoder, cache: VectorCache, root: Path | None, stats: EncodeStats, source: str
) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
    """Image paths (n, nullable; relative ones resolved against ``root``) ->
    ``(vectors (n, dim) float32, has_image (n,) bool, digests)``. An image is keyed by the
    sha256 of its bytes, so renamed or duplicated files are encoded once; a path whose file
    does not exist counts as no image (logged)."""
    t0 = time.perf_counter()
    digests: list[str | None] = []
    first_path: dict[str, Path] = {}
    missing: list[str] = []
    for raw in paths.cast(pl.String).to_list():
        if raw is None or not raw.strip():
            digests.append(None)
            continue
        path = Path(raw.strip()).expanduser()
        if not path.is_absolute() and root is not None:
            path = root / path
        if not path.is_file():
            missing.append(str(path))
            digests.append(None)
            continue
        digest = sha256_hex(path.read_bytes())
        first_path.setdefault(digest, path)
        digests.append(digest)
    if missing:
        log.warning(
            "%s: %d image files not found (encoded without an image), e.g. %s", source, len(missing), missing[:3]
        )
    distinct = list(first_path)
    vectors, stats.image_cache_hits, stats.image_cache_misses = encode_cached(
        distinct, [first_path[d] for d in distinct], encoder, cache
    )
    index = {d: i for i, d in enumerate(distinct)}
    has = np.array([d is not None for d in digests], dtype=bool)
    out = np.zeros((len(digests), vectors.shape[1]), dtype=np.float32)
    out[has] = vectors[[index[d] for d in digests if d is not None]]
    stats.with_image, stats.missing_images, stats.distinct_images = int(has.sum()), len(missing), len(distinct)
    stats.image_s = time.perf_counter() - t0
    return out, has, digests


def content_hashes(texts: pl.Series, attrs: pl.DataFrame, image_digests: list[str | None] | None) -> list[str]:
    """Per entity: sha256 over its text, its fitted attribute values and its image bytes'
    digest. Independent of the encoders: it changes exactly when the entity's content does."""
    parts = [texts.alias("text"), *attrs.get_columns()]
    if image_digests is not None:
        parts.append(pl.Series("image", image_digests, dtype=pl.String))
    docs = pl.DataFrame(parts).select(pl.struct(pl.all()).struct.json_encode().alias("doc"))["doc"]
    return [sha256_hex(d) for d in docs.to_list()]


def _list_column(name: str, mat: np.ndarray) -> pl.Series:
    """``(n, d)`` float32 -> a ``list<f32>`` column (d may be 0)."""
    if mat.shape[1] == 0:
        return pl.Series(name, [[] for _ in range(mat.shape[0])], dtype=pl.List(pl.Float32))
    return pl.Series(name, np.ascontiguousarray(mat, dtype=np.float32)).cast(pl.List(pl.Float32))


def encode_frame(
    frame: pl.DataFrame,
    attributes: AttributeEncoder,
    text_encoder: Encoder,
    cache_root: str | Path,
    image_encoder: Encoder | None = None,
    image_root: str | Path | None = None,
    source: str = "frame",
) -> tuple[pl.DataFrame, EncodeStats]:
    """Encode entity rows.

    Returns ``(content, stats)``: ``content`` keeps ``node_id`` and/or ``key`` from ``frame``
    (in order) and adds ``has_text`` bool, ``text_vec`` list<f32> (text dim, zeros without
    text), ``attr_vec`` list<f32> (``attributes.dim``), ``content_hash`` str, and — when the frame
    has an image column and an image encoder is given — ``has_image`` bool and ``image_vec``
    list<f32>.
    """
    ids = [c for c in ("node_id", "key") if c in frame.columns]
    if not ids:
        raise InputError(f"{source}: needs a `key` column (the entity's id); has {frame.columns}")
    stats = EncodeStats(entities=frame.height)
    root = Path(cache_root)
    attr_mat = attributes.transform(frame, source)  # first: bad attribute values fail before encoding
    texts = clean_text(frame)
    text_mat = encode_texts(texts, text_encoder, VectorCache(root, text_encoder.name), stats)
    stats.text_dim, stats.attr_dim = text_mat.shape[1], attr_mat.shape[1]
    columns = [*frame.select(ids).get_columns(), pl.Series("has_text", texts.is_not_null())]
    columns += [_list_column("text_vec", text_mat), _list_column("attr_vec", attr_mat)]

    img_col, digests = image_column(frame), None
    if img_col is not None and image_encoder is None:
        log.warning("%s has image paths (%s) but enrich.image_encoder is null; images are not encoded", source, img_col)
    elif img_col is not None and image_encoder is not None:
        img_mat, has_img, digests = encode_images(
            frame[img_col], image_encoder, VectorCache(root, image_encoder.name),
            Path(image_root) if image_root else None, stats, source,
        )
        columns += [pl.Series("has_image", has_img), _list_column("image_vec", img_mat)]
        stats.image_dim = img_mat.shape[1]

    hashes = content_hashes(texts, attributes.canonical(frame, source), digests)
    return pl.DataFrame(columns).with_columns(pl.Series("content_hash", hashes, dtype=pl.String)), stats


def stats_json(stats: EncodeStats) -> dict[str, Any]:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(stats).items()}


def load_attribute_encoders(content_dir: str | Path) -> dict[str, AttributeEncoder]:
    """The fitted attribute encoders the enrich stage persisted, by entity type."""
    path = Path(content_dir) / ATTR_ENCODERS_FILE
    if not path.exists():
        raise HirError(f"{path} not found; run `hir enrich` first (or point paths.content_dir at a run that did)")
    data = json.loads(path.read_text())
    return {etype: AttributeEncoder.from_json(enc) for etype, enc in data["types"].items()}


def encode_new_entities(
    frame: pl.DataFrame,
    entity_type: str,
    content_dir: str | Path,
    cache_dir: str | Path | None = None,
    text_encoder: Encoder | None = None,
    image_encoder: Encoder | None = None,
    image_root: str | Path | None = None,
) -> pl.DataFrame:
    """Content vectors for entities the snapshot did not have, with the snapshot's fitted
    attribute encoders and the same text/image encoders, so they land in the same space.

    Args:
        frame: ``key`` str plus, as available, ``text``, the type's ``attr_*`` columns and an
            image path column; absent attributes encode as missing.
        entity_type: which fitted encoder to apply (a key of content/attr_encoders.json).
        content_dir: the enrich stage's output dir (attr_encoders.json, meta.json).
        cache_dir: ``paths.cache_dir`` (vectors live under ``<cache_dir>/content``); default:
            the cache the stage used.
        text_encoder / image_encoder: default: rebuilt from the config recorded in meta.json;
            a given encoder must have the recorded name.
        image_root: base of relative image paths; default: the stage's.

    Returns:
        The columns of ``encode_frame``: ``key``, ``has_text``, ``text_vec``, ``attr_vec``,
        ``content_hash`` (+ ``has_image``, ``image_vec``), one row per input row, in order.
    """
    from hydra.utils import instantiate

    content_dir = Path(content_dir)
    meta_path = content_dir / META_FILE
    if not meta_path.exists():
        raise HirError(f"{meta_path} not found; run `hir enrich` first")
    meta = json.loads(meta_path.read_text())
    encoders = load_attribute_encoders(content_dir)
    if entity_type not in encoders:
        raise InputError(f"entity type {entity_type!r} was not enriched in {content_dir}; have {sorted(encoders)}")

    def _encoder(given: Encoder | None, recorded: dict[str, Any] | None, what: str) -> Encoder | None:
        if recorded is None:
            return None
        enc = given if given is not None else instantiate(recorded["config"])
        if enc.name != recorded["name"]:
            raise HirError(
                f"{what} encoder {enc.name!r} differs from the one that built {content_dir} "
                f"({recorded['name']!r}); its vectors would not be comparable. Re-run `hir enrich`"
            )
        return enc

    if meta["types"].get(entity_type, {}).get("image_dim") and image_column(frame) is None:
        # the type had images in the snapshot: keep its columns, with "no image" for these rows
        frame = frame.with_columns(pl.lit(None, dtype=pl.String).alias("image_path"))
    text = _encoder(text_encoder, meta["text_encoder"], "text")
    image = _encoder(image_encoder, meta.get("image_encoder"), "image")
    assert text is not None
    content, _ = encode_frame(
        frame, encoders[entity_type], text, Path(cache_dir) / "content" if cache_dir else meta["cache"]["dir"], image,
        image_root if image_root is not None else meta.get("image_root"), source=f"new {entity_type} entities",
    )
    return content
