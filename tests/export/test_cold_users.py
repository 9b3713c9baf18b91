"""Users without visible engagement: the knowledge view, or turned toward the recent demand
(export.cold_users, hir/export/cold_users.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest

from hir.export.cold import place_like_export
from hir.export.cold_users import (
    ColdUsers,
    demand_direction,
    place_cold_users,
        turn_like_export,
)
from hir.model.csr import CSR
from hir.model.spectral import engaged_users
from hir.model.valset import ValSet

K = 8
N_USERS, N_ITEMS = 60, 40  # users 0..59 (the first 40 warm), items 60..99
WARM = 40
SPAN = 100.0  # days of the visible window


@dataclass
class Store:
    """The parts of a GraphStore cold-user placement reads."""

    eng: CSR
    warm: np.ndarray
    stage_order: list[str]
    span_days: float
    n_nodes: int = N_USERS + N_ITEMS
    real_time: bool = True  # the timestamps are the data's own

    def type_range(self, etype: str) -> tuple[int, int]:
        return (0, N_USERS) if etype == "user" else (N_USERS, N_USERS + N_ITEMS)


def _world(timed: bool = True, seed: int = 0):
    """Items with random directions and scales, the first 10 near one another; the warm users bought
    those within the last week (the recent demand) and others long ago; cold users' knowledge view
    points anywhere."""
    rng = np.random.default_rng(seed)
    d = rng.normal(size=(N_ITEMS, K))
    d[:10] = 3 * rng.normal(size=K) + 0.5 * d[:10]  # what is in demand now shares a region
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    a = rng.uniform(0.2, 0.9, N_ITEMS)
    z = np.zeros((N_USERS + N_ITEMS, K + 1), np.float32)
    z[N_USERS:, :K] = d * a[:, None]
    z[N_USERS:, K] = np.sqrt(1 - a * a)
    u = rng.normal(size=(N_USERS, K))
    z[:N_USERS, :K] = u / np.linalg.norm(u, axis=1, keepdims=True)
    src, dst, age = [], [], []
    for user in range(WARM):
        for item in rng.choice(10, 3, replace=False):  # recent: the first 10 items
            src.append(user), dst.append(N_USERS + item), age.append(rng.uniform(0, 5))
        for item in 10 + rng.choice(30, 3, replace=False):  # long ago
            src.append(user), dst.append(N_USERS + item), age.append(rng.uniform(40, 90))
    src, dst = np.array(src), np.array(dst)
    age = np.array(age) if timed else np.full(len(src), 50.0)
    both = lambda x, y: np.concatenate([x, y])  # noqa: E731
    eng = CSR.build(N_USERS + N_ITEMS, both(src, dst), both(dst, src), np.ones(2 * len(src)),
                    stage=np.full(2 * len(src), 1, np.int8), age=both(age, age).astype(np.float32) / SPAN)
    warm = np.zeros(N_USERS + N_ITEMS, bool)
    warm[:WARM] = True
    warm[N_USERS:] = True
    return z, Store(eng, warm, ["purchase"], SPAN)


def _valset(users: np.ndarray, positives: list[np.ndarray]) -> ValSet:
    cands = np.arange(N_USERS, N_USERS + N_ITEMS)
    return ValSet(users, cands, positives, [np.zeros(0, np.int64) for _ in users], "masked_new")


def test_recent_demand_counts_the_users_of_the_last_days_only():
    _, store = _world()
    recent, _, timed = engaged_users(store, 7.0, deep_only=True)
    assert timed and recent[:N_USERS].sum() == 0
    assert recent[N_USERS:N_USERS + 10].sum() == 3 * WARM and recent[N_USERS + 10:].sum() == 0
    _, _, untimed = engaged_users(_world(timed=False)[1], 7.0, deep_only=True)
    assert not untimed
    # ages that differ, but synthesized by prepare (data without time): no recent demand either
    assert not engaged_users(replace(store, real_time=False), 7.0, deep_only=True)[2]


def test_the_demand_direction_ranks_the_recent_items_first():
    z, store = _world()
    recent, _, _ = engaged_users(store, 7.0, deep_only=True)
    r = demand_direction(z[N_USERS:], recent[N_USERS:], 1e-3)
    assert r is not None and abs(np.linalg.norm(r) - 1) < 1e-5
    top = np.argsort(-(z[N_USERS:, :K] @ r))[:10]
    assert np.isin(top, np.arange(10)).mean() >= 0.8
    assert demand_direction(z[N_USERS:], np.zeros(N_ITEMS), 1e-3) is None


def test_cold_users_are_turned_when_val_says_so_and_kept_when_it_does_not():
    z, store = _world()
    cold_users = np.arange(WARM, N_USERS)
    rng = np.random.default_rng(1)
    # val: the cold users buy what is in demand now
    turned_z, report = place_cold_users(z, store, _valset(cold_users, [rng.choice(10, 2, replace=False)
                                                                      for _ in cold_users]), ColdUsers())
    assert report["method"] == "recent" and report["window_days"] in (7.0, 14.0, 28.0)
    assert np.array_equal(turned_z[:WARM], z[:WARM]) and np.array_equal(turned_z[N_USERS:], z[N_USERS:])
    assert not np.allclose(turned_z[cold_users], z[cold_users])
    assert np.allclose(np.linalg.norm(turned_z[cold_users], axis=1), 1, atol=1e-5)
    assert (turned_z[cold_users, K] == 0).all()  # a user's slack coordinate stays 0
    # the cold users stay apart: each keeps its own knowledge direction
    assert len(np.unique(turned_z[cold_users].round(5), axis=0)) == len(cold_users)
    # val: they buy long-tail items, which the recent direction cannot find: the knowledge view stays
    tail = [10 + rng.choice(30, 2, replace=False) for _ in cold_users]
    kept, report = place_cold_users(z, store, _valset(cold_users, tail), ColdUsers())
    assert report["method"] == "knowledge" and np.array_equal(kept, z)
    assert "noise" in report["why"]


def test_turning_in_place_writes_the_same_rows_and_the_copy_leaves_z_alone():
    z, store = _world()
    cold_users = np.arange(WARM, N_USERS)
    rng = np.random.default_rng(1)
    vs = _valset(cold_users, [rng.choice(10, 2, replace=False) for _ in cold_users])
    before = z.copy()
    copy, report = place_cold_users(z, store, vs, ColdUsers())
    assert report["method"] == "recent"
    np.testing.assert_array_equal(z, before)  # the default copies
    same, again = place_cold_users(z, store, vs, ColdUsers(), inplace=True)
    assert same is z and again == report
    np.testing.assert_array_equal(same.view(np.int32), copy.view(np.int32))  # bit for bit


@pytest.mark.parametrize("case", ["knowledge", "no cold val user", "untimed"])
def test_the_knowledge_view_is_kept_where_val_cannot_judge(case):
    z, store = _world(timed=case != "untimed")
    cold_users = np.arange(WARM, N_USERS)
    users = np.arange(WARM) if case == "no cold val user" else cold_users
    vs = _valset(users, [np.arange(3) for _ in users])
    out, report = place_cold_users(z, store, vs, ColdUsers(method="knowledge" if case == "knowledge" else "recent"))
    assert np.array_equal(out, z) and report["method"] == "knowledge" and report["why"]


def test_new_users_are_turned_as_the_export_turned_its_own(tmp_path):
    z, store = _world()
    cold_users = np.arange(WARM, N_USERS)
    rng = np.random.default_rng(1)
    out, report = place_cold_users(z, store, _valset(cold_users, [rng.choice(10, 2, replace=False)
                                                                  for _ in cold_users]), ColdUsers())
    assert np.allclose(turn_like_export(report, z[cold_users]), out[cold_users], atol=1e-6)
    assert np.array_equal(turn_like_export({"method": "knowledge"}, z[cold_users]), z[cold_users])
    # `hir refresh` reaches it through the export's meta.json
    (tmp_path / "meta.json").write_text(__import__("json").dumps({"cold_placement": {"users": report}}))
    got = place_like_export(tmp_path, store, "user", z[cold_users], np.zeros((len(cold_users), 4)),
                            np.zeros(len(cold_users), bool))
    assert np.allclose(got, out[cold_users], atol=1e-6)


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match=r"export\.cold_users\.method"):
        ColdUsers(method="popular")
    with pytest.raises(ValueError, match="windows"):
        ColdUsers(windows=[0.0])
