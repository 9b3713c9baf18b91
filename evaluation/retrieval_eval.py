"""Retrieval lift: run every arm on the same test users and catalogue and score them under both
protocols (full catalogue; masked new-to-user), naming the best arm per metric."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from hir_evaluation.lightgcn import LightGCNConfig, fit_lightgcn
from hir_evaluation.retrieval import (
    Ranked,
    RetrievalTask,
    TopK,
    itemknn_topk,
    popularity_topk,
    profile_topk,
    repeat_topk,
    retrieval_data,
    score_arm,
)
from hir_evaluation.snapshot import Snapshot

log = logging.getLogger(__name__)

ARMS = ("hir", "popularity", "itemknn", "lightgcn", "content", "repeat")
# the baselines hir is ranked against; `repeat` (the user's own past entities) is reported beside
# them as a reference point, since repeat engagement dominates grocery-like data
BASELINES = ("popularity", "itemknn", "lightgcn", "content")
# the second protocol's key in metrics.json (evaluation/retrieval.py module doc)
MASKED = "masked_new_to_user"
FULL_PROTOCOL = ("full catalogue: every arm ranks every entity, the user's past entities included; "
                 "relevance = every held-out entity")
MASKED_PROTOCOL = ("masked new-to-user (LightGCN paper): each user's history entities (the pairs every arm "
                   "learns from) are removed from the ranking; relevance = the held-out entities new to the user")
REPEAT_SKIPPED = "ranks only the user's history entities, which this protocol removes"


def evaluate_retrieval(
    snap: Snapshot,
    task: RetrievalTask,
    lightgcn: LightGCNConfig,
    hir: TopK | None,
    content: tuple[np.ndarray, np.ndarray] | None,
    seed: int,
    neighbours: int = 20,
    history_splits: list[str] | None = None,
    arms: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The ``retrieval`` section of metrics.json: both protocols for every arm.

    Args:
        hir: the HIR arm (Milvus search or the file fallback), None when unavailable.
        content: (entity content vectors (I, d), has-vector (I,)) for the content arm, or None.
        neighbours: item-kNN neighbourhood size (0 = every co-occurring item).
        history_splits: the periods every arm learns from (default train + val); set to the
            periods the HIR export saw, so every arm gets the same information.
        arms: the arms to run (default all); an arm left out reports null metrics. Sweeps whose
            cells differ only in the model skip the baselines they share (LightGCN's fit).
    """
    ks = tuple(sorted(task.ks))
    kmax = ks[-1]
    data = retrieval_data(snap, task, "test", seed, history_splits)
    log.info("retrieval: %d test users, %d history pairs, %d entities", len(data.users), data.history.height, data.n_items)
    runs: dict[str, Callable[[], Ranked]] = {
        "popularity": lambda: popularity_topk(data, kmax),
        "itemknn": lambda: itemknn_topk(data, kmax, neighbours),
        "repeat": lambda: repeat_topk(data, kmax),
    }
    fits: dict[str, Any] = {}

    def run_lightgcn() -> Ranked:
        # val's history is the train period: LightGCN trains on it and early-stops on val's held-out set
        val = retrieval_data(snap, task, "val", seed)
        res = fit_lightgcn(val, val, data, kmax, lightgcn, seed)
        fits["lightgcn"] = {"best_epoch": res.best_epoch, "best_val_recall@20": res.best_val_recall,
                            "selection": f"{MASKED} val recall@20", "epochs": res.epochs,
                            "epochs_after_best": res.epochs - res.best_epoch, "seconds": res.seconds,
                            "stopped_by_budget": res.stopped_by_budget, "stopped_by": res.stopped_by,
                            "curve": res.curve}
        return res.ranked

    runs["lightgcn"] = run_lightgcn
    if content is not None:
        runs["content"] = lambda: profile_topk(data, content[0], content[1], kmax)
    if hir is not None:
        runs["hir"] = lambda: hir(data, kmax)
    if arms is not None:
        unknown = sorted(set(arms) - set(ARMS))
        if unknown:
            raise ValueError(f"eval.retrieval_arms: unknown arms {unknown}; expected some of {list(ARMS)}")
        runs = {a: fn for a, fn in runs.items() if a in arms}
    scores: dict[str, dict[str, dict[str, float]]] = {}
    seconds: dict[str, float] = {}
    for arm, fn in runs.items():
        t0 = time.perf_counter()
        scores[arm] = score_arm(fn(), data, ks)
        seconds[arm] = time.perf_counter() - t0
        log.info("retrieval %s: recall@20 %.4f full, %.4f %s (%.1fs)", arm, scores[arm]["all"].get("recall@20", math.nan),
                 scores[arm].get("masked_new_to_user", {}).get("recall@20", math.nan), MASKED, seconds[arm])
    metric_names = [f"{m}@{k}" for k in ks for m in ("recall", "ndcg")]
    empty = dict.fromkeys(metric_names)

    def arm_metrics(arm: str, name: str) -> dict[str, Any]:
        part = scores.get(arm, {}).get(name)
        return {k: v for k, v in part.items() if k != "users"} if part else dict(empty)

    def users(name: str) -> int:
        return int(next((s[name]["users"] for s in scores.values() if name in s), 0))

    out: dict[str, Any] = {
        "task": asdict(task),
        "history_splits": history_splits or ["train", "val"],
        "ks": list(ks),
        "users": len(data.users),
        "protocol": FULL_PROTOCOL,
        "seconds": seconds,
        "fits": fits,
    }
    for arm in ARMS:
        out[arm] = arm_metrics(arm, "all")
    out["slices"] = {name: {"users": users(name)} | {arm: arm_metrics(arm, name) for arm in ARMS}
                     for name in ("new_to_user", "item_cold")}
    out["best"] = best_arms(out, ARMS, metric_names)
    out["hir_over_best_baseline"] = best_baseline_ratio(out, "recall@20")
    out["hir_over_repeat"] = best_baseline_ratio(out, "recall@20", ("repeat",))
    masked: dict[str, Any] = {"protocol": MASKED_PROTOCOL, "users": users(MASKED)}
    masked |= {arm: arm_metrics(arm, MASKED) for arm in ARMS}
    masked["skipped"] = {"repeat": REPEAT_SKIPPED}
    masked["slices"] = {"item_cold": {"users": users("masked_item_cold")}
                        | {arm: arm_metrics(arm, "masked_item_cold") for arm in ARMS}}
    masked["best"] = best_arms(masked, ARMS, metric_names)
    masked["hir_over_best_baseline"] = best_baseline_ratio(masked, "recall@20")
    out[MASKED] = masked
    return out


def best_arms(section: Mapping[str, Any], arms: tuple[str, ...], metrics: list[str]) -> dict[str, str | None]:
    """The arm with the highest value of each metric in ``section`` (first in ``arms`` order on a
    tie; null when no arm has a value)."""
    out: dict[str, str | None] = {}
    for metric in metrics:
        values = {a: (section.get(a) or {}).get(metric) for a in arms}
        values = {a: v for a, v in values.items() if isinstance(v, float) and v == v}
        out[metric] = max(values, key=lambda a: values[a]) if values else None
    return out


def best_baseline_ratio(
    section: Mapping[str, Any], metric: str, baselines: tuple[str, ...] = BASELINES
) -> dict[str, Any]:
    """hir's ``metric`` over the best of ``baselines`` (null when either is missing or the best is 0)."""
    values = {arm: (section.get(arm) or {}).get(metric) for arm in baselines}
    values = {a: v for a, v in values.items() if isinstance(v, float) and v == v}
    hir = (section.get("hir") or {}).get(metric)
    if not values:
        return {"metric": metric, "best_baseline": None, "ratio": None}
    best = max(values, key=lambda a: values[a])
    ratio = hir / values[best] if isinstance(hir, float) and values[best] > 0 else None
    return {"metric": metric, "best_baseline": best, "best_value": values[best], "hir": hir, "ratio": ratio}
