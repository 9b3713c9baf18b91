"""The learned deep-funnel scorer: ranks a user's candidates (open funnel, discovery, popular).

What the training-free base cannot do is weigh the funnel: a cart two days old against a view
two months old, an item this user buys every week against one bought once, a discovery neighbour
against both. The scorer learns exactly that, from the candidate's stage, counts, recency and
source (:data:`hir.funnel.candidates.FEATURES`)::

    s(u, c) = MLP([x_uc, head(c, J_u)])   x_uc: (F,) features of candidate c of user u
    loss    = - 1/|T_u| sum_{t in T_u} log softmax_c(s(u, c))[t]

a listwise softmax over each user's candidate set against the entities the user converted in the
next period (``T_u``; Mult-DAE's multinomial likelihood restricted to the candidates), every user
weighted equally as the test averages per user. ``head`` (optional, ``heads > 0``) is the
target-aware attention from the candidate to the user's context items (hir/funnel/head.py),
trained with the MLP. Training stops at the best check of recall@K on users never fitted: a
share of the training users (``holdout``), or a later period's view of the same users (a
:class:`CheckSet`, hir/funnel/fit.py's ``select: period``); ``stop_at`` instead trains a fixed
number of steps and keeps the last (the refit after a period check).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from hir.funnel.head import Context, ContextHead

log = logging.getLogger(__name__)


@dataclass
class ScorerConfig:
    """hidden: MLP widths; steps: optimiser steps; batch: users per step; lr, weight_decay:
    AdamW; holdout: share of training users held out for the checks; checks: how many checks;
    patience: stop after this many checks without a new best; k: the recall@k the checks compare;
    heads: attention heads of the target-aware head (0 = none: the MLP reads the features alone);
    context: the user's pairs the head attends to (the plain order's first; its cost grows with it).

    kind: ``mlp`` (this module) or ``gbdt`` (hir/funnel/boost.py: gradient-boosted trees, pointwise,
    the same holdout, checks, patience and k). The gbdt's own: trees (boosting rounds at most),
    tree_lr, leaves (per tree), min_leaf (rows per leaf), l2 (leaf regularisation), relative (feature
    names whose within-user rank is an input), per_user (weigh a user's rows by 1 / its targets)."""

    hidden: list[int] = field(default_factory=lambda: [64, 64])
    steps: int = 300
    batch: int = 256
    lr: float = 3e-3
    weight_decay: float = 1e-4
    holdout: float = 0.15
    checks: int = 10
    patience: int = 3
    k: int = 20
    heads: int = 0
    context: int = 20
    kind: str = "mlp"
    trees: int = 200
    tree_lr: float = 0.1
    leaves: int = 31
    min_leaf: int = 500
    l2: float = 1.0
    relative: list[str] = field(default_factory=lambda: ["trip_share_97", "trip_share_90", "log_target", "base_score",
                                                         "log_due", "log_target_age"])
    per_user: bool = False


def lr_schedule(opt: torch.optim.Optimizer, lr: float, steps: int) -> torch.optim.lr_scheduler.LRScheduler:
    """One-cycle to ``lr`` over ``steps`` (10% warm-up), or a constant ``lr`` below 20 steps:
    torch's OneCycleLR divides by its warm-up's length in steps less one, which is 0 at exactly
    10 steps (ZeroDivisionError), and a schedule of a handful of steps has no shape to keep."""
    if steps < 20:
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)


@dataclass
class CheckSet:
    """The candidates a fit is checked on instead of held-out training users: ``x`` (n, F), ``y``
    (n,), ``offsets`` (U + 1,) and ``total`` (U,) as the training rows, ``context`` the head's
    inputs (None without a head)."""

    x: np.ndarray
    y: np.ndarray
    offsets: np.ndarray
    total: np.ndarray
    context: Context | None = None


class FunnelScorer(nn.Module):
    """``s = MLP([standardise(x), head(context)])``: (B, C, F) candidate features (and the head's
    inputs, :meth:`hir.funnel.head.Context.batch`) -> (B, C) scores; (n, F) -> (n,) without a head.

    Args:
        mean, std: (F,) feature standardisation (from the training rows).
        hidden: hidden widths.
        heads: the target-aware head's heads (0 = no head).
    """

    def __init__(self, mean: np.ndarray, std: np.ndarray, hidden: list[int], heads: int = 0) -> None:
        super().__init__()
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32))
        self.head = ContextHead(heads) if heads else None
        layers: list[nn.Module] = []
        width = len(mean) + (self.head.width if self.head is not None else 0)
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def __repr__(self) -> str:
        return (f"FunnelScorer(features={len(self.mean)}, head={self.head}, "
                f"mlp={[m.out_features for m in self.mlp if isinstance(m, nn.Linear)]})")

    def forward(self, x: torch.Tensor, head_in: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        h = (x - self.mean) / self.std
        if self.head is not None:
            if head_in is None:
                raise ValueError("this funnel scorer has a target-aware head: pass the context's batch")
            h = torch.cat([h, self.head(*head_in)], dim=-1)  # (B, C, F + 2H)
        return self.mlp(h).squeeze(-1)

    @torch.no_grad()
    def score(self, x: np.ndarray, context: Context | None = None, chunk: int = 262_144) -> np.ndarray:
        """(n,) scores of (n, F) feature rows (grouped by user as ``context.offsets`` says when
        the scorer has a head)."""
        self.eval()
        if self.head is None:
            out = [self(torch.from_numpy(x[lo:lo + chunk])).numpy() for lo in range(0, len(x), chunk)]
            return np.concatenate(out) if out else np.zeros(0, np.float32)
        if context is None:
            raise ValueError("this funnel scorer has a target-aware head: pass the candidates' context")
        offsets = context.offsets
        scores = np.zeros(len(x), np.float32)
        users = np.arange(len(offsets) - 1)
        step = 64
        for lo in range(0, len(users), step):
            rows = users[lo:lo + step]
            xb, _, mb = _padded(x, np.zeros(len(x), np.float32), offsets, rows)
            s = self(xb, context.batch(rows, xb.shape[1]))
            scores[offsets[rows[0]]:offsets[rows[-1] + 1]] = s[mb].numpy()
        return scores


def _padded(x: np.ndarray, y: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> tuple[torch.Tensor, ...]:
    """(B, C, F) features, (B, C) targets and (B, C) validity of the users ``rows`` (indices into
    ``offsets``: user r owns rows offsets[r]:offsets[r + 1])."""
    sizes = offsets[rows + 1] - offsets[rows]
    c = int(sizes.max())
    xb = np.zeros((len(rows), c, x.shape[1]), np.float32)
    yb = np.zeros((len(rows), c), np.float32)
    mb = np.zeros((len(rows), c), bool)
    for i, r in enumerate(rows):
        lo, hi = offsets[r], offsets[r + 1]
        xb[i, : hi - lo], yb[i, : hi - lo], mb[i, : hi - lo] = x[lo:hi], y[lo:hi], True
    return torch.from_numpy(xb), torch.from_numpy(yb), torch.from_numpy(mb)


def listwise_loss(scores: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean over users of the multinomial log-likelihood of the targets among the valid
    candidates. scores, targets, valid: (B, C)."""
    logp = torch.log_softmax(scores.masked_fill(~valid, -torch.inf), dim=1)
    per_user = -(logp.masked_fill(targets == 0, 0.0) * targets).sum(1) / targets.sum(1).clamp(min=1.0)
    return per_user.mean()


def recall_at(scores: np.ndarray, y: np.ndarray, offsets: np.ndarray, k: int, total: np.ndarray) -> float:
    """Mean over users of hits in the top-k of each user's candidates / the user's target count
    ``total`` (targets outside the candidates count as misses)."""
    out = []
    for r in range(len(offsets) - 1):
        lo, hi = offsets[r], offsets[r + 1]
        top = np.argsort(-scores[lo:hi], kind="stable")[:k]
        out.append(y[lo:hi][top].sum() / max(total[r], 1))
    return float(np.mean(out)) if out else math.nan


def fit_scorer(x: np.ndarray, y: np.ndarray, offsets: np.ndarray, total: np.ndarray, config: ScorerConfig,
               seed: int, context: Context | None = None, check_set: CheckSet | None = None,
               stop_at: int | None = None) -> tuple[FunnelScorer, dict[str, object]]:
    """Train on grouped candidate rows.

    Args:
        x: (n, F) features; y: (n,) 1 for a target entity; offsets: (U + 1,) row offsets of each
            user's candidates (rows sorted by user); total: (U,) the user's target count (also
            the targets missing from its candidates).
        context: the head's inputs of the same groups (needed when ``config.heads > 0``).
        check_set: the candidates the checks score (every training user is then fitted); None =
            a ``config.holdout`` share of the training users.
        stop_at: train exactly this many steps of the ``config.steps`` schedule and keep the last
            (no checks, no holdout: a refit at a step chosen elsewhere).
    Returns:
        The scorer at its best check and a record of the fit (checks, best step, users).
    """
    gen = np.random.default_rng(seed)
    torch.manual_seed(seed)
    users = np.arange(len(offsets) - 1)
    has = np.array([y[offsets[r]:offsets[r + 1]].any() for r in users])
    perm = gen.permutation(users)
    n_hold = 0 if check_set is not None or stop_at is not None else round(config.holdout * len(users))
    hold, fit_users = np.sort(perm[:n_hold]), perm[n_hold:]
    fit_users = fit_users[has[fit_users]]  # a user without a reachable target gives no gradient
    if len(fit_users) == 0:
        raise ValueError("the scorer has no training user with a target among its candidates; "
                         "the candidate sources reach none of the next period's conversions")
    sd = x.std(0)
    if config.heads and context is None:
        raise ValueError("funnel.config.scorer.heads > 0 needs the candidates' context (hir/funnel/head.py)")
    model = FunnelScorer(x.mean(0), np.where(sd > 1e-6, sd, 1.0), config.hidden, config.heads)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    sched = lr_schedule(opt, config.lr, config.steps)
    hold_rows = np.concatenate([np.arange(offsets[r], offsets[r + 1]) for r in hold]) if len(hold) else np.zeros(0, int)
    hold_off = np.concatenate([[0], np.cumsum(offsets[hold + 1] - offsets[hold])]) if len(hold) else np.zeros(1, int)
    hold_ctx = context.subset(hold) if context is not None and config.heads else None
    if check_set is not None:
        cx, cy, coff, ctot = check_set.x, check_set.y, check_set.offsets, check_set.total
        cctx = check_set.context if config.heads else None
    else:
        cx, cy, coff, ctot, cctx = x[hold_rows], y[hold_rows], hold_off, total[hold], hold_ctx

    def check() -> float:
        if stop_at is not None:
            return math.nan
        return recall_at(model.score(cx, cctx), cy, coff, config.k, ctot)

    if stop_at is not None and not 0 <= stop_at <= config.steps:
        raise ValueError(f"funnel scorer: stop_at={stop_at} outside the schedule's 0..{config.steps} steps")
    last = config.steps if stop_at is None else stop_at
    every = max(config.steps // config.checks, 1)
    best = (check(), 0, {k: v.clone() for k, v in model.state_dict().items()})
    history = [(0, best[0])]
    for step in range(1, last + 1):
        model.train()
        batch = gen.choice(fit_users, size=min(config.batch, len(fit_users)), replace=False)
        xb, yb, mb = _padded(x, y, offsets, batch)
        head_in = context.batch(batch, xb.shape[1]) if model.head is not None else None
        loss = listwise_loss(model(xb, head_in), yb, mb)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"funnel scorer: non-finite loss {loss.item()} at step {step}; "
                                     "lower funnel.scorer.lr")
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if stop_at is None and (step % every == 0 or step == config.steps):
            value = check()
            history.append((step, value))
            log.info("funnel scorer step %d: loss %.4f, held-out recall@%d %.4f", step, loss.item(), config.k, value)
            if value > best[0]:
                best = (value, step, {k: v.clone() for k, v in model.state_dict().items()})
            elif len(history) - 1 - [s for s, _ in history].index(best[1]) >= config.patience:
                log.info("funnel scorer: no better check in %d, stopped at step %d", config.patience, step)
                break
    if stop_at is not None:  # the refit keeps its last step: no check chose it here
        return model, {"checks": [], "best_step": last, "best_recall": None, "fit_users": len(fit_users),
                       "holdout_users": 0}
    model.load_state_dict(best[2])
    return model, {"checks": history, "best_step": best[1], "best_recall": best[0], "fit_users": len(fit_users),
                   "holdout_users": len(hold), "check_users": len(coff) - 1}
