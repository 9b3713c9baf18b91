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
from omegaconf import DictConfig

from hir.data import steps
from hir.data.raw import Quarantine, RawDataset
from hir.data.schema import EVENT_COLUMNS, METADATA_RELATIONS, SNAPSHOT_VERSION, TS, engage_relation
from hir.errors import InputError
from hir.progress import progress_steps

log = logging.getLogger(__name__)


def build_snapshot(
    raw: RawDataset,
    quarantine: Quarantine,
    out_dir: Path,
    dataset: str,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    val_start: str | None = None,
    test_start: str | None = None,
) -> dict[str, Any]:
    """Write ``out_dir/{nodes,edges}/*.parquet``, ``events.parquet`` and ``meta.json``.

    The split is temporal: explicit ``val_start``/``test_start`` (ISO dates) when given, else
    the time quantiles that leave ``val_fraction``/``test_fraction`` of events for val/test.
    Returns the meta dict.
    """
    timings: dict[str, float] = {}
    tmp = out_dir / "_tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    (out_dir / "nodes").mkdir(exist_ok=True)
    (out_dir / "edges").mkdir(exist_ok=True)

    with progress_steps("prepare", 5) as step:
        t0 = time.perf_counter()
        # materialise the kept events once, so every later pass reads one parquet file
        raw_events = tmp / "events_keys.parquet"
        raw.events.sink_parquet(raw_events)
        events = pl.scan_parquet(raw_events)
        n_events = events.select(pl.len()).collect().item()
        if n_events == 0:
            raise InputError(f"{dataset}: no event rows survived validation; see {quarantine.out_dir}")
        seen_stages = set(events.select(pl.col("stage").unique()).collect().to_series().to_list())
        seen_types = set(events.select(pl.col("entity_type").unique()).collect().to_series().to_list())
        unknown = sorted(seen_stages - set(raw.stage_order))
        if unknown:
            raise InputError(
                f"{dataset}: events have stages {unknown} that are not in the stage order {raw.stage_order}; "
                "add them to data.stage_order"
            )
        timings["validate"] = time.perf_counter() - t0
        step("split")

        t0 = time.perf_counter()
        if val_start and test_start:
            lo_hi = events.select(pl.col("timestamp").min().alias("min"), pl.col("timestamp").max().alias("max"))
            bounds = lo_hi.collect().row(0, named=True)
            bounds["val_start"] = datetime.fromisoformat(val_start).replace(tzinfo=bounds["min"].tzinfo)
            bounds["test_start"] = datetime.fromisoformat(test_start).replace(tzinfo=bounds["min"].tzinfo)
        else:
            bounds = steps.split_bounds_from_quantiles(events, val_fraction, test_fraction)
        timings["split"] = time.perf_counter() - t0
        step("nodes")

        t0 = time.perf_counter()
        first_seen = events.group_by("entity_type", "entity_key").agg(pl.col("timestamp").min().alias("first_seen"))
        user_first = events.group_by("user_key").agg(pl.col("timestamp").min().alias("first_seen"))
        types = sorted(
            set(seen_types)
            | set(raw.entities) - {"user"}
            | {t for rel in raw.relations for t in METADATA_RELATIONS[rel]} - {"user"}
        )
        node_frames: dict[str, pl.DataFrame] = {}
        user_keys = [events.select(pl.col("user_key").alias("key"))]
        if "user" in raw.entities:
            user_keys.append(raw.entities["user"].lazy().select("key"))
        node_frames["user"] = steps.node_table(
            pl.concat(user_keys), raw.entities.get("user"), user_first.rename({"user_key": "key"})
        ).collect()
        event_types = seen_types
        for etype in types:
            keys = []
            if etype in event_types:
                keys.append(events.filter(pl.col("entity_type") == etype).select(pl.col("entity_key").alias("key")))
            if etype in raw.entities:
                keys.append(raw.entities[etype].lazy().select("key"))
            for rel, frame in raw.relations.items():
                src_t, dst_t = METADATA_RELATIONS[rel]
                if src_t == etype:
                    keys.append(frame.lazy().select(pl.col("src_key").alias("key")))
                if dst_t == etype:
                    keys.append(frame.lazy().select(pl.col("dst_key").alias("key")))
            fs = first_seen.filter(pl.col("entity_type") == etype).select(pl.col("entity_key").alias("key"), "first_seen")
            node_frames[etype] = steps.node_table(pl.concat(keys), raw.entities.get(etype), fs).collect()
        for etype, frame in node_frames.items():
            frame.with_columns(pl.col("key").cast(pl.String)).write_parquet(out_dir / "nodes" / f"{etype}.parquet")
        timings["nodes"] = time.perf_counter() - t0
        step("events")

        t0 = time.perf_counter()
        # only types that have events take part in the id join; their keys share the events' dtype
        key_dtype = events.collect_schema()["entity_key"]
        entity_map = pl.concat(
            [
                f.lazy().select(pl.lit(t).alias("entity_type"), pl.col("key").cast(key_dtype), "node_id")
                for t, f in node_frames.items()
                if t in event_types
            ]
        )
        labelled = steps.label_split(
            steps.assign_ids(events, node_frames["user"].lazy(), entity_map), bounds["val_start"], bounds["test_start"]
        ).with_columns(steps.stage_rank(raw.stage_order).alias("stage_rank"))
        labelled.select(EVENT_COLUMNS).sink_parquet(out_dir / "events.parquet")
        timings["events"] = time.perf_counter() - t0
        step("edges")

        t0 = time.perf_counter()
        final = pl.scan_parquet(out_dir / "events.parquet")
        edges = steps.aggregate_edges(final).collect()
        edge_counts: dict[str, int] = {}
        for (etype,), part in edges.partition_by("entity_type", as_dict=True).items():
            name = engage_relation(str(etype))
            part.drop("entity_type").rename({"user_id": "src_id", "entity_id": "dst_id"}).sort(
                "src_id", "dst_id"
            ).write_parquet(out_dir / "edges" / f"{name}.parquet")
            edge_counts[name] = part.height
        for rel, frame in raw.relations.items():
            src_t, dst_t = METADATA_RELATIONS[rel]
            mapped = steps.map_relation(frame.lazy(), node_frames[src_t].lazy(), node_frames[dst_t].lazy()).collect()
            mapped.write_parquet(out_dir / "edges" / f"{rel}.parquet")
            edge_counts[rel] = mapped.height
        timings["edges"] = time.perf_counter() - t0

    for name, path in raw.artifacts.items():
        shutil.copy(path, out_dir / name)
    shutil.rmtree(tmp)
    meta = _meta(final, raw, quarantine, dataset, node_frames, edge_counts, bounds)
    meta["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2))
    return meta


def _meta(
    events: pl.LazyFrame,
    raw: RawDataset,
    quarantine: Quarantine,
    dataset: str,
    nodes: dict[str, pl.DataFrame],
    edges: dict[str, int],
    bounds: dict[str, datetime],
) -> dict[str, Any]:
    per = events.group_by("split", "stage").agg(pl.len().alias("n")).collect()
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


def run(cfg: DictConfig) -> dict[str, Any]:
    """Hydra entry: adapter from ``cfg.data.adapter``, snapshot into ``cfg.paths.graph_dir``."""
    out_dir = Path(cfg.paths.graph_dir)
    meta_path = out_dir / "meta.json"
    if meta_path.exists() and not cfg.force:
        log.info("graph snapshot exists at %s; reusing it (force=true rebuilds)", out_dir)
        return json.loads(meta_path.read_text())
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    quarantine = Quarantine(out_dir / "quarantine")
    t0 = time.perf_counter()
    raw: RawDataset = instantiate(cfg.data.adapter, quarantine=quarantine, _convert_="all")
    t_adapter = time.perf_counter() - t0
    split = cfg.data.split
    meta = build_snapshot(
        raw,
        quarantine,
        out_dir,
        dataset=cfg.data.name,
        val_fraction=split.val_fraction,
        test_fraction=split.test_fraction,
        val_start=split.get("val_start"),
        test_start=split.get("test_start"),
    )
    meta["timings_s"]["adapter"] = round(t_adapter, 3)
    meta_path.write_text(json.dumps(meta, indent=2))
    if meta["quarantined_rows"]:
        log.warning("quarantined rows (see %s):\n%s", quarantine.out_dir, quarantine.summary())
    log.info(
        "snapshot: %d events kept of %d input rows (%d quarantined); nodes %s",
        meta["kept_rows"], meta["input_rows"], meta["quarantined_rows"], meta["nodes"],
    )
    print(f"graph snapshot: {out_dir}")
    return meta
