"""CSR.build_pairs (the graph load's lower-memory build) is CSR.build of both directions, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from hir.model.csr import CSR


@pytest.mark.parametrize("seed", [0, 1])
def test_build_pairs_is_build_of_both_directions(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, p = 50, 400
    u = rng.integers(0, 20, p).astype(np.int64)
    v = rng.integers(20, n, p).astype(np.int64)
    u[:30], v[:30] = u[30:60], v[30:60]  # repeated pairs: ties the sort must break as build does
    w = rng.random(p)
    feats = {"stage": rng.integers(1, 4, p).astype(np.int8), "recency": rng.integers(1, 6, p).astype(np.int8),
             "count": rng.random(p).astype(np.float32), "age": rng.random(p).astype(np.float32)}
    both = lambda a, b: np.concatenate([a, b])  # noqa: E731
    want = CSR.build(n, both(u, v), both(v, u), both(w, w), **{k: both(x, x) for k, x in feats.items()})
    got = CSR.build_pairs(n, u, v, w, dict(feats))
    for name in ("indptr", "dst", "weight", "cumw", "stage", "recency", "count", "age", "hop"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    # features not given take build's defaults (0, hop 1)
    bare = CSR.build_pairs(n, u, v, w, {})
    ref = CSR.build(n, both(u, v), both(v, u), both(w, w))
    for name in ("stage", "recency", "count", "age", "hop"):
        assert np.array_equal(getattr(bare, name), getattr(ref, name)), name
