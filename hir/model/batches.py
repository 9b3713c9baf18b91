"""Model inputs: sampled contexts -> tensors, fixed node batches to embed, and their embedding.

A batch holds one shared content matrix (and spectral base rows) for its distinct nodes and, per
view, the token arrays of :class:`~hir.model.context.ContextSampler` with ``row`` pointers into
them. Training (:mod:`hir.train.datamodule`) and export (:mod:`hir.export.embed`) build their
batches here, so both feed the network the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from hir.model.context import ContextSampler
from hir.model.spectral import SpectralBase
from hir.model.store import GraphStore
from hir.nn import HirNet

# catalogue rows per block of catalogue_vectors and catalogue_cold
CATALOGUE_BLOCK = 16384


def to_tensors(store: GraphStore, base: SpectralBase | None, views: dict[str, dict[str, np.ndarray]],
               **extra: np.ndarray) -> dict[str, Any]:
    """Numpy views -> tensors, with one shared content matrix.

    Each distinct node of the batch gets one content row (``content`` (U, D) float16) and, with a
    spectral ``base``, one base row (``base`` (U, K) float32, ``base_logit`` (U,)); each view gets
    ``row`` (R, N) int64 pointing into them (-1 for padding). ``extra`` arrays join as tensors.
    """
    nodes = np.concatenate([v["node"].ravel() for v in views.values()]) if views else np.zeros(0, np.int64)
    uniq = np.unique(nodes[nodes >= 0])
    out: dict[str, Any] = {"content": torch.from_numpy(store.content[uniq])}
    if base is not None:
        out["base"] = torch.from_numpy(base.vectors[uniq])
        out["base_logit"] = torch.from_numpy(base.logit[uniq])
    for name, v in views.items():
        t = {k: torch.from_numpy(np.ascontiguousarray(a)) for k, a in v.items()}
        t["row"] = torch.from_numpy(np.where(v["node"] >= 0, np.searchsorted(uniq, v["node"]), -1))
        out[name] = t
    out.update({k: torch.from_numpy(np.ascontiguousarray(a)) for k, a in extra.items()})
    return out


class EmbedBatches(Dataset):
    """Fixed batches of nodes to embed: warm nodes through the engagement view, cold ones (no
    engagement in the store's visible splits) through the knowledge view. Deterministic per batch index.

    Args:
        store, base: the snapshot and its spectral base.
        sampler: builds the contexts.
        nodes: (n,) global ids to embed, in batch order.
        batch_size: nodes per batch.
        seed: base of each batch's context draw.
    """

    def __init__(self, store: GraphStore, base: SpectralBase | None, sampler: ContextSampler, nodes: np.ndarray,
                 batch_size: int, seed: int) -> None:
        self.store, self.base, self.sampler, self.nodes = store, base, sampler, nodes
        self.batch_size, self.seed = batch_size, seed

    def __len__(self) -> int:
        return -(-len(self.nodes) // self.batch_size)

    def __getitem__(self, i: int) -> dict[str, Any]:
        nodes = self.nodes[i * self.batch_size:(i + 1) * self.batch_size]
        rng = np.random.default_rng([self.seed, 1 << 20, i])
        warm = self.store.warm[nodes]
        views = {"eng": self.sampler.engagement(nodes[warm], rng), "kno": self.sampler.knowledge(nodes[~warm], rng)}
        return to_tensors(self.store, self.base, views, eng_nodes=nodes[warm], kno_nodes=nodes[~warm])


def views(batch: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """A batch's (engagement, knowledge) views, each with the shared content rows (and the
    engagement view with the spectral base rows), as :meth:`hir.nn.HirNet.forward` takes them."""
    base = {k: batch[k] for k in ("base", "base_logit") if k in batch}
    return {**batch["eng"], "content": batch["content"], **base}, {**batch["kno"], "content": batch["content"]}


@torch.no_grad()
def embed_batch(net: HirNet, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
    """An :class:`EmbedBatches` batch -> (node ids (n,), embeddings (n, C)): warm nodes through
    the engagement view first, then cold ones through the knowledge view."""
    eng, kno = views(batch)
    out_nodes, out_z = [], []
    for view, nodes, use_ids in ((eng, batch["eng_nodes"], True), (kno, batch["kno_nodes"], False)):
        if len(nodes):
            out_nodes.append(nodes)
            out_z.append(net(view, use_ids=use_ids))
    if not out_nodes:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, net.dim)
    return torch.cat(out_nodes), torch.cat(out_z)


def catalogue(store: GraphStore, base: SpectralBase | None) -> np.ndarray:
    """(M,) global ids of the catalogue the user-side loss ranks: every entity of the types the
    deep-stage edges (the visible ones and the targets, ``val_pairs``) point to, as val and test
    rank them. An entity with a spectral base is ranked by it; one without (cold: no visible
    engagement, e.g. an item first sold in the target window) by its knowledge view
    (:func:`catalogue_cold`), so its targets are kept and train the content placement."""
    if base is None or len(store.deep_pairs) + len(store.val_pairs) == 0:
        return np.zeros(0, np.int64)
    types = np.unique(store.node_type[np.concatenate([store.deep_pairs[:, 1], store.val_pairs[:, 1]])])
    return np.flatnonzero(np.isin(store.node_type, types)).astype(np.int64)


def catalogue_cold(base: SpectralBase, ids: np.ndarray) -> np.ndarray:
    """(M,) bool: the catalogue entities ``ids`` without a spectral base (ranked by their knowledge view).

    A block of ``CATALOGUE_BLOCK`` rows at a time: the whole gather and its squares were two
    (M, K) copies. Whether a row's norm is 0 does not depend on how its squares are summed (a sum
    of non-negative terms is 0 exactly when each term is), so the test is the whole one's."""
    cold = np.empty(len(ids), bool)
    for b in range(0, len(ids), CATALOGUE_BLOCK):
        cold[b:b + CATALOGUE_BLOCK] = ~(np.linalg.norm(base.vectors[ids[b:b + CATALOGUE_BLOCK]], axis=1) > 0)
    return cold


def catalogue_vectors(store: GraphStore, base: SpectralBase) -> Tensor:
    """(M, K + 1) packed base embeddings of :func:`catalogue` (the entities' engagement view,
    which the transformer does not change: see :class:`hir.nn.HirNet`); the rows of cold entities
    (:func:`catalogue_cold`) are zero, a training batch fills them with the entities' knowledge view
    (:class:`hir.train.datamodule.TrainBatches`, ``cold``).

    ``HirNet.pack(normalize(base.vectors[ids]), ...)`` written into one (M, K + 1) output a block
    of ``CATALOGUE_BLOCK`` rows at a time: the whole form held the gather, its unit rows, their
    scaled copy and the output, and gathered again for the cold test, each (M, K) (2.2 GB at
    540,040 entities and rank 1024). A row's norm is reduced within the row and the rest is
    elementwise, so the rows are the whole form's, bit for bit; the scales ``a`` and slacks are
    computed over all M at once, as before.
    """
    ids = catalogue(store, base)
    k = base.vectors.shape[1]
    a, slack = HirNet.pack_scale(torch.from_numpy(base.logit[ids]),
                                 torch.from_numpy(store.node_type[ids].astype(np.int64)))  # (M,) each
    z = torch.empty((len(ids), k + 1), dtype=torch.promote_types(a.dtype, torch.from_numpy(base.vectors[:0]).dtype))
    for b in range(0, len(ids), CATALOGUE_BLOCK):
        e = min(b + CATALOGUE_BLOCK, len(ids))
        v = base.vectors[ids[b:e]]  # (B, K)
        s = torch.nn.functional.normalize(torch.from_numpy(v), dim=-1)
        torch.mul(s, a[b:e, None], out=z[b:e, :k])
        z[b:e, k] = slack[b:e]
        # the cold test on the rows already gathered (catalogue_cold's, without a second gather)
        z[b:e][torch.from_numpy(~(np.linalg.norm(v, axis=1) > 0))] = 0.0
    return z
