"""Content-neighbour placement of cold entities (hir.export.cold)."""

from __future__ import annotations

import numpy as np

from hir.export.cold import neighbour_placement, own_directions, placed


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


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
    dirs, mean_a, _ = neighbour_placement(own, q, ref_z, ref_text, k=1, beta=0.1)
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


def _twin_family(rng: np.random.Generator, beta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Four cold near-twin texts (cosine 0.74-0.82, like online_retail's 'LETTER "O" / "U" / "W" /
    "Z" BLING KEY RING') whose 20 nearest warm entities are one family of 20 (e.g. the other
    letters), and knowledge views that share one direction up to a small text-specific part (cosine
    0.9993-0.9997, as the trained view gives them): their placed directions (4, 16), the family's
    collaborative direction (16,) and the knowledge views (4, 17)."""
    k_dim, t_dim = 16, 32
    fam_text = _unit(rng.normal(size=t_dim))
    other_text = _unit(-2 * fam_text + rng.normal(size=(180, t_dim)) / np.sqrt(t_dim))
    ref_text = np.vstack([_unit(fam_text + 0.5 * _unit(rng.normal(size=(20, t_dim)))), other_text]).astype(np.float32)
    fam_dir = _unit(rng.normal(size=k_dim))
    s = np.vstack([_unit(fam_dir + 0.1 * _unit(rng.normal(size=(20, k_dim)))), _unit(rng.normal(size=(180, k_dim)))])
    a = rng.uniform(0.05, 0.3, 200)
    ref_z = np.hstack([s * a[:, None], np.sqrt(1 - a**2)[:, None]]).astype(np.float32)
    q = _unit(fam_text + 0.5 * _unit(rng.normal(size=(4, t_dim)))).astype(np.float32)
    own_dir = _unit(_unit(rng.normal(size=k_dim)) + 0.05 * _unit(q @ rng.normal(size=(t_dim, k_dim))))
    own = np.hstack([own_dir * 0.1, np.full((4, 1), np.sqrt(0.99))]).astype(np.float32)
    dirs, _, _ = neighbour_placement(own, q, ref_z, ref_text, k=20, beta=beta)
    return dirs, fam_dir, own


def test_near_twin_texts_with_one_shared_knowledge_view_are_told_apart() -> None:
    """The validate check (hir.validate.views.coverage_view): cold entities with different texts
    must not share a direction (cosine >= 1 - 1e-4). The neighbours' mean alone gives the twins
    cosine ~0.99998 (the same 20 neighbours, nearly equal text weights) and so does the raw
    knowledge view; its centred part (own_directions) tells them apart, and they still land by
    their family."""
    for beta in (0.1, 0.3):
        dirs, fam_dir, own = _twin_family(np.random.default_rng(0), beta)
        raw = own[:, :-1] / np.linalg.norm(own[:, :-1], axis=1, keepdims=True)
        assert (raw @ raw.T).min() > 0.999  # the knowledge views nearly coincide
        cos = dirs @ dirs.T
        np.fill_diagonal(cos, -1.0)
        assert cos.max() < 1 - 1e-3, f"beta {beta}: twins at cosine {cos.max():.6f}"
        assert (dirs @ fam_dir).min() > 0.9  # where the family is


def test_own_directions_remove_the_shared_centre_and_reuse_a_given_one() -> None:
    rng = np.random.default_rng(1)
    own = np.hstack([_unit(rng.normal(size=(5, 8)) + 10.0), np.ones((5, 1))]).astype(np.float32)
    res, centre = own_directions(own)
    unit = own[:, :-1] / np.linalg.norm(own[:, :-1], axis=1, keepdims=True)
    np.testing.assert_allclose(centre, unit.mean(0), rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(res, axis=1), 1.0, atol=1e-5)
    assert abs((res @ res.T)[np.triu_indices(5, 1)]).mean() < 0.6  # no longer one shared direction
    # a refresh centres new rows on the export's centre, not on their own mean
    again, same = own_directions(own[:2], centre)
    np.testing.assert_allclose(again, res[:2], atol=1e-6)
    np.testing.assert_array_equal(same, centre)
