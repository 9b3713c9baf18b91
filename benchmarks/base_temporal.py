"""Regression check of the spectral base on a temporal online_retail split (issue 32).

    python benchmarks/base_temporal.py                   # seeds 0 and 1
    python benchmarks/base_temporal.py --seeds 0 --reuse # re-read finished cells, run nothing

The split is `benchmarks/temporal_split.py`'s (train before 2011-10-01, test after), read by the
generic `events_csv` adapter with a test file, prepared and enriched once under
``outputs/events_csv/base_temporal``. Per seed one cell ``outputs/events_csv/base_temporal_s<seed>``
runs ``hir train``, ``hir export`` and ``hir evaluate eval.hir_source=files
eval.retrieval_arms=[hir]`` with the base alone (``model.net.transformer=false``) and reads the
test masked new-to-user recall@20 of the hir arm (train items masked), the spectral choice and
every candidate's val recall (``checkpoints/train_metrics.json``) and the wall seconds.

``--reference SEED=RECALL`` (repeatable): a level the seed must keep; the JSON records each seed's
ratio to it and ``ok`` (ratio >= 1 - ``--tolerance``), and the script exits 1 when one is below.
Writes benchmarks/results/base_temporal.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporal_split import DATA_ARGS, SOURCE, write_split  # benchmarks/ (the script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "base_temporal.json"
SPLIT_DIR = ROOT / "outputs" / "or_temporal"
RUN = "base_temporal"
CELL_FILE = "base_temporal_cell.json"  # a cell's stage seconds, kept for --reuse
EVALUATE = ["eval.hir_source=files", "eval.retrieval_arms=[hir]", "force=true", "eval.ranker_seeds=1",
            "eval.explain.pairs=0"]


def hir(*args: str) -> float:
    """Run one `hir` stage; returns its wall seconds (raises with the log tail on failure)."""
    t0 = time.perf_counter()
    env = os.environ | {"OMP_WAIT_POLICY": "PASSIVE"}
    res = subprocess.run([str(ROOT / ".venv" / "bin" / "hir"), *args], cwd=ROOT, env=env, capture_output=True,
                         text=True)
    if res.returncode:
        raise RuntimeError(f"hir {shlex.join(args)} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return time.perf_counter() - t0


def data_args(cut: str) -> list[str]:
    return ["data=events_csv", f"data.path={SPLIT_DIR / 'events.csv'}", f"data.test_path={SPLIT_DIR / 'test.csv'}",
            *DATA_ARGS]


def cell(seed: int, cut: str, reuse: bool) -> dict[str, Any]:
    """Train, export and evaluate one seed (unless ``reuse`` and its report exists); its figures."""
    snap = ROOT / "outputs" / "events_csv" / RUN
    run = ROOT / "outputs" / "events_csv" / f"{RUN}_s{seed}"
    common = [*data_args(cut), f"run_name={run.name}", f"seed={seed}", "model.net.transformer=false",
              f"paths.graph_dir={snap / 'graph'}", f"paths.content_dir={snap / 'content'}"]
    wall: dict[str, float] = {}
    if reuse and (run / CELL_FILE).exists():
        wall = json.loads((run / CELL_FILE).read_text())["wall_s"]
    if not (reuse and (run / "report" / "metrics.json").exists()):
        shutil.rmtree(run, ignore_errors=True)  # a left checkpoint would be resumed, its base reloaded
        for stage, extra in (("train", []), ("export", []), ("evaluate", EVALUATE)):
            wall[stage] = round(hir(stage, *common, *extra), 1)
            print(f"  seed {seed}: {stage} {wall[stage]:.0f}s", flush=True)
        (run / CELL_FILE).write_text(json.dumps({"wall_s": wall}) + "\n")
    metrics = json.loads((run / "report" / "metrics.json").read_text())
    train = json.loads((run / "checkpoints" / "train_metrics.json").read_text())
    masked = metrics["retrieval"]["masked_new_to_user"]
    spectral = train["spectral"]
    return {
        "seed": seed,
        "test_masked_new_recall@20": masked["hir"]["recall@20"],
        "test_users": metrics["retrieval"].get("users"),
        "spectral": {k: spectral.get(k) for k in ("rank", "stage_base", "filter", "seconds",
                                                  "val_recall@20_by_rank")},
        "candidates": len(spectral.get("candidates", [])),
        "wall_s": wall or None,
        "command": f"hir <train|export|evaluate> {shlex.join(common)} (evaluate: {' '.join(EVALUATE)})".replace(str(ROOT) + "/", ""),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--cut", default="2011-10-01")
    ap.add_argument("--source", type=Path, default=SOURCE)
    ap.add_argument("--reuse", action="store_true", help="re-read finished cells instead of running them")
    ap.add_argument("--reference", action="append", default=[], metavar="SEED=RECALL",
                    help="a seed's level to keep (e.g. the previous code's figure on this split)")
    ap.add_argument("--reference-from", default=None, help="where the --reference figures come from (recorded)")
    ap.add_argument("--tolerance", type=float, default=0.02)
    args = ap.parse_args()
    refs = {int(k): float(v) for k, v in (r.split("=") for r in args.reference)}
    split = write_split(args.source, args.cut, SPLIT_DIR)
    snap = ROOT / "outputs" / "events_csv" / RUN
    if not (snap / "content").exists():
        for stage in ("prepare", "enrich"):
            print(f"{stage}: {hir(stage, *data_args(args.cut), f'run_name={RUN}'):.0f}s", flush=True)
    cells = [cell(s, args.cut, args.reuse) for s in args.seeds]
    for c in cells:
        if c["seed"] in refs:
            c["reference"] = refs[c["seed"]]
            c["ratio"] = round(c["test_masked_new_recall@20"] / refs[c["seed"]], 4)
            c["ok"] = c["ratio"] >= 1 - args.tolerance
    git = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    out = {"what": "spectral base alone (model.net.transformer=false), temporal online_retail split via events_csv, "
                   "test masked new-to-user recall@20 of the hir arm (train items masked)",
           "git": git.stdout.strip() or None, "date": datetime.now(UTC).isoformat(timespec="seconds"),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores", "split": split, "tolerance": args.tolerance,
           "reference_from": args.reference_from,
           "seeds": cells}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    for c in cells:
        print(f"seed {c['seed']}: recall@20 {c['test_masked_new_recall@20']:.4f}, rank {c['spectral']['rank']}, "
              f"{c['spectral']['filter']}" + (f", ratio {c['ratio']}" if "ratio" in c else ""))
    print(OUT)
    if any(c.get("ok") is False for c in cells):
        sys.exit(1)


if __name__ == "__main__":
    main()
