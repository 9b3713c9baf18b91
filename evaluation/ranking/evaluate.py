"""Ranking lift: the same DLRM recipe trained per arm (the baseline and every arm of the registry,
evaluation/ranking/registry.py) on the same rows, scored on the test period with paired (shared)
bootstrap resamples, overall and per slice."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import numpy as np
import polars as pl

from hir.data.snapshot import Snapshot
from hir.errors import HirError
from hir_evaluation.metrics import (
    bootstrap_ranking,
    bootstrap_weights,
    interval,
    ranking_metrics,
    relative_lift,
    reliability,
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
) -> dict[str, Any]:
    """Train the baseline and each arm (None = an input it needs is missing, reported as nulls)
    and score them.

    Every arm learns on the same rows with the same recipe and seed: the ``fit_splits`` periods,
    or, with ``fit_splits == ["test"]``, user-grouped cross-fitting on the test period
    (out-of-fold predictions). When an arm's features reach fewer than ``min_fit_coverage`` of
    the fit-period rows (point-in-time: embeddings stamped after those periods), a ranker would
    meet them for the first time on the test rows; ``crossfit_fallback`` then switches every arm
    to cross-fitting, otherwise that arm is skipped with the reason.

    Returns the ``ranking`` section of metrics.json (plus ``calibration_curves`` for the plot).
    """
    label_stage = task.resolve_label_stage(snap)
    rows = candidate_rows(snap, task, fit_splits, seed)
    crossfit = list(fit_splits) == ["test"]
    is_test = (rows["split"] == "test").to_numpy()
    if is_test.sum() == 0 or rows.filter(pl.col("split") == "test")["label"].sum() == 0:
        raise HirError(f"the test period of {snap.dataset} has no positive ranking rows for task {task}")
    fit_idx, test_idx = np.flatnonzero(~is_test), np.flatnonzero(is_test)
    y = rows["label"].to_numpy().astype(np.float64)
    users = rows["user_id"].to_numpy()
    base = baseline_inputs(snap, rows, task.entity_type, label_stage, id_buckets)
    arm_inputs = {name: inputs(rows, base) for name, inputs in arms.items() if inputs is not None}
    coverage: dict[str, dict[str, float]] = {}
    for name, x in arm_inputs.items():
        # share of fit / test rows that got the arm's features (point-in-time joins leave gaps):
        # its own has_* columns
        has = {k: x.dense[:, j] for j, k in enumerate(x.dense_names) if k.startswith("has_") and k not in base.dense_names}
        coverage[name] = {f"test_{k}": float(v[test_idx].mean()) for k, v in has.items()}
        coverage[name] |= {f"fit_{k}": float(v[fit_idx].mean()) for k, v in has.items()} if len(fit_idx) else {}
    notes: list[str] = []
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

    preds: dict[str, np.ndarray] = {}
    fits: dict[str, dict[str, float]] = {}
    fold = user_folds(users[test_idx], folds, seed) if crossfit else None
    for name, x in inputs.items():
        if fold is None:
            fitted = fit_ranker(x.subset(fit_idx), y[fit_idx], users[fit_idx], ranker, seed, name)
            preds[name] = fitted.predict(x.subset(test_idx))
            fits[name] = {"steps": fitted.steps, "holdout_log_loss": fitted.best_holdout_loss, "seconds": fitted.seconds}
        else:
            preds[name] = np.zeros(len(test_idx))
            fits[name] = {"steps": 0, "holdout_log_loss": 0.0, "seconds": 0.0}
            for k in range(folds):
                train_rows, out_rows = test_idx[fold != k], test_idx[fold == k]
                fitted = fit_ranker(x.subset(train_rows), y[train_rows], users[train_rows], ranker, seed + k,
                                    f"{name}[fold {k}]")
                preds[name][fold == k] = fitted.predict(x.subset(out_rows))
                fits[name]["steps"] += fitted.steps / folds
                fits[name]["holdout_log_loss"] += fitted.best_holdout_loss / folds
                fits[name]["seconds"] += fitted.seconds
        log.info("ranker %s: best at step %d, %.1fs", name, fits[name]["steps"], fits[name]["seconds"])

    y_test, test_rows = y[test_idx], rows[test_idx]
    groups = users[test_idx] if unit == "user" else np.arange(len(test_idx))
    weights = bootstrap_weights(groups, resamples, seed)
    draws = bootstrap_ranking(y_test, preds, weights)
    out: dict[str, Any] = {
        "task": asdict(task) | {"label_stage": label_stage, "candidate_stages": task.resolve_candidate_stages(snap)
                                if task.kind == "funnel" else None},
        "fit_splits": ["test"] if crossfit else list(fit_splits),
        "protocol": f"cross-fit on test ({folds} user folds)" if crossfit else f"fit on {list(fit_splits)}",
        "notes": notes,
        "rows": {"fit": len(test_idx) if crossfit else len(fit_idx), "test": len(test_idx)},
        "positives": {"fit": int(y_test.sum() if crossfit else y[fit_idx].sum()), "test": int(y_test.sum())},
        "bootstrap": {"resamples": resamples, "unit": unit, "level": level},
        "skipped": skipped,
        "calibration_curves": {arm: reliability(y_test, p) for arm, p in preds.items()},
    }
    out["arms"] = [BASELINE, *arms]
    for arm in out["arms"]:
        if arm not in preds:
            out[arm] = {"auc": None, "ne": None, "log_loss": None, "calibration": None,
                        "feature_coverage": coverage.get(arm, {})}
            continue
        point = ranking_metrics(y_test, preds[arm])
        out[arm] = point | {f"{k}_ci": interval(draws[arm][k], level) for k in ("auc", "ne", "calibration")}
        out[arm] |= {"fit": fits[arm], "feature_coverage": coverage.get(arm, {})}
    for arm in arms:
        if arm in preds:
            value = float(relative_lift(out[BASELINE]["ne"], out[arm]["ne"]))
            out[lift_key(arm)] = {"value": value, "ci": interval(draws[arm]["ne_lift"], level), "arm": arm,
                                  "over": BASELINE}
        else:
            out[lift_key(arm)] = {"value": None, "ci": [None, None], "arm": arm, "over": BASELINE}
    out["slices"] = _slices(test_rows, base.subset(test_idx), y_test, preds, weights, task.few_events, level)
    return out


def _slices(
    rows: pl.DataFrame,
    base: RankerInputs,
    y: np.ndarray,
    preds: Mapping[str, np.ndarray],
    weights: np.ndarray,
    few_events: int,
    level: float,
) -> list[dict[str, Any]]:
    """Per slice: size, positives, each arm's AUC/NE/calibration, and hir's NE lift with its interval
    (the same bootstrap draws restricted to the slice's rows)."""
    out = []
    for name, mask in slice_masks(rows, base, few_events).items():
        entry: dict[str, Any] = {"slice": name, "n": int(mask.sum()), "positives": int(y[mask].sum())}
        if mask.sum() == 0:
            out.append(entry)
            continue
        for arm, p in preds.items():
            entry[arm] = ranking_metrics(y[mask], p[mask])
        if "hir" in preds and 0 < y[mask].sum() < mask.sum():
            d = bootstrap_ranking(y[mask], {"baseline": preds["baseline"][mask], "hir": preds["hir"][mask]},
                                  weights[:, mask])
            value = relative_lift(entry["baseline"]["ne"], entry["hir"]["ne"])
            entry["ne_lift"] = {"value": float(value), "ci": interval(d["hir"]["ne_lift"], level)}
        out.append(entry)
    return out
