"""The ranking helpers of hir/model/metrics.py: one top-k serves every k, and a ranking whose
candidates differ only in a few rows equals a full re-ranking."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from hir.model.metrics import (
    chunk_topk,
    column_blocks,
    recall_of_top,
    recall_per_user,
    top_k_rows,
    top_k_variants,
)


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


# -- the blocked ranking equals the whole score matrix's, ties included --------------------------
def _reference(u: np.ndarray, c: np.ndarray, masked: list[np.ndarray], k: int, chunk: int = 1024):
    """top_k_rows before the blocks: the whole (chunk, M) score matrix, ranked by torch.topk;
    its (U, k') values and indices."""
    cand = torch.from_numpy(np.ascontiguousarray(c, np.float32))
    kk = min(k, len(c))
    vals, idx = [], []
    for lo in range(0, len(u), chunk):
        scores = torch.from_numpy(np.ascontiguousarray(u[lo:lo + chunk], np.float32)) @ cand.T
        for i, m in enumerate(masked[lo:lo + chunk]):
            if len(m):
                scores[i, torch.from_numpy(np.asarray(m, np.int64))] = -torch.inf
        t = scores.topk(kk, dim=1)
        vals.append(t.values)
        idx.append(t.indices)
    return torch.cat(vals).numpy(), torch.cat(idx).numpy()


def _blocked(u: np.ndarray, c: np.ndarray, masked: list[np.ndarray], k: int, chunk: int, block: int):
    cand = torch.from_numpy(np.ascontiguousarray(c, np.float32))
    kk = min(k, len(c))
    parts = [chunk_topk(torch.from_numpy(np.ascontiguousarray(u[lo:lo + chunk], np.float32)), cand,
                        masked[lo:lo + chunk], kk, block) for lo in range(0, len(u), chunk)]
    return torch.cat([p[0] for p in parts]).numpy(), torch.cat([p[1] for p in parts]).numpy()


def _assert_same(u, c, masked, k, chunk, block) -> None:
    want_v, want_i = _reference(u, c, masked, k, chunk)
    got_v, got_i = _blocked(u, c, masked, k, chunk, block)
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_array_equal(got_v.view(np.int32), want_v.view(np.int32))  # bits, -0 and NaN too
    np.testing.assert_array_equal(top_k_rows(u, c, masked, k, chunk, block), want_i)


def test_column_blocks_cover_the_columns_and_are_never_narrow() -> None:
    for m in (0, 1, 63, 64, 127, 128, 129, 1000, 4097):
        blocks = column_blocks(m, 64)
        assert blocks[0][0] == 0 and blocks[-1][1] == m
        assert all(a[1] == b[0] for a, b in itertools.pairwise(blocks))
        assert all(hi - lo >= 64 for lo, hi in blocks) or len(blocks) == 1
    assert len(column_blocks(1000, 64)) == 15


def test_blocked_ranking_is_the_whole_matrix_ranking_on_random_scores() -> None:
    # 250 users in chunks of 96 (the last 58), 3,001 candidates in blocks of >= 256, masks of up
    # to 300 rows; and one chunk under SMALL_CHUNK users (scored whole)
    u, c, masked, _ = _data(3, users=250, cands=3001, d=24)
    rng = np.random.default_rng(4)
    masked = [rng.choice(3001, rng.integers(0, 300), replace=False) for _ in range(250)]
    for k in (1, 20, 100):
        _assert_same(u, c, masked, k, 96, 256)
    _assert_same(u[:7], c, masked[:7], 20, 96, 256)


def test_blocked_ranking_keeps_torchs_order_of_ties() -> None:
    # small integer vectors: every score exact and most of them tied; duplicate and zero
    # candidates, zero users, and users masked down to fewer candidates than k (-inf reached)
    rng = np.random.default_rng(5)
    u = rng.integers(-2, 3, size=(200, 3)).astype(np.float32)
    u[::9] = 0
    c = rng.integers(-2, 3, size=(2000, 3)).astype(np.float32)
    c[::50] = 0
    c[1::50] = c[2]
    masked = [rng.choice(2000, rng.integers(0, 40), replace=False) for _ in range(200)]
    for i in range(0, 200, 17):
        masked[i] = np.setdiff1d(np.arange(2000), rng.choice(2000, 10, replace=False))
    for k in (1, 5, 20, 50):
        _assert_same(u, c, masked, k, 64, 128)
    # candidates fewer than k + 1 per block edge; k = M
    _assert_same(u[:40], c[:300], [m[m < 300] for m in masked[:40]], 300, 32, 100)


def test_blocked_ranking_with_non_finite_candidates() -> None:
    # a NaN candidate ranks first (torch's rule) and makes a zero user's scores NaN, not 0
    rng = np.random.default_rng(6)
    u = rng.integers(-1, 2, size=(48, 4)).astype(np.float32)
    u[:5] = 0
    c = rng.integers(-1, 2, size=(700, 4)).astype(np.float32)
    c[10] = np.nan
    c[400, 0] = np.inf
    masked = [rng.choice(700, 5, replace=False) for _ in range(48)]
    _assert_same(u, c, masked, 20, 24, 200)


def test_variants_in_blocks_rank_as_the_replaced_matrix() -> None:
    u, c, masked, _ = _data(7, users=120, cands=2500, d=16)
    rng = np.random.default_rng(8)
    rows = np.sort(rng.choice(len(c), 300, replace=False))
    variants = [rng.normal(size=(len(rows), c.shape[1])).astype(np.float32) * s for s in (0.5, 2.0)]
    got = list(top_k_variants(u, c, masked, 20, rows, iter(variants), chunk=32, block=256))
    want = list(top_k_variants(u, c, masked, 20, rows, iter(variants), chunk=32, block=1 << 20))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_a_mask_outside_the_candidates_is_an_error_not_dropped() -> None:
    """As indexing the whole score matrix did, a masked row >= M (or < -M) raises, on the blocked path too."""
    from hir.model.metrics import top_k_rows

    rng = np.random.default_rng(3)
    users, cand = rng.normal(size=(20, 4)).astype(np.float32), rng.normal(size=(40_000, 4)).astype(np.float32)
    masked = [np.array([1, 2])] * 19 + [np.array([40_000])]
    with pytest.raises(IndexError, match="outside the 40000 candidates"):
        top_k_rows(users, cand, masked, 10)


def _duplicated(seed: int, users: int, cands: int, d: int, copies: int):
    """Float vectors (sums not exact, so the order of a product's sum shows in its bits) whose
    candidates are ``cands // copies`` distinct rows repeated: every user ties in its top k, as
    completejourney's warm texts do (4,141 distinct among 69,836)."""
    rng = np.random.default_rng(seed)
    u = rng.normal(size=(users, d)).astype(np.float32)
    c = rng.normal(size=(cands // copies, d)).astype(np.float32)[rng.integers(0, cands // copies, cands)]
    masked = [rng.choice(cands, rng.integers(0, 20), replace=False) for _ in range(users)]
    return u, c, masked


def test_rows_rebuilt_from_their_own_product_keep_the_chunks_bits() -> None:
    # every row unsure: rebuilt in groups of 96 * 256 // 6001 = 4 rows, padded to SMALL_CHUNK (at
    # d 256 a product of 4 rows alone has other bits than those rows of a larger one), and in
    # chunks of 300, of 12; d 48 too
    for d in (48, 256):
        u, c, masked = _duplicated(9, 300, 6001, d, 6)
        _assert_same(u, c, masked, 20, 96, 256)
        _assert_same(u, c, masked, 20, 300, 256)


def test_a_rebuilt_row_whose_bits_differ_is_taken_from_the_chunks_products(monkeypatch) -> None:
    """Where the rows' own product sums in another order (a BLAS whose kernel depends on the row
    count), chunk_topk sees its top values differ from the first pass's and takes the chunk's
    products: the same ranking as the whole matrix."""
    from hir.model import metrics

    rebuilt = metrics._rebuilt_rows
    taken = []

    def other_order(users, cand, blocks, pick, subset):
        full = rebuilt(users, cand, blocks, pick, subset)
        taken.append(subset)
        return torch.nextafter(full, torch.tensor(np.inf)) if subset else full  # one ulp up: other bits

    monkeypatch.setattr(metrics, "_rebuilt_rows", other_order)
    u, c, masked = _duplicated(10, 120, 2000, 32, 5)
    _assert_same(u, c, masked, 10, 64, 256)
    assert True in taken and False in taken
