"""`hir enrich`: entity text, attributes and images -> ``content/`` (docs/contracts.md).

Reads ``graph/nodes/<type>.parquet``; writes ``content/<type>.parquet`` (``node_id``,
``has_text``, ``text_vec``, ``attr_vec``, ``content_hash``, + ``has_image``/``image_vec`` for
types with images), ``content/attr_encoders.json`` (the fitted attribute encoders, so ``hir
refresh`` encodes new entities identically: ``hir.enrich.content.encode_new_entities``) and
``content/meta.json`` (encoders, dims, counts, cache hits/misses, timings; written last, so its
presence marks a complete output).
"""

from __future__ import annotations

import inspect
import json
import logging
import shutil
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from hir.atomic import write_text_atomic
from hir.data.snapshot import Snapshot, load_snapshot
from hir.enrich.attributes import AttributeEncoder
from hir.enrich.cache import Encoder
from hir.enrich.content import ATTR_ENCODERS_FILE, META_FILE, encode_frame, stats_json
from hir.errors import HirError, InputError

log = logging.getLogger(__name__)

CONTENT_FORMAT = 1


def _init_config(obj: Any) -> dict[str, Any] | None:
    """``{_target_, **constructor args}`` rebuilt from an object that keeps its constructor
    arguments as attributes of the same name (all hir encoders do); None otherwise."""
    cls = type(obj)
    params = [p for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"]
    if not all(hasattr(obj, p.name) for p in params):
        return None
    args = {p.name: getattr(obj, p.name) for p in params}
    if not all(isinstance(v, str | int | float | bool | None) for v in args.values()):
        return None  # e.g. a wrapper around another object: not rebuildable from JSON
    return {"_target_": f"{cls.__module__}.{cls.__qualname__}", **args}


def _describe(encoder: Encoder | None, config: dict[str, Any] | None, dim: int) -> dict[str, Any] | None:
    if encoder is None:
        return None
    return {"name": encoder.name, "dim": dim, "config": config or _init_config(encoder)}


def enrich(
    graph_dir: str | Path,
    content_dir: str | Path,
    cache_root: str | Path,
    text_encoder: Encoder,
    fit_attributes: Callable[..., AttributeEncoder],
    image_encoder: Encoder | None = None,
    image_root: str | Path | None = None,
    configs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Encode every node table of ``graph_dir`` into ``content_dir``; returns the meta dict.

    Args:
        graph_dir: a prepared snapshot (``nodes/<type>.parquet``, ``meta.json``).
        content_dir: output dir; replaced as a whole.
        cache_root: content-vector cache root shared across runs (``<cache_dir>/content``).
        text_encoder / image_encoder: ``hir.enrich.cache.Encoder``s; images are encoded for
            types whose node table has an ``attr_image``/``image_path`` column.
        fit_attributes: ``frame -> AttributeEncoder`` (``hir.enrich.attributes.fit_attributes``
            with its settings bound).
        image_root: base of relative image paths.
        configs: the Hydra configs of ``text_encoder``, ``image_encoder``, ``attributes``, recorded in
            meta.json so ``encode_new_entities`` can rebuild the encoders.
    """
    t_start = time.perf_counter()
    graph_dir, content_dir, cache_root = Path(graph_dir), Path(content_dir), Path(cache_root)
    configs = configs or {}
    snap = load_snapshot(graph_dir, strict=False)  # node tables only; meta.json may be partial
    node_types = snap.node_types()
    if not node_types:
        raise InputError(
            f"no node tables (nodes/*.parquet) in {graph_dir}; run `hir prepare` first (or set paths.graph_dir)"
        )
    graph_meta = snap.meta

    if content_dir.exists():
        shutil.rmtree(content_dir)
    content_dir.mkdir(parents=True)
    types: dict[str, dict[str, Any]] = {}
    fitted: dict[str, AttributeEncoder] = {}
    for etype in node_types:
        path = snap.node_path(etype)
        t0 = time.perf_counter()
        frame = snap.scan_nodes(etype).collect()  # not snap.nodes(): one table in memory at a time
        missing = {"node_id", "key"} - set(frame.columns)
        if missing:
            raise InputError(f"{path} lacks columns {sorted(missing)}; it is not a `hir prepare` node table")
        frame = frame.sort("node_id")
        fitted[etype] = fit_attributes(frame, source=str(path))
        content, stats = encode_frame(
            frame, fitted[etype], text_encoder, cache_root, image_encoder, image_root, source=str(path)
        )
        content.drop("key").write_parquet(content_dir / f"{etype}.parquet")
        types[etype] = {**stats_json(stats), "seconds": round(time.perf_counter() - t0, 3)}
        log.info(
            "%s: %d entities, %d with text (%d distinct: %d cached, %d encoded), attr_vec %d-d%s in %.1fs",
            etype, stats.entities, stats.with_text, stats.distinct_texts, stats.text_cache_hits,
            stats.text_cache_misses, stats.attr_dim,
            f", {stats.with_image} with image" if stats.image_dim else "", types[etype]["seconds"],
        )

    (content_dir / ATTR_ENCODERS_FILE).write_text(
        json.dumps({"format": CONTENT_FORMAT, "types": {t: e.to_json() for t, e in fitted.items()}}, indent=1)
    )
    text_dim = max(t["text_dim"] for t in types.values())
    image_dim = max((t["image_dim"] for t in types.values()), default=0)
    meta = {
        "format": CONTENT_FORMAT,
        "dataset": graph_meta.get("dataset"),
        "graph": {"dir": str(graph_dir), "created": graph_meta.get("created")},
        "text_encoder": _describe(text_encoder, configs.get("text_encoder"), text_dim),
        "image_encoder": _describe(image_encoder, configs.get("image_encoder"), image_dim) if image_dim else None,
        "attributes": configs.get("attributes"),
        "text_dim": text_dim,
        "image_dim": image_dim,
        "attr_dims": {t: s["attr_dim"] for t, s in types.items()},
        "counts": {t: s["entities"] for t, s in types.items()},
        "cache": {
            "dir": str(cache_root),
            "text_hits": sum(s["text_cache_hits"] for s in types.values()),
            "text_misses": sum(s["text_cache_misses"] for s in types.values()),
            "image_hits": sum(s["image_cache_hits"] for s in types.values()),
            "image_misses": sum(s["image_cache_misses"] for s in types.values()),
        },
        "image_root": str(image_root) if image_root is not None else None,
        "types": types,
        "timings_s": {"total": round(time.perf_counter() - t_start, 3), **{t: s["seconds"] for t, s in types.items()}},
        "created": datetime.now().astimezone().isoformat(),
    }
    # meta.json last and atomic: its presence marks complete content vectors (reused unless force)
    write_text_atomic(content_dir / META_FILE, json.dumps(meta, indent=2))
    return meta


def _inputs_changed(meta: dict[str, Any], snap: Snapshot, text_encoder: Encoder, image_name: str | None,
                    attributes: Any) -> str | None:
    """Why existing content/ does not belong to these inputs, or None when it does."""
    created = snap.meta.get("created")
    if meta.get("graph", {}).get("created") != created:
        return f"the graph snapshot changed (built {created}, content/ was made from {meta.get('graph')})"
    if meta.get("text_encoder", {}).get("name") != text_encoder.name:
        return f"the text encoder changed ({meta.get('text_encoder', {}).get('name')} -> {text_encoder.name})"
    recorded_image = (meta.get("image_encoder") or {}).get("name")
    if image_name is not None and recorded_image not in (None, image_name):
        return f"the image encoder changed ({recorded_image} -> {image_name})"
    if meta.get("attributes") != attributes:
        return "the attribute encoder settings changed"
    return None


def run(cfg: DictConfig) -> dict[str, Any]:
    """Hydra entry: encoders from ``cfg.enrich``, graph from ``cfg.paths.graph_dir``, output in
    ``cfg.paths.content_dir``, cache under ``cfg.paths.cache_dir/content``."""
    if cfg.get("enrich") is None:
        raise HirError("no enrich config; use the default `enrich=minilm` (conf/enrich/minilm.yaml)")
    ecfg = cfg.enrich
    graph_dir, content_dir = Path(cfg.paths.graph_dir), Path(cfg.paths.content_dir)
    configs = {
        k: OmegaConf.to_container(ecfg[k], resolve=True) if ecfg.get(k) is not None else None
        for k in ("text_encoder", "image_encoder", "attributes")
    }
    text_encoder: Encoder = instantiate(ecfg.text_encoder)
    image_encoder: Encoder | None = instantiate(ecfg.image_encoder) if ecfg.get("image_encoder") else None

    meta_path = content_dir / META_FILE
    if meta_path.exists() and not cfg.force:
        meta = json.loads(meta_path.read_text())
        why = _inputs_changed(
            meta, load_snapshot(graph_dir, strict=False), text_encoder, image_encoder.name if image_encoder else None,
            configs["attributes"],
        )
        if why is None:
            log.info("content vectors exist at %s; reusing them (force=true rebuilds)", content_dir)
            return meta
        log.info("rebuilding %s: %s", content_dir, why)

    meta = enrich(
        graph_dir,
        content_dir,
        Path(cfg.paths.cache_dir) / "content",
        text_encoder,
        instantiate(ecfg.attributes),
        image_encoder=image_encoder,
        image_root=ecfg.get("image_root"),
        configs=configs,
    )
    cache = meta["cache"]
    log.info(
        "content: %s; text cache %d hits / %d encoded; %.1fs",
        meta["counts"], cache["text_hits"], cache["text_misses"], meta["timings_s"]["total"],
    )
    print(f"content vectors: {content_dir}")
    return meta
