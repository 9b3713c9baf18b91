"""`hir publish`: a validated export -> Feast + Milvus, switched in only when fully staged.

Reads ``paths.embeddings_dir`` (only with a passing ``paths.validation_dir/result.json`` bound
to the files' sha256), writes the serving state under ``publish.store_dir`` (stable across runs:
Feast registry + online store, Milvus Lite dir, one working copy of feature_repo/ per version,
``live.json``) and the run's ``paths.publish_dir/manifest.json``.

Order: stage everything under new names (serving copy of the parquet, feast apply, materialize,
Milvus insert/flush/index/load/sanity search) while the previous version keeps serving; then
switch the Milvus aliases and the live FeatureService and commit ``live.json``; then retire
versions beyond ``publish.keep_versions``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hir import space
from hir.errors import HirError
from hir.export.recorded import exported_checkpoint
from hir.progress import progress_steps
from hir.publish import faults, feast_store, milvus_store, switch
from hir.publish import funnel as funnel_table
from hir.publish.leftovers import (
    SPACE_FIX,
    abandon,
    allocated_bytes,
    check_space,
    export_bytes,
    recover,
    safe_name,
    served_note,
)
from hir.serving import (
    describe_store,
    now_iso,
    read_state,
    slug,
    store_lock,
    sync_manifests,
    write_state,
)
from hir.validate.binding import require_funnel, require_validated, sha256

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"


def milvus_settings(pcfg: DictConfig, rows: int = 0) -> dict[str, Any]:
    """``publish.milvus`` with ``index_params`` / ``search_params`` of the chosen ``index_type`` only.

    ``index_type: auto`` resolves by the largest collection's ``rows``: exact FLAT search up to
    ``flat_max_rows``, HNSW beyond (``index_requested`` keeps what was asked for).
    """
    m = OmegaConf.to_container(pcfg.milvus, resolve=True)
    kind = str(m["index_type"])
    m["index_requested"] = kind
    if kind == "auto":
        kind = "FLAT" if rows <= int(m.get("flat_max_rows") or 0) else "HNSW"
        m["index_type"] = kind
    for key in ("index_params", "search_params"):
        per_type = m[key] or {}
        if kind not in per_type:
            raise HirError(f"publish.milvus.index_type={kind} has no publish.milvus.{key}.{kind} (have {sorted(per_type)}); "
                           f"add it, e.g. '+publish.milvus.{key}.{kind}={{}}' for Milvus' defaults")
        m[key] = dict(per_type[kind] or {})
    return m


def online_settings(pcfg: DictConfig) -> dict[str, Any]:
    """The Feast ``online_store`` block: ``type`` plus that type's options (null ones dropped),
    checked against Feast's config class so a wrong key fails here, before anything is staged."""
    from feast.repo_config import get_online_config_from_type

    cfg = OmegaConf.to_container(pcfg.feast.online_store, resolve=True)
    kind = str(cfg.get("type"))
    options = cfg.get(kind)
    if not isinstance(options, dict):
        have = sorted(k for k, v in cfg.items() if isinstance(v, dict))
        raise HirError(f"publish.feast.online_store.type={kind} has no options block publish.feast.online_store.{kind} "
                       f"(have {have}); add '+publish.feast.online_store.{kind}={{...}}'")
    options = {k: v for k, v in options.items() if v is not None}
    try:
        fields = set(get_online_config_from_type(kind).model_fields)
    except Exception:  # a custom store class: Feast itself checks its keys at apply
        fields = None
    unknown = sorted(set(options) - fields) if fields is not None else []
    if unknown:
        raise HirError(f"publish.feast.online_store.{kind} has {unknown}, which Feast's {kind} online store does not "
                       f"take (it takes {sorted(fields - {'type'})}); remove them")
    return {"type": kind, **options}


def _older(created: str | None, than: str | None) -> bool:
    if not created or not than:
        return False
    return datetime.fromisoformat(created) < datetime.fromisoformat(than)


def _register_manifest(state: dict[str, Any], sl: str, path: Path, noop: bool = False) -> None:
    """Record ``path`` as a run manifest of version ``sl`` and (re)write every recorded manifest
    with its current status (:func:`hir.serving.sync_manifests`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if noop:
        path.write_text(json.dumps({"noop": True}))
    paths = state["versions"][sl].setdefault("manifest_paths", [])
    if str(path) not in paths:
        paths.append(str(path))
    sync_manifests(state)


def run(cfg: DictConfig) -> dict[str, Any]:
    """Hydra entry: publish ``paths.embeddings_dir`` into ``publish.store_dir``."""
    emb_dir, val_dir = Path(cfg.paths.embeddings_dir), Path(cfg.paths.validation_dir)
    manifest_path = (Path(cfg.paths.publish_dir) / MANIFEST).resolve()
    pcfg = cfg.publish
    store_dir = Path(pcfg.store_dir).resolve()
    result = require_validated(emb_dir, val_dir)  # refuses failed, unvalidated or edited files
    require_funnel(result)  # and an open funnel edited since it was validated
    version, created = result["model_version"], result.get("created")
    with store_lock(store_dir, "publish"):
        state = read_state(store_dir)
        # removing what an earlier attempt left needs a little space too (SQLite, the registry)
        with space.guard("the removal of an earlier attempt's leftovers", store_dir,
                         f"{served_note(state)}; the leftovers stay until a run has room to remove them", SPACE_FIX):
            recover(cfg, state)
        live = state["versions"].get(state["live"]) if state["live"] else None
        if live and live["version"] == version:
            if live["hashes"] != result["files"]:
                raise HirError(
                    f"model_version {version!r} is live in {store_dir} with different content (the export files' "
                    "sha256 differ); a version is immutable once published: export under a new model_version"
                )
            funnel_now = (result.get("funnel") or {}).get("files")
            if live.get("funnel_hashes") != funnel_now:
                raise HirError(
                    f"model_version {version!r} is live in {store_dir} with a different open funnel (funnel/ was "
                    f"{'added' if not live.get('funnel_hashes') else 'removed' if not funnel_now else 'recomputed'} "
                    "since it was published); a version is immutable once published: export under a new "
                    "model_version (`hir export force=true`), or keep the published funnel/"
                )
            _register_manifest(state, live["slug"], manifest_path, noop=True)
            write_state(store_dir, state)
            log.info("version %r is already live in %s; nothing to publish (manifest %s)\n%s", version, store_dir,
                     manifest_path, describe_store(state, store_dir))
            return {"version": version, "noop": True, "store_dir": str(store_dir), "status": "live"}
        if live and _older(created, live.get("created")) and not pcfg.allow_rollback:
            raise HirError(
                f"model_version {version!r} (created {created}) is older than the live {live['version']!r} "
                f"(created {live['created']}); publishing it is a rollback: add publish.allow_rollback=true"
            )
        served = served_note(state)
        check_space(cfg, store_dir, emb_dir, state, served)
        writing = {"what": "the serving copy of the export", "where": store_dir / "versions"}
        try:
            manifest = publish_version(cfg, state, store_dir, emb_dir, result, writing,
                                       bytes_before=allocated_bytes(store_dir))
        except BaseException as err:
            # a failed attempt leaves nothing behind: its collections, Feast objects and files go now
            removed = abandon(cfg, state, store_dir, slug(version))
            if space.is_out_of_space(err):
                raise space.OutOfSpace(f"{writing['what']} of {version!r}", writing["where"],
                                       f"{served}; {removed}", SPACE_FIX) from err
            raise
        # the switch is committed: a full disk from here on cannot unpublish, only leave the record short
        with space.guard("the run manifest and live.json", store_dir,
                         f"the new version {version!r} is live and serving", SPACE_FIX):
            _register_manifest(state, slug(version), manifest_path)
            write_state(store_dir, state)
    funnel = manifest["feast"].get("funnel")
    log.info("published %r: feast service %s (and %s, the live one)%s, milvus aliases %s; manifest %s\n%s", version,
             manifest["feast"]["feature_service"], manifest["feast"]["live_feature_service"],
             f", open funnel of {funnel['rows']} users in {funnel['feature_service']} (and "
             f"{funnel['live_feature_service']})" if funnel else "",
             manifest["milvus"]["aliases"], manifest_path, describe_store(state, store_dir))
    return {"version": version, "noop": False, "rows": manifest["rows"], "timings_s": manifest["timings_s"],
            "materialize_rows_per_s": manifest["feast"]["materialize_rows_per_s"],
            "sanity": manifest["milvus"]["sanity"], "store_dir": str(store_dir), "status": "live"}


@dataclass
class _Job:
    """One version being published: what the phases share."""

    cfg: DictConfig
    state: dict[str, Any]
    store_dir: Path
    version: str
    slug: str
    service: str
    prefix: str
    tables: dict[str, dict[str, Any]]
    windows: dict[str, tuple[datetime, datetime]]
    rows: dict[str, int]
    repo: Path
    manifest: dict[str, Any]
    entry: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)
    writing: dict[str, Any] = field(default_factory=dict)
    # the open funnel's spec entry and event_timestamp window (None: no funnel/ was validated)
    funnel: dict[str, Any] | None = None
    funnel_window: tuple[datetime, datetime] | None = None
    # the store's allocated bytes before this publish (None: not measured)
    bytes_before: int | None = None
    emb_dir: Path | None = None

    def now_writing(self, what: str, where: Path | str) -> None:
        """What the next phase writes, and where (an out-of-space message names them)."""
        self.writing.update(what=what, where=where)


def publish_version(cfg: DictConfig, state: dict[str, Any], store_dir: Path, emb_dir: Path,
                    result: dict[str, Any], writing: dict[str, Any] | None = None,
                    bytes_before: int | None = None) -> dict[str, Any]:
    """Stage, switch, commit and retire; returns the manifest of the new live version.
    ``writing`` is kept up to date with what is being written where (for an out-of-space message);
    ``bytes_before``, the store's allocated bytes before, makes the version record what it added
    (``space`` in live.json: the next publish's free-space check reads it)."""
    pcfg = cfg.publish
    writing = {} if writing is None else writing
    with progress_steps("publish", 6) as step:
        t0 = time.perf_counter()
        job = _prepare(cfg, state, store_dir, emb_dir, result)
        job.writing, job.bytes_before, job.emb_dir = writing, bytes_before, emb_dir
        job.timings["stage_files"] = time.perf_counter() - t0
        step("feast apply")
        store = feast_store.open_store(job.repo)
        client = milvus_store.connect(pcfg.milvus.uri, pcfg.milvus.token)
        try:
            _phases(job, store, client, step)
        finally:
            milvus_store.disconnect(client, pcfg.milvus.uri)
    job.manifest["timings_s"] = {k: round(v, 3) for k, v in job.timings.items()}
    state["versions"][job.slug]["manifest"] = job.manifest
    write_state(store_dir, state)
    log.info("published %s: rows %s, timings %s", job.version, job.rows, job.manifest["timings_s"])
    return job.manifest


def _prepare(cfg: DictConfig, state: dict[str, Any], store_dir: Path, emb_dir: Path, result: dict[str, Any]) -> _Job:
    """Serving copies of the parquet, the working copy of feature_repo/ and a ``staged`` entry in
    live.json (which still names the previous live version): nothing that is served changes."""
    pcfg = cfg.publish
    version, sl = result["model_version"], slug(result["model_version"])
    service, prefix = pcfg.feast.feature_service, safe_name(pcfg.milvus.prefix)
    prior = state["versions"].get(sl)
    if prior and prior["status"] == "kept" and prior["hashes"] != result["files"]:
        raise HirError(f"model_version {version!r} is kept in {store_dir} with different content; a version is "
                       "immutable once published: export under a new model_version")
    vdir = store_dir / "versions" / sl
    faults.point("stage_files")
    emb_meta = json.loads((emb_dir / "meta.json").read_text())
    levels = len(emb_meta.get("levels", []))
    tables, windows, rows, offline_sha = {}, {}, {}, {}
    for path in sorted(emb_dir.glob("*.parquet")):
        etype = path.stem
        n = feast_store.names(etype, sl, service)
        dst = vdir / "data" / f"{etype}.parquet"
        stats = feast_store.serving_copy(path, dst, n["join_key"])
        tables[etype] = {**{k: n[k] for k in ("view", "source", "push_source", "join_key")}, "path": str(dst),
                         "levels": levels}
        windows[etype] = (stats["ts_min"], stats["ts_max"])
        rows[etype] = stats["rows"]
        offline_sha[etype] = sha256(dst)
    served = [t for t in pcfg.feast.service_types if t in tables]
    if not served:
        raise HirError(f"publish.feast.service_types={list(pcfg.feast.service_types)} names no entity type of "
                       f"this export ({sorted(tables)}); list the types a ranker reads together")
    spec = {"version": version, "slug": sl, "feature_service": f"{service}_{sl}", "service_types": served,
            "tables": tables}
    funnel, funnel_window = _funnel_spec(cfg, result, vdir, sl, service)
    if funnel:
        spec["funnel"] = {k: funnel[k] for k in ("view", "source", "push_source", "path", "service", "schema")}
    online = online_settings(pcfg)
    (store_dir / "feast").mkdir(parents=True, exist_ok=True)
    repo = feast_store.write_working_copy(Path(pcfg.feast.repo_template), vdir / "feature_repo",
                                          safe_name(pcfg.feast.project), store_dir / "feast" / "registry.db", online, spec)
    milvus_cfg = milvus_settings(pcfg, max(rows.values(), default=0))
    manifest = _manifest(cfg, store_dir, repo, spec, rows, result, prefix, milvus_cfg, online)
    manifest |= {"levels": emb_meta.get("levels", []), "top_k": emb_meta.get("top_k"),
                 # the export's cutoff per type: its rows join point-in-time rows from then on
                 "valid_from": {e: w[0].isoformat() for e, w in windows.items() if w[0] is not None}}
    manifest["feast"]["offline_sha256"] = offline_sha
    if funnel:
        manifest["feast"]["funnel"] = funnel
        manifest["feast"]["offline_sha256"][funnel_table.TABLE] = sha256(Path(funnel["path"]))
    manifest["source"] |= {"graph_dir": result.get("graph_dir"), "content_dir": str(Path(cfg.paths.content_dir).resolve()),
                           # resolved: meta.json records it relative to the export dir (hir.export.recorded)
                           "checkpoint": str(exported_checkpoint(emb_meta["checkpoint"], emb_dir.resolve()))
                           if emb_meta.get("checkpoint") else None,
                           "visible_splits": emb_meta.get("visible_splits")}
    entry = {"version": version, "slug": sl, "created": result.get("created"), "status": "staged",
             "staged_at": now_iso(), "hashes": result["files"], "manifest": manifest,
             "funnel_hashes": (result.get("funnel") or {}).get("files")}
    if prior and prior["status"] == "kept":  # a rollback target stays kept until this succeeds
        entry["live_at"] = prior.get("live_at")
    state["versions"][sl] = {**entry, "status": "kept" if prior and prior["status"] == "kept" else "staged"}
    write_state(store_dir, state)
    return _Job(cfg, state, store_dir, version, sl, service, prefix, tables, windows, rows, repo, manifest, entry,
                funnel=funnel, funnel_window=funnel_window)


def _funnel_spec(cfg: DictConfig, result: dict[str, Any], vdir: Path, sl: str,
                 service: str) -> tuple[dict[str, Any] | None, tuple[datetime, datetime] | None]:
    """The serving copy of the validated open funnel (hir/publish/funnel.py) and its manifest
    entry, or (None, None) when the validation result binds no ``funnel/``."""
    bound = result.get("funnel")
    if not bound:
        log.info("publish: no open funnel validated with this export (funnel.enabled=false or no `hir funnel` run); "
                 "publishing the embedding views only")
        return None, None
    faults.point("stage_funnel")
    n = funnel_table.names(sl, service)
    dst = vdir / "data" / funnel_table.FILE
    stats = funnel_table.serving_table(Path(bound["dir"]), Path(result["graph_dir"]), dst,
                                       OmegaConf.select(cfg, "publish.funnel.max_pairs", default=None),
                                       result["model_version"], datetime.fromisoformat(result.get("created") or now_iso()))
    entry = {**{k: n[k] for k in ("view", "source", "push_source", "join_key")}, "path": str(dst),
             "service": n["service"], "feature_service": n["service"], "live_feature_service": n["live_service"],
             "projection": funnel_table.TABLE, "schema": funnel_table.SCHEMA, "funnel_dir": bound["dir"],
             **{k: stats[k] for k in ("rows", "pairs", "max_pairs", "entity_type", "asof", "visible_splits",
                                      "target_rank")},
             "valid_from": stats["ts_min"].isoformat() if stats["ts_min"] else None}
    return entry, (stats["ts_min"], stats["ts_max"])


def _phases(job: _Job, store: Any, client: Any, step: Any) -> None:
    """feast apply -> materialize -> milvus (insert, index, load, sanity) -> switch -> retire."""
    pcfg, t, manifest = job.cfg.publish, job.timings, job.manifest
    milvus_cfg = milvus_settings(pcfg, max(job.rows.values(), default=0))
    job.now_writing("the Feast registry", job.store_dir / "feast")
    faults.point("feast_apply")
    t0 = time.perf_counter()
    feast_store.apply(store, feast_store.load_definitions(job.repo))
    t["feast_apply"] = time.perf_counter() - t0
    step("feast materialize")

    online = manifest["feast"]["online_store"]
    job.now_writing("the Feast online store (materialize)",
                    Path(online["path"]).parent if online.get("path") else job.store_dir / "feast")
    faults.point("feast_materialize")
    t0 = time.perf_counter()
    per_type = feast_store.materialize(store, {e: tab["view"] for e, tab in job.tables.items()}, job.windows)
    if job.funnel and job.funnel["rows"]:
        faults.point("feast_materialize_funnel")
        per_type |= feast_store.materialize(store, {funnel_table.TABLE: job.funnel["view"]},
                                            {funnel_table.TABLE: job.funnel_window})
    t["feast_materialize"] = time.perf_counter() - t0
    manifest["feast"]["materialize_s"] = {k: round(v, 3) for k, v in per_type.items()}
    materialized = sum(job.rows.values()) + (job.funnel["rows"] if job.funnel else 0)
    manifest["feast"]["materialize_rows_per_s"] = round(materialized / max(t["feast_materialize"], 1e-9), 1)
    step("milvus")

    uri = str(manifest["milvus"]["uri"])
    job.now_writing("the Milvus collections", uri)
    faults.point("milvus_insert")
    t0 = time.perf_counter()
    sanity, stage_s, ties, payload, datas = {}, {}, {}, {}, {}
    for etype, tab in job.tables.items():
        data = milvus_store.read_table(Path(tab["path"]), tab["join_key"])
        # the vectors Milvus gets: near-twins nudged apart, checked against the validated ones
        payload[etype] = milvus_store.checked_payload(
            data, float(milvus_cfg["tie_break"]), float(milvus_cfg["tie_resolution"]),
            float(milvus_cfg["min_nudged_cosine"]), Path(tab["path"]).with_suffix(".milvus.parquet"),
            f"{etype} vectors for Milvus")
        ties[etype] = payload[etype]["nudged"]
        coll = manifest["milvus"]["collections"][etype]
        stage_s[etype] = milvus_store.stage(client, coll, data, etype, job.version, milvus_cfg)
        faults.point("milvus_sanity")
        sanity[etype] = milvus_store.sanity_search(client, coll, data, int(pcfg.sanity.queries),
                                                   dict(milvus_cfg["search_params"]), float(pcfg.sanity.min_self_hit))
        datas[etype] = data
    if "user" in datas:
        # what a consumer does: users' vectors searched among each other type's entities; the
        # index must return what exact search returns (self-queries alone miss a graph index
        # that cannot rank users' neighbours, see milvus_store.user_recall)
        for etype, data in datas.items():
            if etype != "user":
                sanity[etype] |= milvus_store.user_recall(
                    client, manifest["milvus"]["collections"][etype], datas["user"]["vectors"], data,
                    int(pcfg.sanity.queries), int(pcfg.sanity.recall_k), dict(milvus_cfg["search_params"]),
                    float(pcfg.sanity.min_user_recall), milvus_cfg)
    t["milvus"] = time.perf_counter() - t0
    manifest["milvus"]["sanity"] = sanity
    manifest["milvus"]["tie_broken_rows"] = ties
    manifest["milvus"]["payload"] = payload
    manifest["milvus"]["stage_s"] = {e: {k: round(v, 3) for k, v in d.items()} for e, d in stage_s.items()}
    step("switch")

    job.now_writing("the switch (Feast registry, live.json)", job.store_dir)
    faults.point("switch")
    t0 = time.perf_counter()
    manifest["published_at"] = now_iso()
    manifest["timings_s"] = {k: round(v, 3) for k, v in t.items()}
    job.entry["manifest"] = manifest
    switch.switch(job.state, job.store_dir, client, store, job.entry, job.service)
    t["switch"] = time.perf_counter() - t0
    if job.bytes_before is not None and job.emb_dir is not None:
        # what this version added, measured before retiring frees anything: the next publish needs
        # about as much per export byte (SQLite pages, Milvus segments, serving copies)
        size, grown = export_bytes(job.emb_dir), allocated_bytes(job.store_dir) - job.bytes_before
        job.entry["space"] = {"export_bytes": size, "store_growth_bytes": grown,
                              "ratio": round(grown / size, 2) if size and grown > 0 else None}
    step("retire old versions")

    t0 = time.perf_counter()
    try:
        faults.point("cleanup")
        manifest["retired"] = switch.retire(job.state, job.store_dir, client, store, int(pcfg.keep_versions),
                                            job.service)
    except Exception as err:  # the new version is live; leftovers are retried by the next publish
        log.warning("retiring old versions failed (%s); the next publish retries", err)
        manifest["retired"] = []
    t["retire"] = time.perf_counter() - t0


def _manifest(cfg: DictConfig, store_dir: Path, repo: Path, spec: dict[str, Any], rows: dict[str, int],
              result: dict[str, Any], prefix: str, milvus_cfg: dict[str, Any], online: dict[str, Any]) -> dict[str, Any]:
    """What was published where. The keys ``version``, ``feast.repo_path``, ``feast.feature_service``,
    ``feast.feature_views``, ``milvus.uri`` and ``milvus.aliases`` are the contract for readers."""
    pcfg = cfg.publish
    sl, tables = spec["slug"], spec["tables"]
    return {
        "version": spec["version"],
        "slug": sl,
        "created": result.get("created"),
        "dataset": OmegaConf.select(cfg, "data.name", default=None),
        "store_dir": str(store_dir),
        "source": {"embeddings_dir": result["embeddings_dir"], "files": result["files"],
                   "validated_at": result["validated_at"]},
        "rows": rows,
        "dim": result.get("dim"),
        "feast": {
            "repo_path": str(repo),
            "project": safe_name(pcfg.feast.project),
            "feature_service": spec["feature_service"],
            "live_feature_service": pcfg.feast.feature_service,
            "service_types": spec["service_types"],
            "feature_views": {e: t["view"] for e, t in tables.items()},
            "push_sources": {e: t["push_source"] for e, t in tables.items()},
            "entities": {e: {"name": e, "join_key": t["join_key"]} for e, t in tables.items()},
            "offline_files": {e: t["path"] for e, t in tables.items()},
            "offline_store": "duckdb",
            "online_store": online,
            "levels": next(iter(tables.values()))["levels"] if tables else 0,
        },
        "milvus": {
            "uri": milvus_cfg["uri"],
            "aliases": {e: milvus_store.alias_name(prefix, e) for e in tables},
            "collections": {e: milvus_store.collection_name(prefix, e, sl) for e in tables},
            "index": {"index_type": milvus_cfg["index_type"], "metric_type": milvus_cfg["metric_type"],
                      "params": milvus_cfg["index_params"], "requested": milvus_cfg["index_requested"]},
            "search_params": milvus_cfg["search_params"],
        },
        "refreshes": [],
    }
