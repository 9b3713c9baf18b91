"""The memory cuts of the spectral base and of its val search leave every number as it was: the
base filled in place and the scorer's frame kept on the rows it reads are compared, bit for bit,
with the computation they replaced (written out here as it was, over whole (n_nodes, K) frames)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from hir.model import Filter, load_graph, validation_set
from hir.model.filters import user_filter
from hir.model.metrics import recall_per_user, row_norms
from hir.model.spectral import (
    FilterScorer,
    _entity_frame,
    base_vectors,
    engagement_matrix,
    fit_spectral,
    scale_logits,
    sparse_dense,
    trend_of,
)
from tests.train.fixtures import graph_options, tiny_snapshot

FILTERS = [Filter(), Filter(beta=0.3, response="cheby", ideal_weight=0.3),
           Filter(beta=0.4, trend_days=7.0, trend_power=1.0, user_half_life=30.0)]


def _base_as_it_was(store, basis) -> np.ndarray:
    """The base before the cut: a separate (n, K) output beside the whole entity frame."""
    n, f = store.n_nodes, basis.filter
    out = np.zeros((n, basis.rank), np.float32)
    r = engagement_matrix(store, basis.stage_base)
    item_v, deg_fit, ent = _entity_frame(store, basis, r)
    trend = trend_of(store, f)
    factor = np.zeros(n, np.float32)
    factor[ent] = (np.power(deg_fit[ent], f.beta) * trend[ent]).astype(np.float32)
    np.multiply(item_v, factor[:, None], out=out)
    inv = np.where(ent, np.power(np.maximum(deg_fit, 1e-12), -f.beta), 0.0)
    lo, _ = store.type_range("user")
    filt = user_filter(basis.sigma, f.response, f.ideal_weight)
    if f.user_half_life > 0:
        r = engagement_matrix(store, basis.stage_base, f.user_half_life)
    out[lo:lo + r.shape[0]] = np.asarray((r @ sp.diags(inv)).tocsr() @ item_v) * filt[None, :]
    down = store.down
    rows = np.repeat(np.arange(n), np.diff(down.indptr))
    norms = np.linalg.norm(out, axis=1)
    pick = (norms == 0)[rows] & (norms[down.dst] > 0)
    if pick.any():
        pr = rows[pick]
        starts = np.flatnonzero(np.r_[True, pr[1:] != pr[:-1]])
        sums = np.add.reduceat(out[down.dst[pick]].astype(np.float64), starts, axis=0)
        out[pr[starts]] = (sums / np.diff(np.r_[starts, len(pr)])[:, None]).astype(np.float32)
    return out


def _per_user_as_it_was(store, basis, val, rank: int, filt: Filter) -> tuple[np.ndarray, ...]:
    """FilterScorer.per_user before the cut (every val user): the users' fold over the whole
    (n, K) frame and a copy of the candidates' rows, then their product. Returns (fold, users,
    cands, recall)."""
    r = engagement_matrix(store, basis.stage_base)
    item_v, deg, ent = _entity_frame(store, basis, r)
    lo, _ = store.type_range("user")
    rows = r[val.users - lo] if not filt.user_half_life else \
        engagement_matrix(store, basis.stage_base, filt.user_half_life)[val.users - lo]
    inv = np.where(ent, np.power(np.maximum(deg, 1e-12), -filt.beta), 0.0)
    fold = np.asarray(rows @ sp.diags(inv) @ item_v, np.float32)
    k = min(rank, basis.rank)
    users = fold[:, :k] * user_filter(basis.sigma[:k], filt.response, filt.ideal_weight)[None, :]
    users /= np.maximum(np.linalg.norm(users, axis=1, keepdims=True), 1e-12)
    scale = np.power(np.maximum(deg[val.cands], 1e-12), filt.beta) * trend_of(store, filt)[val.cands]
    cands = item_v[val.cands, :k] * (scale * ent[val.cands])[:, None].astype(np.float32)
    return fold, users, cands, recall_per_user(users, cands, val.positives, val.masked, 20)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_snapshot(tmp_path_factory.mktemp("tiny"))


def _product_as_it_was(m, x: np.ndarray, out: np.ndarray | None = None, col_scale: np.ndarray | None = None) -> np.ndarray:
    """:func:`sparse_dense` before the cut: scipy's whole ``m @ x`` (all of x converted first),
    times ``col_scale``, cast into ``out``."""
    p = np.asarray(m @ x)
    if col_scale is not None:
        p = p * col_scale[None, :]
    if out is None:
        return p
    out[:] = p
    return out


@pytest.fixture(scope="module")
def stores(tiny_run: Path):
    """(train store, train + val store): the second has columns new since the fit (folded in)."""
    return tuple(load_graph(tiny_run / "graph", tiny_run / "content", splits, **graph_options())
                 for splits in (("train",), ("train", "val")))


@pytest.mark.parametrize("filt", FILTERS, ids=lambda f: f.label())
def test_the_base_filled_in_place_is_the_base_as_it_was(stores, filt: Filter) -> None:
    train, visible = stores
    basis = fit_spectral(train, 8, 4.0, 4, 0, filt)
    for store in (train, visible):
        want = _base_as_it_was(store, basis)
        lo, hi = store.type_range("user")
        assert np.abs(want[lo:hi]).sum() > 0 and np.abs(want[hi:]).sum() > 0  # both sides are filled
        got = base_vectors(store, basis)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(scale_logits(store, basis, got),
                                      scale_logits(store, basis, want))
    # the visible store does hold columns the fit never saw, and the frame folds them in
    r = engagement_matrix(visible, basis.stage_base)
    known = np.zeros(visible.n_nodes, bool)
    known[basis.cols] = True
    assert (~known & (np.asarray(r.sum(0)).ravel() > 0)).any()


def test_member_means_in_groups_of_runs_are_the_whole_reduceat(stores, monkeypatch: pytest.MonkeyPatch) -> None:
    from hir.model import spectral

    train = stores[0]
    basis = fit_spectral(train, 8, 4.0, 4, 0, Filter())
    whole = base_vectors(train, basis)
    monkeypatch.setattr(spectral, "FOLD_BLOCK", 2)  # many groups, and runs longer than a group
    np.testing.assert_array_equal(base_vectors(train, basis), whole)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((500, 16)).astype(np.float32)
    sizes = rng.integers(1, 9, 60)
    members, starts = rng.integers(0, 500, sizes.sum()), np.r_[0, np.cumsum(sizes)[:-1]]
    for block in (1, 5, 40, 10_000):
        monkeypatch.setattr(spectral, "FOLD_BLOCK", block)
        np.testing.assert_array_equal(spectral._member_sums(x, members, starts),
                                      np.add.reduceat(x[members].astype(np.float64), starts, axis=0))


def test_row_norms_are_linalg_norms() -> None:
    x = np.random.default_rng(0).standard_normal((40_000, 7)).astype(np.float32)
    np.testing.assert_array_equal(row_norms(x), np.linalg.norm(x, axis=1))


@pytest.mark.parametrize("filt", FILTERS, ids=lambda f: f.label())
def test_the_scorer_on_the_rows_it_reads_scores_as_it_did(stores, filt: Filter) -> None:
    basis = fit_spectral(stores[0], 8, 4.0, 4, 0, filt)
    # train + val has no val pair new to its user: the full ranking scores it (and its new columns)
    for store, protocol in zip(stores, ("masked_new", "all")):
        val = validation_set(store, None, 0, protocol)
        score = FilterScorer(store, basis, val, None, 0)
        assert len(score.rows) < store.n_nodes  # the frame is cut
        for rank in (4, 8):
            fold, users, cands, want = _per_user_as_it_was(store, basis, val, rank, filt)
            np.testing.assert_array_equal(score.fold(filt.beta, filt.user_half_life), fold)
            got_users, got_cands = score.vectors(rank, filt)
            np.testing.assert_array_equal(got_users, users)
            np.testing.assert_array_equal(got_cands, cands)
            got = score.per_user(rank, filt)
            assert np.isfinite(want).any()
            np.testing.assert_array_equal(got, want)


def test_the_product_in_column_blocks_is_scipys_whole_product(monkeypatch: pytest.MonkeyPatch) -> None:
    from hir.model import spectral

    rng = np.random.default_rng(0)
    for rows, cols, k in ((40, 300, 1), (40, 300, 2), (300, 2_000, 129), (9, 50, 37)):
        m = sp.random(rows, cols, 0.05, format="csr", random_state=rng, dtype=np.float64)
        m.data *= np.exp(rng.uniform(-20, 20, m.nnz))  # a wide range of terms: rounding shows
        x = (rng.standard_normal((cols, k)) * np.exp(rng.uniform(-20, 20, (cols, 1)))).astype(np.float32)
        g = rng.standard_normal(k).astype(np.float32)  # a column scale (the users' filter)
        for width, block in ((2, 1), (3, 7), (16, 10_000), (128, 2)):
            monkeypatch.setattr(spectral, "FOLD_COLUMNS", width)
            monkeypatch.setattr(spectral, "FOLD_BLOCK", block)  # rows of a CSR product at a time
            for mat in (m, m.tocsc(), m.T.tocsr().T):  # CSR, CSC, and a transpose (CSC) as _entity_frame has
                np.testing.assert_array_equal(sparse_dense(mat, x), mat @ x)
                assert sparse_dense(mat, x).dtype == np.float64
            got = sparse_dense(m, x, np.empty((rows, k), np.float32))
            np.testing.assert_array_equal(got, np.asarray(m @ x, np.float32))
            got = sparse_dense(m, x, np.empty((rows, k), np.float32), g)
            np.testing.assert_array_equal(got, (np.asarray(m @ x) * g[None, :]).astype(np.float32))
            y = rng.standard_normal((rows, k))  # a float64 dense side (a float64 SVD's U) too
            np.testing.assert_array_equal(sparse_dense(m.T, y), m.T @ y)


def test_every_fold_in_in_column_blocks_is_the_whole_product(stores, monkeypatch: pytest.MonkeyPatch) -> None:
    """The base's user fold-in, the fold-in of columns new since the fit (through the basis's
    float32 U) and the scorer's fold, with blocks of 3 of the 8 columns, against scipy's whole
    products."""
    from hir.model import spectral

    filt = FILTERS[2]  # with a user half-life: the decayed rows are folded too
    basis = fit_spectral(stores[0], 8, 4.0, 4, 0, filt)
    assert basis.u.dtype == np.float32 and basis.v.dtype == np.float32  # scipy converted them whole

    def run() -> list[np.ndarray]:
        out = []
        for store, protocol in zip(stores, ("masked_new", "all")):
            out += [base_vectors(store, basis), *_entity_frame(store, basis, engagement_matrix(store, basis.stage_base))]
            score = FilterScorer(store, basis, validation_set(store, None, 0, protocol), None, 0)
            out += [score.fold(filt.beta), score.fold(filt.beta, filt.user_half_life)]
        return out

    monkeypatch.setattr(spectral, "FOLD_COLUMNS", 3)
    monkeypatch.setattr(spectral, "FOLD_BLOCK", 7)  # several blocks of users too
    got = run()
    monkeypatch.setattr(spectral, "sparse_dense", _product_as_it_was)
    want = run()
    assert all(np.abs(w).sum() > 0 for w in want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
