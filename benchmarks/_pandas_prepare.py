"""The core group-bys of `hir prepare`, in pandas and in polars, on the same events file.

Run by benchmarks/prepare.py in a subprocess (one per engine, so each gets its own peak RSS):

    python benchmarks/_pandas_prepare.py --engine pandas --events E.parquet \
        --val-start 2024-03-14T00:00:00+00:00 --test-start 2024-03-23T00:00:00+00:00

The workload is what the snapshot builder does with every event, minus validation and I/O of
the outputs: read the events; dense ids (0..n-1 in key order) for users and, per entity type,
for entities; a temporal split label; and the engagement edges, one row per (user, entity type,
entity, stage, split) with count, first/last timestamp and summed value. The polars side calls
the builder's own steps (hir.data.steps). Prints one JSON line: seconds per step and the edge
count (both engines must agree on it).
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime

COLUMNS = ["user_id", "entity_type", "entity_id", "stage", "timestamp", "value"]


def run_pandas(path: str, val_start: datetime, test_start: datetime) -> dict:
    import numpy as np
    import pandas as pd

    t: dict[str, float] = {}
    t0 = time.perf_counter()
    df = pd.read_parquet(path, columns=COLUMNS)
    # low-cardinality text as categoricals: what a careful pandas user would do
    df["entity_type"] = df["entity_type"].astype("category")
    df["stage"] = df["stage"].astype("category")
    t["read"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    df["user_id"] = pd.factorize(df["user_id"], sort=True)[0]
    ids = np.empty(len(df), np.int64)
    for _, idx in df.groupby("entity_type", observed=True).indices.items():
        ids[idx] = pd.factorize(df["entity_id"].to_numpy()[idx], sort=True)[0]
    df["entity_id"] = ids
    t["ids"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    ts = df["timestamp"]
    df["split"] = pd.Categorical(
        np.select([ts >= test_start, ts >= val_start], ["test", "val"], "train"), categories=["train", "val", "test"]
    )
    t["split"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    edges = df.groupby(["user_id", "entity_type", "entity_id", "stage", "split"], observed=True, sort=False).agg(
        count=("timestamp", "size"), first_ts=("timestamp", "min"), last_ts=("timestamp", "max"),
        value=("value", "sum"),
    )
    t["edges"] = time.perf_counter() - t0
    return {"seconds": t, "edges": len(edges), "events": len(df)}


def run_polars(path: str, val_start: datetime, test_start: datetime) -> dict:
    import polars as pl

    from hir.data import steps

    t: dict[str, float] = {}
    t0 = time.perf_counter()
    df = pl.read_parquet(path, columns=COLUMNS).rename({"user_id": "user_key", "entity_id": "entity_key"})
    t["read"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    users = df.select(pl.col("user_key").unique().sort().alias("key")).with_row_index("node_id")
    entities = (
        df.select("entity_type", pl.col("entity_key").alias("key")).unique().sort("entity_type", "key")
        .with_columns(pl.int_range(pl.len()).over("entity_type").alias("node_id"))
    )
    df = steps.assign_ids(df.lazy(), users.lazy(), entities.lazy()).collect()
    t["ids"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    df = steps.label_split(df.lazy(), val_start, test_start).collect()
    t["split"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    edges = steps.aggregate_edges(df.lazy()).collect()
    t["edges"] = time.perf_counter() - t0
    return {"seconds": t, "edges": edges.height, "events": df.height}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=["pandas", "polars"], required=True)
    ap.add_argument("--events", required=True, help="generator events.parquet")
    ap.add_argument("--val-start", required=True, help="ISO timestamp (from the snapshot's meta.json)")
    ap.add_argument("--test-start", required=True, help="ISO timestamp")
    args = ap.parse_args()
    fn = run_pandas if args.engine == "pandas" else run_polars
    out = fn(args.events, datetime.fromisoformat(args.val_start), datetime.fromisoformat(args.test_start))
    out["seconds"] = {k: round(v, 3) for k, v in out["seconds"].items()}
    out["seconds"]["total"] = round(sum(out["seconds"].values()), 3)
    print(json.dumps({"engine": args.engine, **out}))


if __name__ == "__main__":
    main()
