"""`hir train` end to end on the tiny snapshot: metrics, checkpoints, weights-only loading, reuse."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from hir.train.stage import run
from tests.train.fixtures import TINY_DATA, TINY_MODEL, compose


@pytest.fixture(scope="module")
def trained(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("trained")
    shutil.copytree(tiny_run / "graph", out / "graph")
    shutil.copytree(tiny_run / "content", out / "content")
    return out, run(compose(out, *TINY_DATA, *TINY_MODEL))


def test_train_returns_and_writes_metrics(trained):
    out, metrics = trained
    for k in (10, 20, 50):
        assert 0 <= metrics[f"val/recall@{k}"] <= 1
    assert metrics["val/recall@10"] <= metrics["val/recall@50"]
    for lvl in range(3):
        assert 0 < metrics[f"proto/usage_l{lvl}"] <= 1
        assert 0 <= metrics[f"proto/entropy_l{lvl}"] <= 1
    for part in ("distill", "align", "contrastive", "balance"):
        assert torch.isfinite(torch.tensor(metrics[f"train/{part}"]))
    report = json.loads((out / "checkpoints" / "train_metrics.json").read_text())
    assert report["metrics"] == metrics
    assert [h["epoch"] for h in report["history"]] == [0, 1]
    assert report["attention_backend"] in ("reference", "sdpa", "triton", "flex")


def test_checkpoints_every_epoch_load_weights_only(trained):
    out, _ = trained
    names = sorted(p.name for p in (out / "checkpoints").glob("*.ckpt"))
    assert names == ["epoch000.ckpt", "epoch001.ckpt", "last.ckpt"]
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)  # no arbitrary pickle
    hp = ckpt["hyper_parameters"]
    assert hp["net_config"]["dim"] == 16 and hp["net_config"]["hierarchy"]["levels"] == [2, 4, 8]
    assert any(k.startswith("teacher.") for k in ckpt["state_dict"])
    assert len(ckpt["hir_history"]) == 2


def test_existing_model_is_reused(trained):
    out, metrics = trained
    before = (out / "checkpoints" / "last.ckpt").stat().st_mtime
    again = run(compose(out, *TINY_DATA, *TINY_MODEL))
    assert again == metrics
    assert (out / "checkpoints" / "last.ckpt").stat().st_mtime == before
