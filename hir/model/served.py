"""The served dimension's basis, and its choice on val (``export.dim=auto``).

The exported embedding keeps K free inside and serves d of its directions (hir/export/project.py
has the projection and why these directions): ``P`` (K, d) the top-d eigenvectors of the sum of
the users' and the entities' second moments, each normalised to unit trace.

Which d. A served vector costs storage, feature-store and ANN memory, and every ranker's input
width in proportion to d, so the smallest d that ranks as well as the full rank is the product's
choice. `hir train` makes it on the val split, beside the base's own choices
(:func:`choose_served_dim`, called by :func:`hir.model.spectral.fit_base`): every candidate d
below the rank is scored by the val recall@20 of the base projected onto its d directions,
ranked as export serves it (users ``s_u``, entities ``x_e = a_e s_e`` with ``a_e`` the base's
scale), against the unprojected base on the same users, on two protocols: new-to-user (each
user's history masked, the headline) and the full ranking (every val engagement relevant, repeats
included, nothing masked); the smallest d that the full rank beats on neither beyond the paired
noise (:func:`hir.model.metrics.beats`) is taken, and the largest candidate (the cap) when the
full rank beats them all. A rank at or below every candidate serves the full rank.

Why both protocols: scored on new-to-user recall alone, 128 served directions were chosen on
beibei in every seed and raised its test new-to-user recall by 2.1% [0.5, 3.7], while its full
ranking (the items a user carts and then buys) lost 10% in the same cells: the directions the
projection drops are those that tell a user's own items apart.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from hir.model.metrics import beats, recall_per_user, row_norms
from hir.model.valset import ValSet

log = logging.getLogger(__name__)


class Rows:
    """``x[rows, :k]`` (m, k) without its copy: what :func:`second_moment` reads, a chunk of rows
    at a time (each chunk a C-contiguous copy, as a slice of the whole copy would be). With
    ``factor`` (n,), the rows of ``x * factor[:, None]``: each entry the same product as in that
    whole (n, K) array, so the same bits."""

    def __init__(self, x: np.ndarray, rows: np.ndarray, k: int, factor: np.ndarray | None = None) -> None:
        self.x, self.rows, self.k, self.factor = x, np.asarray(rows, np.int64), int(k), factor

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.rows), self.k

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, sl: slice | np.ndarray) -> np.ndarray:
        rows = self.rows[sl]
        if self.factor is None:
            return np.ascontiguousarray(self.x[rows, :self.k])
        return self.x[rows, :self.k] * self.factor[rows, None]


def second_moment(x: np.ndarray | Rows, chunk: int = 65536) -> np.ndarray:
    """(n, K) rows -> (K, K) float64 ``x^T x / n``, in chunks (a (chunk, K) float64 copy at a time)."""
    out = np.zeros((x.shape[1], x.shape[1]), np.float64)
    for lo in range(0, len(x), chunk):
        part = np.asarray(x[lo:lo + chunk], np.float64)
        out += part.T @ part
    return out / max(len(x), 1)


def leading_directions(users: np.ndarray | Rows, entities: np.ndarray | Rows) -> tuple[np.ndarray, list[np.ndarray | None]]:
    """(K, K) float64 eigenvectors of the trace-normalised ``C_u + C_e``, leading first, each
    column's largest-magnitude component positive (the same inputs give the same directions), and
    the two raw moments (None for an empty group). ``users`` (U, K), ``entities`` (E, K)."""
    raw = [second_moment(g) if len(g) else None for g in (users, entities)]
    moments = [m / tr for m in raw if m is not None and (tr := float(np.trace(m))) > 0]
    if not moments:
        raise ValueError("no user or entity row has a non-zero vector; nothing to project")
    _, vecs = np.linalg.eigh(sum(moments))  # eigenvalues ascending
    p = vecs[:, ::-1]
    sign = np.sign(p[np.abs(p).argmax(axis=0), np.arange(p.shape[1])])
    return p * np.where(sign == 0, 1.0, sign), raw


def fit_basis(users: np.ndarray | Rows, entities: np.ndarray | Rows, d: int) -> tuple[np.ndarray, dict[str, float]]:
    """The served basis: top-d eigenvectors of the trace-normalised second moments.

    Args:
        users: (U, K) user directions ``s_u`` (the embedding without its last coordinate).
        entities: (E, K) entity vectors ``x_e = a s_e``.
        d: served directions, 1 <= d <= K.

    Returns:
        P (K, d) float32, orthonormal columns, leading first, each column's largest-magnitude
        component positive (the same inputs give the same P); and the share of each group's
        second moment P keeps (``captured_user``, ``captured_entity``, in [0, 1]).
    """
    k = users.shape[1] if len(users) else entities.shape[1]
    if not 1 <= d <= k:
        raise ValueError(f"served directions d={d} must be in [1, {k}] (the spectral rank)")
    vecs, raw = leading_directions(users, entities)
    p = vecs[:, :d]
    kept = {name: float(np.trace(p.T @ m @ p) / max(float(np.trace(m)), 1e-30))
            for name, m in zip(("captured_user", "captured_entity"), raw, strict=True) if m is not None}
    return p.astype(np.float32), kept


def below(rank: int, dims: list[int]) -> list[int]:
    """The candidate served dimensions below ``rank``, ascending."""
    return sorted({int(d) for d in dims if 0 < int(d) < rank})


def cap(rank: int, dims: list[int]) -> int:
    """The served dimension without a choice (no val): the largest candidate below ``rank``, or 0
    (the full rank) when none is."""
    return max(below(rank, dims), default=0)


def choose_served_dim(vectors: np.ndarray, scale: np.ndarray, is_user: np.ndarray, val: ValSet,
                      dims: list[int], z: float, min_gain: float,
                      full_ranking: ValSet | None = None) -> tuple[int, dict[str, Any]]:
    """The served dimension chosen on val (module doc).

    Args:
        vectors: (n, K) the base of every node (zero rows: none).
        scale: (n,) each entity's served norm ``a_e`` in (0, 1) (the base's scale).
        is_user: (n,) bool, the user rows.
        val: the val users, their candidates, positives and masked rows (new-to-user).
        dims: the candidate served dimensions (the largest is the cap).
        z, min_gain: the paired-noise rule (:func:`hir.model.metrics.beats`).
        full_ranking: the val set of the full ranking (protocol ``all``: repeats relevant, nothing
            masked), which a candidate must not lose either; None: ``val`` alone.

    Returns:
        d (0 = the full rank: no candidate below it) and a report: each candidate's and the full
        rank's val recall@20 per protocol, and the rule.
    """
    k = vectors.shape[1]
    cands = below(k, dims)
    report: dict[str, Any] = {"rank": k, "candidates": cands, "rule": "the smallest d the full rank does not beat "
                              "beyond the paired noise on val, else the largest"}
    if not cands or not len(val):
        report |= {"served_dim": cap(k, dims), "why": "no candidate below the rank" if not cands else "no val users"}
        return report["served_dim"], report
    norm = row_norms(vectors)  # np.linalg.norm's values without its (n, K) square
    has = norm > 0
    # users s_u, entities a_e s_e: x = vectors * factor[:, None], read a block of its rows at a
    # time (Rows), never whole: it was one more (n, K) copy of the base (2.2 GB at 10M events)
    factor = np.where(has, np.where(is_user, 1.0, scale) / np.maximum(norm, 1e-30), 0.0).astype(np.float32)
    x = Rows(vectors, np.arange(len(vectors)), k, factor)
    vecs, _ = leading_directions(Rows(vectors, np.flatnonzero(has & is_user), k, factor),
                                 Rows(vectors, np.flatnonzero(has & ~is_user), k, factor))
    sets = {"new_to_user": val} | ({"full_ranking": full_ranking} if full_ranking is not None and len(full_ranking)
                                   else {})
    recall: dict[str, dict[str, float]] = {name: {} for name in sets}

    def scores(vs: ValSet, p: np.ndarray | None) -> np.ndarray:
        users, items = x[vs.users], x[vs.cands]
        if p is not None:
            users, items = users @ p, items @ p
        return recall_per_user(users, items, vs.positives, vs.masked, 20)

    full = {name: scores(vs, None) for name, vs in sets.items()}
    for name in sets:
        recall[name]["full"] = round(float(np.nanmean(full[name])), 5)
    chosen = max(cands)
    for d in cands:
        p = vecs[:, :d].astype(np.float32)
        lost = False
        for name, vs in sets.items():
            got = scores(vs, p)
            recall[name][str(d)] = round(float(np.nanmean(got)), 5)
            lost = lost or beats(full[name], got, z, min_gain)
        if not lost:
            chosen = d
            break
    report |= {"served_dim": chosen, "val_recall@20": recall}
    log.info("served dimension: %d of rank %d on val (recall@20 %s)", chosen, k, recall)
    return chosen, report
