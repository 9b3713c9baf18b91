"""The validation task of training: which users, which candidates, which held-out positives.

Protocol ``masked_new`` (the default; the one `hir evaluate` headlines, as in the LightGCN
paper): each user's visible deep-stage entities are masked from its ranking, and the positives
are the val-period deep-stage entities *new to the user* (no visible engagement of any stage).
Protocol ``all``: nothing masked, every val deep-stage pair is a positive (repeat engagement
counts).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hir.errors import HirError
from hir.model.store import GraphStore

PROTOCOLS = ("masked_new", "all")


@dataclass
class ValSet:
    """users: (U,) global ids with at least one positive; cands: (M,) candidate global ids;
    positives / masked: per user, row indices into ``cands``."""

    users: np.ndarray
    cands: np.ndarray
    positives: list[np.ndarray]
    masked: list[np.ndarray]
    protocol: str

    def __len__(self) -> int:
        return len(self.users)

    def scored_users(self, max_users: int | None = None, max_pairs: float | None = None) -> int | None:
        """How many users a ranking of every candidate may score: at most ``max_users``, and at
        most ``max_pairs`` (user x candidate) scores, ``floor(max_pairs / len(cands))`` users, at
        least 1; None when neither binds (every user). Scoring every val user against every
        candidate grows with users x entities, the square of the log; a budget keeps it linear."""
        caps = [int(max_users)] if max_users else []
        if max_pairs and len(self.cands):
            caps.append(max(1, int(max_pairs // len(self.cands))))
        n = min(caps, default=None)
        return n if n is not None and n < len(self) else None

    def limited(self, max_pairs: float | None, seed: int, max_users: int | None = None) -> ValSet:
        """This set, or a seeded sample of its users within ``max_pairs`` (user x candidate)
        scores and ``max_users`` users (:meth:`scored_users`); the candidates stay all of them.
        The one sample of every val choice (the filter search's ``select_users`` draws it too)."""
        n = self.scored_users(max_users, max_pairs)
        if n is None:
            return self
        keep = np.sort(np.random.default_rng([seed, 11]).choice(len(self), n, replace=False))
        return ValSet(self.users[keep], self.cands, [self.positives[i] for i in keep],
                      [self.masked[i] for i in keep], self.protocol)


def _pair_keys(users: np.ndarray, ents: np.ndarray, n: int) -> np.ndarray:
    return users.astype(np.int64) * n + ents.astype(np.int64)


def validation_set(store: GraphStore, max_candidates: int | None, seed: int, protocol: str) -> ValSet:
    """Build the :class:`ValSet` of a training store (see the module doc).

    Candidates are every entity of the types deep-stage edges point to; with ``max_candidates``
    a seeded random subset of them, always including the positives.
    """
    if protocol not in PROTOCOLS:
        raise HirError(f"datamodule.val_protocol={protocol!r}; expected one of {list(PROTOCOLS)}")
    empty = ValSet(np.zeros(0, np.int64), np.zeros(0, np.int64), [], [], protocol)
    if len(store.val_pairs) == 0:
        return empty
    n = store.n_nodes
    pairs = np.unique(store.val_pairs, axis=0)
    eng = store.eng
    src = np.repeat(np.arange(n), np.diff(eng.indptr))
    lo, hi = store.type_range("user")
    is_user = (src >= lo) & (src < hi)
    visible = _pair_keys(src[is_user], eng.dst[is_user], n)
    if protocol == "masked_new":
        pairs = pairs[~np.isin(_pair_keys(pairs[:, 0], pairs[:, 1], n), visible)]
        if len(pairs) == 0:
            return empty
    target_types = np.unique(store.node_type[np.concatenate([pairs[:, 1], store.deep_pairs[:, 1]])])
    cands = np.flatnonzero(np.isin(store.node_type, target_types))
    if max_candidates and len(cands) > max_candidates:
        pos = np.unique(pairs[:, 1])
        rest = np.setdiff1d(cands, pos)
        pick = np.random.default_rng([seed, 7]).choice(rest, max(max_candidates - len(pos), 0), replace=False)
        cands = np.union1d(pos, pick)
    row_of = np.full(n, -1, np.int64)
    row_of[cands] = np.arange(len(cands))
    users = np.unique(pairs[:, 0])
    order = np.argsort(pairs[:, 0], kind="stable")
    split = np.searchsorted(pairs[order, 0], users)
    positives = [np.unique(row_of[e]) for e in np.split(pairs[order, 1], split[1:])]
    masked: list[np.ndarray] = []
    for u in users:
        if protocol == "all":
            masked.append(np.zeros(0, np.int64))
            continue
        a, b = eng.indptr[u], eng.indptr[u + 1]
        deep = eng.dst[a:b][eng.stage[a:b] == len(store.stage_order)]
        rows = row_of[deep]
        masked.append(np.unique(rows[rows >= 0]))
    return ValSet(users.astype(np.int64), cands.astype(np.int64), positives, masked, protocol)
