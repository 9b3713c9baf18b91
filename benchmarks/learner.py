"""Does the learner earn its place? The untrained base, the base with its knowledge view, and the
full model, on test, per seed, with paired intervals over users.

    python benchmarks/learner.py                                        # 4 datasets x seeds 0, 1, 2
    python benchmarks/learner.py --datasets online_retail --seeds 0     # one cell per arm
    python benchmarks/learner.py --budget-min 110                       # launch no cell after 110 minutes
    python benchmarks/learner.py --reuse                                # re-read finished cells, run nothing

Per dataset the snapshot is prepared and enriched once (``hir prepare|enrich data=<d>
run_name=learner``, reused when it exists). Then, for each seed and arm, one cell in its own run dir
``outputs/<d>/learner_<arm>_s<seed>`` reading that snapshot, with ``seed=<seed>`` and every other
setting at its default. What each arm trains (ARMS):

- ``untrained``: ``model.net.transformer=false``, one batch: the spectral base refit on
  train + val at export, the knowledge view (cold entities) untrained: the base as it is fitted;
- ``base``: ``model.net.transformer=false``: the same base, its knowledge view (content -> the
  base's space, for cold entities) and prototypes trained;
- ``full``: ``model.net.transformer=true``: also the transformer's user correction, trained on the
  training task (hir.model.task), exported only when it beats the base on val beyond the noise.

A cell runs ``hir train``, ``hir export`` and ``hir evaluate eval.hir_source=files
eval.retrieval_arms=[hir] force=true`` (with NO_RANKING's shortcuts unless ``--with-ranking``) and
reads the test masked new-to-user recall@20 of hir and its ``few_events`` slice from
``report/metrics.json``, each test user's value from ``report/retrieval_users.parquet``, and the
training seconds and the exported validation point from ``checkpoints/train_metrics.json``. A cell
whose report exists is not run again, so an interrupted run continues where it stopped.

The comparison: full / base (and full / untrained) as the ratio of the seeds' mean recall, with a
95% interval from a paired bootstrap over test users (the same users resampled in every seed and
both arms). Writes benchmarks/results/learner.json and the learner section of docs/results.md.
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
import polars as pl
from _results_md import markers, write_section  # benchmarks/ (the script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
DATASETS = ("online_retail", "beibei", "completejourney", "gowalla")
# untrained: one batch then the epoch's validation (`trainer.max_steps=1` stopped mid-epoch, before
# any validation, and early stopping failed on the missing metric: this round's three untrained
# cells did not run)
ARMS = {"untrained": ["model.net.transformer=false", "trainer.max_epochs=1", "+trainer.limit_train_batches=1"],
        "base": ["model.net.transformer=false"], "full": ["model.net.transformer=true"]}
TRAINS = {"untrained": "nothing: the spectral base (refit on train + val), knowledge view untrained",
          "base": "the knowledge view (cold entities) and the prototypes; users are the spectral base",
          "full": "also the transformer's user correction on the training task (hir.model.task)",
          "forced": "nothing more: the full cell's best epoch exported whether or not it beat the base on val"}
# `forced` re-exports the `full` cell's best.ckpt (no training of its own): what the correction does on
# test when the paired-noise rule is overridden
ARMS["forced"] = []
USERS_FILE = "retrieval_users.parquet"
RECALL = "retrieval.masked_new_to_user.hir.recall@20"
FEW = "retrieval.masked_new_to_user.slices.few_events"
CELL_FILE = "learner_cell.json"
# `hir evaluate` with one ranker seed (eval.ranker_seeds) and no "why this?": the cells read retrieval
# only, and the ranking section is independent of it (online_retail seed 0, base: the retrieval
# section was identical, its seconds aside, and evaluate took 37 s instead of 124 s, of which ranking
# 108 s). The cells of the first learner.json also carried `eval.ranking={}`, which Hydra merges
# into the arms' registry and so removes nothing. --with-ranking runs evaluate's defaults
NO_RANKING = ["eval.ranker_seeds=1", "eval.explain.pairs=0"]
# issue 24's targets (defaults, 2 cores, test split, seeds 0, 1, 2, paired bootstrap over users)
MIN_RATIO = 1.03  # full >= 1.03 x base, with the 95% interval of full / base above 1
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
    common = [f"data={dataset}", f"run_name={run_dir.name}", f"seed={seed}", *ARMS[arm],
              f"paths.graph_dir={snapshot / 'graph'}", f"paths.content_dir={snapshot / 'content'}"]
    evaluate = ["eval.hir_source=files", "eval.retrieval_arms=[hir]", "force=true", *([] if ranking else NO_RANKING)]
    stages = {"train": [], "export": [], "evaluate": evaluate}
    if arm == "forced":
        ckpts = cell_dir(dataset, "full", seed) / "checkpoints"
        if not (ckpts / "best.ckpt").exists():
            return {"error": f"{ckpts / 'best.ckpt'} is missing: run the full arm of seed {seed} first"}
        common.append(f"paths.checkpoint_dir={ckpts}")
        stages = {"export": [f"export.checkpoint={ckpts / 'best.ckpt'}"], "evaluate": evaluate}
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
    ckpt_dir = cell_dir(dataset, "full", seed) / "checkpoints" if arm == "forced" else run_dir / "checkpoints"
    metrics_path, train_path = run_dir / "report" / "metrics.json", ckpt_dir / "train_metrics.json"
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
        "task": {k: v for k, v in (train.get("task") or {}).items() if k != "inputs"} or None,
    }


def user_recall(dataset: str, arm: str, seed: int) -> pl.DataFrame | None:
    """A finished cell's per-user masked new-to-user recall@20 (``user_id``, ``few_events``, ``hir``)."""
    path = cell_dir(dataset, arm, seed) / "report" / USERS_FILE
    return pl.read_parquet(path, columns=["user_id", "few_events", "hir"]) if path.exists() else None


def paired_ratio(dataset: str, num: str, den: str, seeds: list[int], few: bool = False,
                 n_boot: int = 2000) -> dict[str, Any] | None:
    """mean recall of arm ``num`` over that of ``den``, pooled over ``seeds`` (each seed's users
    paired), with a 95% paired bootstrap interval over users (one resample of users serves every
    seed and both arms). ``few``: the few-events slice only. None when a cell lacks its users file."""
    nums, dens = [], []
    for s in seeds:
        a, b = user_recall(dataset, num, s), user_recall(dataset, den, s)
        if a is None or b is None:
            continue
        j = a.join(b, on="user_id", suffix="_den").drop_nulls(["hir", "hir_den"]).filter(
            pl.col("hir").is_not_nan() & pl.col("hir_den").is_not_nan()).sort("user_id")
        if few:
            j = j.filter(pl.col("few_events"))
        nums.append(j.select("user_id", pl.col("hir").alias(f"n{s}")))
        dens.append(j.select("user_id", pl.col("hir_den").alias(f"d{s}")))
    if not nums:
        return None
    frame = nums[0]
    for f in nums[1:] + dens:
        frame = frame.join(f, on="user_id")
    n = frame.select(pl.col(r"^n\d+$")).to_numpy().mean(axis=1)
    d = frame.select(pl.col(r"^d\d+$")).to_numpy().mean(axis=1)
    if not len(n) or d.mean() <= 0:
        return None
    rng = np.random.default_rng(0)
    boot = []
    for _ in range(0, n_boot, 100):
        idx = rng.integers(0, len(n), (100, len(n)))
        boot.append(n[idx].mean(axis=1) / np.maximum(d[idx].mean(axis=1), 1e-12))
    lo, hi = np.quantile(np.concatenate(boot), [0.025, 0.975])
    return {"ratio": float(n.mean() / d.mean()), "lo": float(lo), "hi": float(hi), "users": len(n),
            "seeds": len(nums), "mean_num": float(n.mean()), "mean_den": float(d.mean())}


def verdict(dataset: str, full_base: dict[str, Any] | None, few: dict[str, Any] | None) -> dict[str, Any]:
    """The issue's targets on the paired ratios of the seeds where both arms finished."""
    if full_base is None:
        return {"verdict": "no seed with both arms finished"}
    r, lo, hi = full_base["ratio"], full_base["lo"], full_base["hi"]
    beats = r >= MIN_RATIO and lo > 1
    out: dict[str, Any] = {"ratio": r, "interval": [lo, hi], "seeds": full_base["seeds"],
                           f"beats_base_{MIN_RATIO}x_interval_above_1": beats, "never_worse": hi >= 1}
    words = [f"full/base {r:.3f} [{lo:.3f}, {hi:.3f}]",
             "beats the base (>= 1.03x, interval above 1)" if beats else "does not beat the base by the target",
             "never worse" if hi >= 1 else "WORSE than the base (interval below 1)"]
    if few is not None:
        out["few_events_ratio"] = few["ratio"]
        out["few_events_interval"] = [few["lo"], few["hi"]]
        if dataset in FEW_DATASETS:
            out[f"few_events_{FEW_RATIO}x"] = few["ratio"] >= FEW_RATIO
            words.append(f"few-events {few['ratio']:.3f}x [{few['lo']:.3f}, {few['hi']:.3f}] "
                         f"({'meets' if out[f'few_events_{FEW_RATIO}x'] else 'misses'} >= {FEW_RATIO}x)")
    if full_base["seeds"] < 3:
        words.append(f"only {full_base['seeds']} of 3 seeds")
    return out | {"verdict": "; ".join(words)}


def collect(dataset: str, seeds: list[int]) -> dict[str, Any]:
    cells = {arm: {seed: read_cell(dataset, arm, seed) for seed in seeds} for arm in ARMS}

    def per_seed(arm: str, key: str) -> list[Any]:
        return [(cells[arm][s] or {}).get(key) for s in seeds]

    done = [s for s in seeds if all(cells[a][s] for a in ("base", "full"))]
    ratios = {f"{a}/{b}": paired_ratio(dataset, a, b, seeds) for a, b in
              (("full", "base"), ("full", "untrained"), ("base", "untrained"), ("forced", "base"))}
    few = paired_ratio(dataset, "full", "base", seeds, few=True)
    gits = sorted({c["git"] for arm in cells.values() for c in arm.values() if c and c.get("git")})
    dates = sorted(c["created"] for arm in cells.values() for c in arm.values() if c and c.get("created"))
    return {
        "arms": {arm: {"overrides": ARMS[arm], "trains": TRAINS[arm]} for arm in ARMS},
        **{arm: per_seed(arm, "recall@20") for arm in ARMS},
        "few_events": {**{arm: per_seed(arm, "few_events_recall@20") for arm in ARMS},
                       "users": next((c["few_events_users"] for a in cells.values() for c in a.values() if c), None),
                       "max_events": next((c["few_events_max"] for a in cells.values() for c in a.values() if c), None)},
        "paired": ratios, "paired_few_events_full/base": few,
        "seeds": seeds, "seeds_done": done,
        "train_s": {arm: per_seed(arm, "train_s") for arm in ARMS},
        "exported_epoch": {arm: per_seed(arm, "exported_epoch") for arm in ARMS},
        "exported_base": {arm: per_seed(arm, "exported_base") for arm in ARMS},
        "val": {arm: {"best": per_seed(arm, "val_best"), "base": per_seed(arm, "val_base")} for arm in ARMS},
        "task": per_seed("full", "task"),
        "cell_wall_s": {arm: per_seed(arm, "stage_wall_s") for arm in ARMS},
        "missing": [f"{arm} seed {s}" for arm in ARMS for s in seeds if not cells[arm][s]],
        "verdict": verdict(dataset, ratios["full/base"], few),
        "cells": {arm: {str(s): c for s, c in v.items()} for arm, v in cells.items()},
        "git": gits[0] if len(gits) == 1 else gits or None,
        "git_same_code": same_code(gits) if gits else None,
        "date": dates[-1] if dates else None,
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
    }


def _f(x: Any, nd: int = 4) -> str:
    return "–" if x is None else f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def _ratio(r: dict[str, Any] | None) -> str:
    return "–" if not r else f"{r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}] ({r['users']} users, {r['seeds']} seeds)"


def markdown(doc: dict[str, Any]) -> str:
    arms = "; ".join(f"`{a}` = `{' '.join(o)}` (trains {TRAINS[a]})" for a, o in ARMS.items())
    lines = [BEGIN, "## Learner: the full model against its spectral base (`python benchmarks/learner.py`)", "",
             "Test masked new-to-user recall@20 of hir, per seed, with defaults: " + arms + ". Each cell trains, "
             "exports and evaluates on the dataset's one shared snapshot. Ratios: the seeds' mean recall of one arm "
             "over another's, with a 95% paired bootstrap interval over test users; few-events = users whose "
             "history has at most `eval.retrieval_few_events` events. Exported = the validation point export took "
             f"(`base` = the step-0 base). Targets (issue 24): full >= {MIN_RATIO} x base with the interval above 1 "
             f"on three of four datasets; never worse (no interval entirely below 1); few-events >= {FEW_RATIO} x on "
             f"{' and '.join(FEW_DATASETS)}.", ""]
    for ds, r in doc.items():
        if r.get("date") is None or "arms" not in r:
            lines += [f"### {ds}", "", f"Not run (budget): every cell ({', '.join(r.get('missing', []))}).", ""]
            continue
        git = r["git"] if isinstance(r["git"], str) else (
            f"{', '.join(r['git'])} ({'the same code: they differ in benchmarks/ and docs only' if r['git_same_code'] else 'DIFFERENT code'})")
        lines += [f"### {ds}", "", f"Measured {r['date']} on {r['machine']}, git {git}.", "",
                  "| seed | untrained | base | full | forced | val base → best (full) | exported (full) | train s (full) |",
                  "|---|---|---|---|---|---|---|---|"]
        for i, s in enumerate(r["seeds"]):
            ep = r["exported_epoch"]["full"][i]
            lines.append(f"| {s} | {_f(r['untrained'][i])} | {_f(r['base'][i])} | {_f(r['full'][i])} | "
                         f"{_f((r.get('forced') or [None] * len(r['seeds']))[i])} | "
                         f"{_f(r['val']['full']['base'][i])} → {_f(r['val']['full']['best'][i])} | "
                         f"{'–' if ep is None else 'base' if ep == -1 else f'epoch {ep}'} | {_f(r['train_s']['full'][i], 0)} |")
        p = r["paired"]
        lines += ["", f"- full / base: {_ratio(p['full/base'])}", f"- full / untrained: {_ratio(p['full/untrained'])}",
                  f"- base / untrained: {_ratio(p['base/untrained'])}",
                  f"- forced (the correction exported anyway) / base: {_ratio(p.get('forced/base'))}",
                  f"- few-events full / base: {_ratio(r['paired_few_events_full/base'])}",
                  f"- **Verdict:** {r['verdict']['verdict']}."]
        if r["missing"]:
            lines.append(f"- Not run (budget): {', '.join(r['missing'])}.")
        lines.append("")
    measured = {ds: r["verdict"] for ds, r in doc.items() if "ratio" in r.get("verdict", {})}
    beats = [ds for ds, v in measured.items() if v.get(f"beats_base_{MIN_RATIO}x_interval_above_1")]
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
        print(f"{ds}: untrained {doc[ds]['untrained']}, base {doc[ds]['base']}, full {doc[ds]['full']}; "
              f"{doc[ds]['verdict']['verdict']}", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        write_section(markdown(doc), args.md, "learner")
    print(markdown(doc))
    if failed:
        sys.exit(f"failed cells: {failed}")


if __name__ == "__main__":
    main()
