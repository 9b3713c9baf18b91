"""The spectral basis file: its round trip, and bases written by older versions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hir.model import SpectralBasis, SpectralConfig


def _basis() -> SpectralBasis:
    rng = np.random.default_rng(0)
    return SpectralBasis(cols=np.array([5, 6, 9]), v=rng.random((3, 2), np.float32), u=rng.random((4, 2), np.float32),
                         sigma=np.array([2.0, 1.0], np.float32), col_degree=np.array([3.0, 1.0, 2.0], np.float32),
                         scale_ref=np.ones(5, np.float32), sigma_weight=1.0, stage_base=4.0)


def _same(a: SpectralBasis, b: SpectralBasis) -> None:
    for name in ("cols", "v", "u", "sigma", "col_degree", "scale_ref"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert (a.sigma_weight, a.stage_base) == (b.sigma_weight, b.stage_base)


def test_round_trip_and_prefix(tmp_path: Path) -> None:
    basis = _basis()
    basis.save(tmp_path / "spectral.npz")
    _same(SpectralBasis.load(tmp_path / "spectral.npz"), basis)
    assert basis.truncate(1).rank == 1 and basis.truncate(1).v.shape == (3, 1)


def test_a_basis_written_with_the_old_heldout_pairs_still_loads(tmp_path: Path) -> None:
    basis = _basis()
    fields = {k: getattr(basis, k) for k in ("cols", "v", "u", "sigma", "col_degree", "scale_ref", "sigma_weight",
                                              "stage_base")}
    np.savez(tmp_path / "old.npz", **fields, heldout=np.array([[0, 5]], np.int64))
    _same(SpectralBasis.load(tmp_path / "old.npz"), basis)


@pytest.mark.parametrize(("rank", "want"), [("auto", [64, 128]), (32, [32])])
def test_the_ranks_tried(rank, want) -> None:
    config = SpectralConfig(rank=rank, ranks=[128, 64], stage_base=4.0, sigma_weight=1.0, n_iter=6)
    assert config.candidate_ranks == want
