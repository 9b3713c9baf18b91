"""The evidence gate of the user correction (hir.model.gate): fit on constructed per-user recalls,
it opens on the sparse users only when the correction gains there beyond the noise, and closes
otherwise; applied to embeddings, it gives the users it does not reach their base."""

from __future__ import annotations

import numpy as np

from hir.model.gate import CLOSED, choose_gate, gate_users, gated


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
    assert gate["users_reached"] == 400 and gate["lo"] > 0 and gate["reach"]["lo"] > 0
    heavy = evidence > 5
    g = gated(full, closed, evidence, gate["max_events"])
    assert (g[heavy] == closed[heavy]).all() and (g[~heavy] == full[~heavy]).all()
    # opening it for everybody is a candidate that loses: it is not taken
    everybody = next(c for c in gate["candidates"] if c["users_reached"] == 800)
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
    assert any("val users" in c.get("why_not", "") for c in gate["candidates"])


def test_the_gate_opens_for_everybody_when_the_correction_beats_the_base_everywhere():
    rng = np.random.default_rng(2)
    full, closed, evidence = _users(rng, 0.1, 0.05)
    gate = choose_gate(full, closed, evidence)
    # (500 events: the first threshold that reaches every one of these users)
    assert gate["max_events"] == 500 and gate["users_reached"] == 800, gate


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
