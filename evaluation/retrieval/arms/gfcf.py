"""GF-CF (Shen et al., CIKM 2021, "How Powerful is Graph Convolution for Recommendation?"): the
training-free graph filter, a baseline with no fit and nothing to select on val."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import scipy.sparse as sp
import torch

from hir_evaluation.retrieval.rank import Ranked, Scores, col_scaled, rank_dense, through_users
from hir_evaluation.retrieval.registry import ArmInfo, RetrievalContext

# at most this many matrix entries are decomposed densely (exact, and fast when small)
DENSE_SVD_ENTRIES = 4_000_000
# power iterations of the randomized SVD (sketch of 2k columns): 7 captured all but ~1e-12 of
# the top-k energy on a test matrix whose top singular value 1 repeats (one per small component)
POWER_ITERATIONS = 7


def inv_sqrt(degree: np.ndarray) -> np.ndarray:
    """degree^-1/2, 0 where the degree is 0 (an empty row or column stays empty)."""
    return np.divide(1.0, np.sqrt(degree), out=np.zeros_like(degree, dtype=np.float64), where=degree > 0)


def top_right_singular(x: sp.csr_matrix, rank: int, seed: int) -> np.ndarray:
    """(I, k) float64: the top k = min(rank, min(U, I) - 1) right singular vectors of ``x`` (U, I)
    (the filter uses V Vᵀ, which their signs do not change): numpy's dense SVD for a small matrix,
    else scikit-learn's seeded randomized SVD. Not ARPACK (``svds``): the normalised matrix has
    singular value 1 once per connected component of the history graph, and on rees46's many
    small components ARPACK did not converge (45,041 iterations, 18 of 32 vectors)."""
    k = min(rank, min(x.shape) - 1)
    if k < 1:
        return np.zeros((x.shape[1], 0))
    if x.shape[0] * x.shape[1] <= DENSE_SVD_ENTRIES:
        _, _, vt = np.linalg.svd(x.toarray().astype(np.float64), full_matrices=False)
        return vt[:k].T
    from sklearn.utils.extmath import randomized_svd

    _, _, vt = randomized_svd(x.astype(np.float64), n_components=k, n_oversamples=k, n_iter=POWER_ITERATIONS,
                              random_state=seed)
    return vt.T


def gfcf_scores(r: sp.csr_matrix, rank: int, ideal_weight: float, seed: int) -> Scores:
    """GF-CF's scorer over the binary history matrix ``r`` (U, I), users by id -> (n, I) scores:

        s_u = r_u R~ᵀR~  +  ideal_weight · r_u D_I^-1/2 V_k V_kᵀ D_I^1/2,   R~ = D_U^-1/2 R D_I^-1/2

    The linear filter runs through the user dimension (:func:`through_users`); the ideal
    low-pass one as (n, I) @ (I, k) @ (k, I). Entities without history are -inf.
    """
    r = sp.csr_matrix(r, dtype=np.float32)
    d_users, d_items = np.asarray(r.sum(1)).ravel(), np.asarray(r.sum(0)).ravel()
    norm = col_scaled(sp.diags(inv_sqrt(d_users).astype(np.float32)) @ r, inv_sqrt(d_items))  # R~ (U, I)
    norm_t = norm.T.tocsr()  # (I, U)
    v = top_right_singular(norm, rank, seed)  # (I, k)
    down = np.ascontiguousarray(v * inv_sqrt(d_items)[:, None], dtype=np.float32)  # D_I^-1/2 V_k (I, k)
    up = np.ascontiguousarray(v.T * np.sqrt(d_items)[None, :], dtype=np.float32)  # V_kᵀ D_I^1/2 (k, I)
    never = torch.from_numpy(d_items == 0)

    def score(users: np.ndarray) -> torch.Tensor:
        rows = r[users]  # (n, I)
        s = through_users(rows, norm_t, norm_t)  # r_u R~ᵀ R~
        s += np.float32(ideal_weight) * ((rows @ down) @ up)  # (n, k) @ (k, I)
        out = torch.from_numpy(s)
        out[:, never] = -torch.inf
        return out

    return score


@dataclass(frozen=True)
class GFCF:
    """GF-CF over the binary history matrix (``ctx.test.seen``: one per (user, entity) pair of the
    history, whatever its event count): the normalised item-item filter R~ᵀR~ plus
    ``ideal_weight`` × the ideal low-pass filter on the top ``rank`` right singular vectors of R~
    (:func:`gfcf_scores`). The paper's Gowalla setting is rank 256, ideal_weight 0.3.
    """

    rank: int
    ideal_weight: float
    info: ClassVar[ArmInfo] = ArmInfo(role="baseline")

    def topk(self, ctx: RetrievalContext, k: int) -> Ranked:
        seen = ctx.test.seen
        return rank_dense(gfcf_scores(seen, self.rank, self.ideal_weight, ctx.seed), ctx.test.users, k, seen,
                          deep=ctx.test.seen_deep)
