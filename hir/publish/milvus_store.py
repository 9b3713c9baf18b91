"""Milvus side of a publish: one collection per entity type and version, an alias per type.

A collection ``<prefix>_<type>_<version>`` holds ``id`` (the entity key, primary), ``entity_type``,
``coarse_token`` (the entity's highest-weight level-0 token), ``version`` and ``embedding``
(FLOAT_VECTOR, COSINE; the index publish.milvus.index_type names, FLAT on Milvus Lite built as
an exact faiss scan: :func:`lite_index`). The alias ``<prefix>_<type>`` is moved to it only after
insert, flush, index build, load and a sanity search succeeded. ``uri`` is a Milvus Lite path
(a directory, created on first use) or a server URL (``http://host:19530``).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hir.errors import HirError
from hir.progress import track

log = logging.getLogger(__name__)


class _LiteNoise(logging.Filter):
    """Milvus Lite's in-process gRPC server lacks AllocTimestamp; the client falls back after
    create_index, but the server logs a traceback at ERROR each time. Drop exactly that record."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Method not implemented" not in record.getMessage()


class _Reraised(logging.Filter):
    """pymilvus logs every failed call at ERROR with a formatted traceback ("RPC error: [flush],
    ... Traceback: ...") and Milvus Lite's in-process server logs the same failure with its own
    (``logger.exception("Flush failed ...")``); then the client raises it. hir handles that
    exception: a full disk becomes the one line of hir/space.py, any other error is raised with
    its traceback. The two records only put tracebacks above hir's line (benchmarks/faults.py, a
    store filled to 90% of a publish's need), so they go to hir's log at DEBUG, first line only."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if record.levelno >= logging.ERROR and (record.exc_info or "\nTraceback:\n" in msg):
            log.debug("%s: %s", record.name, msg.split("\n", 1)[0])
            return False
        return True


# the loggers whose errors reach hir as the exception of the call that failed
RERAISED_LOGGERS = ("pymilvus.decorators", "milvus_lite.adapter.grpc.servicer")


def is_lite(uri: str) -> bool:
    return "://" not in uri


def connect(uri: str, token: str | None = None) -> Any:
    """A MilvusClient; a plain path starts Milvus Lite in-process on that directory.

    Milvus Lite lets one process at a time open a directory (it holds a lock until
    :func:`disconnect` or process exit); a second process gets a clear error here.
    """
    from pymilvus import MilvusClient
    from pymilvus.exceptions import ConnectionConfigException

    for name in RERAISED_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Reraised) for f in logger.filters):
            logger.addFilter(_Reraised())
    if is_lite(uri):
        Path(uri).parent.mkdir(parents=True, exist_ok=True)
        grpc_log = logging.getLogger("grpc._server")
        if not any(isinstance(f, _LiteNoise) for f in grpc_log.filters):
            grpc_log.addFilter(_LiteNoise())
        for name in ("milvus_lite", "faiss.loader"):  # start/stop and CPU-feature probing at INFO
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        return MilvusClient(uri=uri, token=token or "")
    except ConnectionConfigException as err:
        if not is_lite(uri):
            raise
        raise HirError(f"cannot open the Milvus Lite dir {uri}: another process has it open (Milvus Lite allows "
                       "one process per dir); wait for it to finish, or serve from a Milvus server with "
                       "publish.milvus.uri=http://host:19530") from err


def disconnect(client: Any, uri: str) -> None:
    """Close the client and, for Milvus Lite, stop this process's server for ``uri`` so other
    processes can open the dir. Clients of the same dir opened earlier in this process stop working."""
    client.close()
    release(uri)


def release(uri: str) -> None:
    """Stop this process's Milvus Lite server for ``uri``, releasing the dir's lock (a no-op for a
    server URL, or when none runs here). ``MilvusClient.close`` alone leaves the server running
    and the dir locked until the process exits: harmless in a short script, not in a long-lived
    process (a notebook, pytest) that another process must follow."""
    if is_lite(uri):
        from milvus_lite.server_manager import server_manager_instance

        server_manager_instance.release_server(uri)


def collection_name(prefix: str, etype: str, slug: str) -> str:
    return f"{prefix}_{etype}_{slug}"


def alias_name(prefix: str, etype: str) -> str:
    return f"{prefix}_{etype}"


def vectors(column: pa.ChunkedArray) -> np.ndarray:
    """A list<f32> column of equal-length (validated) rows as a (n, dim) float32 matrix."""
    arr = column.combine_chunks()
    dim = len(arr[0]) if len(arr) else 0
    return arr.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(arr), dim)


def table_data(table: pa.Table, id_column: str) -> dict[str, Any]:
    """ids, (n, dim) vectors and the coarse token (level-0 token of highest weight, -1 if none)."""
    ids = table[id_column].to_pylist()
    coarse = np.full(len(ids), -1, dtype=np.int64)
    if "tokens_l0" in table.column_names and len(ids):
        tok = table["tokens_l0"].combine_chunks()
        w = vectors(table["weights_l0"])
        starts = tok.offsets.to_numpy()[:-1]
        coarse = pc.list_flatten(tok).to_numpy()[starts + w.argmax(1)].astype(np.int64)
    return {"ids": ids, "vectors": vectors(table["embedding"]), "coarse": coarse}


def read_table(path: Path, join_key: str) -> dict[str, Any]:
    """:func:`table_data` of a serving parquet (ids in ``join_key``)."""
    return table_data(pq.read_table(path), join_key)


def break_ties(data: dict[str, Any], scale: float, seed: int = 0, resolution: float = 1e-4) -> int:
    """Nudge duplicate vectors (``data["vectors"]``, (n, dim)) apart before indexing; sets
    ``data["twin_group"]`` (n,) (rows with one group id had the same vector). Returns rows nudged.

    Twins are vectors that agree on every coordinate after rounding to ``resolution`` (0 = only
    exact duplicates): entities that close are interchangeable for retrieval anyway.

    Why: HNSW keeps one edge among points at distance 0, so a large group of identical vectors
    (e.g. cold-start entities without content, all embedded alike) captures the graph and leaves
    unrelated entities unreachable. Measured on a real rees46 export: 26% of users had an exact
    twin and 26% of the *other* users then never came back as their own nearest neighbour, at any
    ef; nudging the twins by 1e-3 (cosine to the original > 0.9999) made every one reachable. The
    order among twins is arbitrary either way. Near-twins do the same: on a completejourney
    product export (92,331 rows, 22,495 cold products embedded from content, many with the same
    text but a slightly different size or price), exact grouping nudged 1,672 rows and 500 self
    queries found themselves 95.6% of the time; grouping at resolution 1e-4 (84,867 groups)
    gave 99.6%.
    """
    vecs = data["vectors"]
    if len(vecs) == 0:
        data["twin_group"] = np.zeros(0, np.int64)
        return 0
    key = np.round(vecs / resolution).astype(np.int64) if resolution > 0 else vecs
    _, first, group = np.unique(key, axis=0, return_index=True, return_inverse=True)
    data["twin_group"] = group.reshape(-1)
    twin = np.ones(len(vecs), bool)
    twin[first] = False  # the first of each group stays as it is
    if scale <= 0 or not twin.any():
        return 0
    out = vecs.copy()
    noise = np.random.default_rng(seed).normal(scale=scale, size=(int(twin.sum()), vecs.shape[1]))
    if vecs.shape[1] > 1:
        # the nudge moves the semantic part (every coordinate but the last, a per-entity prior or
        # scale) by ``scale`` of its own length, so it stays small however much norm the last
        # coordinate takes; the last coordinate is left as it is
        noise[:, -1] = 0.0
        noise *= np.linalg.norm(out[twin, :-1], axis=1, keepdims=True).clip(1e-6)
    nudged = out[twin] + noise.astype(np.float32)
    out[twin] = nudged / np.linalg.norm(nudged, axis=1, keepdims=True)
    data["vectors"] = out
    return int(twin.sum())


def create_collection(client: Any, name: str, dim: int, max_id_len: int) -> None:
    from pymilvus import DataType, MilvusClient

    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=max(64, max_id_len))
    schema.add_field("entity_type", DataType.VARCHAR, max_length=32)
    schema.add_field("coarse_token", DataType.INT64)
    schema.add_field("version", DataType.VARCHAR, max_length=256)
    schema.add_field("embedding", DataType.FLOAT_VECTOR, dim=dim)
    client.create_collection(name, schema=schema)


def checked_payload(data: dict[str, Any], scale: float, resolution: float, min_cosine: float, path: Path,
                    source: str) -> dict[str, Any]:
    """Nudge near-twins apart (:func:`break_ties`, in place) and check that what goes to Milvus is
    still what was validated: every vector finite, unit norm, at cosine >= ``min_cosine`` to the
    validated one, and so its semantic part (every coordinate but the last). Writes exactly what is
    inserted (``id``, ``coarse_token``, ``twin_group``, ``embedding``) to ``path``; returns its
    ``file``, ``sha256``, ``rows``, ``nudged`` count and ``min_cosine_to_validated``.

    Raises:
        HirError: naming the ids whose vector the nudge moved too far (the fix: a smaller
            ``publish.milvus.tie_break``).
    """
    from hir.validate.binding import sha256

    validated = data["vectors"].copy()
    nudged = break_ties(data, scale, resolution=resolution)
    vecs = data["vectors"]
    norms = np.linalg.norm(vecs, axis=1) if len(vecs) else np.zeros(0)

    def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)

    cos = cosine(vecs, validated)
    # and on the semantic part (all but the last coordinate), which a large last one would hide
    sem = cosine(vecs[:, :-1], validated[:, :-1]) if vecs.ndim == 2 and vecs.shape[1] > 1 else cos
    moved = np.minimum(cos, np.where(np.linalg.norm(validated[:, :-1], axis=1) > 1e-6, sem, 1.0)) \
        if vecs.ndim == 2 and vecs.shape[1] > 1 else cos
    bad = ~np.isfinite(vecs).all(1) | (np.abs(norms - 1) > 1e-3) | (moved < min_cosine)
    if bad.any():
        ids = [data["ids"][i] for i in np.flatnonzero(bad)[:5]]
        raise HirError(f"{source}: {int(bad.sum())} vectors would reach Milvus changed from the validated ones "
                       f"(min cosine {float(moved.min()):.6f}, whole vector or its semantic part, < "
                       f"publish.milvus.min_nudged_cosine={min_cosine}, or not unit norm), e.g. ids {ids}; lower "
                       f"publish.milvus.tie_break ({scale})")
    table = pa.table({"id": pa.array(data["ids"], pa.string()), "coarse_token": pa.array(data["coarse"], pa.int64()),
                      "twin_group": pa.array(data["twin_group"], pa.int64()),
                      "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1), pa.float32()),
                                                                     vecs.shape[1] if vecs.ndim == 2 else 0)})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return {"file": str(path), "sha256": sha256(path), "rows": len(data["ids"]), "nudged": nudged,
            "min_cosine_to_validated": round(float(moved.min()), 6) if len(moved) else None}


def insert(client: Any, name: str, data: dict[str, Any], etype: str, version: str, batch: int,
           upsert: bool = False) -> None:
    """``data`` into collection ``name`` in batches (``upsert``: replace rows with the same id)."""
    ids, vecs, coarse = data["ids"], data["vectors"], data["coarse"]
    write = client.upsert if upsert else client.insert
    starts = range(0, len(ids), batch)
    for s in track(starts, f"milvus insert {etype}", total=len(starts)):
        e = min(len(ids), s + batch)
        rows = vecs[s:e].tolist()
        write(name, [
            {"id": ids[i], "entity_type": etype, "coarse_token": int(coarse[i]), "version": version,
             "embedding": rows[i - s]} for i in range(s, e)
        ])


# Milvus Lite's FLAT is a numpy brute force that, on every search, copies all rows and for COSINE
# normalises them again (92k x 257 floats per query on completejourney). One inverted list scanned
# whole is the same exact search, done in faiss over vectors normalised once at build.
LITE_EXACT = ("IVF_FLAT", {"nlist": 1})


def lite_index(index_type: str, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The index Milvus Lite builds for ``index_type``/``params``: FLAT becomes :data:`LITE_EXACT`
    (exact, one list scanned in full), every other type is built as asked."""
    if index_type.upper() in ("FLAT", "BRUTE_FORCE"):
        return LITE_EXACT[0], dict(LITE_EXACT[1])
    return index_type, dict(params)


def index_request(index_type: str, metric_type: str, params: dict[str, Any], lite: bool) -> dict[str, Any]:
    """The keyword arguments of ``IndexParams.add_index`` (field ``embedding``) for an index.

    The build parameters travel as one JSON ``params`` entry: pymilvus 3 spreads a flat
    ``params={"nlist": 1}`` into top-level key-value pairs, which Milvus Lite 3.2 never reads (it
    reads only ``index_type``, ``metric_type`` and ``params``), so every index was built with Lite's
    defaults (IVF nlist 128, whatever was configured). A Milvus server reads the ``params`` entry
    as well. ``lite``: FLAT is built as :func:`lite_index` says.
    """
    if lite:
        index_type, params = lite_index(index_type, params)
    return {"field_name": "embedding", "index_type": index_type, "metric_type": metric_type,
            "params": {"params": dict(params)} if params else {}}


def build_index(client: Any, name: str, index_type: str, metric_type: str, params: dict[str, Any],
                timeout_s: float = 1800.0, lite: bool = True) -> None:
    """Flush first: rows still in the memtable are only ever brute-forced (STACK.md section 6).
    Milvus Lite builds inline; a Milvus server builds in the background, so wait until every
    row is indexed. ``lite``: the client is Milvus Lite (:func:`index_request`).

    ``sync=False``: pymilvus's own wait sleeps 0.5 s *before* its first look at the index state,
    2.5 s of every publish of five entity types although Lite has finished by then; the loop
    below looks at once, then every 10 ms doubling to 0.5 s (what pymilvus polls a server at)."""
    client.flush(name)
    index = client.prepare_index_params()
    index.add_index(**index_request(index_type, metric_type, params, lite))
    client.create_index(name, index, sync=False)
    deadline = time.monotonic() + timeout_s
    pause = 0.01
    while True:
        info = client.describe_index(name, "embedding")
        if not info.get("pending_index_rows", 0) and str(info.get("state", "Finished")) == "Finished":
            return
        if str(info.get("state")) == "Failed" or time.monotonic() > deadline:
            raise HirError(f"milvus index build of {name} did not finish: {info}")
        time.sleep(pause)
        pause = min(2 * pause, 0.5)


def sanity_search(client: Any, name: str, data: dict[str, Any], n: int, search_params: dict[str, Any],
                  min_self_hit: float) -> dict[str, Any]:
    """Row count matches, and the entities' own vectors find themselves (top-1; an exact twin,
    see :func:`break_ties`, counts) at least ``min_self_hit`` of the time; raises otherwise, so
    the alias is never moved to a broken index."""
    rows = int(client.get_collection_stats(name)["row_count"])
    if rows != len(data["ids"]):
        raise HirError(f"milvus collection {name} has {rows} rows after insert, expected {len(data['ids'])}")
    if not rows:
        return {"rows": 0, "self_hit": None}
    group = dict(zip(data["ids"], data.get("twin_group", range(rows))))
    pick = np.unique(np.linspace(0, rows - 1, min(n, rows)).astype(int))
    res = client.search(name, data=data["vectors"][pick].tolist(), limit=1, search_params={"params": dict(search_params)},
                        output_fields=["id"])
    # a hit is the entity itself, an exact twin (break_ties' group), or a vector the metric cannot
    # tell from it (cosine within float32 rounding of 1: e.g. two advertisers whose only products
    # were bought by one same user, a hair apart but on either side of a tie_resolution step)
    hits = sum(1 for i, r in zip(pick, res)
               if r and (group.get(r[0]["id"]) == group[data["ids"][i]] or float(r[0].get("distance", 0.0)) >= 1 - 1e-6))
    rate = hits / len(pick)
    if rate < min_self_hit:
        raise HirError(f"sanity search on {name}: only {rate:.0%} of {len(pick)} entities find themselves as top-1 "
                       f"(need {min_self_hit:.0%}); the index is unusable, the alias was not moved")
    return {"rows": rows, "self_hit": round(rate, 4)}


def user_recall(client: Any, name: str, users: np.ndarray, data: dict[str, Any], n: int, k: int,
                search_params: dict[str, Any], min_recall: float, cfg: dict[str, Any]) -> dict[str, Any]:
    """Recall@k of the index against exact search for ``n`` users' vectors (evenly picked rows of
    ``users`` (U, d)) over the collection's payload ``data["vectors"]`` (I, d); raises below
    ``min_recall``, so the alias never moves to an index that cannot serve retrieval.

    Why not self-queries alone: HIR entities are ``[a s, sqrt(1 - a^2)]`` with a small scale
    ``a`` for most of them, so entities sit close together along the last coordinate and a graph
    index finds each entity itself yet misses users' nearest ones. Measured on online_retail
    (3,677 products, median a 0.08): HNSW M 16 agreed with exact top-20 on 0.50 of a user's
    hits at ef 128, 0.64 at 256, 0.80 at 512, 0.91 at 1024, while 96% of self-queries hit.
    """
    vecs = np.asarray(data["vectors"], np.float32)
    if len(users) == 0 or len(vecs) == 0:
        return {"user_recall@k": None}
    k = min(k, len(vecs))
    pick = np.unique(np.linspace(0, len(users) - 1, min(n, len(users))).astype(int))
    q = np.asarray(users[pick], np.float32)
    exact = np.argpartition(-(q @ vecs.T), k - 1, axis=1)[:, :k]
    ids = np.asarray(data["ids"], dtype=object)
    res = client.search(name, data=q.tolist(), limit=k, search_params={"params": dict(search_params)},
                        output_fields=["id"])
    got = [len({h["id"] for h in hits} & set(ids[row].tolist())) / k for hits, row in zip(res, exact)]
    recall = float(np.mean(got))
    if recall < min_recall:
        raise HirError(
            f"sanity search on {name}: the {cfg['index_type']} index returns only {recall:.0%} of the exact top-{k} "
            f"for {len(pick)} users' vectors (need {min_recall:.0%}, publish.sanity.min_user_recall); the alias was "
            f"not moved. Use publish.milvus.index_type=FLAT (exact; fine up to a few million rows) or raise the "
            f"search effort (publish.milvus.search_params.{cfg['index_type']}.*)")
    return {"user_recall@k": round(recall, 4), "recall_k": k, "user_queries": len(pick)}


def stage(client: Any, name: str, data: dict[str, Any], etype: str, version: str, cfg: dict[str, Any]) -> dict[str, float]:
    """Create (replacing a leftover of a crashed attempt), insert, flush, index, load; seconds per step."""
    from hir.publish import faults

    t: dict[str, float] = {}
    if client.has_collection(name):
        client.drop_collection(name)
    create_collection(client, name, data["vectors"].shape[1], max((len(i) for i in data["ids"]), default=1) * 4)
    t0 = time.perf_counter()
    insert(client, name, data, etype, version, int(cfg["insert_batch"]))
    t["insert"] = time.perf_counter() - t0
    faults.point("milvus_index")
    t0 = time.perf_counter()
    build_index(client, name, cfg["index_type"], cfg["metric_type"], cfg["index_params"],
                lite=is_lite(str(cfg.get("uri") or "")))
    t["index"] = time.perf_counter() - t0
    faults.point("milvus_load")
    t0 = time.perf_counter()
    client.load_collection(name)
    t["load"] = time.perf_counter() - t0
    return t


def alias_target(client: Any, alias: str) -> str | None:
    """The collection behind ``alias``, None when there is no such alias (asked via the list,
    because describe_alias on a missing alias logs a traceback at ERROR level)."""
    if alias not in client.list_aliases().get("aliases", []):
        return None
    return client.describe_alias(alias)["collection_name"]


def ensure_loaded(client: Any, name: str) -> None:
    """Load a collection (or an alias's collection) unless it is loaded: Milvus Lite starts every
    process with all collections released, so a reader must load before searching."""
    from pymilvus.client.types import LoadState

    if client.get_load_state(name)["state"] != LoadState.Loaded:
        client.load_collection(name)


def point_alias(client: Any, alias: str, collection: str) -> None:
    if alias_target(client, alias) is None:
        client.create_alias(collection, alias)
    else:
        client.alter_alias(collection, alias)


def drop(client: Any, collections: list[str]) -> list[str]:
    dropped = [c for c in collections if client.has_collection(c)]
    for c in dropped:
        client.drop_collection(c)
    return dropped
