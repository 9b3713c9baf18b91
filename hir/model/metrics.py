"""Pure metric functions: masked recall@k by inner product, prototype usage, the paired-noise rule (:func:`beats`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import numpy as np
import torch
from torch import Tensor


def top_k_rows(user_vecs: np.ndarray, cand_vecs: np.ndarray, masked: list[np.ndarray], k: int,
               chunk: int = 1024) -> np.ndarray:
    """(U, k') int64: each user's top-``k`` candidate rows by inner product, best first, its
    ``masked`` rows removed (k' = min(k, M)). user_vecs (U, d), cand_vecs (M, d)."""
    cand = torch.from_numpy(np.ascontiguousarray(cand_vecs, np.float32))
    kk = min(int(k), cand.shape[0])
    out = np.zeros((len(user_vecs), kk), np.int64)
    for lo in range(0, len(user_vecs), chunk):
        scores = torch.from_numpy(np.ascontiguousarray(user_vecs[lo:lo + chunk], np.float32)) @ cand.T
        for i, m in enumerate(masked[lo:lo + chunk]):
            if len(m):
                scores[i, torch.from_numpy(np.asarray(m, np.int64))] = -torch.inf
        out[lo:lo + chunk] = scores.topk(kk, dim=1).indices.numpy()
    return out


def recall_of_top(top: np.ndarray, positives: list[np.ndarray], k: int) -> np.ndarray:
    """(U,) float64 recall@k of ranked lists ``top`` (U, >= k) (:func:`top_k_rows`), NaN for a
    user without positives: one ranking serves every k up to its width and every positive set."""
    out = np.full(len(top), np.nan)
    for i, (row, pos) in enumerate(zip(top[:, :k], positives)):
        if len(pos):
            out[i] = np.isin(row, pos).sum() / len(pos)
    return out


def recall_per_user(user_vecs: np.ndarray, cand_vecs: np.ndarray, positives: list[np.ndarray],
                    masked: list[np.ndarray], k: int = 20, chunk: int = 1024) -> np.ndarray:
    """Recall@k of each user over candidates by inner product, its ``masked`` candidate rows
    removed from its ranking: (U,) float64, NaN for a user without positives. user_vecs (U, d),
    cand_vecs (M, d); positives/masked: per user, candidate row indices. Paired comparisons
    (two embeddings of the same users) take the difference of two of these."""
    return recall_of_top(top_k_rows(user_vecs, cand_vecs, masked, k, chunk), positives, k)


def top_k_variants(user_vecs: np.ndarray, cand_vecs: np.ndarray, masked: list[np.ndarray], k: int,
                   rows: np.ndarray, variants: Iterable[np.ndarray], chunk: int = 1024) -> Iterator[np.ndarray]:
    """:func:`top_k_rows` for versions of the candidates that differ only in ``rows``: yields, per
    (R, d) array of ``variants`` (new vectors of candidate rows ``rows`` (R,)), the (U, k') top
    rows of ``cand_vecs`` with those rows replaced. The other rows' top-k is computed once and
    merged with the variant rows' scores, so each variant costs U x R, not U x M (export's cold
    placement scores 8 boosts of ~20k cold rows against ~90k candidates). The ranking is the
    same as :func:`top_k_rows` on the replaced matrix up to the order of exactly tied scores."""
    rows = np.asarray(rows, np.int64)
    n = len(cand_vecs)
    fixed = np.ones(n, bool)
    fixed[rows] = False
    fixed_ids = np.flatnonzero(fixed)
    # per user: its masked rows among the fixed ones (in the fixed frame) and among the variant rows
    pos_fixed = np.full(n, -1, np.int64)
    pos_fixed[fixed_ids] = np.arange(len(fixed_ids))
    pos_var = np.full(n, -1, np.int64)
    pos_var[rows] = np.arange(len(rows))
    m_fixed = [pos_fixed[np.asarray(m, np.int64)] for m in masked]
    m_var = [pos_var[np.asarray(m, np.int64)] for m in masked]
    m_fixed = [m[m >= 0] for m in m_fixed]
    m_var = [m[m >= 0] for m in m_var]
    kk = min(int(k), n)
    cand = torch.from_numpy(np.ascontiguousarray(cand_vecs[fixed_ids], np.float32))
    users = np.ascontiguousarray(user_vecs, np.float32)
    head_val, head_idx = [], []
    for lo in range(0, len(users), chunk):
        scores = torch.from_numpy(users[lo:lo + chunk]) @ cand.T
        for i, m in enumerate(m_fixed[lo:lo + chunk]):
            if len(m):
                scores[i, torch.from_numpy(m)] = -torch.inf
        t = scores.topk(min(kk, scores.shape[1]), dim=1)
        head_val.append(t.values)
        head_idx.append(torch.from_numpy(fixed_ids)[t.indices])
    for var in variants:
        vc = torch.from_numpy(np.ascontiguousarray(var, np.float32))
        out = np.zeros((len(users), kk), np.int64)
        for c, lo in enumerate(range(0, len(users), chunk)):
            scores = torch.from_numpy(users[lo:lo + chunk]) @ vc.T
            for i, m in enumerate(m_var[lo:lo + chunk]):
                if len(m):
                    scores[i, torch.from_numpy(m)] = -torch.inf
            both = torch.cat([head_val[c], scores], dim=1)
            ids = torch.cat([head_idx[c], torch.from_numpy(rows).expand(scores.shape[0], -1)], dim=1)
            out[lo:lo + chunk] = torch.gather(ids, 1, both.topk(kk, dim=1).indices).numpy()
        yield out


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


def beats(new: np.ndarray, old: np.ndarray, z: float, min_gain: float) -> bool:
    """Whether per-user metric ``new`` beats ``old`` (both (U,), the same users) beyond the paired
    noise: the mean paired difference is more than ``z`` standard errors above 0, and the relative
    gain is above ``min_gain``."""
    ok = ~(np.isnan(new) | np.isnan(old))
    d = new[ok] - old[ok]
    if len(d) < 2:
        return False
    se = float(d.std(ddof=1)) / np.sqrt(len(d))
    base = float(old[ok].mean())
    return float(d.mean()) > z * se and (base <= 0 or float(d.mean()) > min_gain * base)
