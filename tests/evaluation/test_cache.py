"""The evaluation's baseline fits are cached under the snapshot's hash: a second evaluation of the
same snapshot reuses exactly the fits that read nothing of the HIR export, with the same figures,
says so, and refits an arm whose settings or inputs changed."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from hir_evaluation import stage
from hir_evaluation.cache import FitCache, fit_key, snapshot_hash
from tests.evaluation.fixtures import write_export
from tests.evaluation.test_stage import FAST, TINY_TASK

BASELINE_FITS = {"ranking/baseline", "retrieval/popularity", "retrieval/itemknn", "retrieval/lightgcn",
                 "retrieval/repeat", "retrieval/gfcf"}


def test_a_second_evaluation_reuses_the_baseline_fits(compose: Callable, tiny_graph: Path, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    from tests.evaluation.tiny import TEST_START

    write_export(tiny_graph, tmp_path / "embeddings", dim=4, levels=(2,), top_k=1, event_timestamp=TEST_START)
    base = ["data=rees46", f"paths.graph_dir={tiny_graph}", TINY_TASK, "eval.require_content=false", *FAST]
    # the retrieval baselines fitted in a second process while the rankers train
    first = stage.run(compose(*base, "eval.parallel_baselines=true", stage="evaluate"))
    assert first["cache"]["reused"] == [] and set(first["cache"]["stored"]) == BASELINE_FITS
    assert set(first["cache"]["fitted_in_parallel"]) == BASELINE_FITS - {"ranking/baseline"}
    assert first["cache"]["snapshot"] == snapshot_hash(tiny_graph)

    with caplog.at_level(logging.INFO, logger="hir_evaluation.cache"):
        second = stage.run(compose(*base, "force=true", stage="evaluate"))
    assert set(second["cache"]["reused"]) == BASELINE_FITS and second["cache"]["stored"] == []
    assert "evaluate cache: reusing the ranking fit of baseline" in caplog.text
    # the same figures: the baseline's metrics and every arm's lift, which pair it with the hir fits
    for arm in ("baseline", "hir"):
        assert second["ranking"][arm]["seed_values"] == first["ranking"][arm]["seed_values"]
    assert second["ranking"]["ne_lift"]["value"] == first["ranking"]["ne_lift"]["value"]
    for arm in ("popularity", "itemknn", "lightgcn", "gfcf", "hir"):
        assert second["retrieval"][arm] == first["retrieval"][arm], arm
    # the cached lists carry the deep-funnel one (repeat: only that and the full one)
    for arm in ("popularity", "itemknn", "lightgcn", "gfcf", "repeat", "hir"):
        assert first["retrieval"]["deep_funnel"][arm]["hr@10"] is not None, arm
        assert second["retrieval"]["deep_funnel"][arm] == first["retrieval"]["deep_funnel"][arm], arm
    assert second["retrieval"]["fits"]["lightgcn"]["reused_from_cache"] is True
    assert "reused_from_cache" not in first["retrieval"]["fits"]["lightgcn"]
    assert "Baseline fits reused from the cache" in (tmp_path / "report" / "report.md").read_text()

    # one arm's setting changed: that arm alone is fitted again
    third = stage.run(compose(*base, "force=true", "eval.retrieval.itemknn.neighbours=5", stage="evaluate"))
    assert set(third["cache"]["reused"]) == BASELINE_FITS - {"retrieval/itemknn"}
    assert third["cache"]["stored"] == ["retrieval/itemknn"]


def test_the_snapshot_hash_follows_the_files(tiny_graph: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(tiny_graph, copy)
    assert snapshot_hash(copy) == snapshot_hash(tiny_graph)  # where it lies does not matter
    (copy / "quarantine").mkdir(exist_ok=True)
    (copy / "quarantine" / "x.parquet").write_bytes(b"rows evaluate never reads")
    assert snapshot_hash(copy) == snapshot_hash(tiny_graph)
    meta = copy / "meta.json"
    data = json.loads(meta.read_text())
    meta.write_text(json.dumps(data | {"created": "2031-01-01T00:00:00+00:00", "timings_s": {"split": 9.9}}))
    assert snapshot_hash(copy) == snapshot_hash(tiny_graph)  # when and how fast it was prepared: not content
    meta.write_text(json.dumps(data | {"split_bounds": data["split_bounds"] | {"max": "2031-01-01T00:00:00+00:00"}}))
    assert snapshot_hash(copy) != snapshot_hash(tiny_graph)
    (copy / "meta.json").write_text(json.dumps(data))
    events = copy / "events.parquet"
    events.write_bytes(events.read_bytes()[:-1] + b"\0")
    assert snapshot_hash(copy) != snapshot_hash(tiny_graph)


def test_keys_see_every_input_and_a_broken_entry_is_refitted(tmp_path: Path) -> None:
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    key = fit_key("baseline", {"lr": 0.1}, x)
    assert key == fit_key("baseline", {"lr": 0.1}, x.copy())
    assert key != fit_key("baseline", {"lr": 0.2}, x)
    assert key != fit_key("baseline", {"lr": 0.1}, x.astype(np.float64))
    y = x.copy()
    y[2, 1] += 1
    assert key != fit_key("baseline", {"lr": 0.1}, y)
    cache = FitCache(tmp_path, "ab" * 32)
    cache.put("ranking", "baseline", key, {"preds": [x]})
    assert np.array_equal(cache.get("ranking", "baseline", key)["preds"][0], x)
    next(cache.dir.glob("*.pkl")).write_bytes(b"truncated")
    assert cache.get("ranking", "baseline", key) is None  # unreadable: fitted again, with a warning
    assert cache.reused == ["ranking/baseline"] and not list(cache.dir.glob("*.tmp*"))
    off = FitCache(tmp_path, "cd" * 32, enabled=False)  # eval.cache.enabled=false: nothing read or written
    off.put("ranking", "baseline", key, {"preds": [x]})
    assert off.get("ranking", "baseline", key) is None and not off.dir.exists() and off.record()["stored"] == []


def test_a_failed_evaluation_ends_the_second_process(compose: Callable, tiny_graph: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from hir.errors import HirError
    from hir_evaluation.retrieval import background
    from tests.evaluation.tiny import TEST_START

    started: list[background.Background] = []

    class Spy(background.Background):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            started.append(self)

    def fail(*args, **kwargs):
        raise HirError("the rankers failed")

    monkeypatch.setattr(background, "Background", Spy)
    monkeypatch.setattr(stage, "ranking_section", fail)
    write_export(tiny_graph, tmp_path / "embeddings", dim=4, levels=(2,), top_k=1, event_timestamp=TEST_START)
    with pytest.raises(HirError, match="the rankers failed"):
        stage.run(compose("data=rees46", f"paths.graph_dir={tiny_graph}", TINY_TASK, "eval.require_content=false",
                          *FAST, "eval.parallel_baselines=true", stage="evaluate"))
    assert len(started) == 1 and not started[0]._proc.is_alive()  # ended, not waited for


def test_the_pipeline_fits_the_retrieval_baselines_ahead_of_evaluate(compose: Callable, tiny_graph: Path,
                                                                       tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    from hir.stages import run_pipeline
    from tests.evaluation.tiny import VAL_START

    # an export of the train period (the default), stamped at val's start: the prewarm predicts
    # that from export.visible_splits, and the rankers fit on val (no cross-fitting), so its fits
    # carry the keys evaluate looks up
    write_export(tiny_graph, tmp_path / "embeddings", dim=4, levels=(2,), top_k=1, event_timestamp=VAL_START)
    base = ["data=rees46", f"paths.graph_dir={tiny_graph}", TINY_TASK, "eval.require_content=false", *FAST,
            "export.visible_splits=[train]", "pipeline.stages=[evaluate]"]
    with caplog.at_level(logging.INFO):
        metrics = run_pipeline(compose(*base, stage="pipeline"))["evaluate"]
    assert "fitted ahead of evaluate (retrieval/popularity" in caplog.text
    assert set(metrics["cache"]["reused"]) == BASELINE_FITS and metrics["cache"]["stored"] == []
    # the same figures as an evaluation that fits them itself
    alone = stage.run(compose(*base[:-1], "force=true", "eval.cache.enabled=false", stage="evaluate"))
    for arm in ("popularity", "itemknn", "lightgcn", "gfcf", "repeat", "hir"):
        assert metrics["retrieval"][arm] == alone["retrieval"][arm], arm
    for arm in ("baseline", "hir"):
        assert metrics["ranking"][arm]["seed_values"] == alone["ranking"][arm]["seed_values"], arm
    assert metrics["ranking"]["ne_lift"] == alone["ranking"]["ne_lift"]

    # a wrong prediction (val seen) only misses the cache: evaluate fits those arms itself
    missed = run_pipeline(compose(*base, "export.visible_splits=[train,val]", "force=true",
                                  f"eval.cache.dir={tmp_path / 'other_cache'}", stage="pipeline"))["evaluate"]
    assert metrics["retrieval"]["lightgcn"] == missed["retrieval"]["lightgcn"]
    assert "retrieval/lightgcn" in missed["cache"]["stored"]


def test_no_prewarm_without_evaluate_or_the_cache(compose: Callable, tiny_graph: Path) -> None:
    base = ["data=rees46", f"paths.graph_dir={tiny_graph}", TINY_TASK, *FAST]
    assert stage.prewarm(compose(*base, "pipeline.stages=[prepare,train]", stage="pipeline")) is None
    assert stage.prewarm(compose(*base, "eval.cache.enabled=false", stage="pipeline")) is None
    assert stage.prewarm(compose(*base, "eval.prewarm=false", stage="pipeline")) is None
