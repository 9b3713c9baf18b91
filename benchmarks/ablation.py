"""Ablations of the seed's ideas: one Hydra multirun per dataset, gathered into docs/results.md.

    python benchmarks/ablation.py                                   # completejourney + online_retail, 3 seeds
    python benchmarks/ablation.py --datasets online_retail --seeds 0
    python benchmarks/ablation.py --reuse online_retail=multirun/ablation/online_retail   # re-gather

Each dataset runs ``hir pipeline experiment=ablation data=<d> -m`` (conf/experiment/ablation.yaml:
the arms of conf/ablation/ x the training seeds, on one shared snapshot), into
``multirun/ablation/<d>``. Per cell: the masked new-to-user retrieval recall@20 of the exported
embeddings (each user's train items masked), the item-cold slice of that protocol, the ranking NE
lift of the HIR features over the baseline ranker with its bootstrap CI, and the training figures
(spectral base vs best validation recall, epochs, seconds). Per arm: mean and sample standard
deviation over the seeds, and the difference to the full model in units of their spread.

Writes docs/results.md (the page names this command at its top), docs/results_ablation.png and
benchmarks/results/ablation.json.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hir_evaluation.gather import dotted_get, job_dirs, read_job

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("full", "no_bias_table", "no_exposure", "no_distill", "no_primitives", "no_content", "no_transformer")
WHAT = {
    "full": "the full model (defaults)",
    "no_bias_table": "no learned bucket bias T_h[qb, kb] in attention",
    "no_exposure": "no exposure/popularity term in attention",
    "no_distill": "no cross-view distillation and no align loss",
    "no_primitives": "no interest-primitive tokens in the contexts",
    "no_content": "ids only: no content in the network's tokens (export's cold placement still reads text)",
    "no_transformer": "the spectral base alone (no transformer)",
}
# (column, dotted path into the cell's figures); higher is better for every one
METRICS = (
    ("masked_recall@20", "retrieval.masked_new_to_user.hir.recall@20"),
    ("masked_ndcg@20", "retrieval.masked_new_to_user.hir.ndcg@20"),
    ("item_cold_recall@20", "retrieval.masked_new_to_user.slices.item_cold.hir.recall@20"),
    ("ne_lift_%", "ranking.ne_lift.value"),
    ("few_events_ne_lift_%", "slice_lift.few_events"),
    ("cold_entity_ne_lift_%", "slice_lift.cold_entity"),
)
BASELINES = ("popularity", "itemknn", "content")


def run_sweep(dataset: str, seeds: str, sweep_dir: Path, extra: list[str]) -> None:
    """``hir pipeline experiment=ablation data=<dataset> -m`` into ``sweep_dir``."""
    exe = Path(sys.executable).with_name("hir")
    cmd = [str(exe), "pipeline", "experiment=ablation", f"data={dataset}", f"hydra.sweep.dir={sweep_dir}",
           f"hydra.sweeper.params.seed={seeds}", *extra, "-m"]
    print("$", " ".join(cmd), flush=True)
    res = subprocess.run(cmd, cwd=ROOT)
    if res.returncode != 0:
        raise SystemExit(f"the ablation sweep on {dataset} failed (rc {res.returncode}); its cells are in {sweep_dir}")


def read_cell(job: Path) -> dict[str, Any] | None:
    """The arm, seed and figures of one job dir (None when it has no report yet)."""
    kv = read_job(job)["overrides"]
    report = job / "report" / "metrics.json"
    if "ablation" not in kv or not report.exists():
        return None
    metrics = json.loads(report.read_text())
    train_path = job / "checkpoints" / "train_metrics.json"
    train = json.loads(train_path.read_text()) if train_path.exists() else {}
    slices = {}
    for s in (metrics.get("ranking") or {}).get("slices") or []:
        name = s.get("slice", "").split(" ")[0]
        slices[name] = (s.get("ne_lift") or {}).get("value")
    tree = {**metrics, "slice_lift": slices}
    cell: dict[str, Any] = {"arm": kv["ablation"], "seed": int(kv.get("seed", 0)), "dir": str(job)}
    for col, path in METRICS:
        v = dotted_get(tree, path)
        cell[col] = None if not isinstance(v, int | float) else float(v) * (100 if col.endswith("%") else 1)
    ci = dotted_get(metrics, "ranking.ne_lift.ci")
    cell["ne_lift_ci_%"] = [100 * float(c) for c in ci] if isinstance(ci, list) else None
    best = train.get("best") or {}
    trained = [h.get("val/recall@20") for h in train.get("history") or [] if h.get("epoch", -1) >= 0]
    cell["trained_val_recall@20"] = max((v for v in trained if v is not None), default=None)
    cell |= {"base_val_recall@20": best.get("base_score"), "best_val_recall@20": best.get("score"),
             "plateau_epoch": best.get("epoch"), "epochs": train.get("epochs"),
             "train_s": sum((train.get("seconds") or {}).values()) or None,
             "stopped_by": train.get("stopped_by")}
    cell["baselines"] = {a: dotted_get(metrics, f"retrieval.masked_new_to_user.{a}.recall@20") for a in BASELINES}
    cell["baselines_item_cold"] = {a: dotted_get(metrics, f"retrieval.masked_new_to_user.slices.item_cold.{a}.recall@20")
                                   for a in BASELINES}
    return cell


def cells(sweep_dir: Path) -> list[dict[str, Any]]:
    out = [cell for cell in map(read_cell, job_dirs(sweep_dir)) if cell is not None]
    if not out:
        raise SystemExit(f"{sweep_dir}: no finished ablation cell (a job dir with report/metrics.json and an "
                         "ablation=<arm> override); run the sweep first")
    return out


def _stats(values: list[float | None]) -> dict[str, Any]:
    vals = [v for v in values if v is not None and v == v]
    if not vals:
        return {"mean": None, "sd": None, "n": 0}
    return {"mean": statistics.fmean(vals), "sd": statistics.stdev(vals) if len(vals) > 1 else None, "n": len(vals)}


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm: mean / sd / n of every metric, and its difference to the full model."""
    cols = [c for c, _ in METRICS] + ["base_val_recall@20", "best_val_recall@20", "trained_val_recall@20", "train_s",
                                      "plateau_epoch"]
    arms = {}
    for arm in [a for a in ARMS if any(r["arm"] == a for r in rows)]:
        mine = [r for r in rows if r["arm"] == arm]
        arms[arm] = {c: _stats([r.get(c) for r in mine]) for c in cols}
        arms[arm]["seeds"] = sorted(r["seed"] for r in mine)
        arms[arm]["ne_lift_ci_%"] = {r["seed"]: r["ne_lift_ci_%"] for r in mine}
    full = arms.get("full")
    for s in arms.values():
        s["vs_full"] = {}
        for c, _ in METRICS:
            if full is None or s[c]["mean"] is None or full[c]["mean"] is None:
                continue
            d = s[c]["mean"] - full[c]["mean"]
            spread = max(x for x in (s[c]["sd"], full[c]["sd"], 0.0) if x is not None)
            s["vs_full"][c] = {"diff": d, "spread": spread, "verdict": verdict(-d, spread, s[c]["n"], full[c]["n"])}
    base = {a: _stats([r["baselines"].get(a) for r in rows if r["arm"] == "full"]) for a in BASELINES}
    cold = {a: _stats([r["baselines_item_cold"].get(a) for r in rows if r["arm"] == "full"]) for a in BASELINES}
    return {"arms": arms, "baselines_masked_recall@20": base, "baselines_item_cold_recall@20": cold}


def verdict(gain: float, spread: float, n_arm: int, n_full: int) -> str:
    """What removing the part did, in words: ``gain`` = full - arm (what the part adds)."""
    if n_arm < 2 or n_full < 2:
        return "one seed: no spread to judge by"
    if abs(gain) <= spread:
        return "within the seed spread"
    return "the part helps" if gain > 0 else "the part hurts"


def _fmt(s: dict[str, Any], nd: int = 4) -> str:
    if s["mean"] is None:
        return "–"
    sd = f" ± {s['sd']:.{nd}f}" if s["sd"] is not None else ""
    return f"{s['mean']:.{nd}f}{sd}"


def plot(summary: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("masked_recall@20", "new-to-user recall@20 (train masked)"), ("item_cold_recall@20", "item-cold recall@20"),
              ("ne_lift_%", "ranking NE lift (%)")]
    fig, axes = plt.subplots(len(summary), len(panels), figsize=(4.2 * len(panels), 3.0 * len(summary)), squeeze=False)
    for row, (ds, s) in enumerate(summary.items()):
        arms = list(s["arms"])
        for col, (key, title) in enumerate(panels):
            ax = axes[row][col]
            means = [s["arms"][a][key]["mean"] or 0.0 for a in arms]
            sds = [s["arms"][a][key]["sd"] or 0.0 for a in arms]
            ax.barh(range(len(arms)), means, xerr=sds, color=["#d62728" if a == "full" else "#7f7f7f" for a in arms],
                    capsize=3)
            ax.set_yticks(range(len(arms)), arms, fontsize=8)
            ax.invert_yaxis()
            ax.axvline(0, color="black", lw=0.6)
            ax.set_title(f"{ds}: {title}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown(doc: dict[str, Any], plot_name: str) -> str:
    cmd = doc["command"]
    lines = ["# Results: ablations of the seed's ideas", "",
             f"Regenerate: `{cmd}` (about {doc.get('minutes_hint', '?')} minutes per cell, i.e. per arm, seed and dataset, on 2 cores).",
             "", f"Measured {doc['created']} on {doc['machine']}, git {doc['git']}. Each cell: `hir pipeline "
             "experiment=ablation` (conf/experiment/ablation.yaml: train, export, evaluate on one shared snapshot, "
             "defaults otherwise). Retrieval: the LightGCN-paper protocol (each user's train items masked, relevance "
             "= test entities new to the user). Values are mean ± sample sd over the training seeds; a part "
             "'helps' when removing it lowers the mean by more than the larger of the two arms' sds.", "",
             f"![ablations]({plot_name})", ""]
    if doc.get("partial"):
        lines[3:3] = ["", f"**Partial run:** {doc['partial']}"]
    for ds, s in doc["summary"].items():
        lines += [f"## {ds}", "", "| arm | what is removed | " + " | ".join(c for c, _ in METRICS)
                  + " | val recall@20 base → exported | best trained epoch's val | train s |",
                  "|" + "---|" * (len(METRICS) + 5)]
        for arm, a in s["arms"].items():
            vals = [_fmt(a[c], 2 if c.endswith("%") else 4) for c, _ in METRICS]
            val = f"{_fmt(a['base_val_recall@20'])} → {_fmt(a['best_val_recall@20'])}"
            lines.append(f"| {arm} | {WHAT.get(arm, arm)} | " + " | ".join(vals)
                         + f" | {val} | {_fmt(a['trained_val_recall@20'])} | {_fmt(a['train_s'], 0)} |")
        at_base = [arm for arm, a in s["arms"].items() if a["plateau_epoch"]["mean"] == -1]
        if at_base:
            lines += ["", f"In {len(at_base)} of {len(s['arms'])} arms ({', '.join(at_base)}) the best validation "
                      "point was the untrained spectral base (step 0), so those arms exported the base itself "
                      "and their test rows can only differ in the cold entities' own-view term. The column "
                      "'best trained epoch's val' is what each arm's training reached; it is the comparison of the "
                      "parts' effect on training."]
        b, c = s["baselines_masked_recall@20"], s["baselines_item_cold_recall@20"]
        lines += ["", "Baselines in the same cells (masked new-to-user recall@20 / item-cold): "
                  + ", ".join(f"{k} {_fmt(b[k])} / {_fmt(c[k])}" for k in BASELINES) + ".", "",
                  "Each arm against the full model (arm minus full, on masked recall@20, item-cold recall@20 and "
                  "NE lift in %; positive = the arm without the part did better):", ""]
        for arm, a in s["arms"].items():
            if arm == "full":
                continue
            parts = [f"{col} {v['diff']:+.4f} ({v['verdict']})" for col, v in a["vs_full"].items()
                     if col in ("masked_recall@20", "item_cold_recall@20", "ne_lift_%")]
            lines.append(f"- **{arm}**: " + "; ".join(parts))
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="completejourney,online_retail")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--reuse", nargs="*", default=[], help="dataset=sweep_dir: gather a finished sweep, do not run it")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results.md")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "ablation.json")
    ap.add_argument("--override", dest="extra", action="append", default=[],
                    help="one more override for every cell, e.g. --override trainer.max_epochs=1 (repeatable)")
    args = ap.parse_args()
    reuse = dict(r.split("=", 1) for r in args.reuse)
    datasets = list(reuse) if reuse else [d for d in args.datasets.split(",") if d]
    summary, rows_by_ds = {}, {}
    for ds in datasets:
        sweep_dir = Path(reuse[ds]) if ds in reuse else ROOT / "multirun" / "ablation" / ds
        if ds not in reuse:
            run_sweep(ds, args.seeds, sweep_dir, args.extra)
        rows = cells(sweep_dir)
        rows_by_ds[ds] = rows
        summary[ds] = summarise(rows)
    train_s = [r["train_s"] for rows in rows_by_ds.values() for r in rows if r.get("train_s")]
    cmd = "python benchmarks/ablation.py" + ("" if args.datasets == "completejourney,online_retail" else
                                             f" --datasets {args.datasets}") + \
          ("" if args.seeds == "0,1,2" else f" --seeds {args.seeds}") + "".join(f" --override {e}" for e in args.extra)
    doc = {"created": datetime.now(UTC).isoformat(timespec="seconds"),
           "machine": f"{subprocess.getoutput('uname -m')}, {subprocess.getoutput('nproc')} cores",
           "git": subprocess.getoutput(f"git -C {ROOT} rev-parse --short HEAD"), "command": cmd,
           "minutes_hint": math.ceil(statistics.fmean(train_s) / 60) + 2 if train_s else None,
           "summary": summary, "cells": rows_by_ds}
    n_seeds = max((len(a["seeds"]) for s in summary.values() for a in s["arms"].values()), default=0)
    if n_seeds < 3 or len(summary) < 2:
        doc["partial"] = (f"{n_seeds} seed(s) on {', '.join(summary)}. The full evidence is `python benchmarks/ablation.py` "
                          "(completejourney and online_retail, seeds 0, 1, 2: 42 cells, hours on 2 cores); with "
                          "one seed there is no spread, so no part can be judged to help or hurt.")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    png = args.out.with_name(args.out.stem + "_ablation.png")
    plot(summary, png)
    args.out.write_text(markdown(doc, png.name))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=2, default=str))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
