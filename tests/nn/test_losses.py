"""Each loss part on hand-made inputs."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from hir.nn.losses import AlignLoss, BalanceLoss, ContrastiveLoss, DistillLoss

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


def test_contrastive_logq_correction_and_duplicates():
    users = F.normalize(torch.tensor([[1.0, 0.1], [0.1, 1.0], [1.0, 0.0]]), dim=-1)
    items = users.clone()
    ids = torch.tensor([10, 11, 12])
    flat = ContrastiveLoss(0.1)(users, items, torch.zeros(3), ids)
    # a very popular item 12 (high sampling probability) is discounted as a negative
    corrected = ContrastiveLoss(0.1)(users, items, torch.log(torch.tensor([0.01, 0.01, 0.9])), ids)
    assert corrected != flat
    # the same entity twice in a batch is not its own negative
    dup = ContrastiveLoss(0.1)(users[[0, 2]], items[[0, 0]], torch.zeros(2), torch.tensor([10, 10]))
    assert torch.isclose(dup, torch.tensor(0.0), atol=1e-6)


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
