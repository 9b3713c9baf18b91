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
from hir.data.edges import write_engagement_edges
from hir.data.raw import Quarantine, RawDataset
from hir.data.schema import EVENT_COLUMNS, METADATA_RELATIONS, SNAPSHOT_VERSION, TS
from hir.data.split import SplitSpec
from hir.data.split import plan as split_plan
from hir.errors import InputError
from hir.progress import progress_steps

log = logging.getLogger(__name__)


def build_snapshot(
    raw: RawDataset,
    quarantine: Quarantine,
    out_dir: Path,
    dataset: str,
    split: SplitSpec | None = None,
) -> dict[str, Any]:
    """Write ``out_dir/{nodes,edges}/*.parquet``, ``events.parquet`` and ``meta.json``.

    The split (``split``, default :class:`SplitSpec`) is decided by :func:`hir.data.split.plan`:
    temporal when the data has timestamps (quantiles or explicit dates), a seeded random split
    of (user, entity) pairs with synthesized times when it has none, and a shipped test file
    taken exactly as the test split. Returns the meta dict.
    """
    spec = split or SplitSpec()
    timings: dict[str, float] = {}
    tmp = out_dir / "_tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    (out_dir / "nodes").mkdir(exist_ok=True)
    (out_dir / "edges").mkdir(exist_ok=True)

    with progress_steps("prepare", 5) as step:
        t0 = time.perf_counter()
        # materialise the kept events once (lz4: cheap to write, read a few times below)
        raw_events = tmp / "events_keys.parquet"
        raw.events.sink_parquet(raw_events, compression="lz4")
        events = pl.scan_parquet(raw_events)
        heldout = None
        if raw.heldout is not None:
            raw.heldout.sink_parquet(tmp / "heldout_keys.parquet", compression="lz4")
            heldout = pl.scan_parquet(tmp / "heldout_keys.parquet")
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
        timings["split"] = time.perf_counter() - t0
        step("nodes")

        t0 = time.perf_counter()
        node_frames = _node_tables(events, raw, event_types)
        for etype, frame in node_frames.items():
            frame.with_columns(pl.col("key").cast(pl.String)).write_parquet(out_dir / "nodes" / f"{etype}.parquet")
        timings["nodes"] = time.perf_counter() - t0
        step("events")

        t0 = time.perf_counter()
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
        edge_counts = write_engagement_edges(
            out_dir / "events.parquet", out_dir / "edges", node_frames["user"].height, n_events, raw.stage_order
        )
        for rel, frame in raw.relations.items():
            src_t, dst_t = METADATA_RELATIONS[rel]
            mapped = steps.map_relation(frame.lazy(), node_frames[src_t].lazy(), node_frames[dst_t].lazy()).collect()
            mapped.write_parquet(out_dir / "edges" / f"{rel}.parquet")
            edge_counts[rel] = mapped.height
        timings["edges"] = time.perf_counter() - t0
    final = pl.scan_parquet(out_dir / "events.parquet")

    for name, path in raw.artifacts.items():
        shutil.copy(path, out_dir / name)
    shutil.rmtree(tmp)
    meta = _meta(final, raw, quarantine, dataset, node_frames, edge_counts, bounds)
    meta["split"] = plan.info
    meta["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2))
    return meta


def _node_tables(events: pl.LazyFrame, raw: RawDataset, event_types: set[str]) -> dict[str, pl.DataFrame]:
    """Dense-id node tables for users and every entity type in events, metadata or relations."""
    # one streaming pass gives every type's event keys and first-seen times
    first_seen, user_first = pl.collect_all(
        [
            events.group_by("entity_type", "entity_key").agg(pl.col("timestamp").min().alias("first_seen")),
            events.group_by("user_key").agg(pl.col("timestamp").min().alias("first_seen")),
        ],
        engine="streaming",
    )
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
    events: pl.LazyFrame,
    raw: RawDataset,
    quarantine: Quarantine,
    dataset: str,
    nodes: dict[str, pl.DataFrame],
    edges: dict[str, int],
    bounds: dict[str, datetime],
) -> dict[str, Any]:
    per = events.group_by("split", "stage").agg(pl.len().alias("n")).collect(engine="streaming")
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
    meta = build_snapshot(raw, quarantine, out_dir, dataset=cfg.data.name, split=SplitSpec.from_config(cfg.data.split))
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
