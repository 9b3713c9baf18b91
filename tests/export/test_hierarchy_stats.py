"""Prototype labels and super-graph densities on hand-made inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hir.export.labels import class_tfidf_labels, member_texts, top_members, words
from hir.export.supergraph import supergraph_stats
from hir.nn.hierarchy import HierarchicalTokenizer
from tests.nn.config import tokenizer_kwargs


def test_labels_pick_distinctive_member_words():
    texts = ["red running shoe", "blue running shoe", "green tea pot", "black tea cup", "new shoe", None]
    tokens = np.array([0, 0, 1, 1, 0, 1])
    labels = class_tfidf_labels(tokens, 2, texts, n_words=2, max_share=1.0)
    assert labels[0] == "shoe · running"
    assert labels[1].startswith("tea")
    assert words("The NEW pack of Green Tea") == ["green", "tea"]  # stopwords and filler dropped


def test_a_word_most_entities_carry_never_leads_a_label():
    # "grocery" is on 5 of 6 texts and the most frequent word of both tokens
    texts = ["grocery milk white", "grocery milk skim", "grocery milk whole", "grocery cookie", "grocery cookie oat",
             "chocolate cookie"]
    tokens = np.array([0, 0, 0, 1, 1, 1])
    labels = class_tfidf_labels(tokens, 3, texts, n_words=1)
    assert labels == ["milk", "cookie", "(no text)"]
    assert "grocery" in class_tfidf_labels(tokens, 3, texts, n_words=3, max_share=1.0)[0]


def test_member_texts_keep_the_best_members_with_text():
    texts = ["a very long product title that goes on", None, "short"]
    assert member_texts(np.array([[1, 0, 2]]), texts, n=2, width=10) == [["a very lon", "short"]]


def test_top_members_are_the_most_probable_per_prototype():
    torch.manual_seed(0)
    tok = HierarchicalTokenizer(dim=4, **tokenizer_kwargs(levels=(2, 4)))
    z = tok.decode(torch.arange(4)[:, None], level=1).detach().numpy()  # each fine prototype's own vector
    best = top_members(tok, np.repeat(z, 2, axis=0), np.arange(8), m=2, chunk=3)
    assert best[1].shape == (4, 2)
    for j in range(4):
        assert set(best[1][j].tolist()) == {2 * j, 2 * j + 1}


def test_supergraph_density_and_gain():
    # 2 users x 4 entities, 4 raw edges; entities 0, 1 -> prototype 0, entities 2, 3 -> prototype 1
    users, ents = np.array([0, 0, 1, 1]), np.array([0, 1, 1, 2])
    top1 = [np.array([0, 0, 1, 1])]
    stats = supergraph_stats(users, ents, n_users=2, n_entities=4, top1=top1, levels=(2,))
    assert stats["raw"]["density"] == pytest.approx(4 / 8)
    lvl = stats["levels"][0]
    assert lvl["edges"] == 3  # (0, p0), (1, p0), (1, p1)
    assert lvl["density"] == pytest.approx(3 / 4)
    assert lvl["gain"] == pytest.approx(1.5)


def test_supergraph_random_assignment_baseline():
    """Users who engage within one block: a block-wise assignment concentrates each user on one
    token, a random one of the same sizes does not; the gain is above 1 either way."""
    rng = np.random.default_rng(0)
    n_users, n_ent, k = 200, 400, 8
    block = np.arange(n_ent) % k  # entity -> its block
    users = np.repeat(np.arange(n_users), 10)
    ents = np.array([rng.choice(np.flatnonzero(block == u % k), 10, replace=False) for u in range(n_users)]).ravel()
    top1 = [np.asarray(block)]
    lvl = supergraph_stats(users, ents, n_users, n_ent, top1, (k,))["levels"][0]
    assert lvl["edges"] == n_users  # one token per user
    assert lvl["random_edges"] > 4 * n_users  # chance spreads each user over most of the 8 tokens
    assert lvl["concentration"] == pytest.approx(lvl["edges"] / lvl["random_edges"]) and lvl["concentration"] < 0.25
    assert lvl["gain"] > 1 and lvl["random_gain"] > lvl["gain"]  # the gain rewards chance more


@pytest.mark.parametrize("n,high", [(0, 5), (1, 5), (50, 5), (500, 10_000), (300, 2**40)])
def test_integer_key_sets_match_numpy(n: int, high: int) -> None:
    from hir.export.supergraph import distinct, member, n_distinct

    rng = np.random.default_rng(n)
    keys = rng.integers(-3, high, n)  # -1 tokens make negative keys
    of = rng.integers(-3, high, n // 2 + 1) if n else np.zeros(0, np.int64)
    np.testing.assert_array_equal(distinct(keys), np.unique(keys))
    assert distinct(keys).dtype == np.unique(keys).dtype
    assert n_distinct(keys) == len(np.unique(keys))
    np.testing.assert_array_equal(member(keys, of), np.isin(keys, of))
    np.testing.assert_array_equal(member(keys, np.zeros(0, np.int64)), np.isin(keys, np.zeros(0, np.int64)))


def test_engagement_pairs_are_distinct_and_in_one_order(tiny_graph) -> None:
    """The pairs come sorted by (user, entity) within each entity type, the same every call, so
    the held-out log-losses summed over them repeat to the bit from one export to the next."""
    from hir.data.schema import ENTITY_TYPES
    from hir.data.snapshot import load_snapshot
    from hir.export.supergraph import engagement_pairs

    snap = load_snapshot(tiny_graph)
    counts = [snap.num_nodes(t) for t in ENTITY_TYPES]
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    users, ents = engagement_pairs(snap, offsets)
    assert len(users) == len(np.unique(users * (ents.max() + 1) + ents)) > 0
    again = engagement_pairs(snap, offsets)
    assert np.array_equal(users, again[0]) and np.array_equal(ents, again[1])
    bounds = np.searchsorted(offsets, ents, side="right")  # each pair's entity type
    for t in np.unique(bounds):
        key = users[bounds == t] * (ents.max() + 1) + ents[bounds == t]
        assert np.all(np.diff(key) > 0)
