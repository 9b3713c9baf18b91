"""Retrieval lift: run every arm of the registry (evaluation/retrieval/registry.py) on the same
test users and catalogue and score them under the three protocols (full catalogue; masked
new-to-user; deep funnel, with its repeat and explore slices), naming the best arm per metric
and the model's ratio to the best baseline."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from hir.data.snapshot import Snapshot
from hir_evaluation.cache import FitCache, cacheable, fit_key
from hir_evaluation.metrics import hit_per_user, recall_per_user
from hir_evaluation.retrieval.data import RetrievalData, retrieval_data
from hir_evaluation.retrieval.rank import TopK, score_arm
from hir_evaluation.retrieval.registry import RetrievalArm, RetrievalContext
from hir_evaluation.tasks import RetrievalTask

log = logging.getLogger(__name__)

# the second protocol's key in metrics.json (evaluation/retrieval/rank.py module doc)
MASKED = "masked_new_to_user"
FULL_PROTOCOL = ("full catalogue: every arm ranks every entity, the user's past entities included; "
                 "relevance = every held-out entity")
MASKED_PROTOCOL = ("masked new-to-user (LightGCN paper): each user's history entities (the pairs every arm "
                   "learns from) are removed from the ranking; relevance = the held-out entities new to the user")
# the third protocol's key in metrics.json
DEEP = "deep_funnel"


def deep_protocol(stage: str) -> str:
    """The deep-funnel protocol's sentence for metrics.json, naming the target stage."""
    return (f"deep funnel (GHCF / EHCF / CRGCN multi-behaviour protocol): every arm ranks every entity with only "
            f"the user's history entities of the target stage ({stage}) removed; entities reached only at a "
            f"shallower stage stay rankable; relevance = every held-out {stage} entity; HR@K = the share of users "
            f"with one in the top K. Slices: repeat (engaged with before, at any stage) and explore (new to the user)")


def evaluate_retrieval(
    snap: Snapshot,
    task: RetrievalTask,
    arms: Mapping[str, RetrievalArm],
    seed: int,
    hir: TopK | None = None,
    content: tuple[np.ndarray, np.ndarray] | None = None,
    history_splits: list[str] | None = None,
    run: Sequence[str] | None = None,
    few_events: int | None = None,
    cache: FitCache | None = None,
    per_user_path: Path | None = None,
    wait: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """The ``retrieval`` section of metrics.json: both protocols for every arm.

    Args:
        arms: name -> arm, in report order (``build_arms(cfg.eval.retrieval)``).
        hir: the HIR search (Milvus or the file fallback), None when unavailable.
        content: (entity content vectors (I, d), has-vector (I,)) for the content arm, or None.
        history_splits: the periods every arm learns from (default train + val); set to the
            periods the HIR export saw, so every arm gets the same information.
        run: the arms to run (default all); an arm left out, or one whose input is missing,
            reports null metrics. Sweeps whose cells differ only in the model skip the baselines
            they share (LightGCN's fit).
        few_events: adds the ``few_events`` slice to both protocols: the users whose history
            (the pairs every arm learns from) has at most this many events (None: no slice).
        cache: the top-k lists of the arms that read nothing of the HIR export are reused from it
            (same arm settings, test users, history and content) and stored in it otherwise.
        per_user_path: also write per test user values there, for paired comparisons of runs
            over the same users (benchmarks/learner.py bootstraps them): parquet with ``user_id``,
            ``few_events``, the counts ``n_relevant``, ``n_repeat``, ``n_explore`` and
            ``repeat_share`` (n_repeat / n_relevant), then per arm: ``<arm>`` its masked
            new-to-user recall@20, and under the deep-funnel protocol ``<arm>__deep@10`` /
            ``<arm>__deep@20`` (recall), ``<arm>__deep_hr@10`` / ``<arm>__deep_hr@20`` (hit),
            ``<arm>__deep_repeat@20`` / ``<arm>__deep_explore@20`` (recall on each slice). NaN
            where the user has nothing relevant in that set.
        wait: called once before the first arm that needs no optional input (the arms the
            background process fits, evaluation/retrieval/background.py); the arms that read the
            HIR export or the content vectors run first, while it still works. The output is
            in report order either way.
    """
    if run is not None and (unknown := sorted(set(run) - set(arms))):
        raise ValueError(f"eval.retrieval_arms: unknown arms {unknown}; expected some of {list(arms)}")
    ks = tuple(sorted(task.ks))
    data = retrieval_data(snap, task, "test", seed, history_splits)
    log.info("retrieval: %d test users, %d history pairs, %d entities", len(data.users), data.history.height, data.n_items)
    few = None if few_events is None else data.few_events(few_events)
    ctx = RetrievalContext(snap, task, data, seed, hir, content)
    scores: dict[str, dict[str, dict[str, float]]] = {}
    seconds: dict[str, float] = {}
    fits: dict[str, Any] = {}
    per_user: dict[str, np.ndarray] = {}
    k20 = 20 if 20 in ks else ks[-1]
    # the arms with inputs first (stable: report order within each group) when a background
    # process still fits the others; each arm's figures do not depend on when it runs
    order = sorted(arms, key=lambda n: not arms[n].info.needs) if wait is not None else list(arms)
    for name in order:
        arm = arms[name]
        if wait is not None and not arm.info.needs:
            wait()
            wait = None
        if (run is not None and name not in run) or not ctx.has(arm.info.needs):
            continue
        t0 = time.perf_counter()
        key = arm_key(name, arm, ks[-1], seed, task, data, content, history_splits) \
            if cache is not None and cacheable(arm.info.needs) else None
        ranked = cache.get("retrieval", name, key) if key is not None and cache is not None else None
        how = None if ranked is None or cache is None else \
            "fitted_in_parallel" if f"retrieval/{name}" in cache.parallel else "reused_from_cache"
        if ranked is None:
            ranked = arm.topk(ctx, ks[-1])
            if key is not None and cache is not None:
                cache.put("retrieval", name, key, ranked)
        scores[name] = score_arm(ranked, data, ks, few)
        if ranked.masked is not None:
            per_user[name] = recall_per_user(ranked.masked, data.new_to_user, k20)
            # the masked item-cold slice per user (NaN: no item-cold held-out entity), for paired slices
            per_user[f"{name}__item_cold@{k20}"] = recall_per_user(ranked.masked, data.item_cold, k20)
        if ranked.deep is not None:
            per_user |= deep_per_user(name, ranked.deep, data, ks)
        seconds[name] = time.perf_counter() - t0
        if ranked.fit is not None:
            fits[name] = ranked.fit | ({how: True} if how else {})
        log.info("retrieval %s: recall@20 %.4f full, %.4f %s, %.4f %s (%.1fs)", name,
                 scores[name]["all"].get("recall@20", math.nan), scores[name].get(MASKED, {}).get("recall@20", math.nan),
                 MASKED, scores[name].get(DEEP, {}).get("recall@20", math.nan), DEEP, seconds[name])
    if wait is not None:  # no arm without inputs ran: the background process is still joined
        wait()
    scores, seconds, fits = ({n: d[n] for n in arms if n in d} for d in (scores, seconds, fits))
    per_user = {key: per_user[key] for n in arms for key in per_user if key == n or key.startswith(f"{n}__")}
    if per_user_path is not None and per_user:
        per_user_path.parent.mkdir(parents=True, exist_ok=True)
        pl.DataFrame({"user_id": data.users, "few_events": few if few is not None else np.zeros(len(data.users), bool),
                      "history_events": data.history_events(),
                      **slice_counts(data), **per_user}).write_parquet(per_user_path)
    metric_names = [f"{m}@{k}" for k in ks for m in ("recall", "ndcg")]
    deep_names = [*metric_names, *[f"hr@{k}" for k in ks]]
    roles = {name: arm.info.role for name, arm in arms.items()}

    def arm_metrics(arm: str, name: str) -> dict[str, Any]:
        part = scores.get(arm, {}).get(name)
        empty = deep_names if name.startswith("deep_") else metric_names
        return {k: v for k, v in part.items() if k != "users"} if part else dict.fromkeys(empty)

    def users(name: str) -> int:
        return int(next((s[name]["users"] for s in scores.values() if name in s), 0))

    def section(protocol: str, slices: dict[str, str], names: list[str] = metric_names) -> dict[str, Any]:
        """Every arm's metrics under ``protocol`` (a score_arm key), the slices (section key ->
        score_arm key) and the best arm per metric of ``names``."""
        part: dict[str, Any] = {arm: arm_metrics(arm, protocol) for arm in arms}
        part["slices"] = {key: {"users": users(name)} | {arm: arm_metrics(arm, name) for arm in arms}
                          for key, name in slices.items()}
        part["best"] = best_arms(part, tuple(arms), names)
        return part

    out: dict[str, Any] = {
        "task": asdict(task),
        "history_splits": history_splits or ["train", "val"],
        "ks": list(ks),
        "users": len(data.users),
        "protocol": FULL_PROTOCOL,
        "seconds": seconds,
        "fits": fits,
        "arms": roles,
    }
    few_slice = {} if few is None else {"few_events": "few_events"}
    out |= section("all", {"new_to_user": "new_to_user", "repeat": "repeat", "item_cold": "item_cold"} | few_slice)
    out |= model_ratios(out, roles, "recall@20")
    masked: dict[str, Any] = {"protocol": MASKED_PROTOCOL, "users": users(MASKED)}
    masked |= section(MASKED, {"item_cold": "masked_item_cold"} | {k: f"masked_{v}" for k, v in few_slice.items()})
    if few_events is not None:
        for part in (out, masked):
            part["slices"]["few_events"]["max_events"] = few_events
    masked["skipped"] = {name: arm.info.no_masked for name, arm in arms.items() if arm.info.no_masked}
    masked |= model_ratios(masked, roles, "recall@20", references=False)
    out[MASKED] = masked
    deep: dict[str, Any] = {"protocol": deep_protocol(task.target_stage or snap.deep_stage), "users": users(DEEP)}
    deep |= section(DEEP, {"repeat": "deep_repeat", "explore": "deep_explore"}, deep_names)
    deep |= model_ratios(deep, roles, "recall@20")
    out[DEEP] = deep
    return out


def slice_counts(data: RetrievalData) -> dict[str, np.ndarray]:
    """(U,) per test user: how many held-out entities are relevant, repeat and explore (new to the
    user), and the repeat share (NaN without relevant entities)."""
    n_rel = np.array([len(r) for r in data.relevant], dtype=np.int64)
    n_rep = np.array([len(r) for r in data.repeat], dtype=np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(n_rel > 0, n_rep / np.maximum(n_rel, 1), np.nan)
    return {"n_relevant": n_rel, "n_repeat": n_rep, "n_explore": n_rel - n_rep, "repeat_share": share}


def deep_per_user(name: str, deep: np.ndarray, data: RetrievalData, ks: tuple[int, ...]) -> dict[str, np.ndarray]:
    """(U,) per-user values of ``name``'s deep-funnel list ``deep`` (U, k): recall and hit at 10
    and 20 (those of ``ks``), and recall@20 on the repeat and explore slices (NaN where the user
    has nothing relevant in the slice)."""
    out: dict[str, np.ndarray] = {}
    for k in (10, 20):
        if k in ks:
            out[f"{name}__deep@{k}"] = recall_per_user(deep, data.relevant, k)
            out[f"{name}__deep_hr@{k}"] = hit_per_user(deep, data.relevant, k)
    k20 = 20 if 20 in ks else ks[-1]
    out[f"{name}__deep_repeat@{k20}"] = recall_per_user(deep, data.repeat, k20)
    out[f"{name}__deep_explore@{k20}"] = recall_per_user(deep, data.new_to_user, k20)
    return out


def arm_key(
    name: str,
    arm: RetrievalArm,
    k: int,
    seed: int,
    task: RetrievalTask,
    data: RetrievalData,
    content: tuple[np.ndarray, np.ndarray] | None,
    history_splits: list[str] | None,
) -> str:
    """The cache key of an arm's top-k lists: its class and settings, k, the seed, the task, the
    test users, the history every arm learns from and the target-stage history the deep-funnel
    protocol removes (sorted pairs) and, for an arm that reads them, the content vectors."""
    settings = asdict(arm) if is_dataclass(arm) else dict(vars(arm))
    parts: list[Any] = [name, f"{type(arm).__module__}.{type(arm).__qualname__}", settings, k, seed, asdict(task),
                        history_splits, data.users]
    for frame in (data.history, data.deep_history):
        if frame is None:
            parts.append(None)
            continue
        pairs = frame.sort("user_id", "entity_id")
        parts += [pairs["user_id"].to_numpy(), pairs["entity_id"].to_numpy(), pairs["n"].to_numpy()]
    if "content" in arm.info.needs and content is not None:
        parts += [content[0], content[1]]
    return fit_key(*parts)


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
    section: Mapping[str, Any], metric: str, baselines: tuple[str, ...], model: str = "hir"
) -> dict[str, Any]:
    """``model``'s ``metric`` over the best of ``baselines`` (null when either is missing or the best is 0)."""
    values = {arm: (section.get(arm) or {}).get(metric) for arm in baselines}
    values = {a: v for a, v in values.items() if isinstance(v, float) and v == v}
    value = (section.get(model) or {}).get(metric)
    if not values:
        return {"metric": metric, "best_baseline": None, "ratio": None}
    best = max(values, key=lambda a: values[a])
    ratio = value / values[best] if isinstance(value, float) and values[best] > 0 else None
    return {"metric": metric, "best_baseline": best, "best_value": values[best], model: value, "ratio": ratio}


def model_ratios(
    section: Mapping[str, Any], roles: Mapping[str, str], metric: str, references: bool = True
) -> dict[str, dict[str, Any]]:
    """Each model arm over the best baseline (``hir_over_best_baseline``) and, with
    ``references``, over each reference arm (``hir_over_repeat``)."""
    def named(role: str) -> list[str]:
        return [arm for arm, r in roles.items() if r == role]

    out = {}
    for model in named("model"):
        out[f"{model}_over_best_baseline"] = best_baseline_ratio(section, metric, tuple(named("baseline")), model)
        for ref in named("reference") if references else []:
            out[f"{model}_over_{ref}"] = best_baseline_ratio(section, metric, (ref,), model)
    return out
