"""`hir prepare`: run a dataset adapter and write the graph snapshot (docs/contracts.md)."""

from __future__ import annotations

import json
import logging
import shutil
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from hir.atomic import write_text_atomic
from hir.data import steps
from hir.data.build import BUCKET_EVENTS, write_events_and_edges
from hir.data.raw import Quarantine, RawDataset, changed_sources
from hir.data.schema import METADATA_RELATIONS, SNAPSHOT_VERSION, TS
from hir.data.spark_options import SparkOptions
from hir.data.split import SplitSpec
from hir.data.split import plan as split_plan
from hir.errors import InputError
from hir.progress import progress_steps
from hir.settings import changed, log_reuse

log = logging.getLogger(__name__)

ENGINES = ("polars", "spark")


def build_snapshot(
    raw: RawDataset,
    quarantine: Quarantine,
    out_dir: Path,
    dataset: str,
    split: SplitSpec | None = None,
    engine: str = "polars",
    spark: SparkOptions | None = None,
    bucket_events: int = BUCKET_EVENTS,
) -> dict[str, Any]:
    """Write ``out_dir/{nodes,edges}/*.parquet``, ``events.parquet`` and ``meta.json``.

    Both engines start from the same canonical events (the adapter's ``RawDataset``) and the
    same split: :func:`hir.data.split.plan` decides it once (temporal when the data has
    timestamps, a seeded random split of (user, entity) pairs with synthesized times when it has
    none, a shipped test file taken exactly as the test split). Node tables and metadata edges
    are built by the same Polars code for both; ``engine`` picks who turns the events into
    first-seen times, ``events.parquet`` and the engagement edges: ``polars``
    (:mod:`hir.data.build`, one sorted pass per user bucket) or ``spark`` (:mod:`hir.data.spark`,
    options in ``spark``). Returns the meta dict.
    """
    if engine not in ENGINES:
        raise InputError(f"prepare.engine={engine!r}; expected one of {list(ENGINES)}")
    spec = split or SplitSpec()
    timings: dict[str, float] = {}
    tmp = out_dir / "_tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    (out_dir / "nodes").mkdir(exist_ok=True)
    (out_dir / "edges").mkdir(exist_ok=True)
    # the quarantine counted every kept row already: decide in memory vs bucketed up front
    expected = quarantine.totals()["kept_rows"] + sum(raw.derived_events.values())
    in_memory = engine == "polars" and expected <= bucket_events

    with progress_steps("prepare", 5) as step:
        t0 = time.perf_counter()
        events, heldout = _materialise(raw.events, tmp / "events_keys.parquet", in_memory), None
        if raw.heldout is not None:
            heldout = _materialise(raw.heldout, tmp / "heldout_keys.parquet", in_memory)
        both = events if heldout is None else pl.concat([events, heldout], how="vertical_relaxed")
        head = both.select(
            pl.len().alias("n"), pl.col("stage").unique().implode(), pl.col("entity_type").unique().implode()
        ).collect(engine="streaming")
        n_events = int(head["n"][0])
        if n_events == 0:
            raise InputError(quarantine.empty_message(dataset))
        unknown = sorted(set(head["stage"][0].to_list()) - set(raw.stage_order))
        if unknown:
            raise InputError(
                f"{dataset}: events have stages {unknown} that are not in the stage order {raw.stage_order}; "
                "add them to data.stage_order"
            )
        event_types = set(head["entity_type"][0].to_list())
        timings["validate"] = time.perf_counter() - t0
        step("split")

        t0 = time.perf_counter()
        plan = split_plan(events, spec, raw.has_timestamps, heldout, raw.sources)
        events, bounds = plan.events, plan.bounds
        if in_memory:
            events = events.collect()
        timings["split"] = time.perf_counter() - t0
        step("nodes")

        t0 = time.perf_counter()
        if engine == "spark":
            from hir.data import spark as spark_engine

            session = spark_engine.SparkBuild(spark or SparkOptions(), tmp)
            canonical = session.stage(events)
            first_seen, user_first = session.first_seen(canonical)
        else:
            first_seen, user_first = first_seen_tables(events.lazy())
        node_frames = node_tables(first_seen, user_first, raw, event_types)
        for etype, frame in node_frames.items():
            frame.with_columns(pl.col("key").cast(pl.String)).write_parquet(out_dir / "nodes" / f"{etype}.parquet")
        timings["nodes"] = time.perf_counter() - t0
        step("events + edges")

        t0 = time.perf_counter()
        engaged = {t: node_frames[t] for t in event_types}
        if engine == "spark":
            try:
                edge_counts = session.write(canonical, node_frames["user"], engaged, raw.stage_order, bounds, out_dir)
            finally:
                session.stop()
        else:
            edge_counts = write_events_and_edges(
                events, n_events, node_frames["user"], engaged, raw.stage_order, bounds, out_dir, bucket_events
            )
        timings["events_edges"] = time.perf_counter() - t0
        step("metadata edges")

        t0 = time.perf_counter()
        for rel, frame in raw.relations.items():
            src_t, dst_t = METADATA_RELATIONS[rel]
            mapped = steps.map_relation(frame.lazy(), node_frames[src_t].lazy(), node_frames[dst_t].lazy()).collect()
            mapped.write_parquet(out_dir / "edges" / f"{rel}.parquet")
            edge_counts[rel] = mapped.height
        timings["metadata_edges"] = time.perf_counter() - t0

    for name, path in raw.artifacts.items():
        shutil.copy(path, out_dir / name)
    shutil.rmtree(tmp, ignore_errors=True)
    per = split_stage_counts(out_dir, edge_counts)
    meta = _meta(per, raw, quarantine, dataset, node_frames, edge_counts, bounds)
    meta["split"] = plan.info
    meta["engine"] = engine
    meta["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2))
    return meta


def _materialise(frame: pl.LazyFrame, path: Path, in_memory: bool) -> pl.LazyFrame:
    """The adapter's lazy events, run once: into memory, or to lz4 Parquet (cheap to write,
    read a few times below) when they are too many."""
    if in_memory:
        # one chunk: the streaming engine returns ~100k-row chunks, and gathers and casts over
        # many chunks cost twice as much below
        return frame.collect(engine="streaming").rechunk().lazy()
    frame.sink_parquet(path, compression="lz4")
    return pl.scan_parquet(path)


def split_stage_counts(out_dir: Path, edge_counts: dict[str, int]) -> pl.DataFrame:
    """Events per (split, stage), from the engagement edges' ``count`` (the edges partition the
    events, so this never reads ``events.parquet``)."""
    parts = [
        pl.scan_parquet(out_dir / "edges" / f"{rel}.parquet").select("split", "stage", "count")
        for rel in edge_counts
        if "__engages__" in rel
    ]
    return pl.concat(parts).group_by("split", "stage").agg(pl.col("count").cast(pl.Int64).sum().alias("n")).collect()


def first_seen_tables(events: pl.LazyFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(``entity_type``, ``entity_key``, ``first_seen``) and (``user_key``, ``first_seen``): every
    key with an event and its earliest event time, in one pass."""
    first_seen, user_first = pl.collect_all(
        [
            events.group_by("entity_type", "entity_key").agg(pl.col("timestamp").min().alias("first_seen")),
            events.group_by("user_key").agg(pl.col("timestamp").min().alias("first_seen")),
        ],
        engine="streaming",
    )
    return first_seen, user_first


def node_tables(
    first_seen: pl.DataFrame, user_first: pl.DataFrame, raw: RawDataset, event_types: set[str]
) -> dict[str, pl.DataFrame]:
    """Dense-id node tables for users and every entity type in events, metadata or relations,
    from the first-seen tables of either engine (:func:`first_seen_tables`)."""
    user_first = user_first.lazy().rename({"user_key": "key"})
    user_keys = [user_first.select("key")]
    if "user" in raw.entities:
        user_keys.append(raw.entities["user"].lazy().select("key"))
    frames = {"user": steps.node_table(pl.concat(user_keys), raw.entities.get("user"), user_first).collect()}
    types = (event_types | set(raw.entities) | {t for rel in raw.relations for t in METADATA_RELATIONS[rel]}) - {"user"}
    for etype in sorted(types):
        fs = first_seen.lazy().filter(pl.col("entity_type") == etype).select(pl.col("entity_key").alias("key"), "first_seen")
        keys = [fs.select("key")] if etype in event_types else []
        if etype in raw.entities:
            keys.append(raw.entities[etype].lazy().select("key"))
        for rel, frame in raw.relations.items():
            src_t, dst_t = METADATA_RELATIONS[rel]
            if src_t == etype:
                keys.append(frame.lazy().select(pl.col("src_key").alias("key")))
            if dst_t == etype:
                keys.append(frame.lazy().select(pl.col("dst_key").alias("key")))
        frames[etype] = steps.node_table(pl.concat(keys), raw.entities.get(etype), fs).collect()
    return frames


def _meta(
    per: pl.DataFrame,
    raw: RawDataset,
    quarantine: Quarantine,
    dataset: str,
    nodes: dict[str, pl.DataFrame],
    edges: dict[str, int],
    bounds: dict[str, datetime],
) -> dict[str, Any]:
    stages = {s: int(n) for s, n in per.group_by("stage").agg(pl.col("n").sum()).iter_rows()}
    splits = {s: int(n) for s, n in per.group_by("split").agg(pl.col("n").sum()).iter_rows()}
    per_split: dict[str, dict[str, int]] = {}
    for split, stage, n in per.iter_rows():
        per_split.setdefault(split, {})[stage] = int(n)
    test_start = bounds["test_start"]
    cold = {
        t: int(f.filter(pl.col("first_seen") >= pl.lit(test_start, TS)).height) for t, f in nodes.items()
    }
    levels = 0
    if "category" in nodes and "attr_level" in nodes["category"].columns:
        levels = int(nodes["category"]["attr_level"].max() or 0)
    return {
        "snapshot_version": SNAPSHOT_VERSION,
        "dataset": dataset,
        **quarantine.totals(),
        "sources": {k: r.to_json() for k, r in quarantine.events.items()},
        "entity_sources": {k: r.to_json() for k, r in quarantine.entities.items()},
        "derived_events": raw.derived_events,
        "events": int(sum(splits.values())),
        "nodes": {t: f.height for t, f in nodes.items()},
        "edges": edges,
        "stages": {s: stages.get(s, 0) for s in raw.stage_order},
        "stage_order": list(raw.stage_order),
        "deep_stage": raw.stage_order[-1],
        "splits": {s: splits.get(s, 0) for s in ("train", "val", "test")},
        "stages_per_split": per_split,
        "split_bounds": {k: v.isoformat() for k, v in bounds.items()},
        "category_levels": levels,
        "cold_start": cold,
        "created": datetime.now().astimezone().isoformat(),
    }


# what of ``cfg.data`` shapes a snapshot (recorded in meta.json ``settings``, compared on reuse)
SNAPSHOT_SETTINGS = ("name", "adapter", "split")


def snapshot_settings(cfg: DictConfig) -> dict[str, Any]:
    """``{"data": {...}}``: the resolved :data:`SNAPSHOT_SETTINGS` of ``cfg.data`` (those that
    cannot be resolved here, e.g. a mandatory value a reusing run leaves unset, are left out)."""
    from omegaconf.errors import OmegaConfBaseException

    out: dict[str, Any] = {}
    for key in SNAPSHOT_SETTINGS:
        try:
            value = cfg.data.get(key)
            out[key] = OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value
        except OmegaConfBaseException:
            continue
    return {"data": out}


def run(cfg: DictConfig) -> dict[str, Any]:
    """Hydra entry: adapter from ``cfg.data.adapter``, snapshot into ``cfg.paths.graph_dir``."""
    out_dir = Path(cfg.paths.graph_dir)
    meta_path = out_dir / "meta.json"
    if meta_path.exists() and not cfg.force:
        meta = json.loads(meta_path.read_text())
        differ = changed(meta.get("settings", {}), snapshot_settings(cfg), ignore_paths=True)
        differ += [f"source file {line}" for line in changed_sources(meta)]
        # reused all the same (a stage reuses what exists, docs/operations.md), but never silently
        log_reuse(log, "graph snapshot", out_dir, differ, "rebuilds")
        return meta
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    quarantine = Quarantine(out_dir / "quarantine")
    t0 = time.perf_counter()
    raw: RawDataset = instantiate(cfg.data.adapter, quarantine=quarantine, _convert_="all")
    t_adapter = time.perf_counter() - t0
    opts = cfg.get("prepare") or {}
    meta = build_snapshot(
        raw, quarantine, out_dir, dataset=cfg.data.name, split=SplitSpec.from_config(cfg.data.split),
        engine=opts.get("engine", "polars"), spark=SparkOptions.from_config(opts.get("spark")),
        bucket_events=int(opts.get("bucket_events") or BUCKET_EVENTS),
    )
    meta["timings_s"]["adapter"] = round(t_adapter, 3)
    meta["settings"] = snapshot_settings(cfg)
    # meta.json last and atomic: its presence marks a complete snapshot (reused unless force)
    write_text_atomic(meta_path, json.dumps(meta, indent=2))
    if meta["quarantined_rows"]:
        log.warning("quarantined rows (see %s):\n%s", quarantine.out_dir, quarantine.summary())
    log.info(
        "snapshot: %d events kept of %d input rows (%d quarantined); nodes %s",
        meta["kept_rows"], meta["input_rows"], meta["quarantined_rows"], meta["nodes"],
    )
    print(f"graph snapshot: {out_dir}")
    return meta
