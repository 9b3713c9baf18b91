"""Metadata edges (category, advertiser, campaign links) as two CSRs, and what they propagate.

``up``: forward relations (a product's category and advertiser, a category's parent, a
campaign's advertiser and products) and their transitive closure up to ``depth`` hops (a
product's category ancestors); nearer links weigh more (1 / hop). ``down``: the reverse hop (a
category's products, an advertiser's campaigns), weighted towards popular members.

Through them, nodes nobody engages with directly inherit popularity (a category: its products')
and warmth (a node of a type without engagement is warm when linked to something warm).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from hir.data.schema import ENTITY_TYPES
from hir.data.snapshot import Snapshot
from hir.model.csr import CSR


def metadata_links(snap: Snapshot, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every forward metadata edge of the snapshot as global ids: (src (E,), dst (E,))."""
    src, dst = [], []
    for _, s_t, d_t, m in snap.metadata_edges():
        src.append(m["src_id"].to_numpy() + offsets[ENTITY_TYPES.index(s_t)])
        dst.append(m["dst_id"].to_numpy() + offsets[ENTITY_TYPES.index(d_t)])
    return (np.concatenate(src) if src else np.zeros(0, np.int64),
            np.concatenate(dst) if dst else np.zeros(0, np.int64))


def closure(n: int, src: np.ndarray, dst: np.ndarray, depth: int) -> CSR:
    """Forward metadata edges and their transitive closure up to ``depth`` hops (hop = shortest)."""
    if len(src) == 0:
        return CSR.build(n, src, dst, np.zeros(0))
    a = sp.csr_matrix((np.ones(len(src)), (src, dst)), shape=(n, n))
    a.data[:] = 1
    seen = a.copy()
    hops = [a]
    frontier = a
    for _ in range(depth - 1):
        frontier = frontier @ a
        frontier.data[:] = 1
        frontier = frontier - frontier.multiply(seen)
        frontier.eliminate_zeros()
        if frontier.nnz == 0:
            break
        hops.append(frontier)
        seen = seen + frontier
    s, d, h = [], [], []
    for k, m in enumerate(hops, start=1):
        coo = m.tocoo()
        s.append(coo.row)
        d.append(coo.col)
        h.append(np.full(coo.nnz, min(k, 2), np.int8))
    s_all, d_all, h_all = np.concatenate(s), np.concatenate(d), np.concatenate(h)
    # nearer metadata first: a product's own category and advertiser before the ancestors
    return CSR.build(n, s_all.astype(np.int64), d_all.astype(np.int64), 1.0 / h_all, hop=h_all)


def inherit_exposure(up: CSR, exposure: np.ndarray) -> np.ndarray:
    """(n,) exposure where nodes without engagement of their own (categories, advertisers) get
    the sum over everything below them in ``up`` (a category: its products, through the closure)."""
    inherited = np.zeros(len(exposure), np.float64)
    np.add.at(inherited, up.dst, exposure[up.sources()])
    return np.where(exposure > 0, exposure, inherited)


def members(n: int, src: np.ndarray, dst: np.ndarray, exposure: np.ndarray) -> CSR:
    """The reverse hop ``dst -> src`` of the forward edges: an advertiser's context favours its
    popular products (weight ``1 + log1p(exposure)`` of the member)."""
    return CSR.build(n, dst, src, 1.0 + np.log1p(exposure[src]))


def spread_warm(warm: np.ndarray, node_type: np.ndarray, src: np.ndarray, dst: np.ndarray, depth: int) -> np.ndarray:
    """(n,) bool: ``warm`` plus every node of a type that never takes engagement (users always
    do) linked to a warm node, repeated up to ``depth + 1`` times (ancestors of ancestors)."""
    engaged_types = {int(t) for t in np.unique(node_type[warm])} | {0}
    meta_only = ~np.isin(node_type, list(engaged_types))
    for _ in range(depth + 1):
        linked = np.zeros(len(warm), bool)
        linked[dst[warm[src]]] = True
        linked[src[warm[dst]]] = True
        grown = warm | (meta_only & linked)
        if (grown == warm).all():
            break
        warm = grown
    return warm
