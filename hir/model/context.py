"""Vectorised context sampling: seeds -> fixed-width token arrays for the two views.

Engagement view of seed s, in this token order (segments padded with -1 to a fixed width):

    [s] + engagement neighbours (k_eng, weighted draw without replacement: stage weight x
    recency decay x log count, see :mod:`hir.model.engagement`) + metadata up (k_up: category, ancestors,
    advertiser) + metadata down (k_down: a category's products, an advertiser's campaigns)
    + second hop (k_hop2: one weighted draw from each of the top neighbours' engagement rows,
    e.g. other buyers of my products, other products of my buyers)

Knowledge view: [s] + metadata up + metadata down (``k_know_down``), no engagement edges and no
popularity. The interest-primitive tokens are appended by the network, not here.

All randomness comes from the ``numpy.random.Generator`` passed in, so a batch is a pure
function of (seed, epoch, batch index) whatever the worker count.
"""

from __future__ import annotations

import numpy as np

from hir.model.csr import CSR
from hir.model.store import GraphStore
from hir.nn.buckets import ENGAGEMENT, METADATA, SELF

VIEW_KEYS = ("node", "type", "relation", "hop", "stage", "recency", "count", "age", "exposure")


def topk_edges(csr: CSR, rows: np.ndarray, k: int, rng: np.random.Generator, exclude: np.ndarray | None = None) -> np.ndarray:
    """Per row, up to ``k`` edges drawn without replacement with probability ~ weight.

    Gumbel top-k: key = log w + Gumbel noise, keep the k largest keys of each row.

    Args:
        rows: (R,) node ids. exclude: (R,) a neighbour id per row that must not be drawn (-1 none).
    Returns:
        (R, k) edge indices into ``csr``, -1 where a row has fewer eligible edges.
    """
    r = len(rows)
    out = np.full((r, k), -1, np.int64)
    if r == 0 or k == 0:
        return out
    start = csr.indptr[rows]
    deg = csr.indptr[rows + 1] - start
    total = int(deg.sum())
    if total == 0:
        return out
    row_of = np.repeat(np.arange(r), deg)  # (T,) sorted
    pos = np.arange(total) - np.repeat(np.cumsum(deg) - deg, deg)  # position inside the row
    eidx = start[row_of] + pos
    w = csr.weight[eidx]
    keys = np.full(total, -np.inf)
    np.log(w, out=keys, where=w > 0)
    keys -= np.log(-np.log(rng.random(total)))  # + Gumbel(0, 1)
    if exclude is not None:
        keys[csr.dst[eidx] == exclude[row_of]] = -np.inf
    order = np.lexsort((-keys, row_of))  # rows stay in place, keys descending inside each row
    keep = (pos < k) & np.isfinite(keys[order])
    out[row_of[keep], pos[keep]] = eidx[order][keep]
    return out


def draw_one(csr: CSR, rows: np.ndarray, rng: np.random.Generator, exclude: np.ndarray | None = None) -> np.ndarray:
    """One weighted edge per row (inverse CDF on the cumulative weights); -1 for rows with no
    edge, ``rows < 0``, or when the draw hits ``exclude``. rows, exclude: (R,) -> (R,)."""
    ok = rows >= 0
    r = np.where(ok, rows, 0)
    start, end = csr.indptr[r], csr.indptr[r + 1]
    lo = np.where(start > 0, csr.cumw[np.maximum(start - 1, 0)], 0.0)
    hi = np.where(end > 0, csr.cumw[np.maximum(end - 1, 0)], 0.0)
    ok &= (end > start) & (hi > lo)
    u = lo + rng.random(len(rows)) * (hi - lo)
    e = np.clip(np.searchsorted(csr.cumw, u, side="right"), start, np.maximum(end - 1, start))
    out = np.where(ok, e, -1)
    if exclude is not None:
        out[(out >= 0) & (csr.dst[np.maximum(out, 0)] == exclude)] = -1
    return out


def _first_valid(cand: np.ndarray, k: int) -> np.ndarray:
    """(R, M) ids with -1 holes -> (R, k): the valid ids left-packed and repeated cyclically."""
    valid = cand >= 0
    packed = np.take_along_axis(cand, np.argsort(~valid, axis=1, kind="stable"), axis=1)
    n_valid = valid.sum(1, keepdims=True)
    idx = np.arange(k)[None, :] % np.maximum(n_valid, 1)
    return np.where(n_valid > 0, np.take_along_axis(packed, idx, axis=1), -1)


def _dedupe(nodes: np.ndarray) -> np.ndarray:
    """(R, k) ids -> bool (R, k), True on the second and later copies of an id within a row."""
    order = np.argsort(nodes, axis=1, kind="stable")
    s = np.take_along_axis(nodes, order, axis=1)
    dup_sorted = np.zeros_like(s, dtype=bool)
    dup_sorted[:, 1:] = (s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)
    dup = np.zeros_like(dup_sorted)
    np.put_along_axis(dup, order, dup_sorted, axis=1)
    return dup


class ContextSampler:
    """Builds engagement-view and knowledge-view contexts for batches of seeds.

    Args (the sizes `hir train` uses are ``datamodule.context``, conf/datamodule/default.yaml):
        store: the loaded snapshot.
        engagement: engagement neighbours per context.
        meta_up: metadata ancestors per context.
        meta_down: metadata members per context.
        hop2: second-hop entities per context.
        know_down: metadata members per knowledge-view context.
    """

    def __init__(self, store: GraphStore, engagement: int, meta_up: int, meta_down: int, hop2: int,
                 know_down: int) -> None:
        self.store = store
        self.k_eng, self.k_up, self.k_down, self.k_hop2, self.k_know_down = engagement, meta_up, meta_down, hop2, know_down

    @property
    def sizes(self) -> dict[str, int]:
        """The constructor's sizes (recorded in checkpoints, so export samples the same contexts)."""
        return {"engagement": self.k_eng, "meta_up": self.k_up, "meta_down": self.k_down, "hop2": self.k_hop2,
                "know_down": self.k_know_down}

    @property
    def eng_len(self) -> int:
        return 1 + self.k_eng + self.k_up + self.k_down + self.k_hop2

    @property
    def know_len(self) -> int:
        return 1 + self.k_up + self.k_know_down

    def _segment(self, csr: CSR, edges: np.ndarray, relation: int) -> dict[str, np.ndarray]:
        ok = edges >= 0
        e = np.where(ok, edges, 0)

        def take(a: np.ndarray, dtype) -> np.ndarray:
            # a relation with no edges at all (e.g. online_retail has no taxonomy): every slot is
            # padding, but a[e] still needs one row to index
            a = a if len(a) else np.zeros(1, a.dtype)
            return np.where(ok, a[e], 0).astype(dtype)

        return {
            "node": np.where(ok, take(csr.dst, np.int64), -1), "relation": np.where(ok, relation, 0),
            "hop": take(csr.hop, np.int64), "stage": take(csr.stage, np.int64), "recency": take(csr.recency, np.int64),
            "count": take(csr.count, np.float32), "age": take(csr.age, np.float32),
        }

    def _seed_segment(self, seeds: np.ndarray) -> dict[str, np.ndarray]:
        r = len(seeds)
        zi, zf = np.zeros((r, 1), np.int64), np.zeros((r, 1), np.float32)
        return {"node": seeds[:, None].astype(np.int64), "relation": zi + SELF, "hop": zi, "stage": zi,
                "recency": zi, "count": zf, "age": zf}

    def _assemble(self, segments: list[dict[str, np.ndarray]], popularity: bool) -> dict[str, np.ndarray]:
        view = {k: np.concatenate([s[k] for s in segments], axis=1) for k in segments[0]}
        node = view["node"]
        safe = np.maximum(node, 0)
        view["mask"] = node >= 0
        view["type"] = np.where(node >= 0, self.store.node_type[safe], 0).astype(np.int64)
        view["exposure"] = (
            np.where(node >= 0, self.store.exposure[safe], 0).astype(np.float32)
            if popularity else np.zeros(node.shape, np.float32)
        )
        # left-pack real tokens (the seed stays first) and drop columns that are padding in every
        # row: sparse graphs leave most slots empty, and attention cost grows with the width
        order = np.argsort(~view["mask"], axis=1, kind="stable")
        width = max(int(view["mask"].sum(1).max(initial=1)), 1)
        view = {k: np.take_along_axis(a, order[:, :width], axis=1) for k, a in view.items()}
        # padding carries the (type 0, SELF, hop 0) tuple: a valid bucket; the mask hides it
        return view

    def engagement(self, seeds: np.ndarray, rng: np.random.Generator, exclude: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Engagement-view contexts: seeds (R,) global ids; exclude (R,) a neighbour to hide per
        seed (the held-out side of a training pair), -1 for none -> arrays (R, eng_len)."""
        st = self.store
        eng = self._segment(st.eng, topk_edges(st.eng, seeds, self.k_eng, rng, exclude), ENGAGEMENT)
        up = self._segment(st.up, topk_edges(st.up, seeds, self.k_up, rng), METADATA)
        down = self._segment(st.down, topk_edges(st.down, seeds, self.k_down, rng), METADATA)
        # second hop through the strongest first-hop neighbours (metadata members for entities
        # without engagement, e.g. an advertiser's products -> their buyers)
        pivots = _first_valid(np.concatenate([eng["node"], down["node"]], axis=1), self.k_hop2)  # (R, k_hop2)
        e2 = draw_one(st.eng, pivots.reshape(-1), rng, np.repeat(seeds, self.k_hop2)).reshape(pivots.shape)
        hop2 = self._segment(st.eng, e2, ENGAGEMENT)
        dup = _dedupe(hop2["node"])
        for key in hop2:
            hop2[key] = np.where(dup, -1 if key == "node" else 0, hop2[key]).astype(hop2[key].dtype)
        hop2["hop"] = np.where(hop2["node"] >= 0, 2, 0)
        return self._assemble([self._seed_segment(seeds), eng, up, down, hop2], popularity=True)

    def knowledge(self, seeds: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Knowledge-view contexts (content + metadata only): seeds (R,) -> arrays (R, know_len)."""
        st = self.store
        up = self._segment(st.up, topk_edges(st.up, seeds, self.k_up, rng), METADATA)
        down = self._segment(st.down, topk_edges(st.down, seeds, self.k_know_down, rng), METADATA)
        return self._assemble([self._seed_segment(seeds), up, down], popularity=False)
