"""Benchmark `hir prepare`: synthetic data at 1M/10M/100M events, and completejourney.

    python benchmarks/prepare.py                      # 1M, 10M and 100M events (+ completejourney)
    python benchmarks/prepare.py --sizes 1M,10M       # chosen sizes
    python benchmarks/prepare.py --quick              # 1M only (what `make bench` runs)

Every run is a subprocess, so its peak RSS (the kernel's ru_maxrss, reported by wait4) and CPU
time are its own. Generation is measured separately and cached (data/synthetic.py keys the cache
by the generator's parameters), so a rerun only re-measures prepare. Each synthetic size is also
run through the core group-bys in pandas and in polars (benchmarks/_pandas_prepare.py) for a
speed ratio. A watchdog kills a run whose RSS passes --rss-limit-gib (the machine is shared) and
records that. Results: benchmarks/results/prepare.json (prepare_quick.json for --quick).

Targets (2 cores): >= 5M events/s end to end at 10M events; 100M events within 8 GiB peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
HIR = str(Path(PY).with_name("hir"))
GIB = 1 << 30
TARGET_EVENTS_PER_S = 5_000_000
TARGET_RSS_GIB = 8.0


def size_arg(text: str) -> int:
    """'1M' / '10m' / '250k' / '1000' -> int."""
    text = text.strip().lower()
    mult = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}.get(text[-1:], 1)
    return int(float(text[:-1] if text[-1:] in "kmg" else text) * mult)


def synthetic_params(n_events: int) -> dict[str, Any]:
    """Entity counts that grow with the events (50 events a user, 100 a product)."""
    n_products = max(n_events // 100, 1_000)
    return {
        "n_events": n_events,
        "n_users": max(n_events // 50, 500),
        "n_products": n_products,
        "n_advertisers": max(n_products // 30, 50),
        "n_campaigns": max(n_products // 10, 100),
        "n_coarse": 16,
        "n_fine": 8,
    }


def measure(cmd: list[str], log: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Run ``cmd`` (output to ``log``); wall and CPU seconds, peak RSS (ru_maxrss of the process
    tree it waited for), the load average around it, and the last lines of its output."""
    rss_limit, timeout = args.rss_limit_gib * GIB, args.timeout
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
        killed: list[str] = []
        done = threading.Event()

        def watchdog() -> None:
            # the kernel's peak is exact but only known at exit; poll to stop a runaway early.
            # psutil and os.kill never reap the child, so wait4 below always gets its rusage.
            try:
                ps = psutil.Process(proc.pid)
                while not done.wait(0.1):
                    rss = sum(p.memory_info().rss for p in [ps, *ps.children(recursive=True)])
                    if rss > rss_limit:
                        killed.append(f"rss {rss / GIB:.1f} GiB > limit {rss_limit / GIB:.1f} GiB")
                    elif time.perf_counter() - t0 > timeout:
                        killed.append(f"timeout {timeout:.0f}s")
                    if killed:
                        os.kill(proc.pid, signal.SIGKILL)
                        return
            except psutil.Error:  # exited (or a zombie) between two polls
                return

        thread = threading.Thread(target=watchdog, daemon=True)
        thread.start()
        _, status, usage = os.wait4(proc.pid, 0)
        done.set()
        proc.returncode = os.waitstatus_to_exitcode(status)
        thread.join()
    wall = time.perf_counter() - t0
    tail = log.read_text(errors="replace").splitlines()[-15:]
    return {
        "returncode": proc.returncode,
        "killed": killed[0] if killed else None,
        "wall_s": round(wall, 3),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        "peak_rss_gib": round(usage.ru_maxrss * 1024 / GIB, 3),
        "load_avg_before": round(load_before, 2),
        "load_avg_after": round(os.getloadavg()[0], 2),
        "output_tail": tail if proc.returncode else tail[-3:],
    }


def generate(params: dict[str, Any], cache: Path, args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from hir.data.synthetic import SyntheticSpec

    root = cache / SyntheticSpec(**params).cache_key()
    if (root / "manifest.json").exists() and not args.regenerate:
        manifest = json.loads((root / "manifest.json").read_text())
        return {"cached": True, "path": str(root), "seconds_when_generated": manifest["seconds"]}
    if args.regenerate and root.exists():
        import shutil

        shutil.rmtree(root)
    code = (
        "from hir.data.synthetic import SyntheticSpec, ensure; "
        f"ensure(SyntheticSpec(**{params!r}), {str(cache)!r})"
    )
    run = measure([PY, "-c", code], Path(args.workdir) / "generate.log", args)
    run.update(cached=False, path=str(root))
    if (root / "manifest.json").exists():
        manifest = json.loads((root / "manifest.json").read_text())
        run["seconds"] = manifest["seconds"]
        run["events_per_s"] = round(params["n_events"] / run["wall_s"])
        run["bytes"] = sum(p.stat().st_size for p in root.iterdir())
    return run


def prepare(overrides: list[str], run_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [HIR, "prepare", *overrides, f"hydra.run.dir={run_dir}", "force=true"]
    run = measure(cmd, run_dir.with_suffix(".log"), args)
    meta_path = run_dir / "graph" / "meta.json"
    if run["returncode"] == 0 and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        stage_s = sum(meta["timings_s"].values())
        run.update(
            events=meta["events"],
            input_rows=meta["input_rows"],
            engagement_edges=sum(n for k, n in meta["edges"].items() if "__engages__" in k),
            timings_s=meta["timings_s"],
            stage_s=round(stage_s, 3),
            events_per_s=round(meta["events"] / run["wall_s"]),
            events_per_s_stage_only=round(meta["events"] / stage_s) if stage_s else None,
            split_bounds=meta["split_bounds"],
        )
    return run


def compare_engines(events: Path, bounds: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for engine in ("polars", "pandas"):
        cmd = [PY, str(ROOT / "benchmarks" / "_pandas_prepare.py"), "--engine", engine, "--events", str(events),
               "--val-start", bounds["val_start"], "--test-start", bounds["test_start"]]
        run = measure(cmd, Path(args.workdir) / f"engine_{engine}.log", args)
        if run["returncode"] == 0:
            lines = [ln for ln in run.pop("output_tail") if ln.startswith("{")]
            run.update(json.loads(lines[-1]))
        out[engine] = run
    if all("seconds" in out[e] for e in ("polars", "pandas")):
        p, q = out["pandas"]["seconds"], out["polars"]["seconds"]
        out["pandas_over_polars"] = {k: round(p[k] / q[k], 2) if q[k] else None for k in p}
        out["same_edges"] = out["pandas"]["edges"] == out["polars"]["edges"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1M,10M,100M", help="comma-separated event counts (1M, 250k, ...)")
    ap.add_argument("--quick", action="store_true", help="1M events only, no completejourney")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/prepare[_quick].json)")
    ap.add_argument("--workdir", default=str(ROOT / ".cache" / "bench" / "prepare"), help="snapshots go here")
    ap.add_argument("--cache", default=str(ROOT / ".cache" / "synthetic"), help="generated data cache")
    ap.add_argument("--regenerate", action="store_true", help="re-measure generation (drop the cached data)")
    ap.add_argument("--pandas-max", default="10M", help="largest size run through the pandas comparison")
    ap.add_argument("--no-completejourney", action="store_true")
    ap.add_argument("--rss-limit-gib", type=float, default=12.0, help="kill a run past this RSS")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    ap.add_argument("--keep", action="store_true", help="keep the snapshots (they are large)")
    args = ap.parse_args()
    sizes = [1_000_000] if args.quick else [size_arg(s) for s in args.sizes.split(",") if s.strip()]
    out_path = Path(args.out or ROOT / "benchmarks" / "results" / f"prepare{'_quick' if args.quick else ''}.json")
    work, cache = Path(args.workdir), Path(args.cache)
    work.mkdir(parents=True, exist_ok=True)

    import numpy
    import pandas
    import polars

    result: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip(),
        "machine": {
            "cpus": os.cpu_count(), "ram_gib": round(psutil.virtual_memory().total / GIB, 1),
            "python": platform.python_version(), "polars": polars.__version__, "pandas": pandas.__version__,
            "numpy": numpy.__version__,
            "note": "wall times include contention from other processes; see load_avg_* and cpu_s",
        },
        "targets": {"events_per_s_at_10M": TARGET_EVENTS_PER_S, "peak_rss_gib_at_100M": TARGET_RSS_GIB},
        "runs": [],
    }

    def save() -> None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        # paths inside the checkout are written relative to it: results are committed and compared
        out_path.write_text(json.dumps(result, indent=2).replace(str(ROOT) + "/", "") + "\n")

    for n in sizes:
        params = synthetic_params(n)
        entry: dict[str, Any] = {"dataset": "synthetic", "n_events": n, "params": params}
        print(f"[bench] synthetic {n:,} events: generating", flush=True)
        entry["generation"] = gen = generate(params, cache, args)
        if not (Path(gen["path"]) / "manifest.json").exists():
            entry["error"] = "generation failed"
            result["runs"].append(entry)
            save()
            continue
        run_dir = work / f"synthetic_{n}"
        overrides = ["data=synthetic", f"data.adapter.cache_dir={cache}",
                     *(f"data.adapter.{k}={v}" for k, v in params.items())]
        print(f"[bench] synthetic {n:,} events: prepare", flush=True)
        entry["prepare"] = prep = prepare(overrides, run_dir, args)
        print(f"[bench]   {json.dumps({k: prep.get(k) for k in ('wall_s', 'cpu_s', 'peak_rss_gib', 'events_per_s', 'timings_s', 'killed')})}", flush=True)
        if "split_bounds" in prep and n <= size_arg(args.pandas_max):
            print(f"[bench] synthetic {n:,} events: pandas vs polars", flush=True)
            entry["engines"] = compare_engines(Path(gen["path"]) / "events.parquet", prep["split_bounds"], args)
            if "same_edges" in entry["engines"]:
                entry["engines"]["edges_match_snapshot"] = entry["engines"]["polars"]["edges"] == prep["engagement_edges"]
        elif n > size_arg(args.pandas_max):
            entry["engines"] = {"skipped": f"n_events > --pandas-max {args.pandas_max} (pandas holds every row in memory)"}
        if not args.keep:
            import shutil

            shutil.rmtree(run_dir, ignore_errors=True)
        result["runs"].append(entry)
        save()

    if not args.quick and not args.no_completejourney:
        entry = {"dataset": "completejourney"}
        if (ROOT / "conf" / "data" / "completejourney.yaml").exists():
            print("[bench] completejourney: prepare", flush=True)
            entry["prepare"] = prepare(["data=completejourney"], work / "completejourney", args)
        else:
            entry["skipped"] = "conf/data/completejourney.yaml does not exist"
        result["runs"].append(entry)

    by_n = {r["n_events"]: r.get("prepare", {}) for r in result["runs"] if r["dataset"] == "synthetic"}
    result["verdict"] = {
        "events_per_s_at_10M": by_n.get(10_000_000, {}).get("events_per_s"),
        "meets_events_per_s_at_10M": (by_n.get(10_000_000, {}).get("events_per_s") or 0) >= TARGET_EVENTS_PER_S
        if 10_000_000 in by_n else None,
        "peak_rss_gib_at_100M": by_n.get(100_000_000, {}).get("peak_rss_gib"),
        "meets_rss_at_100M": (by_n[100_000_000].get("returncode") == 0
                              and by_n[100_000_000]["peak_rss_gib"] <= TARGET_RSS_GIB) if 100_000_000 in by_n else None,
    }
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    save()
    print(f"[bench] wrote {out_path}\n{json.dumps(result['verdict'], indent=2)}")


if __name__ == "__main__":
    main()
