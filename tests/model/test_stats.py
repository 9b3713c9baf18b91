"""The input statistics of hir/model/stats.py: the top score of users over the deep stage's
entities, a block of entities at a time, is the figure of their whole score matrix."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hir.model.metrics import BLOCK
from hir.model.stats import input_stats


def _world(run: bool, users: int = 700, seed: int = 0):
    """A store stand-in of ``users`` users then 2 * BLOCK + 900 entities in two types (deep pairs
    on type 1, or on types 1 and 3 with a type-2 run between them when not ``run``)."""
    rng = np.random.default_rng(seed)
    n_ent = 2 * BLOCK + 900
    node_type = np.r_[np.zeros(users, np.int64), np.ones(n_ent, np.int64)]
    if not run:
        node_type[users + 5000:users + 6000] = 2
        node_type[users + 6000:] = 3
    vec = rng.standard_normal((len(node_type), 24)).astype(np.float32)
    vec[rng.choice(users, 40, replace=False)] = 0  # users without a base
    deep = np.stack([np.arange(4), users + np.array([0, 1, 7000, 7001])], 1) if not run else \
        np.stack([np.arange(2), users + np.array([0, 1])], 1)
    store = SimpleNamespace(node_type=node_type, deep_pairs=deep)

    class Sampler:
        def engagement(self, ids, rng):
            return {"node": np.ones((len(ids), 3), np.int64), "relation": np.zeros((len(ids), 3), np.int64),
                    "hop": np.ones((len(ids), 3), np.int64)}

    return store, SimpleNamespace(vectors=vec), Sampler()


def _whole_top(store, vectors, ids, k):
    """input_stats' top score before the blocks: every entity row copied, each 256-user chunk's
    whole score matrix ranked."""
    b = vectors[ids].astype(np.float64)
    norm = np.linalg.norm(b, axis=1)
    has = norm > 0
    types = np.unique(store.node_type[store.deep_pairs[:, 1]])
    ents = np.flatnonzero(np.isin(store.node_type, types))
    ev = torch.from_numpy(np.ascontiguousarray(vectors[ents], np.float32))
    uv = (b[has] / norm[has, None]).astype(np.float32)
    kk = min(k, len(ents))
    sums = [float((torch.from_numpy(uv[lo:lo + 256]) @ ev.T).topk(kk, dim=1).values.double().sum())
            for lo in range(0, len(uv), 256)]
    return sum(sums) / (len(uv) * kk)


@pytest.mark.parametrize("run", [True, False])
@pytest.mark.parametrize("sample", [700, 546])  # users with a base: 660 (chunks 256, 256, 148), 518 (256, 256, 6)
def test_top_score_in_entity_blocks_is_the_whole_matrix_figure(run: bool, sample: int) -> None:
    store, base, sampler = _world(run)
    got = input_stats(store, base, sampler, np.arange(700), seed=1, sample=sample)
    ids = np.sort(np.random.default_rng([1, 17]).choice(np.arange(700), min(sample, 700), replace=False))
    assert got["top_score"] == round(_whole_top(store, base.vectors, ids, 20), 5)
    assert got["users"] == min(sample, 700)
