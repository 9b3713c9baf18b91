"""`hir refresh`: entities that arrived after the last export, served without retraining.

    hir refresh data=rees46 refresh.delta_path=new_products.csv

1. the dataset's adapter reads ``refresh.delta_path`` (same format as the dataset, passed as
   the adapter argument ``refresh.adapter_arg``); entities whose key the live version does not
   serve yet are new;
2. their content vectors come from the enrich stage's encoders
   (:func:`hir.enrich.content.encode_new_entities`) and their embedding + tokens from the trained
   model's knowledge view (:meth:`hir.export.embed.Embedder.embed_new`, content + metadata
   links) — no retraining; the checkpoint must be the one the live version was exported from;
3. the same embedding suites as `hir validate` check them (plus "not already served");
4. they are pushed to the live version's Feast push sources (ONLINE) and inserted into its live
   Milvus collections; the delta is recorded in the live manifest (``refreshes``).

The offline store is not appended to (it stays the validated export); the pushed rows are kept
as parquet beside the version (``<store>/versions/<v>/refresh/<time>/``).
"""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
from omegaconf import DictConfig

from hir.errors import HirError, InputError
from hir.progress import progress_steps
from hir.publish import feast_store, milvus_store
from hir.publish.live import now_iso, read_state, store_lock, write_state
from hir.publish.stage import MANIFEST, recover

log = logging.getLogger(__name__)


def served_keys(manifest: dict[str, Any], store_dir: Path, etype: str) -> set[str]:
    """Keys of ``etype`` the live version serves: its export plus every earlier refresh."""
    key = manifest["feast"]["entities"][etype]["join_key"]
    keys = set(pl.read_parquet(manifest["feast"]["offline_files"][etype], columns=[key])[key].to_list())
    for r in manifest.get("refreshes", []):
        path = r.get("files", {}).get(etype)
        if path and Path(path).exists():
            keys |= set(pl.read_parquet(path, columns=["entity_id"])["entity_id"].to_list())
    return keys


def delta_path(cfg: DictConfig) -> Path:
    path = cfg.refresh.delta_path
    if not path:
        raise InputError("hir refresh needs the new entities: refresh.delta_path=<file in the dataset's format>, "
                         "e.g. refresh.delta_path=new_products.csv")
    if not Path(path).exists():
        raise InputError(f"refresh.delta_path={path} does not exist")
    return Path(path)


def read_delta(cfg: DictConfig, out_dir: Path) -> Any:
    """The delta file through the dataset's own adapter (its quarantine under ``out_dir``)."""
    from hydra.utils import instantiate

    from hir.data.raw import Quarantine

    path = delta_path(cfg)
    arg = cfg.refresh.adapter_arg
    if arg not in cfg.data.adapter:
        raise InputError(f"the {cfg.data.name} adapter has no argument {arg!r} to read a delta file from; set "
                         f"refresh.adapter_arg to one of {sorted(k for k in cfg.data.adapter if not k.startswith('_'))}")
    return instantiate(cfg.data.adapter, quarantine=Quarantine(out_dir / "quarantine"), **{arg: str(path)},
                       _convert_="all")


def new_entities(raw: Any, manifest: dict[str, Any], store_dir: Path) -> dict[str, pl.DataFrame]:
    """Per published entity type, the delta's entities the live version does not serve yet."""
    out = {}
    for etype, frame in raw.entities.items():
        if etype not in manifest["feast"]["feature_views"]:
            log.warning("delta has %d %s entities but the live version has no %s view; skipped",
                        frame.height, etype, etype)
            continue
        frame = frame.with_columns(pl.col("key").cast(pl.String))
        new = frame.filter(~pl.col("key").is_in(list(served_keys(manifest, store_dir, etype)))).unique("key")
        if new.height:
            out[etype] = new
    return out


def validate_rows(frames: dict[str, pl.DataFrame], manifest: dict[str, Any], store_dir: Path, vcfg: DictConfig,
                  out_dir: Path) -> dict[str, Any]:
    """The export suites on the new rows (dim, finite, norm, tokens in vocab, weights) plus
    'not served yet'; raises ValidationFailed naming table, column and ids."""
    from hir.validate import suites, views
    from hir.validate.checkpoint import run_checkpoint
    from hir.validate.stage import ValidationFailed

    tables = []
    levels = list(manifest.get("levels") or [])
    for etype, frame in frames.items():
        view = views.embedding_view(frame, pl.DataFrame(schema={"node_id": pl.Int64, "key": pl.String}), len(levels))
        served = list(served_keys(manifest, store_dir, etype))
        view = view.drop("in_graph", strict=False).with_columns((~pl.col("id").is_in(served)).alias("new"))
        table = suites.embedding_table(etype, view, frame.height, int(manifest["dim"]), levels,
                                       manifest.get("top_k"), manifest["version"],
                                       vcfg.embeddings.norm_tolerance, vcfg.embeddings.weight_sum_tolerance,
                                       vcfg.embeddings.max_duplicate_share)
        table.expectations.append(suites.flag("new", "entity_id", "not served by the live version yet"))
        table.source = f"refresh {etype} rows"
        tables.append(table)
    outcome = run_checkpoint(tables, out_dir / "validation" / "tables", out_dir / "validation" / "data_docs",
                             int(vcfg.examples))
    result = outcome.to_json()
    (out_dir / "validation").mkdir(parents=True, exist_ok=True)
    (out_dir / "validation" / "result.json").write_text(json.dumps(result, indent=2))
    if not outcome.success:
        lines = "\n".join(f"  FAIL {f.line()}" for f in outcome.failures)
        raise ValidationFailed(f"refresh rows failed validation; nothing was pushed:\n{lines}")
    return result


def push(frames: dict[str, pl.DataFrame], manifest: dict[str, Any], out_dir: Path) -> dict[str, str]:
    """ONLINE push to each type's push source of the live version; returns the parquet per type
    (the rows as pushed, join key named ``entity_id``)."""
    from feast.data_source import PushMode

    store = feast_store.open_store(Path(manifest["feast"]["repo_path"]))
    files = {}
    for etype, frame in frames.items():
        path = out_dir / f"{etype}.parquet"
        frame.write_parquet(path)
        files[etype] = str(path)
        join_key = manifest["feast"]["entities"][etype]["join_key"]
        # the pushed frame must carry every column of the batch source, named as there
        columns = [join_key if c == "entity_id" else c for c in frame.columns]
        df = frame.rename({"entity_id": join_key}).select(columns).to_pandas()
        store.push(manifest["feast"]["push_sources"][etype], df, to=PushMode.ONLINE)
    return files


def insert(frames: dict[str, pl.DataFrame], manifest: dict[str, Any], batch: int, tie_break: float,
           tie_resolution: float) -> None:
    """Rows into each type's live collection (not a new version: the alias does not move)."""
    client = milvus_store.connect(manifest["milvus"]["uri"])
    try:
        for etype, frame in frames.items():
            coll = manifest["milvus"]["collections"][etype]
            data = milvus_store.table_data(frame.to_arrow(), "entity_id")
            milvus_store.break_ties(data, tie_break, resolution=tie_resolution)
            milvus_store.insert(client, coll, data, etype, manifest["version"], batch)
            client.flush(coll)
    finally:
        milvus_store.disconnect(client, manifest["milvus"]["uri"])


def refresh_rows(cfg: DictConfig, frames: dict[str, pl.DataFrame], delta: str, state: dict[str, Any]) -> dict[str, Any]:
    """Validate, push, insert and record contract-format rows of new entities (``entity_id``,
    ``embedding`` (dim,), ``tokens_l<k>``/``weights_l<k>``, ...) into the live version."""
    store_dir = Path(cfg.publish.store_dir).resolve()
    entry = state["versions"][state["live"]]
    manifest = entry["manifest"]
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
    out_dir = store_dir / "versions" / entry["slug"] / "refresh" / stamp
    out_dir.mkdir(parents=True, exist_ok=True)
    t: dict[str, float] = {}
    with progress_steps("refresh", 3) as step:
        t0 = time.perf_counter()
        validate_rows(frames, manifest, store_dir, cfg.validate, out_dir)
        t["validate"] = time.perf_counter() - t0
        step("feast push")
        t0 = time.perf_counter()
        files = push(frames, manifest, out_dir)
        t["feast_push"] = time.perf_counter() - t0
        step("milvus insert")
        t0 = time.perf_counter()
        insert(frames, manifest, int(cfg.publish.milvus.insert_batch), float(cfg.publish.milvus.tie_break),
               float(cfg.publish.milvus.tie_resolution))
        t["milvus_insert"] = time.perf_counter() - t0
    record = {"at": now_iso(), "delta_path": delta, "rows": {e: f.height for e, f in frames.items()},
              "files": files, "validation": str(out_dir / "validation" / "result.json"),
              "timings_s": {k: round(v, 3) for k, v in t.items()}}
    manifest.setdefault("refreshes", []).append(record)
    state["history"].append({"at": record["at"], "event": "refresh", "version": entry["version"],
                             "previous": None, "rows": record["rows"]})
    write_state(store_dir, state)
    return record


def run(cfg: DictConfig) -> dict[str, Any]:
    """Hydra entry: embed the new entities of ``refresh.delta_path`` and serve them in the live version."""
    store_dir = Path(cfg.publish.store_dir).resolve()
    delta_path(cfg)  # fail before touching the store
    with store_lock(store_dir, "refresh"):
        state = read_state(store_dir)
        if not state["live"]:
            raise HirError(f"nothing is published in {store_dir}; run `hir publish` before `hir refresh`")
        recover(cfg, state)
        manifest = state["versions"][state["live"]]["manifest"]
        work = Path(cfg.paths.publish_dir) / "refresh"
        raw = read_delta(cfg, work)
        new = new_entities(raw, manifest, store_dir)
        if not new:
            msg = f"{cfg.refresh.delta_path}: no entity that the live version {manifest['version']!r} does not serve"
            log.info("%s", msg)
            print(msg)
            return {"version": manifest["version"], "rows": {}}
        frames = embed(cfg, raw, new, manifest)
        record = refresh_rows(cfg, frames, str(cfg.refresh.delta_path), state)
    Path(cfg.paths.publish_dir).mkdir(parents=True, exist_ok=True)
    (Path(cfg.paths.publish_dir) / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
    print(f"refreshed live version {manifest['version']!r} with {record['rows']} new entities "
          "(Feast online + Milvus)")
    return {"version": manifest["version"], "rows": record["rows"], "timings_s": record["timings_s"]}


def links(raw: Any, etype: str, keys: list[str]) -> list[list[tuple[str, str]]]:
    """Per new entity, the entities its metadata relations point to, as (type, key): a product's
    category and advertiser, a campaign's advertiser and products (the knowledge view's context)."""
    from hir.data.schema import relation_types

    out: dict[str, list[tuple[str, str]]] = {k: [] for k in keys}
    for rel, frame in raw.relations.items():
        src, dst = relation_types(rel)
        if src != etype:
            continue
        for s_key, d_key in frame.select(pl.col("src_key").cast(pl.String), pl.col("dst_key").cast(pl.String)).iter_rows():
            if s_key in out:
                out[s_key].append((dst, d_key))
    return [out[k] for k in keys]


def embed(cfg: DictConfig, raw: Any, new: dict[str, pl.DataFrame], manifest: dict[str, Any]) -> dict[str, pl.DataFrame]:
    """Contract-format rows (docs/contracts.md, embeddings/<type>.parquet) for the new entities:
    content vectors with the enrich stage's fitted encoders, then the live version's model through
    its knowledge view (content + metadata neighbours; no engagement, no retraining)."""
    import numpy as np

    from hir.enrich.content import encode_new_entities
    from hir.export.embed import Embedder
    from hir.export.stage import resolve_checkpoint

    ckpt = resolve_checkpoint(cfg)
    embedder = Embedder(ckpt, cfg.paths.graph_dir, cfg.paths.content_dir, tuple(cfg.model.export.visible_splits))
    if embedder.version != manifest["version"]:
        raise HirError(
            f"checkpoint {ckpt} is model {embedder.version!r} but the live version is {manifest['version']!r}: new "
            "entities must be embedded by the model that is served. Point paths.checkpoint_dir (and graph_dir, "
            "content_dir) at the run that exported the live version"
        )
    now = datetime.now(UTC)
    frames = {}
    for etype, frame in new.items():
        keys = frame["key"].to_list()
        content = encode_new_entities(frame, etype, cfg.paths.content_dir)
        mat = {c: np.stack(content[c].to_numpy()) if content.height else None
               for c in ("text_vec", "attr_vec", "image_vec") if c in content.columns}
        z = embedder.embed_new(etype, mat["text_vec"], mat.get("attr_vec"), content["has_text"].to_numpy(),
                               links(raw, etype, keys), mat.get("image_vec"), seed=int(cfg.seed))
        codes, weights = embedder.tokens(z)
        n_served = len(served_keys(manifest, Path(cfg.publish.store_dir).resolve(), etype))
        cols = {
            "entity_id": pl.Series(keys, dtype=pl.String),
            # the ids these entities would get appended to the snapshot's dense range
            "node_id": pl.Series(np.arange(n_served, n_served + len(keys)), dtype=pl.Int64),
            "entity_type": pl.Series([etype] * len(keys), dtype=pl.String),
            "embedding": pl.Series(z).cast(pl.List(pl.Float32)),
            "cold_start": pl.Series([True] * len(keys), dtype=pl.Boolean),
        }
        for lvl in range(len(codes)):
            cols[f"tokens_l{lvl}"] = pl.Series(codes[lvl]).cast(pl.List(pl.Int32))
            cols[f"weights_l{lvl}"] = pl.Series(weights[lvl]).cast(pl.List(pl.Float32))
        frames[etype] = pl.DataFrame(cols).with_columns(
            pl.lit(manifest["version"]).alias("model_version"),
            pl.lit(now).cast(pl.Datetime("us", "UTC")).alias("event_timestamp"),
            pl.lit(now).cast(pl.Datetime("us", "UTC")).alias("created"),
        )
        log.info("embedded %d new %s entities through the knowledge view", len(keys), etype)
    return frames
