"""The affinity features on hand-built vectors: the candidate itself never counts, the converted and
open groups are apart, chunking changes nothing."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import polars as pl
import pytest

from hir.funnel.affinity import COLUMNS, context_affinity
from hir.funnel.source import open_funnel
from tests.funnel.test_source import LOG, T0, _random_log

# entity vectors: 10 and 11 point the same way, 12 is orthogonal, 13 opposite to 10
VECTORS = np.zeros((14, 2), np.float32)
VECTORS[10], VECTORS[11], VECTORS[12], VECTORS[13] = [1, 0], [2, 0], [0, 3], [-1, 0]


def _features(rows: list[tuple[int, int]], use_time: bool = True, cells: int = 16_000_000) -> dict[tuple[int, int], dict]:
    cands = pl.DataFrame({"user_id": [r[0] for r in rows], "entity_id": [r[1] for r in rows]}).sort("user_id", "entity_id")
    source = open_funnel(LOG.lazy(), 2, T0 + timedelta(days=10)).collect()
    out = pl.concat([cands, context_affinity(cands, source, VECTORS, 100, use_time, cells)], how="horizontal")
    return {(r["user_id"], r["entity_id"]): r for r in out.to_dicts()}


def test_the_candidate_itself_never_counts() -> None:
    # user 0: carted 10 (open), bought 11 (converted); user 1: bought 10, viewed 12
    f = _features([(0, 10), (0, 11), (0, 12), (0, 13), (1, 10), (1, 13)])
    # 10 against user 0's other item (11, bought, same direction): 1; not its own cart
    assert f[(0, 10)]["aff_max"] == pytest.approx(1.0) and f[(0, 10)]["aff_conv_max"] == pytest.approx(1.0)
    assert (f[(0, 10)]["ctx_open"], f[(0, 10)]["ctx_conv"]) == (0.0, 1.0) and f[(0, 10)]["aff_open_max"] == 0.0
    # 11 against the cart 10 only
    assert (f[(0, 11)]["aff_open_max"], f[(0, 11)]["ctx_conv"]) == (pytest.approx(1.0), 0.0)
    # 12 is orthogonal to both; 13 opposite to both
    assert f[(0, 12)]["aff_max"] == pytest.approx(0.0) and f[(0, 12)]["aff_mean"] == pytest.approx(0.0)
    assert f[(0, 13)]["aff_max"] == pytest.approx(-1.0) and f[(0, 13)]["ctx_conv"] + f[(0, 13)]["ctx_open"] == 2.0
    # user 1 bought 10 and viewed 12: 13 is opposite to 10 and orthogonal to 12
    assert f[(1, 13)]["aff_conv_mean"] == pytest.approx(-1.0) and f[(1, 13)]["aff_open_mean"] == pytest.approx(0.0)
    assert f[(1, 10)]["aff_mean"] == pytest.approx(0.0)  # only 12 left


def test_recency_weights_the_recent_items() -> None:
    f = _features([(0, 12), (1, 11)])
    # user 1: 10 bought 6 days before asof (cos 1), 12 viewed 4 days before (cos 0)
    assert f[(1, 11)]["aff_recent"] == pytest.approx((1 / 7) / (1 / 7 + 1 / 5))
    assert _features([(1, 11)], use_time=False)[(1, 11)]["aff_recent"] == 0.0


def test_chunks_change_nothing() -> None:
    log = _random_log(3)
    source = open_funnel(log.lazy(), 2, T0 + timedelta(days=61)).collect()
    vectors = np.random.default_rng(0).normal(size=(40, 4)).astype(np.float32)
    cands = source.select("user_id", "entity_id").vstack(
        pl.DataFrame({"user_id": np.repeat(np.arange(60), 3), "entity_id": np.tile([0, 1, 2], 60)})).unique() \
        .sort("user_id", "entity_id")
    whole = context_affinity(cands, source, vectors, 100, True)
    small = context_affinity(cands, source, vectors, 100, True, cells=50)
    assert whole.columns == list(COLUMNS) and whole.height == cands.height
    np.testing.assert_allclose(whole.to_numpy(), small.to_numpy(), rtol=1e-6, atol=1e-6)
