"""Deep-funnel ranking lift with defaults: `hir evaluate` on completejourney, online_retail and beibei.

    python benchmarks/ranking.py                              # evaluate each dataset's run, outputs/<d>/ranking
    python benchmarks/ranking.py --pipeline                   # run `hir pipeline` first (tens of minutes each)
    python benchmarks/ranking.py --datasets beibei --reuse    # re-read a finished report

Each dataset's run dir (``outputs/<dataset>/<run-name>``) must hold a published export (``hir
pipeline data=<dataset> run_name=<run-name>``, or ``--pipeline``); the benchmark then runs ``hir
evaluate data=<dataset> run_name=<run-name> force=true`` with the defaults (conf/eval/default.yaml:
every ranking arm of ``eval.ranking``, ``eval.ranker_seeds`` ranker seeds, paired bootstrap over
users; the dataset's task, conf/eval/task/<dataset>.yaml) against that run's published version,
and reads its ``report/metrics.json``: per arm AUC, NE, calibration, the NE lift over the baseline
with its 95% interval and seed spread, every fit's best step and best check, the few-events and
cold-entity slices with every arm's lift and interval. The model that produced the embeddings is
read from ``checkpoints/train_metrics.json`` and the run's ``hir.log``.

Writes benchmarks/results/ranking.json and the ranking section of docs/results.md (between its
``<!-- ranking:begin -->`` / ``<!-- ranking:end -->`` markers; appended when they are missing).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _results_md import markers, write_section  # benchmarks/ (the script's folder is on sys.path)

from hir_evaluation.ranking.registry import BASELINE, lift_key
from hir_evaluation.report.sections import ranking_arms

ROOT = Path(__file__).resolve().parents[1]
DATASETS = ("completejourney", "online_retail", "beibei")
# targets of the ranking issue (defaults, 2 cores)
MAX_WIDTH = {"completejourney": 0.003}  # NE-lift 95% interval width (a fraction: 0.3 points)
LOWER_BOUND_ABOVE_ZERO = ("completejourney", "beibei")  # hir's NE lift
SLICES = ("few_events", "cold_entity")
BEGIN, END = markers("ranking")


def run(*args: str) -> dict[str, Any]:
    """`hir <args>` from the checkout; wall seconds, and the error tail when it fails."""
    exe = Path(sys.executable).with_name("hir")
    t0 = time.perf_counter()
    res = subprocess.run([str(exe), *args], cwd=ROOT, capture_output=True, text=True)
    wall = round(time.perf_counter() - t0, 1)
    if res.returncode != 0:
        return {"wall_s": wall, "error": f"hir {' '.join(args)} failed (rc {res.returncode}): {res.stderr[-2000:]}"}
    return {"wall_s": wall}


def model_info(run_dir: Path) -> dict[str, Any]:
    """Which model produced the embeddings: the training's best point against the spectral base,
    the base's rank, what stopped training, the export's version and the code's git sha."""
    train = json.loads((run_dir / "checkpoints" / "train_metrics.json").read_text())
    best = train.get("best") or {}
    log = run_dir / "hir.log"
    sha = re.search(r"hir pipeline \(git (\w+)\)", log.read_text()) if log.exists() else None
    emb = json.loads((run_dir / "embeddings" / "meta.json").read_text())
    cfg = train.get("config") or {}
    return {
        "model_version": emb.get("model_version"), "git": sha.group(1) if sha else None,
        "config": "defaults (conf/model/hir.yaml, conf/trainer, conf/spectral)",
        "spectral_rank": (train.get("spectral") or {}).get("rank"),
        "best_epoch": best.get("epoch"), "best_val_recall@20": best.get("score"),
        "base_val_recall@20": best.get("base_score"), "gain_over_base": best.get("gain_over_base"),
        "exported": "the spectral base alone (training did not beat it on val)" if (best.get("epoch") or 0) < 0
        else f"the transformer at epoch {best.get('epoch')}",
        "stopped_by": train.get("stopped_by"), "train_seconds": (train.get("seconds") or {}).get("fit"),
        "net": {k: ((cfg.get("model") or {}).get("net") or {}).get(k) for k in ("width", "depth", "heads")}
        | {"levels": emb.get("levels"), "dim": emb.get("dim")},
        "visible_splits": emb.get("visible_splits"),
    }


def _lift(v: dict[str, Any] | None) -> dict[str, Any] | None:
    if not v or v.get("value") is None:
        return None
    lo, hi = v["ci"]
    return {"value": v["value"], "ci": [lo, hi], "width": hi - lo, "seeds": v.get("seeds"),
            "seed_spread": v.get("seed_spread"), "seed_sd": v.get("seed_sd")}


def collect(dataset: str, run_dir: Path) -> dict[str, Any]:
    metrics = json.loads((run_dir / "report" / "metrics.json").read_text())
    r = metrics["ranking"]
    arms: dict[str, Any] = {}
    for arm in ranking_arms(r):
        a = r.get(arm) or {}
        fit = a.get("fit") or {}
        curves = fit.get("curves") or []
        arms[arm] = {
            "auc": a.get("auc"), "auc_ci": a.get("auc_ci"), "ne": a.get("ne"), "ne_ci": a.get("ne_ci"),
            "calibration": a.get("calibration"), "skipped": a.get("skipped"),
            "best_steps": fit.get("best_steps"), "best_checks": fit.get("best_checks"),
            "checks": [len(c["curve"]) for c in curves], "steps_per_epoch": [c.get("steps_per_epoch") for c in curves],
            "best_at_first_check": fit.get("best_at_first_check"), "fit_seconds": fit.get("seconds"),
            "ne_lift": _lift(r.get(lift_key(arm))) if arm != BASELINE else None,
        }
    slices = {}
    for s in r.get("slices") or []:
        name = next((k for k in SLICES if s["slice"].startswith(k)), None)
        if name:
            slices[name] = {"slice": s["slice"], "n": s["n"], "positives": s["positives"],
                            "ne": {arm: (s.get(arm) or {}).get("ne") for arm in ranking_arms(r)},
                            "ne_lift": {arm: _lift(s.get(lift_key(arm))) for arm in ranking_arms(r) if arm != BASELINE}}
    return {
        "run_dir": str(run_dir.relative_to(ROOT)), "task": r.get("task"), "protocol": r.get("protocol"),
        "rows": r.get("rows"), "positives": r.get("positives"), "seeds": r.get("seeds"),
        "bootstrap": r.get("bootstrap"), "notes": r.get("notes"), "sources": metrics.get("sources", {}).get("ranking_hir"),
        "arms": arms, "slices": slices, "timings_s": metrics.get("timings_s"), "model": model_info(run_dir),
        "explanations": [{k: e.get(k) for k in ("user", "entity", "entity_text", "arm", "score", "label", "source")}
                         | {"shared": [{k: t[k] for k in ("level", "token", "label", "weight")}
                                       for t in (e.get("explanation") or {}).get("shared", [])[:4]]}
                         for e in r.get("explanations") or []],
    }


def targets(results: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ds, res in results.items():
        if "arms" not in res:
            continue
        first = {a: v["best_checks"] for a, v in res["arms"].items() if v.get("best_checks")}
        out[f"{ds}: every arm's best check after its first"] = {
            "value": first, "met": bool(first) and all(min(c) > 1 for c in first.values())}
        hir = (res["arms"].get("hir") or {}).get("ne_lift")
        if ds in MAX_WIDTH:
            out[f"{ds}: hir NE-lift interval <= {100 * MAX_WIDTH[ds]:g} points"] = {
                "value": hir and hir["width"], "met": bool(hir) and hir["width"] <= MAX_WIDTH[ds]}
        if ds in LOWER_BOUND_ABOVE_ZERO:
            out[f"{ds}: hir NE-lift 95% lower bound > 0"] = {"value": hir and hir["ci"][0],
                                                            "met": bool(hir) and hir["ci"][0] > 0}
    return out


def _pct(x: Any, nd: int = 2) -> str:
    return "–" if x is None else f"{100 * x:.{nd}f}"


def _f(x: Any, nd: int = 4) -> str:
    return "–" if x is None else f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def _lift_cell(v: dict[str, Any] | None) -> str:
    if not v:
        return "–"
    return f"{_pct(v['value'])} [{_pct(v['ci'][0])}, {_pct(v['ci'][1])}] ({_pct(v['width'])})"


def _spread(v: dict[str, Any] | None) -> str:
    if not v or not v.get("seeds") or len(v["seeds"]) < 2:
        return "–"
    return f"[{_pct(v['seed_spread'][0])}, {_pct(v['seed_spread'][1])}], sd {_pct(v['seed_sd'])}"


def markdown(doc: dict[str, Any]) -> str:
    lines = [BEGIN, "## Ranking: deep-funnel NE lift (`python benchmarks/ranking.py`)", "",
             f"Measured {doc['created']} on {doc['machine']}, git {doc['git']}. Each dataset: `hir evaluate` with the "
             "defaults against the run's published version (Feast); every arm trains the same ranker recipe on the same "
             "rows with each of the ranker seeds. NE lift = (NE baseline - NE arm) / NE baseline in %, the mean over "
             "seeds, with its 95% paired bootstrap interval over users (each draw averages the seeds) and the interval's "
             "width in brackets; seed spread = [min, max] of the per-seed lifts and their sd; best checks = each fit's "
             "best holdout check (1 = the first).", ""]
    for ds, r in doc["results"].items():
        if "error" in r:
            lines += [f"### {ds}", "", f"failed: {r['error'][-500:]}", ""]
            continue
        m, rows = r["model"], r["rows"] or {}
        lines += [f"### {ds}", "",
                  f"Task `{(r['task'] or {}).get('kind')}` ({(r['task'] or {}).get('candidate_stages')} -> "
                  f"{(r['task'] or {}).get('label_stage')}); protocol: {r['protocol']}; rows fit {rows.get('fit')} / "
                  f"test {rows.get('test')}, test positives {(r['positives'] or {}).get('test')}; seeds {r['seeds']}; "
                  f"ranking {_f((r['timings_s'] or {}).get('ranking'), 0)} s of `hir evaluate`'s "
                  f"{_f(r.get('evaluate_wall_s'), 0)} s. Embeddings: version `{m['model_version']}` (git {m['git']}), "
                  f"{m['config']}: spectral rank {m['spectral_rank']}, exported {m['exported']} (val recall@20 base "
                  f"{_f(m['base_val_recall@20'])}, best {_f(m['best_val_recall@20'])}), training stopped by "
                  f"{m['stopped_by']}.", "",
                  "| arm | AUC | NE | calibration | NE lift % [95% CI] (width) | seed spread % | best checks |",
                  "|---|---|---|---|---|---|---|"]
        for arm, a in r["arms"].items():
            if a.get("skipped"):
                lines.append(f"| {arm} | skipped: {a['skipped'][:120]} | | | | | |")
                continue
            checks = ", ".join(f"{b}/{c}" for b, c in zip(a["best_checks"] or [], a["checks"] or []))
            lines.append(f"| {arm} | {_f(a['auc'])} | {_f(a['ne'])} | {_f(a['calibration'], 3)} | "
                         f"{_lift_cell(a['ne_lift'])} | {_spread(a['ne_lift'])} | {checks} |")
        arms = [a for a in r["arms"] if a != BASELINE]
        if r["slices"]:
            lines += ["", "| slice | rows | positives | " + " | ".join(f"NE lift {a} % [CI]" for a in arms) + " |",
                      "|---|---|---|" + "---|" * len(arms)]
            for s in r["slices"].values():
                lines.append(f"| {s['slice']} | {s['n']} | {s['positives']} | "
                             + " | ".join(_lift_cell(s['ne_lift'].get(a)) for a in arms) + " |")
        if r.get("explanations"):
            lines += ["", "Why this? (the top-ranked test pairs' shared tokens, as `hir explain` computes them):", ""]
            for e in r["explanations"]:
                shared = "; ".join(f"l{t['level']} {t['token']} {t['label']} ({t['weight']:.3f})" for t in e["shared"])
                lines.append(f"- user {e['user']}, {e.get('entity_text') or ''} ({e['entity']}), score "
                             f"{_f(e['score'], 3)}, label {e['label']}: {shared or 'no shared token'}")
        lines.append("")
    lines += ["### Targets", "", "| target | value | met |", "|---|---|---|"]
    for name, t in doc["targets"].items():
        v = t["value"]
        shown = (f"{_pct(v)} points" if "interval" in name else f"{_pct(v)}%") if isinstance(v, float) else v
        lines.append(f"| {name} | {shown} | {'yes' if t['met'] else 'no'} |")
    return "\n".join(lines) + "\n" + END + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--run-name", default="ranking")
    ap.add_argument("--pipeline", action="store_true", help="run `hir pipeline` (every stage) before evaluating")
    ap.add_argument("--reuse", action="store_true", help="read finished reports instead of running `hir evaluate`")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "ranking.json")
    ap.add_argument("--md", type=Path, default=ROOT / "docs" / "results.md")
    args = ap.parse_args()
    doc: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    results = doc.get("results", {})
    failed = []
    for ds in [d for d in args.datasets.split(",") if d]:
        run_dir = ROOT / "outputs" / ds / args.run_name
        ran: dict[str, Any] = {}
        if args.pipeline:
            ran = run("pipeline", f"data={ds}", f"run_name={args.run_name}", "force=true")
        elif not args.reuse:
            ran = run("evaluate", f"data={ds}", f"run_name={args.run_name}", "force=true")
        if "error" in ran:
            failed.append(ds)  # recorded; the other datasets still run, the exit code says so
            results[ds] = ran | {"run_dir": str(run_dir.relative_to(ROOT))}
            print(ran["error"], file=sys.stderr, flush=True)
            continue
        wall = ran.get("wall_s", (results.get(ds) or {}).get("evaluate_wall_s"))
        results[ds] = collect(ds, run_dir) | {"evaluate_wall_s": wall}
        print(f"{ds}: hir NE lift {results[ds]['arms'].get('hir', {}).get('ne_lift')}", flush=True)
    git = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    doc = {"created": datetime.now(UTC).isoformat(timespec="seconds"),
           "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
           "git": git.stdout.strip() or None, "results": results, "targets": targets(results)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    section = markdown(doc)
    write_section(section, args.md, "ranking")
    print(section)
    if failed:
        sys.exit(f"failed: {failed}")


if __name__ == "__main__":
    main()
