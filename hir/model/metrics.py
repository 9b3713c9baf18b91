"""Pure metric functions: masked recall@k by inner product, prototype usage, the paired-noise rule (:func:`beats`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import numpy as np
import torch
from torch import Tensor

# Candidates a user chunk is scored against at once (top_k_rows): a (chunk, >= BLOCK) float32
# block, 32 to 64 MiB at chunk 1024, where the whole (chunk, M) score matrix was 1.2 GB at 10M
# events (300,000 candidates) and grows with the catalogue.
BLOCK = 8192
# A chunk of fewer users is scored against every candidate at once, as before the blocks: with
# 2 threads, MKL's sgemm sums a product of 4 to 15 rows in another order when its columns are cut
# (measured: d >= 100, torch 2.13, MKL 2024.2), where 16 rows and more give the same bits in
# blocks of >= BLOCK columns as in one product. Such a chunk is at most (15, M).
SMALL_CHUNK = 16
ROW_BLOCK = 16384  # rows per block of row_norms


def row_norms(x: np.ndarray) -> np.ndarray:
    """(n,) the Euclidean norms of the rows of ``x`` (n, K), a block of rows at a time:
    ``np.linalg.norm(x, axis=1)`` squares its whole input first (an (n, K) copy). Each row's norm
    is the same computation on the same row, so the values are bit-identical to it."""
    if not len(x):
        return np.zeros(0, x.dtype)
    return np.concatenate([np.linalg.norm(x[b:b + ROW_BLOCK], axis=1) for b in range(0, len(x), ROW_BLOCK)])


def column_blocks(m: int, block: int) -> list[tuple[int, int]]:
    """[lo, hi) blocks of ``block`` columns covering ``m``, the remainder joined to the last block,
    so every block is at least ``block`` wide (one block when ``m < 2 * block``): a narrow product
    is where sgemm changes its summation order."""
    bounds = [(lo, lo + block) for lo in range(0, m - 2 * block + 1, block)]
    return [*bounds, (bounds[-1][1] if bounds else 0, m)]


def all_finite(cand: Tensor, block: int = BLOCK) -> bool:
    """Whether every entry of ``cand`` (M, d) is finite, a block of rows at a time (not an (M, d)
    bool copy: 0.3 GB at 300,000 x 1024)."""
    return all(bool(torch.isfinite(cand[lo:lo + block]).all()) for lo in range(0, cand.shape[0], block))


def _mask(scores: Tensor, rows: np.ndarray, cols: np.ndarray) -> None:
    """Set ``scores[rows, cols]`` to -inf in place (the masked rows of a block)."""
    if len(rows):
        scores[torch.from_numpy(rows), torch.from_numpy(cols)] = -torch.inf


def _masked_pairs(masked: list[np.ndarray], m: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-user masked candidate rows -> (row in the chunk, candidate) pairs, sorted by candidate
    (a block's pairs are then one slice); negative rows count from the end, as in indexing."""
    lens = [len(x) for x in masked]
    if not sum(lens):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    rows = np.repeat(np.arange(len(masked), dtype=np.int64), lens)
    cols = np.concatenate([np.asarray(x, np.int64) for x in masked if len(x)])
    # as indexing the whole score matrix did: a row outside the candidates is an error, never dropped
    if len(cols) and (cols.min() < -m or cols.max() >= m):
        bad = int(cols[(cols < -m) | (cols >= m)][0])
        raise IndexError(f"masked candidate row {bad} is outside the {m} candidates: the masks must index the "
                         "candidate rows they were built for")
    cols = np.where(cols < 0, cols + m, cols)
    order = np.argsort(cols, kind="stable")
    return rows[order], cols[order]


def chunk_topk(users: Tensor, cand: Tensor, masked: list[np.ndarray], kk: int, block: int = BLOCK,
               finite: bool | None = None) -> tuple[Tensor, Tensor]:
    """``(users @ cand.T, masked rows set to -inf).topk(kk, dim=1)``, bit for bit (values and
    indices, ties included), without the (c, M) score matrix. users (c, d), cand (M, d) float32;
    ``masked``: per user (c of them), candidate rows; 0 <= kk <= M; ``finite``: whether every
    entry of ``cand`` is finite (None: checked when needed). Returns (c, kk) values and (c, kk)
    int64 indices.

    Each block of >= ``block`` candidate columns (:func:`column_blocks`) keeps its own top
    ``kk + 1``; the top ``kk + 1`` of those is then the row's, as a multiset of values (exact
    floats, whatever the order of ties). Where those ``kk + 1`` values are all distinct and not
    NaN, the top ``kk`` and their order are unique, so torch's ranking of the whole row is this
    one. Elsewhere (ties inside the top ``kk`` or across its edge, NaN, masked rows reached) the
    order depends on how torch's partial sort visits the whole row, so that user's whole row is
    rebuilt with the same bits, a few users at a time, and ranked by torch as before: from the
    product of those users alone, checked against the first pass, or from the chunk's own block
    products (:func:`_rebuilt_rows`; the first costs those users' share of a pass, the second a
    whole pass a few users: with a tie in every row, as among completejourney's warm texts, 4,141
    distinct of 69,836, 10 passes a chunk). A user vector of zeros scores 0 everywhere (with
    finite candidates): its row is rebuilt without a product. Chunks of fewer than
    :data:`SMALL_CHUNK` users, and fewer than ``2 * block`` candidates, are one product as before."""
    c, m = users.shape[0], cand.shape[0]
    rows, cols = _masked_pairs(masked, m)
    if c < SMALL_CHUNK or m < 2 * block:
        scores = users @ cand.T  # (c, M)
        _mask(scores, rows, cols)
        t = scores.topk(kk, dim=1)
        return t.values, t.indices
    blocks = column_blocks(m, block)
    starts = np.searchsorted(cols, [lo for lo, _ in blocks] + [m])
    width = kk + 1 if kk < m else kk  # one more than kk shows a tie across the edge
    vals, idx = [], []
    for (lo, hi), a, b in zip(blocks, starts[:-1], starts[1:]):
        scores = users @ cand[lo:hi].T  # (c, hi - lo)
        _mask(scores, rows[a:b], cols[a:b] - lo)
        t = scores.topk(min(width, hi - lo), dim=1)
        vals.append(t.values)
        idx.append(t.indices + lo)
        del scores
    t = torch.cat(vals, 1).topk(width, dim=1)  # (c, width): the row's top values, ties in any order
    values, indices = t.values, torch.gather(torch.cat(idx, 1), 1, t.indices)
    unsure = ((values[:, 1:] == values[:, :-1]).any(1) | values.isnan().any(1)).numpy()
    values, indices = values[:, :kk].contiguous(), indices[:, :kk].contiguous()
    if not unsure.any():
        return values, indices
    zero = unsure & ~users.any(1).numpy()
    if zero.any() and not (finite if finite is not None else all_finite(cand, block)):
        zero[:] = False  # 0 x inf is NaN: those rows are not all zeros
    for i in np.flatnonzero(zero):
        # 0 or -0 against every finite candidate: ranked the same as a row of zeros
        row = torch.zeros(1, m)
        _mask(row, np.zeros(np.sum(rows == i), np.int64), cols[rows == i])
        t = row.topk(kk, dim=1)
        values[i], indices[i] = t.values[0], t.indices[0]
    redo = np.flatnonzero(unsure & ~zero)
    group = max(1, users.shape[0] * block // m)  # (group, M) rebuilt rows: no more than one block
    for g in range(0, len(redo), group):
        pick = redo[g:g + group]
        sel = torch.from_numpy(pick)
        inside = np.isin(rows, pick)
        at, masked_cols = np.searchsorted(pick, rows[inside]), cols[inside]
        full = _rebuilt_rows(users, cand, blocks, pick, subset=True)
        _mask(full, at, masked_cols)
        t = full.topk(kk, dim=1)
        if not torch.equal(t.values.view(torch.int32), values[sel].view(torch.int32)):
            # the rows' own product summed in another order than the chunk's: the chunk's products
            full = _rebuilt_rows(users, cand, blocks, pick, subset=False)
            _mask(full, at, masked_cols)
            t = full.topk(kk, dim=1)
        values[sel], indices[sel] = t.values, t.indices
    return values, indices


def _rebuilt_rows(users: Tensor, cand: Tensor, blocks: list[tuple[int, int]], pick: np.ndarray,
                  subset: bool) -> Tensor:
    """(len(pick), M) the score rows ``pick`` of ``users @ cand.T``, in the first pass's column
    ``blocks``. ``subset``: from the product of those rows alone (at least :data:`SMALL_CHUNK`,
    padded with other rows of the chunk), which costs len(pick) / c of a pass and gives the
    chunk's bits (measured as SMALL_CHUNK's rule: subsets of 16 to 1,000 rows of chunks of 64 to
    2,048, d 3 to 512, 256 to 12,000 columns; 1 to 15 rows do not); chunk_topk checks the rows'
    top values against the first pass's and takes ``subset=False`` where they differ: the
    chunk's own products (the first pass's shapes), a whole pass each."""
    full = torch.empty(len(pick), cand.shape[0])
    if subset:
        pad = np.setdiff1d(np.arange(users.shape[0]), pick)[:max(0, SMALL_CHUNK - len(pick))]
        part = users[torch.from_numpy(np.concatenate([pick, pad]))]  # (>= SMALL_CHUNK, d)
        for lo, hi in blocks:
            full[:, lo:hi] = (part @ cand[lo:hi].T)[:len(pick)]
    else:
        sel = torch.from_numpy(pick)
        for lo, hi in blocks:
            full[:, lo:hi] = (users @ cand[lo:hi].T)[sel]  # the first pass's products, same shapes
    return full


def top_k_rows(user_vecs: np.ndarray, cand_vecs: np.ndarray, masked: list[np.ndarray], k: int,
               chunk: int = 1024, block: int = BLOCK) -> np.ndarray:
    """(U, k') int64: each user's top-``k`` candidate rows by inner product, best first, its
    ``masked`` rows removed (k' = min(k, M)). user_vecs (U, d), cand_vecs (M, d). Users are ranked
    ``chunk`` at a time against ``block`` candidates at a time (:func:`chunk_topk`: the ranking
    of the whole (chunk, M) score matrix, ties included, without it)."""
    cand = torch.from_numpy(np.ascontiguousarray(cand_vecs, np.float32))
    kk = min(int(k), cand.shape[0])
    out = np.zeros((len(user_vecs), kk), np.int64)
    finite = all_finite(cand, block)
    for lo in range(0, len(user_vecs), chunk):
        users = torch.from_numpy(np.ascontiguousarray(user_vecs[lo:lo + chunk], np.float32))
        out[lo:lo + chunk] = chunk_topk(users, cand, masked[lo:lo + chunk], kk, block, finite)[1].numpy()
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
                   rows: np.ndarray, variants: Iterable[np.ndarray], chunk: int = 1024,
                   block: int = BLOCK) -> Iterator[np.ndarray]:
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
    finite = all_finite(cand, block)
    for lo in range(0, len(users), chunk):
        # the fixed rows' top-k in candidate blocks, as the whole (chunk, M - R) scores rank it
        values, indices = chunk_topk(torch.from_numpy(users[lo:lo + chunk]), cand, m_fixed[lo:lo + chunk],
                                     min(kk, cand.shape[0]), block, finite)
        head_val.append(values)
        head_idx.append(torch.from_numpy(fixed_ids)[indices])
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
