"""`hir recommend` latency per user, through the path a user calls (hir/publish/recommend.py).

    python benchmarks/recommend.py --data completejourney --users 200
    python benchmarks/recommend.py --funnel outputs/online_retail/default/funnel --discovery base

With a published version (``--data``/``--store``), discovery goes through Feast (the user's
embedding, online store) and Milvus Lite (the ANN search), the open funnel and the scorer through
``funnel/``; one request per user, after one warm-up request. Writes the p50/p95/p99 and the
setting to ``benchmarks/results/recommend.json`` (a key per data/discovery).
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from hir.publish.recommend import open_recommender  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="completejourney")
    p.add_argument("--store", default=None)
    p.add_argument("--funnel", default=None)
    p.add_argument("--discovery", default="auto")
    p.add_argument("--users", type=int, default=200, help="requests (one user each)")
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "recommend.json"))
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    rec = open_recommender(args.data, args.store, args.funnel, args.discovery)
    t_open = time.perf_counter() - t0
    users = np.random.default_rng(args.seed).choice(rec.user_keys, size=min(args.users, len(rec.user_keys)), replace=False)
    rec.recommend_keys([str(users[0])], args.k)  # warm-up: first Milvus load, torch init
    times = []
    for u in users.tolist():
        t = time.perf_counter()
        rows = rec.recommend_keys([str(u)], args.k)
        times.append(time.perf_counter() - t)
        assert rows, f"no recommendation for user {u}"
    ms = 1000 * np.asarray(times)
    discovery = "milvus" if rec.recommender.discovery is not None else "view base"
    dataset = json.loads((rec.recommender.dir.parent / "graph" / "meta.json").read_text()).get("dataset", args.data)
    key = f"{dataset}/{discovery}"
    out_path = Path(args.out)
    result = json.loads(out_path.read_text()) if out_path.exists() else {}
    result[key] = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "machine": platform.platform(),
                   "cpus": os.cpu_count(), "requests": len(times), "k": args.k, "open_seconds": round(t_open, 2),
                   "p50_ms": round(float(np.median(ms)), 2), "p95_ms": round(float(np.quantile(ms, 0.95)), 2),
                   "p99_ms": round(float(np.quantile(ms, 0.99)), 2), "max_ms": round(float(ms.max()), 2),
                   "discovery": discovery, "funnel": os.path.relpath(rec.recommender.dir, ROOT), "target_p95_ms": 50}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1))
    print(json.dumps({key: result[key]}, indent=1))


if __name__ == "__main__":
    main()
