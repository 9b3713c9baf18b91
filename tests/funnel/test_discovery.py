"""Discovery candidates (hir.funnel.discovery.ViewBase.topk): ranked a block of entities at a time,
they are the whole score block's ranking bit for bit, ties and masks included."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from hir.funnel.discovery import ViewBase


def _whole(base: ViewBase, users: np.ndarray, mask: sp.csr_matrix | None, k: int, chunk: int
           ) -> tuple[np.ndarray, np.ndarray]:
    """ViewBase.topk before the blocks: the whole (chunk, E) score block, masked, ranked by torch.topk."""
    ent = torch.from_numpy(base.entities)
    ids = np.full((len(users), k), -1, np.int64)
    vals = np.full((len(users), k), -np.inf, np.float32)
    for lo in range(0, len(users), chunk):
        batch = users[lo:lo + chunk]
        s = torch.from_numpy(base.users[batch]) @ ent.T  # (B, E)
        if mask is not None:
            m = mask[batch].tocoo()
            s[torch.from_numpy(m.row.astype(np.int64)), torch.from_numpy(m.col.astype(np.int64))] = -torch.inf
        v, i = torch.topk(s, min(k, s.shape[1]), dim=1)
        ids[lo:lo + len(batch), : i.shape[1]] = i.numpy()
        vals[lo:lo + len(batch), : v.shape[1]] = v.numpy()
    ids[~np.isfinite(vals)] = -1
    return ids, vals


def _assert_same(base: ViewBase, users: np.ndarray, mask: sp.csr_matrix | None, k: int, chunk: int,
                 block: int) -> None:
    want_i, want_v = _whole(base, users, mask, k, chunk)
    got_i, got_v = base.topk(users, mask, k, chunk, block)
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_array_equal(got_v.view(np.int32), want_v.view(np.int32))  # bits, -0 and -inf too


def _tied(seed: int, n_users: int = 180, n_entities: int = 1500, d: int = 3) -> tuple[ViewBase, sp.csr_matrix]:
    """Small integer vectors (exact scores, most of them tied), zero users (no events in the view),
    zero and duplicate entities, and a mask of up to 40 entities a user; every 13th user masked
    down to 8 entities (fewer than k remain: -1 / -inf)."""
    rng = np.random.default_rng(seed)
    users = rng.integers(-2, 3, size=(n_users, d)).astype(np.float32)
    users[::7] = 0
    ent = rng.integers(-2, 3, size=(n_entities, d)).astype(np.float32)
    ent[::40] = 0
    ent[1::40] = ent[3]
    rows = [rng.choice(n_entities, rng.integers(0, 40), replace=False) for _ in range(n_users)]
    for u in range(0, n_users, 13):
        rows[u] = np.setdiff1d(np.arange(n_entities), rng.choice(n_entities, 8, replace=False))
    mask = sp.csr_matrix((np.ones(sum(map(len, rows)), np.float32),
                          (np.repeat(np.arange(n_users), [len(r) for r in rows]), np.concatenate(rows))),
                         shape=(n_users, n_entities))
    return ViewBase(users, ent), mask


def test_blocked_topk_is_the_whole_blocks_ranking_with_ties_and_masks() -> None:
    base, mask = _tied(0)
    users = np.random.default_rng(1).permutation(len(base.users))  # any order of users, as fit.py asks
    for k in (1, 5, 20, 60):
        # chunks of 64 users (the last 52) and of 20 (the last 0 < SMALL_CHUNK: one product), entity
        # blocks of >= 128 of the 1,500 (the merge) and one block
        for chunk, block in ((64, 128), (20, 128), (64, 100), (64, 1 << 20)):
            _assert_same(base, users, mask, k, chunk, block)
    # masked down below k: those users end in -1 / -inf, the others are full
    ids, vals = base.topk(users, mask, 20, 64, 128)
    short = np.isin(users, np.arange(0, len(base.users), 13))
    assert (ids[short][:, 8:] == -1).all() and np.isneginf(vals[short][:, 8:]).all()
    assert (ids[~short] >= 0).all()
    # k past the entities: padded with -1 / -inf, no mask
    _assert_same(ViewBase(base.users, base.entities[:300]), users[:40], None, 400, 32, 64)


def test_blocked_topk_on_random_scores() -> None:
    rng = np.random.default_rng(2)
    base = ViewBase(rng.normal(size=(150, 32)).astype(np.float32), rng.normal(size=(3001, 32)).astype(np.float32))
    rows = [rng.choice(3001, rng.integers(0, 200), replace=False) for _ in range(150)]
    mask = sp.csr_matrix((np.ones(sum(map(len, rows)), np.float32),
                          (np.repeat(np.arange(150), [len(r) for r in rows]), np.concatenate(rows))), shape=(150, 3001))
    users = np.arange(150)
    for k in (1, 50):
        _assert_same(base, users, mask, k, 96, 256)
        _assert_same(base, users, None, k, 96, 256)
