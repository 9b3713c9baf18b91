"""Content-neighbour placement of cold entities (hir.export.cold)."""

from __future__ import annotations

import numpy as np

from hir.export.cold import neighbour_placement, placed


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_a_cold_entity_lands_by_its_text_twins_and_keeps_its_own_identity() -> None:
    rng = np.random.default_rng(0)
    k_dim, n_warm = 16, 200
    s = _unit(rng.normal(size=(n_warm, k_dim)))
    a = rng.uniform(0.05, 0.3, n_warm)
    ref_z = np.hstack([s * a[:, None], np.sqrt(1 - a**2)[:, None]]).astype(np.float32)
    ref_text = _unit(rng.normal(size=(n_warm, 32))).astype(np.float32)
    # two cold entities whose text is (nearly) warm entity 7's, with different knowledge views
    q = _unit(ref_text[[7, 7]] + 0.01 * rng.normal(size=(2, 32))).astype(np.float32)
    own = np.hstack([_unit(rng.normal(size=(2, k_dim))) * 0.1, np.full((2, 1), np.sqrt(0.99))]).astype(np.float32)
    dirs, mean_a = neighbour_placement(own, q, ref_z, ref_text, k=1, beta=0.1)
    np.testing.assert_allclose(np.linalg.norm(dirs, axis=1), 1.0, atol=1e-5)
    assert (dirs @ s[7] > 0.99).all()  # where its text twin is
    assert abs(dirs[0] @ dirs[1]) < 1 - 1e-4  # told apart by their own views
    np.testing.assert_allclose(mean_a, a[7], rtol=1e-3)
    z = placed(np.zeros((3, k_dim + 1), np.float32), np.array([0, 2]), dirs, mean_a, boost=2.0)
    np.testing.assert_allclose(np.linalg.norm(z[[0, 2]], axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(z[[0, 2], :-1], axis=1), min(1.0, 2 * a[7]), rtol=1e-3)
    assert not z[1].any()
    # a boost past 1 / a clips at scale 1 (no slack left)
    top = placed(np.zeros((1, k_dim + 1), np.float32), np.array([0]), dirs[:1], np.array([0.6], np.float32), 3.0)
    assert abs(np.linalg.norm(top[0, :-1]) - 1.0) < 1e-6 and top[0, -1] == 0.0
