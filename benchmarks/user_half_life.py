"""Does a user-side recency half-life help the spectral base? (issue 32; off by default)

    python benchmarks/user_half_life.py --name online_retail \\
        --graph outputs/online_retail/default/graph --content outputs/online_retail/default/content
    python benchmarks/user_half_life.py --name or_temporal --graph DIR --content DIR --half-lives 30,120

On a prepared and enriched snapshot: the base is fitted and its filter chosen on val as `hir train`
does (conf/spectral/default.yaml, without half-life candidates); then every half-life H is scored
against H = 0 with that filter, on val (train visible) and on test (train + val visible, the basis
refit there as export refits it, positives the test period's deep-stage pairs new to the user,
train + val items masked). Per H: mean masked new-to-user recall@20, the paired relative
difference to H = 0 and its z (mean paired difference over its standard error, over users).
Appends a row per snapshot and seed to benchmarks/results/user_half_life.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import time
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import yaml

from hir.data.schema import ENTITY_TYPES
from hir.data.snapshot import load_snapshot
from hir.model.foldin import offsets_of
from hir.model.spectral import FilterScorer, SpectralConfig, fit_base, fit_spectral
from hir.model.store import GraphStore, load_graph
from hir.model.valset import ValSet, validation_set

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "user_half_life.json"


def test_positives(store: GraphStore, graph: Path) -> None:
    """Point ``store.val_pairs`` at the snapshot's test-period deep-stage pairs."""
    snap = load_snapshot(graph)
    offs = offsets_of(snap)
    rows = []
    for i, t in enumerate(ENTITY_TYPES):
        scan = snap.engagement(t)
        if scan is None:
            continue
        df = scan.filter((pl.col("split") == "test") & (pl.col("stage") == snap.deep_stage)).select(
            "src_id", "dst_id").collect()
        rows.append(np.stack([df["src_id"].to_numpy() + offs[0], df["dst_id"].to_numpy() + offs[i]], 1))
    store.val_pairs = np.concatenate(rows).astype(np.int64)


def paired(scorer: FilterScorer, rank: int, filt: Any, hls: list[float]) -> dict[str, Any]:
    """{H: [mean recall, relative paired difference to H = 0, z]} and the H = 0 mean."""
    ref = scorer.per_user(rank, filt)
    out: dict[str, Any] = {"users": len(ref), "none": round(float(np.nanmean(ref)), 5)}
    for h in hls:
        got = scorer.per_user(rank, replace(filt, user_half_life=h))
        d = got - ref
        se = float(d.std(ddof=1)) / np.sqrt(len(d))
        out[f"{h:g}"] = [round(float(np.nanmean(got)), 5), round(float(d.mean() / ref.mean()), 4),
                         round(float(d.mean()) / max(se, 1e-12), 2)]
    return out


def run(name: str, graph: Path, content: Path, seed: int, hls: list[float]) -> dict[str, Any]:
    t0 = time.perf_counter()
    cfg = yaml.safe_load((ROOT / "conf" / "spectral" / "default.yaml").read_text())
    cfg.pop("_target_")
    config = SpectralConfig(**(cfg | {"user_half_lives": []}))
    opts = yaml.safe_load((ROOT / "conf" / "datamodule" / "default.yaml").read_text())["graph"]  # `hir train`'s
    train = load_graph(graph, content, ("train",), **opts)
    val: ValSet = validation_set(train, None, seed, "masked_new")
    with tempfile.TemporaryDirectory() as tmp:
        basis, _ = fit_base(train, val, config, seed, Path(tmp) / "spectral.npz", False)
    row: dict[str, Any] = {"name": name, "seed": seed, "rank": basis.rank, "stage_base": basis.stage_base,
                           "filter": asdict(basis.filter)}
    row["val"] = paired(FilterScorer(train, basis, val, None, seed), basis.rank, basis.filter, hls)
    visible = load_graph(graph, content, ("train", "val"), **opts)
    test_positives(visible, graph)
    test = validation_set(visible, None, seed, "masked_new")
    refit = fit_spectral(visible, basis.rank, basis.stage_base, config.n_iter, seed, basis.filter)
    row["test"] = paired(FilterScorer(visible, refit, test, None, seed), refit.rank, refit.filter, hls)
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", required=True)
    ap.add_argument("--graph", type=Path, required=True)
    ap.add_argument("--content", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--half-lives", default="7,14,30,60,120,240")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    row = run(a.name, a.graph, a.content, a.seed, [float(x) for x in a.half_lives.split(",")])
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    row |= {"git": git, "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores"}
    doc = json.loads(a.out.read_text()) if a.out.exists() else {
        "what": "test and val masked new-to-user recall@20 of the spectral base under a user-side half-life H "
                "(days), against H = 0 with the filter chosen on val: [mean, paired relative difference, z]",
        "rows": []}
    doc["rows"] = [r for r in doc["rows"] if (r["name"], r["seed"]) != (a.name, a.seed)] + [row]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
