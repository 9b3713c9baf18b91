"""HirModule's step: named parts, a teacher that gets no gradient, EMA, non-finite guard."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hir.errors import HirError
from hir.model import ContextSampler, catalogue, catalogue_vectors, load_graph, validation_set
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
