"""Kill `hir train` after the first epoch's checkpoint, resume with ckpt_path=last, and get the
uninterrupted run's weights and metrics (single-threaded: bitwise reproducible on CPU)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import torch

from tests.conftest import run_hir
from tests.train.fixtures import TINY_MODEL

ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _run_dir(tiny_run: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    for sub in ("graph", "content"):
        shutil.copytree(tiny_run / sub, dest / sub)
    return dest


def _args(run: Path) -> list[str]:
    return ["train", "data=synthetic", f"hydra.run.dir={run}", f"paths.cache_dir={run}/.cache", *TINY_MODEL]


def test_resume_after_kill_matches_uninterrupted(tiny_run: Path, tmp_path: Path):
    full, crashed = _run_dir(tiny_run, tmp_path / "full"), _run_dir(tiny_run, tmp_path / "crashed")
    exe = Path(sys.executable).with_name("hir")
    env = {**os.environ, **ONE_THREAD}
    # the two first runs are independent: run them side by side
    procs = [
        subprocess.Popen([str(exe), *_args(full)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
        subprocess.Popen([str(exe), *_args(crashed), "+callbacks.crash._target_=hir.train.callbacks.CrashAfterEpoch",
                          "+callbacks.crash.epoch=0"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert procs[0].returncode == 0, outs[0][-3000:]
    assert procs[1].returncode == -signal.SIGKILL, outs[1][-3000:]
    # the step-0 point, the best epoch so far and the last epoch (what a resume starts from)
    assert sorted(p.name for p in (crashed / "checkpoints").glob("*.ckpt")) == ["best.ckpt", "init.ckpt", "last.ckpt"]
    assert not (crashed / "checkpoints" / "train_metrics.json").exists()

    resumed = run_hir(*_args(crashed), "++ckpt_path=last", cwd=tmp_path, env=ONE_THREAD)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Restored all states" in resumed.stderr + resumed.stdout

    a = torch.load(full / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(crashed / "checkpoints" / "last.ckpt", weights_only=True)
    assert a["global_step"] == b["global_step"] == 8
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for k in a["state_dict"]:
        torch.testing.assert_close(a["state_dict"][k], b["state_dict"][k], rtol=0, atol=1e-6, msg=k)
    ma = json.loads((full / "checkpoints" / "train_metrics.json").read_text())
    mb = json.loads((crashed / "checkpoints" / "train_metrics.json").read_text())
    for k, v in ma["metrics"].items():
        if k.startswith(("val/", "proto/")):
            assert abs(v - mb["metrics"][k]) < 1e-6, k
    assert [h["epoch"] for h in mb["history"]] == [-1, 0, 1]  # the history survived the crash
