"""The evidence gate of the user correction (hir.model.gate): fit on constructed per-user recalls,
it opens on the sparse users only when the correction gains there beyond the noise, chosen on one
half of the val users and confirmed on the other, and closes otherwise; applied to embeddings, it
gives the users it does not reach their base."""

from __future__ import annotations

import numpy as np

from hir.model.gate import CLOSED, choose_gate, compact, gate_line, gate_users, gated, halves
from hir.model.metrics import paired_gain


def _users(rng: np.random.Generator, sparse_gain: float, heavy_gain: float, n: int = 400
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(full, closed, evidence): n sparse users (1-5 events) and n heavy ones (30-300 events);
    the closed model's recall is noisy, the correction adds ``*_gain`` to it (plus noise of its own)."""
    evidence = np.concatenate([rng.integers(1, 6, n), rng.integers(30, 301, n)]).astype(np.float64)
    closed = rng.uniform(0.0, 0.4, 2 * n)
    shift = np.where(evidence <= 5, sparse_gain, heavy_gain)
    full = np.clip(closed + shift + rng.normal(0, 0.05, 2 * n), 0, 1)
    return full, closed, evidence


def test_the_gate_opens_on_the_sparse_users_only_where_the_correction_gains():
    rng = np.random.default_rng(0)
    # +0.1 for the sparse users, -0.05 for the heavy ones: the correction goes to the sparse users alone
    full, closed, evidence = _users(rng, 0.1, -0.05)
    gate = choose_gate(full, closed, evidence)
    assert gate["max_events"] == 5, gate
    # the figures are the held-out half's (200 of its 400 users are sparse)
    assert gate["users"] == 400 and gate["users_reached"] == 200 and gate["lo"] > 0 and gate["reach"]["lo"] > 0
    heavy = evidence > 5
    g = gated(full, closed, evidence, gate["max_events"])
    assert (g[heavy] == closed[heavy]).all() and (g[~heavy] == full[~heavy]).all()
    # opening it for everybody is a candidate that loses: it is not taken
    everybody = next(c for c in gate["select"]["candidates"] if c["users_reached"] == 400)
    assert not everybody["admissible"] and everybody["band_gain"] < 0


def test_the_gate_closes_when_the_correction_gains_nothing_beyond_the_noise():
    rng = np.random.default_rng(1)
    full, closed, evidence = _users(rng, 0.0, -0.05)
    gate = choose_gate(full, closed, evidence)
    assert gate["max_events"] == CLOSED and gate["users_reached"] == 0, gate
    assert (gated(full, closed, evidence, gate["max_events"]) == closed).all()
    # a large gain on a handful of sparse users does not open it either: too few to tell from noise
    small = np.flatnonzero(evidence <= 5)
    keep = np.setdiff1d(np.arange(len(full)), small[8:])
    lucky = full.copy()
    lucky[small[:8]] = closed[small[:8]] + 0.3
    gate = choose_gate(lucky[keep], closed[keep], evidence[keep])
    assert gate["max_events"] == CLOSED, gate
    assert any("val users" in c.get("why_not", "") for c in gate["select"]["candidates"])


def test_the_gate_opens_for_everybody_when_the_correction_beats_the_base_everywhere():
    rng = np.random.default_rng(2)
    full, closed, evidence = _users(rng, 0.1, 0.05)
    gate = choose_gate(full, closed, evidence)
    # (500 events: the first threshold that reaches every one of these users)
    assert gate["max_events"] == 500 and gate["users_reached"] == 400, gate


def test_halves_split_every_history_size_evenly():
    rng = np.random.default_rng(4)
    evidence = rng.integers(1, 50, 1001).astype(np.float64)
    a, b = halves(evidence, seed=3)
    assert len(a) == 501 and len(b) == 500 and not np.intersect1d(a, b).size
    assert np.union1d(a, b).size == 1001
    # sorted by history size and dealt in turn: the halves' sizes match rank for rank
    assert np.all(np.abs(np.sort(evidence[a])[:500] - np.sort(evidence[b])) <= 1)
    again = halves(evidence, seed=3)
    assert (again[0] == a).all() and (again[1] == b).all()


def test_a_gain_only_the_selection_half_shows_is_not_confirmed():
    """The choice sees a gain on the sparse users of its half; the held-out half shows none (the
    winner's curse of picking the best of a dozen thresholds on the same users): the gate closes,
    where a choice on every val user would have opened it."""
    rng = np.random.default_rng(5)
    full, closed, evidence = _users(rng, 0.0, -0.05)
    pick, _ = halves(evidence, seed=0)
    sparse = evidence <= 5
    lucky = full.copy()
    lucky[pick[sparse[pick]]] = np.clip(closed[pick[sparse[pick]]] + 0.1, 0, 1)
    # on every user the old rule sees sparse users gaining ~+0.05 beyond the noise
    assert paired_gain(lucky[sparse], closed[sparse])["lo"] > 0
    gate = choose_gate(lucky, closed, evidence, seed=0)
    assert gate["select"]["max_events"] == 5, gate["select"]
    assert gate["max_events"] == CLOSED and gate["users_reached"] == 0
    assert "not confirmed on the held-out val users" in gate["why_closed"]
    assert gate["confirm"]["max_events"] == 5 and gate["confirm"]["reach"]["lo"] <= 0
    assert "not confirmed" in gate_line(gate)
    # what a checkpoint keeps: no per-threshold candidates at any depth
    kept = compact(gate)
    assert "candidates" not in kept and "candidates" not in kept["select"]
    assert kept["select"]["max_events"] == 5


def test_gate_users_gives_the_users_it_does_not_reach_their_base():
    rng = np.random.default_rng(3)
    base = rng.normal(size=(6, 4))
    base[5] = 0  # a user without a base keeps its (knowledge-view) row
    z = rng.normal(size=(6, 5))
    is_user = np.array([True, True, True, False, False, True])
    evidence = np.array([2, 9, 40, 50, 1, 80], np.float64)
    out = gate_users(z, base, is_user, evidence, 5)
    np.testing.assert_array_equal(out[[0, 3, 4, 5]], z[[0, 3, 4, 5]])  # reached, entities, no base
    for u in (1, 2):
        np.testing.assert_allclose(out[u, :-1], base[u] / np.linalg.norm(base[u]))
        assert out[u, -1] == 0
    assert gate_users(z, base, is_user, evidence, None) is z
