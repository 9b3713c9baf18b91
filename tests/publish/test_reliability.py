"""A publish that dies at any point leaves the previous version serving in Feast and Milvus, and a
re-run completes; versions are immutable, rollbacks explicit, old versions retired.

The tests of this module run in order on one store: v1 live -> failed attempts at v2 -> v2 ->
an interrupted switch to v3 -> v3 -> rollback to v1 (-> with -m slow, a real SIGKILL of
`hir publish` staging v2, then v2).
"""

from __future__ import annotations

import json
import os
import signal
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from hir.errors import HirError
from hir.publish import faults, milvus_store, switch
from hir.publish import stage as publish
from hir.serving import read_state
from hir.validate import stage as validate
from tests.conftest import run_hir
from tests.publish.fixtures import (
    CREATED,
    TINY,
    assert_serving,
    copy_run,
    export_run,
    pointers,
    read_live,
    reading,
)

T0 = CREATED  # v1's created
# every point before the commit record is written; the full list runs with -m slow
FAST_POINTS = ["feast_materialize", "milvus_sanity", "switch_milvus", "commit"]
SLOW_POINTS = [p for p in faults.POINTS if p not in FAST_POINTS and p != "cleanup"]


@pytest.fixture(scope="module")
def runs(tiny_graph: Path, validated_v1: Path, validated_v2: Path, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """v1 (the session's validated export, created T0, seed 0) published; v2 (a copy of the
    session's, validated against an empty store) and v3 (exported here and validated while v1 is
    live, before any other publish, so its drift report compares against v1 and stays valid)."""
    base = tmp_path_factory.mktemp("reliability")
    cfgs = {"v1": reading(validated_v1, base), "v2": copy_run(validated_v2, base / "v2"),
            "v3": export_run(tiny_graph, base / "v3", "v3", created=T0 + timedelta(days=2), seed=2)}
    publish.run(cfgs["v1"])
    validate.run(cfgs["v3"])
    return SimpleNamespace(cfg=cfgs, store_dir=base / "store", base=base, v1_dir=validated_v1)


def _run_manifest(runs: SimpleNamespace, version: str) -> dict:
    return json.loads((Path(runs.cfg[version].paths.publish_dir) / "manifest.json").read_text())


def _attempt(cfg, monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    monkeypatch.setenv(faults.FAIL_ENV, point)
    with pytest.raises(faults.InjectedFailure):
        publish.run(cfg)
    monkeypatch.delenv(faults.FAIL_ENV)


@pytest.mark.parametrize("point", FAST_POINTS)
def test_failure_at_a_phase_leaves_previous_version_serving(runs, monkeypatch, point: str) -> None:
    _attempt(runs.cfg["v2"], monkeypatch, point)
    assert_serving(runs.store_dir, "v1")
    # the failed attempt left nothing: no entry, no files (tests/publish/test_faults.py checks every object)
    assert "v2" not in read_state(runs.store_dir)["versions"] and not (runs.store_dir / "versions" / "v2").exists()


@pytest.mark.slow
@pytest.mark.parametrize("point", SLOW_POINTS)
def test_failure_at_every_other_phase_leaves_previous_version_serving(runs, monkeypatch, point: str) -> None:
    _attempt(runs.cfg["v2"], monkeypatch, point)
    assert_serving(runs.store_dir, "v1")


def test_rerun_after_failures_completes(runs) -> None:
    metrics = publish.run(runs.cfg["v2"])
    assert not metrics["noop"] and metrics["version"] == "v2"
    assert_serving(runs.store_dir, "v2")
    state = read_state(runs.store_dir)
    assert state["versions"]["v1"]["status"] == "kept"       # keep_versions=2: v1 stays for a rollback
    assert [h["version"] for h in state["history"]] == ["v1", "v2"]
    # each run's own manifest says whether the version it pins is still the live one
    assert _run_manifest(runs, "v1")["status"] == "kept" and _run_manifest(runs, "v1")["live_version"] == "v2"
    assert _run_manifest(runs, "v2")["status"] == "live"


@pytest.mark.parametrize("point", ["switch_milvus", "commit"])
def test_a_kill_between_switch_and_commit_leaves_readers_on_the_live_version(runs, monkeypatch, point: str) -> None:
    """A SIGKILL after the pointers moved (some aliases at switch_milvus; every alias and the live
    service at commit) but before live.json: a reader resolves the live version through live.json
    and its manifest, so it reads v2's rows, never v3's; and opening it puts the pointers back."""
    from hir.publish.retrieval import Retriever
    from tests.publish.fixtures import pl_first_key

    monkeypatch.setattr(switch, "_restore", lambda *a, **k: None)  # what a kill skips:
    monkeypatch.setattr(publish, "abandon", lambda *a, **k: "")    # the restore and the cleanup
    _attempt(runs.cfg["v3"], monkeypatch, point)
    monkeypatch.undo()
    state = read_state(runs.store_dir)
    assert state["live"] == "v2" and state["versions"]["v3"]["status"] == "staged"
    v2, v3 = (state["versions"][v]["manifest"] for v in ("v2", "v3"))
    ahead = pointers(runs.store_dir)
    moved = [t for t, c in ahead["aliases"].items() if c == v3["milvus"]["collections"][t]]
    assert moved == (["advertiser"] if point == "switch_milvus" else sorted(v3["milvus"]["collections"]))
    if point == "commit":  # the unversioned service is ahead too
        assert ahead["service"] == {t: v3["feast"]["feature_views"][t] for t in v3["feast"]["service_types"]}

    user = pl_first_key(v2["feast"]["offline_files"]["user"], "user_id")
    product = pl_first_key(v2["feast"]["offline_files"]["product"], "product_id")
    # a reader of live.json's manifest, with no repair: v2's rows while the pointers are ahead
    reader = Retriever(read_state(runs.store_dir)["versions"]["v2"]["manifest"])
    try:
        rows = reader.store.get_online_features(
            features=[f"{v2['feast']['feature_views']['user']}:model_version",
                      f"{v2['feast']['feature_views']['product']}:model_version"],
            entity_rows=[{"user_id": user, "product_id": product}], full_feature_names=True).to_dict()
        assert [rows[f"{v}__model_version"][0] for v in (v2["feast"]["feature_views"]["user"],
                                                          v2["feast"]["feature_views"]["product"])] == ["v2", "v2"]
        got = reader.for_user(user, "product", k=5)
        vec = reader.embeddings("user", [user]).tolist()
        each = {}
        for v, m in (("v2", v2), ("v3", v3)):
            milvus_store.ensure_loaded(reader.client, m["milvus"]["collections"]["product"])
            hits = reader.client.search(m["milvus"]["collections"]["product"], data=vec, limit=5,
                                        search_params={"params": reader.search_params}, output_fields=["id"])[0]
            each[v] = [(h["id"], float(h["distance"])) for h in hits]
        assert each["v2"] != each["v3"]  # the two versions answer apart, so the next line tells them apart
        assert got == each["v2"]
    finally:
        reader.close()
    assert pointers(runs.store_dir) == ahead  # a plain reader changed nothing

    reader = Retriever.live(runs.store_dir)  # what `hir recommend` opens
    try:
        assert reader.manifest["version"] == "v2"
        assert reader.repaired[:len(moved)] == [v3["milvus"]["aliases"][t] for t in moved]
        assert reader.for_user(user, "product", k=5) == each["v2"]
    finally:
        reader.close()
    assert_serving(runs.store_dir, "v2")  # the read put every pointer back
    seen = read_live(runs.store_dir)  # what benchmarks/faults.py's kill9_publish reads after a real kill
    assert (seen["version"], seen["online_versions"], seen["milvus_versions"], seen["repaired"]) == \
        ("v2", ["v2", "v2"], ["v2"], []) and seen["hits"] == 5
    assert publish.recover(runs.cfg["v3"], read_state(runs.store_dir)) == ["staged v3"]
    assert_serving(runs.store_dir, "v2")


def test_a_reader_of_a_consistent_store_never_takes_its_lock(runs, monkeypatch) -> None:
    """Readers open often; a publish that found the store locked by one would fail. With nothing
    ahead of live.json, opening a reader only reads."""
    from hir.publish.retrieval import Retriever

    def no_lock(*a, **k):
        raise AssertionError("a reader of a consistent store took the store lock")

    monkeypatch.setattr(switch, "store_lock", no_lock)
    reader = Retriever.live(runs.store_dir)
    try:
        assert reader.manifest["version"] == "v2" and reader.repaired == []
    finally:
        reader.close()


def test_switch_interrupted_by_a_kill_is_repaired_then_completed(runs, monkeypatch) -> None:
    """A SIGKILL between two alias flips leaves the pointers mixed (no error handler runs); the
    next publish first restores what live.json says, then finishes."""
    monkeypatch.setattr(switch, "_restore", lambda *a, **k: None)  # what a kill skips:
    monkeypatch.setattr(publish, "abandon", lambda *a, **k: "")    # the restore and the cleanup
    _attempt(runs.cfg["v3"], monkeypatch, "switch_milvus")
    monkeypatch.undo()
    state = read_state(runs.store_dir)
    assert state["live"] == "v2"
    v3 = state["versions"]["v3"]["manifest"]
    client = milvus_store.connect(v3["milvus"]["uri"])
    mixed = {t: milvus_store.alias_target(client, a) for t, a in v3["milvus"]["aliases"].items()}
    milvus_store.disconnect(client, v3["milvus"]["uri"])
    v2 = state["versions"]["v2"]["manifest"]["milvus"]["collections"]
    assert mixed == {**v2, "advertiser": v3["milvus"]["collections"]["advertiser"]}  # only the first alias moved

    repaired = publish.recover(runs.cfg["v3"], read_state(runs.store_dir))
    # the alias back to v2, then the half-staged v3 removed (the re-run stages it afresh)
    assert repaired == [v3["milvus"]["aliases"]["advertiser"], "staged v3"]
    assert_serving(runs.store_dir, "v2")

    publish.run(runs.cfg["v3"])
    assert_serving(runs.store_dir, "v3")
    state = read_state(runs.store_dir)
    assert state["versions"]["v1"]["status"] == "retired" and state["versions"]["v2"]["status"] == "kept"
    assert [_run_manifest(runs, v)["status"] for v in ("v1", "v2", "v3")] == ["retired", "kept", "live"]
    assert {_run_manifest(runs, v)["live_version"] for v in ("v1", "v2", "v3")} == {"v3"}
    v1 = state["versions"]["v1"]["manifest"]
    client = milvus_store.connect(v3["milvus"]["uri"])
    assert not any(client.has_collection(c) for c in v1["milvus"]["collections"].values())
    milvus_store.disconnect(client, v3["milvus"]["uri"])
    assert not Path(v1["feast"]["repo_path"]).exists()
    from feast import FeatureStore

    store = FeatureStore(repo_path=v3["feast"]["repo_path"])
    views = {fv.name for fv in store.list_feature_views()}
    assert views == set(v3["feast"]["feature_views"].values()) | set(state["versions"]["v2"]["manifest"]["feast"]["feature_views"].values())


def test_versions_are_immutable_and_rollback_is_explicit(runs) -> None:
    # v1 (created before the live v3) needs the flag
    with pytest.raises(HirError, match="allow_rollback=true"):
        publish.run(runs.cfg["v1"])
    assert_serving(runs.store_dir, "v3")
    rollback = reading(runs.v1_dir, runs.base, "publish.allow_rollback=true")  # the same files, with the flag
    assert publish.run(rollback)["version"] == "v1"
    assert_serving(runs.store_dir, "v1")

    # the same version string with other content is refused
    edited = export_run(Path(runs.cfg["v1"].paths.graph_dir), runs.base / "v1b", "v1", created=T0, seed=5)
    validate.run(edited)
    with pytest.raises(HirError, match="immutable"):
        publish.run(edited)


@pytest.mark.slow
def test_real_sigkill_mid_publish_then_rerun(runs) -> None:
    """A real SIGKILL (no Python cleanup at all) while Milvus is being staged: v1 keeps serving,
    the lock dies with the process, and the re-run publishes v2. (`hir publish` in a process of
    its own, so slow; the fast suite has the kill between alias flips above, the failure at
    every phase, and tests/test_serving.py's lock of a SIGKILLed process.)"""
    run = Path(runs.cfg["v2"].paths.output_dir)
    proc = run_hir("publish", f"hydra.run.dir={run}", f"paths.cache_dir={run.parent}/.cache",
                   f"publish.store_dir={runs.store_dir}", *TINY, cwd=run.parent,
                   env={faults.KILL_ENV: "milvus_sanity"})
    assert proc.returncode == -signal.SIGKILL, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert_serving(runs.store_dir, "v1")
    state = json.loads((runs.store_dir / "live.json").read_text())
    assert state["versions"]["v2"]["status"] in ("staged", "kept")
    publish.run(runs.cfg["v2"])
    assert_serving(runs.store_dir, "v2")
    assert os.environ.get(faults.KILL_ENV) is None
