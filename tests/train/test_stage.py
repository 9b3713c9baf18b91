"""`hir train` end to end on the tiny snapshot: metrics, checkpoints, weights-only loading, reuse."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from hir.train.stage import run
from tests.train.fixtures import TINY_DATA, TINY_MODEL, compose, graph_options, single_thread


@pytest.fixture(scope="module")
def trained(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("trained")
    shutil.copytree(tiny_run / "graph", out / "graph")
    shutil.copytree(tiny_run / "content", out / "content")
    with single_thread():
        return out, run(compose(out, *TINY_DATA, *TINY_MODEL))


def test_train_returns_and_writes_metrics(trained):
    out, metrics = trained
    assert metrics["val/recall@10"] <= metrics["val/recall@20"] <= metrics["val/recall@50"]
    for part in ("distill", "align", "catalogue", "anchor", "balance", "scale"):
        assert torch.isfinite(torch.tensor(metrics[f"train/{part}"])), part
    report = json.loads((out / "checkpoints" / "train_metrics.json").read_text())
    assert report["metrics"] == metrics
    # the step-0 point (the spectral base), then one entry per epoch
    assert [h["epoch"] for h in report["history"]] == [-1, 0, 1]
    assert report["attention_backend"] in ("reference", "sdpa", "triton", "flex")


def test_step_zero_is_the_spectral_base_and_export_takes_the_best_point(trained):
    from hir.model import SpectralBasis, load_graph, validation_set
    from hir.model.spectral import select_rank

    out, _ = trained
    report = json.loads((out / "checkpoints" / "train_metrics.json").read_text())
    # the recorded step-0 recall is what the base alone scores, computed here independently
    store = load_graph(out / "graph", out / "content", ("train",), **graph_options())
    basis = SpectralBasis.load(out / "checkpoints" / "spectral.npz")
    val = validation_set(store, None, 42, "masked_new")
    _, table = select_rank(store, basis, val, [basis.rank])
    step0 = report["history"][0]
    assert step0["val/recall@20"] == pytest.approx(table[basis.rank], abs=1e-4)
    # the best point is the argmax of the history, its checkpoint is the one recorded
    scores = [h["val/recall@20"] for h in report["history"]]
    best = report["best"]
    assert best["score"] == max(scores) and best["epoch"] == report["history"][scores.index(max(scores))]["epoch"]
    assert best["base_score"] == step0["val/recall@20"]
    assert Path(report["best_checkpoint"]).exists()
    # a rejected correction is the best epoch with its gate closed (the rest of training kept)
    closed = "closed_from" in best
    assert Path(report["best_checkpoint"]).name == ("best.ckpt" if best["epoch"] >= 0 else
                                                    "closed.ckpt" if closed else "init.ckpt")
    if closed:
        ckpt = torch.load(report["best_checkpoint"], weights_only=True)
        assert float(ckpt["state_dict"]["teacher.gate"]) == 0.0 and ckpt["closed_from"] == best["closed_from"]["checkpoint"]


def test_checkpoints_load_weights_only(trained):
    out, _ = trained
    names = sorted(p.name for p in (out / "checkpoints").glob("*.ckpt"))
    closed = "closed_from" in json.loads((out / "checkpoints" / "train_metrics.json").read_text())["best"]
    assert names == ["best.ckpt", *(["closed.ckpt"] if closed else []), "init.ckpt", "last.ckpt"]
    for name in names:
        ckpt = torch.load(out / "checkpoints" / name, weights_only=True)  # no arbitrary pickle
        hp = ckpt["hyper_parameters"]
        assert hp["net_config"]["base_dim"] == 16 and hp["net_config"]["hierarchy"]["levels"] == [2, 4, 8]
        assert any(k.startswith("teacher.") for k in ckpt["state_dict"])
    assert len(torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)["hir_history"]) == 3


def test_existing_model_is_reused(trained):
    out, metrics = trained
    before = (out / "checkpoints" / "last.ckpt").stat().st_mtime
    again = run(compose(out, *TINY_DATA, *TINY_MODEL))
    assert again == metrics
    assert (out / "checkpoints" / "last.ckpt").stat().st_mtime == before
