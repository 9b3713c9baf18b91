"""Benchmark the published serving path: Milvus ANN recall/throughput and Feast online latency.

    python benchmarks/publish.py --store-dir outputs/serving/completejourney
    python benchmarks/publish.py --store-dir /tmp/s --type product --queries 1000 --ef 32,64,128,256,512

Reads the LIVE version of a store that `hir publish` wrote (``<store_dir>/live.json``) and reports:

- ``ann``: for each ``ef``, recall@10 of the HNSW index (through the type's alias) against exact
  cosine search (numpy) over the published vectors (tie-aware: an entity scoring as high as the
  10th exact hit counts), and queries/s (batches of ``--batch``).
  Queries are user embeddings (the retrieval use: user -> entities) when users are published,
  else the entities' own vectors. Target: recall@10 >= 0.95; ``best_ef`` is the smallest ef
  that reaches it. Random vectors (a test export) are the hard case; trained embeddings cluster.
- ``feast``: materialize rows/s of that publish (from its manifest) and get_online_features
  latency for ``--entities`` entities of the type per call (p50/p99 over ``--reads`` calls).

JSON to ``--out`` (default benchmarks/results/publish_<dataset>.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_RECALL = 0.95


def _unit(m: np.ndarray) -> np.ndarray:
    return m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)


def ann(manifest: dict[str, Any], etype: str, n_queries: int, efs: list[int], k: int, batch: int,
        seed: int) -> dict[str, Any]:
    """Recall@k of Milvus against exact search, and queries/s, per ef."""
    from hir.publish import milvus_store

    key = manifest["feast"]["entities"][etype]["join_key"]
    parts = [milvus_store.read_table(Path(manifest["feast"]["offline_files"][etype]), key)]
    # rows added by `hir refresh` are in the collection too
    parts += [milvus_store.read_table(Path(r["files"][etype]), "entity_id")
              for r in manifest.get("refreshes", []) if etype in r.get("files", {})]
    base = _unit(np.concatenate([p["vectors"] for p in parts]).astype(np.float32))
    ids = np.asarray([i for p in parts for i in p["ids"]], dtype=object)
    rng = np.random.default_rng(seed)
    if "user" in manifest["feast"]["offline_files"] and etype != "user":
        users = milvus_store.read_table(Path(manifest["feast"]["offline_files"]["user"]), "user_id")["vectors"]
        queries, source = users[rng.choice(len(users), min(n_queries, len(users)), replace=False)], "user embeddings"
    else:
        queries, source = base[rng.choice(len(base), min(n_queries, len(base)), replace=False)], f"{etype} vectors"
    queries = _unit(queries.astype(np.float32))
    t0 = time.perf_counter()
    scores = queries @ base.T  # (nq, n) cosine
    kth = -np.partition(-scores, k - 1, axis=1)[:, k - 1]  # (nq,) the k-th best exact score
    t_exact = time.perf_counter() - t0
    row_of = {key: i for i, key in enumerate(ids)}

    client = milvus_store.connect(manifest["milvus"]["uri"])
    alias = manifest["milvus"]["aliases"][etype]
    milvus_store.ensure_loaded(client, alias)
    rows = []
    try:
        for ef in efs:
            found: list[set] = []
            t0 = time.perf_counter()
            for s in range(0, len(queries), batch):
                res = client.search(alias, data=queries[s:s + batch].tolist(), limit=k,
                                    search_params={"params": {"ef": max(ef, k)}}, output_fields=["id"])
                found += [{h["id"] for h in r} for r in res]
            dt = time.perf_counter() - t0
            # tie-aware: a hit is any entity scoring at least the k-th best exact score (twins with
            # identical vectors are interchangeable, whichever of them the index returns)
            recall = float(np.mean([sum(scores[q, row_of[i]] >= kth[q] - 1e-6 for i in f) / k
                                    for q, f in enumerate(found)]))
            rows.append({"ef": ef, f"recall@{k}": round(recall, 4), "qps": round(len(queries) / dt, 1)})
            print(f"  {etype} ef={ef:4d}: recall@{k}={recall:.4f}  {len(queries) / dt:8.1f} q/s", flush=True)
    finally:
        milvus_store.disconnect(client, manifest["milvus"]["uri"])
    best = next((r["ef"] for r in rows if r[f"recall@{k}"] >= TARGET_RECALL), None)
    return {"entity_type": etype, "entities": len(ids), "dim": int(base.shape[1]), "queries": len(queries),
            "query_source": source, "k": k, "index": manifest["milvus"]["index"], "rows": rows,
            "target_recall": TARGET_RECALL, "best_ef": best, "exact_numpy_qps": round(len(queries) / t_exact, 1)}


def online_latency(manifest: dict[str, Any], etype: str, n_entities: int, reads: int, seed: int) -> dict[str, Any]:
    """get_online_features for ``n_entities`` entities per call (embedding + every token level)."""
    import polars as pl
    from feast import FeatureStore

    store = FeatureStore(repo_path=manifest["feast"]["repo_path"])
    key = manifest["feast"]["entities"][etype]["join_key"]
    view = manifest["feast"]["feature_views"][etype]
    levels = manifest["feast"]["levels"]
    features = [f"{view}:embedding", *[f"{view}:{c}_l{k}" for k in range(levels) for c in ("tokens", "weights")]]
    ids = pl.read_parquet(manifest["feast"]["offline_files"][etype], columns=[key])[key].to_numpy()
    rng = np.random.default_rng(seed)
    store.get_online_features(features=features, entity_rows=[{key: ids[0]}])  # warm-up (registry, connections)
    times = []
    for _ in range(reads):
        rows = [{key: i} for i in rng.choice(ids, min(n_entities, len(ids)), replace=False)]
        t0 = time.perf_counter()
        out = store.get_online_features(features=features, entity_rows=rows).to_dict()
        times.append(time.perf_counter() - t0)
        assert all(v is not None for v in out["embedding"]), "a published entity has no online embedding"
    ms = np.asarray(times) * 1000
    return {"entity_type": etype, "entities_per_call": len(rows), "features": len(features), "calls": reads,
            "p50_ms": round(float(np.percentile(ms, 50)), 2), "p99_ms": round(float(np.percentile(ms, 99)), 2),
            "online_store": manifest["feast"]["online_store"]["type"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store-dir", required=True, help="publish.store_dir of a published dataset")
    p.add_argument("--type", default="product", help="entity type to search / read")
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--ef", default="16,32,64,128,256,512", help="comma-separated HNSW ef values")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--batch", type=int, default=100, help="queries per Milvus search call")
    p.add_argument("--entities", type=int, default=100, help="entities per get_online_features call")
    p.add_argument("--reads", type=int, default=200, help="get_online_features calls")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    p.add_argument("--note", default=None, help="recorded in the JSON, e.g. where the embeddings came from")
    args = p.parse_args()

    from hir.serving import live_manifest

    manifest = live_manifest(Path(args.store_dir))
    print(f"version {manifest['version']!r} in {args.store_dir}", flush=True)
    result = {
        "store_dir": str(Path(args.store_dir).resolve()),
        "dataset": manifest.get("dataset"),
        "version": manifest["version"],
        "note": args.note,
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": __import__("os").cpu_count()},
        "ann": ann(manifest, args.type, args.queries, [int(e) for e in args.ef.split(",")], args.k, args.batch,
                   args.seed),
        "feast": {
            "materialize_rows": sum(manifest["rows"].values()),
            "materialize_s": manifest["timings_s"].get("feast_materialize"),
            "materialize_rows_per_s": manifest["feast"].get("materialize_rows_per_s"),
            "online": online_latency(manifest, args.type, args.entities, args.reads, args.seed),
        },
        "publish_timings_s": manifest["timings_s"],
    }
    print(f"  feast materialize {result['feast']['materialize_rows_per_s']} rows/s; online "
          f"{args.entities} entities p50 {result['feast']['online']['p50_ms']} ms, "
          f"p99 {result['feast']['online']['p99_ms']} ms", flush=True)
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"publish_{manifest.get('dataset') or 'store'}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    # paths inside the checkout are written relative to it: results are committed and compared
    out.write_text(json.dumps(result, indent=2).replace(str(ROOT) + "/", ""))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
