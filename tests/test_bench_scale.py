"""benchmarks/scale.py's pieces that need no long run: the synthetic log's sizes, the sections of
scale.json it keeps, and the quality table on the tiny snapshot (the real runs: by hand)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks_loader import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("scale")


def test_the_synthetic_log_grows_with_the_events(bench) -> None:
    got = dict(o.split("=") for o in bench.synthetic_overrides(1_000_000))
    assert got == {"data.adapter.n_events": "1000000", "data.adapter.n_users": "20000",
                   "data.adapter.n_products": "30000", "data.adapter.n_advertisers": "1000",
                   "data.adapter.n_campaigns": "3000"}


def test_each_part_keeps_the_others_sections(bench, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(bench, "RESULTS", tmp_path / "scale.json")
    bench.save("pipeline", "after/1000000", {"total_s": 1.0})
    bench.save("quality", "beibei", {"x": 1})
    bench.save("pipeline", "before/1000000", {"total_s": 2.0})
    got = json.loads((tmp_path / "scale.json").read_text())
    assert got == {"pipeline": {"after/1000000": {"total_s": 1.0}, "before/1000000": {"total_s": 2.0}},
                   "quality": {"beibei": {"x": 1}}}


def test_the_quality_table_on_the_tiny_snapshot(bench, tmp_path: Path, monkeypatch) -> None:
    from tests.train.fixtures import tiny_snapshot

    tiny_snapshot(tmp_path / "outputs" / "synthetic" / "scale")
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    monkeypatch.setattr(bench, "RESULTS", tmp_path / "scale.json")
    (tmp_path / "conf" / "eval" / "task").mkdir(parents=True)
    (tmp_path / "conf" / "eval" / "task" / "synthetic.yaml").write_text(
        (ROOT / "conf" / "eval" / "task" / "synthetic.yaml").read_text())
    bench.main(["quality", "--data", "synthetic", "--rank", "8", "--seeds", "0", "--caps", "0.5"])
    got = json.loads((tmp_path / "scale.json").read_text())["quality"]["synthetic"]["splits"]["test"]
    assert set(got["by_cap"]) == {"1", "0.5"}
    full, half = (c for c in got["cells"])
    assert (full["cap"], half["cap"]) == (1.0, 0.5) and half["users_fit"] < full["users_fit"]
    assert "vs_full_ci95" in half and got["users_scored"] > 0
