"""`hir funnel`: the deep-funnel outputs of a run (``funnel/``), between export and validate.

Reads ``graph/`` (the snapshot's events of the visible splits) and writes, atomically:

===========================  ========================================================================
file                         what
===========================  ========================================================================
``open_funnel.parquet``      every (user, entity) pair engaged before the cut-off, the columns of
                             :data:`hir.funnel.source.COLUMNS` plus ``pos`` (the plain order, 0 =
                             first) and ``event_timestamp`` (the cut-off)
``entities.parquet``         per entity: users, buyers, conversion, repeat share (the scorer's inputs)
``users.parquet``            per user: events, entities, days since the last visit
``base.npz``                 the view base's ``users`` (U, K) and ``entities`` (E, K) vectors, fit on
                             the visible events (the scorer's affinity feature, and discovery when
                             no ANN index is given), and ``popular`` (P,) entity ids
``scorer.pt``                the trained scorer (MLP: state dict, widths; gbdt: the pickled model as
                             bytes and the scikit-learn version it needs), feature names, config;
                             loads with ``torch.load(weights_only=True)``
``meta.json``                the cut-off, the task, the fit's record, counts and seconds, the
                             settings digest the stage reuses it under; for a gbdt,
                             ``scorer_sha256`` (the pickle is loaded only when it matches)
===========================  ========================================================================

The cut-off is the export's: the start of the test period when val is visible, else the val start,
so every row reads only events before it (:mod:`hir.funnel.source`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from hir.atomic import write_text_atomic

log = logging.getLogger(__name__)

FILES = ("open_funnel.parquet", "entities.parquet", "users.parquet", "base.npz", "scorer.pt", "meta.json")


def cutoff(snap: Any, visible_splits: list[str]) -> datetime:
    """The funnel's as-of time: test start when val is visible, else val start."""
    return snap.test_start if "val" in visible_splits else snap.val_start


def settings_digest(funnel: Mapping[str, Any], visible_splits: Sequence[str], seed: int, graph_dir: Path) -> str:
    """A digest (16 hex) of what shapes a ``funnel/``: the resolved ``cfg.funnel`` as plain data
    (less ``enabled``), the visible splits, the run's ``seed`` and the snapshot (the bytes of
    ``graph_dir/meta.json``, which a new `hir prepare` rewrites: its sources, counts and time).
    meta.json records it, and `hir funnel` reuses an output only under the same digest."""
    from hir.settings import digest, file_digests

    return digest({"funnel": {k: v for k, v in funnel.items() if k != "enabled"},
                   "visible_splits": list(visible_splits), "seed": int(seed),
                   **file_digests({"graph": graph_dir / "meta.json"})})


def stale(meta: Mapping[str, Any], settings: str) -> str | None:
    """Why an existing ``funnel/`` (its meta.json ``meta``) cannot be reused under the digest
    ``settings`` (:func:`settings_digest`), or None when it can: written under other settings or
    another snapshot (or before the digest was recorded), or its scorer fitted on other inputs than
    this hir computes (:data:`hir.funnel.candidates.FEATURES`; `hir recommend` refuses such a
    scorer, so reusing it would only move the failure to serving)."""
    from hir.funnel.candidates import FEATURES

    had = meta.get("settings_digest")
    if had is None:
        return "it records no settings digest (written by an older hir)"
    if had != settings:
        return "it was written under other settings (funnel.*, export.visible_splits, seed) or another snapshot"
    features = list(meta.get("fit", {}).get("features", FEATURES))
    if features != list(FEATURES):
        return f"its scorer was fitted on other inputs than this hir computes ({len(features)} against {len(FEATURES)})"
    return None


def write_funnel(graph_dir: Path, out_dir: Path, visible_splits: list[str], config: Any, seed: int,
                 entity_type: str = "product", target_stage: str | None = None,
                 settings: str | None = None) -> dict[str, Any]:
    """Fit the scorer and write ``out_dir`` (module table); returns ``meta.json``'s content
    (``settings``: the :func:`settings_digest` it records, None = none)."""
    import torch

    from hir.data.snapshot import load_snapshot
    from hir.funnel.boost import model_sha256
    from hir.funnel.fit import FunnelTables, fit_funnel
    from hir.funnel.serve import scorer_state
    from hir.funnel.source import plain_order, visible_events

    t0 = time.perf_counter()
    snap = load_snapshot(graph_dir)
    stage = target_stage or snap.deep_stage
    if stage not in snap.stage_order:
        raise ValueError(f"funnel target stage {stage!r} is not in {graph_dir}'s stage order {snap.stage_order}")
    target_rank = snap.stage_order.index(stage)
    end = cutoff(snap, visible_splits)
    asof = end - timedelta(microseconds=1)
    split = snap.meta.get("split", {})
    config.use_time = config.use_time and split.get("timestamps") != "synthesized"
    events = visible_events(snap.scan_events(), entity_type, asof, visible_splits).collect()
    if events.is_empty():
        raise ValueError(f"{snap.events_path}: no {entity_type} events in {visible_splits} before {end}; nothing to fit")
    n_users, n_entities = snap.num_nodes("user"), snap.num_nodes(entity_type)
    period = snap.test_start - snap.val_start
    model = fit_funnel(events, target_rank, str(split.get("mode", "")), end - period, end, n_users, n_entities,
                       config, seed)
    t_fit = time.perf_counter() - t0
    tables = FunnelTables.of_view(events, asof, target_rank, n_users, n_entities, config, seed)
    source = plain_order(tables.source, include_converted=True) \
        .with_columns(pl.lit(end).cast(pl.Datetime("us", "UTC")).alias("event_timestamp"))
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / ".tmp"
    tmp.mkdir(exist_ok=True)
    source.write_parquet(tmp / "open_funnel.parquet")
    tables.entities.sort("entity_id").write_parquet(tmp / "entities.parquet")
    tables.users.sort("user_id").write_parquet(tmp / "users.parquet")
    np.savez(tmp / "base.npz", users=tables.base.users, entities=tables.base.entities, popular=tables.popular)
    state = scorer_state(model.scorer, config, model.record["features"])
    torch.save(state, tmp / "scorer.pt")
    meta = {
        "asof": end.isoformat(), "visible_splits": list(visible_splits), "entity_type": entity_type,
        "target_stage": stage, "target_rank": target_rank, "stage_order": snap.stage_order,
        "use_time": config.use_time, "max_funnel": config.max_funnel, "discovery": config.discovery,
        "popular": config.popular, "pairs": source.height, "users": int(source["user_id"].n_unique()),
        "open_pairs": int((~source["converted"]).sum()), "fit": model.record,
        "seconds": {"fit": round(t_fit, 1), "total": round(time.perf_counter() - t0, 1)},
    }
    if settings is not None:
        meta["settings_digest"] = settings
    if state["kind"] == "gbdt":  # the serving side unpickles the model only when its bytes match this
        meta["scorer_sha256"] = model_sha256(state["model"])
    write_text_atomic(tmp / "meta.json", json.dumps(meta, indent=1, default=str))
    for name in FILES:  # meta.json last: its presence marks a whole output
        (tmp / name).replace(out_dir / name)
    tmp.rmdir()
    log.info("funnel: %d pairs (%d open) of %d users as of %s; scorer's best check recall@%d %.4f (%s task, %s check), "
             "%.0fs", meta["pairs"], meta["open_pairs"], meta["users"], end, config.scorer.k, model.record["best_recall"],
             model.record["task"], model.record["select"], meta["seconds"]["total"])
    return meta


def run(cfg: Any) -> dict[str, Any]:
    """The stage: ``funnel/`` of this run, reused when it exists, was written under the same
    settings and snapshot (:func:`settings_digest`) and its scorer reads this hir's inputs, unless
    ``force``; otherwise (re)computed, saying why."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    out = Path(cfg.paths.funnel_dir)
    if not cfg.funnel.enabled:
        log.info("funnel: off (funnel.enabled=false)")
        return {"enabled": False}
    graph_dir = Path(cfg.paths.graph_dir)
    visible = list(cfg.export.visible_splits)
    settings = settings_digest(OmegaConf.to_container(cfg.funnel, resolve=True), visible, int(cfg.seed), graph_dir)
    if (out / "meta.json").exists() and not cfg.force:
        meta = json.loads((out / "meta.json").read_text())
        why = stale(meta, settings)
        if why is None:
            log.info("funnel: reusing %s (force=true recomputes)", out)
            return meta
        log.info("funnel: recomputing %s: %s", out, why)
    config = instantiate(cfg.funnel.config, _convert_="object")
    return write_funnel(graph_dir, out, visible, config, int(cfg.seed), cfg.funnel.entity_type,
                        cfg.funnel.target_stage, settings)
