"""`hir refresh`: entities that arrived after the last export, served without retraining.

    hir refresh refresh.delta_path=new_products.csv            # any dataset, one delta format

1. the delta file (:mod:`hir.publish.delta`: ``entity_id``, ``text``, ``attr_*``, links to
   snapshot entities, optionally ``timestamp`` and first events) is checked against the snapshot
   the live model was trained on; entities the live version serves already are skipped;
2. their content vectors come from the enrich stage's encoders
   (:func:`hir.enrich.content.encode_new_entities`) and their embedding + tokens from the live
   model's knowledge view (:meth:`hir.export.embed.Embedder.embed_new`, content + metadata links),
   with no retraining. The model, snapshot and content are the live version's own, as recorded in
   its manifest (``source``), so `hir refresh` runs from any directory;
3. the same embedding suites as `hir validate` check them (plus "not already served");
4. they are pushed to the live version's Feast push sources, online **and** offline (the offline
   parquet gains the rows, so point-in-time training data sees them from their
   ``event_timestamp`` on), and inserted into its live Milvus collections; the refresh is recorded
   in the live manifest (``refreshes``: files, sha256, counts);
5. where the live version publishes the user's open funnel and the delta has first events, the
   open-funnel rows of those users are recomputed point-in-time from the snapshot's events, earlier
   refreshes' and the delta's, and replace theirs online and offline
   (:mod:`hir.publish.refresh_funnel`); every other user keeps the published row.

``event_timestamp`` of a refreshed row: when the entity appeared (the delta's ``timestamp`` or
first event), but never before the live export's cutoff (the model had not seen that engagement
yet); without a timestamp, the refresh time.
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

from hir import space
from hir.atomic import write_parquet_atomic
from hir.data.snapshot import Snapshot, load_snapshot
from hir.errors import HirError, InputError
from hir.progress import progress_steps
from hir.publish import faults, feast_store, milvus_store
from hir.publish.delta import Delta, describe, first_seen, read_delta
from hir.publish.journal import begin, journal_path, undo, undo_leftovers
from hir.publish.leftovers import SPACE_FIX, recover
from hir.publish.refresh_funnel import earlier_events, funnel_rows, push_funnel
from hir.serving import now_iso, read_state, store_lock, sync_manifests, write_state
from hir.validate.binding import sha256

log = logging.getLogger(__name__)


def served_keys(manifest: dict[str, Any], store_dir: Path, etype: str) -> set[str]:
    """Keys of ``etype`` the live version serves: its offline table (the export plus every
    refresh pushed offline) and the files of earlier refreshes."""
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
        raise InputError("hir refresh needs the new entities: refresh.delta_path=<CSV or Parquet file>, e.g. "
                         "refresh.delta_path=new_products.csv (columns entity_id, text, attr_*, category, ...; "
                         "docs/serving.md: Serving new entities between trainings)")
    if not Path(path).exists():
        raise InputError(f"refresh.delta_path={path} does not exist")
    return Path(path)


def model_source(cfg: DictConfig, manifest: dict[str, Any]) -> dict[str, Path]:
    """graph/, content/ and the checkpoint the live version was exported from: ``refresh.run_dir``
    when set, else the ones its manifest recorded (older manifests: the export's run dir)."""
    from hir.export.recorded import exported_checkpoint

    src = manifest.get("source", {})
    emb_dir = Path(src.get("embeddings_dir", ""))
    run_dir = cfg.refresh.get("run_dir")
    if run_dir:
        run = Path(run_dir)
        meta_path = run / "embeddings" / "meta.json"
        # the run's own checkpoint, wherever the run dir is now (meta.json's relative form, or the
        # file of an older absolute path's name in its checkpoints/)
        ckpt = json.loads(meta_path.read_text())["checkpoint"] if meta_path.exists() else None
        out = {"graph_dir": run / "graph", "content_dir": run / "content",
               "checkpoint": exported_checkpoint(ckpt, meta_path.parent) if ckpt else Path(src.get("checkpoint", ""))}
    else:
        ckpt = src.get("checkpoint")  # publish records it resolved
        if not ckpt and (emb_dir / "meta.json").exists():
            ckpt = json.loads((emb_dir / "meta.json").read_text()).get("checkpoint")
            ckpt = str(exported_checkpoint(ckpt, emb_dir)) if ckpt else None
        out = {"graph_dir": Path(src.get("graph_dir") or emb_dir.parent / "graph"),
               "content_dir": Path(src.get("content_dir") or emb_dir.parent / "content"),
               "checkpoint": Path(ckpt or "")}
    gone = [f"{k} {v}" for k, v in out.items() if not str(v) or not v.exists()]
    if gone:
        raise HirError(f"the model of the live version {manifest['version']!r} cannot be loaded: {', '.join(gone)} "
                       "missing. Restore them, or set refresh.run_dir=<the run dir that exported it>")
    return out


def live_snapshot(graph_dir: Path) -> Snapshot:
    """The snapshot the live version was trained on (what a delta is checked against)."""
    try:
        return load_snapshot(graph_dir)
    except InputError as err:
        raise InputError(f"the snapshot of the live version is gone or incomplete ({err}); restore it, or point "
                         "refresh.run_dir at the run that exported the live version") from err


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


def _batch_schema(path: Path) -> list[str]:
    import pyarrow.parquet as pq

    return pq.read_schema(path).names


def push(frames: dict[str, pl.DataFrame], manifest: dict[str, Any], out_dir: Path) -> dict[str, str]:
    """Push to each type's push source of the live version, OFFLINE then ONLINE (the offline
    table gains the rows; Feast rewrites that file in place, so :func:`begin` backed it up);
    returns the parquet per type (the rows as pushed, join key named ``entity_id``)."""
    import warnings

    from feast.data_source import PushMode

    store = feast_store.open_store(Path(manifest["feast"]["repo_path"]))
    files = {}
    for etype, frame in frames.items():
        path = out_dir / f"{etype}.parquet"
        write_parquet_atomic(frame, path)
        files[etype] = str(path)
        join_key = manifest["feast"]["entities"][etype]["join_key"]
        # the pushed frame must carry every column of the batch source, named and ordered as there
        columns = _batch_schema(Path(manifest["feast"]["offline_files"][etype]))
        df = frame.rename({"entity_id": join_key}).select(columns).to_pandas()
        with warnings.catch_warnings():  # ibis 12 calls duckdb's deprecated fetch_arrow_table
            warnings.filterwarnings("ignore", message=".*fetch_arrow_table", category=DeprecationWarning)
            # offline first: a failure there is undone from the backup before anything is online
            store.push(manifest["feast"]["push_sources"][etype], df, to=PushMode.OFFLINE)
            faults.point("refresh_push_online")
            store.push(manifest["feast"]["push_sources"][etype], df, to=PushMode.ONLINE)
    return files


def insert(frames: dict[str, pl.DataFrame], manifest: dict[str, Any], mcfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """Rows into each type's live collection (not a new version: the alias does not move), the
    near-twins nudged as at publish and checked against the validated vectors; returns, per
    type, the parquet of exactly what went to Milvus, its sha256 and the rows nudged."""
    client = milvus_store.connect(manifest["milvus"]["uri"])
    out: dict[str, Any] = {}
    try:
        for etype, frame in frames.items():
            coll = manifest["milvus"]["collections"][etype]
            data = milvus_store.table_data(frame.to_arrow(), "entity_id")
            payload = milvus_store.checked_payload(data, float(mcfg.tie_break), float(mcfg.tie_resolution),
                                                   float(mcfg.min_nudged_cosine), out_dir / f"{etype}.milvus.parquet",
                                                   f"refresh {etype} rows")
            # upsert: a refresh retried after a failed Feast push must not insert the ids twice
            milvus_store.insert(client, coll, data, etype, manifest["version"], int(mcfg.insert_batch), upsert=True)
            client.flush(coll)
            out[etype] = payload
    finally:
        milvus_store.disconnect(client, manifest["milvus"]["uri"])
    return out


def refresh_rows(cfg: DictConfig, frames: dict[str, pl.DataFrame], delta: str, state: dict[str, Any],
                 extra: dict[str, Any] | None = None, funnel: pl.DataFrame | None = None) -> dict[str, Any]:
    """Validate, push, insert and record contract-format rows of new entities (``entity_id``,
    ``embedding`` (dim,), ``tokens_l<k>``/``weights_l<k>``, ...) into the live version, and the
    recomputed open-funnel rows ``funnel`` of the delta's users (hir/publish/refresh_funnel.py)."""
    store_dir = Path(cfg.publish.store_dir).resolve()
    entry = state["versions"][state["live"]]
    manifest = entry["manifest"]
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
    out_dir = store_dir / "versions" / entry["slug"] / "refresh" / stamp
    journal = journal_path(store_dir, entry["slug"], stamp)
    t: dict[str, float] = {}
    try:
        has_funnel = funnel is not None and funnel.height > 0
        begin(store_dir, entry, stamp, frames, (extra or {}).get("events_file"), has_funnel)
        record = _refresh_rows(cfg, frames, delta, state, extra, out_dir, t, funnel if has_funnel else None)
    except BaseException as err:
        undone = undo(cfg, store_dir, journal)
        if space.is_out_of_space(err):
            raise space.OutOfSpace(f"the refresh of {manifest['version']!r} from {delta}", out_dir.parent,
                                   f"the live version {manifest['version']!r} serves what it served before; {undone}",
                                   SPACE_FIX) from err
        raise
    Path(journal).unlink(missing_ok=True)
    for backup in out_dir.glob("*.offline.bak"):
        backup.unlink()
    return record


def _refresh_rows(cfg: DictConfig, frames: dict[str, pl.DataFrame], delta: str, state: dict[str, Any],
                  extra: dict[str, Any] | None, out_dir: Path, t: dict[str, float],
                  funnel: pl.DataFrame | None = None) -> dict[str, Any]:
    """:func:`refresh_rows` once :func:`begin` has written its journal."""
    store_dir = Path(cfg.publish.store_dir).resolve()
    entry = state["versions"][state["live"]]
    manifest = entry["manifest"]
    with progress_steps("refresh", 3) as step:
        t0 = time.perf_counter()
        validate_rows(frames, manifest, store_dir, cfg.validate, out_dir)
        t["validate"] = time.perf_counter() - t0
        step("milvus insert")
        t0 = time.perf_counter()
        faults.point("refresh_milvus")
        milvus = insert(frames, manifest, cfg.publish.milvus, out_dir)
        t["milvus_insert"] = time.perf_counter() - t0
        step("feast push (online + offline)")
        t0 = time.perf_counter()
        faults.point("refresh_push_offline")
        files = push(frames, manifest, out_dir)
        t["feast_push"] = time.perf_counter() - t0
        funnel_record = None
        if funnel is not None:
            # last before the commit: the users' rows are replaced online, which no undo reverts
            t0 = time.perf_counter()
            funnel_record = push_funnel(funnel, manifest, out_dir)
            t["funnel_push"] = time.perf_counter() - t0
    offline = manifest["feast"].setdefault("offline_sha256", {})
    for etype in frames:
        offline[etype] = sha256(Path(manifest["feast"]["offline_files"][etype]))
    if funnel_record:
        offline["open_funnel"] = sha256(Path(funnel_record["offline_file"]))
    record = {"at": now_iso(), "delta_path": delta, "rows": {e: f.height for e, f in frames.items()},
              "files": files, "sha256": {e: sha256(Path(p)) for e, p in files.items()},
              "milvus": milvus, "offline_sha256": {e: offline[e] for e in frames},
              "valid_from": {e: f["event_timestamp"].min().isoformat() for e, f in frames.items() if f.height},
              "validation": str(out_dir / "validation" / "result.json"),
              "timings_s": {k: round(v, 3) for k, v in t.items()}, **(extra or {})}
    if funnel_record:
        record["funnel"] = funnel_record
    manifest.setdefault("refreshes", []).append(record)
    state["history"].append({"at": record["at"], "event": "refresh", "version": entry["version"],
                             "previous": None, "rows": record["rows"]})
    faults.point("refresh_commit")
    write_state(store_dir, state)
    sync_manifests(state)
    return record


def new_entities(delta: Delta, manifest: dict[str, Any], store_dir: Path) -> tuple[dict[str, pl.DataFrame], dict[str, int]]:
    """(the delta's entities the live version does not serve yet, per type; the count of those it
    serves already, which are skipped)."""
    new, known = {}, {}
    for etype, frame in delta.entities.items():
        served = served_keys(manifest, store_dir, etype)
        fresh = frame.filter(~pl.col("key").is_in(list(served)))
        if frame.height - fresh.height:
            known[etype] = frame.height - fresh.height
        if fresh.height:
            new[etype] = fresh
    return new, known


def run(cfg: DictConfig) -> dict[str, Any]:
    """Hydra entry: embed the new entities of ``refresh.delta_path`` and serve them in the live version."""
    store_dir = Path(cfg.publish.store_dir).resolve()
    path = delta_path(cfg)  # fail before touching the store
    with store_lock(store_dir, "refresh"):
        state = read_state(store_dir)
        if not state["live"]:
            raise HirError(f"nothing is published in {store_dir}; run `hir publish` before `hir refresh`")
        with space.guard("the removal of an earlier attempt's leftovers", store_dir,
                         "the live version serves what it served before; the leftovers stay until a run has room "
                         "to remove them", SPACE_FIX):
            recover(cfg, state)
            undo_leftovers(cfg, store_dir)
        manifest = state["versions"][state["live"]]["manifest"]
        source = model_source(cfg, manifest)
        snapshot = live_snapshot(source["graph_dir"])
        delta = read_delta(path, str(cfg.refresh.entity_type), list(manifest["feast"]["feature_views"]), snapshot)
        new, known = new_entities(delta, manifest, store_dir)
        if known:
            log.info("%s: %s already served by %r; skipped", path, known, manifest["version"])
        if not new:
            msg = f"{path}: no entity that the live version {manifest['version']!r} does not serve ({known} known)"
            log.info("%s", msg)
            return {"version": manifest["version"], "rows": {}, "skipped": known}
        frames = embed(cfg, source, snapshot, delta, new, manifest)
        funnel = funnel_rows(snapshot, manifest, delta.events, datetime.now(UTC), earlier_events(manifest))
        if not manifest["feast"].get("funnel"):
            log.info("the live version %r publishes no open funnel; only the new entities are refreshed",
                     manifest["version"])
        events = _write_events(delta, store_dir, state)
        record = refresh_rows(cfg, frames, str(path), state,
                              {"delta": describe(delta), "skipped_known": known, "events_file": events}, funnel)
    log.info("refreshed live version %r with %s new entities (Feast online + offline, Milvus) and the open funnel "
             "of %d user(s); skipped %s already served", manifest["version"], record["rows"],
             (record.get("funnel") or {}).get("users", 0), known or "none")
    return {"version": manifest["version"], "rows": record["rows"], "skipped": known,
            "funnel_users": (record.get("funnel") or {}).get("users", 0), "timings_s": record["timings_s"]}


def _write_events(delta: Delta, store_dir: Path, state: dict[str, Any]) -> str | None:
    """The delta's first events, kept beside the live version (input for the next training)."""
    if not delta.events.height:
        return None
    out = store_dir / "versions" / state["live"] / "refresh" / "events"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%f')}.parquet"
    write_parquet_atomic(delta.events, path)
    return str(path)


def _cutoff(manifest: dict[str, Any], etype: str) -> datetime | None:
    """The live export's ``event_timestamp`` for ``etype`` (the cutoff of the engagement it saw)."""
    recorded = (manifest.get("valid_from") or {}).get(etype)
    if recorded:
        return datetime.fromisoformat(recorded)
    path = manifest["feast"]["offline_files"][etype]
    return pl.read_parquet(path, columns=["event_timestamp"])["event_timestamp"].min()


def embed(cfg: DictConfig, source: dict[str, Path], snapshot: Snapshot, delta: Delta, new: dict[str, pl.DataFrame],
          manifest: dict[str, Any]) -> dict[str, pl.DataFrame]:
    """Contract-format rows (docs/contracts.md, embeddings/<type>.parquet) for the new entities:
    content vectors with the enrich stage's fitted encoders, then the live version's model through
    its knowledge view (content + metadata neighbours; no engagement, no retraining), placed by
    their content neighbours as the export placed its cold entities."""
    import numpy as np

    from hir.enrich.content import encode_new_entities
    from hir.export.cold import place_like_export
    from hir.export.content_tokens import array_text, blend
    from hir.export.embed import Embedder
    from hir.export.project import load_projection, token_vectors
    from hir.export.stage import TOKENIZER_FILE

    emb_meta_path = Path(manifest.get("source", {}).get("embeddings_dir", "")) / "meta.json"
    emb_meta = json.loads(emb_meta_path.read_text()) if emb_meta_path.exists() else {}
    visible = tuple(emb_meta.get("visible_splits") or cfg.export.visible_splits)
    embedder = Embedder(source["checkpoint"], snapshot, source["content_dir"], visible)
    if embedder.version != manifest["version"]:
        raise HirError(
            f"checkpoint {source['checkpoint']} is model {embedder.version!r} but the live version is "
            f"{manifest['version']!r}: new entities must be embedded by the model that is served. Set "
            "refresh.run_dir to the run that exported the live version"
        )
    # the tokens of the live version came from the tokenizer its export saved (export.hierarchy_fit)
    tokenizer_path = emb_meta_path.parent.parent / "hierarchy" / TOKENIZER_FILE
    if emb_meta_path.exists() and tokenizer_path.exists():
        embedder.load_tokenizer(tokenizer_path)
    # the served dimension of the live version: its export's projection (export.dim), None at full rank
    projection = load_projection(emb_meta_path.parent, emb_meta, embedder.version) if emb_meta else None
    # the export's token space: a tokenizer of the full rank reads the rank-K vectors (export.token_space)
    # the text's weight in the token space (export.token_content): the tokenizer is that much wider
    token_content = float(emb_meta.get("token_content", 0.0))
    text_dim = int(embedder.store.layout["text_dim"]) if token_content > 0 else 0
    full_space = projection is not None and embedder.tokenizer.dim - text_dim == projection.rank
    now = datetime.now(UTC).replace(microsecond=0)
    frames = {}
    store_dir = Path(cfg.publish.store_dir).resolve()
    for etype, frame in new.items():
        keys = frame["key"].to_list()
        content = encode_new_entities(frame.drop("first_seen", "_row"), etype, source["content_dir"])
        mat = {c: np.stack(content[c].to_numpy()) if content.height else None
               for c in ("text_vec", "attr_vec", "image_vec") if c in content.columns}
        links = [delta.links.get(etype, {}).get(k, []) for k in keys]
        z = embedder.embed_new(etype, mat["text_vec"], mat.get("attr_vec"), content["has_text"].to_numpy(),
                               links, mat.get("image_vec"), seed=int(cfg.seed))
        full = z
        if projection is not None:  # as the export projected before placing its cold entities
            z = projection.apply(z, np.full(len(z), etype == "user"))
        projected = z  # placement returns a new array and leaves this one as it is
        if emb_meta_path.exists():
            # as the export placed its own cold entities: by their content neighbours (hir.export.cold)
            z = place_like_export(emb_meta_path.parent, embedder.store, etype, z, mat["text_vec"],
                                  content["has_text"].to_numpy())
        z_tok = token_vectors(full, projected, z, projection) if full_space else z
        if text_dim:  # as the export blended its rows with their text (hir/export/content_tokens.py)
            z_tok = blend(z_tok, array_text(mat["text_vec"], content["has_text"].to_numpy(), text_dim), text_dim,
                          token_content)
        codes, weights = embedder.tokens(z_tok)
        n_served = len(served_keys(manifest, store_dir, etype))
        cutoff = _cutoff(manifest, etype)
        seen = first_seen(delta, etype)
        valid = [max(s, cutoff) if s is not None and cutoff is not None else (s or now) for s in (seen[k] for k in keys)]
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
            pl.Series("event_timestamp", valid).cast(pl.Datetime("us", "UTC")),
            pl.lit(now).cast(pl.Datetime("us", "UTC")).alias("created"),
        )
        log.info("embedded %d new %s entities through the knowledge view (%d with links)", len(keys), etype,
                 sum(1 for x in links if x))
    return frames
