"""HirNet end to end on a hand-built batch; GroupedBatchNorm; online k-means of the codebook."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hir.nn import HirNet
from hir.nn.buckets import ENGAGEMENT, METADATA, SELF
from hir.nn.hierarchy import HierarchicalTokenizer
from hir.nn.norm import GroupedBatchNorm


def _view(b: int = 6, n: int = 5, content_dim: int = 7) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    rel = torch.tensor([SELF, ENGAGEMENT, ENGAGEMENT, METADATA, METADATA]).repeat(b, 1)
    hop = torch.tensor([0, 1, 2, 1, 2]).repeat(b, 1)
    stage = torch.tensor([0, 1, 2, 0, 0]).repeat(b, 1)
    return {
        "node": torch.arange(b * n).view(b, n), "row": torch.arange(b * n).view(b, n) % 9,
        "content": torch.randn(9, content_dim, generator=g), "type": (torch.arange(b) % 2)[:, None].repeat(1, n),
        "relation": rel, "hop": hop, "stage": stage, "recency": (stage > 0).long() * 2,
        "count": torch.rand(b, n, generator=g), "age": torch.rand(b, n, generator=g),
        "exposure": torch.rand(b, n, generator=g) * 50, "mask": torch.ones(b, n, dtype=torch.bool),
    }


def _net(**kw) -> HirNet:
    torch.manual_seed(0)
    return HirNet(n_types=5, n_stages=2, content_dim=7, dim=16, depth=2, heads=2, id_buckets=64,
                  hierarchy={"levels": [2, 4]}, **kw)


def test_forward_gives_unit_embeddings_for_both_views():
    net = _net()
    for use_ids in (True, False):
        z = net(_view(), use_ids=use_ids)
        assert z.shape == (6, 16)
        torch.testing.assert_close(z.norm(dim=-1), torch.ones(6))


def test_prior_coordinate_is_bounded_and_the_semantic_part_is_unit():
    net = _net(prior_max=0.5)
    z = net(_view(), use_ids=True)
    p = net.prior_of(z)
    assert (p.abs() <= 0.5).all() and (p.abs() > 0).all()
    sem = net.semantic(z)
    assert sem.shape == (6, 15)
    torch.testing.assert_close(sem.norm(dim=-1), torch.ones(6))
    # the semantic part is the embedding without its prior coordinate, rescaled to unit norm
    torch.testing.assert_close(sem * torch.sqrt(1 - p * p)[:, None], z[:, :15])
    codes, weights, _ = net.tokens(z)
    torch.testing.assert_close(sum(w.sum(dim=1) for w in weights), torch.full((6,), 2.0))
    assert [c.shape[0] for c in codes] == [6, 6]
    # without the coordinate the whole embedding is semantic
    flat = _net(prior_max=0.0)
    z0 = flat(_view())
    assert flat.semantic(z0) is z0 and torch.equal(flat.prior_of(z0), torch.zeros(6))


def test_prior_max_out_of_range_is_refused():
    import pytest

    with pytest.raises(ValueError, match="prior_max"):
        _net(prior_max=1.0)


def test_id_table_has_a_row_per_node_when_they_fit_else_hashes():
    direct = _net(n_nodes=30)
    assert direct.encoder.direct and direct.encoder.ids.num_embeddings == 30
    node = torch.tensor([[0, 5, 29, -1]])
    emb = direct.encoder.id_embedding(node)
    torch.testing.assert_close(emb[0, :3], direct.encoder.ids.weight[[0, 5, 29]])
    assert torch.equal(emb[0, 3], torch.zeros(16))
    hashed = _net(n_nodes=1000)  # more nodes than id_buckets=64
    assert not hashed.encoder.direct and hashed.encoder.ids.num_embeddings == 64
    assert not _net().encoder.direct  # unknown node count: hashed


def test_gradients_reach_bias_tables_and_lambda():
    net = _net()
    # a non-zero residual branch, so attention matters to the output at step 0
    for block in net.transformer.blocks:
        torch.nn.init.normal_(block.attn.proj.weight, std=0.5)
    net(_view()).pow(3).sum().backward()
    for block in net.transformer.blocks:
        assert block.attn.table.grad is not None and block.attn.table.grad.abs().sum() > 0
        assert block.attn.lam.grad is not None and block.attn.lam.grad.abs().sum() > 0


def test_bias_switches_remove_parameters():
    net = _net(bias={"table": False, "exposure": False})
    assert all(b.attn.table is None and b.attn.lam is None for b in net.transformer.blocks)
    assert net(_view()).shape == (6, 16)


def test_grouped_batch_norm_standardises_each_group():
    norm = GroupedBatchNorm(n_groups=3, dim=2, momentum=1.0)
    x = torch.tensor([[0.0, 1.0], [2.0, 3.0], [10.0, 10.0], [14.0, 12.0], [5.0, 5.0]])
    group = torch.tensor([0, 0, 1, 1, 2])  # group 2 has one row: running stats (0, 1)
    y = norm(x, group)
    torch.testing.assert_close(y[:4].view(2, 2, 2).mean(1), torch.zeros(2, 2))
    torch.testing.assert_close(y[4], x[4] / (1 + 1e-5) ** 0.5)
    torch.testing.assert_close(norm.running_mean[:2], torch.tensor([[1.0, 2.0], [12.0, 11.0]]))
    norm.eval()
    torch.testing.assert_close(norm(x, group)[:4], y[:4], atol=1e-2, rtol=0.5)  # running stats (unbiased var)


def test_online_kmeans_moves_prototypes_to_their_members_and_restarts_dead_ones():
    torch.manual_seed(0)
    tok = HierarchicalTokenizer(dim=2, levels=(2, 4), radius=0.2)
    x = F.normalize(torch.tensor([[1.0, 0.05], [1.0, -0.05], [-1.0, 0.05], [-1.0, -0.05]]), dim=-1).repeat(8, 1)
    for step in range(60):
        tok.ema_update(x, decay=0.5, generator=torch.Generator().manual_seed(step))
    root = tok.vectors()[0]
    # the two coarse prototypes sit on the two clusters (one each)
    assert sorted(root[:, 0].sign().tolist()) == [-1.0, 1.0]
    assert torch.cdist(root, torch.tensor([[1.0, 0.0], [-1.0, 0.0]])).min(dim=1).values.max() < 0.1
    assert all(getattr(tok, f"usage_{lvl}").min() > 0 for lvl in range(2))
    # round trip still holds after online updates
    for lvl, k in enumerate(tok.levels):
        codes, _, _ = tok(tok.decode(torch.arange(k)[:, None], level=lvl))
        assert torch.equal(codes[lvl][:, 0], torch.arange(k))


def test_init_from_data_puts_coarse_prototypes_on_clusters():
    g = torch.Generator().manual_seed(0)
    centres = F.normalize(torch.randn(3, 8, generator=g), dim=-1)
    x = (centres.repeat_interleave(50, 0) + 0.02 * torch.randn(150, 8, generator=g))
    tok = HierarchicalTokenizer(dim=8, levels=(3, 6))
    tok.init_from_data(x, generator=torch.Generator().manual_seed(1))
    assert torch.cdist(centres, tok.vectors()[0]).min(dim=1).values.max() < 0.05
