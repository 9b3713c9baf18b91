"""Each loss part on hand-made inputs."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from hir.nn.losses import AlignLoss, BalanceLoss, CatalogueLoss, DistillLoss

# (teacher view, student view): each view teaches the other
BOTH_WAYS = ((0, 1), (1, 0))


def test_distill_prefers_agreeing_views_and_centres_the_teacher():
    loss = DistillLoss(levels=(2, 4), student_temp=0.1, center_momentum=0.5, directions=BOTH_WAYS)
    teacher = [torch.tensor([[5.0, 0, 0, 0], [0, 0, 0, 5.0]])] * 2
    agree = loss([teacher[0], teacher[0]], teacher, teacher_temp=0.05)
    disagree = loss([teacher[0].flip(0), teacher[0].flip(0)], teacher, teacher_temp=0.05)
    assert agree < disagree
    # the centre moved half-way towards the batch mean of the teacher scores, twice
    torch.testing.assert_close(loss.center, 0.75 * teacher[0].mean(0, keepdim=True))
    loss.eval()
    before = loss.center.clone()
    loss([teacher[0]] * 2, teacher, 0.05)
    assert torch.equal(loss.center, before)  # no centre update outside training


def test_catalogue_ranks_the_targets_with_the_users_view_entities_masked():
    users = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    cat = F.normalize(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.9, 0.3]]), dim=-1)
    rows, cols, w = torch.tensor([0, 1]), torch.tensor([2, 1]), torch.ones(2)
    none = torch.zeros(0, dtype=torch.long)
    loss = CatalogueLoss(0.05, learn_temperature=False)
    plain = loss(users, cat, rows, cols, w, none, none)
    # user 0 already had row 0 (scored above its target): masked, it no longer competes
    masked = loss(users, cat, rows, cols, w, torch.tensor([0]), torch.tensor([0]))
    assert masked < plain
    # a user with two targets weighs each half: every user counts the same, as the test averages
    two = loss(users[:1], cat, torch.tensor([0, 0]), torch.tensor([0, 2]), torch.tensor([0.5, 0.5]), none, none)
    logp = torch.log_softmax(users[:1] @ cat.T * 20.0, dim=-1)[0]
    torch.testing.assert_close(two, -(logp[0] + logp[2]) / 2)
    assert not loss.log_scale.requires_grad and float(loss.scale) == pytest.approx(20.0)
    assert float(CatalogueLoss(1e-4, learn_temperature=True).scale) == pytest.approx(100.0)  # kept in [1, 100]


def test_balance_is_zero_when_uniform_and_high_when_collapsed():
    bal = BalanceLoss(levels=(2, 4), temperature=1.0)
    uniform = [torch.eye(4) * 20] * 2  # every prototype is someone's, sharply
    collapsed = [torch.tensor([[20.0, 0, 0, 0]] * 4)] * 2
    assert bal(uniform) < 0.01
    assert bal(collapsed) > 0.9


def test_align_range_and_a_zero_predictor():
    align = AlignLoss(4, directions=BOTH_WAYS)
    z = F.normalize(torch.randn(5, 4), dim=-1)
    value = align([z, z], [z, z])
    assert 0 <= float(value.detach()) <= 4
    with torch.no_grad():  # identity predictor: 0 + I
        for m in align.predictor:
            if isinstance(m, torch.nn.Linear):
                m.weight.zero_()
                m.bias.zero_()
    assert math.isclose(float(align([z, z], [z, z]).detach()), 2.0, abs_tol=1e-6)  # zero prediction: cos = 0


def test_replaced_catalogue_columns_equal_the_replaced_catalogue_and_only_they_get_gradients():
    torch.manual_seed(0)
    users = F.normalize(torch.randn(4, 3), dim=-1).requires_grad_(True)
    cat = F.normalize(torch.randn(7, 3), dim=-1)
    cols = torch.tensor([1, 5])
    new = F.normalize(torch.randn(2, 3), dim=-1).requires_grad_(True)
    rows, tgt, w = torch.tensor([0, 1, 3]), torch.tensor([1, 2, 5]), torch.ones(3)
    none = torch.zeros(0, dtype=torch.long)
    loss = CatalogueLoss(0.1, learn_temperature=True)
    split = loss(users, cat, rows, tgt, w, none, none, None, cols, new)
    g_users, g_new = torch.autograd.grad(split, (users, new))
    whole = loss(users, cat.index_copy(0, cols, new), rows, tgt, w, none, none)
    w_users, w_new = torch.autograd.grad(whole, (users, new))
    torch.testing.assert_close(split, whole)
    torch.testing.assert_close(g_users, w_users)
    torch.testing.assert_close(g_new, w_new)
