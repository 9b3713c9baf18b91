"""Fuzzed Parquet event files through the generic adapter: each ends in a one-line refusal or
with every row kept or quarantined with a reason, never a traceback (tests/fuzz.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import fuzz

FAST, SLOW = 40, 1000


def _run(n: int, tmp_path: Path) -> list[fuzz.Outcome]:
    outcomes = []
    for seed in range(n):
        case = fuzz.event_case(seed, tmp_path)
        outcomes.append(fuzz.classify(case, lambda p: fuzz.run_events(p, tmp_path / "work")))
        case.path.unlink()
    return outcomes


def _report(outcomes: list[fuzz.Outcome]) -> str:
    return "\n".join(f"seed {o.case.seed} {o.case.mutations}: {o.message[:300]} {o.detail}"
                     for o in outcomes if o.kind == "fault")


def test_fuzzed_parquet_event_files_hold(tmp_path: Path) -> None:
    outcomes = _run(FAST, tmp_path)
    assert not [o for o in outcomes if o.kind == "fault"], _report(outcomes)
    assert {o.kind for o in outcomes} == {"refused", "kept"}  # the cases reach both ends


@pytest.mark.slow
def test_a_thousand_fuzzed_parquet_event_files_hold(tmp_path: Path) -> None:
    outcomes = _run(SLOW, tmp_path)
    assert not [o for o in outcomes if o.kind == "fault"], _report(outcomes)
