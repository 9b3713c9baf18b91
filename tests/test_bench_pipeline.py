"""benchmarks/pipeline.py's pieces that need no pipeline run: the log lines it reads, the refusal
to reuse a run dir, and the docs section it writes (the run itself: `--data synthetic`, by hand)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmarks_loader import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("pipeline")


def test_stage_seconds_are_the_lines_hir_logs(bench, caplog) -> None:
    import logging

    from hir.stages import log as hir_log

    # the line hir/stages.py's run_stage writes, so a changed format fails here
    with caplog.at_level(logging.INFO, logger=hir_log.name):
        hir_log.info("stage %s: done in %.1fs", "train", 12.34)
    text = "[x][hir][INFO] stage prepare: start\n" + caplog.text + "[x][hir][INFO] stage export: done in 3.0s\n"
    assert bench.stage_seconds(text) == {"train": 12.3, "export": 3.0}


def test_a_used_run_dir_is_refused(bench, tmp_path: Path) -> None:
    (tmp_path / "graph").mkdir()
    with pytest.raises(SystemExit):
        bench.main(["--data", "synthetic", "--out-dir", str(tmp_path), "--results", str(tmp_path / "r.json")])


def test_section_has_a_row_per_stage_and_the_verdict(bench) -> None:
    record = {"data": "synthetic", "overrides": ["data.adapter.n_users=200"], "mode": "stages", "git": "abc",
              "measured_at": "2026-01-01T00:00:00+00:00", "machine": {"cpus": 2}, "budget_s": 600.0,
              "stages": [{"stage": "prepare", "seconds": 3.4, "wall_s": 21.7, "peak_rss_mib": 215.8},
                         {"stage": "train", "seconds": 700.0, "wall_s": 720.0, "peak_rss_mib": 2048.0}],
              "total_s": 703.4, "wall_s": 741.7, "peak_rss_mib": 2048.0, "within_budget": False, "failed": None}
    text = bench.section({"synthetic": record})
    assert text.startswith("<!-- pipeline:begin -->") and text.rstrip().endswith("<!-- pipeline:end -->")
    assert "| train | 700.0 | 720.0 | 2048 |" in text and "over the 600 s budget" in text


def test_the_prewarm_record_is_the_line_the_pipeline_logs(bench, caplog) -> None:
    import logging

    from hir_evaluation.retrieval import background

    # the line Background.wait writes, so a changed format fails here
    with caplog.at_level(logging.INFO, logger=background.log.name):
        background.log.info("evaluate prewarm: %s fitted ahead of evaluate (%s) in %.0fs",
                            "retrieval/lightgcn, ranking/baseline", "retrieval/lightgcn 323s, ranking/baseline 24s", 641.2)
    line = f"[t][{background.log.name}][INFO] {caplog.records[-1].getMessage()}\n"
    record = bench.prewarm_record("[x][hir][INFO] stage export: done in 3.0s\n" + line)
    assert record == {"fits": {"retrieval/lightgcn": 323.0, "ranking/baseline": 24.0}, "wall_s": 641.0}
    assert bench.prewarm_record("[x][hir][INFO] stage export: done in 3.0s\n") is None


def test_the_rss_guard_stops_a_growing_process_tree(bench, tmp_path: Path) -> None:
    import os
    import sys

    # a child that starts a grandchild which allocates 400 MiB and then sleeps: the guard must see
    # the grandchild (the tree, not the child alone) and kill both
    code = ("import subprocess, sys; subprocess.run([sys.executable, '-c', "
            "'import time; b = bytearray(400 * 2**20); b[::4096] = b\"x\" * len(b[::4096]); time.sleep(60)'])")
    rc, wall, _, stopped = bench.run_guarded([sys.executable, "-c", code], tmp_path / "log", dict(os.environ),
                                             max_rss_mib=200.0, poll_s=0.1)
    assert rc != 0 and wall < 30
    assert stopped is not None and "RSS" in stopped and "guard" in stopped


def test_the_time_guard_stops_a_slow_child_and_no_guard_changes_nothing(bench, tmp_path: Path) -> None:
    import os
    import sys

    rc, wall, _, stopped = bench.run_guarded([sys.executable, "-c", "import time; time.sleep(60)"],
                                             tmp_path / "log", dict(os.environ), timeout_s=1.0, poll_s=0.1)
    assert rc != 0 and wall < 30 and stopped is not None and "time guard" in stopped
    rc, _, rss, stopped = bench.run_guarded([sys.executable, "-c", "print('ok')"], tmp_path / "log2",
                                            dict(os.environ), max_rss_mib=10_000.0, timeout_s=60.0)
    assert (rc, stopped) == (0, None) and rss > 0
    assert (tmp_path / "log2").read_text().strip() == "ok"
