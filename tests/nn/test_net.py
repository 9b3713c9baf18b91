"""HirNet end to end on a hand-built batch (spectral base, scale packing, views); online k-means of the codebook."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hir.nn import HirNet
from hir.nn.buckets import ENGAGEMENT, METADATA, SELF
from hir.nn.hierarchy import HierarchicalTokenizer
from tests.nn.config import net_kwargs, tokenizer_kwargs


def _view(b: int = 6, n: int = 5, content_dim: int = 7, base_dim: int = 16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    rel = torch.tensor([SELF, ENGAGEMENT, ENGAGEMENT, METADATA, METADATA]).repeat(b, 1)
    hop = torch.tensor([0, 1, 2, 1, 2]).repeat(b, 1)
    stage = torch.tensor([0, 1, 2, 0, 0]).repeat(b, 1)
    base = torch.randn(9, base_dim, generator=g)
    base[6] = 0  # row 6 (the seed of context 3, an entity): a node without a base (cold start)
    return {
        "node": torch.arange(b * n).view(b, n), "row": torch.arange(b * n).view(b, n) % 9,
        "content": torch.randn(9, content_dim, generator=g), "type": (torch.arange(b) % 2)[:, None].repeat(1, n),
        "relation": rel, "hop": hop, "stage": stage, "recency": (stage > 0).long() * 2,
        "count": torch.rand(b, n, generator=g), "age": torch.rand(b, n, generator=g),
        "exposure": torch.rand(b, n, generator=g) * 50, "mask": torch.ones(b, n, dtype=torch.bool),
        "base": base, "base_logit": torch.randn(9, generator=g),
    }


def _net(**kw) -> HirNet:
    torch.manual_seed(0)
    return HirNet(**net_kwargs(n_types=5, n_stages=2, content_dim=7, base_dim=16, n_recency=4, width=16, depth=2,
                               heads=2, hierarchy=tokenizer_kwargs(levels=[2, 4]), **kw))


def test_forward_gives_unit_embeddings_for_both_views():
    net = _net()
    for use_ids in (True, False):
        z = net(_view(), use_ids=use_ids)
        assert z.shape == (6, 17)
        torch.testing.assert_close(z.norm(dim=-1), torch.ones(6))


def test_before_training_the_engagement_view_is_the_spectral_base():
    net = _net()
    view = _view()
    z = net(view, use_ids=True)
    seeds = view["row"][:, 0]
    has = view["base"][seeds].norm(dim=-1) > 0
    s = net.semantic(z)
    torch.testing.assert_close(s[has], F.normalize(view["base"][seeds], dim=-1)[has])
    # users (type 0) are the query side: unit direction, zero slack; entities carry their base scale
    users = view["type"][:, 0] == 0
    torch.testing.assert_close(net.scale_of(z)[users], torch.ones(int(users.sum())))
    torch.testing.assert_close(z[users, -1], torch.zeros(int(users.sum())))
    ent = ~users & has
    torch.testing.assert_close(net.scale_of(z)[ent], torch.sigmoid(view["base_logit"][seeds][ent]))
    # so a user-entity cosine is the entity's scale times the direction cosine
    u, e = z[0], z[1]
    torch.testing.assert_close(u @ e, net.scale_of(z)[1] * (s[0] @ s[1]))
    _, weights, _ = net.tokens(z)
    torch.testing.assert_close(sum(w.sum(dim=1) for w in weights), torch.full((6,), 2.0))


def test_training_moves_users_only_and_a_seed_without_base_takes_the_knowledge_form():
    net = _net()
    torch.nn.init.normal_(net.head.weight, std=0.5)  # a learned correction, its gate open
    with torch.no_grad():
        net.gate.fill_(1.0)
    view = _view()
    z, know = net(view, use_ids=True), net(view, use_ids=False)
    seeds = view["row"][:, 0]
    users = view["type"][:, 0] == 0
    has = view["base"][seeds].norm(dim=-1) > 0
    base_dir = F.normalize(view["base"][seeds], dim=-1)
    moved = (net.semantic(z) - base_dir).norm(dim=-1) > 1e-3
    assert moved[users & has].all() and not moved[~users & has].any()
    cold = ~has
    assert cold.any()
    torch.testing.assert_close(z[cold], know[cold])


def test_the_gate_starts_closed_at_the_base_and_opens_by_gradient():
    net = _net()
    view = _view()
    seeds = view["row"][:, 0]
    has = view["base"][seeds].norm(dim=-1) > 0
    z = net(view, use_ids=True)
    # before training: exactly the base, and no correction
    torch.testing.assert_close(net.semantic(z)[has], F.normalize(view["base"][seeds], dim=-1)[has])
    assert float(net.last_correction.abs().max()) == 0.0
    # the gate's gradient is not zero, so training can open it
    net(view, use_ids=True)[:, 0].sum().backward()
    assert net.gate.grad is not None and float(net.gate.grad.abs()) > 0


def test_without_the_transformer_the_engagement_view_is_the_base_for_everyone():
    net = _net(transformer=False)
    view = _view()
    seeds = view["row"][:, 0]
    has = view["base"][seeds].norm(dim=-1) > 0
    z = net(view, use_ids=True)
    torch.testing.assert_close(net.semantic(z)[has], F.normalize(view["base"][seeds], dim=-1)[has])


def test_without_the_transformer_a_seed_without_a_base_takes_the_knowledge_form():
    """As with the transformer on (whose correction of it is zero): not its zero base, which gave
    every such seed one direction-free vector (a parent category of the synthetic snapshot)."""
    view = _view()
    seeds = view["row"][:, 0]
    none = view["base"][seeds].norm(dim=-1) == 0
    assert none.sum() == 1
    off, on = _net(transformer=False).eval(), _net(transformer=True).eval()
    on.load_state_dict(off.state_dict())
    z_off, z_on = off(view, use_ids=True), on(view, use_ids=True)
    torch.testing.assert_close(z_off.norm(dim=-1), torch.ones(6))
    torch.testing.assert_close(z_off[~none], z_on[~none])  # the gate is closed: the base for the others
    # the knowledge form of its context (its content, no ids), a unit direction
    d, g = off._knowledge({k: v[none] if k not in ("content", "base", "base_logit") else v for k, v in view.items()},
                          use_ids=False)
    torch.testing.assert_close(z_off[none], HirNet.pack(F.normalize(d, dim=-1), g, view["type"][none, 0]))
    assert float(off.semantic(z_off)[none].norm()) > 0.99
    # the parts never used without the transformer are frozen (DDP waits for every trainable one)
    frozen = {n for n, p in off.named_parameters() if not p.requires_grad}
    assert frozen == {"gate", "head.weight", "head.bias", "encoder.base.weight"}
    off.train()
    (off(view, use_ids=True).sum() + off(view, use_ids=False).sum()).backward()
    assert all(p.grad is not None for n, p in off.named_parameters() if p.requires_grad and "tokenizer" not in n
               and "primitive" not in n), [n for n, p in off.named_parameters() if p.requires_grad and p.grad is None]


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
    net = _net(bias=net_kwargs()["bias"] | {"table": False, "exposure": False})
    assert all(b.attn.table is None and b.attn.lam is None for b in net.transformer.blocks)
    assert net(_view()).shape == (6, 17)


def test_online_kmeans_moves_prototypes_to_their_members_and_restarts_dead_ones():
    torch.manual_seed(0)
    tok = HierarchicalTokenizer(dim=2, **tokenizer_kwargs(levels=(2, 4), radius=0.2))
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
    tok = HierarchicalTokenizer(dim=8, **tokenizer_kwargs(levels=(3, 6)))
    tok.init_from_data(x, generator=torch.Generator().manual_seed(1))
    assert torch.cdist(centres, tok.vectors()[0]).min(dim=1).values.max() < 0.05
