"""Where should the base's filter search start? Test recall of the val choice under other starts.

    python benchmarks/filter_start.py --name online_retail --graph outputs/online_retail/learner/graph \\
        --content outputs/online_retail/learner/content --seeds 0,1,2 --variant b04:filter.beta=0.4

The val search (`hir train`, :func:`hir.model.spectral.fit_base`) only leaves its start when a
candidate beats it beyond the paired noise, so the start decides every close call. On a prepared
and enriched snapshot, per seed and variant (``default`` = conf/spectral/default.yaml; a variant
overrides ``filter.<field>`` of the start or a top-level field of the config), the base is fitted
and chosen on val exactly as `hir train` does; each distinct choice is then refit on train + val
(as export refits it) and scored on test: masked new-to-user recall@20 of the test period's
deep-stage pairs, train + val items masked (the protocol of benchmarks/user_half_life.py).

Per variant: its choices, test recall per seed, and its ratio to ``default`` over the seeds pooled
(benchmarks/funnel.py's paired bootstrap over users, every draw averaging the seeds).
Appends a row per snapshot to benchmarks/results/filter_start.json.
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
import yaml
from funnel import bootstrap_ratio
from user_half_life import test_positives  # benchmarks/ (the script's folder is on sys.path)

from hir.model.spectral import FilterScorer, SpectralConfig, fit_base, fit_spectral
from hir.model.store import load_graph
from hir.model.valset import validation_set

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "filter_start.json"


def default_config() -> SpectralConfig:
    cfg = yaml.safe_load((ROOT / "conf" / "spectral" / "default.yaml").read_text())
    cfg.pop("_target_")
    return SpectralConfig(**cfg)


def variant_config(base: SpectralConfig, spec: str) -> SpectralConfig:
    """``filter.beta=0.4,noise_z=1.0`` -> the config with those fields (YAML-parsed values)."""
    fields: dict[str, Any] = {}
    start: dict[str, Any] = {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        if key.startswith("filter."):
            start[key.removeprefix("filter.")] = yaml.safe_load(value)
        else:
            fields[key] = yaml.safe_load(value)
    out = replace(base, **fields)
    return replace(out, filter=asdict(replace(base.start, **start))) if start else out


def run_seed(graph: Path, content: Path, seed: int, configs: dict[str, SpectralConfig]) -> dict[str, Any]:
    """Every variant's val choice and its (U,) test recall per user at one seed."""
    opts = yaml.safe_load((ROOT / "conf" / "datamodule" / "default.yaml").read_text())["graph"]  # `hir train`'s
    train = load_graph(graph, content, ("train",), **opts)
    val = validation_set(train, None, seed, "masked_new")
    choices: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in configs.items():
            t0 = time.perf_counter()
            basis, _ = fit_base(train, val, config, seed, Path(tmp) / f"{name}.npz", False)
            choices[name] = {"rank": basis.rank, "stage_base": basis.stage_base, "filter": basis.filter,
                             "seconds": round(time.perf_counter() - t0, 1)}
    del train, val
    visible = load_graph(graph, content, ("train", "val"), **opts)
    test_positives(visible, graph)
    test = validation_set(visible, None, seed, "masked_new")
    per_user: dict[str, np.ndarray] = {}
    refits: dict[tuple[int, float], Any] = {}
    n_iter = next(iter(configs.values())).n_iter
    for name, c in choices.items():
        key = (c["rank"], c["stage_base"])
        if key not in refits:
            refits[key] = fit_spectral(visible, c["rank"], c["stage_base"], n_iter, seed, c["filter"])
        per_user[name] = FilterScorer(visible, refits[key], test, None, seed).per_user(c["rank"], c["filter"])
    return {"choices": {n: {**c, "filter": c["filter"].label(), "test_recall@20": round(float(np.nanmean(per_user[n])), 5)}
                        for n, c in choices.items()},
            "per_user": per_user}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", required=True)
    ap.add_argument("--graph", type=Path, required=True)
    ap.add_argument("--content", type=Path, required=True)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--variant", action="append", default=[], help="NAME:key=value,... (filter.<field> or a config field)")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    base = default_config()
    configs = {"default": base}
    for v in a.variant:
        name, _, spec = v.partition(":")
        configs[name] = variant_config(base, spec)
    t0 = time.perf_counter()
    seeds = [int(s) for s in a.seeds.split(",")]
    cells = {s: run_seed(a.graph, a.content, s, configs) for s in seeds}
    row: dict[str, Any] = {"name": a.name, "seeds": seeds, "variants": dict(zip(configs, ["", *a.variant], strict=True)),
                           "per_seed": {str(s): c["choices"] for s, c in cells.items()}}
    row["vs_default"] = {
        n: bootstrap_ratio(np.stack([cells[s]["per_user"][n] for s in seeds]),
                           np.stack([cells[s]["per_user"]["default"] for s in seeds]))
        for n in configs if n != "default"}
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    row |= {"seconds": round(time.perf_counter() - t0, 1), "git": git,
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores"}
    doc = json.loads(a.out.read_text()) if a.out.exists() else {
        "what": "test masked new-to-user recall@20 of the spectral base chosen on val from other search starts, "
                "against the default start (ratio of means, seeds pooled, 95% paired bootstrap over users)",
        "rows": []}
    doc["rows"] = [r for r in doc["rows"] if (r["name"], r["variants"]) != (a.name, row["variants"])] + [row]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: row[k] for k in ("name", "per_seed", "vs_default", "seconds")}, indent=1))


if __name__ == "__main__":
    main()
