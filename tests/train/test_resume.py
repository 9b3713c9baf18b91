"""A run killed after its first epoch's checkpoint and resumed with ckpt_path=last ends with the
uninterrupted run's weights and metrics (single-threaded: bitwise reproducible on CPU).

The fast test runs both in-process: the real ``CrashAfterEpoch`` callback, whose kill raises
instead of ending the process, then a plain re-run, which resumes from ``last.ckpt`` by itself. The ``slow``
test does it through the `hir` command with a real SIGKILL."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hir.train import callbacks
from hir.train.stage import run
from tests.conftest import run_hir
from tests.train.fixtures import TINY_MODEL, compose

ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
CRASH = ["+callbacks.crash._target_=hir.train.callbacks.CrashAfterEpoch", "+callbacks.crash.epoch=0"]


def _run_dir(tiny_run: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    for sub in ("graph", "content"):
        shutil.copytree(tiny_run / sub, dest / sub)
    return dest


def assert_resumed_equals_uninterrupted(full: Path, crashed: Path, exact: bool) -> None:
    """The two runs' last checkpoints and train_metrics.json agree (``exact``: bit for bit)."""
    a = torch.load(full / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(crashed / "checkpoints" / "last.ckpt", weights_only=True)
    assert a["global_step"] == b["global_step"] == 8
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for k in a["state_dict"]:
        if exact:
            assert torch.equal(a["state_dict"][k], b["state_dict"][k]), k
        else:
            torch.testing.assert_close(a["state_dict"][k], b["state_dict"][k], rtol=0, atol=1e-6, msg=k)
    ma = json.loads((full / "checkpoints" / "train_metrics.json").read_text())
    mb = json.loads((crashed / "checkpoints" / "train_metrics.json").read_text())
    for k, v in ma["metrics"].items():
        if k.startswith(("val/", "proto/")):
            assert (v == mb["metrics"][k]) if exact else abs(v - mb["metrics"][k]) < 1e-6, k
    assert [h["epoch"] for h in mb["history"]] == [-1, 0, 1]  # the history survived the crash
    if exact:
        assert mb["history"] == ma["history"]


class Killed(Exception):
    """What the fake SIGKILL raises (an exception ends the fit like a kill: nothing after it is written)."""


def test_resume_in_process_matches_uninterrupted(tiny_run: Path, tmp_path: Path, one_thread: None,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    full, crashed = _run_dir(tiny_run, tmp_path / "full"), _run_dir(tiny_run, tmp_path / "crashed")
    kills: list[tuple[int, int]] = []

    def kill(pid: int, sig: int) -> None:
        kills.append((pid, sig))
        raise Killed(f"signal {sig} to {pid}")

    monkeypatch.setattr(callbacks, "os", SimpleNamespace(kill=kill, getpid=os.getpid))
    run(compose(full, "data=synthetic", *TINY_MODEL))
    assert kills == []  # the uninterrupted run has no crash callback
    with pytest.raises(Killed):
        run(compose(crashed, "data=synthetic", *TINY_MODEL, *CRASH))
    assert kills == [(os.getpid(), signal.SIGKILL)]  # killed once, itself, when epoch 1 started
    # the step-0 point, the best epoch so far and the last epoch (what a resume starts from)
    assert sorted(p.name for p in (crashed / "checkpoints").glob("*.ckpt")) == ["best.ckpt", "init.ckpt", "last.ckpt"]
    assert not (crashed / "checkpoints" / "train_metrics.json").exists()
    assert torch.load(crashed / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4

    # the next plain `hir train` of that dir resumes by itself (no ckpt_path needed)
    with caplog.at_level("INFO"):
        run(compose(crashed, "data=synthetic", *TINY_MODEL))
    assert "an earlier training here was interrupted; resuming from it" in caplog.text
    assert "Restored all states" in caplog.text
    assert_resumed_equals_uninterrupted(full, crashed, exact=True)


@pytest.mark.slow
def test_resume_after_kill_matches_uninterrupted(tiny_run: Path, tmp_path: Path):
    full, crashed = _run_dir(tiny_run, tmp_path / "full"), _run_dir(tiny_run, tmp_path / "crashed")
    exe = Path(sys.executable).with_name("hir")
    env = {**os.environ, **ONE_THREAD}

    def args(out: Path) -> list[str]:
        return ["train", "data=synthetic", f"hydra.run.dir={out}", f"paths.cache_dir={out}/.cache", *TINY_MODEL]

    # the two first runs are independent: run them side by side
    procs = [
        subprocess.Popen([str(exe), *args(full)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
        subprocess.Popen([str(exe), *args(crashed), *CRASH], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True),
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert procs[0].returncode == 0, outs[0][-3000:]
    assert procs[1].returncode == -signal.SIGKILL, outs[1][-3000:]
    # the step-0 point, the best epoch so far and the last epoch (what a resume starts from)
    assert sorted(p.name for p in (crashed / "checkpoints").glob("*.ckpt")) == ["best.ckpt", "init.ckpt", "last.ckpt"]
    assert not (crashed / "checkpoints" / "train_metrics.json").exists()

    resumed = run_hir(*args(crashed), "++ckpt_path=last", cwd=tmp_path, env=ONE_THREAD)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Restored all states" in resumed.stderr + resumed.stdout
    assert_resumed_equals_uninterrupted(full, crashed, exact=False)
