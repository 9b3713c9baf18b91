"""The spectral basis file (round trip, bases written by older versions), the filter family and
its choice on val, the trend factor, and the export's refit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from hir.model import Filter, SpectralBasis, SpectralConfig
from hir.model.filters import RESPONSES, response, trend_factor, user_filter
from hir.model.spectral import beats


def _basis(filt: Filter | None = None) -> SpectralBasis:
    rng = np.random.default_rng(0)
    return SpectralBasis(cols=np.array([5, 6, 9]), v=rng.random((3, 2), np.float32), u=rng.random((4, 2), np.float32),
                         sigma=np.array([0.9, 0.5], np.float32), col_degree=np.array([3.0, 1.0, 2.0], np.float32),
                         scale_ref=np.ones(5, np.float32), stage_base=4.0, filter=filt or Filter())


def _same(a: SpectralBasis, b: SpectralBasis) -> None:
    for name in ("cols", "v", "u", "sigma", "col_degree", "scale_ref"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert (a.filter, a.stage_base) == (b.filter, b.stage_base)


def test_round_trip_and_prefix(tmp_path: Path) -> None:
    basis = _basis(Filter(beta=0.4, response="cheby", ideal_weight=0.3, trend_days=14.0, trend_power=0.5,
                          user_half_life=60.0))
    basis.save(tmp_path / "spectral.npz")
    _same(SpectralBasis.load(tmp_path / "spectral.npz"), basis)
    # a basis written before the user half-life loads without one
    with np.load(tmp_path / "spectral.npz") as f:
        np.savez(tmp_path / "before.npz", **{k: f[k] for k in f.files if k != "user_half_life"})
    assert SpectralBasis.load(tmp_path / "before.npz").filter == replace(basis.filter, user_half_life=0.0)
    assert basis.truncate(1).rank == 1 and basis.truncate(1).v.shape == (3, 1)
    assert basis.truncate(1).filter == basis.filter


@pytest.mark.parametrize(("sigma_weight", "want"), [(1.0, Filter(0.5, "linear", 1.0)), (2.0, Filter(0.5, "linear", 0.5)),
                                                    (0.0, Filter(0.5, "none", 1.0))])
def test_a_basis_written_before_the_filter_family_still_loads(tmp_path: Path, sigma_weight: float, want: Filter) -> None:
    """Old files carry sigma_weight c of g = 1 + c s^2 (and some a `heldout` array): the same
    ranking is g = 1/c + s^2, degree 1/2."""
    basis = _basis()
    fields = {k: getattr(basis, k) for k in ("cols", "v", "u", "sigma", "col_degree", "scale_ref", "stage_base")}
    np.savez(tmp_path / "old.npz", **fields, sigma_weight=sigma_weight, heldout=np.array([[0, 5]], np.int64))
    old = SpectralBasis.load(tmp_path / "old.npz")
    assert old.filter == want
    g = user_filter(basis.sigma, want.response, want.ideal_weight)
    np.testing.assert_allclose(g / g[0], (1 + sigma_weight * basis.sigma**2) / (1 + sigma_weight * basis.sigma[0] ** 2),
                               rtol=1e-6)


@pytest.mark.parametrize(("rank", "want"), [("auto", [64, 128]), (32, [32])])
def test_the_ranks_tried(rank, want) -> None:
    config = SpectralConfig(rank=rank, ranks=[128, 64], stage_base=4.0, n_iter=6)
    assert config.candidate_ranks == want
    assert config.candidate_stage_bases == [4.0]
    assert SpectralConfig(rank=8, ranks=[8], stage_base="auto", stage_bases=[2, 16], n_iter=2).candidate_stage_bases == [2.0, 16.0]


def test_responses_are_low_pass_and_the_filter_is_scaled() -> None:
    sigma = np.linspace(1.0, 0.05, 50)
    for name in RESPONSES:
        h = response(name, sigma)
        assert h.shape == (50,) and np.isfinite(h).all()
    # linear is GF-CF's s^2; sharp falls faster; ChebyCF's plateau is ~1 at the top and ~0 at the bottom
    np.testing.assert_allclose(response("linear", sigma), sigma**2)
    assert (response("sharp", sigma) <= response("linear", sigma) + 1e-12).all()
    cheby = response("cheby", sigma)
    assert cheby[0] > 0.9 and abs(cheby[-1]) < 0.1 and np.all(np.diff(cheby) <= 1e-6)
    g = user_filter(sigma, "linear", 0.3)
    assert g.max() == pytest.approx(1.0) and g[-1] == pytest.approx((0.3 + 0.05**2) / 1.3, rel=1e-5)
    with pytest.raises(ValueError, match="expected one of"):
        response("gaussian", sigma)
    with pytest.raises(ValueError, match="ideal_weight > 0"):
        user_filter(sigma, "none", 0.0)


def test_trend_factor() -> None:
    recent, total = np.array([0.0, 5.0, 9.0]), np.array([9.0, 9.0, 9.0])
    np.testing.assert_allclose(trend_factor(recent, total, 1.0), [0.1, 0.6, 1.0], rtol=1e-6)
    np.testing.assert_allclose(trend_factor(recent, total, 0.5), np.sqrt([0.1, 0.6, 1.0]), rtol=1e-6)
    assert (trend_factor(recent, total, 0.0) == 1).all()


def test_a_frame_round_trips_and_turns_every_base(tmp_path: Path) -> None:
    basis = _basis()
    q, _ = np.linalg.qr(np.random.default_rng(1).standard_normal((2, 2)))
    framed = replace(basis, frame=q.astype(np.float32))
    framed.save(tmp_path / "spectral.npz")
    back = SpectralBasis.load(tmp_path / "spectral.npz")
    np.testing.assert_array_equal(back.frame, framed.frame)
    assert SpectralBasis.load(_saved(basis, tmp_path / "plain.npz")).frame is None


def _saved(basis: SpectralBasis, path: Path) -> Path:
    basis.save(path)
    return path


def test_a_step_needs_a_gain_beyond_the_paired_noise() -> None:
    rng = np.random.default_rng(0)
    old = rng.random(4000)
    noise = old + rng.normal(0, 0.05, 4000)  # the same on average: no step
    assert not beats(noise - noise.mean() + old.mean(), old, 1.96, 0.0)
    assert beats(old + 0.02, old, 1.96, 0.0)  # a small, consistent gain is a step
    assert not beats(old + 0.02, old, 1.96, 0.1)  # ... unless min_gain asks for more
    nan = old.copy()
    nan[::2] = np.nan  # users without positives are left out of the pairing
    assert beats(nan + 0.02, old, 1.96, 0.0)


def test_leave_one_out_is_the_fold_in_without_the_pair_trend_included(tiny: Path) -> None:
    from hir.model import load_graph
    from hir.model.filters import user_filter as g_of
    from hir.model.spectral import engagement_matrix, fit_spectral
    from tests.train.fixtures import graph_options

    store = load_graph(tiny / "graph", tiny / "content", ("train",), **graph_options())
    basis = fit_spectral(store, 8, 4.0, 4, 0, Filter(trend_days=7.0, trend_power=1.0))
    base = basis.base_for(store)
    assert base.trend is not None and not np.allclose(base.trend, 1.0)  # the trend is on
    r = engagement_matrix(store, basis.stage_base)
    lo, _ = store.type_range("user")
    rows = np.flatnonzero(np.diff(r.indptr) >= 2)[:5]
    users = rows + lo
    ents = r.indices[r.indptr[rows]]
    w = np.asarray(r[rows, ents]).ravel()
    got = base.leave_one_out(users, ents, w)
    # the fold-in of each user's row without the pair, from the same basis
    item_v = np.zeros((store.n_nodes, basis.rank), np.float64)
    item_v[basis.cols] = basis.v
    deg = np.zeros(store.n_nodes)
    deg[basis.cols] = basis.col_degree
    inv = np.where(deg > 0, np.power(np.maximum(deg, 1e-12), -basis.filter.beta), 0.0)
    for i, (row, e) in enumerate(zip(rows, ents)):
        ru = r[row].toarray().ravel()
        ru[e] = 0.0
        want = (ru * inv) @ item_v * g_of(basis.sigma, basis.filter.response, basis.filter.ideal_weight)
        np.testing.assert_allclose(got[i], want, rtol=1e-4, atol=1e-5)
    # a user whose only engagement was the pair has no base left: a zero row, not residue
    alone = base.leave_one_out(users[:1], ents[:1], w[:1], remaining=np.array([False]))
    assert not alone.any()


def test_a_base_from_its_parts_is_the_base(tiny: Path) -> None:
    # `hir train` needs the chosen base on train both before the task frame is set (the frame's
    # procrustes) and after (the training base): computed once, given twice
    from hir.model import load_graph, spectral
    from tests.train.fixtures import graph_options

    store = load_graph(tiny / "graph", tiny / "content", ("train",), **graph_options())
    basis = spectral.fit_spectral(store, 8, 4.0, 4, 0, Filter())
    parts = basis.parts(store)
    np.testing.assert_array_equal(parts[0], spectral.base_vectors(store, basis))
    q, _ = np.linalg.qr(np.random.default_rng(2).standard_normal((basis.rank, basis.rank)))
    framed = replace(basis, frame=q.astype(np.float32))
    want, got = framed.base_for(store), framed.base_for(store, parts)
    for name in ("vectors", "logit", "degree", "filter", "trend"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    assert not np.allclose(got.vectors, parts[0])  # the frame applied


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.train.fixtures import tiny_snapshot

    return tiny_snapshot(tmp_path_factory.mktemp("loo"))


def test_the_svd_runs_in_float32_only_where_float64_would_be_large() -> None:
    from hir.model.spectral import SVD_FLOAT32_ABOVE_GIB, svd_dtype

    # gowalla at rank 1024 (the largest real fit here) stays float64; the 10M-event log does not
    assert svd_dtype(29_858, 40_981, 1024) is np.float64
    assert svd_dtype(200_000, 300_000, 1024) is np.float32
    # the rule is the threshold, both sides of it
    n = int(SVD_FLOAT32_ABOVE_GIB * 2**30 / (8 * 266))
    assert svd_dtype(n - 10, 0, 256) is np.float64 and svd_dtype(n + 10, 0, 256) is np.float32
    assert svd_dtype(10, 10, 4, "float32") is np.float32 and svd_dtype(10**7, 10**7, 4096, "float64") is np.float64
    with pytest.raises(ValueError, match=r"spectral\.svd_dtype"):
        SpectralConfig(rank=8, ranks=[8], stage_base=4.0, n_iter=2, svd_dtype="half")


def test_a_float32_fit_is_the_float64_fit_to_float32_precision(tiny: Path) -> None:
    from hir.model import load_graph, spectral
    from tests.train.fixtures import graph_options

    store = load_graph(tiny / "graph", tiny / "content", ("train",), **graph_options())
    a = spectral.fit_spectral(store, 8, 4.0, 4, 0, Filter(), dtype="float64")
    b = spectral.fit_spectral(store, 8, 4.0, 4, 0, Filter(), dtype="float32")
    assert spectral.fit_spectral(store, 8, 4.0, 4, 0, Filter()).sigma.tolist() == a.sigma.tolist()  # auto: float64
    assert not np.array_equal(b.sigma, a.sigma)  # it did run in float32
    np.testing.assert_allclose(b.sigma, a.sigma, rtol=1e-3)
    # the same subspace (singular vectors up to sign, and rotations among near-equal values)
    overlap = np.linalg.svd(a.v.T.astype(np.float64) @ b.v.astype(np.float64), compute_uv=False)
    assert overlap.min() > 0.99
    np.testing.assert_allclose(spectral.base_vectors(store, b) @ spectral.base_vectors(store, b).T,
                               spectral.base_vectors(store, a) @ spectral.base_vectors(store, a).T, atol=1e-3)


def test_the_users_fold_in_in_blocks_is_the_whole_one(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hir.model import load_graph, spectral
    from tests.train.fixtures import graph_options

    store = load_graph(tiny / "graph", tiny / "content", ("train",), **graph_options())
    basis = spectral.fit_spectral(store, 8, 4.0, 4, 0, Filter(beta=0.4))
    whole = spectral.base_vectors(store, basis)
    monkeypatch.setattr(spectral, "FOLD_BLOCK", 3)
    lo, hi = store.type_range("user")
    assert hi - lo > 3 and np.abs(whole[lo:hi]).sum() > 0
    np.testing.assert_array_equal(spectral.base_vectors(store, basis), whole)
