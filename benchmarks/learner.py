"""Does the learner earn its place? The untrained base, the base with its knowledge view, and the
full model, on test, per seed, with paired intervals over users.

    python benchmarks/learner.py                                        # 4 datasets x seeds 0, 1, 2
    python benchmarks/learner.py --datasets online_retail --seeds 0     # one cell per arm
    python benchmarks/learner.py --budget-min 110                       # launch no cell after 110 minutes
    python benchmarks/learner.py --reuse                                # re-read finished cells, run nothing
    python benchmarks/learner.py --arms full,forced --seeds 1           # some arms only (the rest are read)
    python benchmarks/learner.py --datasets online_retail --arms base --ablate   # the parts, on the base arm

Per dataset the snapshot is prepared and enriched once (``hir prepare|enrich data=<d>
run_name=learner``, reused when it exists). Then, for each seed and arm, one cell in its own run dir
``outputs/<d>/learner_<arm>_s<seed>`` reading that snapshot, with ``seed=<seed>`` and every other
setting at its default. What each arm trains (ARMS):

- ``untrained``: ``model.net.transformer=false``, one batch: the spectral base refit on
  train + val at export, the knowledge view (cold entities) untrained: the base as it is fitted;
- ``base``: ``model.net.transformer=false``: the same base, its knowledge view (content -> the
  base's space, for cold entities) and prototypes trained;
- ``full``: the same seed's ``base`` cell, then the transformer's user correction alone
  (``model.net.transformer=true model.train_parts=correction model.warm_start=<base cell>``:
  hir/train/warm.py; every other weight and the basis are the base cell's), trained on the
  training task (hir.model.task) and exported behind its evidence gate (hir.model.gate): the
  users with at most the gate's events get the correction, the others their base; the gate is
  fit on val and closes where the correction does not beat the base beyond the paired noise, and
  then the export is the base cell's model exactly;
- ``forced``: the full cell's best epoch exported with the correction for everybody
  (``export.user_gate=open``): what the correction does on test without the gate.

With ``--ablate``, per seed and per part of ABLATIONS, also ``ablate_<part>``: the base arm
with ``+ablation=<part>`` (conf/ablation/<part>.yaml), compared with the base arm on all users,
users with <= 5 events and item-cold. The transformer runs in the base arm too, as the knowledge
view's encoder (trained by distillation from the engagement view), so its parts are judged there.

A cell runs ``hir train``, ``hir export`` and ``hir evaluate eval.hir_source=files
eval.retrieval_arms=[hir] force=true`` (with NO_RANKING's shortcuts unless ``--with-ranking``) and
reads the test masked new-to-user recall@20 of hir from ``report/metrics.json``, each test
user's value, item-cold value and history size from ``report/retrieval_users.parquet``, and the
training seconds, the exported validation point and its evidence gate from
``checkpoints/train_metrics.json``. A cell whose report exists is not run again, so an
interrupted run continues where it stopped.

Slices (SLICES): all test users; users by history size (events before the test period, as
``eval.retrieval_few_events`` counts them: <= 5, 6-20, > 20); item-cold (the held-out entities
first seen in the test period, per user that has one). Per slice, every arm's mean over seeds and
the paired ratios full / base, forced / base, forced / full (what the gate saved or cost), base /
untrained, full / untrained: the seeds' mean
recall of one arm over another's, with a 95% interval from a paired bootstrap over test users
(the same users resampled in every seed and both arms). Writes benchmarks/results/learner.json
and the learner section of docs/results.md.
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
# untrained: nothing learns (model.train_parts=none: the step-0 model, prototypes by k-means, the
# knowledge view as initialised; the default since 2026-12-04: model.train_parts=auto). Until then
# this arm was one batch then the epoch's validation (online_retail: the same test recall, per seed,
# to the last digit). base: the knowledge view, scale heads and prototypes trained (model.train_parts=all)
ARMS = {"untrained": ["model.net.transformer=false", "model.train_parts=none"],
        "base": ["model.net.transformer=false", "model.train_parts=all"],
        # the correction alone, trained on the same seed's base cell (its weights and basis: hir/train/warm.py),
        # so a closed gate exports the base cell's model exactly; run_cell adds model.warm_start
        "full": ["model.net.transformer=true", "model.train_parts=correction"]}
TRAINS = {"untrained": "nothing (the default): the spectral base (refit on train + val), knowledge view untrained",
          "base": "the knowledge view (cold entities) and the prototypes; users are the spectral base",
          "full": "the base cell's model, then the transformer's user correction alone on the training task "
                  "(hir.model.task; everything else frozen), exported behind the evidence gate fit on val",
          "forced": "nothing more: the full cell's best epoch exported with the correction for every user"}
# `forced` re-exports the `full` cell's best.ckpt (no training of its own): what the correction does on
# test when the paired-noise rule is overridden
ARMS["forced"] = ["export.user_gate=open"]
# --ablate: the base arm with one trained part taken away (conf/ablation/<part>.yaml). Without the
# correction the transformer still runs: it is the knowledge view's encoder (hir.nn.HirNet._knowledge),
# trained by distillation from the engagement view, and the knowledge view is what the base arm adds
# over the untrained one (users with few events, cold entities); so the seed's parts are ablated here
ABLATIONS = {"no_bias_table": "no learned bucket bias T_h[qb, kb] in the attention",
             "no_exposure": "no exposure/popularity term in the attention",
             "no_primitives": "no interest-primitive (level-0 prototype) tokens in the contexts",
             "no_distill": "no cross-view distillation and no align loss"}
ABLATE_SLICES = ("all", "events<=5", "no history", "events 1-5", "item_cold")
USERS_FILE = "retrieval_users.parquet"
# slice name -> (lowest, highest) history events of its users, or the per-user column it reads
# (events<=5 is split too: on online_retail 302 of its 335 test users have no event before the test
# period, so the knowledge view embeds them and no user correction can reach them)
SLICES: dict[str, tuple[float, float] | str] = {"all": (0, float("inf")), "events<=5": (0, 5),
                                               "no history": (0, 0), "events 1-5": (1, 5),
                                               "events 6-20": (6, 20), "events>20": (21, float("inf")),
                                               "item_cold": "hir__item_cold@20"}
# forced / full: the correction for everybody against the gated export (what the gate saved or cost)
PAIRS = (("full", "base"), ("forced", "base"), ("forced", "full"), ("base", "untrained"), ("full", "untrained"))
RECALL = "retrieval.masked_new_to_user.hir.recall@20"
ITEM_COLD = "retrieval.masked_new_to_user.slices.item_cold.hir.recall@20"
CELL_FILE = "learner_cell.json"
# `hir evaluate` with one ranker seed (eval.ranker_seeds) and no "why this?": the cells read retrieval
# only, and the ranking section is independent of it (online_retail seed 0, base: the retrieval
# section was identical, its seconds aside, and evaluate took 37 s instead of 124 s, of which ranking
# 108 s). The cells of the first learner.json also carried `eval.ranking={}`, which Hydra merges
# into the arms' registry and so removes nothing. --with-ranking runs evaluate's defaults
NO_RANKING = ["eval.ranker_seeds=1", "eval.explain.pairs=0"]
# issue 32's targets (defaults, 2 cores, test split, seeds 0, 1, 2, paired bootstrap over users)
MIN_RATIO = 1.03  # full >= 1.03 x base, with the 95% interval of full / base above 1
NEVER_WORSE_LO = 0.99  # all users: full / base >= 1.00 with the interval's low end >= 0.99
SPARSE_RATIO = 1.20  # users with <= 5 events, on SPARSE_DATASETS
SPARSE_DATASETS = ("online_retail", "completejourney")
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


def arm_overrides(arm: str) -> list[str]:
    """The arm's Hydra overrides: ARMS, or an ablation (``ablate_<part>``: the base arm less that part)."""
    if arm.startswith("ablate_"):
        return [*ARMS["base"], f"+ablation={arm.removeprefix('ablate_')}"]
    return ARMS[arm]


def cell_dir(dataset: str, arm: str, seed: int) -> Path:
    return ROOT / "outputs" / dataset / f"learner_{arm}_s{seed}"


def run_cell(dataset: str, arm: str, seed: int, snapshot: Path, ranking: bool,
             overrides: tuple[str, ...] = ()) -> dict[str, Any]:
    """train, export and evaluate one cell; returns the stages' wall seconds (and the error, if one failed).
    ``ranking`` false: evaluate with NO_RANKING. ``overrides`` (--override) go to every stage."""
    run_dir = cell_dir(dataset, arm, seed)
    common = [f"data={dataset}", f"run_name={run_dir.name}", f"seed={seed}", *arm_overrides(arm), *overrides,
              f"paths.graph_dir={snapshot / 'graph'}", f"paths.content_dir={snapshot / 'content'}"]
    evaluate = evaluate_overrides(ranking)
    stages = {"train": [], "export": [], "evaluate": evaluate}
    if arm == "full":
        base = cell_dir(dataset, "base", seed) / "checkpoints"
        if not (base / "train_metrics.json").exists():
            return {"error": f"{base / 'train_metrics.json'} is missing: run the base arm of seed {seed} first"}
        common.append(f"model.warm_start={base}")
    if arm == "forced":
        ckpts = cell_dir(dataset, "full", seed) / "checkpoints"
        if not (ckpts / "best.ckpt").exists():
            return {"error": f"{ckpts / 'best.ckpt'} is missing: run the full arm of seed {seed} first"}
        common.append(f"paths.checkpoint_dir={ckpts}")
        stages = {"export": [f"export.checkpoint={ckpts / 'best.ckpt'}", "force=true"], "evaluate": evaluate}
    return run_stages(run_dir, common, stages, f"{dataset} {arm} seed {seed}")


def evaluate_overrides(ranking: bool = False) -> list[str]:
    """`hir evaluate`'s overrides for a cell: hir's exported files, retrieval of hir alone, and
    NO_RANKING unless ``ranking``."""
    return ["eval.hir_source=files", "eval.retrieval_arms=[hir]", "force=true", *([] if ranking else NO_RANKING)]


def run_stages(run_dir: Path, common: list[str], stages: dict[str, list[str]], label: str) -> dict[str, Any]:
    """`hir <stage> <common> <extra>` for each of ``stages`` (stage -> extra overrides) in order,
    stopping at the first failure; writes and returns the cell record (git, start, commands, wall
    seconds per stage, the error)."""
    record: dict[str, Any] = {"git": git_sha(), "started": datetime.now(UTC).isoformat(timespec="seconds"),
                              "command": [f"hir <stage> {' '.join(common)}", *(f"hir {s} ... {' '.join(e)}" for s, e in
                                                                               stages.items() if e)], "wall_s": {}}
    for stage, extra in stages.items():
        res = hir(stage, *common, *extra)
        record["wall_s"][stage] = res["wall_s"]
        print(f"  {label}: {stage} {res['wall_s']:.0f}s", flush=True)
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
    emb_meta = run_dir / "embeddings" / "meta.json"
    meta = json.loads(emb_meta.read_text()) if emb_meta.exists() else {}
    exported_gate = meta.get("user_gate")
    best = train.get("best") or {}
    seconds = train.get("seconds") or {}
    return {
        "recall@20": dotted(metrics, RECALL),
        "item_cold_recall@20": dotted(metrics, ITEM_COLD),
        "users": dotted(metrics, "retrieval.masked_new_to_user.users"),
        "train_s": seconds.get("fit"), "train_seconds": seconds,
        "epochs": train.get("epochs"), "stopped_by": train.get("stopped_by"),
        "spectral_rank": (train.get("spectral") or {}).get("rank"),
        "exported_epoch": best.get("epoch"), "exported_step": best.get("step"),
        "exported_base": best.get("epoch") == -1, "why": best.get("why"),
        "val_best": best.get("score"), "val_base": best.get("base_score"),
        # the evidence gate fit on val (train_metrics.json) and the one the export applied (meta.json)
        "gate": best.get("gate"), "exported_gate": exported_gate,
        # the cold placement's boost, chosen on val (hir/export/cold.py): the item-cold slice follows it
        "cold_boost": (meta.get("cold_placement") or {}).get("boost"),
        "stage_wall_s": cell.get("wall_s"), "git": cell.get("git"), "started": cell.get("started"),
        "model_version": metrics.get("model_version"), "created": metrics.get("created"),
        "task": {k: v for k, v in (train.get("task") or {}).items() if k != "inputs"} or None,
    }


def user_recall(dataset: str, arm: str, seed: int, slice_: str = "all") -> pl.DataFrame | None:
    """A finished cell's per-user recall@20 on ``slice_`` (SLICES) as (``user_id``, ``hir``),
    users outside the slice (or without a value there) dropped; None without its users file."""
    path = cell_dir(dataset, arm, seed) / "report" / USERS_FILE
    if not path.exists():
        return None
    frame = pl.read_parquet(path)
    how = SLICES[slice_]
    if isinstance(how, str):
        if how not in frame.columns:
            return None
        frame = frame.select("user_id", pl.col(how).alias("hir"))
    else:
        lo, hi = how
        frame = frame.filter(pl.col("history_events").is_between(lo, hi)).select("user_id", "hir")
    return frame.filter(pl.col("hir").is_not_null() & pl.col("hir").is_not_nan())


def paired_ratio(dataset: str, num: str, den: str, seeds: list[int], slice_: str = "all",
                 n_boot: int = 2000) -> dict[str, Any] | None:
    """mean recall of arm ``num`` over that of ``den`` on ``slice_``, pooled over ``seeds`` (each
    seed's users paired), with a 95% paired bootstrap interval over users (one resample of users
    serves every seed and both arms). None when no seed has both cells' users files."""
    nums, dens = [], []
    for s in seeds:
        a, b = user_recall(dataset, num, s, slice_), user_recall(dataset, den, s, slice_)
        if a is None or b is None:
            continue
        j = a.join(b, on="user_id", suffix="_den").sort("user_id")
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


def slice_means(dataset: str, arm: str, seeds: list[int], slice_: str) -> dict[str, Any]:
    """Per seed, the arm's mean recall@20 over the slice's users (None: cell missing), and the users."""
    frames = [user_recall(dataset, arm, s, slice_) for s in seeds]
    return {"per_seed": [None if f is None or not f.height else float(f["hir"].mean()) for f in frames],
            "users": next((f.height for f in frames if f is not None), None)}


def verdict(dataset: str, paired: dict[str, dict[str, Any]], num: str = "full", den: str = "base") -> dict[str, Any]:
    """The targets (issue 32) on the paired ratios ``num / den`` of the seeds where both arms
    finished: never worse (all users: >= 1.00, low end >= 0.99), helps overall (>= 1.03, interval
    above 1), sparse users (<= 5 events: >= 1.20, interval above 1, on SPARSE_DATASETS). The issue's
    pair is full / base (the correction); base / untrained asks the same of training the knowledge view."""
    key = f"{num}/{den}"
    full_base = paired["all"].get(key)
    if full_base is None:
        return {"verdict": "no seed with both arms finished"}
    r, lo, hi = full_base["ratio"], full_base["lo"], full_base["hi"]
    beats = r >= MIN_RATIO and lo > 1
    never_worse = r >= 1.0 and lo >= NEVER_WORSE_LO
    out: dict[str, Any] = {"pair": key, "ratio": r, "interval": [lo, hi], "seeds": full_base["seeds"],
                           f"beats_base_{MIN_RATIO}x_interval_above_1": beats, "never_worse": never_worse}
    words = [f"{key} {r:.3f} [{lo:.3f}, {hi:.3f}]",
             "helps (>= 1.03x, interval above 1)" if beats else "does not help by 1.03x",
             "never worse (>= 1.00, low end >= 0.99)" if never_worse else "NOT never-worse (< 1.00 or low end < 0.99)"]
    sparse = paired["events<=5"].get(key)
    if sparse is not None:
        out["sparse_ratio"], out["sparse_interval"] = sparse["ratio"], [sparse["lo"], sparse["hi"]]
        out["sparse_gains"] = sparse["ratio"] > 1 and sparse["lo"] > 1
        target = dataset in SPARSE_DATASETS
        if target:
            out[f"sparse_{SPARSE_RATIO}x"] = sparse["ratio"] >= SPARSE_RATIO and sparse["lo"] > 1
        words.append(f"users <= 5 events {sparse['ratio']:.3f}x [{sparse['lo']:.3f}, {sparse['hi']:.3f}]"
                     + (f" ({'meets' if out[f'sparse_{SPARSE_RATIO}x'] else 'misses'} >= {SPARSE_RATIO}x)" if target else ""))
    if full_base["seeds"] < 3:
        words.append(f"only {full_base['seeds']} of 3 seeds")
    return out | {"verdict": "; ".join(words)}


def ablation(dataset: str, seeds: list[int]) -> dict[str, Any]:
    """Per part of ABLATIONS with a finished cell: the base arm without it against the base arm, per
    slice of ABLATE_SLICES (paired ratio, seeds pooled; below 1: the part helps)."""
    out = {}
    for part, what in ABLATIONS.items():
        arm = f"ablate_{part}"
        cells = {s: read_cell(dataset, arm, s) for s in seeds}
        if not any(cells.values()):
            continue
        out[part] = {"what": what, "overrides": arm_overrides(arm),
                     "recall@20": [(c or {}).get("recall@20") for c in cells.values()],
                     "seeds_done": [s for s, c in cells.items() if c],
                     "paired_over_base": {sl: paired_ratio(dataset, arm, "base", seeds, sl) for sl in ABLATE_SLICES},
                     "train_s": [(c or {}).get("train_s") for c in cells.values()],
                     "cold_boost": [(c or {}).get("cold_boost") for c in cells.values()],
                     "git": sorted({c["git"] for c in cells.values() if c and c.get("git")})}
    return out


def default_transformer() -> str:
    """``model.net.transformer`` as conf/model/hir.yaml sets it (lower-case, as Hydra writes it)."""
    from omegaconf import OmegaConf

    return str(OmegaConf.load(ROOT / "conf" / "model" / "hir.yaml").net.transformer).lower()


def ablation_reading(paired: dict[str, dict[str, Any] | None]) -> str:
    """What the intervals say of a part (the user slices only: item-cold follows the boost):
    inert (every ratio exactly 1), helps (taking it away loses beyond the noise on a slice),
    costs (taking it away gains beyond the noise), or no measurable effect."""
    got = {sl: r for sl, r in paired.items() if r and sl != "item_cold"}
    if got and all(r["ratio"] == 1.0 and r["lo"] == 1.0 and r["hi"] == 1.0 for r in got.values()):
        return "inert: exactly the base arm's export"
    helps = [sl for sl, r in got.items() if r["hi"] < 1.0]
    costs = [sl for sl, r in got.items() if r["lo"] > 1.0]
    if helps and not costs:
        return f"helps ({', '.join(helps)})"
    if costs and not helps:
        return f"costs ({', '.join(costs)})"
    return "mixed" if helps else "no measurable effect"


def collect(dataset: str, seeds: list[int]) -> dict[str, Any]:
    cells = {arm: {seed: read_cell(dataset, arm, seed) for seed in seeds} for arm in ARMS}

    def per_seed(arm: str, key: str) -> list[Any]:
        return [(cells[arm][s] or {}).get(key) for s in seeds]

    done = [s for s in seeds if all(cells[a][s] for a in ("base", "full"))]
    paired = {sl: {f"{a}/{b}": paired_ratio(dataset, a, b, seeds, sl) for a, b in PAIRS} for sl in SLICES}
    slices = {sl: {arm: slice_means(dataset, arm, seeds, sl) for arm in ARMS} for sl in SLICES}
    gits = sorted({c["git"] for arm in cells.values() for c in arm.values() if c and c.get("git")})
    dates = sorted(c["created"] for arm in cells.values() for c in arm.values() if c and c.get("created"))
    return {
        "arms": {arm: {"overrides": ARMS[arm], "trains": TRAINS[arm]} for arm in ARMS},
        **{arm: per_seed(arm, "recall@20") for arm in ARMS},
        "slices": slices, "paired": paired,
        "gate": {"fit_on_val": per_seed("full", "gate"), "exported": per_seed("full", "exported_gate")},
        "seeds": seeds, "seeds_done": done,
        "train_s": {arm: per_seed(arm, "train_s") for arm in ARMS},
        "exported_epoch": {arm: per_seed(arm, "exported_epoch") for arm in ARMS},
        "exported_base": {arm: per_seed(arm, "exported_base") for arm in ARMS},
        "cold_boost": {arm: per_seed(arm, "cold_boost") for arm in ARMS},
        "why": per_seed("full", "why"),
        "val": {arm: {"best": per_seed(arm, "val_best"), "base": per_seed(arm, "val_base")} for arm in ARMS},
        "task": per_seed("full", "task"),
        "cell_wall_s": {arm: per_seed(arm, "stage_wall_s") for arm in ARMS},
        "missing": [f"{arm} seed {s}" for arm in ARMS for s in seeds if not cells[arm][s]],
        "verdict": verdict(dataset, paired),
        # the same targets for what the default trains (the knowledge view, the prototypes) over the
        # training-free base
        "verdict_default_training": verdict(dataset, paired, "base", "untrained"),
        "ablation": ablation(dataset, seeds),
        "cells": {arm: {str(s): c for s, c in v.items()} for arm, v in cells.items()},
        "git": gits[0] if len(gits) == 1 else gits or None,
        "git_same_code": same_code(gits) if gits else None,
        "date": dates[-1] if dates else None,
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
    }


def _f(x: Any, nd: int = 4) -> str:
    return "–" if x is None else f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def _ratio(r: dict[str, Any] | None) -> str:
    return "–" if not r else f"{r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]"


def _gate(g: dict[str, Any] | None) -> str:
    if not g:
        return "–"
    tau = g.get("max_events")
    return "none" if tau is None else "closed" if tau == 0 else f"<= {tau:g} events"


def _mean(xs: list[float | None]) -> float | None:
    got = [x for x in xs if x is not None]
    return float(np.mean(got)) if got else None


def markdown(doc: dict[str, Any]) -> str:
    arms = "; ".join(f"`{a}` = `{' '.join(o) or '(no override)'}` (trains {TRAINS[a]})" for a, o in ARMS.items())
    lines = [BEGIN, "## Learner: the full model against its spectral base (`python benchmarks/learner.py`)", "",
             "Test masked new-to-user recall@20 of hir with defaults: " + arms + ". Each cell trains, exports and "
             "evaluates on the dataset's one shared snapshot. Slices: users by history size (events before the test "
             "period, as `eval.retrieval_few_events` counts them) and item-cold (held-out entities first seen in the "
             "test period). Ratios: the seeds' mean recall of one arm over another's on the slice, with a 95% paired "
             "bootstrap interval over test users, seeds pooled. Gate = the evidence gate of the correction fit on val "
             "(users with at most that many events get it; hir/model/gate.py). Targets (issue 32): never worse (full / "
             f"base >= 1.00 with the low end >= {NEVER_WORSE_LO}); helps (>= {MIN_RATIO}, interval above 1); users <= 5 "
             f"events >= {SPARSE_RATIO} with the interval above 1 on {' and '.join(SPARSE_DATASETS)}.", ""]
    for ds, r in doc.items():
        if r.get("date") is None or "slices" not in r:
            lines += [f"### {ds}", "", f"Not run (budget): every cell ({', '.join(r.get('missing', []))}).", ""]
            continue
        git = r["git"] if isinstance(r["git"], str) else (
            f"{', '.join(r['git'])} ({'the same code: they differ in benchmarks/ and docs only' if r['git_same_code'] else 'DIFFERENT code'})")
        lines += [f"### {ds}", "", f"Measured {r['date']} on {r['machine']}, git {git}.", "",
                  "| seed | untrained | base | full | forced | val base → best (full) | exported (full) | gate (full) | "
                  "train s (full) | cold boost (untrained / base / full) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for i, s in enumerate(r["seeds"]):
            ep = r["exported_epoch"]["full"][i]
            lines.append(f"| {s} | {_f(r['untrained'][i])} | {_f(r['base'][i])} | {_f(r['full'][i])} | "
                         f"{_f(r['forced'][i])} | {_f(r['val']['full']['base'][i])} → {_f(r['val']['full']['best'][i])} | "
                         f"{'–' if ep is None else 'base' if ep == -1 else f'epoch {ep}'} | "
                         f"{_gate(r['gate']['fit_on_val'][i])} | {_f(r['train_s']['full'][i], 0)} | "
                         + " / ".join(_f(r["cold_boost"][a][i], 2) for a in ("untrained", "base", "full")) + " |")
        lines += ["", "| slice | users | untrained | base | full | forced | full / base | forced / base | "
                  "forced / full | base / untrained |", "|---|---|---|---|---|---|---|---|---|---|"]
        for sl in SLICES:
            m, p = r["slices"][sl], r["paired"][sl]
            users = next((m[a]["users"] for a in ARMS if m[a]["users"]), None)
            lines.append(f"| {sl} | {_f(users)} | " + " | ".join(_f(_mean(m[a]["per_seed"])) for a in ARMS) + " | "
                         + " | ".join(_ratio(p[k]) for k in ("full/base", "forced/base", "forced/full", "base/untrained")) + " |")
        lines += ["", f"- **Verdict (the correction, the issue's targets):** {r['verdict']['verdict']}."]
        if r.get("verdict_default_training"):
            lines.append("- **The same targets for training the knowledge view and the prototypes (base: "
                         "`model.train_parts=all`, the default until 2026-12-04) over the untrained model (the "
                         f"default since):** {r['verdict_default_training']['verdict']}.")
        if r.get("ablation"):
            lines += ["", "Ablation (`--ablate`): the base arm with one part taken away (`+ablation=<part>`: "
                      "conf/ablation/), over the base arm, paired, seeds pooled; below 1 the part helps. The "
                      "transformer is the knowledge view's encoder in the base arm, so its parts act there.", "",
                      "| part taken away | seeds | " + " | ".join(ABLATE_SLICES) + " | cold boost (seeds) | reading |",
                      "|---|---|" + "---|" * len(ABLATE_SLICES) + "---|---|"]
            base_boosts = " / ".join(_f(b, 2) for b in r["cold_boost"]["base"])
            for part, a in r["ablation"].items():
                lines.append(f"| {part} ({a['what']}) | {len(a['seeds_done'])} | "
                             + " | ".join(_ratio(a["paired_over_base"][sl]) for sl in ABLATE_SLICES) + " | "
                             + " / ".join(_f(b, 2) for b in a["cold_boost"]) + f" (base {base_boosts}) | "
                             + ablation_reading(a["paired_over_base"]) + " |")
            lines.append("")
            lines.append("The item-cold column follows the cold placement's boost, chosen on val per cell "
                         "(hir/export/cold.py): where a cell chose another boost than the base cell, that column "
                         "measures the boost, not the part. What is off by default (conf/model/hir.yaml): "
                         f"the user correction (`model.net.transformer={default_transformer()}`); an inert part "
                         "above acts only inside it (the knowledge view's contexts carry no exposure).")
        if r["missing"]:
            lines.append(f"- Not run (budget): {', '.join(r['missing'])}.")
        lines.append("")
    return "\n".join(lines) + END + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--arms", default=",".join(ARMS), help="the arms to run (the others are read when they exist)")
    ap.add_argument("--run-name", default="learner", help="the shared snapshot's run name")
    ap.add_argument("--reuse", action="store_true", help="read finished cells only; run nothing")
    ap.add_argument("--ablate", action="store_true",
                    help="also run the base arm without each part of ABLATIONS (after the arms; --arms base runs only these)")
    ap.add_argument("--budget-min", type=float, default=None,
                    help="launch no new cell after this many minutes (the cells not run are listed as missing)")
    ap.add_argument("--with-ranking", action="store_true", help="evaluate with every ranker seed (defaults)")
    ap.add_argument("--override", action="append", default=[],
                    help="a hir override for every cell run now (repeatable), e.g. export.dim=256 to match cells "
                         "exported before a default changed; each cell records its command")
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
                for arm in [a for a in ARMS if a in args.arms.split(",")]:
                    if read_cell(ds, arm, seed) is not None:
                        continue
                    if args.budget_min is not None and (time.monotonic() - t0) / 60 > args.budget_min:
                        print(f"  {ds} {arm} seed {seed}: not started (over {args.budget_min} minutes)", flush=True)
                        continue
                    if "error" in run_cell(ds, arm, seed, snapshot, args.with_ranking, tuple(args.override)):
                        failed.append(f"{ds} {arm} seed {seed}")
            for seed in seeds if args.ablate else ():
                for arm in (f"ablate_{part}" for part in ABLATIONS):
                    if read_cell(ds, arm, seed) is not None:
                        continue
                    if read_cell(ds, "base", seed) is None:
                        failed.append(f"{ds} {arm} seed {seed} (no base cell to compare with)")
                        continue
                    if "error" in run_cell(ds, arm, seed, snapshot, args.with_ranking, tuple(args.override)):
                        failed.append(f"{ds} {arm} seed {seed}")
        doc[ds] = collect(ds, seeds)
        print(f"{ds}: untrained {doc[ds]['untrained']}, base {doc[ds]['base']}, full {doc[ds]['full']}, "
              f"forced {doc[ds]['forced']}; "
              f"{doc[ds]['verdict']['verdict']}", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        write_section(markdown(doc), args.md, "learner")
    print(markdown(doc))
    if failed:
        sys.exit(f"failed cells: {failed}")


if __name__ == "__main__":
    main()
