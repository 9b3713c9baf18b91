"""Metric functions against hand-computed values and scikit-learn."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import log_loss as sk_log_loss
from sklearn.metrics import roc_auc_score

from hir_evaluation import metrics as m


def test_auc_matches_sklearn_with_ties_and_weights() -> None:
    rng = np.random.default_rng(0)
    y = (rng.random(500) < 0.3).astype(float)
    p = np.round(rng.random(500) * 0.5 + 0.3 * y, 2)  # rounding makes many ties
    w = rng.integers(0, 4, 500).astype(float)
    assert m.auc(y, p) == pytest.approx(roc_auc_score(y, p), abs=1e-12)
    assert m.auc(y, p, w) == pytest.approx(roc_auc_score(y, p, sample_weight=w), abs=1e-12)


def test_auc_hand_example_and_degenerate() -> None:
    # pairs (pos, neg): (0.8 > 0.3), (0.8 > 0.5), (0.5 = 0.5 tie -> 1/2), (0.5 > 0.3): 3.5 / 4
    y = np.array([1, 1, 0, 0.0])
    p = np.array([0.8, 0.5, 0.5, 0.3])
    assert m.auc(y, p) == pytest.approx(3.5 / 4)
    assert math.isnan(m.auc(np.ones(3), np.array([0.1, 0.2, 0.3])))


def test_normalized_entropy_is_one_at_the_base_rate_and_lower_when_better() -> None:
    y = np.array([1, 0, 0, 0, 1, 0, 0, 0.0])
    assert m.normalized_entropy(y, np.full(8, 0.25)) == pytest.approx(1.0)
    better = np.where(y == 1, 0.6, 0.1)
    ne = m.normalized_entropy(y, better)
    assert ne < 1
    assert ne == pytest.approx(sk_log_loss(y, better) / m.entropy(0.25))


def test_calibration_and_lift_sign() -> None:
    y = np.array([1, 0, 0, 0.0])
    assert m.calibration(y, np.full(4, 0.5)) == pytest.approx(2.0)  # predicts 2 positives for 1
    assert m.relative_lift(0.8, 0.6) == pytest.approx(0.25)  # lower NE is a positive lift
    assert m.relative_lift(0.8, 0.9) < 0


def test_bootstrap_is_paired_and_clustered() -> None:
    groups = np.array([0, 0, 1, 1, 1, 2])
    w = m.bootstrap_weights(groups, 50, seed=3)
    assert w.shape == (50, 6)
    # rows of one cluster always share a weight, and each draw picks 3 clusters
    assert np.all(w[:, 0] == w[:, 1]) and np.all(w[:, 2] == w[:, 4])
    assert np.all(w[:, [0, 2, 5]].sum(1) == 3)
    rng = np.random.default_rng(1)
    y = (rng.random(400) < 0.2).astype(float)
    base = np.clip(0.2 + 0.1 * (y - 0.2) + 0.05 * rng.normal(size=400), 0.01, 0.99)
    better = np.clip(base + 0.2 * (y - 0.2), 0.01, 0.99)
    draws = m.bootstrap_ranking(y, {"baseline": base, "hir": better}, m.bootstrap_weights(np.arange(400), 100, 0))
    lo, hi = m.interval(draws["hir"]["ne_lift"])
    point = m.relative_lift(m.normalized_entropy(y, base), m.normalized_entropy(y, better))
    assert 0 < lo <= point <= hi
    # the vectorised NE of a draw equals the direct weighted computation
    w0 = m.bootstrap_weights(np.arange(400), 1, 0)[0]
    assert m.bootstrap_ranking(y, {"baseline": base}, w0[None])["baseline"]["ne"][0] == pytest.approx(
        m.normalized_entropy(y, base, w0))


def test_recall_and_ndcg_by_hand() -> None:
    topk = np.array([[5, 1, 2], [7, 8, 9], [3, -1, -1]])
    relevant = [{1, 4}, {9}, set()]  # the third user has nothing held out and is skipped
    out = m.recall_ndcg_at_k(topk, relevant, (1, 3))
    assert out["users"] == 2
    assert out["recall@1"] == 0.0
    assert out["recall@3"] == pytest.approx((0.5 + 1.0) / 2)
    dcg_u0 = 1 / math.log2(3)
    idcg_u0 = 1 + 1 / math.log2(3)
    dcg_u1 = 1 / math.log2(4)
    assert out["ndcg@3"] == pytest.approx((dcg_u0 / idcg_u0 + dcg_u1 / 1.0) / 2)
    with pytest.raises(ValueError, match="fewer than the largest K"):
        m.recall_ndcg_at_k(topk, relevant, (5,))


def test_seed_draws_count_the_ranker_seeds_noise() -> None:
    from hir_evaluation.metrics import bootstrap_ranking, bootstrap_weights, interval, seed_mean_draws

    rng = np.random.default_rng(3)
    n = 4000
    y = (rng.random(n) < 0.3).astype(np.float64)
    base = np.clip(0.3 + 0.2 * (y - 0.3) + rng.normal(0, 0.05, n), 0.01, 0.99)
    weights = bootstrap_weights(np.arange(n), 300, seed=1)
    # one seed: the rows' bootstrap alone
    one = seed_mean_draws(y, {"baseline": [base], "hir": [np.clip(base + 0.05 * (y - 0.3), 0.01, 0.99)]}, weights)
    ref = bootstrap_ranking(y, {"baseline": base, "hir": np.clip(base + 0.05 * (y - 0.3), 0.01, 0.99)}, weights)
    np.testing.assert_allclose(one["hir"]["ne_lift"], ref["hir"]["ne_lift"])
    # five seeds that agree: the same draws; five that disagree: a wider interval than their rows' alone
    same = seed_mean_draws(y, {"baseline": [base] * 5, "hir": [np.clip(base + 0.05 * (y - 0.3), 0.01, 0.99)] * 5},
                           weights)
    np.testing.assert_allclose(same["hir"]["ne_lift"], ref["hir"]["ne_lift"])
    hir = [np.clip(base + s * (y - 0.3), 0.01, 0.99) for s in (0.0, 0.02, 0.05, 0.08, 0.1)]
    two_level = seed_mean_draws(y, {"baseline": [base] * 5, "hir": hir}, weights)["hir"]["ne_lift"]
    rows_only = np.mean([bootstrap_ranking(y, {"baseline": base, "hir": h}, weights)["hir"]["ne_lift"] for h in hir],
                        axis=0)
    width = np.diff(interval(two_level))[0]
    assert width > 1.5 * np.diff(interval(rows_only))[0]
    # the interval still holds the mean over the seeds
    lo, hi = interval(two_level)
    assert lo < float(np.mean(rows_only)) < hi


def test_a_slice_of_every_row_reports_the_overall_draws() -> None:
    import polars as pl

    from hir_evaluation.metrics import bootstrap_weights, seed_mean_draws
    from hir_evaluation.ranking.evaluate import _slices
    from hir_evaluation.ranking.features import RankerInputs

    rng = np.random.default_rng(3)
    n = 400
    y = (rng.random(n) < 0.3).astype(np.float64)
    preds = {arm: [np.clip(rng.random(n) * 0.5 + 0.3 * y, 0.01, 0.99) for _ in range(3)] for arm in ("baseline", "hir")}
    rows = pl.DataFrame({"cold_entity": rng.random(n) < 0.2, "stage": ["view"] * n})
    base = RankerInputs(np.log1p(rng.integers(0, 40, (n, 1))).astype(np.float32), ["user_n"], np.zeros((n, 0), np.int64),
                        [], [])
    weights = bootstrap_weights(rng.integers(0, 50, n), 30, 7)
    overall = seed_mean_draws(y, preds, weights, seed=7)
    fast = _slices(rows, base, y, preds, weights, 5, 0.95, 7, overall)
    slow = _slices(rows, base, y, preds, weights, 5, 0.95, 7)
    assert fast == slow  # the all-rows slice (stage=view) computed or taken from the overall: the same figures
    every = next(s for s in fast if s["slice"] == "stage=view")
    assert every["n"] == n and every["ne_lift"]["ci"] == pytest.approx(
        [float(q) for q in np.quantile(overall["hir"]["ne_lift"][np.isfinite(overall["hir"]["ne_lift"])], [0.025, 0.975])])
