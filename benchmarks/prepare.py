"""Benchmark `hir prepare`: synthetic data at 1M/10M/100M events, and completejourney.

    python benchmarks/prepare.py                      # 1M, 10M and 100M events (+ completejourney)
    python benchmarks/prepare.py --sizes 1M,10M       # chosen sizes
    python benchmarks/prepare.py --quick              # 1M only (what `make bench` runs)
    python benchmarks/prepare.py --spark-sizes 1M     # which sizes also run prepare.engine=spark

Every run is a subprocess, so its peak RSS (the kernel's ru_maxrss, reported by wait4) and CPU
time are its own. Generation is measured separately and cached (data/synthetic.py keys the cache
by the generator's parameters), so a rerun only re-measures prepare. Each synthetic size is also
run through the core group-bys in pandas and in polars (benchmarks/_pandas_prepare.py) for a
speed ratio. The polars side of that is the bare group-by reference: `vs_bare_groupby` divides
prepare's end-to-end events/s by the bare group-bys' events/s measured in the same run, a figure
that does not depend on how busy the shared machine was. Sizes in --spark-sizes (and
completejourney) are also built with `prepare.engine=spark` (--spark-master, default local[2]),
and the Spark snapshot is compared with the Polars one (meta.json counts, every node and edge
table and events.parquet after sorting: `spark.equal_to_polars`). A watchdog kills a run whose
RSS passes --rss-limit-gib (the machine is shared) and records that. Results:
benchmarks/results/prepare.json (prepare_quick.json for --quick).

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
    # a forked child starts with this process's peak in its ru_maxrss (Linux keeps it across exec):
    # keep this process small (no big imports or tables here) and record what it was
    parent_rss = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
        killed: list[str] = []
        peak_tree = [0]
        done = threading.Event()

        def watchdog() -> None:
            # the kernel's peak is exact but only known at exit; poll to stop a runaway early.
            # psutil and os.kill never reap the child, so wait4 below always gets its rusage.
            try:
                ps = psutil.Process(proc.pid)
                while not done.wait(0.1):
                    rss = sum(p.memory_info().rss for p in [ps, *ps.children(recursive=True)])
                    peak_tree[0] = max(peak_tree[0], rss)
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
        # the whole process tree (a Spark run's JVM included), polled every 0.1 s
        "peak_tree_rss_gib": round(peak_tree[0] / GIB, 3),
        "parent_rss_gib_at_spawn": round(parent_rss / GIB, 3),
        "load_avg_before": round(load_before, 2),
        "load_avg_after": round(os.getloadavg()[0], 2),
        "output_tail": tail if proc.returncode else tail[-3:],
    }


def generate(params: dict[str, Any], cache: Path, args: argparse.Namespace) -> dict[str, Any]:
    # the cache key in a subprocess: importing polars here would grow this process (see measure)
    code = f"from hir.data.synthetic.spec import SyntheticSpec; print(SyntheticSpec(**{params!r}).cache_key())"
    key = subprocess.run([PY, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    root = cache / key
    if (root / "manifest.json").exists() and not args.regenerate:
        manifest = json.loads((root / "manifest.json").read_text())
        return {"cached": True, "path": str(root), "seconds_when_generated": manifest["seconds"]}
    if args.regenerate and root.exists():
        import shutil

        shutil.rmtree(root)
    code = (
        "from hir.data.synthetic.dataset import ensure; from hir.data.synthetic.spec import SyntheticSpec; "
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


def compare_engines(events: Path, bounds: dict[str, str], args: argparse.Namespace, pandas: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for engine in ("polars", "pandas") if pandas else ("polars",):
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


def spark_run(overrides: list[str], run_dir: Path, polars_graph: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``prepare.engine=spark`` on the same data, and how its snapshot compares with the Polars one.

    The comparison runs in a subprocess: a child inherits its parent's peak RSS across fork+exec
    (Linux ru_maxrss), so a large parent would inflate every later run's peak."""
    spark = [
        "prepare.engine=spark", f"prepare.spark.master='{args.spark_master}'",
        f"prepare.spark.shuffle_partitions={args.spark_partitions}",
        f"prepare.spark.conf={{spark.driver.memory: {args.spark_driver_memory}}}",
    ]
    run = prepare([*overrides, *spark], run_dir, args)
    run["master"] = args.spark_master
    if run["returncode"] == 0 and (polars_graph / "meta.json").exists():
        t0 = time.perf_counter()
        code = ("import json, sys; from hir.data.compare import snapshot_differences as d; "
                "print(json.dumps(d(sys.argv[1], sys.argv[2])))")
        out = subprocess.run([PY, "-c", code, str(polars_graph), str(run_dir / "graph")], cwd=ROOT,
                             capture_output=True, text=True)
        diffs = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else [out.stderr[-2000:]]
        run["equal_to_polars"] = {"equal": not diffs, "differences": diffs,
                                  "compared": "meta.json counts, nodes/*, edges/*, events.parquet (sorted)",
                                  "seconds": round(time.perf_counter() - t0, 1)}
    return run


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
    ap.add_argument("--spark-sizes", default="1M,10M", help="sizes also built with prepare.engine=spark ('' = none)")
    ap.add_argument("--spark-master", default="local[2]")
    ap.add_argument("--spark-partitions", type=int, default=8, help="spark.sql.shuffle.partitions")
    ap.add_argument("--spark-driver-memory", default="6g")
    ap.add_argument("--no-spark-completejourney", action="store_true")
    args = ap.parse_args()
    sizes = [1_000_000] if args.quick else [size_arg(s) for s in args.sizes.split(",") if s.strip()]
    spark_sizes = set() if args.quick else {size_arg(s) for s in args.spark_sizes.split(",") if s.strip()}
    out_path = Path(args.out or ROOT / "benchmarks" / "results" / f"prepare{'_quick' if args.quick else ''}.json")
    work, cache = Path(args.workdir), Path(args.cache)
    work.mkdir(parents=True, exist_ok=True)

    from importlib.metadata import version

    result: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip(),
        "machine": {
            "cpus": os.cpu_count(), "ram_gib": round(psutil.virtual_memory().total / GIB, 1),
            "python": platform.python_version(), "polars": version("polars"), "pandas": version("pandas"),
            "numpy": version("numpy"), "pyspark": version("pyspark"),
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
        if "split_bounds" in prep:
            print(f"[bench] synthetic {n:,} events: bare group-bys (polars{', pandas' if n <= size_arg(args.pandas_max) else ''})", flush=True)
            entry["engines"] = compare_engines(Path(gen["path"]) / "events.parquet", prep["split_bounds"], args,
                                               pandas=n <= size_arg(args.pandas_max))
            if "edges" in entry["engines"].get("polars", {}):
                entry["engines"]["edges_match_snapshot"] = entry["engines"]["polars"]["edges"] == prep["engagement_edges"]
            if n > size_arg(args.pandas_max):
                entry["engines"]["pandas"] = {"skipped": f"n_events > --pandas-max {args.pandas_max} (pandas holds every row in memory)"}
            bare = entry["engines"].get("polars", {}).get("seconds", {}).get("total")
            if bare and prep.get("events_per_s"):
                entry["vs_bare_groupby"] = {
                    "prepare_events_per_s": prep["events_per_s"],
                    "bare_groupby_events_per_s": round(n / bare),
                    "ratio": round(prep["events_per_s"] / (n / bare), 3),
                    "note": "prepare end to end (process wall, all outputs written) over the bare polars "
                            "read+ids+split+edge group-bys (in-process, nothing written), same run",
                }
        if n in spark_sizes and prep.get("returncode") == 0:
            print(f"[bench] synthetic {n:,} events: prepare.engine=spark ({args.spark_master})", flush=True)
            entry["spark"] = spark_run(overrides, work / f"synthetic_{n}_spark", run_dir / "graph", args)
            print(f"[bench]   {json.dumps({k: entry['spark'].get(k) for k in ('wall_s', 'peak_rss_gib', 'events_per_s', 'killed')})}", flush=True)
        if not args.keep:
            import shutil

            shutil.rmtree(run_dir, ignore_errors=True)
            shutil.rmtree(work / f"synthetic_{n}_spark", ignore_errors=True)
        result["runs"].append(entry)
        save()

    if not args.quick and not args.no_completejourney:
        entry = {"dataset": "completejourney"}
        if (ROOT / "conf" / "data" / "completejourney.yaml").exists():
            print("[bench] completejourney: prepare", flush=True)
            entry["prepare"] = prepare(["data=completejourney"], work / "completejourney", args)
            if not args.no_spark_completejourney and entry["prepare"].get("returncode") == 0:
                print(f"[bench] completejourney: prepare.engine=spark ({args.spark_master})", flush=True)
                entry["spark"] = spark_run(["data=completejourney"], work / "completejourney_spark",
                                           work / "completejourney" / "graph", args)
        else:
            entry["skipped"] = "conf/data/completejourney.yaml does not exist"
        result["runs"].append(entry)

    by_n = {r["n_events"]: r.get("prepare", {}) for r in result["runs"] if r["dataset"] == "synthetic"}
    ratio = {r["n_events"]: r.get("vs_bare_groupby", {}).get("ratio") for r in result["runs"] if r["dataset"] == "synthetic"}
    spark = {
        (str(r.get("n_events")) if r["dataset"] == "synthetic" else r["dataset"]): {
            k: r["spark"].get(k) for k in ("master", "wall_s", "peak_tree_rss_gib", "events_per_s")
        } | {"equal_to_polars": r["spark"].get("equal_to_polars", {}).get("equal")}
        for r in result["runs"] if "spark" in r
    }
    result["verdict"] = {
        "events_per_s_at_10M_over_bare_groupby": ratio.get(10_000_000),
        "spark": spark,
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
