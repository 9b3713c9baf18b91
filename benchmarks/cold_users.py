"""Users without visible engagement (export.cold_users): the trained model's export with today's
cold-user placement against the same model exported with the knowledge view, per slice.

    python benchmarks/cold_users.py                                       # online_retail + completejourney, seeds 0-2
    python benchmarks/cold_users.py --datasets online_retail --seeds 0
    python benchmarks/cold_users.py --reuse                               # re-read finished cells

It reuses a ``benchmarks/learner.py`` arm's cells (``--ref``, default ``untrained``, the default
model; run those first): per dataset and seed, the cell's checkpoints are copied into
``outputs/<d>/learner_<arm>_s<seed>`` (``--arm``, default ``coldusers``) and exported and
evaluated there with every default plus ``--override`` (``hir export ... force=true``, ``hir
evaluate eval.hir_source=files eval.retrieval_arms=[hir]`` with learner.py's NO_RANKING), so the
two exports differ only in what export does. Without overrides the reference measures today's
placement only while it was exported with the knowledge view for its cold users
(``cold_placement.users`` missing from its meta.json, or ``method: knowledge``): a cell exported
by today's code already turns them.

    python benchmarks/cold_users.py --datasets online_retail --arm w3 --override 'export.cold_users.windows=[3,7]' \
        --out /tmp/w3.json --md /tmp/w3.md                         # a variant against the untrained cells
Ratios: learner.py's paired bootstrap over test users, seeds pooled. Writes
benchmarks/results/cold_users.json and the cold_users section of docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import learner  # benchmarks/ (the script's folder is on sys.path)
from _results_md import markers, write_section

ROOT = learner.ROOT
ARM = "coldusers"
BEGIN, END = markers("cold_users")


def users_plan(run_dir: Path) -> dict[str, Any] | None:
    """The cold-user report of a cell's export (meta.json ``cold_placement.users``), or None."""
    meta = run_dir / "embeddings" / "meta.json"
    if not meta.exists():
        return None
    return (json.loads(meta.read_text()).get("cold_placement") or {}).get("users")


def run_cell(dataset: str, seed: int, ref: str = "untrained", overrides: tuple[str, ...] = (),
             arm: str = ARM) -> dict[str, Any]:
    """Export and evaluate the ``ref`` cell's checkpoints with today's defaults and ``overrides`` in
    ``arm``'s cell; the stages' seconds."""
    base, run_dir = learner.cell_dir(dataset, ref, seed), learner.cell_dir(dataset, arm, seed)
    if not (base / "checkpoints" / "train_metrics.json").exists():
        return {"error": f"{base / 'checkpoints'} is missing: run `benchmarks/learner.py --arms {ref}` first"}
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    shutil.copytree(base / "checkpoints", run_dir / "checkpoints")
    snapshot = ROOT / "outputs" / dataset / "learner"
    common = [f"data={dataset}", f"run_name={run_dir.name}", f"seed={seed}", *learner.ARMS[ref],
              f"paths.graph_dir={snapshot / 'graph'}", f"paths.content_dir={snapshot / 'content'}"]
    common += list(overrides)
    return learner.run_stages(run_dir, common, {"export": ["force=true"], "evaluate": learner.evaluate_overrides()},
                              f"{dataset} seed {seed}")


def collect(dataset: str, seeds: list[int], ref: str = "untrained", overrides: tuple[str, ...] = (),
            arm: str = ARM) -> dict[str, Any]:
    done = [s for s in seeds if (learner.cell_dir(dataset, arm, s) / "report" / learner.USERS_FILE).exists()]
    plans = {s: users_plan(learner.cell_dir(dataset, arm, s)) for s in done}
    # without overrides, a reference exported by this code already placed its cold users the same way
    stale = [] if overrides else [s for s in done if (users_plan(learner.cell_dir(dataset, ref, s)) or {})
                                  .get("method") == "recent"]
    return {
        "seeds": done,
        "reference_already_turned": stale,
        "chosen": {str(s): {k: (p or {}).get(k) for k in ("method", "window_days", "weight", "val_users", "why")}
                   for s, p in plans.items()},
        "val_recall@20": {str(s): (p or {}).get("val_recall@20") for s, p in plans.items()},
        "reference": ref,
        "overrides": list(overrides),
        "chosen_by_reference": {str(s): {k: (users_plan(learner.cell_dir(dataset, ref, s)) or {}).get(k)
                                         for k in ("method", "window_days", "weight")} for s in done},
        "paired": {sl: learner.paired_ratio(dataset, arm, ref, done, sl) for sl in learner.SLICES},
        "cells": {str(s): learner.read_cell(dataset, arm, s) for s in done},
    }


def markdown(doc: dict[str, Any]) -> str:
    lines = [BEGIN, "## Users without history (`python benchmarks/cold_users.py`)", "",
             "The learner's cells (`benchmarks/learner.py`; per dataset, the arm named below) exported again with "
             "`export.cold_users` at its default (the knowledge view turned toward the recent demand when that "
             "beats it on val; hir/export/cold_users.py) against their own export with the knowledge view. Test "
             "masked new-to-user recall@20, paired bootstrap over test users, seeds pooled.", ""]
    for ds, r in doc.items():
        if ds.startswith("_"):
            continue
        chosen = "; ".join(f"seed {s}: " + (f"{c['window_days']:g} d x {c['weight']:g} ({c['val_users']} val users)"
                                            if c.get("method") == "recent" else f"knowledge view ({c.get('why')})")
                           for s, c in r["chosen"].items())
        how = f"The `{r.get('reference', 'base')}` cells" + (f", exported with {' '.join(r['overrides'])}"
                                                             if r.get("overrides") else "")
        lines += [f"### {ds}", "", f"{how}. Chosen on val: {chosen}.", "",
                  "| slice | users | knowledge view | turned | ratio |", "|---|---|---|---|---|"]
        for sl, p in r["paired"].items():
            if p:
                lines.append(f"| {sl} | {p['users']} | {p['mean_den']:.4f} | {p['mean_num']:.4f} | "
                             f"{p['ratio']:.3f} [{p['lo']:.3f}, {p['hi']:.3f}] |")
        if r["reference_already_turned"]:
            lines.append(f"\nSeeds {r['reference_already_turned']}: the base cell already turned its cold users "
                         "(exported by this code), so those ratios compare an export with itself.")
        lines.append("")
    meta = doc.get("_meta", {})
    lines.append(f"Measured {meta.get('date')} on {meta.get('machine')}, git {meta.get('git')}.")
    return "\n".join(lines) + "\n" + END + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="online_retail,completejourney")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--reuse", action="store_true", help="read finished cells only; run nothing")
    ap.add_argument("--override", action="append", default=[],
                    help="a Hydra override for the export (repeatable), e.g. export.cold_users.windows=[3,7]")
    ap.add_argument("--arm", default=ARM, help="the cells' name (outputs/<d>/learner_<arm>_s<seed>)")
    ap.add_argument("--ref", default="untrained", help="the learner arm whose checkpoints are exported again "
                                                        "and whose export is the reference")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cold_users.json")
    ap.add_argument("--md", type=Path, default=ROOT / "docs" / "results.md")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    doc: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    failed = []
    for ds in [d for d in args.datasets.split(",") if d]:
        for seed in seeds if not args.reuse else ():
            if "error" in run_cell(ds, seed, args.ref, tuple(args.override), args.arm):
                failed.append(f"{ds} seed {seed}")
        doc[ds] = collect(ds, seeds, args.ref, tuple(args.override), args.arm)
        p = doc[ds]["paired"]["all"]
        print(f"{ds}: all users {p['ratio']:.3f} [{p['lo']:.3f}, {p['hi']:.3f}]" if p else f"{ds}: no cell", flush=True)
    gits = sorted({c.get("git") for r in doc.values() if isinstance(r, dict) and "cells" in r
                   for c in r["cells"].values() if c and c.get("git")})
    doc["_meta"] = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "git": gits,
                    "machine": f"{platform.machine()}, {len(learner.os.sched_getaffinity(0))} cores"}
    args.out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    write_section(markdown(doc), args.md, "cold_users")
    if failed:
        sys.exit(f"failed cells: {failed}")


if __name__ == "__main__":
    main()
