"""`hir validate`: run the graph and embedding suites, write result.json + data docs, gate.

Writes under ``paths.validation_dir``: ``result.json`` (success, every failure, drift, and the
sha256 of each export file it checked — `hir publish` accepts only files bound to a passing
result), ``data_docs/index.html`` (GE's HTML report) and ``tables/`` (the derived tables GE
checked, plus GE's raw checkpoint result). Exits non-zero (HirError) with one line per failed
expectation: table, column, check, observed value, example ids.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
from omegaconf import DictConfig, OmegaConf

from hir.atomic import write_text_atomic
from hir.data.schema import relation_types
from hir.data.snapshot import Snapshot, load_snapshot
from hir.errors import HirError, InputError
from hir.progress import progress_steps
from hir.serving import live_entry
from hir.validate import views
from hir.validate.binding import RESULT_FILE, export_hashes, funnel_hashes, read_result, sha256
from hir.validate.drift import drift_summary, drift_view

log = logging.getLogger(__name__)

# docs/contracts.md, embeddings/<type>.parquet (per-level columns are added per level)
EMBEDDING_COLUMNS = {
    "entity_id": "str", "node_id": "int", "entity_type": "str", "embedding": "list<float>", "cold_start": "bool",
    "model_version": "str", "event_timestamp": "datetime", "created": "datetime",
}


class ValidationFailed(HirError):
    """At least one expectation failed; the message lists them."""


def _read_json(path: Path, fix: str) -> dict[str, Any]:
    if not path.exists():
        raise InputError(f"{path} does not exist; {fix}")
    return json.loads(path.read_text())


def _utc(value: str | datetime) -> datetime:
    ts = datetime.fromisoformat(value) if isinstance(value, str) else value
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def _stage_set(cfg: DictConfig, snap: Snapshot) -> list[str]:
    """validate.graph.stages, else the dataset's configured stage order, else meta.json's."""
    for key in ("validate.graph.stages", "data.stage_order", "data.adapter.stage_order"):
        value = OmegaConf.select(cfg, key, default=None)
        if value:
            return list(value)
    return snap.stage_order


def graph_tables(snap: Snapshot, stages: list[str], ts_min: datetime, ts_max: datetime,
                 split_share: dict[str, tuple[float, float]], max_quarantine: float) -> list:
    """The prepared snapshot's tables and their suites."""
    from hir.validate import suites

    meta = snap.meta
    nodes: dict[str, int] = {t: int(n) for t, n in meta["nodes"].items()}
    bounds = {k: _utc(v) for k, v in snap.split_bounds.items()}
    events = snap.scan_events()
    tables = [
        suites.events_table(views.events_view(events, nodes, bounds), stages, ts_min, ts_max),
        suites.splits_table(views.split_view(events), split_share),
        suites.sources_table(views.sources_view(meta), max_quarantine),
    ]
    for etype, n in nodes.items():
        tables.append(suites.nodes_table(etype, snap.nodes(etype, ["node_id", "key"]), n))
    for rel in snap.relations():
        src, dst = relation_types(rel)
        view = views.edges_view(snap.scan_edges(rel), nodes.get(src, 0), nodes.get(dst, 0))
        tables.append(suites.edges_table(rel, view, stages))
    return tables


def embedding_tables(
    emb_dir: Path, emb_meta: dict[str, Any], snap: Snapshot, expected_dim: int, vcfg: DictConfig,
    previous: dict[str, Any] | None,
) -> tuple[list, dict[str, Any]]:
    """Suites for every ``embeddings/<type>.parquet`` and ``meta.json``; returns (tables, report):
    the report holds per type ``drift``, ``duplicate_share`` (rows with an exact twin),
    ``twin_share`` (sampled rows with engagement that have a near twin) and
    ``cold_start_coverage`` (cold-start entities with text told apart from other texts)."""
    from hir.validate import suites

    levels: list[int] = [int(v) for v in emb_meta.get("levels", [])]
    top_k = emb_meta.get("top_k")
    graph_meta = snap.meta
    test_start = _utc(snap.split_bounds["test_start"])
    expected = dict(EMBEDDING_COLUMNS)
    for k in range(len(levels)):
        expected |= {f"tokens_l{k}": "list<int>", f"weights_l{k}": "list<float>"}
    files = {p.stem: p for p in sorted(emb_dir.glob("*.parquet"))}
    counts: dict[str, int] = {t: int(n) for t, n in (emb_meta.get("counts") or {}).items()}
    tables, drift, meta_rows, duplicates, twins, coverage = [], {}, [], {}, {}, {}
    # engagement contexts as the export saw them: twins with one context are not a collapse
    contexts = views.context_labels(snap, emb_meta.get("visible_splits"))
    for etype in sorted(set(files) | set(counts)):
        n_rows = None
        if etype in files:
            frame = pl.read_parquet(files[etype])
            n_rows = frame.height
            tables.append(suites.embedding_schema_table(etype, views.schema_view(dict(frame.schema), expected)))
        meta_rows.append({"id": etype, "dim": int(emb_meta.get("dim", -1)), "count_ok": n_rows == counts.get(etype),
                          "file_ok": etype in files and etype in counts, "type_ok": etype in graph_meta["nodes"]})
        if etype not in files or "entity_id" not in frame.columns or etype not in graph_meta["nodes"]:
            continue
        graph_nodes = snap.nodes(etype, ["node_id", "key", "first_seen", "text"])
        e = vcfg.embeddings
        view = views.embedding_view(frame, graph_nodes, len(levels), float(e.twin_tolerance), int(e.twin_sample),
                                    contexts)
        tables.append(suites.embedding_table(
            etype, view, int(graph_meta["nodes"][etype]), expected_dim, levels, top_k,
            str(emb_meta.get("model_version")), vcfg.embeddings.norm_tolerance, vcfg.embeddings.weight_sum_tolerance,
            vcfg.embeddings.max_duplicate_share,
        ))
        duplicates[etype] = round(1 - float(view["emb_distinct"].mean()), 6) if "emb_distinct" in view.columns else None
        if "emb_no_twin" in view.columns and view["emb_no_twin"].drop_nulls().len():
            twins[etype] = round(1 - float(view["emb_no_twin"].drop_nulls().mean()), 6)
        cover = views.coverage_view(graph_nodes, frame, view, test_start, float(e.twin_tolerance), int(e.twin_sample))
        if cover["covered"].drop_nulls().len():
            coverage[etype] = round(float(cover["covered"].drop_nulls().mean()), 6)
        tables.append(suites.coverage_table(etype, cover, vcfg.embeddings.min_cold_start_coverage))
        prev_file = ((previous or {}).get("feast", {}).get("offline_files") or {}).get(etype)
        if prev_file and Path(prev_file).exists():
            join_key = previous["feast"]["entities"][etype]["join_key"]
            prev = pl.read_parquet(prev_file).rename({join_key: "entity_id"})
            dview = drift_view(frame, prev, len(levels))
            drift[etype] = drift_summary(dview, frame.height)
            gate = suites.drift_table(etype, dview, vcfg.drift.min_mean_cosine, vcfg.drift.min_mean_jaccard,
                                      vcfg.examples)
            if gate is not None:
                tables.append(gate)
    tables.append(suites.meta_table(pl.DataFrame(meta_rows, schema={"id": pl.String, "dim": pl.Int64,
                  "count_ok": pl.Boolean, "file_ok": pl.Boolean, "type_ok": pl.Boolean}), expected_dim))
    return tables, {"drift": drift, "duplicate_share": duplicates, "twin_share": twins, "cold_start_coverage": coverage}


def _summary(result: dict[str, Any]) -> str:
    fails = result["failures"]
    head = (f"validation {'passed' if result['success'] else 'FAILED'}: {result['evaluated'] - len(fails)}/"
            f"{result['evaluated']} expectations passed for model_version {result['model_version']!r}")
    lines = [head, *(f"  FAIL {f['table']} | column {f['column']} | {f['check']} ({f['expectation']}): "
                     f"{f['observed']}" + (f"; e.g. ids {', '.join(f['examples'])}" if f["examples"] else "")
                     for f in fails)]
    dup = {t: v for t, v in (result.get("duplicate_share") or {}).items() if v}
    if dup:
        lines.append("  rows sharing their exact vector with another row: " +
                     ", ".join(f"{t} {v:.1%}" for t, v in sorted(dup.items())))
    twins = result.get("twin_share") or {}
    if twins:
        lines.append("  entities with engagement that have a near-identical twin: " +
                     ", ".join(f"{t} {v:.1%}" for t, v in sorted(twins.items())))
    cover = result.get("cold_start_coverage") or {}
    if cover:
        lines.append("  cold-start entities told apart by their text: " +
                     ", ".join(f"{t} {v:.1%}" for t, v in sorted(cover.items())))
    for etype, d in (result.get("drift") or {}).items():
        lines.append(f"  drift {etype} vs live {result['previous_version']!r}: " +
                     ", ".join(f"{k}={v}" for k, v in d.items()))
    if result.get("data_docs"):
        lines.append(f"  data docs: {result['data_docs']}")
    return "\n".join(lines)


def _funnel_binding(cfg: DictConfig) -> dict[str, Any] | None:
    """``{"dir", "files"}`` of the run's ``funnel/`` when `hir funnel` wrote one (and is on), else None."""
    funnel_dir = OmegaConf.select(cfg, "paths.funnel_dir", default=None)
    if not OmegaConf.select(cfg, "funnel.enabled", default=False) or not funnel_dir:
        return None
    path = Path(funnel_dir)
    if not (path / "open_funnel.parquet").exists():
        log.info("validate: no %s (run `hir funnel` to publish the open funnel); validating without it",
                 path / "open_funnel.parquet")
        return None
    return {"dir": str(path.resolve()), "files": funnel_hashes(path)}


def run(cfg: DictConfig) -> dict[str, Any]:
    """Hydra entry: validate ``paths.graph_dir`` + ``paths.embeddings_dir`` into ``paths.validation_dir``."""
    graph_dir, emb_dir = Path(cfg.paths.graph_dir), Path(cfg.paths.embeddings_dir)
    val_dir = Path(cfg.paths.validation_dir)
    vcfg = cfg.validate
    snap = load_snapshot(graph_dir)
    emb_meta = _read_json(emb_dir / "meta.json", "run `hir export` first (or point paths.embeddings_dir at an export)")
    expected_dim = int(vcfg.embeddings.dim if vcfg.embeddings.dim is not None else emb_meta["dim"])
    store_dir = OmegaConf.select(cfg, "publish.store_dir", default=None)
    previous = live_entry(Path(store_dir)) if store_dir else None
    prev_manifest = previous["manifest"] if previous and previous["version"] != emb_meta.get("model_version") else None
    binding = {
        "files": export_hashes(emb_dir),
        "graph_meta_sha256": sha256(snap.meta_path),
        "config_sha256": hashlib.sha256(
            json.dumps([OmegaConf.to_container(vcfg, resolve=True), expected_dim], sort_keys=True).encode()
        ).hexdigest(),
        "previous_version": prev_manifest["version"] if prev_manifest else None,
        "funnel": _funnel_binding(cfg),
    }
    old = read_result(val_dir)
    if old and not cfg.force and all(old.get(k) == v for k, v in binding.items()):
        log.info("validation of these exact files exists at %s; reusing it (force=true re-runs)", val_dir / RESULT_FILE)
        result = old
    else:
        result = _validate(cfg, snap, emb_dir, val_dir, emb_meta, expected_dim, prev_manifest, binding)
    summary = _summary(result)
    if not result["success"]:
        raise ValidationFailed(summary)  # the hir command logs and prints it
    log.info("%s", summary)  # the hir command's console handler shows it; no second print
    keys = ("success", "evaluated", "model_version", "previous_version", "drift", "duplicate_share", "twin_share",
            "cold_start_coverage", "timings_s")
    return {k: result.get(k) for k in keys}


def _validate(cfg: DictConfig, snap: Snapshot, emb_dir: Path, val_dir: Path, emb_meta: dict, expected_dim: int,
              prev_manifest: dict | None, binding: dict[str, Any]) -> dict[str, Any]:
    from hir.validate.checkpoint import run_checkpoint

    vcfg = cfg.validate
    g = vcfg.graph
    ts_max = _utc(g.max_timestamp) if g.max_timestamp else datetime.now(UTC) + timedelta(days=1)
    timings: dict[str, float] = {}
    for sub in ("tables", "data_docs"):
        shutil.rmtree(val_dir / sub, ignore_errors=True)
    with progress_steps("validate", 3) as step:
        t0 = time.perf_counter()
        tables = graph_tables(snap, _stage_set(cfg, snap), _utc(g.min_timestamp), ts_max,
                              {k: tuple(v) for k, v in g.split_share.items()}, g.max_quarantine_share)
        timings["graph_tables"] = time.perf_counter() - t0
        step("embedding tables")
        t0 = time.perf_counter()
        emb_tables, report = embedding_tables(emb_dir, emb_meta, snap, expected_dim, vcfg, prev_manifest)
        if binding.get("funnel"):
            from hir.validate.funnel import export_timestamp, funnel_tables

            emb_tables += funnel_tables(Path(binding["funnel"]["dir"]), snap, export_timestamp(emb_dir, emb_meta))
        timings["embedding_tables"] = time.perf_counter() - t0
        step("checkpoint")
        t0 = time.perf_counter()
        outcome = run_checkpoint([*tables, *emb_tables], val_dir / "tables", val_dir / "data_docs", vcfg.examples)
        timings["checkpoint"] = time.perf_counter() - t0
    created = emb_meta.get("created")
    if created is None:  # not in every export's meta.json: the newest row's `created`
        latest = pl.scan_parquet(sorted(emb_dir.glob("*.parquet"))).select(pl.col("created").max()).collect().item() \
            if list(emb_dir.glob("*.parquet")) else None
        created = latest.isoformat() if latest else None
    result = {
        **outcome.to_json(),
        "validated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "embeddings_dir": str(emb_dir.resolve()),
        "graph_dir": str(snap.dir.resolve()),
        "model_version": str(emb_meta.get("model_version")),
        "created": created,
        "dim": expected_dim,
        "counts": emb_meta.get("counts"),
        "drift": report["drift"],
        "duplicate_share": report["duplicate_share"],
        "twin_share": report["twin_share"],
        "cold_start_coverage": report["cold_start_coverage"],
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
        **binding,
    }
    val_dir.mkdir(parents=True, exist_ok=True)
    # atomic: a kill mid-write must not leave a torn result.json that `hir publish` then cannot read
    write_text_atomic(val_dir / RESULT_FILE, json.dumps(result, indent=2, default=str))
    return result

