"""The training objective, one module per part; the LightningModule weights and logs each.

- :class:`DistillLoss`   cross-view DINO over the prototype hierarchy (centering + sharpening)
- :class:`AlignLoss`     BGRL-style cross-view regression of the teacher's embedding
- :class:`CatalogueLoss`  a held-out deep-funnel entity ranked among the whole catalogue
- :class:`BalanceLoss`   mean-entropy collapse guard on prototype usage
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from hir.nn.hierarchy import level_log_probs, mean_entropy_gap


class DistillLoss(nn.Module):
    """Teacher on one view gives targets over the prototypes to the student on the other view.

    With views a, b and per-level distributions (coarser levels aggregate the finest one)::

        P_t = hier(softmax((t - c) / tau_t)),   p_s = hier(softmax(s / tau_s))
        loss = mean_{(x, y) in {(a, b), (b, a)}} mean_l  CE(P_t[x]_l, p_s[y]_l)

    ``c`` is a running centre of the teacher scores (momentum ``center_momentum``): centering
    keeps one prototype from taking over, the low teacher temperature sharpens the targets.

    Args:
        levels: prototypes per level, coarse first.
        student_temp: tau_s.
        center_momentum: EMA momentum of the centre.
        directions: (teacher view, student view) pairs taught.
    """

    def __init__(self, levels: tuple[int, ...], student_temp: float, center_momentum: float,
                 directions: tuple[tuple[int, int], ...]) -> None:
        super().__init__()
        self.levels, self.student_temp, self.center_momentum = tuple(levels), student_temp, center_momentum
        self.directions = tuple(tuple(d) for d in directions)
        self.register_buffer("center", torch.zeros(1, self.levels[-1]))

    def forward(self, student: list[Tensor], teacher: list[Tensor], teacher_temp: float) -> Tensor:
        """student, teacher: per view (B, K_fine) prototype scores (teacher's without grad) -> scalar."""
        targets = [
            [lp.exp() for lp in level_log_probs(F.log_softmax((t - self.center) / teacher_temp, -1), self.levels)]
            for t in teacher
        ]
        preds = [level_log_probs(F.log_softmax(s / self.student_temp, -1), self.levels) for s in student]
        parts = [
            -(targets[x][lvl] * preds[y][lvl]).sum(-1).mean()
            for x, y in self.directions
            for lvl in range(len(self.levels))
        ]
        if self.training:
            self.update_center(teacher)
        return torch.stack(parts).mean()

    @torch.no_grad()
    def update_center(self, teacher: list[Tensor]) -> None:
        batch = torch.cat(teacher).sum(0, keepdim=True)  # (1, K)
        n = torch.tensor(float(sum(t.shape[0] for t in teacher)), device=batch.device)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(batch)
            dist.all_reduce(n)
        self.center.mul_(self.center_momentum).add_(batch / n, alpha=1 - self.center_momentum)


class AlignLoss(nn.Module):
    """BGRL-style: a predictor on the student's embedding of one view regresses the teacher's
    embedding of the other view, ``2 - 2 cos(pred(s_x), t_y)``, both directions. Ties the two views
    into one space, so content-only (cold-start) embeddings sit where engagement ones do.

    Args:
        dim: embedding width.
        directions: (teacher view, student view) pairs.
        hidden: predictor hidden width (default 2 * dim).
    """

    def __init__(self, dim: int, directions: tuple[tuple[int, int], ...], hidden: int | None = None) -> None:
        super().__init__()
        hidden = hidden or 2 * dim
        self.directions = tuple(tuple(d) for d in directions)
        self.predictor = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, student: list[Tensor], teacher: list[Tensor]) -> Tensor:
        """student, teacher: per view (B, C) embeddings -> scalar."""
        parts = [
            2 - 2 * F.cosine_similarity(self.predictor(student[y]), teacher[x], dim=-1).mean()
            for x, y in self.directions
        ]
        return torch.stack(parts).mean()


class CatalogueLoss(nn.Module):
    """Softmax of each user's held-out targets over the whole catalogue, its view entities masked.

    ``logits[i, j] = s * u_i·e_j`` over every catalogue entity j (fixed vectors: the spectral base
    of the training task's view), user i's deep-stage view entities removed; the loss is the mean
    over users of the mean cross-entropy of their targets (Mult-DAE's multinomial likelihood,
    every user weighing the same, as the test averages per user). With inputs that never saw the
    targets (:mod:`hir.model.task`), this is the masked new-to-user task of evaluation on the
    train split. ``s`` is a learned scale (initialised at ``1 / temperature``, kept in [1, 100]).

    Args:
        temperature: initial tau.
        learn_temperature: learn ``s``.
    """

    def __init__(self, temperature: float, learn_temperature: bool) -> None:
        super().__init__()
        self.log_scale = nn.Parameter(torch.tensor(-math.log(temperature)), requires_grad=learn_temperature)

    @property
    def scale(self) -> Tensor:
        return self.log_scale.clamp(0.0, math.log(100.0)).exp()

    def forward(self, users: Tensor, catalogue: Tensor, tgt_rows: Tensor, tgt_cols: Tensor, tgt_weight: Tensor,
                mask_rows: Tensor, mask_cols: Tensor, col_bias: Tensor | None = None,
                cols: Tensor | None = None, col_vectors: Tensor | None = None) -> Tensor:
        """users: (U, C); catalogue: (M, C); tgt_rows, tgt_cols, tgt_weight: (T,) each target's
        (user row, catalogue row, 1 / the user's target count); mask_rows, mask_cols: (Q,) entries
        to remove; col_bias: (M,) log-weight added to each entity's logit (-inf leaves it out; a
        sampled entity's ``log(1 / inclusion probability)``) or None -> scalar. ``cols`` (R,) and
        ``col_vectors`` (R, C): catalogue rows replaced by these vectors (the batch's cold entities,
        embedded by the network): as ``catalogue.index_copy(0, cols, col_vectors)``, but only those
        R columns carry a gradient to the catalogue side (a fixed catalogue's (M, C) gradient was
        a third of a training step's backward on completejourney)."""
        logits = users @ catalogue.T  # (U, M)
        if cols is not None and col_vectors is not None and len(cols):
            logits = logits.index_copy(1, cols, users @ col_vectors.T)
        logits = logits * self.scale
        if col_bias is not None:
            logits = logits + col_bias[None, :]
        logits = logits.index_put((mask_rows, mask_cols), logits.new_tensor(float("-inf")))
        logp = torch.log_softmax(logits, dim=-1)  # (U, M)
        n = torch.unique(tgt_rows).numel()
        return -(tgt_weight * logp[tgt_rows, tgt_cols]).sum() / max(n, 1)


class BalanceLoss(nn.Module):
    """Mean-entropy regulariser: pushes the batch-average prototype distribution of each level
    towards uniform, so every prototype gets used (0 = perfectly balanced).

    Args:
        levels: prototypes per level, coarse first.
        temperature: temperature of the student distribution.
    """

    def __init__(self, levels: tuple[int, ...], temperature: float) -> None:
        super().__init__()
        self.levels, self.temperature = tuple(levels), temperature

    def forward(self, student: list[Tensor]) -> Tensor:
        """student: per view (B, K_fine) prototype scores -> scalar."""
        parts = [mean_entropy_gap(level_log_probs(F.log_softmax(s / self.temperature, -1), self.levels)) for s in student]
        return torch.stack(parts).mean()
