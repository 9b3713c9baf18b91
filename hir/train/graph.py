"""The snapshot as numpy arrays: one global node index, CSR adjacencies, content rows.

Built once per process from ``graph/`` (prepare) and ``content/`` (enrich). Every entity type
of ``hir.data.schema.ENTITY_TYPES`` has a fixed type id (a type absent from the snapshot has no
nodes), and node ``(type, node_id)`` has global id ``offset[type] + node_id``.

Engagement edges are *visible* only from the given splits (training: ``train``); one CSR entry
per (user, entity) pair in both directions, with the pair's deepest stage, total count and last
timestamp. Metadata edges give two CSRs: ``up`` (forward relations and their transitive closure
up to ``meta_depth`` hops: a product's category, its ancestors, its advertiser) and ``down`` (the
reverse hop: a category's products, an advertiser's campaigns).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import scipy.sparse as sp

from hir.data.schema import ENTITY_TYPES
from hir.data.snapshot import Snapshot, load_snapshot
from hir.errors import InputError

log = logging.getLogger(__name__)

N_RECENCY = 4
# norm of a node's attribute block next to its unit-norm text vector (text carries more meaning)
ATTR_NORM = 0.5
SECONDS_PER_DAY = 86400.0


@dataclass
class CSR:
    """Adjacency in CSR form over global ids with per-edge features and sampling weights.

    ``weight`` (E,) >= 0; ``cumw`` (E,) is the inclusive cumulative sum of ``weight`` over the
    whole array, so a row's weighted draw is a ``searchsorted`` in ``[cumw[start-1], cumw[end-1]]``.
    """

    indptr: np.ndarray  # (n+1,) int64
    dst: np.ndarray  # (E,) int64 global ids
    weight: np.ndarray  # (E,) float64
    cumw: np.ndarray  # (E,) float64
    stage: np.ndarray  # (E,) int8: 1..S for engagement, 0 for metadata
    recency: np.ndarray  # (E,) int8: 1..N_RECENCY for engagement, 0 for metadata
    count: np.ndarray  # (E,) float32 log1p(count)
    age: np.ndarray  # (E,) float32 age of the last event / span of the visible window
    hop: np.ndarray  # (E,) int8: 1 or 2

    @classmethod
    def build(cls, n: int, src: np.ndarray, dst: np.ndarray, weight: np.ndarray, **features: np.ndarray) -> CSR:
        order = np.lexsort((dst, src))
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.add.at(indptr, src + 1, 1)
        indptr = np.cumsum(indptr)
        e = len(src)
        feats = {
            "stage": np.zeros(e, np.int8), "recency": np.zeros(e, np.int8), "count": np.zeros(e, np.float32),
            "age": np.zeros(e, np.float32), "hop": np.ones(e, np.int8),
        } | features
        w = weight.astype(np.float64)[order]
        return cls(indptr, dst.astype(np.int64)[order], w, np.cumsum(w), **{k: v[order] for k, v in feats.items()})

    def degree(self, rows: np.ndarray) -> np.ndarray:
        return self.indptr[rows + 1] - self.indptr[rows]


@dataclass
class GraphStore:
    """Everything the sampler, the validation metric and export need, as arrays."""

    types: tuple[str, ...]  # ENTITY_TYPES; the index is the type id
    offsets: np.ndarray  # (n_types + 1,) int64 global id ranges per type
    node_type: np.ndarray  # (n,) int8
    content: np.ndarray  # (n, content_dim) float16: text | image | attr blocks per type | has_text
    exposure: np.ndarray  # (n,) float32 visible engagement events of the node (popularity)
    warm: np.ndarray  # (n,) bool: has train engagement (or, without engagement types, linked to warm)
    eng: CSR
    up: CSR
    down: CSR
    deep_pairs: np.ndarray  # (P, 2) int64 (user, entity) visible deep-stage edges, one row per pair
    deep_weight: np.ndarray  # (P,) float64 sampling weight of each pair (its deep-stage event count ** pair_power)
    deep_degree: np.ndarray  # (n,) float32 sum of deep_weight per entity (its positive sampling weight)
    val_pairs: np.ndarray  # (V, 2) int64 (user, entity) deep-stage edges of the val split
    stage_order: tuple[str, ...]
    deep_stage: str
    spec: dict[str, Any]  # plain sizes the network is built from (saved in checkpoints)
    layout: dict[str, Any]  # content row layout (see load_content)
    split_bounds: dict[str, str]  # the snapshot's split bounds (ISO), from meta.json
    visible_end: str  # ISO time the visible engagement ends (val_start or test_start)
    # spectral base (hir.train.spectral), set by attach_base: (n, K) float32 vectors (zero rows =
    # none) and (n,) float32 scale logits
    base: np.ndarray | None = None
    base_logit: np.ndarray | None = None
    base_degree: np.ndarray | None = None  # (n,) column degree of the base (entities)
    base_filter: np.ndarray | None = None  # (K,) the users' spectral filter

    @property
    def n_nodes(self) -> int:
        return int(self.offsets[-1])

    def global_ids(self, etype: str, node_id: np.ndarray) -> np.ndarray:
        return self.offsets[self.types.index(etype)] + np.asarray(node_id, dtype=np.int64)

    def type_range(self, etype: str) -> tuple[int, int]:
        t = self.types.index(etype)
        return int(self.offsets[t]), int(self.offsets[t + 1])


def _ts(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def load_content(content_dir: Path, types: tuple[str, ...], counts: dict[str, int]) -> tuple[np.ndarray, dict[str, Any]]:
    """``content/<type>.parquet`` -> (n, D) float16 rows in global-id order and the layout.

    Layout: text vector (shared width) | image vector (if any) | one attr block per type | has_text.
    A type without a content file gets zero rows (logged).
    """
    frames: dict[str, pl.DataFrame] = {}
    for t in types:
        path = content_dir / f"{t}.parquet"
        if counts.get(t, 0) == 0:
            continue
        if not path.exists():
            log.warning("no content for %s (%s); its tokens carry ids and graph context only", t, path)
            continue
        df = pl.read_parquet(path)
        missing = {"node_id", "has_text", "text_vec", "attr_vec"} - set(df.columns)
        if missing:
            raise InputError(f"{path}: missing columns {sorted(missing)}; expected the enrich contract (docs/contracts.md)")
        frames[t] = df.sort("node_id")
    if not frames:
        raise InputError(f"{content_dir}: no content/<type>.parquet files; run `hir enrich` first")

    def width(df: pl.DataFrame, col: str) -> int:
        if col not in df.columns or df.height == 0:
            return 0
        return int(df[col].list.len().max() or 0)

    text_dim = max(width(df, "text_vec") for df in frames.values())
    image_dim = max(width(df, "image_vec") for df in frames.values())
    attr_dims = {t: width(df, "attr_vec") for t, df in frames.items()}
    attr_off, cursor = {}, text_dim + image_dim
    for t in types:
        attr_off[t] = cursor
        cursor += attr_dims.get(t, 0)
    dim = cursor + 1
    layout = {"text_dim": text_dim, "image_dim": image_dim, "attr_dims": attr_dims, "attr_offsets": attr_off, "dim": dim}
    offsets = np.cumsum([0] + [counts.get(t, 0) for t in types])
    out = np.zeros((int(offsets[-1]), dim), dtype=np.float16)
    for ti, t in enumerate(types):
        if t not in frames:
            continue
        df = frames[t]
        ids = df["node_id"].to_numpy()
        if len(ids) and (ids.min() < 0 or ids.max() >= counts[t]):
            raise InputError(f"{content_dir / t}.parquet: node_id outside 0..{counts[t] - 1}; content is from another snapshot")
        rows = offsets[ti] + ids

        def block(col: str, df: pl.DataFrame = df, t: str = t) -> np.ndarray | None:
            w = width(df, col)
            if w == 0:
                return None
            try:
                return df[col].list.to_array(w).to_numpy().astype(np.float32)
            except Exception as err:  # ragged or null lists
                raise InputError(f"{content_dir / t}.parquet: {col} must hold equal-length vectors ({err})") from err

        try:
            out[rows] = content_rows(layout, t, block("text_vec"), block("attr_vec"),
                                     df["has_text"].fill_null(False).to_numpy(), block("image_vec"))
        except ValueError as err:
            raise InputError(f"{content_dir / t}.parquet: {err}") from err
    return out, layout


def content_rows(layout: dict[str, Any], etype: str, text: np.ndarray | None, attr: np.ndarray | None,
                 has_text: np.ndarray, image: np.ndarray | None = None) -> np.ndarray:
    """One entity type's vectors -> (n, layout dim) float16 content rows (see :func:`load_content`).

    Shared by the snapshot loader and by embedding new entities, so both see the same rows.
    """
    n = len(has_text)
    out = np.zeros((n, layout["dim"]), dtype=np.float32)
    td, idim = layout["text_dim"], layout["image_dim"]
    ad, ao = layout["attr_dims"].get(etype, 0), layout["attr_offsets"].get(etype, 0)
    for name, arr, lo, width in (("text_vec", text, 0, td), ("image_vec", image, td, idim), ("attr_vec", attr, ao, ad)):
        if arr is None or width == 0 or arr.size == 0:
            continue
        if arr.shape != (n, width):
            raise ValueError(f"{name} has shape {arr.shape}, expected ({n}, {width})")
        if name == "attr_vec":
            # one-hot attribute encodings would outweigh the unit-norm text vector in the content
            # projection's input geometry; each row's attribute block gets norm ATTR_NORM
            arr = ATTR_NORM * arr / np.maximum(np.linalg.norm(arr, axis=1, keepdims=True), 1e-6)
        out[:, lo:lo + width] = arr
    out[:, -1] = np.asarray(has_text, dtype=np.float32)
    return out.astype(np.float16)


def _recency_edges(age_days: np.ndarray) -> list[float]:
    """Bucket boundaries (days) at the 25/50/75% quantiles of visible edge ages."""
    if len(age_days) == 0:
        return [1.0, 7.0, 30.0]
    return [float(x) for x in np.quantile(age_days, [0.25, 0.5, 0.75])]


def load_graph(
    snapshot: Snapshot | Path | str,
    content_dir: Path | str,
    visible_splits: tuple[str, ...] = ("train",),
    stage_base: float = 4.0,
    half_life_days: float | None = None,
    meta_depth: int = 3,
    pair_power: float = 1.0,
) -> GraphStore:
    """Read a snapshot into a :class:`GraphStore`.

    Args:
        snapshot: prepare's ``graph/`` (a :class:`~hir.data.snapshot.Snapshot` or its directory).
        content_dir: enrich's ``content/``.
        visible_splits: engagement splits the contexts may see (training: only ``train``).
        stage_base: sampling weight of funnel stage r is ``stage_base ** r`` (deeper = likelier).
        half_life_days: recency decay of sampling weights; default the median visible edge age.
        meta_depth: hops of the forward metadata closure (category ancestors).
        pair_power: deep-funnel (user, entity) pairs, the contrastive positives, are drawn with
            probability ~ (deep-stage events of the pair) ** pair_power: 1 = as often as they
            happened (a weekly repeat purchase weighs 50 one-off ones), 0 = every pair alike.
    """
    snap = snapshot if isinstance(snapshot, Snapshot) else load_snapshot(snapshot)
    content_dir = Path(content_dir)
    types = ENTITY_TYPES
    counts = snap.node_counts
    offsets = np.cumsum([0] + [counts[t] for t in types]).astype(np.int64)
    n = int(offsets[-1])
    node_type = np.repeat(np.arange(len(types), dtype=np.int8), [counts[t] for t in types])
    stage_order = tuple(snap.stage_order)
    deep_stage = snap.deep_stage
    bounds = snap.split_bounds
    # contexts see edges up to the end of the visible window
    t_ref = _ts(bounds["test_start"] if "val" in visible_splits else bounds["val_start"])
    span_days = max((t_ref - _ts(bounds["min"])) / SECONDS_PER_DAY, 1e-6)
    stage_rank = pl.col("stage").replace_strict(list(stage_order), list(range(len(stage_order))), return_dtype=pl.Int8)

    pairs, deep, val, train_nodes = [], [], [], []
    for ti, t in enumerate(types):
        scan = snap.engagement(t)
        if scan is None:
            continue
        e = scan.select("src_id", "dst_id", "stage", "split", "count", "last_ts").with_columns(stage_rank.alias("rank"))
        dst_off = int(offsets[ti])
        vis = e.filter(pl.col("split").is_in(list(visible_splits)))
        is_deep = pl.col("stage") == deep_stage
        # one pass over the file: the four queries share its scan
        agg, deep_t, val_t, tr = pl.collect_all([
            vis.group_by("src_id", "dst_id").agg(pl.col("rank").max(), pl.col("count").sum(), pl.col("last_ts").max()),
            vis.filter(is_deep).group_by("src_id", "dst_id").agg(pl.col("count").sum().cast(pl.Float64))
            .sort("src_id", "dst_id").select("src_id", (pl.col("dst_id") + dst_off).alias("dst"), "count"),
            e.filter(is_deep & (pl.col("split") == "val")).select("src_id", (pl.col("dst_id") + dst_off).alias("dst")),
            e.filter(pl.col("split") == "train").select("src_id", "dst_id"),
        ])
        pairs.append(agg.with_columns(pl.lit(dst_off).alias("dst_off")))
        deep.append(deep_t.to_numpy())
        val.append(val_t.to_numpy())
        train_nodes += [tr["src_id"].to_numpy() + offsets[0], tr["dst_id"].to_numpy() + dst_off]
    if not pairs:
        raise InputError(f"{snap.dir / 'edges'}: no user__engages__<type>.parquet; the snapshot has no engagement")

    allp = pl.concat(pairs)
    u = allp["src_id"].to_numpy().astype(np.int64) + offsets[0]
    v = allp["dst_id"].to_numpy().astype(np.int64) + allp["dst_off"].to_numpy()
    rank = allp["rank"].to_numpy().astype(np.int8)
    cnt = allp["count"].to_numpy().astype(np.float64)
    last = allp["last_ts"].dt.epoch("us").to_numpy().astype(np.float64) / 1e6
    age_days = np.clip((t_ref - last) / SECONDS_PER_DAY, 0, None)
    rec_edges = _recency_edges(age_days)
    half_life = float(half_life_days or max(float(np.median(age_days)) if len(age_days) else 1.0, 1e-3))
    weight = stage_base ** rank * np.exp2(-age_days / half_life) * np.log1p(cnt)
    feats = {
        "stage": (rank + 1).astype(np.int8),
        "recency": (np.searchsorted(rec_edges, age_days) + 1).astype(np.int8),
        "count": np.log1p(cnt).astype(np.float32),
        "age": (age_days / span_days).astype(np.float32),
    }
    both = lambda a, b: np.concatenate([a, b])  # noqa: E731 - user->entity plus entity->user
    eng = CSR.build(n, both(u, v), both(v, u), both(weight, weight), **{k: both(x, x) for k, x in feats.items()})
    exposure = np.zeros(n, np.float64)
    np.add.at(exposure, u, cnt)
    np.add.at(exposure, v, cnt)

    up_src, up_dst = [], []
    for _, s_t, d_t, m in snap.metadata_edges():
        up_src.append(m["src_id"].to_numpy() + offsets[types.index(s_t)])
        up_dst.append(m["dst_id"].to_numpy() + offsets[types.index(d_t)])
    s1 = np.concatenate(up_src) if up_src else np.zeros(0, np.int64)
    d1 = np.concatenate(up_dst) if up_dst else np.zeros(0, np.int64)
    up = _closure(n, s1, d1, meta_depth)
    # nodes nobody engages with directly (categories, advertisers) inherit the popularity of
    # everything below them (a category: its products, through the closure)
    up_src = np.repeat(np.arange(n), np.diff(up.indptr))
    inherited = np.zeros(n, np.float64)
    np.add.at(inherited, up.dst, exposure[up_src])
    exposure = np.where(exposure > 0, exposure, inherited)
    down_w = 1.0 + np.log1p(exposure[s1])  # an advertiser's context favours its popular products
    down = CSR.build(n, d1, s1, down_w)

    warm = np.zeros(n, bool)
    warm[np.concatenate(train_nodes)] = True
    engaged_types = {int(t) for t in np.unique(node_type[warm])} | {0}
    # a type that never takes engagement is warm when linked to something warm (repeat: ancestors)
    meta_only = ~np.isin(node_type, list(engaged_types))
    for _ in range(meta_depth + 1):
        linked = np.zeros(n, bool)
        linked[d1[warm[s1]]] = True
        linked[s1[warm[d1]]] = True
        grown = warm | (meta_only & linked)
        if (grown == warm).all():
            break
        warm = grown

    content, layout = load_content(content_dir, types, counts)
    deep_rows = np.concatenate(deep) if deep else np.zeros((0, 3))
    deep_pairs = deep_rows[:, :2].astype(np.int64)
    deep_pairs[:, 0] += offsets[0]
    deep_weight = np.maximum(deep_rows[:, 2], 1.0) ** float(pair_power)
    val_pairs = np.concatenate(val).astype(np.int64) if val else np.zeros((0, 2), np.int64)
    val_pairs[:, 0] += offsets[0]
    deep_degree = np.bincount(deep_pairs[:, 1], weights=deep_weight, minlength=n).astype(np.float32)
    spec = {
        "n_types": len(types), "n_stages": len(stage_order), "content_dim": layout["dim"], "n_recency": N_RECENCY,
        "n_nodes": n,
    }
    log.info(
        "graph: %d nodes %s; %d visible engagement pairs (%s), %d deep pairs, %d val deep pairs; "
        "recency buckets at %s days, half-life %.3g days; content %d-d",
        n, {t: c for t, c in counts.items() if c}, len(u), "+".join(visible_splits), len(deep_pairs),
        len(val_pairs), [round(x, 3) for x in rec_edges], half_life, layout["dim"],
    )
    return GraphStore(
        types=types, offsets=offsets, node_type=node_type, content=content, exposure=exposure.astype(np.float32),
        warm=warm, eng=eng, up=up, down=down, deep_pairs=deep_pairs, deep_weight=deep_weight, deep_degree=deep_degree,
        val_pairs=val_pairs,
        stage_order=stage_order, deep_stage=deep_stage, spec=spec, layout=layout, split_bounds=bounds,
        visible_end=bounds["test_start"] if "val" in visible_splits else bounds["val_start"],
    )


def _closure(n: int, src: np.ndarray, dst: np.ndarray, depth: int) -> CSR:
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
