"""`hir validate` on a real (tiny) prepared snapshot + an export written per the contract: the
checks CI runs on a small pipeline output, and the gate in front of `hir publish`."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hir.stages import user_error
from hir.validate import stage
from hir.validate.binding import NotValidated, require_validated


def _run_dir(cfg) -> Path:
    return Path(cfg.paths.output_dir)


def test_clean_outputs_pass_and_are_bound_to_their_files(make_run) -> None:
    cfg = make_run("v1")
    metrics = stage.run(cfg)
    run = _run_dir(cfg)
    assert metrics["success"] and metrics["evaluated"] > 100
    result = json.loads((run / "validation" / "result.json").read_text())
    assert result["success"] and result["failures"] == []
    assert set(result["files"]) == {"meta.json", *(f"{t}.parquet" for t in ("advertiser", "campaign", "category",
                                                                                "product", "user"))}
    assert (run / "validation" / "data_docs" / "index.html").exists()
    assert require_validated(run / "embeddings", run / "validation")["model_version"] == "v1"

    # the same files are not re-validated; an edited file is refused by publish's gate
    assert stage.run(cfg)["timings_s"] == metrics["timings_s"]
    path = run / "embeddings" / "user.parquet"
    frame = pl.read_parquet(path)
    frame.with_columns(pl.col("model_version").str.replace("v1", "v1-edited")).write_parquet(path)
    with pytest.raises(NotValidated, match=r"user\.parquet \(content changed\)"):
        require_validated(run / "embeddings", run / "validation")


def test_corrupted_embeddings_fail_with_table_column_and_ids(make_run) -> None:
    """A NaN, a short vector and a duplicate id: validation fails naming each (a user error: the
    `hir validate` command prints the message, no traceback, and exits 2, as tests/test_cli.py
    checks for such errors), and `hir publish` refuses the outputs."""
    cfg = make_run("v1")
    run = _run_dir(cfg)
    path = run / "embeddings" / "product.parquet"
    frame = pl.read_parquet(path)
    ids = frame["entity_id"].to_list()
    emb = frame["embedding"].to_list()
    emb[3][5] = float("nan")
    emb[7] = emb[7][:10]
    ids[12] = ids[11]
    frame.with_columns(pl.Series("embedding", emb, dtype=pl.List(pl.Float32)), pl.Series("entity_id", ids)).write_parquet(path)

    with pytest.raises(stage.ValidationFailed) as failed:
        stage.run(cfg)
    assert user_error(failed.value) is failed.value  # the hir command: exit 2, the message, no traceback
    err = str(failed.value)
    assert "validation FAILED" in err and "Traceback" not in err
    nan_id, short_id, dup_id = frame["entity_id"][3], frame["entity_id"][7], frame["entity_id"][11]
    for needle in ("embeddings/product.parquet | column embedding | all values finite", nan_id,
                   "column embedding | length = 64", short_id,
                   "column entity_id | unique", dup_id):
        assert needle in err, needle
    result = json.loads((run / "validation" / "result.json").read_text())
    assert not result["success"]
    assert {(f["table"], f["column"]) for f in result["failures"]} >= {
        ("embeddings/product.parquet", "embedding"), ("embeddings/product.parquet", "entity_id")}

    from hir.publish import stage as publish

    with pytest.raises(NotValidated, match="did not pass validation"):
        publish.run(cfg)
    assert not (Path(cfg.publish.store_dir) / "live.json").exists()


def test_graph_gates_stage_set_split_share_and_quarantine(make_run) -> None:
    cfg = make_run("v1", "validate.graph.stages=[view,click,cart]", "validate.graph.split_share.test=[0.3,0.9]")
    meta_path = _run_dir(cfg) / "graph" / "meta.json"
    meta = json.loads(meta_path.read_text())
    # as if prepare had quarantined 1000 bad rows of the events source
    src = next(iter(meta["sources"].values()))
    for node in (src, meta):
        node["input_rows"] += 1000
        node["quarantined_rows"] += 1000
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(stage.ValidationFailed) as err:
        stage.run(cfg)
    msg = str(err.value)
    assert "graph/events.parquet | column stage | stage in the configured set" in msg
    assert "test share of events within [0.3, 0.9]" in msg
    assert "graph/meta.json (sources) | column quarantined_rows | quarantined share <= 0.05" in msg
    assert "embeddings/" not in msg  # the export itself is fine


def _dim(cfg) -> int:
    return int(json.loads((_run_dir(cfg) / "embeddings" / "meta.json").read_text())["dim"])


def _set_vectors(path: Path, mask: pl.Expr, vector: np.ndarray, noise: float, seed: int = 0) -> list[str]:
    """Give the rows matching ``mask`` ``vector`` plus Gaussian ``noise`` (then unit norm);
    returns their ids."""
    frame = pl.read_parquet(path)
    rows = frame.select(mask.alias("m"))["m"].to_numpy()
    emb = np.stack(frame["embedding"].to_numpy())
    rng = np.random.default_rng(seed)
    new = vector[None, :] + rng.normal(scale=noise, size=(int(rows.sum()), emb.shape[1]))
    emb[rows] = new / np.linalg.norm(new, axis=1, keepdims=True)
    frame.with_columns(pl.Series("embedding", emb.astype(np.float32)).cast(pl.List(pl.Float32))).write_parquet(path)
    return frame.filter(pl.Series(rows))["entity_id"].to_list()


def test_a_collapsed_model_fails_validation(make_run) -> None:
    """Every product with engagement maps to about one vector (1e-5 noise: no two are exactly
    equal, so an exact-duplicate count sees nothing); the default gate must fail it."""
    cfg = make_run("v1")
    path = _run_dir(cfg) / "embeddings" / "product.parquet"
    one = np.random.default_rng(3).normal(size=_dim(cfg))
    ids = _set_vectors(path, ~pl.col("cold_start"), one / np.linalg.norm(one), noise=1e-5)
    assert len(ids) > 100
    with pytest.raises(stage.ValidationFailed) as err:
        stage.run(cfg)
    msg = str(err.value)
    assert "embeddings/product.parquet | column embedding | at most 20% of the entities with engagement" in msg
    assert "embeddings/user.parquet" not in msg  # the other tables are fine
    result = json.loads((_run_dir(cfg) / "validation" / "result.json").read_text())
    assert result["twin_share"]["product"] == 1.0 and result["twin_share"]["user"] == 0.0
    assert result["duplicate_share"]["product"] == 0.0  # what the old exact-duplicate gate measured


def test_collapsed_cold_start_embeddings_fail_coverage(make_run) -> None:
    """The cold-start products (first seen in the test period, texts of their own) all get one
    vector: the model did not tell them apart by content."""
    cfg = make_run("v1")
    graph = _run_dir(cfg) / "graph"
    meta = json.loads((graph / "meta.json").read_text())
    nodes = pl.read_parquet(graph / "nodes" / "product.parquet")
    test_start = datetime.fromisoformat(meta["split_bounds"]["test_start"])
    cold = nodes.filter((pl.col("first_seen") >= test_start) & pl.col("text").is_not_null())
    assert cold.height >= 5 and cold["text"].n_unique() >= 3
    one = np.random.default_rng(4).normal(size=_dim(cfg))
    _set_vectors(_run_dir(cfg) / "embeddings" / "product.parquet",
                 pl.col("entity_id").is_in(cold["key"].cast(pl.String).to_list()), one / np.linalg.norm(one), noise=1e-6)
    with pytest.raises(stage.ValidationFailed) as err:
        stage.run(cfg)
    msg = str(err.value)
    assert "embeddings/product.parquet (coverage of the snapshot) | column embedding | at least 90% of the cold-start" in msg
    result = json.loads((_run_dir(cfg) / "validation" / "result.json").read_text())
    assert result["cold_start_coverage"]["product"] < 0.5


def test_row_conditions_raise_no_deprecation_warnings(tmp_path: Path) -> None:
    """Expectations on a subset of rows (split shares, cold-start coverage) used GX's string
    row_condition + condition_parser, deprecated since GX 1.9: every one warned, 114 lines in one
    sweep's log. They are Condition objects now, and they still select the right rows."""
    import warnings

    from hir.validate import suites
    from hir.validate.checkpoint import run_checkpoint

    shares = pl.DataFrame({"id": ["train", "val", "test"], "events": [8, 1, 1], "share": [0.98, 0.01, 0.01]})
    cover = pl.DataFrame({"id": [str(i) for i in range(6)], "cold": [True] * 3 + [False] * 3, "has_row": [True] * 6,
                          "has_embedding": [False] + [True] * 5})
    tables = [suites.splits_table(shares, {"train": (0.4, 0.9), "val": (0.01, 0.4), "test": (0.01, 0.4)}),
              suites.coverage_table("product", cover, 0.9)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = run_checkpoint(tables, tmp_path / "t", tmp_path / "d")
    deprecations = [str(w.message) for w in caught
                    if (issubclass(w.category, DeprecationWarning) and "row_condition" in str(w.message))
                    or "condition_parser" in str(w.message)]
    assert deprecations == []
    assert {(f.table, f.check) for f in outcome.failures} == {
        ("graph/events.parquet (split shares)", "train share of events within [0.4, 0.9]"),
        ("embeddings/product.parquet (coverage of the snapshot)", "every cold-start entity has a finite embedding"),
    }
    (fail,) = [f for f in outcome.failures if "cold-start" in f.check]
    assert fail.examples == ["0"]  # only the cold rows were checked
