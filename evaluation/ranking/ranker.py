"""The downstream ranker: a small DLRM-style model (Naumov et al. 2019) in plain torch, trained
with one recipe, seed and budget for every arm so only the input features differ."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from hir_evaluation.ranking.features import RankerInputs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RankerConfig:
    """Model size and the training recipe shared by all arms.

    Args:
        dim: width D of every embedding / projected vector taking part in the interactions.
        bottom: hidden sizes of the dense-feature MLP (its output is one more D-vector).
        top: hidden sizes of the MLP over [bottom output, pairwise dots].
        lr, weight_decay, batch_size: AdamW recipe.
        max_steps: the step budget (the same for every arm, whatever the data size).
        eval_every, patience: the holdout log loss is checked every ``eval_every`` steps (or every
            epoch when an epoch is shorter: small data overfits the id tables within a few epochs);
            training stops after ``patience`` checks without improvement, best weights restored.
        holdout: fraction of fit users held out for early stopping (grouped by user).
        threads: torch CPU threads while training; the ops are small, so on 2 cores thread
            synchronisation costs more than it gains (1 thread measured 40x faster on a busy box).
    """

    dim: int = 16
    bottom: tuple[int, ...] = (64,)
    top: tuple[int, ...] = (64, 32)
    lr: float = 3e-3
    weight_decay: float = 1e-5
    batch_size: int = 1024
    max_steps: int = 2000
    eval_every: int = 200
    patience: int = 3
    holdout: float = 0.2
    threads: int = 1


def _mlp(sizes: list[int], last_act: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_act:
            layers.append(nn.ReLU())
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
        self.bottom = _mlp([n_dense, *cfg.bottom, d], last_act=True)
        self.tables = nn.ModuleList(nn.Embedding(v, d) for v in vocab)
        self.projections = nn.ModuleDict({k: nn.Linear(n, d) for k, n in vector_dims.items()})
        self.bags = nn.ModuleDict({k: nn.EmbeddingBag(v, d, mode="sum") for k, v in bag_vocab.items()})
        n_vec = 1 + len(vocab) + len(vector_dims) + len(bag_vocab)
        self.register_buffer("pairs", torch.triu_indices(n_vec, n_vec, offset=1), persistent=False)
        self.top = _mlp([d + self.pairs.shape[1], *cfg.top, 1], last_act=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for table in self.tables:
            nn.init.normal_(table.weight, std=0.05)
        for bag in self.bags.values():
            nn.init.normal_(bag.weight, std=0.05)

    def forward(
        self,
        dense: torch.Tensor,
        sparse: torch.Tensor,
        vectors: dict[str, torch.Tensor],
        bags: dict[str, tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """dense (B, F), sparse (B, S), vectors name -> (B, d_v), bags name -> ((B, k), (B, k)) -> logits (B,)."""
        b = self.bottom(dense)  # (B, D)
        parts = [b, *[t(sparse[:, j]) for j, t in enumerate(self.tables)]]
        parts += [self.projections[k](vectors[k]) for k in self.projections]
        parts += [self.bags[k](bags[k][0], per_sample_weights=bags[k][1]) for k in self.bags]
        x = torch.stack(parts, dim=1)  # (B, T, D)
        dots = torch.bmm(x, x.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]  # (B, T(T-1)/2)
        return self.top(torch.cat([b, dots], dim=1)).squeeze(1)

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
    model: DLRM
    mean: np.ndarray
    std: np.ndarray
    steps: int
    best_holdout_loss: float
    seconds: float
    threads: int = 1

    def predict(self, inputs: RankerInputs, batch_size: int = 8192) -> np.ndarray:
        """Probabilities (n,) for every row of ``inputs``."""
        self.model.eval()
        out = []
        with torch.no_grad(), torch_threads(self.threads):
            for start in range(0, len(inputs), batch_size):
                idx = np.arange(start, min(start + batch_size, len(inputs)))
                out.append(torch.sigmoid(self.model(*_tensors(inputs, idx, self.mean, self.std))).numpy())
        return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)


def _tensors(inputs: RankerInputs, idx: np.ndarray, mean: np.ndarray, std: np.ndarray):
    dense = torch.from_numpy(((inputs.dense[idx] - mean) / std).astype(np.float32))
    sparse = torch.from_numpy(inputs.sparse[idx])
    vectors = {k: torch.from_numpy(v[idx]) for k, v in inputs.vectors.items()}
    bags = {k: (torch.from_numpy(b.ids[idx]), torch.from_numpy(b.weights[idx])) for k, b in inputs.bags.items()}
    return dense, sparse, vectors, bags


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
    inputs: RankerInputs, y: np.ndarray, users: np.ndarray, cfg: RankerConfig, seed: int, name: str = "ranker"
) -> FittedRanker:
    """Train on ``inputs``/``y`` (n rows) with early stopping on a user-grouped holdout.

    Args:
        inputs: the arm's features of the fit rows.
        y: (n,) labels in {0, 1}.
        users: (n,) user ids, for the grouped holdout.
        seed: seeds the holdout, initialisation and batch order (same for every arm).
    """
    with torch_threads(cfg.threads):
        return _fit(inputs, y, users, cfg, seed, name, time.perf_counter())


def _fit(
    inputs: RankerInputs, y: np.ndarray, users: np.ndarray, cfg: RankerConfig, seed: int, name: str, t0: float
) -> FittedRanker:
    torch.manual_seed(seed)
    fit_idx, hold_idx = holdout_split(users, cfg.holdout, seed)
    mean = inputs.dense[fit_idx].mean(0)
    std = inputs.dense[fit_idx].std(0) + 1e-6
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
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    loss_fn = nn.BCEWithLogitsLoss()
    y_t = torch.from_numpy(y.astype(np.float32))
    rng = np.random.default_rng(seed)
    hold_x = _tensors(inputs, hold_idx, mean, std)
    best, best_state, best_step, bad, step = float("inf"), None, 0, 0, 0
    order = np.zeros(0, dtype=np.int64)
    every = max(1, min(cfg.eval_every, -(-len(fit_idx) // cfg.batch_size)))
    while step < cfg.max_steps:
        model.train()
        for _ in range(every):
            if len(order) < cfg.batch_size:  # a fresh shuffle of the fit rows per epoch
                order = np.concatenate([order, fit_idx[rng.permutation(len(fit_idx))]])
            idx, order = order[: cfg.batch_size], order[cfg.batch_size :]
            loss = loss_fn(model(*_tensors(inputs, idx, mean, std)), y_t[idx])
            if not torch.isfinite(loss):
                raise FloatingPointError(f"{name}: non-finite training loss {loss.item()} at step {step}")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
        model.eval()
        with torch.no_grad():
            hold = float(loss_fn(model(*hold_x), y_t[hold_idx]))
        log.info("%s step %d: holdout log loss %.5f", name, step, hold)
        if hold < best - 1e-5:
            best, best_step, bad = hold, step, 0
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            bad += 1
            if bad >= cfg.patience:
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    return FittedRanker(model, mean, std, best_step, best, time.perf_counter() - t0, cfg.threads)
