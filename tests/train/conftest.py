"""Fixtures of the train tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.train.fixtures import single_thread, tiny_snapshot


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run dir with graph/ and content/ of the tiny synthetic snapshot (shared, read-only)."""
    return tiny_snapshot(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The test runs torch on one intra-op thread (:func:`tests.train.fixtures.single_thread`)."""
    with single_thread():
        yield
