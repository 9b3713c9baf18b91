"""Measure what training holds in memory per edge and per node: the GraphStore and a DDP rank.

    python benchmarks/graph_memory.py --run outputs/gowalla/smoke     # a run with graph/ + content/
    git archive <base> hir conf | tar -x -C /tmp/base                  # the code before a change
    python benchmarks/graph_memory.py --run outputs/gowalla/smoke --hir before=/tmp/base \
        --hir after=.venv/bin/hir

1. GraphStore (hir/model/store.py): ``load_graph`` in a subprocess; the ``nbytes`` of every
   array it keeps, grouped into per-engagement-pair arrays (the CSR holds each visible pair
   twice, user->entity and entity->user), per-deep-pair arrays, metadata edges and per-node
   arrays; the process RSS before and after the load and its peak (the build's transient copies).
2. The import baseline: RSS, USS and PSS of a process that only imported torch, Lightning and
   hir's training modules (what every rank pays before it holds any data).
3. A DDP fit: ``hir train trainer=ddp trainer.devices=2`` for one short epoch on the same
   snapshot, per code version (``--hir``). Every process's RSS, USS and PSS (smaps_rollup) is
   polled every 0.25 s: rank 0, rank 1 (Lightning's re-launch) and, since the data is laid out
   once per machine (hir.train.datamodule.shared_state), the child process that lays it out. RSS
   counts a mapped file page in every process that touched it; PSS splits it between them (the
   processes' PSS add up to the machine's memory); USS is a process's own pages. Each of rank 0's
   set-up log lines (graph loaded, spectral fit, task view, model, loader) records every process's
   RSS at that moment: where a rank's peak goes.

Results: benchmarks/results/graph_memory.json. Extrapolations are left to docs/scale.md, labelled.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30

PROBE = r"""
import json, resource, sys, time
import numpy as np, psutil
from dataclasses import fields
from hir.model import GraphStore, load_graph
from hir.model.csr import CSR
proc = psutil.Process()
rss0 = proc.memory_info().rss
t0 = time.perf_counter()
store = load_graph(sys.argv[1], sys.argv[2], ("train",), **json.loads(sys.argv[3]))
secs = time.perf_counter() - t0
rss1 = proc.memory_info().rss
parts = {}
for f in fields(GraphStore):
    v = getattr(store, f.name)
    if isinstance(v, np.ndarray):
        parts[f.name] = int(v.nbytes)
    elif isinstance(v, CSR):
        for g in fields(CSR):
            parts[f"{f.name}.{g.name}"] = int(getattr(v, g.name).nbytes)
print(json.dumps({
    "parts": parts, "n_nodes": int(store.n_nodes), "eng_entries": int(len(store.eng.dst)),
    "deep_pairs": int(len(store.deep_pairs)), "val_pairs": int(len(store.val_pairs)),
    "up_entries": int(len(store.up.dst)), "down_entries": int(len(store.down.dst)),
    "content_dim": int(store.content.shape[1]), "seconds": round(secs, 2),
    "rss_before_gib": rss0 / 2**30, "rss_after_gib": rss1 / 2**30,
    "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30,
}))
"""


def graph_store(run: Path) -> dict[str, Any]:
    from omegaconf import OmegaConf

    # the sampling options `hir train` loads the graph with (datamodule.graph)
    options = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "datamodule" / "default.yaml").graph)
    out = subprocess.run([sys.executable, "-c", PROBE, str(run / "graph"), str(run / "content"), json.dumps(options)],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    m = json.loads(out.stdout.strip().splitlines()[-1])
    p = m["parts"]
    pairs = m["eng_entries"] // 2
    eng = sum(v for k, v in p.items() if k.startswith("eng.") and k != "eng.indptr")
    node_keys = ["node_type", "content", "exposure", "warm", "eng.indptr", "up.indptr", "down.indptr"]
    per_node = {k: p[k] / m["n_nodes"] for k in node_keys}
    meta_edges = sum(v for k, v in p.items() if k.startswith(("up.", "down.")) and not k.endswith("indptr"))
    deep = p["deep_pairs"] + p["deep_weight"]
    total = sum(p.values())
    return {
        "snapshot": str(run.relative_to(ROOT)) if run.is_relative_to(ROOT) else str(run),
        "counts": {k: m[k] for k in ("n_nodes", "eng_entries", "deep_pairs", "val_pairs", "up_entries",
                                     "down_entries", "content_dim")} | {"visible_pairs": pairs},
        "bytes": {
            "total": total,
            "per_visible_pair": round(eng / max(pairs, 1), 2),
            "per_deep_pair": round(deep / max(m["deep_pairs"], 1), 2),
            "per_metadata_entry": round(meta_edges / max(m["up_entries"] + m["down_entries"], 1), 2),
            "per_node": round(sum(per_node.values()), 2),
            "per_node_parts": {k: round(v, 2) for k, v in per_node.items()},
            "arrays": p,
        },
        "load_graph": {
            "seconds": m["seconds"],
            "rss_before_gib": round(m["rss_before_gib"], 3),
            "rss_after_gib": round(m["rss_after_gib"], 3),
            "peak_rss_gib": round(m["peak_rss_gib"], 3),
            "peak_over_store": round((m["peak_rss_gib"] - m["rss_before_gib"]) * GIB / total, 2),
        },
    }


# log lines that mark a set-up phase (their first occurrence per process is a probe point)
PHASES = {
    "graph:": "load_graph (train store)",
    "spectral base: rank": "spectral fit",
    "training task:": "task view (second store, its fit)",
    "data layout": "mapped layout done",
    "model:": "model built",
    "batches per epoch per rank": "train loader",
    "trained in": "fit done",
}


def _mem(p: psutil.Process, full: bool) -> dict[str, int]:
    """RSS, and with ``full`` USS and PSS (reads /proc/<pid>/smaps_rollup: shared mapped pages count
    once per machine in the sum of PSS, once per process in RSS)."""
    if full:
        m = p.memory_full_info()
        return {"rss": m.rss, "uss": m.uss, "pss": getattr(m, "pss", m.uss)}
    return {"rss": p.memory_info().rss}


def _role(p: psutil.Process, root: int) -> str | None:
    cmd = " ".join(p.cmdline())
    if p.pid == root:
        return "rank0"
    if "resource_tracker" in cmd:
        return None
    if "multiprocessing" in cmd:
        return "layout"
    # Lightning re-launches `hir train ...` for rank 1 (a child of rank 0)
    return "rank1" if " train " in f" {cmd} " else None


def ddp_rank(run: Path, seeds: int, timeout: float, code: str, steps: int | None,
             overrides: list[str]) -> dict[str, Any]:
    """Peak RSS, PSS and USS of each process of a 2-process CPU DDP fit (one epoch of ``seeds``
    seeds, or ``steps`` optimizer steps): rank 0, rank 1 and, with the mapped layout, the child
    process that lays the data out; and each rank's memory at each set-up phase (its log lines).
    ``code``: a `hir` executable, or a source checkout (a directory holding ``hir/`` and ``conf/``,
    e.g. ``git archive <commit> hir conf``) run with this venv's `hir` on ``PYTHONPATH``."""
    hir, env = code, os.environ | {"OMP_WAIT_POLICY": "PASSIVE"}
    if Path(code).is_dir():
        hir, env = str(Path(sys.executable).with_name("hir")), env | {"PYTHONPATH": str(Path(code).resolve())}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [hir, "train", "trainer=ddp", "trainer.devices=2", "trainer.accelerator=cpu", "trainer.max_epochs=1",
               f"datamodule.seeds_per_epoch={seeds}", f"paths.graph_dir={run / 'graph'}",
               f"paths.content_dir={run / 'content'}", f"hydra.run.dir={tmp}", "force=true",
               "trainer.enable_progress_bar=false"] + ([f"trainer.max_steps={steps}"] if steps else []) + overrides
        t0 = time.perf_counter()
        # its own process group: a timeout ends every rank (rank 1 holds the output pipe too)
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
        peaks: dict[str, dict[str, int]] = {}
        now: dict[str, dict[str, int]] = {}
        done = threading.Event()
        lock = threading.Lock()

        def poll() -> None:
            root = psutil.Process(proc.pid)
            while not done.wait(0.25):
                try:
                    kids = root.children(recursive=True)
                except psutil.Error:
                    continue
                for p in [root, *kids]:
                    try:
                        role = _role(p, proc.pid)
                        if role is None:
                            continue
                        m = _mem(p, full=True)
                    except psutil.Error:
                        continue
                    with lock:
                        now[role] = m
                        peak = peaks.setdefault(role, {k: 0 for k in m})
                        for k, v in m.items():
                            peak[k] = max(peak[k], v)

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        lines: list[str] = []
        phases: list[dict[str, Any]] = []
        timer = threading.Timer(timeout, os.killpg, (proc.pid, signal.SIGKILL))
        timer.start()
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip())
            for marker, name in PHASES.items():
                if marker in line:
                    with lock:
                        snap = {r: round(m["rss"] / GIB, 3) for r, m in now.items()}
                    phases.append({"phase": name, "t_s": round(time.perf_counter() - t0, 1), "rss_gib": snap})
        proc.wait()
        timer.cancel()
        done.set()
        thread.join()
    # rank 1 logs to its own file (train_ddp_process_1.log), so the phases are rank 0's lines
    return {
        "command": " ".join(cmd[1:7] + cmd[11:]),
        "code": code,
        "returncode": proc.returncode,
        "timed_out": proc.returncode == -signal.SIGKILL,
        "wall_s": round(time.perf_counter() - t0, 1),
        "peak_gib": {r: {k: round(v / GIB, 3) for k, v in m.items()} for r, m in sorted(peaks.items())},
        "rank_peak_rss_gib": [round(peaks[r]["rss"] / GIB, 3) for r in ("rank0", "rank1") if r in peaks],
        "phases_rank0": phases,
        "log": [ln for ln in lines if any(m in ln for m in ("data layout", "spectral base: rank", "trained in"))],
        "output_tail": lines[-4:],
    }


def import_baseline() -> dict[str, float]:
    """RSS/USS/PSS of a process that has only imported what a training rank imports."""
    code = ("import json, psutil, torch, lightning, hir.train.datamodule, hir.train.module; "
            "m = psutil.Process().memory_full_info(); print(json.dumps({'rss': m.rss, 'uss': m.uss, 'pss': m.pss}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return {k: round(v / GIB, 3) for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, help="a run dir with graph/ and content/ (e.g. outputs/gowalla/smoke)")
    ap.add_argument("--seeds", type=int, default=1024, help="seeds of the DDP epoch")
    ap.add_argument("--no-ddp", action="store_true")
    ap.add_argument("--hir", action="append", default=None,
                    help="label=path: a `hir` executable or a source checkout to run the DDP fit with (repeat: "
                         "before/after); default: after=this venv's hir")
    ap.add_argument("--steps", type=int, default=None, help="trainer.max_steps of the DDP fit (a short run)")
    ap.add_argument("--override", action="append", default=[],
                    help="a Hydra override of the DDP fit (repeat), e.g. spectral.rank=1024 to skip the rank search")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "graph_memory.json"))
    args = ap.parse_args()
    run = Path(args.run).resolve()
    result: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip(),
        "machine": {"cpus": os.cpu_count(), "ram_gib": round(psutil.virtual_memory().total / GIB, 1)},
        "graph_store": graph_store(run),
    }
    if not args.no_ddp:
        result["import_baseline_gib"] = import_baseline()
        hirs = args.hir or [f"after={Path(sys.executable).with_name('hir')}"]
        result["ddp"] = {}
        for spec in hirs:
            label, _, exe = spec.partition("=")
            result["ddp"][label] = ddp_rank(run, args.seeds, args.timeout, exe, args.steps, args.override)
            print(json.dumps({label: result["ddp"][label]}, indent=1), flush=True)
        result["ddp"]["graph_store_gib"] = round(result["graph_store"]["bytes"]["total"] / GIB, 3)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
