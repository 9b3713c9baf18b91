"""`hir recommend` latency per user, through the path a user calls (hir/publish/recommend.py).

    python benchmarks/recommend.py --data completejourney --users 200                    # --discovery auto
    python benchmarks/recommend.py --store STORE --discovery milvus
    python benchmarks/recommend.py --funnel outputs/online_retail/default/funnel --discovery base

With a published version (``--data``/``--store``), discovery reads the user's embedding from Feast
(online store) and searches it in process over the version's Milvus rows (``exact``, the default on
a Milvus Lite store; hir/publish/exact.py) or in Milvus (``milvus``); the open funnel and the
scorer go through ``funnel/`` (the version's, or ``--funnel`` of the same snapshot); one request
per user, after one warm-up request. Writes the p50/p95/p99 and the setting to
``benchmarks/results/recommend.json`` (a key per data/discovery).

Where the time goes (``components``, p50/p95 ms per request): ``feast`` (the user's embedding),
``exact`` or ``milvus`` (the search call) and within Milvus Lite's, ``lite_engine`` (the
in-process server's search) and ``lite_index`` (the index's own search, faiss or numpy); ``other``
is the rest of the request (open funnel, scorer, rows). ``exact`` (Milvus rows): the share of the
discovery lists Milvus returned equal to exact search (numpy over the vectors Milvus holds, the
user's history removed), ids in order. ``milvus`` (exact rows): the share of the discovery lists
and of the scored lists equal to those the same recommender serves with Milvus discovery.

``--threads`` (default 1): the threads of torch's and BLAS's thread pools (torch.set_num_threads,
threadpoolctl), as a latency-serving process sets them. A request's arrays are small (hundreds of
candidates, one query vector), yet large enough for torch and BLAS to split some ops across
threads, and on a machine whose cores are shared each split waits for a thread another process
may hold (docs/serving.md measures both).
A row with other than 1 thread is keyed ``<data>/<discovery>/threads=<n>``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from _results_md import shown  # noqa: E402  (benchmarks/)

from hir.publish.exact import ExactSearch  # noqa: E402
from hir.publish.recommend import open_recommender  # noqa: E402


class Clock:
    """Seconds spent in wrapped calls, per name, since ``spent`` was cleared (outermost call only)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def wrap(self, owner: Any, attr: str, name: str) -> None:
        fn = getattr(owner, attr)

        def timed(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - t
        setattr(owner, attr, timed)

    def wrap_lite(self) -> None:
        """Milvus Lite's server-side search and its indexes' own search (the server runs in this
        process, in a thread of its own, so the clock sees it)."""
        from milvus_lite.engine.collection import Collection
        from milvus_lite.index.brute_force import BruteForceIndex
        from milvus_lite.index.faiss_hnsw import FaissHnswIndex
        from milvus_lite.index.faiss_ivf_flat import FaissIvfFlatIndex

        self.wrap(Collection, "search", "lite_engine")
        for cls in (BruteForceIndex, FaissHnswIndex, FaissIvfFlatIndex):
            self.wrap(cls, "search", "lite_index")


def milvus_facts(rec: Any, users: list[str], k: int) -> dict[str, Any]:
    """The index Milvus holds for the discovery collection, and the share of ``users``' discovery
    lists equal to exact search over the vectors Milvus holds (the publish's payload file,
    ``manifest.milvus.payload``), the user's history removed as discovery removes it."""
    import pyarrow.parquet as pq

    disc = rec.recommender.discovery
    r = disc.retriever
    coll = r.manifest["milvus"]["collections"][disc.entity_type]
    index = {key: v for key, v in r.client.describe_index(coll, "embedding").items()
             if key in ("index_type", "metric_type", "params", "total_rows")}
    payload = pq.read_table(r.manifest["milvus"]["payload"][disc.entity_type]["file"])
    ids = np.asarray(payload["id"].to_pylist(), dtype=object)
    vecs = np.asarray(payload["embedding"].to_pylist(), np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)  # COSINE
    same, overlap = 0, []
    user_index = {key: i for i, key in enumerate(disc.user_keys)}
    for u in users:
        q = r.embeddings("user", [u])[0]
        q = q / np.linalg.norm(q)
        h = disc.history
        row = user_index[u]
        seen = {disc.entity_keys[e] for e in h.indices[h.indptr[row]:h.indptr[row + 1]]}
        order = [i for i in np.argsort(-(vecs @ q), kind="stable")[: k + len(seen)] if ids[i] not in seen][:k]
        got = [e for e, _ in r.search(q[None], disc.entity_type, k, exclude=[sorted(seen)])[0]]
        same += got == ids[order].tolist()
        overlap.append(len(set(got) & set(ids[order].tolist())) / max(1, len(order)))
    return {"index": index, "exact": {"users": len(users), "same_list": round(same / max(1, len(users)), 4),
                                      "recall_at_k": round(float(np.mean(overlap)), 4) if overlap else None}}


def exact_facts(rec: Any, args: argparse.Namespace, users: list[str], k: int) -> dict[str, Any]:
    """What the in-process search holds, and the share of ``users``' discovery lists (ids in
    order) and scored lists (entity and source per rank) equal to those served with Milvus
    discovery; ``max_score_diff``: the largest gap between the two's scores of a rank."""
    rows = rec.recommender.discovery.retriever.rows[rec.recommender.discovery.entity_type]
    via_milvus = open_recommender(args.data, args.store, args.funnel, "milvus")
    same_list, same_scored, overlap, gap = 0, 0, [], 0.0
    try:
        for u in users:
            got, disc = rec.recommend_both([u], k)
            want, disc_m = via_milvus.recommend_both([u], k)
            same_list += disc[u] == disc_m[u]
            overlap.append(len(set(disc[u]) & set(disc_m[u])) / max(1, len(disc_m[u])))
            same_scored += [(r["entity"], r["source"]) for r in got] == [(r["entity"], r["source"]) for r in want]
            gap = max([gap, *(abs(a["score"] - b["score"]) for a, b in zip(got, want, strict=False))])
    finally:
        via_milvus.recommender.discovery.retriever.close()
    return {"searched": {"rows": rows.shape[0], "dim": rows.shape[1], "files": len(rows.files)},
            "milvus": {"users": len(users), "same_list": round(same_list / max(1, len(users)), 4),
                       "recall_at_k": round(float(np.mean(overlap)), 4) if overlap else None,
                       "same_scored": round(same_scored / max(1, len(users)), 4), "max_score_diff": round(gap, 6)}}



def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="completejourney")
    p.add_argument("--store", default=None)
    p.add_argument("--funnel", default=None)
    p.add_argument("--discovery", default="auto")
    p.add_argument("--users", type=int, default=200, help="requests (one user each)")
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exact-users", type=int, default=50,
                   help="users whose discovery list is checked: Milvus's against exact search, exact's against Milvus")
    p.add_argument("--threads", type=int, default=1, help="torch and BLAS threads (0: their defaults)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "recommend.json"))
    args = p.parse_args(argv)
    import torch
    from threadpoolctl import threadpool_limits

    if args.threads > 0:
        torch.set_num_threads(args.threads)
        threadpool_limits(args.threads)  # BLAS (numpy's), for the rest of the process
    t0 = time.perf_counter()
    rec = open_recommender(args.data, args.store, args.funnel, args.discovery)
    t_open = time.perf_counter() - t0
    users = np.random.default_rng(args.seed).choice(rec.user_keys, size=min(args.users, len(rec.user_keys)), replace=False)
    rec.recommend_keys([str(users[0])], args.k)  # warm-up: first Milvus load / vectors read, torch init
    clock = Clock()
    search = rec.recommender.discovery
    discovery = "view base" if search is None else "exact" if isinstance(search.retriever, ExactSearch) else "milvus"
    if search is not None:
        clock.wrap(search.retriever, "embeddings", "feast")
        clock.wrap(search.retriever, "search", discovery)
        if discovery == "milvus":
            clock.wrap_lite()
    times, parts = [], []
    for u in users.tolist():
        clock.spent.clear()
        t = time.perf_counter()
        rows = rec.recommend_keys([str(u)], args.k)
        times.append(time.perf_counter() - t)
        parts.append(dict(clock.spent))
        assert rows, f"no recommendation for user {u}"
    ms = 1000 * np.asarray(times)
    components = {}
    for name in sorted({n for p in parts for n in p} | {"other"}):
        spent = 1000 * np.asarray([p.get(name, 0.0) if name != "other" else
                                   t - p.get("feast", 0.0) - p.get(discovery, 0.0) for p, t in zip(parts, times)])
        components[name] = {"p50_ms": round(float(np.median(spent)), 2), "p95_ms": round(float(np.quantile(spent, 0.95)), 2)}
    checked = [str(u) for u in users[: args.exact_users].tolist()]
    extra = milvus_facts(rec, checked, args.k) if discovery == "milvus" else \
        exact_facts(rec, args, checked, args.k) if discovery == "exact" else {}
    dataset = json.loads((rec.recommender.dir.parent / "graph" / "meta.json").read_text()).get("dataset", args.data)
    key = f"{dataset}/{discovery}" + (f"/threads={torch.get_num_threads()}" if torch.get_num_threads() != 1 else "")
    out_path = Path(args.out)
    result = json.loads(out_path.read_text()) if out_path.exists() else {}
    from hir.stages import git_sha

    result[key] = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "git": git_sha(), "machine": platform.platform(),
                   "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "requests": len(times), "k": args.k,
                   "open_seconds": round(t_open, 2),
                   "p50_ms": round(float(np.median(ms)), 2), "p95_ms": round(float(np.quantile(ms, 0.95)), 2),
                   "p99_ms": round(float(np.quantile(ms, 0.99)), 2), "max_ms": round(float(ms.max()), 2),
                   "discovery": discovery, "funnel": shown(Path(rec.recommender.dir)), "target_p95_ms": 50,
                   "components": components, **extra}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1))
    print(json.dumps({key: result[key]}, indent=1))


if __name__ == "__main__":
    main()
