"""Baseline ranking features, point-in-time correct: every count and recency for a row at time
``ts`` uses only events strictly before ``ts``.

The ranker's inputs are plain arrays (:class:`RankerInputs`); arms differ only in which extra
blocks (vectors, token bags) they add to the same baseline block.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from hir.data.snapshot import Snapshot
from hir_evaluation.sources.hir import TokenBag

# an entity never seen before ts gets this age (hours): older than anything in the data
NEVER_H = 24.0 * 365 * 5


@dataclass
class RankerInputs:
    """Everything one arm feeds the ranker for n rows.

    dense: (n, F) float32 raw values (the ranker standardises them on the fit rows);
    sparse: (n, S) int64 ids, column j in [0, vocab[j]) with 0 = unknown;
    vectors: name -> (n, d) float32 (embeddings, content vectors; zeros where missing);
    bags: name -> TokenBag.
    """

    dense: np.ndarray
    dense_names: list[str]
    sparse: np.ndarray
    sparse_names: list[str]
    vocab: list[int]
    vectors: dict[str, np.ndarray] = field(default_factory=dict)
    bags: dict[str, TokenBag] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.dense.shape[0])

    def with_blocks(
        self,
        dense: dict[str, np.ndarray] | None = None,
        vectors: dict[str, np.ndarray] | None = None,
        bags: dict[str, TokenBag] | None = None,
    ) -> RankerInputs:
        """A copy with extra dense columns (name -> (n,)), vectors and bags appended."""
        extra = dense or {}
        cols = [self.dense, *[np.asarray(v, np.float32)[:, None] for v in extra.values()]]
        return RankerInputs(
            dense=np.concatenate(cols, axis=1),
            dense_names=[*self.dense_names, *extra],
            sparse=self.sparse,
            sparse_names=self.sparse_names,
            vocab=self.vocab,
            vectors={**self.vectors, **(vectors or {})},
            bags={**self.bags, **(bags or {})},
        )

    def subset(self, idx: np.ndarray) -> RankerInputs:
        return RankerInputs(
            dense=self.dense[idx],
            dense_names=self.dense_names,
            sparse=self.sparse[idx],
            sparse_names=self.sparse_names,
            vocab=self.vocab,
            vectors={k: v[idx] for k, v in self.vectors.items()},
            bags={k: TokenBag(b.ids[idx], b.weights[idx], b.vocab) for k, b in self.bags.items()},
        )


def affinity(user: np.ndarray, entity: np.ndarray) -> np.ndarray:
    """Cosine of each row's user and entity vectors, (n, d) x 2 -> (n,) float32; 0 where either
    side is missing (a zero vector). The two-tower score a serving system would compute, given
    to the ranker as one dense feature next to the vectors (HIR and content arms alike)."""
    num = (user * entity).sum(axis=1)
    den = np.linalg.norm(user, axis=1) * np.linalg.norm(entity, axis=1)
    return np.divide(num, den, out=np.zeros_like(num), where=den > 0).astype(np.float32)


def prior_stats(events: pl.DataFrame, rows: pl.DataFrame, keys: list[str], name: str) -> pl.DataFrame:
    """Count and age (hours) of ``events`` per ``keys`` strictly before each row's ``ts``.

    Args:
        events: ``keys`` + ``timestamp``.
        rows: ``keys`` + ``ts`` + ``_row`` (row index, to restore order).
    Returns:
        ``_row``, ``{name}_n`` (f64, 0 when none), ``{name}_age_h`` (f64, NEVER_H when none).
    """
    # only keys that some row asks about (for pairs this drops most of the events)
    events = events.join(rows.select(keys).unique(), on=keys, how="semi")
    per_time = (
        events.group_by([*keys, "timestamp"])
        .len()
        .sort("timestamp")
        .with_columns(pl.col("len").cum_sum().over(keys).alias("_cum"))
        .select(*keys, "timestamp", "_cum")
    )
    joined = rows.select("_row", *keys, "ts").sort("ts").join_asof(
        per_time,
        left_on="ts",
        right_on="timestamp",
        by=keys,
        strategy="backward",
        allow_exact_matches=False,  # strictly before ts: an event at ts may be the label itself
        check_sortedness=False,
    )
    return joined.select(
        "_row",
        pl.col("_cum").fill_null(0).cast(pl.Float64).alias(f"{name}_n"),
        ((pl.col("ts") - pl.col("timestamp")).dt.total_seconds() / 3600.0).fill_null(NEVER_H).alias(f"{name}_age_h"),
    )


def _relation_ids(snap: Snapshot, entity_type: str, relation: str, n: int) -> np.ndarray | None:
    """node_id -> dst id + 1 of a many-to-one metadata relation (0 = none), or None if absent."""
    edges = snap.edges(f"{entity_type}__{relation}")
    if edges is None or edges.is_empty():
        return None
    out = np.zeros(n, dtype=np.int64)
    first = edges.unique(subset=["src_id"], keep="first")
    out[first["src_id"].to_numpy()] = first["dst_id"].to_numpy() + 1
    return out


def category_roots(snap: Snapshot) -> np.ndarray | None:
    """category node_id -> its taxonomy root's node_id (itself for a root), or None."""
    parents = snap.edges("category__child_of__category")
    if parents is None or not snap.has_nodes("category"):
        return None
    n = snap.num_nodes("category")
    parent = np.arange(n)
    parent[parents["src_id"].to_numpy()] = parents["dst_id"].to_numpy()
    root = parent.copy()
    for _ in range(64):  # taxonomies are shallow; pointer jumping converges in log(depth) steps
        nxt = root[root]
        if np.array_equal(nxt, root):
            break
        root = nxt
    return root


def entity_price(snap: Snapshot, entity_type: str, label_stage: str) -> np.ndarray:
    """Price per entity node_id (NaN when unknown): ``attr_price`` when the dataset has it, else
    the median unit value (value / quantity) of its ``label_stage`` events in the train period."""
    nodes = snap.nodes(entity_type)
    n = nodes.height
    price = np.full(n, np.nan)
    if "attr_price" in nodes.columns:
        vals = nodes.select(pl.col("attr_price").cast(pl.Float64)).to_series().to_numpy()
        price[nodes["node_id"].to_numpy()] = vals
        return price
    ev = snap.events.filter(
        (pl.col("entity_type") == entity_type)
        & (pl.col("stage") == label_stage)
        & (pl.col("split") == "train")
        & (pl.col("quantity") > 0)
    )
    if "value" in ev.columns and not ev.is_empty():
        med = ev.group_by("entity_id").agg((pl.col("value") / pl.col("quantity")).median().alias("p"))
        price[med["entity_id"].to_numpy()] = med["p"].to_numpy()
    return price


def hashed(ids: np.ndarray, n: int, buckets: int) -> tuple[np.ndarray, int]:
    """Dense ids in [0, n) -> [1, vocab) with 0 kept for unknown; ids beyond ``buckets`` wrap
    (the hashing trick), so the table size never depends on which rows are present."""
    vocab = min(n, buckets) + 1
    return (ids % (vocab - 1)) + 1, vocab


def baseline_inputs(
    snap: Snapshot, rows: pl.DataFrame, entity_type: str, label_stage: str, id_buckets: int = 100_000
) -> RankerInputs:
    """Counts, recency, popularity, price and ids for every candidate row (see module doc).

    Args:
        rows: candidate rows (``user_id``, ``entity_id``, ``ts``) in the order the arrays follow.
        id_buckets: embedding-table size cap for user/entity ids.
    """
    rows = rows.select("user_id", "entity_id", "ts").with_row_index("_row")
    ev = snap.events.filter(pl.col("entity_type") == entity_type).select("user_id", "entity_id", "stage", "timestamp")
    deep = ev.filter(pl.col("stage") == label_stage)
    blocks = [
        prior_stats(ev, rows, ["user_id"], "user"),
        prior_stats(deep, rows, ["user_id"], "user_deep"),
        prior_stats(ev, rows, ["entity_id"], "entity"),
        prior_stats(deep, rows, ["entity_id"], "entity_deep"),
        prior_stats(ev, rows, ["user_id", "entity_id"], "pair"),
        prior_stats(deep, rows, ["user_id", "entity_id"], "pair_deep"),
    ]
    feats = rows.select("_row")
    for block in blocks:
        feats = feats.join(block, on="_row", how="left")
    feats = feats.sort("_row").drop("_row")
    entity_ids = rows["entity_id"].to_numpy()
    price = entity_price(snap, entity_type, label_stage)[entity_ids]
    dense = {c: np.log1p(feats[c].to_numpy()) for c in feats.columns}
    dense["log_price"] = np.log1p(np.nan_to_num(np.clip(price, 0, None), nan=0.0))
    dense["has_price"] = (~np.isnan(price)).astype(np.float64)

    n_items = snap.num_nodes(entity_type)
    user_ids, user_vocab = hashed(rows["user_id"].to_numpy(), snap.num_nodes("user"), id_buckets)
    item_ids, item_vocab = hashed(entity_ids, n_items, id_buckets)
    sparse = {"user": (user_ids, user_vocab), "entity": (item_ids, item_vocab)}
    cat = _relation_ids(snap, entity_type, "in_category__category", n_items)
    if cat is not None:
        sparse["category"] = (cat[entity_ids], snap.num_nodes("category") + 1)
        roots = category_roots(snap)
        if roots is not None:
            leaf = cat[entity_ids]
            top = np.where(leaf > 0, roots[np.maximum(leaf - 1, 0)] + 1, 0)
            sparse["category_root"] = (top, snap.num_nodes("category") + 1)
    adv = _relation_ids(snap, entity_type, "by_advertiser__advertiser", n_items)
    if adv is not None:
        sparse["advertiser"] = (adv[entity_ids], snap.num_nodes("advertiser") + 1)
    return RankerInputs(
        dense=np.stack(list(dense.values()), axis=1).astype(np.float32),
        dense_names=list(dense),
        sparse=np.stack([v for v, _ in sparse.values()], axis=1).astype(np.int64),
        sparse_names=list(sparse),
        vocab=[int(v) for _, v in sparse.values()],
    )
