"""HirModule's step: named parts, a teacher that gets no gradient, EMA, non-finite guard."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hir.errors import HirError
from hir.model import ContextSampler, ValSet, catalogue, catalogue_vectors, load_graph, validation_set
from hir.model.batches import catalogue_cold
from hir.model.spectral import fit_spectral
from hir.nn import HirNet
from hir.train.datamodule import TrainBatches
from hir.train.module import HirModule, momentum_schedule, teacher_temp_schedule
from tests.nn.config import net_kwargs
from tests.train.fixtures import defaults, graph_options, spectral_fit


@pytest.fixture
def setup(tiny_run: Path):
    store = load_graph(tiny_run / "graph", tiny_run / "content", ("train",), **graph_options())
    base = fit_spectral(store, 8, **spectral_fit()).base_for(store)
    torch.manual_seed(0)
    sizes = {k: store.spec[k] for k in ("n_types", "n_stages", "content_dim", "n_recency")} | {"base_dim": 8}
    hierarchy = net_kwargs()["hierarchy"] | {"levels": [2, 4]}
    model = defaults("model")
    module = HirModule(HirNet(**net_kwargs(**sizes, width=16, depth=1, heads=2, hierarchy=hierarchy)),
                       model["objective"], model["optim"], model["val_k"], model["monitor_k"], seed=42)
    module._catalogue = catalogue_vectors(store, base)
    targets = validation_set(store, None, 0, "masked_new")  # the val positives stand in for a task's targets
    batch = TrainBatches(store, base, ContextSampler(store, 4, 2, 2, 2, 2), targets, 32, 8, None, seed=0,
                         catalogue=catalogue(store, base))[(0, 0)]
    return module, batch


def test_parts_are_named_and_the_teacher_gets_no_gradient(setup):
    module, batch = setup
    parts = module.loss_parts(batch)
    # "scale": the knowledge view's entity scale regresses the engagement teacher's; the
    # catalogue part trains the users
    assert set(parts) == {"distill", "align", "balance", "catalogue", "anchor", "scale"}
    assert float(parts["anchor"]) == 0.0  # the gate starts closed: the base exactly
    sum(parts.values()).backward()
    # the user correction's gate gets a gradient from the catalogue part
    assert module.net.gate.grad is not None and float(module.net.gate.grad.abs()) > 0
    assert all(p.grad is None for p in module.teacher.parameters())
    assert all(not p.requires_grad for p in module.teacher.parameters())
    assert module.net.encoder.content.weight.grad is not None
    # the codebook is fitted by online k-means, not by gradient
    assert module.net.tokenizer.root.grad is None


def test_ema_moves_the_teacher_towards_the_student(setup):
    module, batch = setup
    parts = module.loss_parts(batch)
    opt = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=1.0)
    sum(parts.values()).backward()
    opt.step()
    w_s, w_t = module.net.head.weight.detach().clone(), module.teacher.head.weight.detach().clone()
    module.momentum = np.array([0.75])
    module.on_train_batch_end(None, batch, 0)
    torch.testing.assert_close(module.teacher.head.weight, 0.75 * w_t + 0.25 * w_s)
    # the codebook is shared, not averaged
    torch.testing.assert_close(module.teacher.tokenizer.root, module.net.tokenizer.root)


def test_non_finite_part_stops_with_its_name(setup):
    module, batch = setup
    with torch.no_grad():
        module.align.predictor[0].weight.fill_(float("nan"))
    with pytest.raises(HirError, match="loss part 'align' is nan"):
        module.loss_parts(batch)


def test_schedules_are_precomputed_per_step():
    t = teacher_temp_schedule(100, 0.04, 0.07, 0.3)
    assert len(t) == 101 and t[0] == pytest.approx(0.04) and t[29] == pytest.approx(0.07) and t[-1] == pytest.approx(0.07)
    m = momentum_schedule(100, 0.9)
    assert m[0] == pytest.approx(0.9) and m[-1] == pytest.approx(1.0) and (np.diff(m) >= 0).all()


def test_the_engagement_teacher_teaches_only_the_knowledge_student_by_default(setup):
    module, batch = setup
    module.weights = {**module.weights, "catalogue": 0.0, "anchor": 0.0, "scale": 0.0}
    parts = module.loss_parts(batch)
    sum(module.weights[k] * v for k, v in parts.items()).backward()
    # distill/align/balance reach the knowledge head, never the engagement correction
    assert module.net.know_head.weight.grad.abs().sum() > 0
    assert module.net.head.weight.grad is None or module.net.head.weight.grad.abs().sum() == 0
    assert module.net.gate.grad is None or float(module.net.gate.grad.abs()) == 0


def test_cold_catalogue_entities_keep_their_targets_and_train_the_knowledge_view(tiny_run: Path):
    """Entities without a base in the view (first engaged in the target period) are in the
    catalogue, ranked by their knowledge view: their targets are kept and the catalogue loss
    trains the content placement through them."""
    store = load_graph(tiny_run / "graph", tiny_run / "content", ("train",), **graph_options())
    base = fit_spectral(store, 8, **spectral_fit()).base_for(store)
    cat = catalogue(store, base)
    cold = cat[catalogue_cold(base, cat)]
    # the catalogue is what val and test rank: every entity of the target types, cold ones included
    np.testing.assert_array_equal(cat, validation_set(store, None, 0, "all").cands)
    assert len(cold), "the tiny snapshot has no catalogue entity without a train base"
    # hand-built targets (the tiny task has too few): 6 users with a base, each a warm and a cold target
    lo, hi = store.type_range("user")
    users = np.flatnonzero(np.linalg.norm(base.vectors[lo:hi], axis=1) > 0)[:6] + lo
    rng = np.random.default_rng(0)
    warm_rows, cold_rows = np.flatnonzero(~catalogue_cold(base, cat)), np.flatnonzero(catalogue_cold(base, cat))
    positives = [np.sort([rng.choice(warm_rows), rng.choice(cold_rows)]) for _ in users]
    targets = ValSet(users.astype(np.int64), cat, positives, [np.zeros(0, np.int64)] * len(users), "masked_new")
    sampler = ContextSampler(store, 4, 2, 2, 2, 2)
    ds = TrainBatches(store, base, sampler, targets, 32, len(targets), None, seed=0, catalogue=cat)
    batch = ds[(0, 0)]
    users = batch["seeds"][: int(batch["n_users"])].numpy()
    # every target of every batch user is a label: none is dropped for want of a base
    assert len(batch["tgt_cols"]) == sum(len(targets.positives[ds.target_of[int(u)]]) for u in users)
    # the batch ranks its cold targets by their knowledge view, and a uniform sample of 32 other
    # cold entities standing for all of them (the sampled softmax's log-weight)
    cols, bias = batch["cold_cols"].numpy(), batch["cold_bias"].numpy()
    forced = np.intersect1d(batch["tgt_cols"].numpy(), np.flatnonzero(catalogue_cold(base, cat)))
    assert len(forced) == len(users) and set(forced) <= set(cols) and catalogue_cold(base, cat)[cols].all()
    assert len(cols) == len(forced) + 32 and len(np.unique(cols)) == len(cols)
    np.testing.assert_allclose(bias, np.where(np.isin(cols, forced), 0.0, np.log((len(cold) - len(forced)) / 32)),
                               rtol=1e-6)
    np.testing.assert_array_equal(batch["cold"]["node"][:, 0].numpy(), cat[cols])
    # with room for every cold entity the softmax is exact: all of them, no weight
    whole = TrainBatches(store, base, sampler, targets, len(cold), len(targets), None, seed=0, catalogue=cat)[(0, 0)]
    np.testing.assert_array_equal(np.sort(cat[whole["cold_cols"].numpy()]), cold)
    assert not whole["cold_bias"].any()
    # the catalogue loss reaches the cold targets' content: it trains their knowledge view
    torch.manual_seed(0)
    sizes = {k: store.spec[k] for k in ("n_types", "n_stages", "content_dim", "n_recency")} | {"base_dim": 8}
    model = defaults("model")
    module = HirModule(HirNet(**net_kwargs(**sizes, width=16, depth=1, heads=2,
                                           hierarchy=net_kwargs()["hierarchy"] | {"levels": [2, 4]})),
                       model["objective"], model["optim"], model["val_k"], model["monitor_k"], seed=42)
    module._catalogue = catalogue_vectors(store, base)
    content = batch["cold"]["content"] = batch["cold"]["content"].float().requires_grad_()
    loss = module.loss_parts(batch)["catalogue"]
    assert torch.isfinite(loss)
    loss.backward()
    rows = batch["cold"]["row"][:, 0][torch.from_numpy(np.isin(cols, forced))]  # the cold targets' own rows
    assert float(content.grad[rows].abs().sum()) > 0
