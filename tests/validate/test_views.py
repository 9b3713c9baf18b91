"""Derived check columns on hand-built frames (no Great Expectations involved)."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import polars as pl
import pytest

from hir.validate import views
from hir.validate.drift import drift_summary, drift_view

S = 1 / math.sqrt(2)


def _emb(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={
        "entity_id": pl.String, "node_id": pl.Int64, "embedding": pl.List(pl.Float32),
        "tokens_l0": pl.List(pl.Int32), "weights_l0": pl.List(pl.Float32),
    })


GRAPH = pl.DataFrame({"node_id": [0, 1, 2, 3], "key": ["a", "b", "c", "d"],
                      "first_seen": [datetime(2024, 1, d, tzinfo=UTC) for d in (1, 2, 9, 10)]})


def test_embedding_view_flags_each_defect() -> None:
    frame = _emb([
        {"entity_id": "a", "node_id": 0, "embedding": [S, S], "tokens_l0": [1, 2], "weights_l0": [0.75, 0.25]},
        {"entity_id": "b", "node_id": 1, "embedding": [1.0, float("nan")], "tokens_l0": [3, 3], "weights_l0": [0.5, 0.6]},
        {"entity_id": "c", "node_id": 7, "embedding": [1.0, 1.0, 0.0], "tokens_l0": [0], "weights_l0": [1.0, 0.0]},
        {"entity_id": "x", "node_id": 3, "embedding": None, "tokens_l0": [-1, 9], "weights_l0": [-0.5, 1.5]},
    ])
    v = views.embedding_view(frame, GRAPH, n_levels=1).sort("id")
    assert v["id"].to_list() == ["a", "b", "c", "x"]
    assert v["emb_len"].to_list() == [2, 2, 3, None]
    assert v["emb_finite"].to_list() == [True, False, True, False]
    assert v["emb_norm"][0] == pytest.approx(1.0, abs=1e-6) and v["emb_norm"][2] == pytest.approx(math.sqrt(2))
    assert v["tok_distinct_l0"].to_list() == [True, False, True, True]
    assert v["tok_min_l0"].to_list() == [1, 3, 0, -1] and v["tok_max_l0"].to_list() == [2, 3, 0, 9]
    assert v["w_sum_l0"].to_list() == pytest.approx([1.0, 1.1, 1.0, 1.0])
    assert v["w_min_l0"].to_list() == pytest.approx([0.25, 0.5, 0.0, -0.5])
    assert v["w_len_ok_l0"].to_list() == [True, True, False, True]
    # c has the wrong node id, x is not in the snapshot
    assert v["in_graph"].to_list() == [True, True, False, False]


def test_fixed_size_arrays_are_read_like_lists() -> None:
    frame = _emb([{"entity_id": "a", "node_id": 0, "embedding": [S, S], "tokens_l0": [1, 2], "weights_l0": [0.5, 0.5]}])
    arr = frame.with_columns(pl.col("embedding").cast(pl.Array(pl.Float32, 2)))
    assert views.embedding_view(arr, GRAPH, 1)["emb_len"].to_list() == [2]


def test_coverage_view_marks_cold_entities_without_rows() -> None:
    frame = _emb([
        {"entity_id": "a", "node_id": 0, "embedding": [S, S], "tokens_l0": [1], "weights_l0": [1.0]},
        {"entity_id": "c", "node_id": 2, "embedding": [float("inf"), 0.0], "tokens_l0": [1], "weights_l0": [1.0]},
    ])
    emb = views.embedding_view(frame, GRAPH, 1)
    cov = views.coverage_view(GRAPH, frame, emb, datetime(2024, 1, 9, tzinfo=UTC)).sort("id")
    assert cov["cold"].to_list() == [False, False, True, True]        # c, d first seen in test
    assert cov["has_row"].to_list() == [True, False, True, False]
    assert cov["has_embedding"].to_list() == [True, False, False, False]


def _unit(*v: float) -> list[float]:
    x = [float(a) for a in v]
    n = math.sqrt(sum(a * a for a in x))
    return [a / n for a in x]


def test_near_twins_are_flagged_among_entities_with_engagement_only() -> None:
    """a and b are 0.004 rad apart (no exact duplicate, still one vector to an index); d is their
    cold-start twin (not checked: cold entities may share a vector); c stands apart."""
    frame = _emb([
        {"entity_id": "a", "node_id": 0, "embedding": _unit(1, 0.5, 0), "tokens_l0": [1], "weights_l0": [1.0]},
        {"entity_id": "b", "node_id": 1, "embedding": _unit(1, 0.505, 0), "tokens_l0": [1], "weights_l0": [1.0]},
        {"entity_id": "c", "node_id": 2, "embedding": _unit(0, 1, 1), "tokens_l0": [1], "weights_l0": [1.0]},
        {"entity_id": "d", "node_id": 3, "embedding": _unit(1, 0.5, 0), "tokens_l0": [1], "weights_l0": [1.0]},
    ]).with_columns(pl.Series("cold_start", [False, False, False, True]))
    v = views.embedding_view(frame, GRAPH, 1, twin_tolerance=1e-4).sort("id")
    assert v["emb_distinct"].to_list() == [False, True, True, False]   # only a and d are exact twins
    assert v["emb_no_twin"].to_list() == [False, False, True, None]
    # a tolerance below their distance tells a and b apart; d is a's exact twin either way
    assert views.embedding_view(frame, GRAPH, 1, twin_tolerance=1e-6).sort("id")["emb_no_twin"].to_list() == \
        [False, True, True, None]


def test_cold_start_coverage_needs_distinct_vectors_for_distinct_texts() -> None:
    """Cold-start c and d have different texts but one vector: neither is covered. e has d's
    text and vector (same content, same vector: fine). a is not cold, f has no text."""
    graph = pl.DataFrame({"node_id": [0, 2, 3, 4, 5], "key": ["a", "c", "d", "e", "f"],
                          "first_seen": [datetime(2024, 1, d, tzinfo=UTC) for d in (1, 9, 9, 9, 9)],
                          "text": ["x", "red shoe", "blue hat", "blue hat", None]})
    same = _unit(1, 1, 0)
    frame = _emb([
        {"entity_id": k, "node_id": i, "embedding": e, "tokens_l0": [1], "weights_l0": [1.0]}
        for k, i, e in (("a", 0, same), ("c", 2, same), ("d", 3, _unit(1, 1, 1e-7)), ("e", 4, _unit(1, 1, 1e-7)),
                        ("f", 5, same))
    ])
    emb = views.embedding_view(frame, graph, 1)
    cov = views.coverage_view(graph, frame, emb, datetime(2024, 1, 9, tzinfo=UTC), tolerance=1e-4).sort("id")
    assert cov["id"].to_list() == ["a", "c", "d", "e", "f"]
    assert cov["covered"].to_list() == [None, False, False, False, None]
    # c given its own direction: it is told apart, and so are d and e (same text as each other)
    frame = frame.with_columns(pl.when(pl.col("entity_id") == "c").then(pl.lit(_unit(0, 0, 1), pl.List(pl.Float32)))
                               .otherwise(pl.col("embedding")).alias("embedding"))
    cov = views.coverage_view(graph, frame, views.embedding_view(frame, graph, 1),
                              datetime(2024, 1, 9, tzinfo=UTC)).sort("id")
    assert cov["covered"].to_list() == [None, True, True, True, None]


def test_events_view_checks_ranges_and_split_bounds() -> None:
    ts = [datetime(2024, 1, d, tzinfo=UTC) for d in (1, 5, 8, 9)]
    events = pl.LazyFrame({
        "user_id": [0, 1, 5, 0], "entity_id": [0, 3, 1, 2], "entity_type": ["product"] * 4,
        "stage": ["view"] * 4, "split": ["train", "val", "train", "test"], "timestamp": ts,
    })
    bounds = {"val_start": datetime(2024, 1, 5, tzinfo=UTC), "test_start": datetime(2024, 1, 8, tzinfo=UTC)}
    v = views.events_view(events, {"user": 2, "product": 3}, bounds)
    assert v["user_ok"].to_list() == [True, True, False, True]
    assert v["entity_ok"].to_list() == [True, False, True, True]
    assert v["split_ok"].to_list() == [True, True, False, True]       # row 2 is after test_start
    shares = views.split_view(events)
    assert dict(zip(shares["id"], shares["share"])) == {"train": 0.5, "val": 0.25, "test": 0.25}


def test_sources_view_quarantine_share_and_accounting() -> None:
    meta = {"input_rows": 10, "kept_rows": 8, "quarantined_rows": 2,
            "sources": {"events": {"input_rows": 10, "kept_rows": 8, "quarantined_rows": 2}},
            "entity_sources": {"products": {"input_rows": 4, "kept_rows": 4, "quarantined_rows": 1}}}
    v = views.sources_view(meta)
    assert v["quarantine_share"].to_list() == pytest.approx([0.2, 0.25, 0.2])
    assert v["accounting_ok"].to_list() == [True, False, True]


def test_schema_view_dtype_families() -> None:
    schema = {"entity_id": pl.String, "embedding": pl.Array(pl.Float32, 4), "node_id": pl.Float64}
    v = views.schema_view(schema, {"entity_id": "str", "embedding": "list<float>", "node_id": "int", "created": "datetime"})
    assert v["present"].to_list() == [True, True, True, False]
    assert v["dtype_ok"].to_list() == [True, True, False, False]


def test_drift_cosine_and_jaccard_on_shared_ids() -> None:
    cur = _emb([
        {"entity_id": "a", "node_id": 0, "embedding": [1.0, 0.0], "tokens_l0": [1, 2], "weights_l0": [0.5, 0.5]},
        {"entity_id": "b", "node_id": 1, "embedding": [0.0, 1.0], "tokens_l0": [3, 4], "weights_l0": [0.5, 0.5]},
        {"entity_id": "new", "node_id": 2, "embedding": [1.0, 0.0], "tokens_l0": [1, 2], "weights_l0": [0.5, 0.5]},
    ])
    prev = _emb([
        {"entity_id": "a", "node_id": 0, "embedding": [S, S], "tokens_l0": [2, 1], "weights_l0": [0.5, 0.5]},
        {"entity_id": "b", "node_id": 1, "embedding": [0.0, -2.0], "tokens_l0": [4, 5], "weights_l0": [0.5, 0.5]},
        {"entity_id": "gone", "node_id": 3, "embedding": [1.0, 0.0], "tokens_l0": [1, 2], "weights_l0": [0.5, 0.5]},
    ])
    d = drift_view(cur, prev, n_levels=1).sort("id")
    assert d["id"].to_list() == ["a", "b"]
    assert d["cosine"].to_list() == pytest.approx([S, -1.0])
    assert d["jaccard_l0"].to_list() == pytest.approx([1.0, 1 / 3])
    s = drift_summary(d, n_current=3)
    assert s["shared_ids"] == 2 and s["shared_share"] == pytest.approx(2 / 3)
    assert s["mean_cosine"] == pytest.approx((S - 1) / 2, abs=1e-6)


def test_drift_with_changed_dimension_reports_no_cosine() -> None:
    cur = _emb([{"entity_id": "a", "node_id": 0, "embedding": [1.0, 0.0, 0.0], "tokens_l0": [1], "weights_l0": [1.0]}])
    prev = _emb([{"entity_id": "a", "node_id": 0, "embedding": [1.0, 0.0], "tokens_l0": [1], "weights_l0": [1.0]}])
    d = drift_view(cur, prev, 1)
    assert d["cosine"].to_list() == [None] and d["jaccard_l0"].to_list() == [1.0]


def test_exact_twins_are_flagged() -> None:
    frame = _emb([
        {"entity_id": "a", "node_id": 0, "embedding": [S, S], "tokens_l0": [1], "weights_l0": [1.0]},
        {"entity_id": "b", "node_id": 1, "embedding": [S, S], "tokens_l0": [2], "weights_l0": [1.0]},
        {"entity_id": "c", "node_id": 2, "embedding": [S, -S], "tokens_l0": [1], "weights_l0": [1.0]},
    ])
    assert views.embedding_view(frame, GRAPH, 1).sort("id")["emb_distinct"].to_list() == [False, False, True]


def test_twins_with_one_engagement_context_are_not_a_collapse(tmp_path) -> None:
    """a and b are near twins. With different contexts (a linked to u1, b to u2) that is a
    collapse; with the same one (both linked to u1 only) their identical vectors are right."""
    frame = _emb([
        {"entity_id": "a", "node_id": 0, "embedding": _unit(1, 0.5, 0), "tokens_l0": [1], "weights_l0": [1.0]},
        {"entity_id": "b", "node_id": 1, "embedding": _unit(1, 0.5005, 0), "tokens_l0": [1], "weights_l0": [1.0]},
        {"entity_id": "c", "node_id": 2, "embedding": _unit(0, 1, 1), "tokens_l0": [1], "weights_l0": [1.0]},
    ]).with_columns(pl.Series("cold_start", [False, False, False]), pl.lit("product").alias("entity_type"))

    def contexts(users_of_b: list[int], split_of_c: str = "train") -> pl.DataFrame:
        edges = tmp_path / "graph" / "edges"
        edges.mkdir(parents=True, exist_ok=True)
        pl.DataFrame({"src_id": [10, *users_of_b, 11], "dst_id": [0, *[1] * len(users_of_b), 2],
                      "split": ["train", *["train"] * len(users_of_b), split_of_c]}).write_parquet(
            edges / "user__engages__product.parquet")
        return views.context_labels(tmp_path / "graph", ["train"])

    flags = views.embedding_view(frame, GRAPH, 1, 1e-4, contexts=contexts([11])).sort("id")["emb_no_twin"]
    assert flags.to_list() == [False, False, True]  # a (u10) and b (u11): two contexts, one vector
    same = contexts([10])  # b is linked to u10 only, like a
    same_p = same.filter(pl.col("entity_type") == "product")
    assert same_p.filter(pl.col("node_id") == 0)["context"].item() == same_p.filter(pl.col("node_id") == 1)["context"].item()
    assert views.embedding_view(frame, GRAPH, 1, 1e-4, contexts=same).sort("id")["emb_no_twin"].to_list() == \
        [True, True, True]
    # a link in a split the export did not see is no part of the context: c has none left, b is
    # linked to u10 and u11 (a superset of a's context, so a different one)
    labels = contexts([10, 11], split_of_c="test").filter(pl.col("entity_type") == "product")
    assert sorted(labels["node_id"].to_list()) == [0, 1] and labels["context"].n_unique() == 2


def test_a_group_without_engagement_takes_its_members_evidence(tmp_path) -> None:
    """Advertisers x and y have no engagement: their context is their products'. x's product and
    y's product were both bought by user 0 alone, so x and y share a context; z's was not."""
    edges = tmp_path / "graph" / "edges"
    edges.mkdir(parents=True)
    pl.DataFrame({"src_id": [0, 0, 1], "dst_id": [0, 1, 2], "split": ["train"] * 3}).write_parquet(
        edges / "user__engages__product.parquet")
    pl.DataFrame({"src_id": [0, 1, 2], "dst_id": [0, 1, 2]}).write_parquet(edges / "product__by_advertiser__advertiser.parquet")
    labels = views.context_labels(tmp_path / "graph", ["train"])
    adv = dict(labels.filter(pl.col("entity_type") == "advertiser").select("node_id", "context").iter_rows())
    prod = dict(labels.filter(pl.col("entity_type") == "product").select("node_id", "context").iter_rows())
    assert prod[0] == prod[1] != prod[2]
    assert adv[0] == adv[1] != adv[2]
    assert len(labels.filter(pl.col("entity_type") == "user")) == 2


def _nearest_reference(z, query, pool, labels=None):
    """nearest_cosine by the definition: every (query, pool) pair, one at a time."""
    import numpy as np

    def unit(v):
        n = np.linalg.norm(v)
        if not np.isfinite(v).all():
            return None
        return np.append(np.zeros_like(v), 1.0) if n < 1e-6 else np.append(v / n, 0.0)

    out = np.full(len(query), -2.0)
    for i, a in enumerate(query):
        for b in pool:
            ua, ub = unit(z[a]), unit(z[b])
            if a == b or ua is None or ub is None or (labels is not None and labels[a] == labels[b]):
                continue
            out[i] = max(out[i], float(ua @ ub))
    return out


@pytest.mark.parametrize("query_kind", ["distinct", "repeated"])
def test_nearest_cosine_equals_its_definition(query_kind: str) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    z = rng.normal(size=(40, 5)).astype(np.float32)
    z[3] = z[7] * 2.0  # a twin at another scale
    z[5] = 0.0  # zero rows: twins of each other only
    z[11] = 0.0
    z[9, 2] = np.nan  # non-finite rows compare as -2
    z[13, 0] = np.inf
    labels = rng.integers(0, 4, 40)
    query = np.array([3, 5, 9, 13, 20, 7] if query_kind == "distinct" else [3, 5, 3, 9, 20, 7, 7])
    pool = np.union1d(np.arange(0, 40, 2), query)
    for lab in (None, labels):
        got = views.nearest_cosine(z, query, pool, lab, block=7)  # several blocks, a ragged last one
        want = _nearest_reference(z, query, pool, lab)
        assert np.allclose(got, want, atol=1e-6), (lab is not None, got, want)
    got = views.nearest_cosine(z, query, pool)
    assert got[0] == pytest.approx(1.0, abs=1e-6)  # row 3 finds row 7
    assert got[list(query).index(9)] == -2.0
    assert views.nearest_cosine(z, np.array([], np.int64), pool).shape == (0,)
