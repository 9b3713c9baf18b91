"""HierarchicalTokenizer: round trip per level, tree-consistent probabilities, contract shapes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hir.nn.hierarchy import HierarchicalTokenizer, level_log_probs
from tests.nn.config import tokenizer_kwargs


@pytest.mark.parametrize("levels", [(4, 8), (3, 12, 48), (16, 128)])
def test_round_trip_per_level(levels):
    torch.manual_seed(0)
    tok = HierarchicalTokenizer(dim=16, **tokenizer_kwargs(levels=levels, top_k=2))
    for lvl, k in enumerate(levels):
        codes = torch.arange(k)[:, None]  # every prototype of the level
        vec = tok.decode(codes, level=lvl)  # (K, dim)
        again, _, _ = tok(vec)
        assert torch.equal(again[lvl][:, 0], codes[:, 0]), f"level {lvl}: {again[lvl][:, 0]} != {codes[:, 0]}"


def test_round_trip_survives_training_steps():
    """The bound is a parametrisation, not an init property: it holds after arbitrary updates."""
    torch.manual_seed(1)
    tok = HierarchicalTokenizer(dim=8, **tokenizer_kwargs(levels=(4, 16, 64)))
    opt = torch.optim.SGD(tok.parameters(), lr=0.5)
    for _ in range(50):
        x = F.normalize(torch.randn(32, 8), dim=-1)
        # sharpen assignments and pull all finest prototypes together (towards collapse)
        fine = tok.vectors()[-1]
        loss = -tok.log_probs(x)[-1].max(-1).values.mean() + (fine - fine.mean(0)).pow(2).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    for lvl, k in enumerate(tok.levels):
        codes, _, _ = tok(tok.decode(torch.arange(k)[:, None], level=lvl))
        assert torch.equal(codes[lvl][:, 0], torch.arange(k))


def test_parent_probability_is_sum_of_children():
    torch.manual_seed(0)
    tok = HierarchicalTokenizer(dim=8, **tokenizer_kwargs(levels=(2, 6, 12)))
    lp = tok.log_probs(F.normalize(torch.randn(5, 8), dim=-1))
    for lvl in range(1, 3):
        child = lp[lvl].exp()
        par = tok.parents(lvl)
        summed = torch.zeros(5, tok.levels[lvl - 1]).index_add_(1, par, child)
        torch.testing.assert_close(summed, lp[lvl - 1].exp())
    for p in lp:
        torch.testing.assert_close(p.exp().sum(-1), torch.ones(5))


def test_contract_shapes_and_weights():
    torch.manual_seed(0)
    tok = HierarchicalTokenizer(dim=8, **tokenizer_kwargs(levels=(2, 8), top_k=4))
    codes, weights, aux = tok(F.normalize(torch.randn(7, 8), dim=-1))
    assert [c.shape for c in codes] == [(7, 2), (7, 4)]  # top_k capped by the level size
    for c, w in zip(codes, weights):
        assert c.dtype == torch.int64
        torch.testing.assert_close(w.sum(-1), torch.ones(7))
        assert (w[:, :-1] >= w[:, 1:]).all()  # most probable first
    assert aux.ndim == 0 and 0 <= float(aux.detach()) <= 1
    # fine codes live under their coarse parent when the tree is consistent: top-1 fine's parent
    # is one of the coarse top codes
    assert torch.isin(tok.parents(1)[codes[1][:, 0]], codes[0]).all()


def test_level_log_probs_aggregates_contiguous_children():
    fine = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))
    coarse, same = level_log_probs(fine, (2, 4))
    torch.testing.assert_close(coarse.exp(), torch.tensor([[0.3, 0.7]]))
    assert same is fine


def test_bad_levels_are_rejected():
    with pytest.raises(ValueError, match="strict multiple"):
        HierarchicalTokenizer(8, **tokenizer_kwargs(levels=(4, 6)))
    with pytest.raises(ValueError, match="strict multiple"):
        HierarchicalTokenizer(8, **tokenizer_kwargs(levels=(4, 4)))
    with pytest.raises(ValueError, match="radius"):
        HierarchicalTokenizer(8, **tokenizer_kwargs(levels=(4, 8), radius=0.3))


def test_kmeans_best_of_n_init_is_no_worse_than_its_first_seeding():
    from hir.nn.hierarchy import kmeans

    x = torch.randn(300, 4, generator=torch.Generator().manual_seed(0))

    def inertia(c: torch.Tensor) -> float:
        return float(torch.cdist(x, c).min(dim=1).values.pow(2).sum())

    one = kmeans(x, 6, 10, torch.Generator().manual_seed(1))
    best = kmeans(x, 6, 10, torch.Generator().manual_seed(1), n_init=5)  # the first of its 5 runs is `one`
    assert best.shape == (6, 4) and inertia(best) <= inertia(one) + 1e-6


@pytest.mark.parametrize("n,k", [(20, 3), (20, 30), (26, 1), (300, 8), (1000, 64)])
def test_kmeans_distances_are_cdist_bit_for_bit(n: int, k: int):
    # k-means' assignments must not move: the prepared distances equal torch.cdist exactly (its
    # matrix-product path above 25 rows, its direct path below), not only to a tolerance
    from hir.nn.hierarchy import _Distances

    gen = torch.Generator().manual_seed(n + k)
    x = F.normalize(torch.randn(n, 33, generator=gen), dim=1)
    c = torch.randn(k, 33, generator=gen)
    got, want = _Distances(x)(c), torch.cdist(x, c)
    assert torch.equal(got, want), (got - want).abs().max()


@pytest.mark.parametrize("free_levels", [1, 2])
def test_free_levels_keep_one_parent_each_and_tree_consistent_probabilities(free_levels: int):
    torch.manual_seed(0)
    tok = HierarchicalTokenizer(dim=8, **tokenizer_kwargs(levels=(2, 6, 12)), free_levels=free_levels)
    tok.init_from_data(F.normalize(torch.randn(200, 8), dim=-1), generator=torch.Generator().manual_seed(0))
    lp = tok.log_probs(F.normalize(torch.randn(5, 8), dim=-1))
    for lvl in range(1, 3):
        par = tok.parents(lvl)
        # every prototype has exactly one parent on the level above, and every parent its share of children
        assert par.shape == (tok.levels[lvl],) and ((par >= 0) & (par < tok.levels[lvl - 1])).all()
        assert torch.bincount(par).tolist() == [tok.levels[lvl] // tok.levels[lvl - 1]] * tok.levels[lvl - 1]
        summed = torch.zeros(5, tok.levels[lvl - 1]).index_add_(1, par, lp[lvl].exp())
        torch.testing.assert_close(summed, lp[lvl - 1].exp())
    # the finest level still round-trips: a prototype's vector is encoded as itself
    k = tok.levels[-1]
    codes, _, _ = tok(tok.decode(torch.arange(k)[:, None], level=2))
    assert torch.equal(codes[2][:, 0], torch.arange(k))


def test_a_free_level_takes_its_members_mean_where_the_bound_cannot():
    """Setting a level to far-off vectors: the bounded tree leaves each child within radius x
    dmin of its parent, the free level puts it exactly there (hir/export/fits.py's settling)."""
    torch.manual_seed(0)
    target = [F.normalize(torch.randn(k, 8), dim=-1) for k in (2, 4)]
    for free, exact in ((0, False), (1, True)):
        tok = HierarchicalTokenizer(dim=8, **tokenizer_kwargs(levels=(2, 4)), free_levels=free)
        with torch.no_grad():
            for lvl in range(2):
                tok._set_level(lvl, target[lvl], [v.detach() for v in tok.vectors()])
        v = tok.vectors()
        torch.testing.assert_close(v[0], target[0])
        assert torch.allclose(v[1], target[1], atol=1e-6) is exact
        offset = (v[1] - v[0][tok.parents(1)]).norm(dim=-1)
        dmin = torch.cdist(v[0], v[0]).fill_diagonal_(float("inf")).min(dim=1).values[tok.parents(1)]
        assert bool((offset <= tok.radius * dmin + 1e-6).all()) is not exact


def test_reshaped_keeps_the_prototypes_and_frees_the_finest_levels():
    torch.manual_seed(0)
    tok = HierarchicalTokenizer(dim=8, **tokenizer_kwargs(levels=(2, 4, 8)))
    free = tok.reshaped(free_levels=1)
    assert free.free_levels == 1 and free.levels == tok.levels and free.radius == tok.radius
    assert [free.free(lvl) for lvl in range(3)] == [False, False, True]
    for a, b in zip(tok.vectors(), free.vectors()):  # loosening the bound moves no prototype
        torch.testing.assert_close(a, b)
    assert "free_levels=1" in repr(free)
    wide = tok.reshaped(dim=12, free_levels=2)
    assert wide.dim == 12 and wide.free_levels == 2
    with pytest.raises(ValueError, match="free_levels=3"):
        HierarchicalTokenizer(8, **tokenizer_kwargs(levels=(2, 4, 8)), free_levels=3)
