"""ContextSampler on a hand-built 8-node snapshot: visibility, weighting, determinism."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hir.model import ContextSampler, load_graph
from hir.model.context import topk_edges
from hir.nn.buckets import ENGAGEMENT, METADATA, SELF
from tests.train.fixtures import graph_options, write_content

T0 = datetime(2024, 1, 1, tzinfo=UTC)
TS = pl.Datetime("us", "UTC")


def _edges(rows: list[tuple[int, int, str, str, int]]) -> pl.DataFrame:
    """(user, product, stage, split, day) -> engagement edge rows."""
    return pl.DataFrame({
        "src_id": [r[0] for r in rows], "dst_id": [r[1] for r in rows], "stage": [r[2] for r in rows],
        "split": [r[3] for r in rows], "count": pl.Series([1] * len(rows), dtype=pl.UInt32),
        "first_ts": pl.Series([T0 + timedelta(days=r[4]) for r in rows], dtype=TS),
        "last_ts": pl.Series([T0 + timedelta(days=r[4]) for r in rows], dtype=TS),
        "value": [0.0] * len(rows),
    })


@pytest.fixture
def hand_graph(tmp_path: Path) -> Path:
    """users u0, u1; products p0..p4; categories c0 (child of c1); advertiser a0.

    u0: p0 purchase (train), p1..p4 view (train); p2 also purchased in *val*, p3 in *test*.
    u1: p0 view (train) -- so p0's second hop from u0 reaches u1, and u0's reaches p0's buyers.
    """
    g = tmp_path / "graph"
    (g / "nodes").mkdir(parents=True)
    (g / "edges").mkdir()

    def nodes(keys: list[str], texts: list[str | None]) -> pl.DataFrame:
        return pl.DataFrame({"node_id": list(range(len(keys))), "key": keys, "text": pl.Series(texts, dtype=pl.String),
                             "first_seen": pl.Series([T0] * len(keys), dtype=TS)})

    nodes(["u0", "u1"], [None, None]).write_parquet(g / "nodes" / "user.parquet")
    nodes([f"p{i}" for i in range(5)], ["red shoe", "blue shoe", "tea pot", "green tea", "tea cup"]).write_parquet(
        g / "nodes" / "product.parquet")
    nodes(["c0", "c1"], ["shoes", "apparel"]).write_parquet(g / "nodes" / "category.parquet")
    nodes(["a0"], ["acme"]).write_parquet(g / "nodes" / "advertiser.parquet")
    _edges([
        (0, 0, "purchase", "train", 1), *[(0, p, "view", "train", 1) for p in (1, 2, 3, 4)],
        (0, 2, "purchase", "val", 8), (0, 3, "purchase", "test", 9), (1, 0, "view", "train", 2),
    ]).write_parquet(g / "edges" / "user__engages__product.parquet")
    pl.DataFrame({"src_id": [0, 1, 2, 3, 4], "dst_id": [0, 0, 0, 0, 0]}).write_parquet(g / "edges" / "product__in_category__category.parquet")
    pl.DataFrame({"src_id": [0], "dst_id": [1]}).write_parquet(g / "edges" / "category__child_of__category.parquet")
    pl.DataFrame({"src_id": [0, 1], "dst_id": [0, 0]}).write_parquet(g / "edges" / "product__by_advertiser__advertiser.parquet")
    bounds = {"min": T0.isoformat(), "max": (T0 + timedelta(days=10)).isoformat(),
              "val_start": (T0 + timedelta(days=7)).isoformat(), "test_start": (T0 + timedelta(days=9)).isoformat()}
    meta = {"nodes": {"user": 2, "product": 5, "category": 2, "advertiser": 1}, "stage_order": ["view", "cart", "purchase"],
            "deep_stage": "purchase", "split_bounds": bounds}
    (g / "meta.json").write_text(json.dumps(meta))
    write_content(g, tmp_path / "content")
    return tmp_path


def _gid(store, etype: str, i: int) -> int:
    return int(store.global_ids(etype, [i])[0])


def test_only_train_edges_are_visible(hand_graph: Path):
    store = load_graph(hand_graph / "graph", hand_graph / "content", ("train",), **graph_options())
    s = ContextSampler(store, engagement=8, meta_up=0, meta_down=0, hop2=0, know_down=8)
    u0 = _gid(store, "user", 0)
    view = s.engagement(np.array([u0]), np.random.default_rng(0))
    eng = view["node"][0][view["relation"][0] == ENGAGEMENT]
    assert sorted(eng.tolist()) == [_gid(store, "product", i) for i in range(5)]
    p2 = _gid(store, "product", 2)
    stage = view["stage"][0][view["node"][0] == p2]
    assert stage.tolist() == [1]  # p2's purchase is in val: only the train view (stage rank 0 + 1) shows
    # the deep-funnel pairs and the val pairs are split-exact
    assert store.deep_pairs.tolist() == [[u0, _gid(store, "product", 0)]]
    assert store.val_pairs.tolist() == [[u0, p2]]


def test_deep_and_recent_edges_are_drawn_first(hand_graph: Path):
    store = load_graph(hand_graph / "graph", hand_graph / "content", ("train",), **graph_options())
    u0 = np.array([_gid(store, "user", 0)] * 2000)
    picks = store.eng.dst[topk_edges(store.eng, u0, 1, np.random.default_rng(0))[:, 0]]
    share = (picks == _gid(store, "product", 0)).mean()
    # purchase weight 4^2 = 16 vs 1 for each of 4 views (same day, same count): 16/20
    assert 0.75 < share < 0.85, share


def test_exclusion_hides_the_held_out_side(hand_graph: Path):
    store = load_graph(hand_graph / "graph", hand_graph / "content", ("train",), **graph_options())
    s = ContextSampler(store, engagement=8, meta_up=0, meta_down=0, hop2=4, know_down=8)
    u0, p0 = _gid(store, "user", 0), _gid(store, "product", 0)
    view = s.engagement(np.array([u0, p0]), np.random.default_rng(1), exclude=np.array([p0, u0]))
    assert p0 not in view["node"][0].tolist()
    assert u0 not in view["node"][1].tolist()


def test_metadata_up_reaches_ancestors_and_knowledge_view_has_no_engagement(hand_graph: Path):
    store = load_graph(hand_graph / "graph", hand_graph / "content", ("train",), **graph_options())
    s = ContextSampler(store, engagement=4, meta_up=4, meta_down=4, hop2=2, know_down=4)
    p0 = _gid(store, "product", 0)
    view = s.knowledge(np.array([p0]), np.random.default_rng(0))
    got = {(int(n), int(h)) for n, h, m in zip(view["node"][0], view["hop"][0], view["mask"][0]) if m}
    assert got == {(p0, 0), (_gid(store, "category", 0), 1), (_gid(store, "advertiser", 0), 1), (_gid(store, "category", 1), 2)}
    assert set(view["relation"][0][view["mask"][0]].tolist()) == {SELF, METADATA}
    assert (view["exposure"] == 0).all() and (view["stage"] == 0).all()


def test_second_hop_goes_through_shared_neighbours(hand_graph: Path):
    store = load_graph(hand_graph / "graph", hand_graph / "content", ("train",), **graph_options())
    s = ContextSampler(store, engagement=1, meta_up=0, meta_down=0, hop2=4, know_down=8)
    p0, u1 = _gid(store, "product", 0), _gid(store, "user", 1)
    view = s.engagement(np.array([u1]), np.random.default_rng(0))
    hop2 = view["node"][0][view["hop"][0] == 2]
    # u1 -> p0 -> u0 (the only other buyer); never back to u1 itself
    assert hop2.tolist() == [_gid(store, "user", 0)]
    assert view["node"][0][view["hop"][0] == 1].tolist() == [p0]


def test_same_generator_same_context(hand_graph: Path):
    store = load_graph(hand_graph / "graph", hand_graph / "content", ("train",), **graph_options())
    s = ContextSampler(store, engagement=2, meta_up=1, meta_down=2, hop2=2, know_down=8)
    seeds = np.arange(store.n_nodes)
    a = s.engagement(seeds, np.random.default_rng(5))
    b = s.engagement(seeds, np.random.default_rng(5))
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    draws = {tuple(s.engagement(seeds[:1], np.random.default_rng(i))["node"][0]) for i in range(30)}
    assert len(draws) > 1  # u0 has 5 neighbours and 2 slots: different generators differ


def test_cold_and_warm(hand_graph: Path):
    store = load_graph(hand_graph / "graph", hand_graph / "content", ("train",), **graph_options())
    warm = {(t, i) for t in store.types for i in range(*store.type_range(t)) if store.warm[i]}
    assert store.warm[_gid(store, "product", 0)] and store.warm[_gid(store, "category", 1)]  # linked to warm products
    assert len(warm) == store.n_nodes  # every product has a train edge; categories/advertiser are linked


def test_a_relation_without_edges_gives_padding(hand_graph: Path):
    # a dataset without a taxonomy (online_retail) has empty metadata adjacency
    store = load_graph(hand_graph / "graph", hand_graph / "content", ("train",), **graph_options())
    empty = type(store.up).build(store.n_nodes, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
    store.up = store.down = empty
    sampler = ContextSampler(store, 4, 2, 2, 2, 2)
    seeds = np.arange(store.n_nodes)
    for view in (sampler.engagement(seeds, np.random.default_rng(0)), sampler.knowledge(seeds, np.random.default_rng(0))):
        meta = view["relation"] == METADATA
        assert not meta.any()
        assert (view["node"][:, 0] == seeds).all()
