"""Export applies the correction's evidence gate (hir.model.gate): users with more visible events
than the checkpoint's gate admits get exactly their base vector, the others the corrected one,
and entities are untouched."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch

from hir.export.embed import Embedder
from hir.model import SPECTRAL_FILE


def _gated_checkpoint(trained_run: Path, out: Path, max_events: float) -> Path:
    """The tiny run's last.ckpt with the transformer's correction switched on and open (a random
    head behind a non-zero gate: every user's vector moves off its base) and an evidence gate of
    ``max_events``, beside a copy of its spectral basis."""
    src = trained_run / "checkpoints"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / SPECTRAL_FILE, out / SPECTRAL_FILE)
    ckpt = torch.load(src / "last.ckpt", map_location="cpu", weights_only=True)
    hp = dict(ckpt["hyper_parameters"])
    hp["net_config"] = dict(hp["net_config"]) | {"transformer": True}
    state = dict(ckpt["state_dict"])
    gen = torch.Generator().manual_seed(0)
    for who in ("net", "teacher"):
        state[f"{who}.gate"] = torch.tensor(0.5)
        state[f"{who}.head.weight"] = torch.randn(state[f"{who}.head.weight"].shape, generator=gen)
    path = out / "gated.ckpt"
    torch.save({"state_dict": state, "hyper_parameters": hp, "hir_gate": {"max_events": max_events}}, path)
    return path


def test_users_beyond_the_gate_get_their_base_and_the_others_the_correction(trained_run: Path, tmp_path: Path):
    first = Embedder(trained_run / "checkpoints" / "last.ckpt", trained_run / "graph", trained_run / "content")
    st = first.store
    users = np.arange(*st.type_range("user"))
    has_base = np.linalg.norm(first.base.vectors[users], axis=1) > 0
    tau = float(np.median(st.exposure[users][has_base]))  # half the users are beyond the gate
    ckpt = _gated_checkpoint(trained_run, tmp_path / "checkpoints", tau)
    z = {g: Embedder(ckpt, trained_run / "graph", trained_run / "content", user_gate=g).embed_snapshot()
         for g in ("checkpoint", "open", "closed")}
    gated = Embedder(ckpt, trained_run / "graph", trained_run / "content")
    assert gated.gate_max_events == tau and gated.net.corrects
    heavy = users[has_base & (st.exposure[users] > tau)]
    sparse = users[has_base & (st.exposure[users] <= tau)]
    assert len(heavy) and len(sparse)
    # heavy users: exactly the base's direction, the slack 0 (the correction closed)
    base = gated.base.vectors[heavy]
    np.testing.assert_allclose(z["checkpoint"][heavy, :-1], base / np.linalg.norm(base, axis=1, keepdims=True),
                               rtol=0, atol=1e-6)
    assert (z["checkpoint"][heavy, -1] == 0).all()
    np.testing.assert_allclose(z["checkpoint"][heavy], z["closed"][heavy], rtol=0, atol=1e-6)
    # sparse users: the corrected vector, which the open correction gives too and which is not the base
    np.testing.assert_array_equal(z["checkpoint"][sparse], z["open"][sparse])
    assert np.abs(z["open"][sparse] - z["closed"][sparse]).max() > 1e-3
    # entities (warm: their base; cold: the knowledge view) are the same under every gate
    ents = np.setdiff1d(np.arange(st.n_nodes), users)
    np.testing.assert_array_equal(z["checkpoint"][ents], z["open"][ents])
    np.testing.assert_array_equal(z["checkpoint"][ents], z["closed"][ents])
