"""Fixtures for the enrich tests: one MiniLM per session, a tiny hand-built graph snapshot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hir.enrich.text import SentenceEncoder


@pytest.fixture(scope="session")
def minilm() -> SentenceEncoder:
    """The real bundled MiniLM, loaded once (~6 s); every SentenceEncoder with the same
    model/device shares the loaded weights, so `run(cfg)` in a test reuses it too."""
    enc = SentenceEncoder(batch_size=16)
    assert enc.dim == 384
    return enc


class CountingEncoder:
    """Wraps a real encoder and records what it was asked to encode (the cache tests assert
    on exactly which texts reach the model)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: list[list] = []

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def dim(self) -> int:
        return self.inner.dim

    def encode(self, items: Sequence) -> np.ndarray:
        self.calls.append(list(items))
        return self.inner.encode(items)

    @property
    def encoded(self) -> list:
        return [x for call in self.calls for x in call]


PRODUCTS = pl.DataFrame(
    {
        "node_id": [3, 0, 1, 2, 4, 5],  # unsorted on purpose: outputs must come out by node_id
        "key": ["p3", "p0", "p1", "p2", "p4", "p5"],
        "text": ["red running shoes", "red running shoes", "stainless steel kettle", None, "  ", "organic green tea"],
        "attr_price": [59.0, 65.0, 25.5, None, 3.0, 2400.0],
        "attr_brand": ["acme", "acme", "kettlo", None, "teaco", "teaco"],
    }
)
USERS = pl.DataFrame(
    {"node_id": [0, 1, 2], "key": ["u0", "u1", "u2"], "text": pl.Series([None] * 3, dtype=pl.String),
     "attr_age": ["25-34", None, "65+"]}
)


def write_graph(graph_dir: Path, products: pl.DataFrame = PRODUCTS, created: str = "2026-01-01T00:00:00+00:00") -> Path:
    """A two-type snapshot in the prepare stage's layout (docs/contracts.md)."""
    (graph_dir / "nodes").mkdir(parents=True, exist_ok=True)
    products.write_parquet(graph_dir / "nodes" / "product.parquet")
    USERS.write_parquet(graph_dir / "nodes" / "user.parquet")
    (graph_dir / "meta.json").write_text(json.dumps({"dataset": "tiny", "created": created}))
    return graph_dir


@pytest.fixture
def counting(minilm) -> CountingEncoder:
    return CountingEncoder(minilm)


@pytest.fixture
def products() -> pl.DataFrame:
    return PRODUCTS.clone()


@pytest.fixture
def graph(tmp_path: Path) -> Path:
    return write_graph(tmp_path / "graph")


@pytest.fixture
def make_graph():
    return write_graph


@pytest.fixture
def new_counting(minilm):
    """A factory of fresh counting wrappers around the shared MiniLM."""
    return lambda: CountingEncoder(minilm)
