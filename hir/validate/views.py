"""Derived per-row columns that Great Expectations can check.

GE 1.24 cannot look inside list cells (its length expectations flag every row, its range
expectations raise on lists; ../shared/STACK.md section 7), so every list property becomes a
scalar column here: ``emb_len``, ``emb_finite``, ``emb_norm``, ``tok_min_l0`` ... Each view keeps
an ``id`` column (the entity key, or the row number of an event/edge) so a failed expectation
can name example rows. Pure functions of frames; no GE import.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from hir.data.schema import SPLITS, TS
from hir.data.snapshot import Snapshot, load_snapshot

# a sampled row is compared with at most this many rows of its table (all of them below it)
TWIN_POOL = 200_000


def as_lists(frame: pl.DataFrame) -> pl.DataFrame:
    """Fixed-size ``Array`` columns (what some writers produce) as ``List``, so one code path
    reads both."""
    arrays = [c for c, t in frame.schema.items() if isinstance(t, pl.Array)]
    return frame.with_columns(pl.col(c).cast(pl.List(frame.schema[c].inner)) for c in arrays) if arrays else frame


def _finite(col: str) -> pl.Expr:
    """True when the list is non-null and every element is a finite number."""
    return pl.col(col).list.eval(pl.element().is_finite().fill_null(False)).list.all().fill_null(False)


def embedding_view(frame: pl.DataFrame, graph_nodes: pl.DataFrame, n_levels: int,
                   twin_tolerance: float | None = None, twin_sample: int = 4000,
                   contexts: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per embedding row with scalar checks.

    Args:
        frame: an ``embeddings/<type>.parquet`` table (``embedding`` list<f32> (dim,),
            ``tokens_l<k>`` list<i32> (top_k,), ``weights_l<k>`` list<f32> (top_k,)).
        graph_nodes: the snapshot's ``nodes/<type>.parquet`` (``node_id``, ``key``).
        n_levels: hierarchy levels to derive (only those whose columns exist are derived).
        twin_tolerance: with a value, add ``emb_no_twin`` (:func:`twin_view`).
        twin_sample: rows checked for near twins.
        contexts: :func:`context_labels` (``entity_type``, ``node_id``, ``context``): twins with
            one context are not counted (:func:`twin_view`).

    Returns:
        ``id`` (entity_id), the scalar source columns, ``in_graph`` (the key exists in the
        snapshot with the same node_id), ``emb_len``/``emb_finite``/``emb_norm``/``emb_distinct``
        (no other row has exactly the same vector), ``emb_no_twin`` (see above) and per level
        ``tok_len/tok_min/tok_max/tok_distinct/w_len_ok/w_sum/w_min/w_finite``.
    """
    frame = as_lists(frame)
    cols = set(frame.columns)
    exprs: list[pl.Expr] = [pl.col("entity_id").alias("id")]
    exprs += [pl.col(c) for c in ("node_id", "entity_type", "model_version", "cold_start") if c in cols]
    if "embedding" in cols:
        emb = pl.col("embedding")
        exprs += [
            emb.list.len().alias("emb_len"),
            _finite("embedding").alias("emb_finite"),
            emb.list.eval(pl.element().cast(pl.Float64).pow(2)).list.sum().sqrt().alias("emb_norm"),
            # another row has exactly this vector (the model could not tell the entities apart)
            (~emb.is_duplicated() | emb.is_null()).alias("emb_distinct"),
        ]
    for k in range(n_levels):
        tok, w = f"tokens_l{k}", f"weights_l{k}"
        if tok in cols:
            exprs += [
                pl.col(tok).list.len().alias(f"tok_len_l{k}"),
                # int64, not the tokens' int32: GE 1.24 checks a range on int64 / float64 columns
                # vectorised and on any other dtype one Python call per row (same verdicts)
                pl.col(tok).list.min().cast(pl.Int64).alias(f"tok_min_l{k}"),
                pl.col(tok).list.max().cast(pl.Int64).alias(f"tok_max_l{k}"),
                (pl.col(tok).list.n_unique() == pl.col(tok).list.len()).alias(f"tok_distinct_l{k}"),
            ]
        if w in cols:
            exprs += [
                pl.col(w).list.eval(pl.element().cast(pl.Float64)).list.sum().alias(f"w_sum_l{k}"),
                pl.col(w).list.min().cast(pl.Float64).alias(f"w_min_l{k}"),
                _finite(w).alias(f"w_finite_l{k}"),
            ]
        if tok in cols and w in cols:
            exprs.append((pl.col(w).list.len() == pl.col(tok).list.len()).fill_null(False).alias(f"w_len_ok_l{k}"))
    view = frame.select(exprs)
    if twin_tolerance is not None:
        labels = None
        if contexts is not None and "node_id" in cols and "entity_type" in cols:
            ctx = frame.select("entity_type", "node_id").join(contexts, on=["entity_type", "node_id"], how="left",
                                                               maintain_order="left")["context"]
            # a node without edges is a context of its own
            labels = np.where(ctx.is_null().to_numpy(), -1 - frame["node_id"].to_numpy().astype(np.int64),
                              ctx.fill_null(0).to_numpy().astype(np.int64))
        view = view.with_columns(twin_view(frame, twin_tolerance, twin_sample, labels=labels))
    if "node_id" in cols:
        keys = graph_nodes.select(pl.col("key").cast(pl.String).alias("id"), pl.col("node_id").alias("_graph_node"))
        view = view.join(keys, on="id", how="left", coalesce=True, maintain_order="left").with_columns(
            (pl.col("_graph_node") == pl.col("node_id")).fill_null(False).alias("in_graph")
        ).drop("_graph_node")
    return view


def matrix(frame: pl.DataFrame, column: str = "embedding") -> np.ndarray | None:
    """A list<float> column as an (n, dim) float32 matrix, or None when the rows are not all
    present with one length (the schema and length checks report that)."""
    col = as_lists(frame.select(column))[column]
    lens = col.list.len()
    if frame.height == 0 or col.null_count() or lens.min() != lens.max() or not lens.max():
        return None
    return col.list.to_array(int(lens.max())).to_numpy().astype(np.float32)


def semantic_part(z: np.ndarray) -> np.ndarray:
    """(n, dim) embeddings -> (n, dim - 1): every coordinate but the last, which carries a
    per-entity prior or scale (docs/contracts.md, embeddings). Two entities that differ only there
    are the same to anything that compares their meaning."""
    return z[:, :-1] if z.ndim == 2 and z.shape[1] > 1 else z


def nearest_cosine(z: np.ndarray, query: np.ndarray, pool: np.ndarray, labels: np.ndarray | None = None,
                   block: int = 8192) -> np.ndarray:
    """Per row index in ``query``, the highest cosine to a row of ``pool`` (row indices of ``z``,
    (n, dim)) other than itself; with ``labels`` (n,), only to rows whose label differs from its
    own. -2 where there is no such row. Non-finite rows compare as -2; all-zero rows are one
    direction of their own (twins of each other, of nothing else)."""
    norms = np.linalg.norm(z, axis=1, keepdims=True)
    zero = (norms < 1e-6) & np.isfinite(norms)
    unit = np.concatenate([z / norms.clip(1e-12) * ~zero, zero.astype(z.dtype)], axis=1)  # (n, dim + 1)
    # a row is finite or all NaN, so a cosine is NaN exactly where its query or pool row is: those
    # rows and columns are set to -2 below (cheaper than scanning every (Q, B) block for NaN)
    bad = ~np.isfinite(unit).all(1)
    unit = np.where(bad[:, None], np.nan, unit)
    best = np.full(len(query), -2.0, np.float64)
    if not len(query):
        return best
    q = unit[query]  # (Q, dim)
    q_bad = bad[query]
    order = np.argsort(query, kind="stable")
    distinct = bool((np.diff(query[order]) != 0).all())
    for start in range(0, len(pool), block):
        cols = pool[start:start + block]
        sims = q @ unit[cols].T  # (Q, B)
        sims[q_bad] = -2.0
        sims[:, bad[cols]] = -2.0
        # a row is not its own twin: the (query, column) cells holding the same row, O(B) when the
        # query rows are distinct (both callers sample without replacement)
        if distinct:
            at = np.minimum(np.searchsorted(query, cols, sorter=order), len(query) - 1)
            hit = query[order[at]] == cols
            sims[order[at[hit]], np.flatnonzero(hit)] = -2.0
        else:
            sims[query[:, None] == cols[None, :]] = -2.0
        if labels is not None:
            sims[labels[query][:, None] == labels[cols][None, :]] = -2.0
        # the max of the block's values, widened after: the same number as widening first
        best = np.maximum(best, sims.max(1, initial=-2.0).astype(np.float64))
    return best


def _sample(idx: np.ndarray, n: int, seed: int) -> np.ndarray:
    """A seeded, sorted subset of at most ``n`` of ``idx`` (all of them when fewer)."""
    if len(idx) <= n:
        return idx
    return np.sort(np.random.default_rng(seed).choice(idx, n, replace=False))


def twin_view(frame: pl.DataFrame, tolerance: float, sample: int, seed: int = 0,
              labels: np.ndarray | None = None) -> pl.Series:
    """``emb_no_twin`` per row: for a seeded sample of at most ``sample`` rows *with engagement*
    (``cold_start`` false), True when no other row of the table has (nearly) the same vector
    (cosine >= 1 - ``tolerance``); null for the other rows. A model that collapsed gives every
    entity about one vector; entities it learned from engagement are told apart otherwise (cold
    ones without distinguishing content may legitimately share one, so they are left to
    :func:`coverage_view`).

    ``labels`` (n,): the rows' engagement contexts (:func:`context_labels`). A twin with the
    same context does not count: two products viewed by the same one user, or two users who
    bought the same one product, have identical collaborative evidence and a model that embeds
    them alike is right, not collapsed (measured on rees46: 59% of the engaged products and 27%
    of the users have such a twin under the spectral base)."""
    out = np.full(frame.height, None, dtype=object)
    z = matrix(frame) if "embedding" in frame.columns else None
    if z is not None:
        warm = ~frame["cold_start"].fill_null(False).to_numpy() if "cold_start" in frame.columns \
            else np.ones(frame.height, bool)
        query = _sample(np.flatnonzero(warm), sample, seed)
        if len(query):
            pool = _sample(np.arange(frame.height), TWIN_POOL, seed + 1)
            pool = np.union1d(pool, query)
            out[query] = nearest_cosine(semantic_part(z), query, pool, labels) < 1 - tolerance
    return pl.Series("emb_no_twin", out.tolist(), dtype=pl.Boolean)


def coverage_view(graph_nodes: pl.DataFrame, frame: pl.DataFrame, emb_view: pl.DataFrame, test_start: object,
                  tolerance: float = 1e-4, sample: int = 4000, seed: int = 0) -> pl.DataFrame:
    """One row per snapshot entity: ``id`` (key), ``cold`` (first event in the test period),
    ``has_row`` (the export has a row for it), ``has_embedding`` (that row's embedding is present
    and finite) and ``covered``: for cold-start entities with text (a seeded sample of at most
    ``sample``), True when no cold-start entity with a *different* text has (nearly) the same
    vector (cosine >= 1 - ``tolerance`` of the :func:`semantic_part`), i.e. the model told it apart
    from its content; null for
    the others. Cold-start embeddings that all collapsed onto a few vectors are not covered.

    Args:
        graph_nodes: the snapshot's ``nodes/<type>.parquet`` (``key``, ``first_seen``, ``text``).
        frame: the export table (``entity_id``, ``embedding``).
        emb_view: :func:`embedding_view` of ``frame`` (``id``, ``emb_finite``).
    """
    nodes = graph_nodes.select(
        pl.col("key").cast(pl.String).alias("id"),
        (pl.col("first_seen") >= pl.lit(test_start, TS)).fill_null(False).alias("cold"),
        (pl.col("text") if "text" in graph_nodes.columns else pl.lit(None, pl.String)).alias("_text"),
    )
    usable = emb_view.select("id", pl.col("emb_finite") if "emb_finite" in emb_view.columns else pl.lit(False))
    usable = usable.rename({usable.columns[1]: "has_embedding"}).unique("id").with_columns(pl.lit(True).alias("has_row"))
    view = nodes.join(usable, on="id", how="left", maintain_order="left").with_columns(
        pl.col("has_row", "has_embedding").fill_null(False))
    covered = np.full(view.height, None, dtype=object)
    cold = view.filter(pl.col("cold") & pl.col("_text").is_not_null() & pl.col("has_embedding")).with_row_index("_i")
    rows = frame.select(pl.col("entity_id").cast(pl.String).alias("id"), "embedding").unique("id")
    cold = cold.join(rows, on="id", how="inner", maintain_order="left")
    z = matrix(cold) if cold.height else None
    if z is not None:
        position = {k: i for i, k in enumerate(view["id"].to_list())}
        labels = cold["_text"].cast(pl.Categorical).to_physical().to_numpy()
        query = _sample(np.arange(cold.height), sample, seed)
        best = nearest_cosine(semantic_part(z), query, np.arange(cold.height), labels)
        ids = cold["id"].to_list()
        for q, b in zip(query, best):
            covered[position[ids[q]]] = bool(b < 1 - tolerance)
    return view.drop("_text").with_columns(pl.Series("covered", covered.tolist(), dtype=pl.Boolean))


def schema_view(frame_schema: dict[str, pl.DataType], expected: dict[str, str]) -> pl.DataFrame:
    """One row per expected column: ``id`` (column name), ``present``, ``dtype``, ``dtype_ok``.

    ``expected`` maps column -> a dtype family: ``str``, ``int``, ``bool``, ``datetime``,
    ``list<float>``, ``list<int>``.
    """
    rows = []
    for col, family in expected.items():
        dtype = frame_schema.get(col)
        rows.append({"id": col, "present": dtype is not None, "dtype": str(dtype), "expected": family,
                     "dtype_ok": dtype is not None and _family(dtype) == family})
    return pl.DataFrame(rows, schema={"id": pl.String, "present": pl.Boolean, "dtype": pl.String,
                                      "expected": pl.String, "dtype_ok": pl.Boolean})


def _family(dtype: pl.DataType) -> str:
    if isinstance(dtype, pl.List | pl.Array):
        inner = _family(dtype.inner)
        return f"list<{inner}>"
    if dtype.is_float():
        return "float"
    if dtype.is_integer():
        return "int"
    if dtype == pl.Boolean:
        return "bool"
    if isinstance(dtype, pl.Datetime):
        return "datetime"
    if dtype in (pl.String, pl.Categorical):
        return "str"
    return str(dtype)


def _categorical(*cols: str) -> list[pl.Expr]:
    """Low-cardinality text as Categorical: pandas reads it as `category`, which halves GE's time
    on millions of event rows (set and null checks run on the codes)."""
    return [pl.col(c).cast(pl.Categorical) for c in cols]


def events_view(events: pl.LazyFrame, nodes: dict[str, int], bounds: dict[str, object]) -> pl.DataFrame:
    """``graph/events.parquet`` with ``id`` (0-based row), and checks that the row's ids fall in
    the snapshot's node ranges (``user_ok``, ``entity_ok``) and its split agrees with its
    timestamp and the split bounds of meta.json (``split_ok``)."""
    val_start, test_start = pl.lit(bounds["val_start"], TS), pl.lit(bounds["test_start"], TS)
    expected_split = (
        pl.when(pl.col("timestamp") >= test_start).then(pl.lit("test"))
        .when(pl.col("timestamp") >= val_start).then(pl.lit("val"))
        .otherwise(pl.lit("train"))
    )
    n_of_type = pl.col("entity_type").replace_strict(nodes, default=0, return_dtype=pl.Int64)
    return (
        events.with_row_index("id")
        .select(
            "id", "user_id", "entity_id", *_categorical("entity_type", "stage", "split"), "timestamp",
            pl.col("user_id").is_between(0, nodes.get("user", 0) - 1).fill_null(False).alias("user_ok"),
            ((pl.col("entity_id") >= 0) & (pl.col("entity_id") < n_of_type)).fill_null(False).alias("entity_ok"),
            (pl.col("split") == expected_split).fill_null(False).alias("split_ok"),
        )
        .collect()
    )


def split_view(events: pl.LazyFrame) -> pl.DataFrame:
    """``id`` (split name), ``events`` and ``share`` of all events, one row per split (zeros kept)."""
    counts = events.group_by("split").agg(pl.len().alias("events")).collect()
    total = max(int(counts["events"].sum()), 1)
    have = dict(counts.iter_rows())
    return pl.DataFrame(
        {"id": list(SPLITS), "events": [int(have.get(s, 0)) for s in SPLITS]},
        schema={"id": pl.String, "events": pl.Int64},
    ).with_columns((pl.col("events") / total).alias("share"))


def sources_view(meta: dict) -> pl.DataFrame:
    """One row per input source of meta.json (events and entity tables) plus ``all events``:
    ``quarantine_share`` and ``accounting_ok`` (input = kept + quarantined)."""
    rows = []
    for kind in ("sources", "entity_sources"):
        for name, rep in (meta.get(kind) or {}).items():
            rows.append((name, rep["input_rows"], rep["kept_rows"], rep["quarantined_rows"]))
    rows.append(("all events", meta["input_rows"], meta["kept_rows"], meta["quarantined_rows"]))
    return pl.DataFrame(rows, schema={"id": pl.String, "input_rows": pl.Int64, "kept_rows": pl.Int64,
                                      "quarantined_rows": pl.Int64}, orient="row").with_columns(
        (pl.col("quarantined_rows") / pl.col("input_rows").clip(lower_bound=1)).alias("quarantine_share"),
        (pl.col("input_rows") == pl.col("kept_rows") + pl.col("quarantined_rows")).alias("accounting_ok"),
    )


def edges_view(edges: pl.LazyFrame, n_src: int, n_dst: int) -> pl.DataFrame:
    """An edge table with ``id`` (0-based row) and ``src_ok``/``dst_ok`` (ids in node range)."""
    names = edges.collect_schema().names()
    extra = [c for c in ("stage", "split") if c in names]
    return edges.with_row_index("id").select(
        "id", "src_id", "dst_id", *_categorical(*extra),
        pl.col("src_id").is_between(0, n_src - 1).fill_null(False).alias("src_ok"),
        pl.col("dst_id").is_between(0, n_dst - 1).fill_null(False).alias("dst_ok"),
    ).collect()


def context_labels(graph: Snapshot | Path, visible_splits: list[str] | None = None, depth: int = 3) -> pl.DataFrame:
    """``entity_type``, ``node_id`` (the type's local id), ``context``: an int64 label equal for
    two nodes of a type with the same engagement evidence, the input of their spectral base.

    A node with engagement edges (in ``visible_splits``; default every split): the set of nodes at
    the other end (an entity's users, a user's entities). A node without: the set of its members'
    labels through the metadata edges (an advertiser's or a category's products, a parent
    category's children), ``depth`` levels up, as the base of such a node is its members' mean.
    Nodes with neither have no row.

    ``graph``: the snapshot, or its directory (only its edge tables are read; meta.json may be absent).
    """
    snap = graph if isinstance(graph, Snapshot) else load_snapshot(graph, strict=False)
    own: list[pl.DataFrame] = []
    meta: list[pl.DataFrame] = []
    for rel in snap.relations():
        parts = rel.split("__")
        if len(parts) != 3:
            continue
        s_t, _, d_t = parts
        lf = snap.scan_edges(rel)
        cols = lf.collect_schema().names()
        if "split" in cols:
            if visible_splits is not None:
                lf = lf.filter(pl.col("split").is_in(list(visible_splits)))
            e = lf.select(pl.col("src_id").cast(pl.Int64), pl.col("dst_id").cast(pl.Int64)).unique().collect()
            own.append(e.select(pl.lit(d_t).alias("entity_type"), pl.col("dst_id").alias("node_id"),
                                (pl.col("src_id").hash(1) ^ pl.lit(s_t).hash(2)).alias("t")))
            own.append(e.select(pl.lit(s_t).alias("entity_type"), pl.col("src_id").alias("node_id"),
                                (pl.col("dst_id").hash(1) ^ pl.lit(d_t).hash(2)).alias("t")))
        else:
            meta.append(lf.select(pl.lit(s_t).alias("m_type"), pl.col("src_id").cast(pl.Int64).alias("m_id"),
                                  pl.lit(d_t).alias("entity_type"), pl.col("dst_id").cast(pl.Int64).alias("node_id"))
                        .unique().collect())
    schema = {"entity_type": pl.String, "node_id": pl.Int64, "context": pl.Int64}
    if not own:
        return pl.DataFrame(schema=schema)

    def digest(frame: pl.DataFrame) -> pl.DataFrame:
        # equal sets <=> equal sorted lists of per-element hashes (up to hash collisions)
        sets = frame.group_by("entity_type", "node_id").agg(pl.col("t").unique().sort())
        return sets.select("entity_type", "node_id", (pl.col("t").hash(3) & ((1 << 62) - 1)).cast(pl.Int64).alias("context"))

    labels = digest(pl.concat(own))
    links = pl.concat(meta) if meta else None
    for _ in range(depth if links is not None else 0):
        members = links.join(labels.rename({"entity_type": "m_type", "node_id": "m_id", "context": "t"}),
                             on=["m_type", "m_id"], how="inner")
        fresh = digest(members.select("entity_type", "node_id", pl.col("t").cast(pl.UInt64)))
        fresh = fresh.join(labels, on=["entity_type", "node_id"], how="anti")  # own engagement wins
        if fresh.height == 0:
            break
        labels = pl.concat([labels, fresh])
    return labels.select(pl.col("entity_type").cast(pl.String), "node_id", "context")
