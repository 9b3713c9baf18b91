"""The listwise scorer learns a planted signal and keeps its best check."""

from __future__ import annotations

import numpy as np
import torch

from hir.funnel.scorer import ScorerConfig, fit_scorer, listwise_loss, recall_at


def planted(users: int = 300, per_user: int = 12, features: int = 5, seed: int = 0):
    """Each user's target is the candidate with the largest feature 2 (plus noise features)."""
    gen = np.random.default_rng(seed)
    x = gen.normal(size=(users * per_user, features)).astype(np.float32)
    y = np.zeros(users * per_user, np.float32)
    for u in range(users):
        rows = slice(u * per_user, (u + 1) * per_user)
        y[rows][np.argmax(x[rows, 2])] = 1.0
    offsets = np.arange(0, users * per_user + 1, per_user)
    return x, y, offsets, np.ones(users, np.float32)


def test_learns_the_planted_feature() -> None:
    x, y, offsets, total = planted()
    config = ScorerConfig(hidden=[16], steps=150, batch=64, lr=0.01, holdout=0.2, checks=5, k=1)
    model, record = fit_scorer(x, y, offsets, total, config, seed=0)
    assert record["best_recall"] > 0.8, record
    untrained = record["checks"][0][1]
    assert untrained < 0.5 and record["best_step"] > 0
    # the scores on fresh users follow the planted order
    x2, y2, off2, tot2 = planted(seed=1)
    assert recall_at(model.score(x2), y2, off2, 1, tot2) > 0.8


def test_listwise_loss_ignores_padding_and_weights_users_equally() -> None:
    scores = torch.tensor([[2.0, 0.0, 9.0], [1.0, 1.0, 0.0]])
    targets = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    valid = torch.tensor([[True, True, False], [True, True, True]])
    loss = listwise_loss(scores, targets, valid)
    first = -torch.log_softmax(torch.tensor([2.0, 0.0]), 0)[0]
    second = -torch.log_softmax(torch.tensor([1.0, 1.0, 0.0]), 0)[:2].mean()
    assert torch.isclose(loss, (first + second) / 2)
