"""Discovery candidates for a funnel view: the nearest entities new to the user.

When the scorer is trained, the served discovery source (the published user embedding searched in
Milvus) cannot be used: the published vectors were fit on the very periods the training targets
come from. The scorer therefore sees discovery candidates of the same *kind* computed from the
training view alone: GF-CF's filter in the embedding form the spectral base serves (Shen et al.
2021; hir/model/spectral.py)::

    R~ = D_u^-1/2 R D_e^-1/2 ~ U diag(s) V^T          (rank K, randomised SVD)
    user  b_u = r_u D_e^-1/2 V diag(s^2 / s_1^2 + a)   entity  b_e = D_e^1/2 V[e]

A candidate carries its position in the user's list and its score, which the scorer reads on the
same scale at serving time (positions in the ANN result, cosine scores), so the learner is trained
on the candidates it will be served.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl
import scipy.sparse as sp
import torch
from sklearn.utils.extmath import randomized_svd

from hir.model.metrics import BLOCK, all_finite, chunk_topk


@dataclass
class ViewBase:
    """User and entity vectors of one view: ``users`` (n_users, K), ``entities`` (n_entities, K)."""

    users: np.ndarray
    entities: np.ndarray
    # whether every entity row is finite, found on the first topk: a served request ranks a user or
    # two, and checking the whole (E, K) matrix on each took 166 ms at completejourney's 92k x 256
    _finite: bool | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def fit(cls, pairs: pl.DataFrame, n_users: int, n_entities: int, rank: int = 256, ideal: float = 0.3,
            seed: int = 0) -> ViewBase:
        """Fit on ``pairs`` (``user_id, entity_id``; weight ``w`` when present, else 1)."""
        w = pairs["w"].to_numpy().astype(np.float32) if "w" in pairs.columns else np.ones(pairs.height, np.float32)
        r = sp.csr_matrix((w, (pairs["user_id"].to_numpy(), pairs["entity_id"].to_numpy())),
                          shape=(n_users, n_entities), dtype=np.float32)
        du = np.asarray(r.sum(axis=1)).ravel()
        de = np.asarray(r.sum(axis=0)).ravel()
        inv_u = np.where(du > 0, du, 1.0) ** -0.5
        inv_e = np.where(de > 0, de, 1.0) ** -0.5
        norm = sp.diags(inv_u) @ r @ sp.diags(inv_e)
        k = int(min(rank, min(norm.shape) - 1))
        _, s, vt = randomized_svd(norm, k, n_iter=4, random_state=seed)
        v = vt.T.astype(np.float32)  # (E, K)
        g = (s**2 / max(s[0] ** 2, 1e-12) + ideal).astype(np.float32)
        users = (r @ (inv_e[:, None] * v)) * g  # (U, K)
        entities = np.where(de > 0, de, 0.0)[:, None] ** 0.5 * v  # (E, K)
        return cls(np.asarray(users, np.float32), np.asarray(entities, np.float32))

    def pair_scores(self, users: np.ndarray, entities: np.ndarray, chunk: int = 131_072) -> np.ndarray:
        """(n,) scores b_u . b_e of the pairs (users[i], entities[i])."""
        out = np.empty(len(users), np.float32)
        for lo in range(0, len(users), chunk):
            u, e = users[lo:lo + chunk], entities[lo:lo + chunk]
            out[lo:lo + len(u)] = np.einsum("nk,nk->n", self.users[u], self.entities[e])
        return out

    def topk(self, users: np.ndarray, mask: sp.csr_matrix | None, k: int, chunk: int = 2048,
             block: int = 4 * BLOCK) -> tuple[np.ndarray, np.ndarray]:
        """(len(users), k) entity ids and scores, best first, with each user's row of ``mask``
        (n_users, n_entities) removed (-1 / -inf where fewer remain).

        Users are ranked ``chunk`` at a time against ``block`` entities at a time
        (:func:`hir.model.metrics.chunk_topk`: the ranking of the whole (chunk, n_entities) score
        block, ties included, without it), so memory is (chunk, >= block) scores, not
        (chunk, n_entities): 24 GB at 2048 x 3M entities. ``block`` 4 x BLOCK (256 MiB at chunk
        2048): each block keeps its top k + 1, and at the funnel's k of 100 that partial sort
        costs more the more blocks there are (1,024 x 150,000 x 128, k 100: the whole block
        1.3-1.7 s, blocks of 8,192 2.2-3.3 s, of 32,768 1.3-1.8 s)."""
        ent = torch.from_numpy(self.entities)
        kk = min(k, ent.shape[0])
        ids = np.full((len(users), k), -1, np.int64)
        vals = np.full((len(users), k), -np.inf, np.float32)
        if self._finite is None:  # the entities do not change after the fit
            self._finite = all_finite(ent, block)
        finite = self._finite
        for lo in range(0, len(users), chunk):
            batch = users[lo:lo + chunk]
            masked: list = [()] * len(batch)
            if mask is not None:
                m = mask[batch].tocsr()
                masked = [m.indices[m.indptr[i]:m.indptr[i + 1]] for i in range(len(batch))]
            v, i = chunk_topk(torch.from_numpy(self.users[batch]), ent, masked, kk, block, finite)  # (B, kk) each
            ids[lo:lo + len(batch), :kk] = i.numpy()
            vals[lo:lo + len(batch), :kk] = v.numpy()
        ids[~np.isfinite(vals)] = -1
        return ids, vals
