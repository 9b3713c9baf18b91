"""Pure metric functions: masked recall@k by inner product, prototype usage."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor


def recall_per_user(user_vecs: np.ndarray, cand_vecs: np.ndarray, positives: list[np.ndarray],
                    masked: list[np.ndarray], k: int = 20, chunk: int = 1024) -> np.ndarray:
    """Recall@k of each user over candidates by inner product, its ``masked`` candidate rows
    removed from its ranking: (U,) float64, NaN for a user without positives. user_vecs (U, d),
    cand_vecs (M, d); positives/masked: per user, candidate row indices. Paired comparisons
    (two embeddings of the same users) take the difference of two of these."""
    cand = torch.from_numpy(np.ascontiguousarray(cand_vecs, np.float32))
    out = np.full(len(user_vecs), np.nan)
    for lo in range(0, len(user_vecs), chunk):
        scores = torch.from_numpy(np.ascontiguousarray(user_vecs[lo:lo + chunk], np.float32)) @ cand.T
        for i, m in enumerate(masked[lo:lo + chunk]):
            if len(m):
                scores[i, torch.from_numpy(np.asarray(m, np.int64))] = -torch.inf
        top = scores.topk(min(k, cand.shape[0]), dim=1).indices.numpy()
        for i, (row, pos) in enumerate(zip(top, positives[lo:lo + chunk])):
            if len(pos):
                out[lo + i] = np.isin(row, pos).sum() / len(pos)
    return out


def masked_recall(user_vecs: np.ndarray, cand_vecs: np.ndarray, positives: list[np.ndarray],
                  masked: list[np.ndarray], k: int = 20, chunk: int = 1024) -> float:
    """Mean recall@k of users over candidates (:func:`recall_per_user`; users without positives
    are skipped)."""
    r = recall_per_user(user_vecs, cand_vecs, positives, masked, k, chunk)
    r = r[~np.isnan(r)]
    return float(r.mean()) if len(r) else 0.0


def paired_gain(new: np.ndarray, old: np.ndarray, n_boot: int = 1000, seed: int = 0) -> dict[str, float]:
    """Paired bootstrap over users of ``mean(new) - mean(old)`` (two (U,) per-user metrics of the
    same users; NaN rows skipped): ``gain`` (relative to mean(old)), ``lo``/``hi`` its 95% interval."""
    ok = ~(np.isnan(new) | np.isnan(old))
    d, base = new[ok] - old[ok], float(old[ok].mean()) if ok.any() else 0.0
    if not len(d) or base <= 0:
        return {"gain": 0.0, "lo": 0.0, "hi": 0.0}
    rng = np.random.default_rng(seed)
    # in chunks of 50 resamples: (50, U) indices at a time, not (n_boot, U)
    boot = np.concatenate([d[rng.integers(0, len(d), (min(50, n_boot - i), len(d)))].mean(axis=1)
                           for i in range(0, n_boot, 50)])
    return {"gain": float(d.mean() / base), "lo": float(np.quantile(boot, 0.025) / base),
            "hi": float(np.quantile(boot, 0.975) / base)}


def usage_stats(top1: Tensor, n_protos: int) -> tuple[float, float]:
    """(share of prototypes that are some entity's top-1 token, entropy of the top-1 histogram
    normalised by log K). top1: (B,) int64 ids in [0, n_protos)."""
    counts = torch.bincount(top1, minlength=n_protos).double()
    p = counts / counts.sum().clamp_min(1)
    h = -(p[p > 0] * p[p > 0].log()).sum().item()
    return float((counts > 0).double().mean()), h / math.log(n_protos)
