"""The DLRM-style ranker: shapes, a learnable planted signal, grouped early-stopping holdout."""

from __future__ import annotations

import numpy as np
import torch

from hir_evaluation.metrics import auc, calibration
from hir_evaluation.ranking.features import RankerInputs
from hir_evaluation.ranking.ranker import DLRM, RankerConfig, fit_ranker, holdout_split
from hir_evaluation.sources.hir import TokenBag


def _inputs(n: int, rng: np.random.Generator) -> tuple[RankerInputs, np.ndarray]:
    """Label = the user's and the entity's hidden group agree (only learnable through ids/vectors/bags)."""
    users = rng.integers(0, 60, n)
    items = rng.integers(0, 80, n)
    ug, ig = users % 3, items % 3
    y = ((ug == ig) & (rng.random(n) < 0.8)).astype(np.float64)
    vec = np.eye(3, dtype=np.float32)[ig] + 0.1 * rng.normal(size=(n, 3)).astype(np.float32)
    bag = TokenBag(np.stack([ug, (ug + 1) % 3], 1).astype(np.int64), np.tile([0.9, 0.1], (n, 1)).astype(np.float32), 3)
    x = RankerInputs(
        dense=rng.normal(size=(n, 2)).astype(np.float32), dense_names=["noise_a", "noise_b"],
        sparse=np.stack([users + 1, items + 1], 1).astype(np.int64), sparse_names=["user", "entity"], vocab=[61, 81],
        vectors={"entity_vec": vec}, bags={"user_tok": bag},
    )
    return x, y


def test_forward_shapes_and_repr() -> None:
    rng = np.random.default_rng(0)
    x, _ = _inputs(32, rng)
    model = DLRM(2, x.vocab, {"entity_vec": 3}, {"user_tok": 3}, RankerConfig(dim=8))
    dense = torch.from_numpy(x.dense)
    sparse = torch.from_numpy(x.sparse)
    out = model(dense, sparse, {"entity_vec": torch.from_numpy(x.vectors["entity_vec"])},
                {"user_tok": (torch.from_numpy(x.bags["user_tok"].ids), torch.from_numpy(x.bags["user_tok"].weights))})
    assert out.shape == (32,)
    # 5 interacting vectors (bottom, 2 tables, 1 projection, 1 bag) -> 10 pairwise dots
    assert "interactions=10" in repr(model)


def test_learns_a_planted_signal_and_stays_calibrated() -> None:
    rng = np.random.default_rng(1)
    x, y = _inputs(6000, rng)
    users = x.sparse[:, 0]
    cfg = RankerConfig(dim=8, lr=0.01, batch_size=256, max_steps=600, eval_every=50, patience=3)
    fitted = fit_ranker(x.subset(np.arange(5000)), y[:5000], users[:5000], cfg, seed=0)
    p = fitted.predict(x.subset(np.arange(5000, 6000)))
    assert auc(y[5000:], p) > 0.85
    assert 0.8 < calibration(y[5000:], p) < 1.25
    # same seed, same data -> the same model (every arm shares one recipe)
    again = fit_ranker(x.subset(np.arange(5000)), y[:5000], users[:5000], cfg, seed=0)
    assert np.allclose(again.predict(x.subset(np.arange(5000, 5100))), p[:100], atol=1e-6)


def test_holdout_is_grouped_by_user() -> None:
    users = np.repeat(np.arange(50), 4)
    fit, hold = holdout_split(users, 0.2, seed=0)
    assert set(users[fit]).isdisjoint(users[hold])
    assert len(set(users[hold])) == 10 and len(fit) + len(hold) == len(users)


def test_a_ranker_pool_fits_every_other_seed_with_the_same_results(caplog) -> None:
    """fit_arm with eval.ranker_workers' pool (a spawned process fits seeds 1 and 3 of 4) returns
    what fitting all four here returns, in seed order, and the pool's log lines reach this log."""
    import logging

    from hir_evaluation.ranking.evaluate import fit_arm, ranker_pool

    rng = np.random.default_rng(2)
    x, y = _inputs(1200, rng)
    users = x.sparse[:, 0]
    times = np.arange(len(y))
    cfg = RankerConfig(dim=8, lr=0.01, batch_size=128, max_steps=60, eval_every=20, patience=2)
    seeds = [5, 6, 7, 8]
    plan = [(np.arange(1000), np.arange(200))]
    test_idx = np.arange(1000, 1200)
    serial, serial_fits = fit_arm("arm", x, y, users, times, cfg, seeds, plan, test_idx, False)
    pool = ranker_pool(2, len(seeds))
    assert pool is not None and ranker_pool(1, 4) is None and ranker_pool(2, 1) is None
    try:
        with caplog.at_level(logging.INFO):
            pooled, pooled_fits = fit_arm("arm", x, y, users, times, cfg, seeds, plan, test_idx, False, pool=pool)
    finally:
        pool.shutdown()
    assert [f["seed"] for f in pooled_fits] == seeds
    assert [f["best_step"] for f in pooled_fits] == [f["best_step"] for f in serial_fits]
    for a, b in zip(serial, pooled):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert any("ranker arm (seed 6)" in r.getMessage() for r in caplog.records)
