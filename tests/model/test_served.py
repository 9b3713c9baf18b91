"""The served dimension chosen on val (hir/model/served.py, ``export.dim=auto``): the smallest
candidate that ranks as well as the full rank, the cap when none does, the full rank below every
candidate; the basis file keeps the choice and export serves it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from hir.export.project import resolve_dim, served_rank
from hir.model import SpectralBasis, ValSet
from hir.model.served import Rows, cap, choose_served_dim, fit_basis, second_moment


def _world(spread: int, k: int = 16, users: int = 300, items: int = 200, seed: int = 0):
    """Base vectors of ``users`` users and ``items`` entities whose every direction lives in the
    first ``spread`` of ``k`` coordinates, and a val set whose positives are each user's top 5
    entities by the full-rank score (so the full rank's recall@20 is 1)."""
    rng = np.random.default_rng(seed)
    vec = np.zeros((users + items, k), np.float32)
    vec[:, :spread] = rng.standard_normal((users + items, spread))
    is_user = np.r_[np.ones(users, bool), np.zeros(items, bool)]
    scale = np.where(is_user, 1.0, rng.uniform(0.2, 0.9, users + items)).astype(np.float32)
    unit = vec / np.linalg.norm(vec, axis=1, keepdims=True)
    x = unit * scale[:, None]
    cands = np.arange(users, users + items)
    scores = x[:users] @ x[cands].T
    positives = [np.argsort(-row)[:5] for row in scores]
    val = ValSet(np.arange(users), cands, positives, [np.zeros(0, np.int64)] * users, "masked_new")
    return vec, scale, is_user, val


def test_the_smallest_dimension_that_ranks_as_well_is_taken() -> None:
    vec, scale, is_user, val = _world(spread=4)  # rank 16, but the data spans 4 directions
    d, report = choose_served_dim(vec, scale, is_user, val, [4, 8], 1.96, 0.0)
    recall = report["val_recall@20"]["new_to_user"]
    assert d == 4 and recall["full"] == pytest.approx(1.0)
    assert recall["4"] == pytest.approx(1.0) and report["candidates"] == [4, 8]


def test_the_cap_when_the_full_rank_beats_every_candidate() -> None:
    vec, scale, is_user, val = _world(spread=16)  # every direction carries signal
    d, report = choose_served_dim(vec, scale, is_user, val, [2, 4], 1.96, 0.0)
    assert d == 4  # the largest candidate (the cap), although the full rank beats it
    recall = report["val_recall@20"]["new_to_user"]
    assert recall["4"] < recall["full"] - 0.1 and set(recall) == {"full", "2", "4"}


def test_the_full_rank_below_every_candidate_and_the_cap_without_val() -> None:
    vec, scale, is_user, val = _world(spread=4)
    assert choose_served_dim(vec, scale, is_user, val, [16, 128], 1.96, 0.0)[0] == 0
    empty = ValSet(np.zeros(0, np.int64), val.cands, [], [], "masked_new")
    d, report = choose_served_dim(vec, scale, is_user, empty, [4, 8, 128], 1.96, 0.0)
    assert d == 8 == cap(16, [4, 8, 128]) and report["why"] == "no val users"
    assert cap(16, [128, 256]) == 0


def test_the_choice_is_the_basis_export_projects_with() -> None:
    """The directions scored on val are those export fits (fit_basis) on the same rows."""
    vec, scale, is_user, _ = _world(spread=6)
    unit = vec / np.linalg.norm(vec, axis=1, keepdims=True)
    x = unit * scale[:, None]
    p, kept = fit_basis(x[is_user], x[~is_user], 6)
    assert kept["captured_user"] == pytest.approx(1.0, abs=1e-5) and kept["captured_entity"] == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose((x[is_user] @ p) @ (x[~is_user] @ p).T, x[is_user] @ x[~is_user].T, atol=1e-5)


def test_export_dim_auto_resolves_to_the_recorded_choice(tmp_path: Path) -> None:
    assert served_rank("auto") == "auto" and served_rank("AUTO") == "auto"
    assert resolve_dim("auto", 128, 256) == 128 and resolve_dim("auto", 0, 256) is None
    assert resolve_dim("auto", None, 256) == 256  # a basis trained before the choice existed
    assert resolve_dim(64, 128, 256) == 64 and resolve_dim(None, 128, 256) is None
    rng = np.random.default_rng(0)
    basis = SpectralBasis(cols=np.array([1, 2]), v=rng.random((2, 2), np.float32), u=rng.random((3, 2), np.float32),
                          sigma=np.array([0.9, 0.5], np.float32), col_degree=np.ones(2, np.float32),
                          scale_ref=np.ones(3, np.float32), stage_base=4.0)
    basis.save(tmp_path / "none.npz")
    replace(basis, served_dim=0).save(tmp_path / "zero.npz")
    replace(basis, served_dim=128).save(tmp_path / "d.npz")
    assert SpectralBasis.load(tmp_path / "none.npz").served_dim is None
    assert SpectralBasis.load(tmp_path / "zero.npz").served_dim == 0
    assert SpectralBasis.load(tmp_path / "d.npz").served_dim == 128


def test_the_full_ranking_can_veto_a_dimension_new_to_user_recall_accepts() -> None:
    """A candidate must not lose the full ranking either: with new-to-user positives the
    projection does not hurt (drawn at random here) but full-ranking positives that need every
    direction, the cap is served, not the smallest candidate."""
    vec, scale, is_user, full = _world(spread=16)  # positives: each user's top 5 at full rank
    rng = np.random.default_rng(1)
    users = len(full.users)
    anywhere = ValSet(full.users, full.cands, [rng.choice(len(full.cands), 5, replace=False) for _ in range(users)],
                      [np.zeros(0, np.int64)] * users, "masked_new")
    alone, _ = choose_served_dim(vec, scale, is_user, anywhere, [2, 4], 1.96, 0.0)
    both, report = choose_served_dim(vec, scale, is_user, anywhere, [2, 4], 1.96, 0.0, full_ranking=full)
    assert alone == 2 and both == 4
    assert set(report["val_recall@20"]) == {"new_to_user", "full_ranking"}
    assert report["val_recall@20"]["full_ranking"]["2"] < report["val_recall@20"]["full_ranking"]["full"] - 0.1


def test_rows_of_the_scaled_base_are_the_rows_of_its_whole_copy() -> None:
    # choose_served_dim reads x = vectors * factor[:, None] through Rows, never whole: the same bits
    rng = np.random.default_rng(3)
    vec = rng.standard_normal((500, 12)).astype(np.float32)
    factor = rng.uniform(0, 2, 500).astype(np.float32)
    factor[::7] = 0
    whole = vec * factor[:, None]
    rows = np.sort(rng.choice(500, 200, replace=False))
    lazy = Rows(vec, rows, 12, factor)
    np.testing.assert_array_equal(np.concatenate([lazy[lo:lo + 64] for lo in range(0, 200, 64)]), whole[rows])
    np.testing.assert_array_equal(Rows(vec, np.arange(500), 12, factor)[rows[::-1]], whole[rows[::-1]])
    np.testing.assert_array_equal(second_moment(lazy, chunk=64), second_moment(Rows(whole, rows, 12), chunk=64))
