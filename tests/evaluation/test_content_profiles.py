"""Content user profiles: the mean text vector of each user's (user, entity) pairs, re-normalised."""

from __future__ import annotations

import numpy as np

from hir_evaluation.sources.content import user_profiles


def test_profiles_are_the_normalised_sum_over_pairs() -> None:
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(40, 6)).astype(np.float32)
    has = rng.random(40) > 0.3
    vecs[~has] = 0
    users, entities = rng.integers(0, 9, 120), rng.integers(0, 40, 120)  # repeated pairs count twice
    profiles, present = user_profiles(vecs, has, users, entities, 10)
    for u in range(10):
        rows = [vecs[e].astype(np.float64) for uu, e in zip(users, entities) if uu == u and has[e]]
        total = np.sum(rows, axis=0) if rows else np.zeros(6)
        norm = np.linalg.norm(total)
        assert present[u] == (norm > 0)
        assert np.allclose(profiles[u], total / norm if norm > 0 else 0.0, atol=1e-6)
    assert not present[9]  # user 9 has no pairs
