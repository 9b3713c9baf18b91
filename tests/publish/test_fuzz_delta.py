"""Fuzzed `hir refresh` deltas (CSV and Parquet) against a snapshot: each ends in a one-line
refusal naming the file, or with every row in the delta read, never a traceback (tests/fuzz.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hir.data.snapshot import load_snapshot
from tests import fuzz

FAST, SLOW = 40, 1000


def _run(n: int, tmp_path: Path, graph: Path) -> list[fuzz.Outcome]:
    snap = load_snapshot(graph)
    outcomes = []
    for seed in range(n):
        case = fuzz.delta_case(seed, tmp_path, snap)
        outcomes.append(fuzz.classify(case, lambda p: fuzz.run_delta(p, snap)))
        case.path.unlink()
    return outcomes


def _report(outcomes: list[fuzz.Outcome]) -> str:
    return "\n".join(f"seed {o.case.seed} {o.case.mutations}: {o.message[:300]} {o.detail}"
                     for o in outcomes if o.kind == "fault")


def test_fuzzed_deltas_hold(tiny_graph: Path, tmp_path: Path) -> None:
    outcomes = _run(FAST, tmp_path, tiny_graph)
    assert not [o for o in outcomes if o.kind == "fault"], _report(outcomes)
    assert {o.kind for o in outcomes} == {"refused", "kept"}
    # a refusal names the file it refused
    assert all(o.case.path.name in o.message for o in outcomes if o.kind == "refused")


@pytest.mark.slow
def test_a_thousand_fuzzed_deltas_hold(tiny_graph: Path, tmp_path: Path) -> None:
    outcomes = _run(SLOW, tmp_path, tiny_graph)
    assert not [o for o in outcomes if o.kind == "fault"], _report(outcomes)
