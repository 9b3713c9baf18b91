"""Fixtures of the train tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.train.fixtures import tiny_snapshot


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run dir with graph/ and content/ of the tiny synthetic snapshot (shared, read-only)."""
    return tiny_snapshot(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def one_thread() -> Iterator[None]:
    """torch on one intra-op thread for the test (bitwise reproducible on CPU, and no idle threads
    spinning against the other processes of a busy 2-core machine); restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
