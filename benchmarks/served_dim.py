"""Masked new-to-user recall@20 against the served dimension (``export.dim``, hir/export/project.py).

    python benchmarks/served_dim.py --datasets online_retail --dims 64 128 256 full
    python benchmarks/served_dim.py --datasets online_retail completejourney --ne-lift
    python benchmarks/served_dim.py --datasets completejourney --override spectral.rank=512 --ne-lift

Per dataset: one training (``hir pipeline`` prepare, enrich, train into ``outputs/<data>/<run>``;
reused when it is there), then one ``hir export`` per served dimension from that checkpoint, each
into ``<run>/served_dim/<dim>/`` (embeddings/, hierarchy/). Each export's test retrieval is scored
by the evaluation harness itself: :func:`hir_evaluation.retrieval.data.retrieval_data` (the
dataset's retrieval task, conf/eval/task/<data>.yaml) and the exact search over the export files
(:func:`hir_evaluation.retrieval.hir_search.files_topk`: the user's history masked, relevance the
held-out entities new to the user), recall@20 per user, its mean and a paired bootstrap of the
change against the full rank. Beside each projected row: plain truncation of the full export to
its first d directions (the same layout re-formed, :func:`hir.export.project.project` with the
identity's first d columns), the reference the fitted basis has to beat. With ``--ne-lift``,
``hir evaluate`` (the export files, the hir arms only) gives the NE lift of the hir ranking arm per
dimension, and its own masked recall cross-checks this one. ``--score-only`` rescores the exports
that exist (no `hir` command) and takes the NE lift from an earlier ``--ne-lift`` report of the
same export.

Writes ``benchmarks/results/served_dim.json`` and the served_dim section of docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from _results_md import markers, write_section  # noqa: E402

HIR = [str(Path(sys.executable).with_name("hir"))]
K = 20


def hir(*args: str, log: Path) -> float:
    """Run one `hir` command from the repo root (its output appended to ``log``); its seconds."""
    t0 = time.perf_counter()
    with log.open("a") as f:
        f.write(f"\n$ hir {' '.join(args)}\n")
        f.flush()
        proc = subprocess.run([*HIR, *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, check=False)
    if proc.returncode:
        raise SystemExit(f"hir {' '.join(args)} failed (exit {proc.returncode}); see {log}")
    return time.perf_counter() - t0


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def retrieval(run: Path, data: str, seed: int, as_of: str) -> tuple[Any, Any, Any, list[str]]:
    """The dataset's test retrieval data as `hir evaluate` builds it, its snapshot and task: the
    history (what is masked) is the periods the export saw, train alone when the export is valid
    from before the test period (hir_evaluation.sources.selection.Sources.history_splits)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from hir.data.snapshot import load_snapshot
    from hir_evaluation.retrieval.data import retrieval_data

    task = instantiate(OmegaConf.load(ROOT / "conf" / "eval" / "task" / f"{data}.yaml").retrieval)
    snap = load_snapshot(run / "graph")
    history = ["train"] if datetime.fromisoformat(as_of) < snap.test_start else ["train", "val"]
    return retrieval_data(snap, task, "test", seed, history), snap, task, history


def masked_recall(ranked: Any, rdata: Any) -> np.ndarray:
    """(U,) masked new-to-user recall@20 per test user (NaN: nothing new to the user)."""
    from hir_evaluation.metrics import recall_per_user

    return recall_per_user(ranked.masked, rdata.new_to_user, K)


def truncated(emb_dir: Path, snap: Any, entity_type: str, d: int, rdata: Any) -> np.ndarray:
    """Per-user masked recall@20 of the full export cut to its first d directions (the layout
    re-formed as the projection does, with the identity's first d columns as the basis)."""
    from hir.export.project import project
    from hir_evaluation.retrieval.hir_search import _vectors
    from hir_evaluation.retrieval.rank import inner_product_scores, rank_dense

    users, has_user = _vectors(emb_dir, snap, "user")
    items, has_item = _vectors(emb_dir, snap, entity_type)
    basis = np.eye(users.shape[1] - 1, d, dtype=np.float32)
    users = np.where(has_user[:, None], project(users, basis, np.ones(len(users), bool)), 0)
    items = project(items, basis, np.zeros(len(items), bool))
    ranked = rank_dense(inner_product_scores(users, items, has_item), rdata.users, K, rdata.seen)
    for top in ranked.lists():
        top[~has_user[rdata.users]] = -1
    return masked_recall(ranked, rdata)


def paired(new: np.ndarray, ref: np.ndarray, seed: int) -> dict[str, float]:
    """Relative change of the mean and its 95% paired bootstrap interval over users."""
    from hir.model.metrics import paired_gain

    g = paired_gain(new, ref, 1000, seed)
    return {k: round(100 * v, 2) for k, v in g.items()}


def ne_lift(data: str, run_name: str, dim_dir: Path, log: Path, extra: list[str]) -> dict[str, Any]:
    """`hir evaluate` on the export files of ``dim_dir`` (the hir arms only): the hir ranking arm's
    NE lift over the baseline and its interval."""
    report = dim_dir / "report"
    # the hir ranking arm alone beside the baseline (the other arms do not read the served vectors)
    hir("evaluate", f"data={data}", f"run_name={run_name}", "eval.hir_source=files", "eval.retrieval_arms=[hir]",
        "~eval.ranking.hir_tokens", "~eval.ranking.content", "eval.explain.arm=hir",
        f"paths.embeddings_dir={dim_dir / 'embeddings'}", f"paths.hierarchy_dir={dim_dir / 'hierarchy'}",
        f"paths.report_dir={report}", "force=true", *extra, log=log)
    return from_report(report / "metrics.json")


def from_report(path: Path) -> dict[str, Any]:
    """The hir ranking arm's NE lift and the harness's own masked new-to-user recall@20 of the hir
    search from a `hir evaluate` metrics.json (the latter cross-checks this benchmark's)."""
    metrics = json.loads(path.read_text())
    lift = (metrics.get("ranking") or {}).get("ne_lift") or {}
    harness = (((metrics.get("retrieval") or {}).get("masked_new_to_user") or {}).get("hir") or {}).get("recall@20")
    return {"ne_lift": lift.get("value"), "ne_lift_ci": lift.get("ci"), "harness_masked_new_recall@20": harness}


def earlier_report(out: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """What an earlier ``--ne-lift`` run's `hir evaluate` of this very export measured (same model
    version, same embeddings dir), or nothing."""
    path = out / "report" / "metrics.json"
    if not path.exists():
        return {}
    metrics = json.loads(path.read_text())
    same = metrics.get("model_version") == meta["model_version"] and \
        Path((metrics.get("outputs") or {}).get("embeddings", "")).resolve() == (out / "embeddings").resolve()
    return from_report(path) | {"ne_from": "an earlier --ne-lift run's report of this export"} if same else {}


def bench_dataset(data: str, dims: list[str], run_name: str, seed: int, with_ne: bool, log: Path,
                  extra: list[str], score_only: bool) -> dict[str, Any]:
    from hir_evaluation.retrieval.hir_search import files_topk

    run = ROOT / "outputs" / data / run_name
    if not score_only:
        hir("pipeline", f"data={data}", f"run_name={run_name}", "pipeline.stages=[prepare,enrich,train]", *extra, log=log)
    rdata = snap = task = history = None
    rows: dict[str, dict[str, Any]] = {}
    recalls: dict[str, np.ndarray] = {}
    for dim in dims:
        out = run / "served_dim" / dim
        value = "null" if dim == "full" else dim
        if not score_only:
            hir("export", f"data={data}", f"run_name={run_name}", f"export.dim={value}",
                f"paths.embeddings_dir={out / 'embeddings'}", f"paths.hierarchy_dir={out / 'hierarchy'}", *extra, log=log)
        meta = json.loads((out / "embeddings" / "meta.json").read_text())
        if rdata is None:
            rdata, snap, task, history = retrieval(run, data, seed, meta["event_timestamp"])
        recalls[dim] = masked_recall(files_topk(out / "embeddings", snap, task.entity_type)(rdata, K), rdata)
        rows[dim] = {"dim": meta["dim"], "rank": meta["spectral"]["rank"], "projection": meta.get("projection"),
                     "model_version": meta["model_version"], "export_seconds": meta["seconds"]["total"],
                     "embeddings_bytes": dir_bytes(out / "embeddings"),
                     "masked_new_recall@20": round(float(np.nanmean(recalls[dim])), 5)}
        # a served dimension at or above the rank projects nothing: the export is the full one
        if with_ne and (dim == "full" or meta.get("projection")):
            rows[dim] |= ne_lift(data, run_name, out, log, extra)
        elif not with_ne:
            rows[dim] |= earlier_report(out, meta)
    for r in rows.values():
        if "ne_lift" not in r and "ne_lift" in rows.get("full", {}) and not r.get("projection"):
            r |= {k: rows["full"][k] for k in ("ne_lift", "ne_lift_ci")}
    full = recalls.get("full")
    for dim in dims:
        if full is None or dim == "full":
            continue
        rows[dim]["vs_full_%"] = paired(recalls[dim], full, seed)
        if int(dim) < rows[dim]["rank"]:
            cut = truncated(run / "served_dim" / "full" / "embeddings", snap, task.entity_type, int(dim), rdata)
            rows[dim]["truncated_masked_new_recall@20"] = round(float(np.nanmean(cut)), 5)
            rows[dim]["fitted_vs_truncated_%"] = paired(recalls[dim], cut, seed)
    users = int((~np.isnan(next(iter(recalls.values())))).sum()) if recalls else 0
    return {"run": os.path.relpath(run, ROOT), "history_splits": history, "test_users": users, "dims": rows}


def table(result: dict[str, Any]) -> str:
    begin, end = markers("served_dim")
    lines = [begin, "## Served dimension (`export.dim`)", "",
             "; ".join(f"`{ds.get('command', result['command'])}`" for ds in result["datasets"].values())
             + f" (last run {result['when'][:10]}; {result['machine_cpus']} cores). One training per dataset, "
             "one export per served dimension d (the embedding has d + 1 coordinates); masked new-to-user recall@20 "
             "on test by the harness's exact search over the export files, the history masked as `hir evaluate` "
             "masks it (the periods the export saw); change against the full rank with its 95% "
             "paired bootstrap interval over users; *truncated*: the full export cut to its first d directions; "
             "*captured*: the share of the users' and entities' second moments the served basis keeps"
             + ("; NE lift: the hir ranking arm over the baseline by `hir evaluate` on the export files, 95% interval"
                if any("ne_lift" in r for d in result["datasets"].values() for r in d["dims"].values()) else "")
             + (" (taken from an earlier `--ne-lift` run's `hir evaluate` report of the same export)"
                if any("ne_from" in r for d in result["datasets"].values() for r in d["dims"].values()) else "")
             + ".", ""]
    ne = any("ne_lift" in r for d in result["datasets"].values() for r in d["dims"].values())
    head = "| dataset | d | width | recall@20 | vs full (%) | truncated | captured user / entity | MB |"
    lines += [head + (" NE lift (%) |" if ne else ""), "|" + "---|" * (8 + ne)]
    for name, ds in result["datasets"].items():
        for dim, r in ds["dims"].items():
            vs = r.get("vs_full_%")
            p = r.get("projection") or {}
            cap = f"{p['captured_user']:.3f} / {p['captured_entity']:.3f}" if p else \
                ("1 / 1" if dim == "full" else f"1 / 1 (d >= rank {r['rank']}: the full export)")
            row = (f"| {name} | {dim} | {r['dim']} | {r['masked_new_recall@20']:.4f} | "
                   + (f"{vs['gain']:+.2f} [{vs['lo']:+.2f}, {vs['hi']:+.2f}]" if vs and p else "") + " | "
                   + (f"{r['truncated_masked_new_recall@20']:.4f}" if "truncated_masked_new_recall@20" in r else "")
                   + f" | {cap} | {r['embeddings_bytes'] / 1e6:.0f} |")
            if ne:
                lift, ci = r.get("ne_lift"), r.get("ne_lift_ci") or [None, None]
                row += (f" {100 * lift:+.2f} [{100 * ci[0]:+.2f}, {100 * ci[1]:+.2f}] |" if lift is not None
                        and None not in ci else " |")
            lines.append(row)
    lines += ["", end, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", default=["online_retail"])
    p.add_argument("--dims", nargs="+", default=["64", "128", "256", "full"])
    p.add_argument("--run-name", default="served")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--ne-lift", action="store_true", help="also `hir evaluate` each export (slow)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "served_dim.json"))
    p.add_argument("--docs", default=str(ROOT / "docs" / "results.md"))
    p.add_argument("--override", action="append", default=[], help="a Hydra override for every hir command")
    p.add_argument("--score-only", action="store_true",
                   help="score the exports that exist (no hir command); NE lift from their earlier reports")
    args = p.parse_args(argv)
    dims = [d for d in args.dims if d != "full"] + (["full"] if "full" in args.dims else [])
    log = ROOT / "outputs" / "served_dim.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    out_path = Path(args.out)
    result = json.loads(out_path.read_text()) if out_path.exists() else {"datasets": {}}
    result |= {"command": "python benchmarks/served_dim.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "when": datetime.now(UTC).isoformat(timespec="seconds"), "machine": platform.platform(),
               "machine_cpus": os.cpu_count()}
    for data in args.datasets:
        # a run with overrides is its own row (e.g. `completejourney spectral.rank=512`), with its command
        key = " ".join([data, *args.override])
        result["datasets"][key] = bench_dataset(data, dims, args.run_name, args.seed, args.ne_lift, log, args.override,
                                                args.score_only) | {"command": result["command"]}
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=1))  # after each dataset: a later failure keeps it
        print(json.dumps({key: result["datasets"][key]}, indent=1))
    write_section(table(result), Path(args.docs), "served_dim")


if __name__ == "__main__":
    main()
