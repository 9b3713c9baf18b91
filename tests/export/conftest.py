"""Fixtures of the export tests: a tiny snapshot and a model trained on it (in-process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hir.train.stage import run as train
from tests.train.fixtures import TINY_DATA, TINY_MODEL, compose, tiny_snapshot


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run dir with graph/, content/ and checkpoints/ of a tiny trained model."""
    out = tiny_snapshot(tmp_path_factory.mktemp("export"))
    train(compose(out, *TINY_DATA, *TINY_MODEL))
    return out
