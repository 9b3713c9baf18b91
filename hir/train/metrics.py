"""Pure metric functions over tensors (validation recall, prototype usage)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor


def recall_at_k(users: Tensor, candidates: Tensor, positives: list[np.ndarray], ks: tuple[int, ...],
                chunk: int = 512) -> dict[int, float]:
    """Mean over users of |top-K ∩ positives| / |positives|, ranking candidates by dot product.

    Args:
        users: (U, C) user embeddings.
        candidates: (M, C) candidate embeddings.
        positives: per user, the candidate row indices of its held-out positives (non-empty).
        ks: cut-offs.
        chunk: users scored at a time (memory: chunk x M scores).
    """
    kmax = min(max(ks), candidates.shape[0])
    hits = {k: 0.0 for k in ks}
    for lo in range(0, users.shape[0], chunk):
        top = (users[lo:lo + chunk] @ candidates.T).topk(kmax, dim=-1).indices.cpu().numpy()  # (u, kmax)
        for row, pos in zip(top, positives[lo:lo + chunk]):
            hit = np.isin(row, pos)
            for k in ks:
                hits[k] += hit[:k].sum() / len(pos)
    n = max(users.shape[0], 1)
    return {k: hits[k] / n for k in ks}


def usage_stats(top1: Tensor, n_protos: int) -> tuple[float, float]:
    """(share of prototypes that are some entity's top-1 token, entropy of the top-1 histogram
    normalised by log K). top1: (B,) int64 ids in [0, n_protos)."""
    counts = torch.bincount(top1, minlength=n_protos).double()
    p = counts / counts.sum().clamp_min(1)
    h = -(p[p > 0] * p[p > 0].log()).sum().item()
    return float((counts > 0).double().mean()), h / math.log(n_protos)
