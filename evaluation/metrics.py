"""Metric functions: pure numpy over labels, scores and (bootstrap) row weights.

Ranking: AUC, log loss, normalized entropy (He et al. 2014: the log loss divided by the entropy
of the background positive rate, here the rate of the evaluated rows, so NE < 1 means better
than always predicting the base rate), calibration (mean prediction / observed rate).
Retrieval: recall@K and NDCG@K with binary relevance, and the hit ratio HR@K (the share of users
with at least one relevant item in their top K; equal to recall@K when each user has one). Lift over a named baseline is computed in
one place, :func:`relative_lift`, for point values and bootstrap draws alike.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

EPS = 1e-7


def _weights(y: np.ndarray, w: np.ndarray | None) -> np.ndarray:
    return np.ones(len(y), dtype=np.float64) if w is None else np.asarray(w, dtype=np.float64)


def log_loss(y: np.ndarray, p: np.ndarray, w: np.ndarray | None = None) -> float:
    """Mean binary cross-entropy (nats) of probabilities ``p`` (n,) for labels ``y`` (n,) in {0, 1}."""
    w = _weights(y, w)
    p = np.clip(p, EPS, 1 - EPS)
    ll = -(y * np.log(p) + (1 - y) * np.log(1 - p))
    return float((w * ll).sum() / w.sum())


def entropy(rate: float) -> float:
    """Binary entropy (nats) of a positive rate."""
    r = min(max(rate, EPS), 1 - EPS)
    return float(-(r * np.log(r) + (1 - r) * np.log(1 - r)))


def normalized_entropy(y: np.ndarray, p: np.ndarray, w: np.ndarray | None = None) -> float:
    """Log loss over the entropy of the (weighted) background rate of ``y``; nan if y is constant."""
    w = _weights(y, w)
    rate = float((w * y).sum() / w.sum())
    if rate <= 0 or rate >= 1:
        return float("nan")
    return log_loss(y, p, w) / entropy(rate)


def calibration(y: np.ndarray, p: np.ndarray, w: np.ndarray | None = None) -> float:
    """Mean predicted probability over the observed positive rate (1 = calibrated)."""
    w = _weights(y, w)
    observed = float((w * y).sum())
    return float((w * p).sum() / observed) if observed > 0 else float("nan")


class AucPrep:
    """Sorted tie groups of one score vector, so weighted AUCs (bootstrap draws) cost O(n)."""

    def __init__(self, y: np.ndarray, p: np.ndarray) -> None:
        order = np.argsort(p, kind="mergesort")
        self.y = np.asarray(y, dtype=np.float64)[order]
        self.order = order
        _, self.group = np.unique(np.asarray(p)[order], return_inverse=True)
        self.n_groups = int(self.group.max()) + 1 if len(p) else 0

    def auc(self, w: np.ndarray | None = None) -> float:
        """Weighted AUC (ties count half); ``w`` in the caller's original row order."""
        ws = np.ones(len(self.y)) if w is None else np.asarray(w, dtype=np.float64)[self.order]
        pos = np.bincount(self.group, weights=ws * self.y, minlength=self.n_groups)
        neg = np.bincount(self.group, weights=ws * (1 - self.y), minlength=self.n_groups)
        n_pos, n_neg = pos.sum(), neg.sum()
        if n_pos <= 0 or n_neg <= 0:
            return float("nan")
        below = np.cumsum(neg) - neg  # negative weight strictly below each group
        return float((pos * (below + 0.5 * neg)).sum() / (n_pos * n_neg))


def auc(y: np.ndarray, p: np.ndarray, w: np.ndarray | None = None) -> float:
    """Area under the ROC curve (ties count half); nan when a class is absent."""
    return AucPrep(y, p).auc(w)


def ranking_metrics(y: np.ndarray, p: np.ndarray, w: np.ndarray | None = None) -> dict[str, float]:
    return {
        "auc": auc(y, p, w),
        "ne": normalized_entropy(y, p, w),
        "log_loss": log_loss(y, p, w),
        "calibration": calibration(y, p, w),
    }


def relative_lift(baseline: np.ndarray | float, other: np.ndarray | float) -> np.ndarray | float:
    """Relative NE lift of ``other`` over ``baseline``: (NE_base - NE_other) / NE_base.

    Positive means ``other`` has the lower (better) normalized entropy.
    """
    return (np.asarray(baseline) - np.asarray(other)) / np.asarray(baseline)


def bootstrap_weights(groups: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    """(n_resamples, n) row weights of a cluster bootstrap: draw the clusters in ``groups`` (n,)
    with replacement; a row's weight is how often its cluster was drawn. Pass one group per row
    for a plain row bootstrap. Every arm uses the same draws, so differences are paired."""
    _, idx = np.unique(groups, return_inverse=True)
    k = int(idx.max()) + 1
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, k, size=(n_resamples, k))
    counts = np.stack([np.bincount(d, minlength=k) for d in draws])
    return counts[:, idx].astype(np.float64)


def bootstrap_ranking(
    y: np.ndarray,
    preds: Mapping[str, np.ndarray],
    weights: np.ndarray,
    baseline: str = "baseline",
) -> dict[str, dict[str, np.ndarray]]:
    """Per-arm metric draws under shared bootstrap ``weights`` (R, n), plus ``ne_lift`` draws of
    every other arm over ``baseline``.

    Returns:
        {arm: {"auc": (R,), "ne": (R,), "calibration": (R,), "ne_lift": (R,) (not for baseline)}}
    """
    out: dict[str, dict[str, np.ndarray]] = {}
    total = weights.sum(1)
    positives = weights @ y
    rate = np.clip(positives / total, EPS, 1 - EPS)
    background = -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))
    for arm, p in preds.items():
        prep = AucPrep(y, p)
        q = np.clip(p, EPS, 1 - EPS)
        row_loss = -(y * np.log(q) + (1 - y) * np.log(1 - q))
        with np.errstate(divide="ignore", invalid="ignore"):
            ne = np.where((positives > 0) & (positives < total), (weights @ row_loss) / total / background, np.nan)
            cal = np.where(positives > 0, (weights @ p) / positives, np.nan)
        out[arm] = {"auc": np.array([prep.auc(w) for w in weights]), "ne": ne, "calibration": cal}
    for arm in preds:
        if arm != baseline and baseline in out:
            out[arm]["ne_lift"] = relative_lift(out[baseline]["ne"], out[arm]["ne"])
    return out


def seed_mean_draws(
    y: np.ndarray,
    preds: Mapping[str, Sequence[np.ndarray]],
    weights: np.ndarray,
    baseline: str = "baseline",
    seed: int = 0,
) -> dict[str, dict[str, np.ndarray]]:
    """:func:`bootstrap_ranking` for rankers trained with several seeds: every arm has one
    prediction (n,) per seed, all arms the same seeds. Each draw (a row of ``weights`` (R, n))
    scores every seed's prediction, and also draws the seeds with replacement (a two-level
    bootstrap: rows and ranker seeds); a metric's draw is its mean over the drawn seeds, and
    ``ne_lift`` is that mean of the lift of the arm's seed s over the baseline's seed s (paired:
    same resample, same drawn seeds, same seed's holdout split and batch order).

    Why the seeds are drawn too: on completejourney the ranker seeds' NE lifts spread with an sd of
    0.3-0.45 points, as much as the test rows' bootstrap spread, so an interval over rows alone
    (what this returned before) under-stated the uncertainty of a mean over 5 or 10 seeds. With
    one seed nothing changes.

    Returns:
        {arm: {"auc": (R,), "ne": (R,), "calibration": (R,), "ne_lift": (R,) (not for baseline)}}
    """
    n_seeds = {len(ps) for ps in preds.values()}
    if len(n_seeds) != 1:
        raise ValueError(f"every arm needs one prediction per seed; got {({a: len(p) for a, p in preds.items()})}")
    n = n_seeds.pop()

    def one_seed(s: int) -> dict[str, dict[str, np.ndarray]]:
        return bootstrap_ranking(y, {arm: ps[s] for arm, ps in preds.items()}, weights, baseline)

    # the seeds' draws are independent and NumPy's gathers and sums release the GIL: two threads
    # (same results) took 6.2 s against 9.5 s for 4 arms x 4 seeds x 200 draws of 98k rows on 2
    # busy cores; the bootstrap of completejourney's 10 ranker seeds was ~35 s of `hir evaluate`
    workers = min(n, max(1, os.cpu_count() or 1), 4)
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            per_seed = list(pool.map(one_seed, range(n)))
    else:
        per_seed = [one_seed(s) for s in range(n)]
    # (R, S) how often each draw takes each seed (all ones with a single seed)
    picks = np.random.default_rng([seed, 29]).integers(0, n, size=(len(weights), n))
    share = np.stack([np.bincount(p, minlength=n) for p in picks]).astype(np.float64) / n
    out: dict[str, dict[str, np.ndarray]] = {}
    for arm in preds:
        out[arm] = {}
        for key in per_seed[0][arm]:
            vals = np.stack([d[arm][key] for d in per_seed], axis=1)  # (R, S)
            # a nan draw (a resample without positives) stays nan, as the plain mean kept it
            out[arm][key] = np.where(np.isnan(vals).any(1), np.nan, (np.nan_to_num(vals) * share).sum(1))
    return out


def interval(draws: np.ndarray, level: float = 0.95) -> list[float]:
    """Percentile interval of bootstrap draws (nan draws, from a resample without positives, dropped)."""
    d = np.asarray(draws, dtype=np.float64)
    d = d[np.isfinite(d)]
    if d.size == 0:
        return [float("nan"), float("nan")]
    lo, hi = np.quantile(d, [(1 - level) / 2, 1 - (1 - level) / 2])
    return [float(lo), float(hi)]


def reliability(y: np.ndarray, p: np.ndarray, bins: int = 10) -> dict[str, list[float]]:
    """Calibration curve over equal-count bins of ``p``: mean prediction, observed rate, count."""
    order = np.argsort(p)
    chunks = [c for c in np.array_split(order, bins) if len(c)]
    return {
        "predicted": [float(p[c].mean()) for c in chunks],
        "observed": [float(y[c].mean()) for c in chunks],
        "count": [float(len(c)) for c in chunks],
    }


def recall_per_user(topk: np.ndarray, relevant: Sequence[set[int]], k: int) -> np.ndarray:
    """(U,) recall@k of each user (NaN where the user has no relevant item): the per-user values
    whose mean :func:`recall_ndcg_at_k` reports, for paired comparisons of two arms or runs."""
    out = np.full(len(relevant), np.nan)
    for i, r in enumerate(relevant):
        if r:
            out[i] = sum(int(item) in r for item in topk[i, :k]) / len(r)
    return out


def hit_per_user(topk: np.ndarray, relevant: Sequence[set[int]], k: int) -> np.ndarray:
    """(U,) 1.0 where the user's top k holds at least one relevant item, 0.0 where not, NaN where
    the user has no relevant item: the per-user values whose mean is HR@k."""
    out = np.full(len(relevant), np.nan)
    for i, r in enumerate(relevant):
        if r:
            out[i] = float(any(int(item) in r for item in topk[i, :k]))
    return out


def recall_ndcg_at_k(
    topk: np.ndarray, relevant: Sequence[set[int]], ks: Sequence[int], hit_ratio: bool = False
) -> dict[str, float]:
    """Mean recall@K and NDCG@K (and, with ``hit_ratio``, HR@K) over users with at least one
    relevant item.

    Args:
        topk: (U, Kmax) retrieved item ids per user, best first (-1 = empty slot).
        relevant: per user, the set of held-out item ids.
        ks: cut-offs, each <= Kmax.
        hit_ratio: also report ``hr@K``, the share of those users with a relevant item in the top K.
    Returns:
        {"recall@K": ..., "ndcg@K": ...[, "hr@K": ...]} for each K, and "users": the number of
        users scored.
    """
    metrics = ("recall", "ndcg", "hr") if hit_ratio else ("recall", "ndcg")
    kmax = max(ks)
    if topk.shape[1] < kmax:
        raise ValueError(f"retrieved {topk.shape[1]} items per user, fewer than the largest K={kmax}")
    keep = [i for i, r in enumerate(relevant) if r]
    out: dict[str, float] = {"users": float(len(keep))}
    if not keep:
        return out | {f"{m}@{k}": float("nan") for k in ks for m in metrics}
    hits = np.array([[item in relevant[i] for item in topk[i, :kmax]] for i in keep], dtype=np.float64)
    n_rel = np.array([len(relevant[i]) for i in keep], dtype=np.float64)
    discount = 1.0 / np.log2(np.arange(2, kmax + 2))
    for k in ks:
        out[f"recall@{k}"] = float((hits[:, :k].sum(1) / n_rel).mean())
        dcg = (hits[:, :k] * discount[:k]).sum(1)
        ideal = np.array([discount[: int(min(n, k))].sum() for n in n_rel])
        out[f"ndcg@{k}"] = float((dcg / ideal).mean())
        if hit_ratio:
            out[f"hr@{k}"] = float((hits[:, :k].sum(1) > 0).mean())
    return out
