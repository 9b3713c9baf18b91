"""HirModule's validation with a correction: val/recall@K is the evidence-gated model's (the
correction for the users it helps on val, the base for the others), and its gain over the step-0
base is what StopBelowBase and the best checkpoint read."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hir.model import ValSet
from hir.nn import HirNet
from hir.train.module import HirModule
from tests.nn.config import net_kwargs, tokenizer_kwargs
from tests.train.fixtures import defaults

K = 8  # base width: embeddings have K + 1 coordinates


def _module(n_sparse: int, n_heavy: int, n_cands: int) -> tuple[HirModule, np.ndarray, np.ndarray, ValSet]:
    """A module whose teacher has an open correction, on a val set of ``n_sparse`` users with 2
    events and ``n_heavy`` with 50, each with one positive candidate."""
    torch.manual_seed(0)
    net = HirNet(**net_kwargs(n_types=5, n_stages=2, content_dim=7, base_dim=K, n_recency=4, width=16, depth=1,
                              heads=2, hierarchy=tokenizer_kwargs(levels=[2, 4])))
    model = defaults("model")
    module = HirModule(net, model["objective"], model["optim"], model["val_k"], model["monitor_k"], seed=0)
    with torch.no_grad():
        module.teacher.gate.fill_(0.5)  # the teacher corrects: the gate is fit
    n_users = n_sparse + n_heavy
    users, cands = np.arange(n_users), n_users + np.arange(n_cands)
    rng = np.random.default_rng(0)
    positives = [np.array([rng.integers(n_cands)]) for _ in users]
    val = ValSet(users, cands, positives, [np.zeros(0, np.int64) for _ in users], "masked_new")
    exposure = np.concatenate([np.full(n_sparse, 2.0), np.full(n_heavy, 50.0), np.zeros(n_cands)]).astype(np.float32)
    # every user's base is a random direction: it finds the positive about as often as chance
    base = np.zeros((n_users + n_cands, K), np.float32)
    base[:n_users] = rng.normal(size=(n_users, K))
    dm = SimpleNamespace(val=val, store=SimpleNamespace(exposure=exposure), base=SimpleNamespace(vectors=base))
    module._trainer = SimpleNamespace(datamodule=dm)
    return module, users, cands, val


def test_the_gated_recall_keeps_the_correction_where_it_helps_and_the_base_elsewhere():
    module, users, cands, val = _module(n_sparse=60, n_heavy=60, n_cands=200)
    base = module.trainer.datamodule.base.vectors
    gen = torch.Generator().manual_seed(1)
    zc = F.normalize(torch.randn(len(cands), K, generator=gen), dim=-1)
    # the correction points a sparse user at its positive, and a heavy user away from it (last)
    zu = torch.stack([zc[int(p[0])] if u < 60 else -zc[int(p[0])] for u, p in zip(users, val.positives)])
    z = torch.cat([torch.cat([zu, torch.zeros(len(users), 1)], 1), torch.cat([zc, torch.zeros(len(cands), 1)], 1)])
    nodes = np.concatenate([users, cands])
    metrics = module.val_metrics(nodes, z)
    gate = module.evidence_gate
    # the sparse users (2 events) get the correction, the heavy ones (50) keep the base (chosen on
    # half of the val users, confirmed on the other half's 30 sparse users)
    assert gate["max_events"] == 2 and gate["users_reached"] == 30 and gate["users"] == 60, gate
    # gated = the corrected sparse users (every one hits) and the heavy users' base recall
    zb = F.normalize(torch.from_numpy(base[users[60:]]), dim=-1)
    ranks = (zb @ zc.T).argsort(dim=1, descending=True)[:, :20].numpy()
    heavy_base = np.mean([int(p[0]) in r for r, p in zip(ranks, val.positives[60:])])
    assert heavy_base > 0  # so the gated and the full recall differ in the heavy users' half
    assert metrics["val/recall@20"] == pytest.approx((60 * 1.0 + 60 * heavy_base) / 120)
    assert metrics["val/full_recall@20"] < metrics["val/recall@20"]
    assert metrics["val/gain_over_base"] == 0.0  # the first validation is the step-0 reference
