"""Pure metric functions: masked recall@k by inner product, prototype usage."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor


def masked_recall(user_vecs: np.ndarray, cand_vecs: np.ndarray, positives: list[np.ndarray],
                  masked: list[np.ndarray], k: int = 20, chunk: int = 1024) -> float:
    """Mean recall@k of users over candidates by inner product, each user's ``masked`` candidate
    rows removed from its ranking. user_vecs (U, d), cand_vecs (M, d); positives/masked: per
    user, candidate row indices (users without positives are skipped)."""
    cand = torch.from_numpy(np.ascontiguousarray(cand_vecs, np.float32))
    total, n = 0.0, 0
    for lo in range(0, len(user_vecs), chunk):
        scores = torch.from_numpy(np.ascontiguousarray(user_vecs[lo:lo + chunk], np.float32)) @ cand.T
        for i, m in enumerate(masked[lo:lo + chunk]):
            if len(m):
                scores[i, torch.from_numpy(np.asarray(m, np.int64))] = -torch.inf
        top = scores.topk(min(k, cand.shape[0]), dim=1).indices.numpy()
        for row, pos in zip(top, positives[lo:lo + chunk]):
            if len(pos):
                total += np.isin(row, pos).sum() / len(pos)
                n += 1
    return total / max(n, 1)


def usage_stats(top1: Tensor, n_protos: int) -> tuple[float, float]:
    """(share of prototypes that are some entity's top-1 token, entropy of the top-1 histogram
    normalised by log K). top1: (B,) int64 ids in [0, n_protos)."""
    counts = torch.bincount(top1, minlength=n_protos).double()
    p = counts / counts.sum().clamp_min(1)
    h = -(p[p > 0] * p[p > 0].log()).sum().item()
    return float((counts > 0).double().mean()), h / math.log(n_protos)
