"""Which nodes are warm (hir.model.store): engaged in the store's visible splits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hir.data.snapshot import load_snapshot
from hir.model import ContextSampler, EmbedBatches, load_graph
from tests.train.fixtures import context_sizes, graph_options, tiny_snapshot


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_snapshot(tmp_path_factory.mktemp("store"))


def _first_seen_in_val(run: Path) -> tuple[np.ndarray, np.ndarray]:
    """(users, products) node ids with val engagement and none in train."""
    e = pl.read_parquet(load_snapshot(run / "graph").edge_path("user__engages__product"))
    train, val = e.filter(pl.col("split") == "train"), e.filter(pl.col("split") == "val")
    ids = [np.setdiff1d(val[c].unique().to_numpy(), train[c].unique().to_numpy()) for c in ("src_id", "dst_id")]
    return ids[0], ids[1]


def test_warm_means_engaged_in_the_visible_splits(tiny: Path):
    users, products = _first_seen_in_val(tiny)
    assert len(users) and len(products), "the tiny snapshot has no user and no product first seen in val"
    train = load_graph(tiny / "graph", tiny / "content", ("train",), **graph_options())
    export = load_graph(tiny / "graph", tiny / "content", ("train", "val"), **graph_options())
    nodes = np.concatenate([export.global_ids("user", users), export.global_ids("product", products)])
    # training sees train alone: these nodes are cold there
    assert not train.warm[nodes].any()
    # export sees train + val (the base is refit on both): they are warm, with an engagement context
    assert export.warm[nodes].all()
    batch = EmbedBatches(export, None, ContextSampler(export, **context_sizes()), nodes, len(nodes), 0)[0]
    assert sorted(batch["eng_nodes"].tolist()) == sorted(nodes.tolist()) and len(batch["kno_nodes"]) == 0
    # a node with no visible engagement at all (first seen in test) stays cold
    lo, hi = export.type_range("product")
    engaged = np.unique(export.eng.dst[(export.eng.dst >= lo) & (export.eng.dst < hi)])
    never = np.setdiff1d(np.arange(lo, hi), engaged)
    assert not export.warm[never].any()
