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
    whole = _predict(hu, ht, pop, (2.0,), u, t, (1, 3), block=1000)[0]
    assert _predict(hu, ht, pop, (2.0,), u, t, (1, 3), block=7)[0] == pytest.approx(whole)


def _predict_loop_reference(hist_users: np.ndarray, hist_tokens: np.ndarray, pop: np.ndarray, alpha: float,
                            users: np.ndarray, tokens: np.ndarray, tops: tuple[int, ...]) -> dict[str, float]:
    """The predictor pair by pair: the user's (k,) distribution formed whole, the rank by comparison."""
    k, loss, hits = len(pop), 0.0, np.zeros(len(tops))
    for u, t in zip(users, tokens):
        counts = np.bincount(hist_tokens[hist_users == u], minlength=k).astype(np.float64)
        p = (counts + alpha * pop) / (counts.sum() + alpha)
        loss -= np.log(p[t])
        rank = (p > p[t]).sum() + (p == p[t]).sum() - 1
        hits += [rank < m for m in tops]
    return {"log_loss": loss / len(users), **{f"recall@{m}": h / len(users) for m, h in zip(tops, hits)}}


@pytest.mark.parametrize("seed", range(4))
def test_predict_matches_the_pair_by_pair_reference(seed: int) -> None:
    from hir.export.heldout import _predict

    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 9))
    hu, ht = rng.integers(0, 30, 200), rng.integers(0, k, 200)
    u, t = rng.integers(0, 35, 150), rng.integers(0, k, 150)  # users 30-34 have no history
    # a uniform popularity ties every token a user never engaged: ties count against the true token
    pop = np.full(k, 1 / k) if seed % 2 else rng.dirichlet(np.ones(k))
    alphas = (1.0, 3.0, 30.0)
    block = int(rng.integers(1, 40))
    got = _predict(hu, ht, pop, alphas, u, t, (1, 2, 5), block=block)
    for alpha, g in zip(alphas, got):
        assert g == pytest.approx(_predict_loop_reference(hu, ht, pop, alpha, u, t, (1, 2, 5)), rel=1e-12)
    # the log-loss alone (no recall) is the same number
    assert [g["log_loss"] for g in _predict(hu, ht, pop, alphas, u, t, (), block)] == [g["log_loss"] for g in got]


def test_rank_of_a_value_within_its_row() -> None:
    from hir.export.heldout import _rank

    rng = np.random.default_rng(0)
    p = rng.integers(1, 5, (7, 6)).astype(np.float64) / 8  # many ties
    r = rng.integers(0, 7, 50)
    pt = p[r, rng.integers(0, 6, 50)]
    np.testing.assert_array_equal(_rank(p, r, pt), (p[r] > pt[:, None]).sum(1) + (p[r] == pt[:, None]).sum(1) - 1)
