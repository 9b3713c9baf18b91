"""Benchmark `hir evaluate` on a finished run: a first evaluation (an empty baseline-fit cache)
and a second one of the same snapshot (the cache filled by the first), each `force=true` in a
fresh `hir` process, as a user runs them.

    python benchmarks/evaluate.py --data completejourney --run-name default
    python benchmarks/evaluate.py --data completejourney --runs cold          # the first evaluation only
    python benchmarks/evaluate.py --data completejourney --pythonpath /tmp/old --label before --runs cold

``--pythonpath DIR`` puts DIR first on the child's PYTHONPATH (a ``hir_evaluation`` package there
replaces this checkout's: a before/after comparison on the same run and machine). Targets
(issue 27, completejourney, 2 cores): the first evaluation <= 240 s, the second <= 120 s, and
the NE-lift interval no wider than before (0.35 points).

Per run: wall seconds, metrics.json ``timings_s``, what the cache reused and stored, the LightGCN
fit (epochs, best epoch, seconds, how it stopped), every ranking arm's fit seconds, the NE lift
of ``hir`` with its interval and width, and the load average before and after (the machine is
shared: compare runs made under a similar load). JSON to ``--out``
(default benchmarks/results/evaluate_<data>.json; runs of other labels already there are kept).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"cold_s": 240.0, "warm_s": 120.0, "ne_lift_ci_width_points": 0.35}


def git_sha() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def one_run(name: str, data: str, run_name: str, cache_dir: Path, pythonpath: str | None) -> dict[str, Any]:
    """`hir evaluate force=true` in a fresh process; the figures of its metrics.json."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    hir = Path(sys.executable).with_name("hir")
    cmd = [str(hir), "evaluate", f"data={data}", f"run_name={run_name}", "force=true", f"eval.cache.dir={cache_dir}"]
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name}: `{' '.join(cmd)}` failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    metrics = json.loads((ROOT / "outputs" / data / run_name / "report" / "metrics.json").read_text())
    return {"run": name, "command": " ".join(cmd[1:]), "wall_s": round(wall, 1),
            "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
            **figures(metrics)}


def figures(metrics: dict[str, Any]) -> dict[str, Any]:
    """What a run's metrics.json says about its time and its headline figures."""
    ranking, retrieval = metrics["ranking"], metrics["retrieval"]
    lift = ranking.get("ne_lift") or {}
    lo, hi = lift.get("ci") or [None, None]
    lgcn = (retrieval.get("fits") or {}).get("lightgcn") or {}
    return {
        "timings_s": {k: round(v, 1) for k, v in (metrics.get("timings_s") or {}).items()},
        "cache": {k: v for k, v in (metrics.get("cache") or {}).items() if k != "dir"},
        "ranking_fit_s": {a: round(((ranking.get(a) or {}).get("fit") or {}).get("seconds", 0.0), 1)
                          for a in ranking.get("arms", [])},
        "retrieval_s": {a: round(s, 1) for a, s in (retrieval.get("seconds") or {}).items()},
        "lightgcn": {k: lgcn.get(k) for k in ("epochs", "best_epoch", "seconds", "stopped_by", "best_val_recall@20",
                                              "reused_from_cache", "fitted_in_parallel")},
        "ne_lift_hir": {"value": lift.get("value"), "ci": [lo, hi],
                        "width_points": round(100 * (hi - lo), 3) if lo is not None and hi is not None else None},
        "masked_recall@20": {a: (retrieval.get("masked_new_to_user", {}).get(a) or {}).get("recall@20")
                             for a in (retrieval.get("arms") or {})},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="completejourney")
    ap.add_argument("--run-name", default="default", help="the finished run: outputs/<data>/<run-name>")
    ap.add_argument("--runs", default="cold,warm", help="cold (empty cache), warm (the cache cold filled), or both")
    ap.add_argument("--pythonpath", default=None, help="a directory put first on the child's PYTHONPATH")
    ap.add_argument("--label", default="after", help="the name of this set of runs in the JSON")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    out = args.out or ROOT / "benchmarks" / "results" / f"evaluate_{args.data}.json"
    runs = []
    with tempfile.TemporaryDirectory(prefix="hir-eval-cache-") as tmp:
        for name in args.runs.split(","):
            runs.append(one_run(name, args.data, args.run_name, Path(tmp), args.pythonpath))
            print(json.dumps(runs[-1]), flush=True)
    result = json.loads(out.read_text()) if out.exists() else {"targets": TARGETS, "labels": {}}
    result["labels"][args.label] = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"), "git": git_sha(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores", "pythonpath": args.pythonpath, "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
