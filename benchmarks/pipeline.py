"""Time and memory of `make run`'s pipeline: every stage of `hir pipeline` on a fresh output dir.

    python benchmarks/pipeline.py                              # data=completejourney: `hir pipeline`, as `make run`
    python benchmarks/pipeline.py --data synthetic data.adapter.n_users=200 data.adapter.n_events=5000
    python benchmarks/pipeline.py --mode stages                # one `hir <stage>` process per stage (RSS each)

The default (``--mode pipeline``) runs the one `hir pipeline` process `make run` runs (one peak RSS
for all stages; its evaluation prewarm, ``eval.prewarm``, fits the snapshot-only baselines in a
low-priority process from the end of prepare, and ``prewarm`` records what it fitted and when it
ended). ``--mode stages`` runs each stage of ``pipeline.stages`` (conf/config.yaml) as its own
`hir <stage>` subprocess in one run dir (``hydra.run.dir``), in order, so each stage's peak RSS is
its own (``os.wait4``'s ``ru_maxrss`` of that child and the processes it waited for); there is no
prewarm then (each `hir evaluate` fits its baselines itself, as a lone `hir evaluate` does). The seconds of a
stage are the ones it logs itself (``stage X: done in Ys``, hir/stages.py); ``wall_s`` adds the
process start (imports, config) of the stage's own process.

Nothing is reused: the run dir (``--out-dir``, default a new temporary dir) must be empty, and the
caches (``paths.cache_dir``: enrich's content vectors, eval's cache) and the serving store
(``publish.store_dir``) live inside it, as on a fresh clone. The dataset's own serving store is
never touched.

Results: benchmarks/results/pipeline.json (one entry per dataset, the latest run) and the
``pipeline`` section of docs/results.md. Exit status 1 when a stage fails (its log tail is kept).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import contextlib

from _results_md import markers, write_section  # benchmarks/ (the script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "pipeline.json"
DOCS = ROOT / "docs" / "results.md"
SECTION = "pipeline"
# issue 33: `make run` on 2 cores within ten minutes
BUDGET_S = 600.0
# hir/stages.py's run_stage: "stage %s: done in %.1fs"
DONE = re.compile(r"stage (\w+): done in ([0-9.]+)s")
# evaluation/retrieval/background.py's Background.wait: "evaluate prewarm: A, B fitted ahead of evaluate (A 3s, B 9s) in Ns"
PREWARM = re.compile(r"evaluate prewarm: (.*) fitted ahead of evaluate \((.*)\) in ([0-9]+)s")


def prewarm_record(log: str) -> dict[str, Any] | None:
    """What the pipeline's evaluation prewarm fitted ({fit: seconds}) and its wall seconds, from
    the log of a `hir pipeline` run (None when it did not run)."""
    m = PREWARM.search(log)
    if m is None:
        return None
    fits = {}
    for part in m.group(2).split(", "):
        name, _, sec = part.rpartition(" ")
        if name:
            fits[name] = float(sec.rstrip("s"))
    return {"fits": fits, "wall_s": float(m.group(3))}


def stage_seconds(log: str) -> dict[str, float]:
    """The seconds each stage logged (``stage X: done in Ys``) in a `hir` log text; the last line
    of a stage wins."""
    return {m.group(1): float(m.group(2)) for m in DONE.finditer(log)}


def git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=5)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return (out.stdout.strip() + ("+dirty" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def pipeline_stages(overrides: list[str]) -> list[str]:
    """``pipeline.stages`` as `hir pipeline` composes it with ``overrides``."""
    from hydra import compose, initialize_config_dir

    from hir.stages import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[o for o in overrides if not o.startswith("hydra.")])
    return [str(s) for s in cfg.pipeline.stages]


def run_child(argv: list[str], log_path: Path, env: dict[str, str]) -> tuple[int, float, float]:
    """Run ``argv`` with stdout and stderr to ``log_path``; returns (exit status, wall seconds,
    peak RSS in MiB of the child and the processes it waited for, from ``os.wait4``)."""
    rc, wall, rss, _ = run_guarded(argv, log_path, env)
    return rc, wall, rss


def tree_rss_mib(pid: int) -> float:
    """RSS in MiB of process ``pid`` and all its descendants now (0 once it is gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error):  # exited between the listing and the read
            total += proc.memory_info().rss
    return total / 2**20


def run_guarded(argv: list[str], log_path: Path, env: dict[str, str], max_rss_mib: float | None = None,
                timeout_s: float | None = None, poll_s: float = 0.5) -> tuple[int, float, float, str | None]:
    """:func:`run_child` with two guards, for logs that may not fit this machine: the child's
    process group is killed (SIGKILL) once the RSS of its process tree passes ``max_rss_mib`` or
    its wall time passes ``timeout_s``, so a run that would take the machine's memory stops
    where it stands, and that is recorded.

    Returns (exit status, wall seconds, peak RSS in MiB from ``os.wait4``, why it was stopped:
    None, or a sentence naming the guard, the time and the tree's RSS then).
    """
    import signal
    import threading

    t0 = time.perf_counter()
    stopped: list[str] = []
    with log_path.open("w") as fh:
        # its own session, so the kill reaches every process the stage started (Spark, prewarm)
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        done = threading.Event()

        def watch() -> None:
            while not done.wait(poll_s):
                now = time.perf_counter() - t0
                rss = tree_rss_mib(proc.pid) if max_rss_mib is not None else 0.0
                why = None
                if max_rss_mib is not None and rss > max_rss_mib:
                    why = f"stopped at {now:.0f} s: the process tree's RSS {rss / 1024:.2f} GiB passed the " \
                          f"{max_rss_mib / 1024:.1f} GiB guard"
                elif timeout_s is not None and now > timeout_s:
                    why = f"stopped at {now:.0f} s: past the {timeout_s:.0f} s time guard (tree RSS {rss / 1024:.2f} GiB)"
                if why:
                    stopped.append(why)
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    return

        watcher = None
        if max_rss_mib is not None or timeout_s is not None:
            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
        _, status, usage = os.wait4(proc.pid, 0)
        done.set()
        if watcher is not None:
            watcher.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
    # ru_maxrss is in KiB on Linux
    return proc.returncode, time.perf_counter() - t0, usage.ru_maxrss / 1024, (stopped[0] if stopped else None)


def measure(data: str, out_dir: Path, extra: list[str], mode: str, max_rss_mib: float | None = None,
            timeout_s: float | None = None) -> dict[str, Any]:
    """Run the pipeline on ``data`` in the empty ``out_dir``; returns the record pipeline.json keeps.

    ``max_rss_mib`` and ``timeout_s`` (``mode="stages"`` only): the guards of :func:`run_guarded`,
    the time one budget for all stages; a stage they stop ends the run, recorded in ``failed``."""
    if mode != "stages" and (max_rss_mib is not None or timeout_s is not None):
        raise ValueError("the RSS and time guards need mode='stages' (one process per stage)")
    hir = str(Path(sys.executable).with_name("hir"))
    fresh = [f"data={data}", f"hydra.run.dir={out_dir}", f"paths.cache_dir={out_dir}/.cache",
             f"publish.store_dir={out_dir}/store", *extra]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
           "TRANSFORMERS_OFFLINE": os.environ.get("TRANSFORMERS_OFFLINE", "1"), "TOKENIZERS_PARALLELISM": "false"}
    stages = pipeline_stages(fresh)
    git, started = git_sha(), datetime.now(UTC).isoformat(timespec="seconds")  # the code measured, before it runs
    logs = out_dir / "bench_logs"
    logs.mkdir()
    rows: list[dict[str, Any]] = []
    failed = None
    if mode == "pipeline":
        rc, wall, rss = run_child([hir, "pipeline", *fresh], logs / "pipeline.log", env)
        text = (logs / "pipeline.log").read_text(errors="replace")
        done = stage_seconds(text)
        rows = [{"stage": s, "seconds": done.get(s), "peak_rss_mib": None} for s in stages]
        summary = {"wall_s": round(wall, 1), "peak_rss_mib": round(rss, 1), "prewarm": prewarm_record(text)}
        if rc:
            failed = {"stage": next((s for s in stages if s not in done), None), "exit": rc, "log_tail": text[-3000:]}
    else:
        wall = 0.0
        for s in stages:
            left = None if timeout_s is None else max(timeout_s - wall, 1.0)
            rc, w, rss, stopped = run_guarded([hir, s, *fresh], logs / f"{s}.log", env, max_rss_mib, left)
            wall += w
            text = (logs / f"{s}.log").read_text(errors="replace")
            rows.append({"stage": s, "seconds": stage_seconds(text).get(s), "wall_s": round(w, 1),
                         "peak_rss_mib": round(rss, 1)})
            print(f"{s}: {rows[-1]}", flush=True)
            if rc:
                failed = {"stage": s, "exit": rc, "stopped": stopped, "log_tail": text[-3000:]}
                break
        summary = {"wall_s": round(wall, 1), "peak_rss_mib": max((r["peak_rss_mib"] for r in rows), default=None)}
    total = round(sum(r["seconds"] or 0.0 for r in rows), 1)
    return {
        "data": data, "overrides": extra, "mode": mode, "stages": rows, "total_s": total, **summary,
        "budget_s": BUDGET_S, "within_budget": failed is None and summary["wall_s"] <= BUDGET_S, "failed": failed,
        "out_dir": os.path.relpath(out_dir, ROOT), "git": git, "measured_at": started,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
    }


def section(results: dict[str, dict[str, Any]]) -> str:
    """docs/results.md's ``pipeline`` section: one table per dataset in pipeline.json."""
    begin, end = markers(SECTION)
    lines = [begin, "## `make run`: time and memory per stage", "",
             f"`python benchmarks/pipeline.py` runs `make run`'s pipeline on a fresh output dir (no cache, its own "
             f"serving store) and records each stage's seconds and peak RSS "
             f"(benchmarks/results/pipeline.json). The budget is {BUDGET_S:.0f} s for the whole run.", ""]
    for data, r in sorted(results.items()):
        extra = f" with `{' '.join(r['overrides'])}`" if r["overrides"] else ""
        verdict = ("FAILED at " + str(r["failed"]["stage"])) if r.get("failed") else (
            "within" if r["within_budget"] else "over")
        lines += [f"**{data}**{extra} (git {r['git']}, {r['measured_at']}, {r['machine']['cpus']} cores, mode "
                  f"{r['mode']}): {r['wall_s']:.1f} s in all, {verdict} the {r['budget_s']:.0f} s budget.", "",
                  "| stage | seconds | with process start (s) | peak RSS (MiB) |", "|---|---|---|---|"]
        for row in r["stages"]:
            def cell(v: Any, fmt: str = "{:.1f}") -> str:
                return "–" if v is None else fmt.format(v)
            lines.append(f"| {row['stage']} | {cell(row['seconds'])} | {cell(row.get('wall_s'))} | "
                         f"{cell(row['peak_rss_mib'], '{:.0f}')} |")
        lines.append(f"| **all** | {r['total_s']:.1f} | {r['wall_s']:.1f} | {cell(r['peak_rss_mib'], '{:.0f}')} |")
        lines.append("")
        if pre := r.get("prewarm"):
            lines += [f"The evaluation prewarm (`eval.prewarm`, a nice-19 process from the end of prepare) fitted "
                      f"{', '.join(f'{n} ({s:.0f} s)' for n, s in pre['fits'].items())} ahead of evaluate, "
                      f"{pre['wall_s']:.0f} s after prepare; evaluate reused them from its fit cache.", ""]
    lines.append(end)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="completejourney", help="the dataset (conf/data/<name>.yaml); default as `make run`")
    ap.add_argument("--out-dir", type=Path, default=None,
                    help="an empty or new run dir (default: a new temporary dir, removed after unless --keep)")
    ap.add_argument("--mode", choices=("stages", "pipeline"), default="pipeline",
                    help="stages: one `hir <stage>` process per stage (a peak RSS each); pipeline: one `hir pipeline`")
    ap.add_argument("--keep", action="store_true", help="keep the temporary run dir")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--docs", type=Path, default=DOCS, help="the results page whose `pipeline` section is rewritten")
    ap.add_argument("overrides", nargs="*", help="more hir overrides (key=value), e.g. to make a run small")
    args = ap.parse_args(argv)
    if args.out_dir is not None and args.out_dir.exists() and any(args.out_dir.iterdir()):
        ap.error(f"--out-dir {args.out_dir} is not empty: the benchmark never reuses outputs; give a new dir")
    out = args.out_dir.resolve() if args.out_dir else Path(tempfile.mkdtemp(prefix=f"hir-pipeline-{args.data}-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"run dir: {out}", flush=True)
    try:
        record = measure(args.data, out, list(args.overrides), args.mode)
    finally:
        if args.out_dir is None and not args.keep:
            shutil.rmtree(out, ignore_errors=True)
    results = json.loads(args.results.read_text()) if args.results.exists() else {}
    results[args.data] = record
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=2) + "\n")
    write_section(section(results), args.docs, SECTION)
    print(json.dumps({k: record[k] for k in ("stages", "total_s", "wall_s", "peak_rss_mib", "within_budget")}, indent=1))
    if record["failed"]:
        print(f"stage {record['failed']['stage']} failed (exit {record['failed']['exit']}):\n"
              f"{record['failed']['log_tail']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
