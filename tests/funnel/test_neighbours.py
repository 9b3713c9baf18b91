"""TIFU-KNN's neighbour share (hir/funnel/neighbours.py) on a hand-built log: the time-decayed
vectors, the neighbours (cosine > 0, never the user itself, the k nearest), the weighted mean,
the blocks, the plain counts without time and the within-user rank the scorer reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pytest

from hir.funnel.candidates import FEATURES
from hir.funnel.neighbours import decay_name, neighbour_share, neighbour_weights, user_vectors
from hir.funnel.source import open_funnel

T0 = datetime(2024, 1, 1, tzinfo=UTC)
A, B, C, D = 0, 1, 2, 3
# (user, entity, stage_rank, day); stage 2 = purchase (the target), 0 = view
LOG = [
    (0, A, 2, 1), (0, B, 2, 1), (0, A, 2, 2),   # user 0: trips on days 1 and 2 -> x_0 = [A 1, B 0.9/1.9] at r=0.9
    (1, A, 2, 1), (1, C, 2, 1),                 # user 1: one trip -> x_1 = [A 1, C 1]
    (2, D, 2, 3),                               # user 2: shares nothing with anyone
    (3, A, 0, 1),                               # user 3: only a view -> no vector, no neighbour
    (4, A, 2, 1),                               # user 4: x_4 = [A 1]
]
N_USERS, N_ENT = 5, 4


def _source() -> pl.DataFrame:
    ev = pl.DataFrame({"user_id": [r[0] for r in LOG], "entity_id": [r[1] for r in LOG],
                       "stage_rank": [r[2] for r in LOG],
                       "timestamp": [T0 + timedelta(days=r[3]) for r in LOG]}).with_columns(
        pl.col("timestamp").cast(pl.Datetime("us", "UTC")))
    return open_funnel(ev.lazy(), target_rank=2, asof=T0 + timedelta(days=10)).collect()


def _share(k: int, use_time: bool = True, cells: int = 1_000_000) -> dict[tuple[int, int], float]:
    rows = pl.DataFrame({"user_id": np.repeat(np.arange(N_USERS), N_ENT), "entity_id": np.tile(np.arange(N_ENT), N_USERS)})
    out = neighbour_share(rows, _source(), N_USERS, N_ENT, k, 0.9, use_time, cells)
    return {(u, e): v for u, e, v in zip(rows["user_id"], rows["entity_id"], out["nbr_share"], strict=True)}


def test_vectors_are_the_decayed_trip_shares() -> None:
    x = user_vectors(_source(), N_USERS, N_ENT, 0.9, use_time=True).toarray()
    np.testing.assert_allclose(x[0], [1.0, 0.9 / 1.9, 0, 0], rtol=1e-6)
    np.testing.assert_allclose(x[1], [1, 0, 1, 0])
    assert not x[3].any(), "a user who only viewed has no vector"
    counts = user_vectors(_source(), N_USERS, N_ENT, 0.9, use_time=False).toarray()
    np.testing.assert_allclose(counts[0], [2 / 3, 1 / 3, 0, 0], rtol=1e-6)


def test_share_is_the_cosine_weighted_mean_over_the_k_nearest() -> None:
    n0 = np.sqrt(1 + (0.9 / 1.9) ** 2)
    cos01, cos04 = 1 / (n0 * np.sqrt(2)), 1 / n0
    two = _share(k=2)
    # user 0's neighbours: 1 and 4 (user 2 shares nothing, user 3 has no vector)
    assert two[(0, C)] == pytest.approx(cos01 / (cos01 + cos04), rel=1e-5)
    assert two[(0, A)] == pytest.approx(1.0, rel=1e-5)
    assert two[(0, B)] == 0.0 and two[(0, D)] == 0.0
    # never the user itself: user 1's own C is not its neighbours'
    cos14 = 1 / np.sqrt(2)
    assert two[(1, C)] == 0.0
    assert two[(1, B)] == pytest.approx(cos01 * (0.9 / 1.9) / (cos01 + cos14), rel=1e-5)
    # no neighbour (nothing shared, or no vector): 0 everywhere
    assert all(two[(u, e)] == 0.0 for u in (2, 3) for e in range(N_ENT))
    # k = 1: user 0's nearest is 4 (cosine 1/|x_0| against 1/(|x_0| sqrt 2)), which never bought C
    one = _share(k=1)
    assert one[(0, C)] == 0.0 and one[(0, A)] == pytest.approx(1.0)


def test_blocks_change_nothing() -> None:
    assert _share(k=2, cells=1) == _share(k=2)
    x = user_vectors(_source(), N_USERS, N_ENT, 0.97, use_time=True)
    users = np.arange(N_USERS)
    np.testing.assert_allclose(neighbour_weights(x, users, 3, cells=1).toarray(),
                               neighbour_weights(x, users, 3).toarray())


def test_without_time_the_counts_decide() -> None:
    counts = _share(k=2, use_time=False)
    # user 1's neighbours 0 ([2/3, 1/3]) and 4 ([1]) by cosine of the count shares
    n0 = np.sqrt(5) / 3
    c10, c14 = (2 / 3) / (n0 * np.sqrt(2)), 1 / np.sqrt(2)
    assert counts[(1, B)] == pytest.approx(c10 * (1 / 3) / (c10 + c14), rel=1e-5)


def test_only_stored_decays() -> None:
    assert decay_name(0.97) == "97"
    with pytest.raises(ValueError, match=r"neighbour_decay=0\.5"):
        decay_name(0.5)


def test_inverse_rank_within_the_user() -> None:
    rows = pl.DataFrame({"user_id": [0, 0, 0, 0, 1], "nbr_share": [0.5, 0.2, 0.0, 0.5, 0.1]})
    got = rows.select(FEATURES["nbr_inv_rank"]).to_series().to_list()
    assert got == pytest.approx([1.0, 1 / 3, 0.0, 1.0, 1.0])
