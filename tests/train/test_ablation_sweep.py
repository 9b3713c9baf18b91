"""`hir pipeline experiment=ablation -m` runs every arm end to end (train, export, evaluate) on a
tiny shared snapshot, each arm really changes the model, and benchmarks/ablation.py gathers the
cells into the results page.

The end-to-end sweep (seven cells through the real command) is ``slow``. The fast tests cover
the same ground in-process: every arm composed and built (each differs from ``full`` in exactly
its own switch), the sweep's arms and seeds, and two real cells (train, export, evaluate)
gathered by benchmarks/ablation.py into the page."""

from __future__ import annotations

import json
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from hydra.utils import instantiate
from omegaconf import OmegaConf

from hir.export.embed import resolve_checkpoint
from tests.conftest import ROOT, run_hir
from tests.train.fixtures import TINY_DATA, TINY_MODEL, compose, graph_options

ARMS = ("full", "no_bias_table", "no_exposure", "no_distill", "no_primitives", "no_content", "no_transformer")
# one cell of the sweep, shrunk: one epoch of one batch, a small base, a short ranker
CELL = [*TINY_DATA, *TINY_MODEL, "trainer.max_epochs=1", "datamodule.seeds_per_epoch=48", "spectral.rank=8",
        "eval.ranker.max_steps=20", "eval.ranker.eval_every=10", "eval.bootstrap.resamples=10"]


def assert_each_arm_changes_its_own_switch(nets: dict[str, dict], weights: dict[str, dict]) -> None:
    """``nets``/``weights``: per arm, the checkpoint's ``net_config`` and ``objective.weights``."""
    assert set(nets) == set(weights) == set(ARMS)
    full = nets["full"]
    # each arm differs from the full model in exactly its own switch
    changed = {arm: sorted(k for k in full if nets[arm][k] != full[k]) for arm in ARMS}
    assert changed["full"] == [] and changed["no_bias_table"] == ["bias"] and changed["no_exposure"] == ["bias"]
    assert nets["no_bias_table"]["bias"]["table"] is False and nets["no_exposure"]["bias"]["exposure"] is False
    # the bias switches are the only difference inside the bias config
    for arm, switch in (("no_bias_table", "table"), ("no_exposure", "exposure")):
        assert sorted(k for k in full["bias"] if nets[arm]["bias"][k] != full["bias"][k]) == [switch], arm
    assert changed["no_primitives"] == ["primitive_tokens"] and changed["no_content"] == ["content"]
    assert changed["no_transformer"] == ["transformer"] and changed["no_distill"] == []  # loss weights, not the net
    assert weights["no_distill"]["distill"] == weights["no_distill"]["align"] == 0.0
    assert weights["full"]["distill"] > 0 and weights["full"]["align"] > 0
    # no other arm touches the loss weights
    assert all(weights[arm] == weights["full"] for arm in ARMS if arm != "no_distill")


def _sweep_config() -> OmegaConf:
    """experiment=ablation with its hydra node (what the sweeper reads)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from hir.stages import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose("config", overrides=["experiment=ablation"], return_hydra_config=True)


def test_sweep_lists_every_arm_and_three_seeds() -> None:
    cfg = _sweep_config()
    params = cfg.hydra.sweeper.params
    assert [a.strip() for a in params["+ablation"].split(",")] == list(ARMS)
    assert sorted(p.stem for p in (ROOT / "conf" / "ablation").glob("*.yaml")) == sorted(ARMS)  # no arm left out
    assert [int(s) for s in str(params["seed"]).split(",")] == [0, 1, 2]
    assert list(cfg.pipeline.stages) == ["train", "export", "evaluate"]
    assert OmegaConf.to_container(cfg.hydra.callbacks, resolve=False)["prepare_once"] == {
        "_target_": "hir.sweeps.PrepareOnce", "stages": ["prepare", "enrich"]}


def test_each_arm_differs_from_full_in_its_own_switch(tiny_run: Path, tmp_path: Path) -> None:
    """Every arm composed as the sweeper composes it and its module built (no training): what a
    checkpoint's hyper-parameters would hold."""
    from hir.data.snapshot import load_snapshot
    from hir.model import load_graph

    store = load_graph(load_snapshot(tiny_run / "graph"), tiny_run / "content", ("train",), **graph_options())
    nets, weights = {}, {}
    for arm in ARMS:
        cfg = compose(tmp_path, "experiment=ablation", f"+ablation={arm}", *CELL, stage="pipeline")
        sizes = {k: int(store.spec[k]) for k in ("n_types", "n_stages", "content_dim", "n_recency")}
        module = instantiate(cfg.model, net=sizes | {"base_dim": int(cfg.spectral.rank)}, data={})
        nets[arm], weights[arm] = module.hparams["net_config"], module.hparams["objective"]["weights"]
    assert_each_arm_changes_its_own_switch(nets, weights)


@pytest.mark.slow  # two real cells (train, export, evaluate): ~35 s; the arms' composition runs fast above
def test_cells_gather_into_the_results_page(tiny_run: Path, tmp_path: Path, one_thread: None,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Two real cells (train, export, evaluate in-process on the shared tiny snapshot, as a sweep
    job runs them) in a multirun layout, gathered by benchmarks/ablation.py."""
    from hir.stages import run_pipeline

    sweep = tmp_path / "mr"
    arms = ("full", "no_transformer")
    nets = {}
    for num, arm in enumerate(arms):
        job = sweep / str(num)
        overrides = ["experiment=ablation", *CELL, f"paths.graph_dir={tiny_run / 'graph'}",
                     f"paths.content_dir={tiny_run / 'content'}", f"+ablation={arm}", "seed=0"]
        cfg = compose(job, *overrides, stage="pipeline")
        assert list(cfg.pipeline.stages) == ["train", "export", "evaluate"]
        run_pipeline(cfg)
        # what Hydra writes into every job dir: the job's overrides
        (job / ".hydra").mkdir()
        (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([*overrides, "stage=pipeline"]))
        metrics = json.loads((job / "report" / "metrics.json").read_text())
        masked = metrics["retrieval"]["masked_new_to_user"]
        assert masked["hir"]["recall@20"] is not None and masked["lightgcn"]["recall@20"] is None  # arms filtered
        assert not (job / "graph").exists()  # read from the shared snapshot
        ckpt = resolve_checkpoint("best", job / "checkpoints")
        nets[arm] = torch.load(ckpt, weights_only=True)["hyper_parameters"]["net_config"]
    assert sorted(k for k in nets["full"] if nets["no_transformer"][k] != nets["full"][k]) == ["transformer"]

    out = tmp_path / "docs" / "results.md"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["ablation.py", "--reuse", f"synthetic={sweep}", "--out", str(out),
                                      "--json", str(tmp_path / "ablation.json")])
    runpy.run_path(str(ROOT / "benchmarks" / "ablation.py"), run_name="__main__")
    page = out.read_text()
    assert page.startswith("# Results") and "Regenerate: `python benchmarks/ablation.py" in page
    assert "**Partial run:** 1 seed(s) on synthetic" in page
    assert (out.parent / "results_ablation.png").stat().st_size > 1000
    doc = json.loads((tmp_path / "ablation.json").read_text())
    summary = doc["summary"]["synthetic"]["arms"]
    assert list(summary) == list(arms)
    for num, arm in enumerate(arms):
        s = summary[arm]["masked_recall@20"]
        assert s["n"] == 1 and f"| {arm} |" in page
        # the page's figure is the cell's own evaluation
        cell = json.loads((sweep / str(num) / "report" / "metrics.json").read_text())
        assert s["mean"] == cell["retrieval"]["masked_new_to_user"]["hir"]["recall@20"]
    assert summary["no_transformer"]["vs_full"]["masked_recall@20"]["verdict"] == "one seed: no spread to judge by"


@pytest.mark.slow
def test_ablation_sweep_runs_every_arm(tiny_run: Path, tmp_path: Path) -> None:
    shared = tmp_path / "shared"  # the sweep's shared snapshot: PrepareOnce finds it and reuses it
    for sub in ("graph", "content"):
        shutil.copytree(tiny_run / sub, shared / sub)
    sweep = tmp_path / "mr"
    res = run_hir("pipeline", "experiment=ablation", *CELL, "hydra.sweeper.params.seed=0", f"hydra.run.dir={shared}",
                  f"hydra.sweep.dir={sweep}", f"paths.cache_dir={tmp_path}/.cache", "-m", cwd=tmp_path, timeout=900)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-4000:]
    assert "preparing the shared inputs once" in log
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert len(jobs) == len(ARMS)
    nets, weights = {}, {}
    for job in jobs:
        overrides = (job / ".hydra" / "overrides.yaml").read_text()
        arm = next(a for a in ARMS if f"ablation={a}\n" in overrides + "\n")
        metrics = json.loads((job / "report" / "metrics.json").read_text())
        masked = metrics["retrieval"]["masked_new_to_user"]
        assert masked["hir"]["recall@20"] is not None and masked["lightgcn"]["recall@20"] is None  # arms filtered
        assert not (job / "graph").exists()  # read from the shared snapshot, not prepared again
        ckpt = resolve_checkpoint("best", job / "checkpoints")
        hp = torch.load(ckpt, weights_only=False)["hyper_parameters"]
        nets[arm], weights[arm] = hp["net_config"], hp["objective"]["weights"]
    assert_each_arm_changes_its_own_switch(nets, weights)

    out = tmp_path / "docs" / "results.md"
    gen = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ablation.py"), "--reuse", f"synthetic={sweep}",
                          "--out", str(out), "--json", str(tmp_path / "ablation.json")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert gen.returncode == 0, gen.stderr[-3000:]
    page = out.read_text()
    assert page.startswith("# Results") and "Regenerate: `python benchmarks/ablation.py" in page
    assert (out.parent / "results_ablation.png").stat().st_size > 1000
    doc = json.loads((tmp_path / "ablation.json").read_text())
    arms = doc["summary"]["synthetic"]["arms"]
    assert list(arms) == list(ARMS)
    for arm in ARMS:
        s = arms[arm]["masked_recall@20"]
        assert s["n"] == 1 and s["mean"] is not None and f"| {arm} |" in page
