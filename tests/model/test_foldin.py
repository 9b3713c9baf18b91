"""The streaming fold-in over the snapshot's edge files equals the in-memory one (issue 35)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hir.data.snapshot import load_snapshot
from hir.model import Filter
from hir.model.foldin import iter_user_base, write_user_base


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.train.fixtures import tiny_snapshot

    return tiny_snapshot(tmp_path_factory.mktemp("foldin"))


def _stream(tiny: Path, splits: tuple[str, ...], basis, bucket: int) -> np.ndarray:
    parts = list(iter_user_base(load_snapshot(tiny / "graph"), splits, basis, bucket_users=bucket))
    assert len(parts) > 1  # several buckets
    ids = np.concatenate([p[0] for p in parts])
    np.testing.assert_array_equal(ids, np.arange(len(ids)))
    return np.concatenate([p[1] for p in parts])


@pytest.mark.parametrize("cap", [None, 0.5])
def test_the_streaming_fold_in_is_the_in_memory_one(tiny: Path, cap: float | None) -> None:
    from hir.model import load_graph
    from hir.model.spectral import engagement_matrix, fit_spectral
    from tests.train.fixtures import graph_options

    train = load_graph(tiny / "graph", tiny / "content", ("train",), **graph_options())
    # a user half-life on: the streamed pairs' ages are the store's
    basis = fit_spectral(train, 8, 4.0, 4, 0, Filter(beta=0.4, response="cheby", ideal_weight=0.3, user_half_life=5.0),
                         sample_users=cap)
    # the window the basis was fit on, and a wider one (export: train + val) with new columns
    # folded in through the (sampled) users, in a rotated frame
    q, _ = np.linalg.qr(np.random.default_rng(1).standard_normal((basis.rank, basis.rank)))
    for splits, b in ((("train",), basis), (("train", "val"), replace(basis, frame=q.astype(np.float32)))):
        store = train if splits == ("train",) else load_graph(tiny / "graph", tiny / "content", splits, **graph_options())
        lo, hi = store.type_range("user")
        want = b.base_for(store).vectors[lo:hi]
        got = _stream(tiny, splits, b, bucket=7)
        assert np.abs(want).sum() > 0
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    # the wider window has columns the basis was not fit on (folded in through its users)
    assert not np.isin(np.flatnonzero(engagement_matrix(store, 4.0).getnnz(0)), basis.cols).all()


def test_write_user_base(tiny: Path, tmp_path: Path) -> None:
    from hir.model import load_graph
    from hir.model.spectral import fit_spectral
    from tests.train.fixtures import graph_options

    store = load_graph(tiny / "graph", tiny / "content", ("train",), **graph_options())
    basis = fit_spectral(store, 6, 4.0, 4, 0)
    n = write_user_base(load_snapshot(tiny / "graph"), ("train",), basis, tmp_path / "user.parquet", bucket_users=5)
    lo, hi = store.type_range("user")
    frame = pl.read_parquet(tmp_path / "user.parquet")
    assert n == hi - lo == frame.height
    np.testing.assert_allclose(np.stack(frame["embedding"].to_list()), basis.base_for(store).vectors[lo:hi],
                               rtol=1e-4, atol=1e-6)
