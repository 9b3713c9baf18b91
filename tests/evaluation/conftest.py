"""Fixtures of the evaluation tests: the hand-built snapshot of tests/evaluation/tiny.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.evaluation.tiny import write_snapshot


@pytest.fixture
def tiny_graph(tmp_path: Path) -> Path:
    return write_snapshot(tmp_path)
