"""`hir train` end to end on the tiny snapshot: metrics, checkpoints, weights-only loading, reuse."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from hir.export.embed import resolve_checkpoint
from hir.model import SPECTRAL_FILE
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
    # recorded by name in the checkpoint dir (so the run dir may move), as export resolves it
    assert report["best_checkpoint"] == best["checkpoint"] and report["last_checkpoint"] == "last.ckpt"
    best_path = resolve_checkpoint("best", out / "checkpoints")
    assert best_path == out / "checkpoints" / report["best_checkpoint"] and best_path.exists()
    # a rejected correction is the best epoch with its gate closed (the rest of training kept)
    closed = "closed_from" in best
    assert report["best_checkpoint"] == ("best.ckpt" if best["epoch"] >= 0 else "closed.ckpt" if closed else "init.ckpt")
    if closed:
        ckpt = torch.load(best_path, weights_only=True)
        assert float(ckpt["state_dict"]["teacher.gate"]) == 0.0 and ckpt["closed_from"] == best["closed_from"]["checkpoint"]


def test_a_moved_run_dir_resolves_its_own_best_checkpoint(trained, tmp_path: Path):
    """train_metrics.json names the best checkpoint so that a run dir moved elsewhere (a removed
    worktree, a copied run) resolves to its own file, not to where it was trained."""
    out, _ = trained
    moved = tmp_path / "moved"
    shutil.copytree(out / "checkpoints", tmp_path / "copy" / "checkpoints")
    (tmp_path / "copy").rename(moved)
    report = json.loads((moved / "checkpoints" / "train_metrics.json").read_text())
    got = resolve_checkpoint("best", moved / "checkpoints")
    assert got == moved / "checkpoints" / Path(report["best_checkpoint"]).name and got.exists()


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


def test_a_model_reused_under_other_settings_says_which(trained, caplog: pytest.LogCaptureFixture):
    out, metrics = trained
    before = (out / "checkpoints" / "last.ckpt").stat().st_mtime
    with caplog.at_level("INFO", logger="hir.train.stage"):
        assert run(compose(out, *TINY_DATA, *TINY_MODEL)) == metrics
    assert "other settings" not in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="hir.train.stage"):
        again = run(compose(out, *TINY_DATA, *TINY_MODEL, "seed=7", "trainer.log_every_n_steps=3"))
    assert again == metrics and (out / "checkpoints" / "last.ckpt").stat().st_mtime == before
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "model.seed: " in warned[0] and "force=true" in warned[0]
    assert "log_every_n_steps" not in warned[0]  # how it runs, not what it learns
    report = json.loads((out / "checkpoints" / "train_metrics.json").read_text())
    assert set(report["inputs"]) == {"graph", "content"} and report["inputs"]["graph"]  # (no content meta.json here)
    meta = out / "graph" / "meta.json"
    before_meta = meta.read_bytes()
    try:  # a new snapshot under the same settings (a `hir prepare force=true`)
        meta.write_bytes(before_meta + b"\n")
        caplog.clear()
        with caplog.at_level("INFO", logger="hir.train.stage"):
            assert run(compose(out, *TINY_DATA, *TINY_MODEL)) == metrics
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warned) == 1 and "graph: another graph/meta.json" in warned[0]
    finally:
        meta.write_bytes(before_meta)


def test_correction_alone_on_a_warm_start_keeps_everything_else(trained, tmp_path: Path):
    """`model.train_parts=correction` from a transformer-off run: the same basis, the correction
    trained, and every other teacher weight (the knowledge view, the prototypes, the scale heads:
    what export reads) bit-identical to the warm-start run's."""
    from hir.train.module import CORRECTION_PARAMS

    base_out, _ = trained
    out = tmp_path / "full"
    shutil.copytree(base_out / "graph", out / "graph")
    shutil.copytree(base_out / "content", out / "content")
    with single_thread():
        run(compose(out, *TINY_DATA, *TINY_MODEL, "model.net.transformer=true", "model.train_parts=correction",
                    f"model.warm_start={base_out / 'checkpoints'}"))
    assert (out / "checkpoints" / "spectral.npz").read_bytes() == (base_out / "checkpoints" / "spectral.npz").read_bytes()
    before = torch.load(resolve_checkpoint("best", base_out / "checkpoints"), weights_only=True)["state_dict"]
    after = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
    assert after["hyper_parameters"]["train_parts"] == "correction"
    learned = [k for k in before if k.startswith(("net.", "teacher."))
               and k.split(".", 1)[1].startswith(CORRECTION_PARAMS)]
    kept = [k for k in before if k.startswith("teacher.") and k not in learned]
    assert kept and all(torch.equal(before[k], after["state_dict"][k]) for k in kept)
    assert any(not torch.equal(before[k], after["state_dict"][k]) for k in learned if k.startswith("net."))


def test_correction_alone_needs_the_transformer_and_a_matching_warm_start(trained, tmp_path: Path):
    from hir.errors import InputError

    base_out, _ = trained
    # (Hydra's instantiate wraps the module's HirError; `hir` prints its cause)
    with pytest.raises(Exception, match=r"needs model\.net\.transformer=true"):
        run(compose(tmp_path, *TINY_DATA, *TINY_MODEL, "model.train_parts=correction",
                    f"paths.graph_dir={base_out / 'graph'}", f"paths.content_dir={base_out / 'content'}"))
    with pytest.raises(InputError, match="does not exist"):
        run(compose(tmp_path, *TINY_DATA, *TINY_MODEL, f"model.warm_start={tmp_path / 'nowhere.ckpt'}",
                    f"paths.graph_dir={base_out / 'graph'}", f"paths.content_dir={base_out / 'content'}"))
    with pytest.raises(InputError, match="differs in"), single_thread():
        run(compose(tmp_path, *TINY_DATA, *TINY_MODEL, "model.net.depth=2", f"model.warm_start={base_out / 'checkpoints'}",
                    f"paths.graph_dir={base_out / 'graph'}", f"paths.content_dir={base_out / 'content'}"))


# the default's training (model.train_parts=auto: none without the transformer) on the tiny model
UNTRAINED = [*(o for o in TINY_MODEL if not o.startswith("model.train_parts=")), "model.train_parts=none"]


def test_nothing_trained_exports_the_step_zero_model(trained, tmp_path: Path):
    """`model.train_parts=none`: no batch runs; the step-0 point (the spectral base, prototypes
    initialised by k-means) is validated, saved as init.ckpt and is what export takes; its val
    recall is the trained run's step-0 recall, and the knowledge view is the initial one."""
    base_out, _ = trained
    out = tmp_path / "none"
    shutil.copytree(base_out / "graph", out / "graph")
    shutil.copytree(base_out / "content", out / "content")
    with single_thread():
        run(compose(out, *TINY_DATA, *UNTRAINED))
    report = json.loads((out / "checkpoints" / "train_metrics.json").read_text())
    trained_report = json.loads((base_out / "checkpoints" / "train_metrics.json").read_text())
    assert [h["epoch"] for h in report["history"]] == [-1] and report["global_step"] == 0
    assert report["stopped_by"] == "train_parts=none"
    # no training task was cut (its second store and fit), so the basis keeps the SVD's own frame
    assert report["task"]["kind"] == "none" and report["task"]["target_users"] == 0
    assert "frame" not in np.load(out / "checkpoints" / SPECTRAL_FILE)
    assert trained_report["task"]["kind"] != "none" and "frame" in np.load(base_out / "checkpoints" / SPECTRAL_FILE)
    best_path = resolve_checkpoint("best", out / "checkpoints")
    assert report["best_checkpoint"] == "init.ckpt" and best_path.exists()
    step0 = report["history"][0]["val/recall@20"]
    assert step0 == pytest.approx(trained_report["history"][0]["val/recall@20"], abs=1e-6)
    ckpt = torch.load(best_path, weights_only=True)
    assert bool(ckpt["state_dict"]["prototypes_ready"])
    assert ckpt["hyper_parameters"]["train_parts"] == "none"
    # the trained run's knowledge view moved; this one's is the initial one (the same seed's init)
    init_trained = torch.load(base_out / "checkpoints" / "init.ckpt", weights_only=True)["state_dict"]
    know = [k for k in init_trained if k.startswith("teacher.") and "know" in k]
    assert know and all(torch.equal(init_trained[k], ckpt["state_dict"][k]) for k in know)
    with pytest.raises(Exception, match="train_parts=none trains nothing"):
        run(compose(tmp_path / "t", *TINY_DATA, *UNTRAINED, "model.net.transformer=true",
                    f"paths.graph_dir={out / 'graph'}", f"paths.content_dir={out / 'content'}"))


def test_train_parts_auto_trains_only_with_the_transformer(tmp_path: Path):
    """The default ``model.train_parts=auto``: everything with the transformer, nothing without it;
    an unknown value is refused with the accepted ones."""
    from hir.errors import HirError
    from hir.train.module import resolve_train_parts

    cfg = compose(tmp_path, *TINY_DATA)
    assert cfg.model.train_parts == "auto" and cfg.model.net.transformer is False
    assert resolve_train_parts("auto", False) == "none" and resolve_train_parts("auto", True) == "all"
    assert resolve_train_parts("correction", True) == "correction"
    with pytest.raises(HirError, match="expected one of"):
        resolve_train_parts("some", False)
