"""Super-graph statistics (raw user->entity graph vs user->prototype graph) and, for data with a
planted hierarchy, how well the exported tokens recover it (NMI)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import polars as pl
from sklearn.metrics import normalized_mutual_info_score

from hir.data.schema import ENTITY_TYPES
from hir.data.snapshot import Snapshot

log = logging.getLogger(__name__)


# -- sets of integer keys (e.g. user * K + token), by sort --------------------------------------
# np.unique (numpy 2.4) takes a hash path for integers that took 0.7 s on completejourney's 1.26M
# user-token keys, where sorting takes 0.02 s; these give the same values (tests compare them).

def distinct(keys: np.ndarray) -> np.ndarray:
    """``np.unique(keys)`` of an integer array (sorted distinct values, same dtype), by one sort."""
    s = np.sort(keys)
    return s[np.concatenate(([True], s[1:] != s[:-1]))] if len(s) else s


def n_distinct(keys: np.ndarray) -> int:
    """``len(np.unique(keys))`` of an integer array."""
    return len(distinct(keys))


def member(keys: np.ndarray, of: np.ndarray) -> np.ndarray:
    """``np.isin(keys, of)`` of integer arrays: (len(keys),) bool, by a sort of ``of`` and a binary search."""
    s = np.sort(of)
    if not len(s):
        return np.zeros(len(keys), bool)
    return s[np.minimum(np.searchsorted(s, keys), len(s) - 1)] == keys


def engagement_pairs(snapshot: Snapshot, offsets: np.ndarray,
                     splits: tuple[str, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (user, entity) pairs over every stage of ``splits`` (default every split):
    (user ids, global entity ids), sorted by (user, entity) within each entity type (polars'
    ``unique`` returns them in another order each run, which moved the held-out log-losses'
    sums in their last bit from one export to the next)."""
    users, ents = [], []
    for ti, t in enumerate(ENTITY_TYPES):
        scan = snapshot.engagement(t)
        if scan is not None:
            if splits is not None:
                scan = scan.filter(pl.col("split").is_in(list(splits)))
            e = scan.select("src_id", "dst_id").unique().sort("src_id", "dst_id").collect()
            users.append(e["src_id"].to_numpy())
            ents.append(e["dst_id"].to_numpy() + offsets[ti])
    if not users:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(users).astype(np.int64), np.concatenate(ents).astype(np.int64)


def supergraph_stats(users: np.ndarray, entities: np.ndarray, n_users: int, n_entities: int,
                     top1: list[np.ndarray], levels: tuple[int, ...], seed: int = 0) -> dict[str, Any]:
    """Density (edges / (rows x cols)) of the raw user->entity graph and of its projection onto
    each level's prototypes (entity -> its top-1 token), and the gain projected / raw.

    The gain is (E'/E)(N/K), far above 1 for any assignment, so beside it stands the projection of
    a random assignment with the same token sizes (``random_edges``, ``random_gain``) and their
    ratio ``concentration`` = E' / E'_random: below 1 when users' entities share tokens more than
    chance would have them.

    Args:
        users, entities: (E,) distinct raw edges (user id, global entity id).
        top1: per level, (n_nodes,) top-1 token of every node (indexed by global id).
    """
    raw_density = len(users) / max(n_users * n_entities, 1)
    out: dict[str, Any] = {
        "raw": {"edges": len(users), "rows": int(n_users), "cols": int(n_entities), "density": raw_density,
                "mean_degree": len(users) / max(n_distinct(users), 1)},
        "levels": [],
    }
    # the same token sizes dealt at random: the entities' tokens permuted among the entities
    ents, inverse = np.unique(entities, return_inverse=True)
    shuffled = np.random.default_rng(seed).permutation(ents)[inverse]
    n_users_seen = n_distinct(users)
    for lvl, k in enumerate(levels):
        proto = top1[lvl][entities]
        pairs = n_distinct(users * k + proto)
        rand = n_distinct(users * k + top1[lvl][shuffled])
        density = pairs / max(n_users * k, 1)
        out["levels"].append({
            "level": lvl, "prototypes": int(k), "edges": pairs, "density": density,
            "gain": density / raw_density if raw_density else None,
            "random_edges": rand,
            "random_gain": rand / max(n_users * k, 1) / raw_density if raw_density else None,
            # < 1: a user's entities share fewer tokens than chance (the hierarchy groups what
            # users engage with together); the gain alone is > 1 for any assignment
            "concentration": pairs / max(rand, 1),
            "mean_degree": pairs / max(n_users_seen, 1),
        })
    return out


def planted_recovery(snapshot: Snapshot, keys: dict[str, list[str]], offsets: np.ndarray,
                     top1: list[np.ndarray]) -> dict[str, Any] | None:
    """NMI between a planted hierarchy (``graph/*truth.parquet``: entity_type, key, coarse, fine,
    weight) and the top-1 token at every level, over all entities with a truth row (an entity
    with a mixture, e.g. a user, counts its heaviest interest) and over products alone."""
    found = snapshot.truth()
    if found is None:
        return None
    name, truth = found
    need = {"entity_type", "key", "coarse", "fine"}
    if not need <= set(truth.columns):
        log.warning("%s lacks columns %s; skipping hierarchy recovery", name, sorted(need - set(truth.columns)))
        return None
    if "weight" in truth.columns:
        truth = truth.sort("weight", descending=True)
    truth = truth.unique(subset=["entity_type", "key"], keep="first", maintain_order=True)
    truth = truth.filter(pl.col("coarse").is_not_null() & pl.col("fine").is_not_null())
    rows, coarse, fine, etypes = [], [], [], []
    for ti, t in enumerate(ENTITY_TYPES):
        if t not in keys:
            continue
        index = {k: i for i, k in enumerate(keys[t])}
        part = truth.filter(pl.col("entity_type") == t)
        for key, c, f in part.select(pl.col("key").cast(pl.String), "coarse", "fine").iter_rows():
            if key in index:
                rows.append(offsets[ti] + index[key])
                coarse.append(c)
                fine.append(f)
                etypes.append(t)
    if not rows:
        return None
    rows_a, coarse_a, fine_a, etypes_a = np.array(rows), np.array(coarse), np.array(fine), np.array(etypes)
    out: dict[str, Any] = {"truth_file": name, "entities": len(rows)}
    for scope, sel in (("all", np.ones(len(rows), bool)), ("product", etypes_a == "product")):
        if not sel.any():
            continue
        out[scope] = {
            name: {f"l{lvl}": float(normalized_mutual_info_score(lab[sel], t1[rows_a[sel]])) for lvl, t1 in enumerate(top1)}
            for name, lab in (("coarse", coarse_a), ("fine", fine_a))
        }
        out[scope]["n"] = int(sel.sum())
    return out
