"""LightGCN baseline arm (He et al. 2020) with PyG's ``torch_geometric.nn.LightGCN``: BPR on the
train-period history, early stopping on val recall@20 under the masked new-to-user protocol (the
paper's: train entities removed from the ranking, relevance = val entities new to the user; the
protocol of the report's headline), then top-K over the test history graph."""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import ClassVar

import numpy as np
import torch
from torch_geometric.nn import LightGCN as PygLightGCN

from hir_evaluation.metrics import recall_ndcg_at_k
from hir_evaluation.ranking.ranker import torch_threads
from hir_evaluation.retrieval.data import RetrievalData
from hir_evaluation.retrieval.rank import Ranked, inner_product_scores, rank_dense
from hir_evaluation.retrieval.registry import ArmInfo, RetrievalContext

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LightGCN:
    """The LightGCN arm: trained on the train period, its epoch selected on val, ranking the test
    users over the whole history graph. Args:
    dim, layers: embedding width and propagation depth.
    lr, lambda_reg: Adam step and BPR L2 weight.
    init_std: std of the normal initial embeddings (0 = PyG's xavier-uniform).
    batch_size: (user, positive, negative) triples per step; each step propagates the full graph.
    steps_per_epoch: steps between two val checks (0 = one pass over the train pairs).
    max_epochs, patience: early stopping on masked new-to-user val recall@20 (``patience``
        checks without a gain), never before ``min_epochs``.
    decline, decline_checks: stop sooner once the curve has turned over: the last
        ``decline_checks`` checks each more than ``decline`` (relative) below the best (0 = off).
        A flat or noisy stretch waits the full patience; an overfitting one does not.
    max_seconds: cap on training, in CPU seconds of this process (the time budget of `hir evaluate`):
        not wall-clock, so a fit that waits for a core (a loaded machine, the pipeline's
        low-priority prewarm) is not cut short and its result does not depend on the load.
    threads: torch CPU threads while training (1 measured 3.6x faster than 2 on a busy 2-core box).
    The values, and the measurements behind them, are in conf/eval/default.yaml (eval.retrieval.lightgcn).
    """

    dim: int
    layers: int
    lr: float
    lambda_reg: float
    init_std: float
    batch_size: int
    steps_per_epoch: int
    max_epochs: int
    patience: int
    min_epochs: int
    max_seconds: float
    threads: int
    decline: float = 0.0
    decline_checks: int = 2

    info: ClassVar[ArmInfo] = ArmInfo(role="baseline", fits_on_val=True)

    def topk(self, ctx: RetrievalContext, k: int) -> Ranked:
        # val's history is the train period: LightGCN trains on it and early-stops on val's held-out set
        res = fit_lightgcn(ctx.val, ctx.val, ctx.test, k, self, ctx.seed)
        return replace(res.ranked, fit={
            "best_epoch": res.best_epoch, "best_val_recall@20": res.best_val_recall,
            "selection": "masked_new_to_user val recall@20", "epochs": res.epochs,
            "epochs_after_best": res.epochs - res.best_epoch, "seconds": res.seconds,
            "stopped_by_budget": res.stopped_by_budget, "stopped_by": res.stopped_by, "curve": res.curve})


def _sym_normalized(src: np.ndarray, dst: np.ndarray, n: int) -> torch.Tensor:
    """D^-½ A D^-½ of the undirected edges (src, dst) over ``n`` nodes, both directions, as a
    sparse CSR (n, n) float32 tensor; symmetric by construction."""
    src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    deg = np.bincount(dst, minlength=n).astype(np.float64)
    values = (1.0 / np.sqrt(deg[src] * deg[dst])).astype(np.float32)
    index = torch.from_numpy(np.stack([dst, src]))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]parse.*")  # CSR "beta" / invariant-check notices
        coo = torch.sparse_coo_tensor(index, torch.from_numpy(values), (n, n), check_invariants=True)
        return coo.coalesce().to_sparse_csr()


@dataclass
class Graph:
    """The normalised adjacency over the nodes that have an edge: ``adj`` (n, n) CSR, ``nodes``
    (n,) their ids in U + I. Isolated nodes are left out of every sparse product: Aˡ E is 0 on
    them for l >= 1 (on completejourney's train graph 31k of 95k nodes, a third of the work)."""

    adj: torch.Tensor
    nodes: torch.Tensor


def propagation_graph(users: np.ndarray, items: np.ndarray, n_users: int) -> Graph:
    """:class:`Graph` of the (user, item) pairs, items offset by ``n_users`` in the node ids."""
    ends = np.concatenate([users, items + n_users])
    nodes, local = np.unique(ends, return_inverse=True)
    return Graph(_sym_normalized(local[: len(users)], local[len(users) :], len(nodes)), torch.from_numpy(nodes))


class _SymmetricSpmm(torch.autograd.Function):
    """y = A x for a symmetric sparse A; the backward is A g (Aᵀ = A), so torch never builds Aᵀ
    (its CSR backward re-transposes A at every step, ~5x slower on a 1M-edge graph)."""

    @staticmethod
    def forward(ctx, adj: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.adj = adj
        return torch.sparse.mm(adj, x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        return None, torch.sparse.mm(ctx.adj, grad)


def propagate(model: PygLightGCN, graph: Graph) -> torch.Tensor:
    """``model.get_embedding`` for a pre-normalised symmetric adjacency (the model is built with
    ``normalize=False``): Σ_l α_l Aˡ E, (U + I, dim). Same maths, faster backward, and the sparse
    products run over ``graph.nodes`` only."""
    x = model.embedding.weight
    out = x * model.alpha[0]
    h = x[graph.nodes]  # (n, dim), the nodes with an edge
    acc = torch.zeros_like(h)
    for layer in range(model.num_layers):
        h = _SymmetricSpmm.apply(graph.adj, h)
        acc = acc + h * model.alpha[layer + 1]
    return out.index_add(0, graph.nodes, acc)


@dataclass
class LightGCNResult:
    """ranked: the test users' top-k under both protocols, from the best epoch's weights;
    best_epoch / best_val_recall: the selected epoch and its masked new-to-user val recall@20;
    epochs: epochs run; seconds: training + scoring time; stopped_by: ``patience`` or
    ``decline`` (the val plateau, :func:`plateau_stop`), ``max_seconds`` or ``max_epochs`` (the budget: ``stopped_by_budget``); curve: one
    entry per epoch (``epoch``, ``seconds`` since the start, ``loss`` of the last step,
    ``val_recall@20`` masked new-to-user, ``val_recall@20_full`` full catalogue against every val
    entity); embeddings: (U + I, dim) the test-graph propagation the ranking used (users first,
    items offset by U)."""

    ranked: Ranked
    best_epoch: int
    best_val_recall: float
    epochs: int
    seconds: float
    stopped_by_budget: bool = False
    stopped_by: str = "patience"
    curve: list[dict[str, float]] = field(default_factory=list)
    embeddings: np.ndarray | None = None


def val_recalls(emb: np.ndarray, n_users: int, val: RetrievalData) -> tuple[float, float]:
    """(masked new-to-user, full) val recall@20 of propagated embeddings ``emb`` (U + I, dim)."""
    ranked = rank_dense(inner_product_scores(emb[:n_users], emb[n_users:]), val.users, 20, val.seen)
    assert ranked.masked is not None
    return (recall_ndcg_at_k(ranked.masked, val.new_to_user, (20,))["recall@20"],
            recall_ndcg_at_k(ranked.full, val.relevant, (20,))["recall@20"])


def plateau_stop(recalls: list[float], bad: int, cfg: LightGCN) -> str | None:
    """Why training stops after the last check of ``recalls`` (val recall@20 per check), or None:
    ``patience`` after ``cfg.patience`` checks without a gain (``bad``), ``decline`` when each of
    the last ``cfg.decline_checks`` checks lies more than ``cfg.decline`` below the best (the
    curve has turned over: overfitting, not noise). Either way the best check's weights are kept."""
    if bad >= cfg.patience:
        return "patience"
    n = cfg.decline_checks
    if cfg.decline > 0 and 0 < n <= bad:
        best = max(recalls)
        if all(r < (1.0 - cfg.decline) * best for r in recalls[-n:]):
            return "decline"
    return None


def fit_lightgcn(
    train: RetrievalData, val: RetrievalData, test: RetrievalData, k: int, cfg: LightGCN, seed: int
) -> LightGCNResult:
    """Train on ``train.history`` (the train period), select the epoch by masked new-to-user
    recall@20 on ``val`` (its history masked, relevance = its new-to-user sets), then rank for
    ``test`` users propagating over ``test.history`` with the best weights, every protocol.
    """
    with torch_threads(cfg.threads):
        return _fit(train, val, test, k, cfg, seed)


def _fit(
    train: RetrievalData, val: RetrievalData, test: RetrievalData, k: int, cfg: LightGCN, seed: int
) -> LightGCNResult:
    t0, cpu0 = time.perf_counter(), time.process_time()
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    n_users, n_items = test.n_users, test.n_items
    n_nodes = n_users + n_items
    # a fixed pair order: the seeded draws below index into it (history comes from unordered joins)
    hist = train.history.sort("user_id", "entity_id")
    u = hist["user_id"].to_numpy()
    i = hist["entity_id"].to_numpy()
    if len(u) == 0:
        raise ValueError("LightGCN: the train period has no history pairs")
    adj_train = propagation_graph(u, i, n_users)
    model = PygLightGCN(n_nodes, cfg.dim, cfg.layers, normalize=False)  # adj_train is already D^-1/2 A D^-1/2
    if cfg.init_std > 0:
        torch.nn.init.normal_(model.embedding.weight, std=cfg.init_std)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    steps = cfg.steps_per_epoch or max(1, len(u) // cfg.batch_size)
    best, best_state, best_epoch, bad, epoch, budget_hit = -1.0, None, 0, 0, 0, False
    curve: list[dict[str, float]] = []
    stopped_by = "max_epochs"
    for epoch in range(1, cfg.max_epochs + 1):
        model.train()
        for _ in range(steps):
            pick = rng.integers(0, len(u), size=min(cfg.batch_size, len(u)))
            uu = torch.from_numpy(u[pick])
            pos = torch.from_numpy(i[pick] + n_users)
            neg = torch.from_numpy(rng.integers(0, n_items, size=len(pick)) + n_users)
            emb = propagate(model, adj_train)  # (U + I, dim), full propagation
            pos_rank = (emb[uu] * emb[pos]).sum(-1)
            neg_rank = (emb[uu] * emb[neg]).sum(-1)
            loss = model.recommendation_loss(
                pos_rank, neg_rank, node_id=torch.cat([uu, pos, neg]), lambda_reg=cfg.lambda_reg
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            recall, recall_full = val_recalls(propagate(model, adj_train).numpy(), n_users, val)
        curve.append({"epoch": epoch, "seconds": round(time.perf_counter() - t0, 2), "loss": float(loss.item()),
                      "val_recall@20": recall, "val_recall@20_full": recall_full})
        log.info("lightgcn epoch %d: loss %.4f, val recall@20 %.4f masked new-to-user (%.4f full), %.0fs",
                 epoch, loss.item(), recall, recall_full, curve[-1]["seconds"])
        if recall > best + 1e-6:
            best, best_epoch, bad = recall, epoch, 0
            best_state = {key: v.detach().clone() for key, v in model.state_dict().items()}
        else:
            bad += 1
        if epoch >= cfg.min_epochs and (reason := plateau_stop([c["val_recall@20"] for c in curve], bad, cfg)):
            stopped_by = reason
            break
        if time.process_time() - cpu0 > cfg.max_seconds:
            stopped_by = "max_seconds"
            break
    if stopped_by == "max_epochs" and bad >= cfg.patience:
        stopped_by = "patience"  # plateaued, but min_epochs kept it going to the end
    if stopped_by not in ("patience", "decline"):
        budget_hit = True
        log.warning("lightgcn: stopped at epoch %d by eval.retrieval.lightgcn.%s (%s), %d epochs after its best val epoch %d "
                    "(patience %d): it may not have reached its val plateau; raise the budget", epoch, stopped_by,
                    f"{cfg.max_seconds:.0f}s" if stopped_by == "max_seconds" else cfg.max_epochs, epoch - best_epoch,
                    best_epoch, cfg.patience)
    if best_state is not None:
        model.load_state_dict(best_state)
    adj_full = propagation_graph(test.history["user_id"].to_numpy(), test.history["entity_id"].to_numpy(), n_users)
    with torch.no_grad():
        emb = propagate(model, adj_full).numpy()
    ranked = rank_dense(inner_product_scores(emb[:n_users], emb[n_users:]), test.users, k, test.seen,
                        deep=test.seen_deep)
    return LightGCNResult(ranked, best_epoch, best, epoch, time.perf_counter() - t0, budget_hit, stopped_by, curve,
                          emb)
