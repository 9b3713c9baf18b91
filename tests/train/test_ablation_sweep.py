"""`hir pipeline experiment=ablation -m` runs every arm end to end (train, export, evaluate) on a
tiny shared snapshot, each arm really changes the model, and benchmarks/ablation.py gathers the
cells into the results page."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from tests.conftest import ROOT, run_hir
from tests.train.fixtures import TINY_DATA, TINY_MODEL

ARMS = ("full", "no_bias_table", "no_exposure", "no_distill", "no_primitives", "no_content", "no_transformer")


def test_ablation_sweep_runs_every_arm(tiny_run: Path, tmp_path: Path) -> None:
    shared = tmp_path / "shared"  # the sweep's shared snapshot: PrepareOnce finds it and reuses it
    for sub in ("graph", "content"):
        shutil.copytree(tiny_run / sub, shared / sub)
    sweep = tmp_path / "mr"
    res = run_hir("pipeline", "experiment=ablation", *TINY_DATA, *TINY_MODEL, "trainer.max_epochs=1",
                  "datamodule.seeds_per_epoch=48", "spectral.rank=8", "eval.ranker.max_steps=20", "eval.ranker.eval_every=10",
                  "eval.bootstrap.resamples=10", "hydra.sweeper.params.seed=0", f"hydra.run.dir={shared}",
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
        ckpt = json.loads((job / "checkpoints" / "train_metrics.json").read_text())["best_checkpoint"]
        hp = torch.load(ckpt, weights_only=False)["hyper_parameters"]
        nets[arm], weights[arm] = hp["net_config"], hp["objective"]["weights"]
    assert set(nets) == set(ARMS)
    full = nets["full"]
    # each arm differs from the full model in exactly its own switch
    changed = {arm: sorted(k for k in full if nets[arm][k] != full[k]) for arm in ARMS}
    assert changed["full"] == [] and changed["no_bias_table"] == ["bias"] and changed["no_exposure"] == ["bias"]
    assert nets["no_bias_table"]["bias"]["table"] is False and nets["no_exposure"]["bias"]["exposure"] is False
    assert changed["no_primitives"] == ["primitive_tokens"] and changed["no_content"] == ["content"]
    assert changed["no_transformer"] == ["transformer"] and changed["no_distill"] == []  # loss weights, not the net
    assert weights["no_distill"]["distill"] == weights["no_distill"]["align"] == 0.0
    assert weights["full"]["distill"] > 0 and weights["full"]["align"] > 0

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
