"""The training catalogue built a block of rows at a time (``catalogue_vectors``, ``catalogue_cold``)
is the whole-array form it replaced, bit for bit, on random bases: several blocks, a last block of
one row, a rank that is no multiple of a vector width, zero rows and rows whose squares underflow."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hir.model import batches
from hir.model.batches import catalogue, catalogue_cold, catalogue_vectors
from hir.model.spectral import SpectralBase
from hir.nn import HirNet
from hir.nn.net import USER_TYPE

N = 3_001  # nodes; the catalogue is most of them


def _pack_as_it_was(s: torch.Tensor, logit: torch.Tensor, seed_type: torch.Tensor) -> torch.Tensor:
    a = torch.where(seed_type == USER_TYPE, torch.ones_like(logit), torch.sigmoid(logit))
    slack = torch.sqrt((1 - a * a).clamp_min(0))
    return torch.cat([s * a[:, None], slack[:, None]], dim=-1)


def _cold_as_it_was(base: SpectralBase, ids: np.ndarray) -> np.ndarray:
    return ~(np.linalg.norm(base.vectors[ids], axis=1) > 0)


def _vectors_as_it_was(store, base: SpectralBase) -> torch.Tensor:
    """catalogue_vectors before the cut: whole (M, K) gathers, normalised, packed, cold rows zeroed."""
    ids = catalogue(store, base)
    s = torch.nn.functional.normalize(torch.from_numpy(base.vectors[ids]), dim=-1)
    z = _pack_as_it_was(s, torch.from_numpy(base.logit[ids]), torch.from_numpy(store.node_type[ids].astype(np.int64)))
    z[torch.from_numpy(_cold_as_it_was(base, ids))] = 0.0
    return z


def _random(k: int, seed: int) -> tuple[SimpleNamespace, SpectralBase]:
    """A store (node types 0-3, deep pairs into types 0, 1 and 3: users are in the catalogue too)
    and a base with zero rows, tiny rows (squares underflow to 0) and a wide range of norms."""
    rng = np.random.default_rng(seed)
    node_type = rng.integers(0, 4, N).astype(np.int8)
    by_type = [np.flatnonzero(node_type == t) for t in range(4)]
    store = SimpleNamespace(node_type=node_type,
                            deep_pairs=np.c_[by_type[0][:5], np.r_[by_type[1][:3], by_type[3][:2]]],
                            val_pairs=np.c_[by_type[0][:2], by_type[0][2:4]])
    x = rng.standard_normal((N, k)) * np.exp(rng.uniform(-6, 6, (N, 1)))
    x[rng.random(N) < 0.2] = 0.0
    x[rng.random(N) < 0.05] = 1e-30  # non-zero, but every square underflows: cold by the norm test
    logit = (rng.standard_normal(N) * 5).astype(np.float32)
    base = SpectralBase(x.astype(np.float32), logit, np.ones(N, np.float32), np.ones(k, np.float32))
    return store, base


@pytest.mark.parametrize("k", [1, 8, 37])
def test_the_catalogue_in_blocks_is_the_whole_catalogue(k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    store, base = _random(k, k)
    ids = catalogue(store, base)
    assert 1_500 < len(ids) < N and (store.node_type[ids] == USER_TYPE).any()
    want, cold = _vectors_as_it_was(store, base), _cold_as_it_was(base, ids)
    assert cold.any() and (~cold).any()
    assert (base.vectors[ids][cold] != 0).any()  # the underflowing rows are cold, as before
    for block in (1, 7, 1_000, len(ids) - 1, 16_384):  # len - 1: a last block of one row
        monkeypatch.setattr(batches, "CATALOGUE_BLOCK", block)
        got = catalogue_vectors(store, base)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want), f"block {block}: {(got != want).sum()} elements differ"
        np.testing.assert_array_equal(catalogue_cold(base, ids), cold)


def test_pack_is_pack_as_it_was() -> None:
    g = torch.Generator().manual_seed(0)
    s, logit = torch.randn(513, 37, generator=g), torch.randn(513, generator=g) * 5
    seed_type = torch.randint(0, 4, (513,), generator=g)
    assert torch.equal(HirNet.pack(s, logit, seed_type), _pack_as_it_was(s, logit, seed_type))


def test_an_empty_catalogue_is_empty() -> None:
    store, base = _random(8, 0)
    store.deep_pairs, store.val_pairs = np.zeros((0, 2), np.int64), np.zeros((0, 2), np.int64)
    assert catalogue_vectors(store, base).shape == (0, 9)
