"""Does the learner earn its place? The spectral base alone against the full model, on test, per seed.

    python benchmarks/learner.py                                        # 4 datasets x seeds 0, 1, 2
    python benchmarks/learner.py --datasets online_retail --seeds 0     # one cell per arm
    python benchmarks/learner.py --budget-min 110                       # launch no cell after 110 minutes
    python benchmarks/learner.py --reuse                                # re-read finished cells, run nothing

Per dataset the snapshot is prepared and enriched once (``hir prepare|enrich data=<d>
run_name=learner``, reused when it exists). Then, for each seed and arm, one cell in its own run dir
``outputs/<d>/learner_<arm>_s<seed>`` reading that snapshot (``paths.graph_dir`` /
``paths.content_dir``), with ``seed=<seed>`` and every other setting at its default:

- ``base``: ``model.net.transformer=false``, the spectral base alone;
- ``full``: ``model.net.transformer=true``, the full model (the default).

A cell runs ``hir train``, ``hir export`` and ``hir evaluate eval.hir_source=files
eval.retrieval_arms=[hir] force=true`` (with NO_RANKING's shortcuts unless ``--with-ranking``)
and reads the test masked new-to-user recall@20 of hir
(``retrieval.masked_new_to_user.hir.recall@20``) and its ``few_events`` slice (users whose history
has at most ``eval.retrieval_few_events`` events) from ``report/metrics.json``, the training
seconds and the exported validation point from ``checkpoints/train_metrics.json`` (``best.epoch``
-1 = the export took the step-0 spectral base). A cell whose ``report/metrics.json`` exists is not
run again, so an interrupted run continues where it stopped; each stage's wall time is kept in the
cell's ``learner_cell.json``.

Writes benchmarks/results/learner.json in issue 19's form, ``{dataset: {"base": [per seed], "full":
[...], "few_events": {"base": [...], "full": [...]}, "train_s": [full arm per seed], ...}}`` (a cell
that did not finish is null and listed under ``missing``), with a verdict per dataset against the
issue's targets, and the learner section of docs/results.md (between its ``<!-- learner:begin -->``
/ ``<!-- learner:end -->`` markers; appended when they are missing).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _results_md import markers, write_section  # benchmarks/ (the script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
DATASETS = ("online_retail", "beibei", "completejourney", "gowalla")
ARMS = {"base": "model.net.transformer=false", "full": "model.net.transformer=true"}
RECALL = "retrieval.masked_new_to_user.hir.recall@20"
FEW = "retrieval.masked_new_to_user.slices.few_events"
CELL_FILE = "learner_cell.json"
# `hir evaluate` with one ranker seed (eval.ranker_seeds) and no "why this?": the cells read retrieval
# only, and the ranking section is independent of it (online_retail seed 0, base: the retrieval
# section was identical, its seconds aside, and evaluate took 37 s instead of 124 s, of which ranking
# 108 s). The cells of the first learner.json also carried `eval.ranking={}`, which Hydra merges
# into the arms' registry and so removes nothing. --with-ranking runs evaluate's defaults
NO_RANKING = ["eval.ranker_seeds=1", "eval.explain.pairs=0"]
# issue 19's targets (defaults, 2 cores, test split, mean of seeds 0, 1, 2)
MIN_RATIO = 1.03  # full >= 1.03 x base, with mean(full) - 2 sd(full) > mean(base)
FEW_RATIO = 1.05  # few-events slice, on FEW_DATASETS
FEW_DATASETS = ("online_retail", "completejourney")
BEGIN, END = markers("learner")


def git_sha() -> str | None:
    res = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return res.stdout.strip() or None


def same_code(shas: list[str]) -> bool:
    """Whether the commits ``shas`` have the same project code (everything but benchmarks/ and docs)."""
    paths = ["hir", "evaluation", "kernels", "conf", "pyproject.toml"]
    return all(subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", shas[0], sha, "--", *paths]).returncode == 0
               for sha in shas[1:])


def hir(*args: str) -> dict[str, Any]:
    """`hir <args>` from the checkout: wall seconds, and the error tail when it fails."""
    exe = Path(sys.executable).with_name("hir")
    t0 = time.perf_counter()
    res = subprocess.run([str(exe), *args], cwd=ROOT, capture_output=True, text=True)
    out = {"wall_s": round(time.perf_counter() - t0, 1)}
    if res.returncode != 0:
        out["error"] = f"hir {' '.join(args)} failed (rc {res.returncode}): {res.stderr[-2000:]}"
    return out


def cell_dir(dataset: str, arm: str, seed: int) -> Path:
    return ROOT / "outputs" / dataset / f"learner_{arm}_s{seed}"


def run_cell(dataset: str, arm: str, seed: int, snapshot: Path, ranking: bool) -> dict[str, Any]:
    """train, export and evaluate one cell; returns the stages' wall seconds (and the error, if one failed).
    ``ranking`` false: evaluate with NO_RANKING."""
    run_dir = cell_dir(dataset, arm, seed)
    common = [f"data={dataset}", f"run_name={run_dir.name}", f"seed={seed}", ARMS[arm],
              f"paths.graph_dir={snapshot / 'graph'}", f"paths.content_dir={snapshot / 'content'}"]
    evaluate = ["eval.hir_source=files", "eval.retrieval_arms=[hir]", "force=true", *([] if ranking else NO_RANKING)]
    stages = {"train": [], "export": [], "evaluate": evaluate}
    record: dict[str, Any] = {"git": git_sha(), "started": datetime.now(UTC).isoformat(timespec="seconds"),
                              "command": [f"hir <stage> {' '.join(common)}", *(f"hir {s} ... {' '.join(e)}" for s, e in
                                                                               stages.items() if e)], "wall_s": {}}
    for stage, extra in stages.items():
        res = hir(stage, *common, *extra)
        record["wall_s"][stage] = res["wall_s"]
        print(f"  {dataset} {arm} seed {seed}: {stage} {res['wall_s']:.0f}s", flush=True)
        if "error" in res:
            record["error"] = res["error"]
            print(res["error"], file=sys.stderr, flush=True)
            break
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CELL_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return record


def dotted(tree: dict[str, Any], path: str) -> Any:
    for key in path.split("."):
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def read_cell(dataset: str, arm: str, seed: int) -> dict[str, Any] | None:
    """The figures of a finished cell, or None when its report is missing."""
    run_dir = cell_dir(dataset, arm, seed)
    metrics_path, train_path = run_dir / "report" / "metrics.json", run_dir / "checkpoints" / "train_metrics.json"
    if not metrics_path.exists() or not train_path.exists():
        return None
    metrics, train = json.loads(metrics_path.read_text()), json.loads(train_path.read_text())
    cell = json.loads((run_dir / CELL_FILE).read_text()) if (run_dir / CELL_FILE).exists() else {}
    best, few = train.get("best") or {}, dotted(metrics, FEW) or {}
    seconds = train.get("seconds") or {}
    return {
        "recall@20": dotted(metrics, RECALL),
        "few_events_recall@20": dotted(few, "hir.recall@20"),
        "few_events_users": few.get("users"), "few_events_max": few.get("max_events"),
        "users": dotted(metrics, "retrieval.masked_new_to_user.users"),
        "train_s": seconds.get("fit"), "train_seconds": seconds,
        "epochs": train.get("epochs"), "stopped_by": train.get("stopped_by"),
        "spectral_rank": (train.get("spectral") or {}).get("rank"),
        "exported_epoch": best.get("epoch"), "exported_step": best.get("step"),
        "exported_base": best.get("epoch") == -1,
        "val_best": best.get("score"), "val_base": best.get("base_score"),
        "stage_wall_s": cell.get("wall_s"), "git": cell.get("git"), "started": cell.get("started"),
        "model_version": metrics.get("model_version"), "created": metrics.get("created"),
    }


def mean_sd(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def verdict(dataset: str, base: list[float], full: list[float], few_base: list[float],
            few_full: list[float]) -> dict[str, Any]:
    """The issue's targets on the seeds where both arms finished (``base``/``full`` paired by seed)."""
    mb, _ = mean_sd(base)
    mf, sdf = mean_sd(full)
    out: dict[str, Any] = {"seeds": len(base), "mean_base": mb, "mean_full": mf, "sd_full": sdf}
    if not base:
        return out | {"verdict": "no seed with both arms finished"}
    ratio = mf / mb if mb else None
    lower = mf - 2 * sdf if sdf is not None else None
    beats = ratio is not None and ratio >= MIN_RATIO and lower is not None and lower > mb
    out |= {"ratio": ratio, "full_minus_2sd": lower, f"beats_base_{MIN_RATIO}x_and_2sd": beats,
            "never_worse": mf >= mb}
    mfb, _ = mean_sd(few_base)
    mff, _ = mean_sd(few_full)
    few_ratio = mff / mfb if mfb else None
    out |= {"few_events_mean_base": mfb, "few_events_mean_full": mff, "few_events_ratio": few_ratio}
    if dataset in FEW_DATASETS:
        out[f"few_events_{FEW_RATIO}x"] = few_ratio is not None and few_ratio >= FEW_RATIO
    words = [f"full/base {ratio:.3f}" if ratio is not None else "full/base –",
             "beats the base (>= 1.03x, mean - 2 sd above the base)" if beats else
             "does not beat the base" + ("" if sdf is not None else " (one seed: no sd)"),
             "never worse" if mf >= mb else "WORSE than the base"]
    if dataset in FEW_DATASETS:
        words.append(f"few-events {few_ratio:.3f}x ({'meets' if out[f'few_events_{FEW_RATIO}x'] else 'misses'} "
                     f">= {FEW_RATIO}x)" if few_ratio is not None else "few-events –")
    if len(base) < 3:
        words.append(f"only {len(base)} of 3 seeds")
    return out | {"verdict": "; ".join(words)}


def collect(dataset: str, seeds: list[int]) -> dict[str, Any]:
    cells = {arm: {seed: read_cell(dataset, arm, seed) for seed in seeds} for arm in ARMS}

    def per_seed(arm: str, key: str) -> list[Any]:
        return [(cells[arm][s] or {}).get(key) for s in seeds]

    done = [s for s in seeds if all(cells[a][s] and cells[a][s]["recall@20"] is not None for a in ARMS)]

    def paired(arm: str, key: str) -> list[float]:
        return [v for s in done if (v := cells[arm][s][key]) is not None]

    gits = sorted({c["git"] for arm in cells.values() for c in arm.values() if c and c.get("git")})
    dates = sorted(c["created"] for arm in cells.values() for c in arm.values() if c and c.get("created"))
    return {
        "base": per_seed("base", "recall@20"), "full": per_seed("full", "recall@20"),
        "few_events": {"base": per_seed("base", "few_events_recall@20"), "full": per_seed("full", "few_events_recall@20"),
                       "users": next((c["few_events_users"] for a in cells.values() for c in a.values() if c), None),
                       "max_events": next((c["few_events_max"] for a in cells.values() for c in a.values() if c), None)},
        "train_s": per_seed("full", "train_s"),
        "seeds": seeds,
        "base_train_s": per_seed("base", "train_s"),
        "exported_epoch": {arm: per_seed(arm, "exported_epoch") for arm in ARMS},
        "exported_step": {arm: per_seed(arm, "exported_step") for arm in ARMS},
        "exported_base": {arm: per_seed(arm, "exported_base") for arm in ARMS},
        "val": {arm: {"best": per_seed(arm, "val_best"), "base": per_seed(arm, "val_base")} for arm in ARMS},
        "cell_wall_s": {arm: per_seed(arm, "stage_wall_s") for arm in ARMS},
        "missing": [f"{arm} seed {s}" for arm in ARMS for s in seeds if not cells[arm][s]],
        "verdict": verdict(dataset, paired("base", "recall@20"), paired("full", "recall@20"),
                           paired("base", "few_events_recall@20"), paired("full", "few_events_recall@20")),
        "cells": {arm: {str(s): c for s, c in v.items()} for arm, v in cells.items()},
        "git": gits[0] if len(gits) == 1 else gits or None,
        "git_same_code": same_code(gits) if gits else None,
        "date": dates[-1] if dates else None,
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
    }


def _f(x: Any, nd: int = 4) -> str:
    return "–" if x is None else f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def _wall(w: dict[str, float] | None) -> str:
    return "–" if not w else " + ".join(f"{w[s]:.0f}" for s in ("train", "export", "evaluate") if s in w)


def markdown(doc: dict[str, Any]) -> str:
    lines = [BEGIN, "## Learner: the full model against its spectral base (`python benchmarks/learner.py`)", "",
             "Test masked new-to-user recall@20 of hir (`retrieval.masked_new_to_user.hir.recall@20`), per seed, with "
             "defaults; `base` = `model.net.transformer=false`, `full` = the default model. Each cell trains, exports "
             "and evaluates on the dataset's one shared snapshot; few-events = the same metric over test users whose "
             "history has at most `eval.retrieval_few_events` events. Exported = the validation point export took "
             "(`base` = the step-0 spectral base). The base arm trains too: without the transformer, what trains "
             "is the knowledge (content) view of the nodes without engagement, so its val can move (online_retail) "
             "or not at all (beibei, which has no text). Train s: `seconds.fit` of train_metrics.json. Walls: train + export + evaluate seconds of the cell. Targets (issue "
             f"19): full >= {MIN_RATIO} x base with mean(full) - 2 sd(full) > mean(base) on three of four datasets; "
             f"never worse; few-events >= {FEW_RATIO} x on {' and '.join(FEW_DATASETS)}.", ""]
    for ds, r in doc.items():
        v = r["verdict"]
        if r["date"] is None:
            lines += [f"### {ds}", "", f"Not run (budget): every cell ({', '.join(r['missing'])}).", ""]
            continue
        git = r["git"] if isinstance(r["git"], str) else (
            f"{', '.join(r['git'])} ({'the same code: they differ in benchmarks/ and docs only' if r['git_same_code'] else 'DIFFERENT code'})")
        lines += [f"### {ds}", "", f"Measured {r['date']} on {r['machine']}, git {git}; few-events slice: "
                  f"{r['few_events']['users']} users (<= {r['few_events']['max_events']} events).", "",
                  "| seed | base | full | full / base | few-events base | few-events full | val base → best (full) | "
                  "exported base / full | train s base / full | walls base | walls full |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for i, s in enumerate(r["seeds"]):
            b, f = r["base"][i], r["full"][i]
            exported = " / ".join("–" if (ep := r["exported_epoch"][arm][i]) is None else "base" if ep == -1
                                  else f"epoch {ep}" for arm in ARMS)
            lines.append(
                f"| {s} | {_f(b)} | {_f(f)} | {_f(f / b, 3) if b and f is not None else '–'} | "
                f"{_f(r['few_events']['base'][i])} | {_f(r['few_events']['full'][i])} | "
                f"{_f(r['val']['full']['base'][i])} → {_f(r['val']['full']['best'][i])} | "
                f"{exported} | "
                f"{_f(r['base_train_s'][i], 0)} / {_f(r['train_s'][i], 0)} | {_wall(r['cell_wall_s']['base'][i])} | "
                f"{_wall(r['cell_wall_s']['full'][i])} |")
        lines += ["", f"Mean over the {v['seeds']} seed(s) with both arms: base {_f(v.get('mean_base'))}, full "
                  f"{_f(v.get('mean_full'))} (sd {_f(v.get('sd_full'))}). **Verdict:** {v['verdict']}."]
        if r["missing"]:
            lines.append(f"Not run (budget): {', '.join(r['missing'])}.")
        lines.append("")
    measured = {ds: r["verdict"] for ds, r in doc.items() if "ratio" in r["verdict"]}
    beats = [ds for ds, v in measured.items() if v[f"beats_base_{MIN_RATIO}x_and_2sd"]]
    worse = [ds for ds, v in measured.items() if not v["never_worse"]]
    lines += [f"**Across datasets:** the full model beats its base on {len(beats)} of the {len(measured)} datasets "
              f"measured ({', '.join(beats) or 'none'}; the target is three of four) and is worse than it on "
              f"{', '.join(worse) or 'none'}.", ""]
    return "\n".join(lines) + END + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--run-name", default="learner", help="the shared snapshot's run name")
    ap.add_argument("--reuse", action="store_true", help="read finished cells only; run nothing")
    ap.add_argument("--budget-min", type=float, default=None,
                    help="launch no new cell after this many minutes (the cells not run are listed as missing)")
    ap.add_argument("--with-ranking", action="store_true", help="evaluate with every ranker seed (defaults)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "learner.json")
    ap.add_argument("--md", type=Path, default=ROOT / "docs" / "results.md")
    args = ap.parse_args()
    t0 = time.monotonic()
    datasets = [d for d in args.datasets.split(",") if d]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    doc: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    failed = []
    for ds in datasets:
        snapshot = ROOT / "outputs" / ds / args.run_name
        if not args.reuse:
            over = args.budget_min is not None and (time.monotonic() - t0) / 60 > args.budget_min
            for stage in () if over else ("prepare", "enrich"):
                res = hir(stage, f"data={ds}", f"run_name={args.run_name}")
                print(f"{ds}: {stage} {res['wall_s']:.0f}s", flush=True)
                if "error" in res:
                    sys.exit(res["error"])
            for seed in seeds:
                for arm in ARMS:
                    if read_cell(ds, arm, seed) is not None:
                        continue
                    if args.budget_min is not None and (time.monotonic() - t0) / 60 > args.budget_min:
                        print(f"  {ds} {arm} seed {seed}: not started (over {args.budget_min} minutes)", flush=True)
                        continue
                    if "error" in run_cell(ds, arm, seed, snapshot, args.with_ranking):
                        failed.append(f"{ds} {arm} seed {seed}")
        doc[ds] = collect(ds, seeds)
        print(f"{ds}: base {doc[ds]['base']}, full {doc[ds]['full']}; {doc[ds]['verdict']['verdict']}", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        write_section(markdown(doc), args.md, "learner")
    print(markdown(doc))
    if failed:
        sys.exit(f"failed cells: {failed}")


if __name__ == "__main__":
    main()
