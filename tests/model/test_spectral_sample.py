"""The basis fit on a sample of users (issue 35): the stratified sample, and the sampled fit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hir.errors import HirError
from hir.model import Filter, SpectralBasis
from hir.model.usersample import activity_strata, resolve_cap, stratified_users


def test_the_cap_is_a_fraction_or_a_count() -> None:
    assert resolve_cap(None, 40) == 40
    assert resolve_cap(1.0, 40) == 40 and resolve_cap(0.25, 40) == 10 and resolve_cap(0.01, 40) == 1
    assert resolve_cap(7, 40) == 7 and resolve_cap(1000, 40) == 40 and resolve_cap(100.0, 400) == 100
    for bad in (0.0, -0.5, 0, 2.5, "half", True):
        with pytest.raises(HirError, match="sample_users"):
            resolve_cap(bad, 40)


def test_the_sample_is_seeded_proportional_and_covers_every_stratum() -> None:
    rng = np.random.default_rng(0)
    # a long tail: most users have 1-3 pairs, a few hundreds; one user alone in the top stratum
    activity = np.concatenate([rng.integers(1, 4, 5000), rng.integers(8, 64, 400), [900], np.zeros(50, np.int64)])
    strata = activity_strata(activity)
    rows, weight = stratified_users(activity, 0.1, seed=3)
    again, _ = stratified_users(activity, 0.1, seed=3)
    other, _ = stratified_users(activity, 0.1, seed=4)
    np.testing.assert_array_equal(rows, again)
    assert not np.array_equal(rows, other)
    assert np.all(np.diff(rows) > 0) and activity[rows].min() > 0  # sorted, never a user without activity
    levels, sizes = np.unique(strata[strata >= 0], return_counts=True)
    got = dict(zip(*np.unique(strata[rows], return_counts=True)))
    assert set(got) == set(levels)  # every stratum is drawn from, the lone heavy user too
    total = resolve_cap(0.1, int(sizes.sum()))
    for level, size in zip(levels, sizes):
        k = got[level]
        assert k == max(1, round(total * size / sizes.sum()))  # proportional allocation
        np.testing.assert_allclose(weight[strata[rows] == level], np.sqrt(size / k))
    # the weights make the sample's total activity estimate the population's
    assert abs((weight**2 * activity[rows]).sum() / activity.sum() - 1) < 0.05
    assert stratified_users(activity, 1.0, 0) is None and stratified_users(activity, 10**9, 0) is None


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    from hir.model import load_graph
    from tests.train.fixtures import graph_options, tiny_snapshot

    tiny = tiny_snapshot(tmp_path_factory.mktemp("sample"))
    return load_graph(tiny / "graph", tiny / "content", ("train",), **graph_options())


def test_a_cap_covering_every_user_is_todays_fit(store) -> None:
    from hir.model.spectral import fit_spectral

    today = fit_spectral(store, 8, 4.0, 4, 0)
    for cap in (1.0, 10**9):
        capped = fit_spectral(store, 8, 4.0, 4, 0, sample_users=cap)
        assert capped.rows is None and capped.row_weight is None
        for name in ("cols", "v", "u", "sigma", "col_degree", "scale_ref"):
            np.testing.assert_array_equal(getattr(capped, name), getattr(today, name), err_msg=name)


def test_a_sampled_fit_keeps_full_degrees_and_round_trips(store, tmp_path: Path) -> None:
    from hir.model.spectral import engagement_matrix, fit_spectral

    full = fit_spectral(store, 8, 4.0, 4, 0)
    half = fit_spectral(store, 8, 4.0, 4, 0, Filter(), sample_users=0.5)
    n_active = int((np.diff(engagement_matrix(store, 4.0).indptr) > 0).sum())
    assert half.rows is not None and abs(len(half.rows) - n_active / 2) <= 8  # rounding per stratum
    assert half.u.shape == (len(half.rows), half.rank)
    # the entity side is normalised by every user's column sums, not the sample's
    np.testing.assert_array_equal(half.cols, full.cols)
    np.testing.assert_array_equal(half.col_degree, full.col_degree)
    assert np.all(np.diff(half.sigma) <= 0) and not np.array_equal(half.v, full.v)
    half.save(tmp_path / "spectral.npz")
    back = SpectralBasis.load(tmp_path / "spectral.npz")
    np.testing.assert_array_equal(back.rows, half.rows)
    np.testing.assert_array_equal(back.row_weight, half.row_weight)
    assert back.sample_cap == 0.5
    np.testing.assert_array_equal(back.truncate(4).rows, half.rows)  # a prefix keeps the users


def test_the_cap_reaches_the_fit_and_the_refit(store, tmp_path: Path) -> None:
    from hir.model import SpectralConfig, fit_base, refit_aligned

    config = SpectralConfig(rank=8, ranks=[8], stage_base=4.0, n_iter=2, probe_rank=8, sample_users=0.5)
    basis, _ = fit_base(store, None, config, 0, tmp_path / "spectral.npz", reuse=False)
    saved = SpectralBasis.load(tmp_path / "spectral.npz")
    assert basis.rows is not None and saved.sample_cap == 0.5
    np.testing.assert_array_equal(saved.rows, basis.rows)
    refit, base = refit_aligned(store, saved, 2, 1)  # export's refit samples again, with its own seed
    assert refit.rows is not None and len(refit.rows) == len(basis.rows) and refit.sample_cap == 0.5
    assert base.vectors.shape == (store.n_nodes, basis.rank)


def test_refining_on_every_user_recovers_the_full_spectrum() -> None:
    import scipy.sparse as sp

    from hir.model.usersample import gram_times, refine_on_all

    rng = np.random.default_rng(0)
    m = sp.random(600, 80, density=0.08, random_state=1, format="csr") + sp.csr_matrix(
        (rng.random((600, 3)) * [3.0, 2.0, 1.5]) @ rng.random((3, 80)))  # a planted rank 3 over noise
    m = sp.csr_matrix(m)
    blocks = lambda: (m[lo:lo + 128] for lo in range(0, 600, 128))  # noqa: E731
    x = rng.standard_normal((80, 5))
    np.testing.assert_allclose(gram_times(blocks(), x), (m.T @ (m @ x)), rtol=1e-10)
    _, s_true, vt_true = np.linalg.svd(m.toarray(), full_matrices=False)
    # the start: the top vectors of a 10% row sample (what a sampled fit gives)
    _, _, vt_s = np.linalg.svd(m[rng.choice(600, 60, replace=False)].toarray(), full_matrices=False)
    v, s = refine_on_all(blocks, vt_s[:5].T, passes=8)
    np.testing.assert_allclose(s[:3], s_true[:3], rtol=1e-3)
    # the leading directions agree up to sign
    np.testing.assert_allclose(np.abs(np.sum(v[:, :3] * vt_true[:3].T, axis=0)), 1.0, atol=1e-3)
    np.testing.assert_allclose(v.T @ v, np.eye(5), atol=1e-10)
    with pytest.raises(ValueError, match="passes"):
        refine_on_all(blocks, vt_s[:5].T, passes=0)
