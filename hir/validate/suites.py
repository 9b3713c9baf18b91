"""The expectation suites: which checks run on which (derived) table.

A :class:`Table` is a frame (built by :mod:`hir.validate.views`, always with an ``id`` column)
plus its expectations. Every expectation carries ``meta = {"column": <the source column it is
about>, "check": <what it asserts, in words>}`` so a failure can be reported against the column
the user knows (``embedding``), not the derived one (``emb_finite``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import great_expectations.expectations as gxe
import polars as pl
from great_expectations.expectations.row_conditions import Column

from hir.data.schema import ENTITY_TYPES, SPLITS


@dataclass
class Table:
    """One GE data asset + suite. ``name`` is GE-safe; ``source`` is what the user sees."""

    name: str
    source: str
    frame: pl.DataFrame
    expectations: list[gxe.Expectation] = field(default_factory=list)


def _e(cls: type, about: str, check: str, examples: list[str] | None = None, **kw: Any) -> gxe.Expectation:
    """``cls(**kw)`` with meta naming the source column ``about`` and the ``check`` in words."""
    meta: dict[str, Any] = {"column": about, "check": check}
    if examples:
        meta["examples"] = examples
    return cls(meta=meta, **kw)


def flag(column: str, about: str, check: str, mostly: float = 1.0) -> gxe.Expectation:
    """The derived boolean ``column`` is True (for at least ``mostly`` of the rows)."""
    return _e(gxe.ExpectColumnValuesToBeInSet, about, check, column=column, value_set=[True], mostly=mostly)


def _not_null(*cols: str) -> list[gxe.Expectation]:
    return [_e(gxe.ExpectColumnValuesToNotBeNull, c, "not null", column=c) for c in cols]


def events_table(view: pl.DataFrame, stages: list[str], ts_min: datetime, ts_max: datetime) -> Table:
    """``graph/events.parquet``: keys present, stages/splits/types known, timestamps in range,
    ids inside the node tables, split consistent with the timestamp."""
    return Table("graph_events", "graph/events.parquet", view, [
        *_not_null("user_id", "entity_id", "entity_type", "stage", "split", "timestamp"),
        _e(gxe.ExpectColumnValuesToBeInSet, "stage", f"stage in the configured set {stages}",
           column="stage", value_set=list(stages)),
        _e(gxe.ExpectColumnValuesToBeInSet, "split", f"split in {list(SPLITS)}", column="split", value_set=list(SPLITS)),
        _e(gxe.ExpectColumnValuesToBeInSet, "entity_type", f"entity type in {list(ENTITY_TYPES)}",
           column="entity_type", value_set=list(ENTITY_TYPES)),
        _e(gxe.ExpectColumnValuesToBeBetween, "timestamp", f"timestamp within [{ts_min}, {ts_max}]",
           column="timestamp", min_value=ts_min, max_value=ts_max),
        flag("user_ok", "user_id", "user_id is a node id of nodes/user.parquet"),
        flag("entity_ok", "entity_id", "entity_id is a node id of nodes/<entity_type>.parquet"),
        flag("split_ok", "split", "split agrees with the timestamp and meta.json split_bounds"),
    ])


def splits_table(view: pl.DataFrame, share: dict[str, tuple[float, float]]) -> Table:
    """Share of events per split within the configured bounds."""
    exps = []
    for split, (lo, hi) in share.items():
        exps.append(_e(gxe.ExpectColumnValuesToBeBetween, "split", f"{split} share of events within [{lo}, {hi}]",
                       column="share", min_value=lo, max_value=hi, row_condition=Column("id") == split))
    return Table("graph_splits", "graph/events.parquet (split shares)", view, exps)


def sources_table(view: pl.DataFrame, max_share: float) -> Table:
    """Quarantined share of every input source under the limit; row accounting adds up."""
    return Table("graph_sources", "graph/meta.json (sources)", view, [
        _e(gxe.ExpectColumnValuesToBeBetween, "quarantined_rows", f"quarantined share <= {max_share}",
           column="quarantine_share", min_value=0.0, max_value=max_share),
        flag("accounting_ok", "input_rows", "input_rows = kept_rows + quarantined_rows"),
    ])


def nodes_table(etype: str, frame: pl.DataFrame, n_meta: int) -> Table:
    """``nodes/<type>.parquet``: dense node ids 0..n-1, unique non-null keys, count = meta.json."""
    view = frame.select(pl.col("key").cast(pl.String).alias("id"), "node_id")
    return Table(f"graph_nodes_{etype}", f"graph/nodes/{etype}.parquet", view, [
        *_not_null("id", "node_id"),
        _e(gxe.ExpectColumnValuesToBeUnique, "key", "unique", column="id"),
        _e(gxe.ExpectColumnValuesToBeUnique, "node_id", "unique", column="node_id"),
        _e(gxe.ExpectColumnValuesToBeBetween, "node_id", f"dense ids in [0, {n_meta - 1}]",
           column="node_id", min_value=0, max_value=max(n_meta - 1, 0)),
        _e(gxe.ExpectTableRowCountToEqual, "*", f"row count = meta.json nodes.{etype}", value=n_meta),
    ])


def edges_table(rel: str, view: pl.DataFrame, stages: list[str]) -> Table:
    """``edges/<rel>.parquet``: endpoints inside the node tables (and known stage/split)."""
    exps = [*_not_null("src_id", "dst_id"),
            flag("src_ok", "src_id", "src_id is a node id of the source type"),
            flag("dst_ok", "dst_id", "dst_id is a node id of the destination type")]
    if "stage" in view.columns:
        exps.append(_e(gxe.ExpectColumnValuesToBeInSet, "stage", f"stage in {stages}", column="stage", value_set=stages))
    if "split" in view.columns:
        exps.append(_e(gxe.ExpectColumnValuesToBeInSet, "split", f"split in {list(SPLITS)}",
                       column="split", value_set=list(SPLITS)))
    return Table(f"graph_edges_{rel}", f"graph/edges/{rel}.parquet", view, exps)


def embedding_schema_table(etype: str, view: pl.DataFrame) -> Table:
    """The contract's columns exist with the right dtype family (see views.schema_view)."""
    return Table(f"embeddings_{etype}_columns", f"embeddings/{etype}.parquet (columns)", view, [
        flag("present", "*", "column of docs/contracts.md present"),
        flag("dtype_ok", "*", "column dtype as in docs/contracts.md"),
    ])


def embedding_table(
    etype: str,
    view: pl.DataFrame,
    n_entities: int,
    dim: int,
    levels: list[int],
    top_k: int | list[int] | None,
    model_version: str,
    norm_tol: float,
    wsum_tol: float,
    max_dup: float = 1.0,
) -> Table:
    """``embeddings/<type>.parquet`` (as :func:`views.embedding_view`): one row per snapshot
    entity, unique ids, embedding of ``dim`` finite values with norm 1 ± ``norm_tol`` (and at most
    ``max_dup`` of the sampled rows with engagement with a near twin, ``emb_no_twin``), tokens in
    each level's vocabulary, weights finite, non-negative, summing to 1 ± ``wsum_tol``."""
    cols = set(view.columns)
    exps = [
        _e(gxe.ExpectTableRowCountToEqual, "*", f"one row per snapshot entity (graph/meta.json nodes.{etype})",
           value=n_entities),
        *_not_null("id"),
        _e(gxe.ExpectColumnValuesToBeUnique, "entity_id", "unique", column="id"),
    ]
    if "node_id" in cols:
        exps.append(_e(gxe.ExpectColumnValuesToBeUnique, "node_id", "unique", column="node_id"))
    if "in_graph" in cols:
        exps.append(flag("in_graph", "entity_id", f"(entity_id, node_id) is a node of graph/nodes/{etype}.parquet"))
    if "entity_type" in cols:
        exps.append(_e(gxe.ExpectColumnValuesToBeInSet, "entity_type", f"= {etype!r}", column="entity_type",
                       value_set=[etype]))
    if "model_version" in cols:
        exps.append(_e(gxe.ExpectColumnValuesToBeInSet, "model_version", f"= embeddings/meta.json {model_version!r}",
                       column="model_version", value_set=[model_version]))
    if "emb_len" in cols:
        exps += [
            _e(gxe.ExpectColumnValuesToNotBeNull, "embedding", "not null", column="emb_len"),
            _e(gxe.ExpectColumnValuesToBeInSet, "embedding", f"length = {dim}", column="emb_len", value_set=[dim]),
            flag("emb_finite", "embedding", "all values finite"),
            _e(gxe.ExpectColumnValuesToBeBetween, "embedding", f"L2 norm within 1 ± {norm_tol}",
               column="emb_norm", min_value=1 - norm_tol, max_value=1 + norm_tol),
        ]
    if "emb_no_twin" in cols:
        # a collapsed model gives many entities about one vector; entities it learned from
        # engagement never share one otherwise (cold ones are checked by coverage_table)
        exps.append(flag("emb_no_twin", "embedding", f"at most {max_dup:.0%} of the entities with engagement "
                         "(cold_start false) have a near-identical vector with a different engagement context "
                         "(a collapsed model)", mostly=1 - max_dup))
    for k, vocab in enumerate(levels):
        tok, w = f"tokens_l{k}", f"weights_l{k}"
        if f"tok_len_l{k}" in cols:
            want = top_k[k] if isinstance(top_k, list) and k < len(top_k) else top_k
            if isinstance(want, int) and want > 0:
                exps.append(_e(gxe.ExpectColumnValuesToBeInSet, tok, f"{want} tokens (meta.json top_k)",
                               column=f"tok_len_l{k}", value_set=[want]))
            exps += [
                _e(gxe.ExpectColumnValuesToNotBeNull, tok, "not null", column=f"tok_len_l{k}"),
                _e(gxe.ExpectColumnValuesToBeBetween, tok, "token ids >= 0", column=f"tok_min_l{k}", min_value=0),
                _e(gxe.ExpectColumnValuesToBeBetween, tok, f"token ids < level-{k} vocabulary {vocab}",
                   column=f"tok_max_l{k}", max_value=vocab - 1),
                flag(f"tok_distinct_l{k}", tok, "no repeated token in a row"),
            ]
        if f"w_sum_l{k}" in cols:
            exps += [
                flag(f"w_finite_l{k}", w, "all weights finite"),
                _e(gxe.ExpectColumnValuesToBeBetween, w, "weights >= 0", column=f"w_min_l{k}", min_value=0.0),
                _e(gxe.ExpectColumnValuesToBeBetween, w, f"weights sum to 1 ± {wsum_tol}", column=f"w_sum_l{k}",
                   min_value=1 - wsum_tol, max_value=1 + wsum_tol),
            ]
        if f"w_len_ok_l{k}" in cols:
            exps.append(flag(f"w_len_ok_l{k}", w, f"one weight per token of {tok}"))
    return Table(f"embeddings_{etype}", f"embeddings/{etype}.parquet", view, exps)


def coverage_table(etype: str, view: pl.DataFrame, min_coverage: float) -> Table:
    """Every snapshot entity has a row; every cold-start one (first event in the test period) a
    finite embedding; and at least ``min_coverage`` of the cold-start ones with text an embedding
    that no cold-start entity with another text shares (``covered``, :func:`views.coverage_view`)."""
    exps = [flag("has_row", "entity_id", f"every entity of graph/nodes/{etype}.parquet has a row")]
    if view["cold"].any():
        exps.append(_e(gxe.ExpectColumnValuesToBeInSet, "embedding", "every cold-start entity has a finite embedding",
                       column="has_embedding", value_set=[True],
                       row_condition=Column("cold") == True))  # noqa: E712 (a GX condition, not a test)
    if "covered" in view.columns and view["covered"].drop_nulls().len():
        exps.append(flag("covered", "embedding", f"at least {min_coverage:.0%} of the cold-start entities with text "
                         "have a vector no cold-start entity with another text shares (told apart by content)",
                         mostly=min_coverage))
    return Table(f"embeddings_{etype}_coverage", f"embeddings/{etype}.parquet (coverage of the snapshot)", view, exps)


def meta_table(view: pl.DataFrame, expected_dim: int) -> Table:
    """``embeddings/meta.json`` agrees with the files (per-type counts) and the configured dim."""
    return Table("embeddings_meta", "embeddings/meta.json", view, [
        _e(gxe.ExpectColumnValuesToBeInSet, "dim", f"= configured dimension {expected_dim}", column="dim",
           value_set=[expected_dim]),
        flag("count_ok", "counts", "counts.<type> = rows of embeddings/<type>.parquet"),
        flag("file_ok", "counts", "every type in counts has a file and every file a count"),
        flag("type_ok", "counts", "entity type exists in the snapshot (graph/meta.json nodes)"),
    ])


def drift_table(etype: str, view: pl.DataFrame, min_cosine: float | None, min_jaccard: float | None,
                worst: int) -> Table | None:
    """Mean cosine / token Jaccard on shared ids at or above the configured minima; None when
    no gate is configured (drift is still reported in result.json)."""
    exps = []
    if min_cosine is not None:
        worst_ids = view.sort("cosine", nulls_last=False).head(worst)["id"].to_list()
        exps.append(_e(gxe.ExpectColumnMeanToBeBetween, "embedding",
                       f"mean cosine to the live version >= {min_cosine}", examples=worst_ids,
                       column="cosine", min_value=min_cosine))
    if min_jaccard is not None:
        for col in (c for c in view.columns if c.startswith("jaccard_l")):
            worst_ids = view.sort(col).head(worst)["id"].to_list()
            exps.append(_e(gxe.ExpectColumnMeanToBeBetween, f"tokens_{col.removeprefix('jaccard_')}",
                           f"mean token Jaccard to the live version >= {min_jaccard}", examples=worst_ids,
                           column=col, min_value=min_jaccard))
    if not exps:
        return None
    return Table(f"drift_{etype}", f"embeddings/{etype}.parquet (drift vs live)", view, exps)
