"""Ranking lift: the same DLRM recipe trained per arm (the baseline and every arm of the registry,
evaluation/ranking/registry.py) and per ranker seed on the same rows, scored on the test period
with paired (shared) bootstrap resamples over users, overall and per slice, every arm's lift with
its interval and its seed spread."""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Mapping
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import asdict
from typing import Any

import numpy as np
import polars as pl

from hir.data.snapshot import Snapshot
from hir.enrich.text import available_cores
from hir.errors import HirError
from hir_evaluation.cache import FitCache, fit_key
from hir_evaluation.metrics import (
    bootstrap_weights,
    interval,
    ranking_metrics,
    relative_lift,
    reliability,
    seed_mean_draws,
)
from hir_evaluation.ranking.features import RankerInputs, baseline_inputs
from hir_evaluation.ranking.ranker import RankerConfig, fit_ranker
from hir_evaluation.ranking.registry import BASELINE, ArmInputs, lift_key
from hir_evaluation.tasks import RankingTask, build_candidates

log = logging.getLogger(__name__)


def candidate_rows(snap: Snapshot, task: RankingTask, fit_splits: list[str], seed: int) -> pl.DataFrame:
    """Fit-period rows then test rows, one frame (features are computed once for all).

    ``fit_splits == ["test"]`` means cross-fitting on the test period: only test rows."""
    if list(fit_splits) == ["test"]:
        return build_candidates(task, snap, "test", seed)
    bad = [s for s in fit_splits if s not in ("train", "val")]
    if bad or not fit_splits:
        raise HirError(
            f"eval.ranker_fit_splits={list(fit_splits)}; expected a non-empty subset of [train, val], or [test] "
            "for user-grouped cross-fitting on the test period"
        )
    return pl.concat([build_candidates(task, snap, s, seed) for s in [*fit_splits, "test"]])


def user_folds(users: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """(n,) fold index per row, every user's rows in one fold."""
    uniq, inverse = np.unique(users, return_inverse=True)
    order = np.random.default_rng(seed).permutation(len(uniq))
    return (order % folds)[inverse]


def slice_masks(rows: pl.DataFrame, base: RankerInputs, few_events: int) -> dict[str, np.ndarray]:
    """Test-row slices: users with few prior events, entities new in the period, per funnel stage."""
    prior = np.expm1(base.dense[:, base.dense_names.index("user_n")])
    masks = {
        f"few_events (<= {few_events} prior)": prior <= few_events + 0.5,
        "cold_entity (new in test)": rows["cold_entity"].to_numpy(),
    }
    for stage in sorted(rows["stage"].drop_nulls().unique().to_list()):
        masks[f"stage={stage}"] = (rows["stage"] == stage).fill_null(False).to_numpy()
    return masks


def fit_summary(fits: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm's fits (per seed and fold) in metrics.json: the mean best step (``steps``), each
    fit's best step and best check (1 = its first holdout check), total seconds, and every
    holdout curve (``curves``: seed, fold, steps an epoch, one ``{step, holdout_log_loss}`` per check)."""
    return {
        "steps": float(np.mean([f["best_step"] for f in fits])),
        "best_steps": [f["best_step"] for f in fits],
        "best_checks": [f["best_check"] for f in fits],
        "best_at_first_check": any(f["best_check"] <= 1 for f in fits),
        "holdout_log_loss": float(np.mean([f["holdout_log_loss"] for f in fits])),
        "seconds": float(sum(f["seconds"] for f in fits)),
        "curves": [{k: f[k] for k in ("seed", "fold", "steps_per_epoch", "curve")} for f in fits],
    }


def ranking_rows(snap: Snapshot, task: RankingTask, fit_splits: list[str], seed: int, id_buckets: int
                 ) -> tuple[pl.DataFrame, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, RankerInputs]:
    """What every ranker fit reads besides its arm's blocks: the candidate rows (n) of
    ``fit_splits`` then test, the fit and test row positions, labels y (n,), users (n,), times
    (n,) in epoch us, and the baseline's inputs. One function for :func:`evaluate_ranking` and
    :func:`prewarm_ranking`, so the prewarm's fits carry exactly the cache keys evaluate looks up."""
    rows = candidate_rows(snap, task, fit_splits, seed)
    is_test = (rows["split"] == "test").to_numpy()
    if is_test.sum() == 0 or rows.filter(pl.col("split") == "test")["label"].sum() == 0:
        raise HirError(f"the test period of {snap.dataset} has no positive ranking rows for task {task}")
    y = rows["label"].to_numpy().astype(np.float64)
    users = rows["user_id"].to_numpy()
    times = rows["ts"].dt.epoch("us").to_numpy()
    base = baseline_inputs(snap, rows, task.entity_type, task.resolve_label_stage(snap), id_buckets)
    return rows, np.flatnonzero(~is_test), np.flatnonzero(is_test), y, users, times, base


def evaluate_ranking(
    snap: Snapshot,
    task: RankingTask,
    ranker: RankerConfig,
    fit_splits: list[str],
    arms: Mapping[str, ArmInputs | None],
    resamples: int,
    unit: str,
    level: float,
    seed: int,
    id_buckets: int = 100_000,
    min_fit_coverage: float = 0.01,
    crossfit_fallback: bool = True,
    folds: int = 2,
    seeds: int = 1,
    top_pairs: int = 0,
    top_arm: str | None = None,
    cache: FitCache | None = None,
    cached_arms: frozenset[str] = frozenset(),
    workers: int | str = 1,
) -> dict[str, Any]:
    """Train the baseline and each arm (None = an input it needs is missing, reported as nulls)
    ``seeds`` times each and score them.

    Every arm learns on the same rows with the same recipe and seeds: the ``fit_splits`` periods,
    or, with ``fit_splits == ["test"]`` or a task that says ``crossfit``, user-grouped
    cross-fitting on the test period (out-of-fold predictions). When an arm's features reach
    fewer than ``min_fit_coverage`` of the fit-period rows (point-in-time: embeddings stamped
    after those periods), a ranker would meet them for the first time on the test rows;
    ``crossfit_fallback`` then switches every arm to cross-fitting, otherwise that arm is
    skipped with the reason.

    Ranker seed i is ``seed + 1000 i``; fold k of a cross-fit adds k. Metrics are means over the
    seeds; intervals come from ``resamples`` bootstrap draws over ``unit`` (users), the same
    draws for every arm and seed (paired), each draw averaging the seeds; the NE lift's seed
    spread (per-seed lifts) is reported beside its interval.

    ``workers``: ``eval.ranker_workers`` (:func:`ranker_pool`): 2 or ``auto`` fits every other
    seed in a second process.

    ``cache``: the fits of ``cached_arms`` (the baseline and the arms that read nothing of the HIR
    export) are reused from it when every input of the fit (features, labels, rows, seeds, recipe)
    is the same, and stored in it otherwise.

    Returns the ``ranking`` section of metrics.json (plus ``calibration_curves`` for the plot and
    ``top_pairs``: the ``top_pairs`` test rows that ``top_arm`` (else the baseline) scores
    highest, for the report's explanations).
    """
    label_stage = task.resolve_label_stage(snap)
    notes: list[str] = []
    if task.crossfit and list(fit_splits) != ["test"]:
        notes.append(
            f"the {task.kind} task has labels in the test period only (eval.task.ranking.crossfit): every ranker arm "
            f"is cross-fitted there ({folds} user-grouped folds, out-of-fold predictions), not fitted on {list(fit_splits)}"
        )
        fit_splits = ["test"]
    rows, fit_idx, test_idx, y, users, times, base = ranking_rows(snap, task, fit_splits, seed, id_buckets)
    crossfit = list(fit_splits) == ["test"]
    arm_inputs = {name: inputs(rows, base) for name, inputs in arms.items() if inputs is not None}
    coverage: dict[str, dict[str, float]] = {}
    for name, x in arm_inputs.items():
        # share of fit / test rows that got the arm's features (point-in-time joins leave gaps):
        # its own has_* columns
        has = {k: x.dense[:, j] for j, k in enumerate(x.dense_names) if k.startswith("has_") and k not in base.dense_names}
        coverage[name] = {f"test_{k}": float(v[test_idx].mean()) for k, v in has.items()}
        coverage[name] |= {f"fit_{k}": float(v[fit_idx].mean()) for k, v in has.items()} if len(fit_idx) else {}
    uncovered = [n for n, c in coverage.items() if max((v for k, v in c.items() if k.startswith("fit_")), default=1.0)
                 < min_fit_coverage]
    if uncovered and not crossfit and crossfit_fallback:
        # the export saw the fit periods (stamped after them): the only point-in-time correct
        # rows for a ranker to learn its features from are the test period's, so every arm is
        # cross-fitted there instead (same rows, folds and recipe for all arms)
        notes.append(
            f"{', '.join(uncovered)} features reach < {100 * min_fit_coverage:g}% of the {list(fit_splits)} rows (the "
            "embeddings are stamped after them, point-in-time), so every ranker arm is cross-fitted on the test "
            f"period instead ({folds} user-grouped folds, out-of-fold predictions)"
        )
        log.warning("%s", notes[-1])
        crossfit = True
    inputs: dict[str, RankerInputs] = {BASELINE: base}
    skipped: dict[str, str] = {}
    for name, x in arm_inputs.items():
        cov = max((v for k, v in coverage[name].items() if k.startswith("test_" if crossfit else "fit_")), default=1.0)
        if cov < min_fit_coverage:
            skipped[name] = (
                f"{name} features reach {100 * cov:.2f}% of the rows the ranker learns from: the point-in-time join "
                "finds no embedding stamped before them (event_timestamp must be the cutoff of the engagement the "
                "export saw)"
            )
            log.warning("ranking arm %s skipped: %s", name, skipped[name])
            continue
        inputs[name] = x

    # (rows a ranker learns on, positions in test_idx it predicts): one fit, or one per fold
    if crossfit:
        fold = user_folds(users[test_idx], folds, seed)
        plan = [(test_idx[fold != k], np.flatnonzero(fold == k)) for k in range(folds)]
    else:
        plan = [(fit_idx, np.arange(len(test_idx)))]
    seed_list = [seed + 1000 * i for i in range(max(1, seeds))]
    preds: dict[str, list[np.ndarray]] = {}
    fits: dict[str, list[dict[str, Any]]] = {}
    pool = ranker_pool(workers, len(seed_list))
    try:
        for name, x in inputs.items():
            preds[name], fits[name] = fit_arm(name, x, y, users, times, ranker, seed_list, plan, test_idx, crossfit,
                                              cache if name in cached_arms else None, pool)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)

    y_test, test_rows = y[test_idx], rows[test_idx]
    groups = users[test_idx] if unit == "user" else np.arange(len(test_idx))
    weights = bootstrap_weights(groups, resamples, seed)
    draws = seed_mean_draws(y_test, preds, weights, seed=seed)
    out: dict[str, Any] = {
        "task": asdict(task) | {"label_stage": label_stage, "candidate_stages": task.resolve_candidate_stages(snap)
                                if task.kind in ("funnel", "conversion") else None},
        "fit_splits": ["test"] if crossfit else list(fit_splits),
        "protocol": f"cross-fit on test ({folds} user folds)" if crossfit else f"fit on {list(fit_splits)}",
        "notes": notes,
        "rows": {"fit": len(test_idx) if crossfit else len(fit_idx), "test": len(test_idx)},
        "positives": {"fit": int(y_test.sum() if crossfit else y[fit_idx].sum()), "test": int(y_test.sum())},
        "bootstrap": {"resamples": resamples, "unit": unit, "level": level, "paired": True},
        "seeds": seed_list,
        "skipped": skipped,
        "calibration_curves": {arm: reliability(y_test, np.mean(p, axis=0)) for arm, p in preds.items()},
    }
    out["arms"] = [BASELINE, *arms]
    per_seed = {arm: [ranking_metrics(y_test, p) for p in ps] for arm, ps in preds.items()}
    for arm in out["arms"]:
        if arm not in preds:
            out[arm] = {"auc": None, "ne": None, "log_loss": None, "calibration": None,
                        "feature_coverage": coverage.get(arm, {})}
            continue
        point = {k: float(np.mean([m[k] for m in per_seed[arm]])) for k in per_seed[arm][0]}
        out[arm] = point | {f"{k}_ci": interval(draws[arm][k], level) for k in ("auc", "ne", "calibration")}
        out[arm] |= {"fit": fit_summary(fits[arm]), "seed_values": per_seed[arm],
                     "feature_coverage": coverage.get(arm, {})}
    for arm in arms:
        if arm in preds:
            lifts = [float(relative_lift(b["ne"], a["ne"])) for b, a in zip(per_seed[BASELINE], per_seed[arm])]
            out[lift_key(arm)] = {"value": float(np.mean(lifts)), "ci": interval(draws[arm]["ne_lift"], level),
                                  "arm": arm, "over": BASELINE} | seed_spread(lifts)
        else:
            out[lift_key(arm)] = {"value": None, "ci": [None, None], "arm": arm, "over": BASELINE}
    out["slices"] = _slices(test_rows, base.subset(test_idx), y_test, preds, weights, task.few_events, level, seed,
                            draws)
    if top_pairs:
        arm = top_arm if top_arm in preds else BASELINE
        score = np.mean(preds[arm], axis=0)
        order = np.argsort(-score, kind="stable")
        picked, seen = [], set()
        for i in order:  # one pair per user, the highest-scored first
            u = int(test_rows["user_id"][int(i)])
            if u in seen:
                continue
            seen.add(u)
            picked.append({"user_id": u, "entity_id": int(test_rows["entity_id"][int(i)]), "arm": arm,
                           "score": float(score[i]), "label": int(y_test[i])})
            if len(picked) == top_pairs:
                break
        out["top_pairs"] = picked
    return out


def fit_arm(name: str, x: RankerInputs, y: np.ndarray, users: np.ndarray, times: np.ndarray, ranker: RankerConfig,
            seed_list: list[int], plan: list[tuple[np.ndarray, np.ndarray]], test_idx: np.ndarray, crossfit: bool,
            cache: FitCache | None = None, pool: Executor | None = None) -> tuple[list[np.ndarray], list[dict[str, Any]]]:
    """One arm's rankers, one per seed (and fold): (per seed its (T,) test predictions, per fit its
    record). With ``cache``, the fits are taken from it when every input they read (features,
    labels, rows, seeds, recipe) is the same, and stored in it otherwise. With ``pool`` (a
    one-process :func:`ranker_pool`), every other seed is fitted there, the rest here: each fit
    reads only its seed, so the results are the same as fitting them one after another."""
    key = None
    if cache is not None:
        # everything the fits read: two evaluations with the same key fit the same rankers
        key = fit_key(name, ranker, seed_list, [(learn, out) for learn, out in plan], test_idx, y, users, times,
                      x.dense, x.dense_names, x.sparse, x.sparse_names, x.vocab, x.vectors, x.bags)
        if (hit := cache.get("ranking", name, key)) is not None:
            return hit["preds"], hit["fits"]
    args = (name, x, y, users, times, ranker, plan, test_idx, crossfit)
    # with a pool, every other seed is fitted in its process while this one fits the rest: a ranker
    # runs on one thread (RankerConfig.threads), so on 2 cores the second one would idle
    pooled = pool is not None and len(seed_list) > 1
    future = pool.submit(_fit_seeds_logged, *args, seed_list[1::2]) if pooled else None
    by_seed = dict(_fit_seeds(*args, seed_list[::2] if pooled else seed_list))
    if future is not None:
        records, theirs = future.result()
        for level, logger, msg in records:  # the pool process's log lines, in this process's log
            logging.getLogger(logger).log(level, "%s", msg)
        by_seed |= dict(theirs)
    preds = [by_seed[s][0] for s in seed_list]
    fits = [f for s in seed_list for f in by_seed[s][1]]
    log.info("ranker %s: best steps %s, %.1fs", name, [f["best_step"] for f in fits], sum(f["seconds"] for f in fits))
    if key is not None and cache is not None:
        cache.put("ranking", name, key, {"preds": preds, "fits": fits})
    return preds, fits


def _fit_seeds(name: str, x: RankerInputs, y: np.ndarray, users: np.ndarray, times: np.ndarray,
               ranker: RankerConfig, plan: list[tuple[np.ndarray, np.ndarray]], test_idx: np.ndarray,
               crossfit: bool, seeds: list[int]) -> list[tuple[int, tuple[np.ndarray, list[dict[str, Any]]]]]:
    """:func:`fit_arm`'s fits of ``seeds``: per seed, its (T,) test predictions and its fits' records."""
    out = []
    for s in seeds:
        p = np.zeros(len(test_idx))
        records = []
        for k, (learn, out_pos) in enumerate(plan):
            tag = f"ranker {name} (seed {s}{f', fold {k}' if crossfit else ''})"
            fitted = fit_ranker(x, y, users, ranker, s + k, tag, rows=learn, times=times)
            p[out_pos] = fitted.predict(x, test_idx[out_pos])
            records.append({"seed": s, "fold": k if crossfit else None, "best_step": fitted.steps,
                            "best_check": fitted.best_check, "holdout_log_loss": fitted.best_holdout_loss,
                            "seconds": fitted.seconds, "steps_per_epoch": fitted.steps_per_epoch,
                            "curve": fitted.curve})
        out.append((s, (p, records)))
    return out


class _Records(logging.Handler):
    """Keeps the log records of a pool process, to be logged again by the parent."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.kept: list[tuple[int, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.kept.append((record.levelno, record.name, record.getMessage()))


def _fit_seeds_logged(*args: Any) -> tuple[list[tuple[int, str, str]], list[Any]]:
    """:func:`_fit_seeds` in a pool process (spawned: no logging set up), with its INFO+ log records."""
    handler = _Records()
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)  # a spawned process starts at WARNING
    try:
        return handler.kept, _fit_seeds(*args)
    finally:
        root.removeHandler(handler)


def ranker_pool(workers: int | str, seeds: int) -> Executor | None:
    """A one-process pool for :func:`fit_arm` (``eval.ranker_workers``): ``auto`` = when this
    machine has 2 or more cores and there are 2 or more ranker seeds; an int >= 2 always; 1 = none.
    Spawned, not forked: this process holds torch and Polars thread pools a fork would copy mid-use."""
    n = min(2, available_cores()) if str(workers) == "auto" else int(workers)
    if n < 2 or seeds < 2:
        return None
    return ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))


def prewarm_ranking(snap: Snapshot, task: RankingTask, ranker: RankerConfig, fit_splits: list[str],
                    arms: Mapping[str, ArmInputs | None], seed: int, seeds: int, id_buckets: int,
                    cache: FitCache) -> dict[str, float]:
    """The fits of :func:`evaluate_ranking` that read nothing of the HIR export (the baseline and
    ``arms``, bound to sources without HIR), made ahead into ``cache`` under the keys
    :func:`evaluate_ranking` will look up when it fits on ``fit_splits`` (no cross-fitting: a
    cross-fitted evaluation has other keys and fits them itself). Returns arm -> seconds of the
    fits made here (cached ones are skipped)."""
    if task.crossfit or list(fit_splits) == ["test"]:
        return {}
    rows, fit_idx, test_idx, y, users, times, base = ranking_rows(snap, task, fit_splits, seed, id_buckets)
    if not len(fit_idx):
        return {}
    plan = [(fit_idx, np.arange(len(test_idx)))]
    seed_list = [seed + 1000 * i for i in range(max(1, seeds))]
    done: dict[str, float] = {}
    for name, bound in {BASELINE: None, **arms}.items():
        if name != BASELINE and bound is None:
            continue
        x = base if bound is None else bound(rows, base)
        stored = len(cache.stored)
        _, fits = fit_arm(name, x, y, users, times, ranker, seed_list, plan, test_idx, False, cache)
        if len(cache.stored) > stored:  # fitted here, not found in the cache
            done[name] = float(sum(f["seconds"] for f in fits))
    return done


def seed_spread(lifts: list[float]) -> dict[str, Any]:
    """Per-seed NE lifts, their [min, max] and sample sd (0 for one seed)."""
    return {"seeds": lifts, "seed_spread": [float(min(lifts)), float(max(lifts))],
            "seed_sd": float(np.std(lifts, ddof=1)) if len(lifts) > 1 else 0.0}


def _slices(
    rows: pl.DataFrame,
    base: RankerInputs,
    y: np.ndarray,
    preds: Mapping[str, list[np.ndarray]],
    weights: np.ndarray,
    few_events: int,
    level: float,
    seed: int = 0,
    overall: dict[str, dict[str, np.ndarray]] | None = None,
) -> list[dict[str, Any]]:
    """Per slice: size, positives, each arm's AUC/NE/calibration (means over seeds), and every
    arm's NE lift over the baseline with its interval (the same paired bootstrap draws restricted
    to the slice's rows, and the same draws of the ranker seeds, ``seed``; ``ne_lift`` for hir,
    ``ne_lift_<arm>`` for the others). A slice of every row (completejourney's stage=exposure: every
    candidate is an exposure) takes the ``overall`` draws, which are exactly its own: the bootstrap
    is not run twice."""
    out = []
    for name, mask in slice_masks(rows, base, few_events).items():
        entry: dict[str, Any] = {"slice": name, "n": int(mask.sum()), "positives": int(y[mask].sum())}
        if mask.sum() == 0:
            out.append(entry)
            continue
        per_seed = {arm: [ranking_metrics(y[mask], p[mask]) for p in ps] for arm, ps in preds.items()}
        for arm, ms in per_seed.items():
            entry[arm] = {k: float(np.mean([m[k] for m in ms])) for k in ms[0]}
        if BASELINE in preds and len(preds) > 1 and 0 < y[mask].sum() < mask.sum():
            if overall is not None and mask.all():
                d = overall
            else:
                d = seed_mean_draws(y[mask], {arm: [p[mask] for p in ps] for arm, ps in preds.items()}, weights[:, mask],
                                    seed=seed)
            for arm in preds:
                if arm == BASELINE:
                    continue
                lifts = [float(relative_lift(b["ne"], a["ne"])) for b, a in zip(per_seed[BASELINE], per_seed[arm])]
                entry[lift_key(arm)] = {"value": float(np.mean(lifts)), "ci": interval(d[arm]["ne_lift"], level)} | \
                    seed_spread(lifts)
        out.append(entry)
    return out
