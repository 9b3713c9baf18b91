"""`hir evaluate` end to end: the real rees46 snapshot with a contract-shaped export (file
fallback), the report's schema and files, reuse, and the errors users see."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hir.errors import HirError, InputError
from hir_evaluation import stage
from tests.conftest import REES46, run_hir
from tests.evaluation.fixtures import write_content, write_export

# small budgets: the code paths, not the numbers, are under test here
FAST = [
    "eval.parallel_baselines=false",  # no second process per test (tests/evaluation/test_cache.py runs one)
    "eval.ranker.max_steps=60", "eval.ranker.eval_every=20", "eval.bootstrap.resamples=20", "eval.ranker_seeds=2",
    "eval.retrieval.lightgcn.max_epochs=2", "eval.retrieval.lightgcn.steps_per_epoch=3", "eval.retrieval.lightgcn.batch_size=1024",
    "eval.retrieval.itemknn.neighbours=20", "eval.retrieval.gfcf.rank=32", "eval.diagnostics.map_points=300",
]
# hir with rare ids mapped to "unknown": off by default (conf/eval/default.yaml says why)
HIR_RARE = ("+eval.ranking.hir_rare={_target_: hir_evaluation.ranking.arms.hir_rare.HirForRareIds, max_events: 20, "
            "user_max_events: -1}")
# merged into conf/eval/task/rees46.yaml (the composed default): reset its 30-minute window
TINY_TASK = "eval.task={ranking:{_target_:hir_evaluation.tasks.RankingTask,candidate_stages:[view],window:null}}"


@pytest.mark.skipif(not REES46.exists(), reason=f"needs {REES46}")
def test_rees46_report(compose: Callable, tmp_path: Path, rees46_graph: Path) -> None:
    shutil.copytree(rees46_graph, tmp_path / "graph")  # the session's rees46 snapshot
    write_export(tmp_path / "graph", tmp_path / "embeddings", tmp_path / "hierarchy")
    write_content(tmp_path / "graph", tmp_path / "content")
    # the same export again, as a second run would write it: token stability must be perfect
    shutil.copytree(tmp_path / "embeddings", tmp_path / "other" / "embeddings")
    cfg = compose("data=rees46", *FAST, f"eval.compare_embeddings_dir={tmp_path / 'other' / 'embeddings'}",
                  HIR_RARE, stage="evaluate")
    metrics = stage.run(cfg)

    report = tmp_path / "report"
    # the off-by-default arm comes back with one config line, after the default arms
    assert metrics["ranking"]["arms"] == ["baseline", "hir", "hir_tokens", "content", "hir_rare"]
    assert metrics["ranking"]["hir_rare"]["auc"] is not None
    assert json.loads((report / "metrics.json").read_text()) == metrics
    ranking, retrieval = metrics["ranking"], metrics["retrieval"]
    for arm in ("baseline", "hir", "content"):
        assert {"auc", "ne", "calibration"} <= set(ranking[arm])
        # the fixture's SVD embeddings and hashed content carry signal: every arm ranks the test
        # period's purchases above chance (a shuffled or constant prediction gives 0.5)
        assert ranking[arm]["auc"] > 0.55, (arm, ranking[arm]["auc"])
    # the lift is the mean over ranker seeds of the relative NE difference of exactly these two
    # arms' same-seed rankers, inside its interval, with its seed spread
    lift = ranking["ne_lift"]
    per_seed = [(b["ne"] - h["ne"]) / b["ne"] for b, h in zip(ranking["baseline"]["seed_values"],
                                                            ranking["hir"]["seed_values"])]
    assert len(per_seed) == 2 and lift["seeds"] == pytest.approx(per_seed)
    assert lift["value"] == pytest.approx(np.mean(per_seed))
    assert lift["seed_spread"] == pytest.approx([min(per_seed), max(per_seed)])
    assert lift["ci"][0] <= lift["value"] <= lift["ci"][1]
    # every fit's holdout curve is kept, and the report shows the fits and the curves
    fit = ranking["baseline"]["fit"]
    assert [c["seed"] for c in fit["curves"]] == ranking["seeds"] == [ranking["seeds"][0], ranking["seeds"][0] + 1000]
    assert all(c["curve"] and c["steps_per_epoch"] > 0 for c in fit["curves"])
    assert fit["best_steps"] == [c["curve"][b - 1]["step"] for c, b in zip(fit["curves"], fit["best_checks"])]
    # the few-events and cold-entity slices carry every arm's lift with its interval
    for sl in ranking["slices"][:2]:
        for key in ("ne_lift", "ne_lift_hir_tokens", "ne_lift_hir_rare", "ne_lift_content"):
            if key in sl:
                assert len(sl[key]["ci"]) == 2 and len(sl[key]["seeds"]) == 2
    # "why this?": top-ranked test pairs explained from the export files (nothing is published)
    assert len(ranking["explanations"]) == 3 and {e["source"] for e in ranking["explanations"]} == {"files"}
    n_products = json.loads((tmp_path / "graph" / "meta.json").read_text())["nodes"]["product"]
    for arm in ("hir", "popularity", "itemknn", "lightgcn", "content", "gfcf"):
        r = retrieval[arm]
        # recall only grows with K; each arm finds 10x more than a random top-20 would (20 / products)
        assert r["recall@10"] <= r["recall@20"] <= r["recall@50"], (arm, r)
        assert r["recall@20"] > 10 * 20 / n_products, (arm, r["recall@20"], n_products)
    # collaborative baselines on the raw history beat global popularity on this data
    assert retrieval["itemknn"]["recall@20"] > retrieval["popularity"]["recall@20"]
    assert retrieval["gfcf"]["recall@20"] > retrieval["popularity"]["recall@20"], retrieval["gfcf"]
    assert retrieval["arms"]["gfcf"] == "baseline" and "| gfcf |" in (report / "report.md").read_text()
    assert metrics["sources"]["fallback"] is True and "FALLBACK" in metrics["sources"]["notes"][0]
    assert ranking["task"]["candidate_stages"] == ["view"]  # conf/eval/task/rees46.yaml
    assert set(metrics["diagnostics"]["nmi"]["product"]) == {"l0", "l1"}
    stability = metrics["diagnostics"]["stability"]
    assert [s["level"] for s in stability] == [0, 1]
    assert all(s["jaccard"] == 1.0 and s["top1_agreement"] == 1.0 and s["nmi"] == pytest.approx(1.0) for s in stability)
    assert all(s["entities"] == n_products for s in stability)
    html = (report / "report.html").read_text()
    # lift, recall@K, repeat vs explore, calibration, ranker curves, token usage, embedding map + the LightGCN curve
    assert html.count("data:image/png;base64,") == 8 and "src=\"http" not in html
    assert "## Slices" in (report / "report.md").read_text()
    # the deep-funnel protocol: every arm with a deep list, its table in the report
    deep = retrieval["deep_funnel"]
    assert deep["users"] == retrieval["users"] and "purchase" in deep["protocol"]
    for arm in ("hir", "popularity", "itemknn", "lightgcn", "content", "gfcf", "repeat"):
        assert deep[arm]["hr@10"] is not None and deep[arm]["recall@10"] <= deep[arm]["hr@10"], arm
    assert "### Retrieval, deep funnel" in (report / "report.md").read_text()

    # idempotent: the finished report is reused, force=true recomputes
    (report / "report.md").write_text("marker")
    assert stage.run(cfg)["created"] == metrics["created"]
    assert (report / "report.md").read_text() == "marker"


def test_without_hir_the_arms_are_empty(compose: Callable, tiny_graph: Path) -> None:
    cfg = compose("data=rees46", f"paths.graph_dir={tiny_graph}", TINY_TASK, "eval.require_hir=false",
                  "eval.require_content=false", *FAST, stage="evaluate")
    metrics = stage.run(cfg)
    assert metrics["ranking"]["hir"]["auc"] is None and metrics["retrieval"]["hir"]["recall@20"] is None
    assert metrics["ranking"]["ne_lift"]["value"] is None
    assert metrics["ranking"]["baseline"]["auc"] is not None
    assert any("no HIR embeddings" in n for n in metrics["sources"]["notes"])


def test_missing_inputs_are_user_errors(compose: Callable, tiny_graph: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="run `hir prepare`"):
        stage.run(compose("data=rees46", f"paths.graph_dir={tmp_path / 'nowhere'}", stage="evaluate"))
    with pytest.raises(InputError, match=r"eval\.require_hir=false"):
        stage.run(compose("data=rees46", f"paths.graph_dir={tiny_graph}", TINY_TASK, stage="evaluate"))


def test_point_in_time_protocols(compose: Callable, tiny_graph: Path, tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from tests.evaluation.tiny import TEST_START

    base = ["data=rees46", f"paths.graph_dir={tiny_graph}", TINY_TASK, "eval.require_content=false", *FAST]
    # stamped at test_start (the export saw train + val): no fit-period row may use the embeddings,
    # so every arm is cross-fitted on the test period
    write_export(tiny_graph, tmp_path / "embeddings", dim=4, levels=(2,), top_k=1, event_timestamp=TEST_START)
    metrics = stage.run(compose(*base, stage="evaluate"))
    ranking = metrics["ranking"]
    assert ranking["fit_splits"] == ["test"] and "cross-fit" in ranking["protocol"]
    assert ranking["hir"]["auc"] is not None and not ranking["skipped"]
    assert ranking["hir"]["feature_coverage"]["fit_has_hir_user"] == 0.0
    assert any("cross-fitted" in n for n in metrics["sources"]["notes"])
    # stamped after every row: nothing is point-in-time valid, the arm is skipped with the reason,
    # which fails the stage (after the report is written) unless eval.require_hir=false allows it
    write_export(tiny_graph, tmp_path / "embeddings", dim=4, levels=(2,), top_k=1,
                 event_timestamp=datetime(2030, 1, 1, tzinfo=UTC))
    skip = [*base, "eval.ranker_crossfit_fallback=false"]
    with pytest.raises(HirError, match=r"ranking arm hir skipped: hir features reach 0\.00%.*eval\.require_hir=false"):
        stage.run(compose(*skip, "force=true", stage="evaluate"))
    written = json.loads((tmp_path / "report" / "metrics.json").read_text())
    assert written["ranking"]["hir"]["skipped"].startswith("hir features reach 0.00% of the rows")
    assert "| hir | skipped | – | – | skipped: hir features reach 0.00% of the rows" in \
        (tmp_path / "report" / "report.md").read_text()
    with pytest.raises(HirError, match="ranking arm hir skipped"):  # the reused report fails the same way
        stage.run(compose(*skip, stage="evaluate"))
    metrics = stage.run(compose(*skip, "eval.require_hir=false", stage="evaluate"))
    assert "hir" in metrics["ranking"]["skipped"] and metrics["ranking"]["hir"]["auc"] is None
    assert metrics["ranking"]["fit_splits"] == ["val"]
    assert metrics["retrieval"]["hir"]["recall@20"] is not None  # retrieval serves the latest version


def test_cli_prints_errors_without_traceback(tmp_path: Path) -> None:
    res = run_hir("evaluate", "data=rees46", f"hydra.run.dir={tmp_path}", cwd=tmp_path, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 2
    assert "run `hir prepare`" in out and "Traceback" not in out


def test_a_retired_version_is_not_evaluated_silently(compose: Callable, tiny_graph: Path, tmp_path: Path) -> None:
    """The run's manifest pins a version its store has retired since (its Feast views and
    Milvus collections are gone): say so, and how to go on."""
    manifest = {"version": "v1", "status": "retired", "live_version": "v3", "store_dir": "/s",
                "feast": {"repo_path": "/r", "feature_service": "rankers_v1", "feature_views": {}, "entities": {},
                          "offline_files": {}, "live_feature_service": "rankers"},
                "milvus": {"uri": "/m", "aliases": {}, "collections": {}}}
    (tmp_path / "publish").mkdir()
    (tmp_path / "publish" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match=r"pins version 'v1', which its store retired \(live there: 'v3'\).*"
                                         r"eval\.hir_source=files"):
        stage.run(compose("data=rees46", f"paths.graph_dir={tiny_graph}", TINY_TASK, *FAST, stage="evaluate"))


def test_a_dataset_without_text_runs_no_content_arms(compose: Callable, tiny_graph: Path, tmp_path: Path) -> None:
    """Content vectors exist but no entity has text (gowalla's check-ins): the content arms are
    not run, the stage succeeds with require_content on, and a note says why."""
    content = tmp_path / "content"
    nodes = pl.read_parquet(tiny_graph / "nodes" / "product.parquet")
    content.mkdir(parents=True)
    pl.DataFrame({"node_id": nodes["node_id"], "has_text": [False] * nodes.height,
                  "text_vec": pl.Series(np.zeros((nodes.height, 4), np.float32)).cast(pl.List(pl.Float32)),
                  "attr_vec": pl.Series(np.zeros((nodes.height, 2), np.float32)).cast(pl.List(pl.Float32)),
                  "content_hash": ["0"] * nodes.height}).write_parquet(content / "product.parquet")
    write_export(tiny_graph, tmp_path / "embeddings", dim=4, levels=(2,), top_k=1)
    metrics = stage.run(compose("data=rees46", f"paths.graph_dir={tiny_graph}", f"paths.content_dir={content}",
                                TINY_TASK, *FAST, stage="evaluate"))
    assert metrics["ranking"]["content"]["auc"] is None and not metrics["ranking"]["skipped"]
    assert metrics["retrieval"]["content"]["recall@20"] is None and metrics["retrieval"]["hir"]["recall@20"] is not None
    assert any("has text" in n and "content arms are not run" in n for n in metrics["sources"]["notes"])


def test_a_report_is_reused_only_for_the_inputs_and_settings_it_was_made_from(compose: Callable,
                                                                             tmp_path: Path) -> None:
    (tmp_path / "graph").mkdir()
    (tmp_path / "graph" / "meta.json").write_text('{"created": "a"}')
    (tmp_path / "embeddings").mkdir()
    (tmp_path / "embeddings" / "meta.json").write_text('{"model_version": "v1"}')
    (tmp_path / "report").mkdir()
    cfg = compose("data=rees46", stage="evaluate")
    from omegaconf import OmegaConf

    metrics = {"inputs": stage.evaluated_inputs(cfg), "config": OmegaConf.to_container(cfg.eval, resolve=True)}
    assert metrics["inputs"]["content"] is None and metrics["inputs"]["version"] is None
    (tmp_path / "report" / "metrics.json").write_text(json.dumps(metrics))
    assert stage.reusable_report(cfg) == metrics
    # gates and speed settings do not count, nor does where the cache lives
    assert stage.reusable_report(compose("data=rees46", "eval.require_content=false", "eval.ranker_workers=1",
                                         f"eval.cache.dir={tmp_path / 'elsewhere'}", stage="evaluate")) == metrics
    assert stage.reusable_report(compose("data=rees46", "force=true", stage="evaluate")) is None
    assert "eval.bootstrap.resamples: 200 -> 20" in stage.stale_report(
        metrics, compose("data=rees46", "eval.bootstrap.resamples=20", stage="evaluate"))
    (tmp_path / "embeddings" / "meta.json").write_text('{"model_version": "v2"}')  # a new export
    assert stage.stale_report(metrics, cfg) == "its inputs changed since it was written (embeddings)"
    assert stage.reusable_report(cfg) is None
    (tmp_path / "publish").mkdir()
    (tmp_path / "publish" / "manifest.json").write_text('{"version": "v2"}')
    assert "(embeddings, version)" in stage.stale_report(metrics, cfg)
    assert "older hir" in stage.stale_report({"config": metrics["config"]}, cfg)
