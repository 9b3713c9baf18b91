"""Shared fixtures: compose real Hydra configs, shrunk for tests, writing under tmp_path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

# offline, quiet, small: set before anything imports torch/transformers
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Triton reads TRITON_INTERPRET when its own @jit helpers (triton.language.standard) are defined,
# i.e. when triton is first imported — and torch/lightning import it early. Without a GPU the
# kernels run under the interpreter, so set it here, before anything imports torch.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
REES46 = SHARED_DATA / "rees46_multicat_2019oct_head" / "events.csv.gz"
ONLINE_RETAIL = SHARED_DATA / "uci_online_retail" / "online_retail.csv.gz"


@pytest.fixture
def compose(tmp_path: Path) -> Callable:
    """``compose("data=rees46", stage="prepare")`` -> a DictConfig whose outputs go to tmp_path."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from hir.stages import register_resolvers

    register_resolvers()

    def _compose(*overrides: str, stage: str = "pipeline", output_dir: Path | None = None):
        out = output_dir or tmp_path
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            return hydra_compose(
                "config",
                overrides=[
                    f"stage={stage}", f"paths.output_dir={out}", f"paths.cache_dir={out}/.cache",
                    f"publish.store_dir={out}/store", *overrides,
                ],
            )

    return _compose


def run_hir(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run the real `hir` command in a subprocess (as a user would)."""
    exe = Path(sys.executable).with_name("hir")
    return subprocess.run(
        [str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})},
    )
