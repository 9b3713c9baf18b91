"""Fixtures of the train tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.train.fixtures import tiny_snapshot


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run dir with graph/ and content/ of the tiny synthetic snapshot (shared, read-only)."""
    return tiny_snapshot(tmp_path_factory.mktemp("tiny"))
