"""The exported hierarchy's reference figures and refit on a planted clustered toy: 4 interests of
6 items each (unit directions around 4 orthogonal axes), 48 users who each engage with 3 items of
one interest."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hir.export.hierarchy import kmeans_reference, refit_tokenizer, taxonomy_nmi
from hir.export.supergraph import supergraph_stats
from hir.nn.hierarchy import HierarchicalTokenizer

DIM, INTERESTS, ITEMS, USERS, LEVELS = 8, 4, 6, 48, (2, 4, 8)


@pytest.fixture(scope="module")
def toy() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    interest = np.repeat(np.arange(INTERESTS), ITEMS)  # (24,) each item's planted interest
    x = np.eye(DIM)[interest] + 0.15 * rng.standard_normal((len(interest), DIM))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)  # (24, DIM)
    users, ents = [], []
    for u in range(USERS):
        members = np.flatnonzero(interest == u % INTERESTS)
        for e in rng.choice(members, 3, replace=False):
            users.append(u)
            ents.append(USERS + e)  # global ids: users first, then items
    z = np.concatenate([np.zeros((USERS, DIM), np.float32), x])  # (72, DIM)
    return {"z": z, "interest": interest, "users": np.array(users), "ents": np.array(ents)}


def tokenizer() -> HierarchicalTokenizer:
    torch.manual_seed(0)
    return HierarchicalTokenizer(DIM, LEVELS, top_k=2, tau=0.05, radius=0.2)


def top1_of(tok: HierarchicalTokenizer, z: np.ndarray) -> list[np.ndarray]:
    codes, _, _ = tok(torch.from_numpy(z))
    return [c[:, 0].numpy().astype(np.int64) for c in codes]


def test_refitted_tokens_concentrate_what_users_engage_with_together(toy):
    """Every user's items share one interest; the refitted tokens group each interest, so users
    touch fewer tokens than under a random assignment of the same sizes at every level."""
    items = toy["z"][USERS:]
    tok = tokenizer()
    before = [v.clone() for v in tok.vectors()]
    refit = refit_tokenizer(tok, items, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(before, tok.vectors()))  # the input is not modified
    top1 = [np.concatenate([np.zeros(USERS, np.int64), t]) for t in top1_of(refit, items)]
    sg = supergraph_stats(toy["users"], toy["ents"], USERS, len(items), top1, LEVELS)
    conc = [lv["concentration"] for lv in sg["levels"]]
    assert all(c < 0.8 for c in conc), conc  # measured 0.73, 0.53, 0.66 (seeded)
    # the same seed gives the same tree
    again = refit_tokenizer(tok, items, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(refit.vectors(), again.vectors()))
    # codes still round-trip: a prototype's vector is encoded as itself at every level
    for lvl, v in enumerate(refit.vectors()):
        codes, _, _ = refit(v)
        assert torch.equal(codes[lvl][:, 0], torch.arange(LEVELS[lvl]))


def test_kmeans_reference_has_the_learned_figures(toy):
    rows = np.arange(USERS, USERS + INTERESTS * ITEMS)
    labels = {"taxonomy_d1": toy["interest"]}
    ref, top1 = kmeans_reference(toy["z"], rows, toy["users"], toy["ents"], USERS, LEVELS, seed=0,
                                 labels=labels, offset=USERS)
    assert [lv["prototypes"] for lv in ref["levels"]] == list(LEVELS) and ref["entities"] == len(rows)
    assert all((t[:USERS] == -1).all() and ((t[rows] >= 0) & (t[rows] < k)).all() for t, k in zip(top1, LEVELS))
    # the same figures as the learned tokens get (the same random baseline)
    sg = supergraph_stats(toy["users"], toy["ents"], USERS, 1, top1, LEVELS)
    assert [lv["concentration"] for lv in ref["levels"]] == [lv["concentration"] for lv in sg["levels"]]
    assert ref["levels"][1]["concentration"] < 1
    # 4 well-separated interests, 4 clusters: k-means finds them
    assert ref["levels"][1]["taxonomy_nmi"]["taxonomy_d1"] == pytest.approx(1.0)
    assert ref["levels"] == kmeans_reference(toy["z"], rows, toy["users"], toy["ents"], USERS, LEVELS, seed=0,
                                             labels=labels, offset=USERS)[0]["levels"]  # seeded


def test_taxonomy_nmi_reads_products_at_their_offset():
    labels = {"taxonomy_d1": np.array([0, 0, 1, 1, -1]), "truth_coarse": np.array([0, 1, 0, 1, 0])}
    top1 = [np.array([9, 9, 3, 3, 5, 5, 7])]  # two users, then the five products
    assert taxonomy_nmi(labels, 2, top1) == [{"taxonomy_d1": pytest.approx(1.0)}]


def test_refit_needs_enough_entities():
    with pytest.raises(ValueError, match="hierarchy_fit=checkpoint"):
        refit_tokenizer(tokenizer(), np.ones((1, DIM), np.float32), seed=0)
