"""The user's open funnel published as a Feast view (hir/publish/funnel.py): read back online and
point-in-time offline against funnel/open_funnel.parquet, switched with the version, refused when
edited after validation, and absent (with the rankers' service unchanged) without `hir funnel`."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import polars as pl
import pytest

from hir.errors import HirError
from hir.publish import stage as publish
from hir.publish.faults import FAIL_ENV, InjectedFailure
from hir.publish.feast_store import service_views
from hir.publish.funnel import FLOATS, PAIR_COLUMNS, USER_COLUMNS
from hir.serving import read_state
from hir.validate import stage as validate
from hir.validate.binding import NotValidated
from tests.publish.fixtures import copy_run, funnel_run


def _store(store_dir: Path) -> tuple[dict, object]:
    from feast import FeatureStore

    state = read_state(store_dir)
    manifest = state["versions"][state["live"]]["manifest"]
    return manifest, FeatureStore(repo_path=manifest["feast"]["repo_path"])


@pytest.fixture(scope="module")
def validated_f1(tiny_graph: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run ``f1`` (export + funnel/ of the tiny snapshot), validated once for the module. Read
    only: a test takes a copy (``copy_run``), which stays validated, as validation is bound to
    the files' contents, not to their paths."""
    run = tmp_path_factory.mktemp("funnel_validated") / "f1"
    validate.run(funnel_run(tiny_graph, run, "f1"))
    return run


@pytest.fixture(scope="module")
def served(validated_f1: Path, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """Run ``f1`` (export + funnel/ of the tiny snapshot) validated and published."""
    run = tmp_path_factory.mktemp("funnel") / "f1"
    cfg = copy_run(validated_f1, run)
    publish.run(cfg)
    manifest, store = _store(run.parent / "store")
    return SimpleNamespace(run=run, cfg=cfg, manifest=manifest, store=store,
                           pairs=pl.read_parquet(run / "funnel" / "open_funnel.parquet"),
                           users=pl.read_parquet(run / "graph" / "nodes" / "user.parquet").sort("node_id"),
                           products=pl.read_parquet(run / "graph" / "nodes" / "product.parquet").sort("node_id"))


def _expected(s: SimpleNamespace, user: int) -> pl.DataFrame:
    """The user's rows of open_funnel.parquet as they must be served: plain order, capped, keys."""
    cap = s.manifest["feast"]["funnel"]["max_pairs"]
    rows = s.pairs.filter(pl.col("user_id") == user).sort("pos").head(cap)
    return rows.with_columns(pl.col("entity_id").map_elements(lambda i: s.products["key"][i], pl.String).alias("key"))


def test_online_rows_are_the_parquet_rows_in_plain_order(served: SimpleNamespace) -> None:
    s, m = served, served.manifest["feast"]["funnel"]
    assert m["live_feature_service"] == "rankers_funnel" and m["feature_service"] == "rankers_funnel_f1"
    # users with the most pairs, one with a single pair, one without any (not in the table)
    counts = s.pairs.group_by("user_id").len().sort(["len", "user_id"], descending=[True, False])
    # and a user with a converted pair among the served ones (its trip columns are set)
    cycled = s.pairs.filter(pl.col("n_trips").is_not_null() & (pl.col("pos") < m["max_pairs"]))["user_id"][0]
    users = [*counts["user_id"].head(2).to_list(), counts["user_id"][-1], cycled]
    no_funnel = next(i for i in range(s.users.height) if i not in set(s.pairs["user_id"].to_list()))
    keys = [s.users["key"][i] for i in [*users, no_funnel]]
    got = s.store.get_online_features(features=s.store.get_feature_service(m["live_feature_service"]),
                                      entity_rows=[{"user_id": k} for k in keys], full_feature_names=True).to_dict()
    for row, user in enumerate(users):
        want = _expected(s, user)
        assert got["open_funnel__funnel_entity"][row] == want["key"].to_list()
        assert got["open_funnel__funnel_pairs"][row] == s.pairs.filter(pl.col("user_id") == user).height
        for col in PAIR_COLUMNS:
            served_values, wanted = got[f"open_funnel__funnel_{col}"][row], want[col].to_list()
            assert len(served_values) == len(wanted), col
            for a, b in zip(served_values, wanted, strict=True):
                if b is None:  # e.g. never reached the target stage: NaN in a float array, 0 in a count
                    assert (math.isnan(a) if col in FLOATS else a == 0), (col, a)
                else:
                    assert a == pytest.approx(b, rel=1e-6), (col, a, b)
        for col in USER_COLUMNS:  # a NaN scalar comes back from the online store as None
            a, b = got[f"open_funnel__{col}"][row], want[col][0]
            if b is None:
                assert (a is None or math.isnan(a)) if col in FLOATS else a == 0, (col, a)
            else:
                assert a == pytest.approx(b, rel=1e-6), (col, a, b)
        assert got["open_funnel__model_version"][row] == "f1"
    assert got["open_funnel__funnel_entity"][-1] is None  # a user without a funnel: no row
    # the repurchase-cycle columns are served (hir/funnel/cycle.py), with real trips among them
    assert {"n_trips", "cycle_median", "trip_decay_97", "entity_cycle", "entity_recent"} <= set(PAIR_COLUMNS)
    assert any(v > 0 for v in got["open_funnel__funnel_trip_decay_97"][len(users) - 1])
    assert got["open_funnel__user_trips"][len(users) - 1] > 0


def test_offline_rows_are_point_in_time(served: SimpleNamespace) -> None:
    """Before the cut-off the funnel row does not exist yet; from it on it does."""
    s, m = served, served.manifest["feast"]["funnel"]
    user = s.pairs["user_id"][0]
    asof = s.pairs["event_timestamp"][0]
    key = s.users["key"][user]
    entity_df = pd.DataFrame({"user_id": [key, key], "event_timestamp": [asof - pd.Timedelta(seconds=1), asof]})
    out = s.store.get_historical_features(entity_df=entity_df, features=s.store.get_feature_service(m["feature_service"]),
                                          full_feature_names=True).to_df().sort_values("event_timestamp")
    entities = out["open_funnel__funnel_entity"].tolist()
    assert entities[0] is None or (isinstance(entities[0], float) and math.isnan(entities[0]))
    assert list(entities[1]) == _expected(s, user)["key"].to_list()


def test_rankers_service_is_unchanged(served: SimpleNamespace) -> None:
    feast = served.manifest["feast"]
    assert service_views(served.store, feast["live_feature_service"]) == \
        {t: feast["feature_views"][t] for t in ("product", "user")}
    names = {p.name for p in served.store.get_feature_service(feast["feature_service"]).feature_view_projections}
    assert names == {feast["feature_views"]["user"], feast["feature_views"]["product"]}
    assert feast["offline_sha256"]["open_funnel"]


def test_edited_funnel_is_refused(make_run_funnel: callable) -> None:
    # a run of its own: a copy of ``validated_f1`` would publish the funnel/ its validation
    # result names, the original's
    cfg, run = make_run_funnel("e1")
    validate.run(cfg)
    path = run / "funnel" / "open_funnel.parquet"
    pl.read_parquet(path).with_columns(pl.col("n_events") + 1).write_parquet(path)
    with pytest.raises(NotValidated, match=r"open_funnel\.parquet"):
        publish.run(cfg)
    assert not (run.parent / "store" / "live.json").exists() or read_state(run.parent / "store")["live"] is None


@pytest.fixture
def make_run_funnel(tiny_graph: Path, tmp_path: Path) -> callable:
    def _make(version: str, *overrides: str) -> tuple:
        return funnel_run(tiny_graph, tmp_path / version, version, *overrides), tmp_path / version

    return _make


def test_versions_switch_the_funnel_and_a_failed_switch_keeps_the_old_one(validated_f1: Path, make_run_funnel: callable,
                                                                         tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    run1 = tmp_path / "f1"
    cfg1 = copy_run(validated_f1, run1)
    publish.run(cfg1)
    store_dir = run1.parent / "store"
    manifest, store = _store(store_dir)
    assert service_views(store, "rankers_funnel") == {"open_funnel": "open_funnel_f1"}

    # idempotent: the same files again are a no-op; a recomputed funnel under the same version is refused
    assert publish.run(cfg1)["noop"]
    path = run1 / "funnel" / "open_funnel.parquet"
    pl.read_parquet(path).with_columns(pl.col("n_events") + 1).write_parquet(path)
    validate.run(cfg1)
    with pytest.raises(HirError, match="different open funnel"):
        publish.run(cfg1)

    # a switch that fails after the funnel service moved: everything back to f1
    cfg2, _ = make_run_funnel("a2")
    validate.run(cfg2)
    os.environ[FAIL_ENV] = "switch_funnel"
    try:
        with pytest.raises(InjectedFailure):
            publish.run(cfg2)
    finally:
        del os.environ[FAIL_ENV]
    _, store = _store(store_dir)
    assert read_state(store_dir)["live"] == "f1"
    assert service_views(store, "rankers_funnel") == {"open_funnel": "open_funnel_f1"}
    assert "open_funnel_a2" not in {v.name for v in store.list_feature_views()}

    # a version without funnel/ (funnel.enabled=false): published as before, the funnel service goes
    cfg3, _ = make_run_funnel("a3", "funnel.enabled=false")
    validate.run(cfg3)
    with caplog.at_level("INFO", logger="hir.publish.stage"):
        publish.run(cfg3)
    assert any("no open funnel validated" in r.getMessage() for r in caplog.records)
    manifest, store = _store(store_dir)
    assert manifest["version"] == "a3" and "funnel" not in manifest["feast"]
    assert service_views(store, "rankers_funnel") is None
    assert json.loads((store_dir / "live.json").read_text())["live"] == "a3"


def test_docs_example_runs_as_written(served: SimpleNamespace, tmp_path: Path) -> None:
    """docs/serving.md "The user's open funnel" with only the manifest path, the user and the dates
    replaced by this store's: the open items it prints are the parquet's unconverted pairs."""
    import contextlib
    import io
    import re
    import runpy

    from tests.conftest import ROOT

    text = (ROOT / "docs" / "serving.md").read_text()
    body = text[text.index("## The user's open funnel"):]
    body = body[:body.index("\n## ", 3)]
    blocks = re.findall(r"```python\n(.*?)```", body, flags=re.S)
    assert len(blocks) == 1
    counts = served.pairs.group_by("user_id").len().sort(["len", "user_id"], descending=[True, False])
    user = counts["user_id"][0]
    asof = served.pairs["event_timestamp"][0]
    code = blocks[0]
    for old, new in (("outputs/completejourney/default/publish/manifest.json", str(served.run / "publish" / "manifest.json")),
                     ('"1234"', repr(served.users["key"][user])),
                     ('"2017-06-01"', repr(str(asof - pd.Timedelta(days=1)))),
                     ('"2017-12-01"', repr(str(asof + pd.Timedelta(days=1))))):
        assert old in code, old
        code = code.replace(old, new)
    script = tmp_path / "funnel_doc.py"
    script.write_text(code + '\nRESULT = {"open": open_items, "pit": training.sort_values("event_timestamp")["open_funnel__model_version"].tolist()}\n')
    with contextlib.redirect_stdout(io.StringIO()):
        out = runpy.run_path(str(script), run_name="__main__")["RESULT"]
    want = _expected(served, user).filter(~pl.col("converted"))["key"].to_list()
    assert out["open"] == want and len(want) > 0
    assert out["pit"] == [None, "f1"]
