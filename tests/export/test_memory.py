"""The export's memory cuts leave its numbers as they were: each piece computed a block of rows at
a time, or from row chunks instead of a whole copy, is compared bit for bit with the whole-array
computation it replaced (more rows than one block, so several blocks run)."""

from __future__ import annotations

import numpy as np
import pytest

from hir.export.embed import Embedder
from hir.export.project import Projection, fit_projection, lift, token_vectors
from hir.model.served import fit_basis
from hir.model.spectral import _procrustes, _rows64

N, K, D = 40_000, 24, 6  # rows over two blocks of 16,384


@pytest.fixture(scope="module")
def z() -> np.ndarray:
    """(N, K + 1) unit rows: entities with slack, the first quarter users (zero slack)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, K + 1)).astype(np.float32)
    x[: N // 4, -1] = 0.0
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_the_projection_fit_from_row_chunks_is_the_fit_on_copies(z: np.ndarray) -> None:
    is_user = np.arange(N) < N // 4
    warm = np.random.default_rng(1).random(N) < 0.8
    got = fit_projection(z, is_user, warm, D, "v")
    want, kept = fit_basis(z[warm & is_user, :-1], z[warm & ~is_user, :-1], D)
    np.testing.assert_array_equal(got.basis, want)
    assert got.report["captured_user"] == round(kept["captured_user"], 4)


def test_token_vectors_in_blocks_are_the_whole_copy(z: np.ndarray) -> None:
    is_user = np.arange(N) < N // 4
    projection = fit_projection(z, is_user, np.ones(N, bool), D, "v")
    assert isinstance(projection, Projection)
    projected = projection.apply(z, is_user)
    served = projected.copy()
    moved = np.random.default_rng(2).random(N) < 0.3  # rows "placed" in the served space
    served[moved] = np.roll(served[moved], 1, axis=0)
    want = lift(served, projection.basis)
    kept = (projected == served).all(axis=1)
    want[kept] = z[kept]
    got = token_vectors(z, projected, served, projection)
    assert 0 < kept.sum() < N
    np.testing.assert_array_equal(got, want)


def test_directions_of_rows_in_blocks_are_the_directions_of_their_copy(z: np.ndarray) -> None:
    embedder = object.__new__(Embedder)  # semantic reads no state of the embedder
    rows = np.sort(np.random.default_rng(3).choice(N, 30_000, replace=False))
    np.testing.assert_array_equal(embedder.semantic_rows(z, rows), embedder.semantic(z[rows]))


def test_procrustes_from_float64_rows_is_the_formula_on_whole_copies(z: np.ndarray) -> None:
    rng = np.random.default_rng(4)
    src = z[:, :-1]
    dst = src @ np.linalg.qr(rng.standard_normal((K, K)))[0].astype(np.float32)
    both = rng.random(N) < 0.9
    m = src[both].astype(np.float64).T @ dst[both].astype(np.float64)
    left, _, right = np.linalg.svd(m)
    rows = np.flatnonzero(both)
    np.testing.assert_array_equal(_procrustes(_rows64(src, rows), _rows64(dst, rows)),
                                  (left @ right).astype(np.float32))


def test_top1_tokens_in_chunks_are_the_tokens_of_every_row_at_once() -> None:
    import torch

    from hir.export.fits import top1_of
    from hir.nn import HierarchicalTokenizer

    rng = np.random.default_rng(5)
    x = rng.standard_normal((3000, 32)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    tok = HierarchicalTokenizer(32, (4, 16, 64), 3, 0.1, 0.2)
    tok.init_from_data(torch.from_numpy(x), iters=5, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = [lp.argmax(1).numpy() for lp in tok.log_probs(torch.from_numpy(x))]
    for chunk in (1000, 4096):
        got = top1_of(tok, x, chunk)
        assert [len(np.unique(g)) > 1 for g in got] == [True] * 3
        for g, w in zip(got, whole, strict=True):
            np.testing.assert_array_equal(g, w)
