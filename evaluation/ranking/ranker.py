"""The downstream ranker: a small DLRM-style model (Naumov et al. 2019) in plain torch, trained
with one recipe, seed and budget for every arm so only the input features differ."""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from hir_evaluation.ranking.features import RankerInputs

log = logging.getLogger(__name__)
HOLDOUTS = ("user", "time", "auto")


@dataclass(frozen=True)
class RankerConfig:
    """Model size and the training recipe shared by all arms.

    Args:
        dim: width D of every embedding / projected vector taking part in the interactions.
        bottom: hidden sizes of the dense-feature MLP (its output is one more D-vector).
        top: hidden sizes of the MLP over [bottom output, pairwise dots].
        dropout: dropout on the hidden layers of both MLPs (0 = none).
        lr, weight_decay, batch_size: the recipe: AdamW on the dense layers (``weight_decay``
            decoupled, dense layers only) and SparseAdam on the id tables and token bags (a step
            updates only the rows its batch looks up, lazily, as CTR trainers do).
        table_l2: L2 penalty on the id-table and token-bag rows a batch looks up (frequency-aware:
            a rare id is pulled toward 0 only when it is seen).
        table_lr: the tables' learning rate (0 = ``lr``).
        table_init: std of the tables' normal initialisation; 0 starts every row at 0, so an id
            the fit rows never contain adds nothing (rather than seed-dependent noise) at test.
        ema: the model checked and kept is an exponential moving average of the weights with
            this decay per step, warmed up as (1 + t) / (10 + t) (0 = the weights themselves).
        max_steps, min_steps, max_epochs: the step budget: ``max_epochs`` passes over the fit
            rows (0 = no epoch limit), but at least ``min_steps`` (small fit sets take several
            passes) and at most ``max_steps``. Id tables memorise the rows of one pass and
            overfit from the second ("one-epoch overfitting" of CTR models, Zhang et al. 2022:
            the holdout loss jumps at the epoch boundary), so one pass is the usual budget.
        lr_schedule: ``constant``, or ``cosine``: the learning rate decays to 0 over the budget,
            so the last checks sit on the plateau of the pass rather than on its noise.
        eval_every, checks_per_epoch: the holdout log loss is checked every ``eval_every`` steps,
            or more often when an epoch is shorter than ``checks_per_epoch`` such intervals;
        patience: training stops after ``patience`` checks without improvement, best weights
            restored (the curve of every check is kept: :attr:`FittedRanker.curve`).
        holdout, holdout_by: the share of the fit rows held out for early stopping: by ``user``
            (that share of the users, all their rows), by ``time`` (the latest rows, so the
            checks score later rows of known users, as the test period does; rows need times),
            or ``auto``: by time when the fit rows have more than one time, else by user;
        holdout_rows: at most this many holdout rows are scored per check (a seeded sample of
            the held-out users' rows; 0 = all): the checks compare points of one curve on the
            same rows, so a sample ranks them as the whole would, at a fraction of the cost.
        threads: torch CPU threads while training; the ops are small, so on 2 cores thread
            synchronisation costs more than it gains (1 thread measured 40x faster on a busy box).
    """

    dim: int = 16
    bottom: tuple[int, ...] = (64,)
    top: tuple[int, ...] = (64, 32)
    dropout: float = 0.0
    lr: float = 3e-3
    weight_decay: float = 1e-5
    table_l2: float = 0.0
    table_lr: float = 0.0
    table_init: float = 0.05
    ema: float = 0.0
    batch_size: int = 1024
    max_steps: int = 2000
    min_steps: int = 0
    max_epochs: float = 0.0
    lr_schedule: str = "constant"
    eval_every: int = 200
    checks_per_epoch: int = 1
    patience: int = 3
    holdout: float = 0.2
    holdout_by: str = "auto"
    holdout_rows: int = 0
    threads: int = 1


def _mlp(sizes: list[int], last_act: bool, dropout: float = 0.0) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_act:
            layers.append(nn.ReLU())
            if dropout > 0 and i < len(sizes) - 2:  # hidden layers only, never the output
                layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """logit = top([b, dots(b, e_1..e_S, v_1..v_V, t_1..t_T)]) where

    b = bottom(dense) (B, D); e_j = E_j[sparse_j] (B, D); v = W_v x_v (B, D) for dense vectors
    x_v (B, d_v); t = Σ_k w_k T[id_k] (B, D) for weighted token bags; dots are the
    T(T-1)/2 pairwise inner products of those D-vectors.

    Args:
        n_dense: F, dense feature count.
        vocab: table size per sparse column (id 0 = unknown).
        vector_dims: name -> d_v of each dense vector input.
        bag_vocab: name -> vocabulary of each token bag.
        cfg: sizes (``dim``, ``bottom``, ``top``).
    """

    def __init__(
        self, n_dense: int, vocab: list[int], vector_dims: dict[str, int], bag_vocab: dict[str, int], cfg: RankerConfig
    ) -> None:
        super().__init__()
        d = cfg.dim
        self.table_init = cfg.table_init
        self.bottom = _mlp([n_dense, *cfg.bottom, d], last_act=True, dropout=cfg.dropout)
        # sparse gradients: a step touches only the rows its batch looks up (lazy Adam, as CTR
        # trainers do), so its cost does not grow with the vocabulary
        self.tables = nn.ModuleList(nn.Embedding(v, d, sparse=True) for v in vocab)
        self.projections = nn.ModuleDict({k: nn.Linear(n, d) for k, n in vector_dims.items()})
        self.bags = nn.ModuleDict({k: nn.EmbeddingBag(v, d, mode="sum", sparse=True) for k, v in bag_vocab.items()})
        n_vec = 1 + len(vocab) + len(vector_dims) + len(bag_vocab)
        self.register_buffer("pairs", torch.triu_indices(n_vec, n_vec, offset=1), persistent=False)
        self.top = _mlp([d + self.pairs.shape[1], *cfg.top, 1], last_act=False, dropout=cfg.dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for table in self.tables:
            nn.init.normal_(table.weight, std=self.table_init)
        for bag in self.bags.values():
            nn.init.normal_(bag.weight, std=self.table_init)

    def forward(self, *inputs: Any) -> torch.Tensor:
        """(dense, sparse, vectors, bags) as :meth:`forward_with_penalty` takes them -> logits (B,)."""
        return self.forward_with_penalty(*inputs)[0]

    def forward_with_penalty(
        self,
        dense: torch.Tensor,
        sparse: torch.Tensor,
        vectors: dict[str, torch.Tensor],
        bags: dict[str, tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits (B,), the mean squared norm of the table and bag rows looked up, a scalar).

        The penalty counts each looked-up row once per row of the batch (B·S table rows, and
        each bag's (B, k) token rows weighted by their bag weights)."""
        b = self.bottom(dense)  # (B, D)
        looked = [t(sparse[:, j]) for j, t in enumerate(self.tables)]  # S x (B, D)
        penalty = sum((e.pow(2).sum(1).mean() for e in looked), torch.zeros(()))
        parts = [b, *looked]
        parts += [self.projections[k](vectors[k]) for k in self.projections]
        for k, bag in self.bags.items():
            ids, w = bags[k]  # (B, k), (B, k)
            parts.append(bag(ids, per_sample_weights=w))
            if self.training:
                rows = nn.functional.embedding(ids, bag.weight, sparse=True)  # (B, k, D)
                penalty = penalty + (rows.pow(2).sum(-1) * w).sum(1).mean()
        x = torch.stack(parts, dim=1)  # (B, T, D)
        dots = torch.bmm(x, x.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]  # (B, T(T-1)/2)
        return self.top(torch.cat([b, dots], dim=1)).squeeze(1), penalty

    def __repr__(self) -> str:
        return (
            f"DLRM(dense={self.bottom[0].in_features}, tables={[t.num_embeddings for t in self.tables]}, "
            f"vectors={list(self.projections)}, bags={list(self.bags)}, dim={self.bottom[-2].out_features}, "
            f"interactions={self.pairs.shape[1]})"
        )


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run a block with ``n`` torch CPU threads (0 = leave as is), restoring the previous count."""
    before = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class FittedRanker:
    """A trained ranker (best holdout weights) and how it got there.

    curve: one ``{"step", "holdout_log_loss"}`` per holdout check, in order; ``steps`` is the
    best check's step and ``checks_per_epoch``-spaced checks make ``steps_per_epoch`` steps a pass.
    """

    model: DLRM
    mean: np.ndarray
    std: np.ndarray
    steps: int
    best_holdout_loss: float
    seconds: float
    threads: int = 1
    curve: list[dict[str, float]] = field(default_factory=list)
    steps_per_epoch: int = 0

    @property
    def best_check(self) -> int:
        """1-based index of the best check on :attr:`curve` (1 = the first check)."""
        return 1 + next(i for i, c in enumerate(self.curve) if c["step"] == self.steps) if self.curve else 0

    def predict(self, inputs: RankerInputs, rows: np.ndarray | None = None, batch_size: int = 8192) -> np.ndarray:
        """Probabilities for ``rows`` of ``inputs`` (indices; None = every row), shape (len(rows),)."""
        rows = np.arange(len(inputs)) if rows is None else np.asarray(rows)
        self.model.eval()
        out = []
        with torch.no_grad(), torch_threads(self.threads):
            for start in range(0, len(rows), batch_size):
                idx = rows[start : start + batch_size]
                out.append(torch.sigmoid(self.model(*_tensors(inputs, idx, self.mean, self.std))).numpy())
        return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)


def _tensors(inputs: RankerInputs, idx: np.ndarray, mean: np.ndarray, std: np.ndarray):
    dense = torch.from_numpy(((inputs.dense[idx] - mean) / std).astype(np.float32))
    sparse = torch.from_numpy(inputs.sparse[idx])
    vectors = {k: torch.from_numpy(v[idx]) for k, v in inputs.vectors.items()}
    bags = {k: (torch.from_numpy(b.ids[idx]), torch.from_numpy(b.weights[idx])) for k, b in inputs.bags.items()}
    return dense, sparse, vectors, bags


def time_holdout(times: np.ndarray, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (fit, holdout): the latest ``fraction`` of the rows by time are held out (rows
    at the cut's instant stay together on one side), so the checks score later rows than the
    ranker learns from, as the test period does."""
    order = np.argsort(times, kind="stable")
    cut = times[order[min(len(order) - 1, round((1 - fraction) * len(order)))]]
    held = times >= cut
    if held.all() or not held.any():  # one instant: early-stop on the fit rows themselves
        rows = np.arange(len(times))
        return rows, rows
    return np.flatnonzero(~held), np.flatnonzero(held)


def holdout_split(users: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (fit, holdout), grouped by user so no user is on both sides."""
    uniq = np.unique(users)
    if len(uniq) < 2:  # nothing to hold out: early-stop on the fit rows themselves
        rows = np.arange(len(users))
        return rows, rows
    rng = np.random.default_rng(seed)
    held = rng.choice(uniq, size=min(len(uniq) - 1, max(1, round(fraction * len(uniq)))), replace=False)
    mask = np.isin(users, held)
    return np.flatnonzero(~mask), np.flatnonzero(mask)


def fit_ranker(
    inputs: RankerInputs,
    y: np.ndarray,
    users: np.ndarray,
    cfg: RankerConfig,
    seed: int,
    name: str = "ranker",
    rows: np.ndarray | None = None,
    times: np.ndarray | None = None,
) -> FittedRanker:
    """Train on ``rows`` of ``inputs``/``y``/``users`` (indices; None = every row) with early
    stopping on a user-grouped holdout. Rows are gathered per batch, so no arm's features are
    copied for a fit.

    Args:
        inputs: the arm's features, n rows.
        y: (n,) labels in {0, 1}.
        users: (n,) user ids, for the grouped holdout.
        seed: seeds the holdout, initialisation, dropout and batch order (same for every arm).
        times: (n,) row times (any sortable numbers), needed when ``cfg.holdout_by == "time"``.
    """
    rows = np.arange(len(y)) if rows is None else np.asarray(rows)
    if cfg.holdout_by not in HOLDOUTS:
        raise ValueError(f"eval.ranker.holdout_by={cfg.holdout_by!r}; expected one of {list(HOLDOUTS)}")
    by = cfg.holdout_by
    if by == "auto":
        by = "time" if times is not None and len(np.unique(np.asarray(times)[rows])) > 1 else "user"
    if by == "time":
        if times is None:
            raise ValueError(f"{name}: eval.ranker.holdout_by=time needs the rows' times")
        fit_pos, hold_pos = time_holdout(np.asarray(times)[rows], cfg.holdout)
    else:
        fit_pos, hold_pos = holdout_split(users[rows], cfg.holdout, seed)
    with torch_threads(cfg.threads):
        return _fit(inputs, y, rows[fit_pos], rows[hold_pos], cfg, seed, name, time.perf_counter())


def _holdout_loss(model: DLRM, inputs: RankerInputs, y: torch.Tensor, idx: np.ndarray, mean: np.ndarray,
                  std: np.ndarray, batch_size: int = 8192) -> float:
    """Mean log loss over ``idx`` (evaluation mode, in batches)."""
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(idx), batch_size):
            part = idx[start : start + batch_size]
            logits = model(*_tensors(inputs, part, mean, std))
            total += float(nn.functional.binary_cross_entropy_with_logits(logits, y[part], reduction="sum"))
    return total / max(len(idx), 1)


def _fit(
    inputs: RankerInputs, y: np.ndarray, fit_idx: np.ndarray, hold_idx: np.ndarray, cfg: RankerConfig, seed: int,
    name: str, t0: float,
) -> FittedRanker:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    if cfg.holdout_rows and len(hold_idx) > cfg.holdout_rows:
        hold_idx = np.sort(rng.choice(hold_idx, size=cfg.holdout_rows, replace=False))
    dense_fit = inputs.dense[fit_idx]
    mean = dense_fit.mean(0)
    std = dense_fit.std(0) + 1e-6
    del dense_fit
    model = DLRM(
        inputs.dense.shape[1],
        inputs.vocab,
        {k: v.shape[1] for k, v in inputs.vectors.items()},
        {k: b.vocab for k, b in inputs.bags.items()},
        cfg,
    )
    # start at the base rate, so the first steps learn ranking rather than the intercept
    rate = float(np.clip(y[fit_idx].mean(), 1e-4, 1 - 1e-4))
    with torch.no_grad():
        model.top[-1].bias.fill_(float(np.log(rate / (1 - rate))))
    tables = [*model.tables.parameters(), *model.bags.parameters()]
    sparse_ids = {id(p) for p in tables}
    dense_opt = torch.optim.AdamW([p for p in model.parameters() if id(p) not in sparse_ids], lr=cfg.lr,
                                  weight_decay=cfg.weight_decay)
    table_opt = torch.optim.SparseAdam(tables, lr=cfg.table_lr or cfg.lr) if tables else None
    loss_fn = nn.BCEWithLogitsLoss()
    y_t = torch.from_numpy(y.astype(np.float32))
    # the model that is checked and kept: an exponential moving average of the weights (ema > 0)
    scored = copy.deepcopy(model) if cfg.ema else model
    best, best_state, best_step, bad, step = float("inf"), None, 0, 0, 0
    curve: list[dict[str, float]] = []
    order = np.zeros(0, dtype=np.int64)
    per_epoch = -(-len(fit_idx) // cfg.batch_size)
    every = max(1, min(cfg.eval_every, -(-per_epoch // max(1, cfg.checks_per_epoch))))
    budget = cfg.max_steps
    if cfg.max_epochs > 0:
        budget = min(cfg.max_steps, max(cfg.min_steps, int(np.ceil(cfg.max_epochs * per_epoch))))
    if cfg.lr_schedule not in ("constant", "cosine"):
        raise ValueError(f"eval.ranker.lr_schedule={cfg.lr_schedule!r}; expected 'constant' or 'cosine'")
    scale = (lambda t: 0.5 * (1 + np.cos(np.pi * min(t, budget) / budget))) if cfg.lr_schedule == "cosine" else (
        lambda t: 1.0)
    schedules = [torch.optim.lr_scheduler.LambdaLR(o, scale) for o in (dense_opt, table_opt) if o is not None]
    while step < budget:
        model.train()
        for _ in range(min(every, budget - step)):
            if len(order) < cfg.batch_size:  # a fresh shuffle of the fit rows per epoch
                order = np.concatenate([order, fit_idx[rng.permutation(len(fit_idx))]])
            idx, order = order[: cfg.batch_size], order[cfg.batch_size :]
            logits, penalty = model.forward_with_penalty(*_tensors(inputs, idx, mean, std))
            loss = loss_fn(logits, y_t[idx])
            if not torch.isfinite(loss):
                raise FloatingPointError(f"{name}: non-finite training loss {loss.item()} at step {step}")
            dense_opt.zero_grad(set_to_none=True)
            if table_opt is not None:
                table_opt.zero_grad(set_to_none=True)
            (loss + cfg.table_l2 * penalty if cfg.table_l2 else loss).backward()
            dense_opt.step()
            if table_opt is not None:
                table_opt.step()
            for schedule in schedules:
                schedule.step()
            if scored is not model:
                # the average's decay warms up (1 + t) / (10 + t) -> ema, so short runs move it
                decay = min(cfg.ema, (1 + step) / (10 + step))
                with torch.no_grad():
                    for avg, cur in zip(scored.parameters(), model.parameters()):
                        avg.lerp_(cur, 1.0 - decay)
            step += 1
        scored.eval()
        hold = _holdout_loss(scored, inputs, y_t, hold_idx, mean, std)
        curve.append({"step": step, "holdout_log_loss": hold})
        log.debug("%s step %d: holdout log loss %.5f", name, step, hold)
        if hold < best - 1e-5:
            best, best_step, bad = hold, step, 0
            best_state = {k: v.detach().clone() for k, v in scored.state_dict().items()}
        else:
            bad += 1
            if bad >= cfg.patience:
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    log.info("%s: best holdout log loss %.5f at step %d (check %d of %d, %d steps an epoch)", name, best, best_step,
             1 + [c["step"] for c in curve].index(best_step) if curve else 0, len(curve), per_epoch)
    return FittedRanker(model, mean, std, best_step, best, time.perf_counter() - t0, cfg.threads, curve, per_epoch)
