"""The users the spectral basis is fit on: a seeded sample stratified by activity (issue 35).

The basis (``V``, ``s``, the filter) only needs the entity-side structure of the engagement
matrix, ``R~^T R~``; a sample of its rows estimates it, and every user is then folded in from
its own row (:mod:`hir.model.foldin`), so the fit's working set is ``sample x (rank +
oversampling)`` instead of ``users x (rank + oversampling)``.

Users are grouped into strata by activity (``floor(log2(pairs))``: 1, 2-3, 4-7, ... visible
pairs) and each stratum gives the same share of its users (proportional allocation, at least one
user each), so heavy users are represented as often as they occur, neither more nor less.
Each sampled row is weighted by ``sqrt(n_s / k_s)`` (Horvitz-Thompson: stratum size over users
drawn from it), which makes ``R~_S^T W^2 R~_S`` an unbiased estimate of ``R~^T R~``: the
singular values stay on the full matrix's scale, so the filter ``g(s)`` means the same thing.

A sample alone costs quality: an entity's row of ``V`` is seen only through its sampled users,
and a long-tail entity has few (fit on half of gowalla's users, test recall@20 fell 13%,
benchmarks/results/scale.json). :func:`refine_on_all` then takes the sample's subspace as the
start of a subspace iteration on every user (streamed in row blocks: the item Gram ``R~^T R~``
times an ``E x K`` matrix needs no user-side matrix), so each entity's row and the singular
values come from all of the data; the sample only chooses where the iteration starts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
import scipy.sparse as sp

from hir.errors import HirError


def resolve_cap(cap: int | float | None, n_active: int) -> int:
    """Users to fit on out of ``n_active`` (users with visible engagement).

    cap: None = all; a float in (0, 1] = that fraction (rounded up); an int >= 1 = that count.
    The result is at most ``n_active``.
    """
    if cap is None:
        return n_active
    if isinstance(cap, bool) or not isinstance(cap, int | float):
        raise HirError(f"spectral.sample_users={cap!r}; expected null, a fraction in (0, 1] or a count >= 1")
    if isinstance(cap, float) and cap <= 1.0:
        if cap <= 0.0:
            raise HirError(f"spectral.sample_users={cap!r}: a fraction must be in (0, 1]; a count must be an int >= 1")
        return min(n_active, max(1, math.ceil(cap * n_active)))
    if cap < 1 or cap != int(cap):
        raise HirError(f"spectral.sample_users={cap!r}: above 1 it is a count of users and must be a whole number >= 1")
    return min(n_active, int(cap))


def activity_strata(activity: np.ndarray) -> np.ndarray:
    """(n,) int stratum of each user: ``floor(log2(activity))`` (-1 for a user without activity)."""
    a = np.asarray(activity, np.float64)
    out = np.full(len(a), -1, np.int64)
    pos = a > 0
    out[pos] = np.floor(np.log2(a[pos])).astype(np.int64)
    return out


def stratified_users(activity: np.ndarray, cap: int | float | None, seed: int) -> tuple[np.ndarray, np.ndarray] | None:
    """A seeded sample of the users with activity, stratified by :func:`activity_strata`.

    Args:
        activity: (n_users,) visible pairs (or events) per user; users with 0 are never drawn.
        cap: :func:`resolve_cap`'s ``cap``.
        seed: the sample's seed (the same seed and activity give the same sample).

    Returns:
        None when the cap covers every user with activity (the full fit), else ``(rows, weight)``:
        (k,) int64 sorted user rows and (k,) float64 their weight ``sqrt(n_s / k_s)``.
    """
    strata = activity_strata(activity)
    active = np.flatnonzero(strata >= 0)
    k = resolve_cap(cap, len(active))
    if k >= len(active):
        return None
    rng = np.random.default_rng([int(seed), 35])
    levels, sizes = np.unique(strata[active], return_counts=True)
    # proportional allocation, at least one user per stratum (a stratum is never left out)
    take = np.maximum(1, np.round(k * sizes / len(active)).astype(np.int64))
    take = np.minimum(take, sizes)
    rows, weight = [], []
    for level, size, t in zip(levels, sizes, take):
        members = active[strata[active] == level]
        rows.append(rng.choice(members, int(t), replace=False))
        weight.append(np.full(int(t), math.sqrt(size / t)))
    r, w = np.concatenate(rows), np.concatenate(weight)
    order = np.argsort(r)
    return r[order].astype(np.int64), w[order]


def gram_times(blocks: Iterable[sp.csr_matrix], x: np.ndarray) -> np.ndarray:
    """``R~^T R~ x`` streamed over row blocks of ``R~`` (each (b, E)): x (E, k) -> (E, k) float64.
    Memory is ``E x k`` plus one block's ``b x k``; no user-side matrix is ever whole."""
    out = np.zeros(x.shape, np.float64)
    for block in blocks:
        out += block.T @ (block @ x)
    return out


def refine_on_all(blocks: Callable[[], Iterable[sp.csr_matrix]], v: np.ndarray,
                  passes: int) -> tuple[np.ndarray, np.ndarray]:
    """The sample's right singular vectors ``v`` (E, K) refined on every user: ``passes - 1``
    subspace-iteration steps of the item Gram ``R~^T R~`` (an entity's row is then computed from
    all of its users, not the sample's: the long tail is what a sample of users misses), then
    Rayleigh-Ritz, whose eigenpairs give ``V`` and ``s^2`` of the full matrix within the subspace.

    Args:
        blocks: returns a fresh iterable of (b, E) CSR row blocks of the normalised matrix, every
            user once (called once per pass).
        v: (E, K) the sample's right singular vectors.
        passes: full-data passes (>= 1).

    Returns:
        (v (E, K) float64 orthonormal, s (K,) float64 descending).
    """
    if passes < 1:
        raise ValueError(f"passes={passes}; refining needs at least one full-data pass")
    q = np.asarray(v, np.float64)
    for _ in range(passes - 1):
        q, _ = np.linalg.qr(gram_times(blocks(), q))
    m = q.T @ gram_times(blocks(), q)
    w, rot = np.linalg.eigh((m + m.T) / 2)
    order = np.argsort(w)[::-1]
    return q @ rot[:, order], np.sqrt(np.clip(w[order], 0.0, None))
