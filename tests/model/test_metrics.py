"""The ranking helpers of hir/model/metrics.py: one top-k serves every k, and a ranking whose
candidates differ only in a few rows equals a full re-ranking."""

from __future__ import annotations

import numpy as np

from hir.model.metrics import recall_of_top, recall_per_user, top_k_rows, top_k_variants


def _data(seed: int = 0, users: int = 37, cands: int = 300, d: int = 8):
    rng = np.random.default_rng(seed)
    u = rng.normal(size=(users, d)).astype(np.float32)
    c = rng.normal(size=(cands, d)).astype(np.float32)
    masked = [rng.choice(cands, rng.integers(0, 30), replace=False) for _ in range(users)]
    positives = [np.setdiff1d(rng.choice(cands, rng.integers(0, 6), replace=False), m) for m in masked]
    return u, c, masked, positives


def test_one_ranking_gives_the_recall_of_every_k() -> None:
    u, c, masked, positives = _data()
    top = top_k_rows(u, c, masked, 50, chunk=10)
    for k in (1, 10, 20, 50):
        want = recall_per_user(u, c, positives, masked, k)
        np.testing.assert_array_equal(recall_of_top(top, positives, k), want)
    # masked rows never appear
    assert not any(np.isin(row, m).any() for row, m in zip(top, masked))


def test_replacing_some_rows_ranks_as_the_replaced_matrix() -> None:
    u, c, masked, _ = _data(1)
    rng = np.random.default_rng(5)
    rows = np.sort(rng.choice(len(c), 40, replace=False))
    variants = [rng.normal(size=(len(rows), c.shape[1])).astype(np.float32) * s for s in (0.5, 1.0, 3.0)]
    got = list(top_k_variants(u, c, masked, 20, rows, iter(variants), chunk=16))
    assert len(got) == 3
    for var, top in zip(variants, got):
        full = c.copy()
        full[rows] = var
        np.testing.assert_array_equal(top, top_k_rows(u, full, masked, 20))
    # a large variant takes over the top of every list; a zero one leaves the fixed rows' ranking
    assert np.isin(got[2][:, 0], rows).mean() > np.isin(got[0][:, 0], rows).mean()
