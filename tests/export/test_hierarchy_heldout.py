"""The held-out hierarchy measures (hir/export/heldout.py) on hand-built pairs."""

from __future__ import annotations

import numpy as np
import pytest

from hir.export.heldout import (
    aligned_agreement,
    degree_matched_permutation,
    heldout_concentration,
    prototypes_of,
    taxonomy_purity,
    token_coverage,
    token_prediction,
)


def two_interest_pairs(n_users: int = 40, per_user: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Users 0..n/2 engage entities 0..9, the rest entities 10..19 (distinct pairs)."""
    rng = np.random.default_rng(seed)
    u, e = [], []
    for user in range(n_users):
        lo = 0 if user < n_users // 2 else 10
        for ent in rng.choice(np.arange(lo, lo + 10), per_user, replace=False):
            u.append(user)
            e.append(ent)
    return np.array(u), np.array(e)


def test_permutation_moves_entities_only_among_equal_degrees() -> None:
    ents = np.arange(8)
    degree = np.array([1, 1, 1, 1, 9, 9, 9, 9])
    perm = degree_matched_permutation(ents, degree, np.random.default_rng(0), bins=2)
    assert sorted(perm) == list(ents)
    assert set(perm[:4]) == {0, 1, 2, 3} and set(perm[4:]) == {4, 5, 6, 7}


def test_concentration_is_low_for_interest_tokens_and_near_one_for_random_ones() -> None:
    users, ents = two_interest_pairs()
    interest = np.repeat([0, 1], 10)  # token = the interest the entity belongs to
    random = np.random.default_rng(1).permutation(interest)
    got = heldout_concentration(users, ents, [interest, random], (2, 2), shuffles=8, bins=1)
    assert got[0]["edges"] == 40  # every user touches one token
    assert got[0]["concentration"] < 0.7
    assert 0.85 < got[1]["concentration"] < 1.15


def test_prediction_beats_popularity_only_when_tokens_carry_interest() -> None:
    hist = two_interest_pairs(seed=0)
    val = two_interest_pairs(seed=1)
    test = two_interest_pairs(seed=2)
    interest = np.repeat([0, 1], 10)
    parity = np.arange(20) % 2  # a token that cuts across both interests
    got = token_prediction(hist, val, hist, test, [interest, parity], (2, 2), tops=(1,))
    assert got[0]["pairs"] > 0 and got[0]["pairs"] == got[1]["pairs"]
    assert got[0]["hir"]["log_loss"] < got[0]["popularity"]["log_loss"] - 0.3
    assert got[0]["hir"]["recall@1"] == pytest.approx(1.0)
    assert got[1]["hir"]["log_loss"] > got[0]["hir"]["log_loss"] + 0.3


def test_prediction_counts_only_new_pairs_of_users_with_history() -> None:
    hist = (np.array([0, 0]), np.array([1, 2]))
    test = (np.array([0, 0, 1]), np.array([1, 3, 3]))  # (0,1) repeats; user 1 has no history
    got = token_prediction(hist, hist, hist, test, [np.array([0, 0, 1, 1])], (2,))
    assert got[0]["pairs"] == 1 and got[0]["users"] == 1


def test_coverage_of_token_edges_exceeds_the_raw_edges() -> None:
    hist = two_interest_pairs(seed=0)
    test = two_interest_pairs(seed=2)
    interest = np.repeat([0, 1], 10)
    got = token_coverage(hist, test, [interest], (2,))
    assert got["levels"][0]["coverage"] == 1.0  # every user's test tokens are in their history
    assert got["raw_coverage"] < 0.5


def test_purity_and_aligned_agreement() -> None:
    assert taxonomy_purity(np.array([0, 0, 1, 1]), np.array([5, 5, 5, 7])) == 0.75
    x = np.eye(3)[[0, 0, 1, 2, 2]]
    a = np.array([0, 0, 1, 2, 2])
    b = np.array([2, 2, 0, 1, 1])  # the same grouping under other ids
    assert aligned_agreement(a, b, prototypes_of(x, a, 3), prototypes_of(x, b, 3)) == 1.0
    b2 = np.array([2, 2, 0, 1, 0])
    assert aligned_agreement(a, b2, prototypes_of(x, a, 3), prototypes_of(x, b2, 3)) == pytest.approx(0.8)


def test_prediction_does_not_depend_on_the_user_block_size() -> None:
    from hir.export.heldout import _predict

    rng = np.random.default_rng(3)
    hu, ht = rng.integers(0, 50, 400), rng.integers(0, 6, 400)
    u, t = rng.integers(0, 60, 300), rng.integers(0, 6, 300)  # users 50-59 have no history
    pop = np.full(6, 1 / 6)
    whole = _predict(hu, ht, pop, 2.0, u, t, (1, 3), block=1000)
    assert _predict(hu, ht, pop, 2.0, u, t, (1, 3), block=7) == pytest.approx(whole)
