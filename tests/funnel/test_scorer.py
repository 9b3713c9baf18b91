"""The listwise scorer learns a planted signal and keeps its best check."""

from __future__ import annotations

import numpy as np
import torch

from hir.funnel.scorer import CheckSet, ScorerConfig, fit_scorer, listwise_loss, recall_at


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


def test_a_check_set_decides_the_step_and_stop_at_refits_to_it() -> None:
    """With a check set every training user is fitted and the checks score the check set (here
    users whose target follows another feature: the check must see it and prefer the untrained
    step); ``stop_at`` trains exactly that many steps with no check."""
    x, y, offsets, total = planted()
    config = ScorerConfig(hidden=[16], steps=60, batch=64, lr=0.01, checks=3, k=1, patience=5)
    other = planted(users=100, seed=2)
    xo, off_o = other[0], other[2]
    yo = np.zeros_like(other[1])
    for u in range(100):  # the check set's target: the smallest feature 2, against the training one
        rows = slice(off_o[u], off_o[u + 1])
        yo[rows][np.argmin(xo[rows, 2])] = 1.0
    _, rec = fit_scorer(x, y, offsets, total, config, 0, check_set=CheckSet(xo, yo, off_o, other[3]))
    assert rec["holdout_users"] == 0 and rec["fit_users"] == 300 and rec["check_users"] == 100
    assert rec["best_step"] == 0, rec  # training on the planted order only moves it away from the check's
    model, rec2 = fit_scorer(x, y, offsets, total, config, 0, stop_at=40)
    assert rec2["best_step"] == 40 and rec2["checks"] == []
    assert recall_at(model.score(x), y, offsets, 1, total) > 0.6


def test_any_step_count_trains_and_refits() -> None:
    """Short fits (a refit of a few steps after a period check) train: at exactly 10 steps torch's
    one-cycle schedule divided by zero."""
    x, y, offsets, total = planted(users=60)
    for steps in (1, 2, 10, 19, 20):
        config = ScorerConfig(hidden=[8], steps=steps, batch=16, lr=0.01, holdout=0.2, checks=2, k=1)
        _, rec = fit_scorer(x, y, offsets, total, config, seed=0)
        assert 0 <= rec["best_step"] <= steps
        _, rec2 = fit_scorer(x, y, offsets, total, config, seed=0, stop_at=steps)
        assert rec2["best_step"] == steps
