"""Faults an operator meets in `hir publish` and `hir refresh`: a full disk at any write point,
a failed or killed attempt, a second writer. Each stops with one line, leaves the live version
serving, and leaves nothing of the failed attempt behind.

The tests run in order on one store: v1 live -> a publish of v2 refused for space, failing for
space mid-way, killed (leftovers removed by the next run), locked out -> refreshes of v1 failing
and killed -> v2 published. ``-m slow`` adds every write point, the real `hir` command and two
real `hir publish` processes at once. The disk-full runs on a real small filesystem are in
benchmarks/faults.py (they need root for a tmpfs).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest

from hir import space
from hir.errors import HirError
from hir.publish import faults, journal, milvus_store, refresh
from hir.publish import stage as publish
from hir.serving import read_state
from hir.validate import stage as validate
from hir.validate.binding import sha256
from tests.conftest import run_hir
from tests.publish.export_fixture import contract_rows
from tests.publish.fixtures import (
    CREATED,
    READER,
    TINY,
    assert_serving,
    copy_run,
    export_run,
    reading,
    served_objects,
)

FAST_SPACE_POINTS = ["feast_materialize", "milvus_insert"]
SLOW_SPACE_POINTS = [p for p in faults.POINTS if p not in FAST_SPACE_POINTS and p != "cleanup"]


@pytest.fixture(scope="module")
def runs(validated_v1: Path, validated_v2: Path, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    base = tmp_path_factory.mktemp("faults")
    v1 = reading(validated_v1, base)
    publish.run(v1)
    v2 = copy_run(validated_v2, base / "v2")
    return SimpleNamespace(v1=v1, v2=v2, store_dir=base / "store", base=base)


def _one_line(err: BaseException) -> str:
    msg = str(err)
    assert "\n" not in msg, msg
    return msg


def test_publish_refuses_early_when_the_disk_is_clearly_short(runs, monkeypatch) -> None:
    """The check before writing: the export's parquet bytes x the store's growth per export byte
    measured when v1 was published, against the disk's free space (half of that, here)."""
    from hir.publish.leftovers import export_bytes

    before = served_objects(runs.store_dir)
    grown = read_state(runs.store_dir)["versions"]["v1"]["space"]
    # v1 recorded what it added: more than its parquet (online rows, Milvus, serving copies)
    assert grown["store_growth_bytes"] > grown["export_bytes"] > 0 and grown["ratio"] > 1
    emb = Path(runs.v2.paths.embeddings_dir)
    need = int(grown["ratio"] * export_bytes(emb))
    monkeypatch.setattr(space, "free_bytes", lambda path: need // 2)
    with pytest.raises(space.OutOfSpace) as info:
        publish.run(runs.v2)
    msg = _one_line(info.value)
    assert msg.startswith(f"not enough disk space to write the new version from {emb} ("), msg
    assert "the growth measured at the publish of 'v1')" in msg
    # the store's path, the bytes free and needed, what still serves, the fix
    assert f" in {runs.store_dir.resolve()} ({space.human(need // 2)} free there, about {space.human(need)} needed)" in msg
    assert "'v1' is unchanged and serving; nothing was written" in msg
    assert "Fix: free space on that disk (or set publish.store_dir to a larger one), then run the same command" in msg
    monkeypatch.undo()
    assert served_objects(runs.store_dir) == before


def test_the_first_publish_into_a_store_sizes_the_check_by_the_factor(runs, monkeypatch) -> None:
    """No publish measured the store's growth yet: publish.space.factor x the export's bytes."""
    from hir.publish.leftovers import export_bytes

    cfg = reading(Path(runs.v1.paths.output_dir), runs.base / "fresh")
    need = int(float(cfg.publish.space.factor) * export_bytes(Path(cfg.paths.embeddings_dir)))
    monkeypatch.setattr(space, "free_bytes", lambda path: need - 1)
    with pytest.raises(space.OutOfSpace, match=r"publish\.space\.factor; no publish into this store measured one yet"):
        publish.run(cfg)
    assert read_state(runs.base / "fresh" / "store") == read_state(runs.base / "nowhere")  # nothing was written


@pytest.mark.parametrize("point", FAST_SPACE_POINTS)
def test_out_of_space_mid_publish_is_one_line_and_leaves_nothing(runs, monkeypatch, point: str) -> None:
    before = served_objects(runs.store_dir)
    monkeypatch.setenv(faults.NOSPACE_ENV, point)
    with pytest.raises(space.OutOfSpace) as info:
        publish.run(runs.v2)
    msg = _one_line(info.value)
    what = {"feast_materialize": "the Feast online store", "milvus_insert": "the Milvus collections"}[point]
    assert msg.startswith(f"out of disk space writing {what}") and "of 'v2'" in msg, msg
    assert "the live version 'v1' is unchanged and serving; the failed attempt's partial writes were removed" in msg
    assert_serving(runs.store_dir, "v1")
    assert served_objects(runs.store_dir) == before


def test_feast_drops_a_failed_version_without_journaling_its_rows(runs) -> None:
    """The cleanup of a version that failed on a full disk drops its online tables with SQLite's
    secure_delete off: on (Debian's build default) a DROP TABLE first copies the whole table into
    the rollback journal, which that full disk cannot hold (benchmarks/faults.py's
    disk_full_publish_tmpfs at 70% and 90% of the need)."""
    import sqlite3

    from feast import FeatureStore

    from hir.publish import feast_store

    m = read_state(runs.store_dir)["versions"]["v1"]["manifest"]
    store = FeatureStore(repo_path=m["feast"]["repo_path"])
    conn = store._get_provider().online_store._get_conn(store.config)
    assert isinstance(conn, sqlite3.Connection)
    conn.execute("PRAGMA secure_delete = ON")
    feast_store._cheap_drops(store)  # what drop_version runs before it deletes anything
    assert conn.execute("PRAGMA secure_delete").fetchone() == (0,)


@pytest.mark.slow
@pytest.mark.parametrize("point", SLOW_SPACE_POINTS)
def test_out_of_space_at_every_other_write_point(runs, monkeypatch, point: str) -> None:
    before = served_objects(runs.store_dir)
    monkeypatch.setenv(faults.NOSPACE_ENV, point)
    with pytest.raises(space.OutOfSpace) as info:
        publish.run(runs.v2)
    assert "the live version 'v1' is unchanged and serving" in _one_line(info.value)
    assert_serving(runs.store_dir, "v1")
    assert served_objects(runs.store_dir) == before


def test_a_killed_publish_is_cleaned_up_by_the_next_run(runs, monkeypatch, caplog) -> None:
    """A kill skips the cleanup (here: `abandon` patched out); the staged collections, views and
    files stay until the next publish or refresh, which removes them and says so."""
    before = served_objects(runs.store_dir)
    monkeypatch.setattr(publish, "abandon", lambda *a, **k: "skipped (a kill)")
    monkeypatch.setenv(faults.FAIL_ENV, "milvus_sanity")
    with pytest.raises(faults.InjectedFailure):
        publish.run(runs.v2)
    monkeypatch.undo()
    left = served_objects(runs.store_dir)
    assert "v2" in left["dirs"] and len(left["collections"]) > len(before["collections"])
    with caplog.at_level(logging.WARNING):
        repaired = publish.recover(runs.v2, read_state(runs.store_dir))
    assert repaired == ["staged v2"]
    assert "removed the leftovers of an interrupted publish of 'v2'" in caplog.text
    assert served_objects(runs.store_dir) == before
    assert_serving(runs.store_dir, "v1")


def test_a_second_publish_refuses_naming_the_holder(runs) -> None:
    """Two real processes: one holds the store as `hir publish` would; this one is refused."""
    holder = ("import sys, time\nfrom pathlib import Path\nfrom hir.serving import store_lock\n"
              "with store_lock(Path(sys.argv[1]), 'publish'):\n    print('held', flush=True)\n    sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", holder, str(runs.store_dir)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(HirError, match=rf"locked by hir publish \(pid {proc.pid}\); wait for it"):
            publish.run(runs.v2)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert_serving(runs.store_dir, "v1")


def _new_products(runs, n: int = 3) -> pl.DataFrame:
    manifest = read_state(runs.store_dir)["versions"]["v1"]["manifest"]
    ids = pl.Series([f"fault{i}" for i in range(n)])
    rows = contract_rows(ids, pl.Series([50_000 + i for i in range(n)]), pl.Series([True] * n), "product",
                         dim=manifest["dim"], levels=manifest["levels"], top_k=manifest["top_k"], version="v1",
                         seed=[7], created=datetime.now(UTC))
    return rows.with_columns(pl.lit(datetime(2026, 3, 1, tzinfo=UTC)).cast(pl.Datetime("us", "UTC"))
                             .alias("event_timestamp"))


def _refresh_trace(runs) -> dict:
    """What a refresh changes: the offline parquet's bytes, the new ids in Milvus, its files."""
    manifest = read_state(runs.store_dir)["versions"]["v1"]["manifest"]
    client = milvus_store.connect(manifest["milvus"]["uri"])
    try:
        coll = manifest["milvus"]["collections"]["product"]
        milvus_store.ensure_loaded(client, coll)
        hits = client.query(coll, filter='id like "fault%"', output_fields=["id"])
    finally:
        milvus_store.disconnect(client, manifest["milvus"]["uri"])
    refresh_dir = runs.store_dir / "versions" / "v1" / "refresh"
    return {"offline": sha256(Path(manifest["feast"]["offline_files"]["product"])), "milvus": sorted(h["id"] for h in hits),
            "files": sorted(str(p.relative_to(refresh_dir)) for p in refresh_dir.rglob("*")) if refresh_dir.exists() else [],
            "refreshes": len(manifest.get("refreshes", []))}


@pytest.mark.parametrize(("env", "point"), [(faults.FAIL_ENV, "refresh_push_online"),
                                            (faults.NOSPACE_ENV, "refresh_push_offline")])
def test_a_failed_refresh_is_undone(runs, monkeypatch, env: str, point: str) -> None:
    before = _refresh_trace(runs)
    monkeypatch.setenv(env, point)
    with pytest.raises((faults.InjectedFailure, space.OutOfSpace)) as info:
        refresh.refresh_rows(runs.v1, {"product": _new_products(runs)}, "delta.csv", read_state(runs.store_dir))
    if env == faults.NOSPACE_ENV:
        msg = _one_line(info.value)
        assert "the live version 'v1' serves what it served before; its partial writes were undone" in msg
    assert _refresh_trace(runs) == before
    assert_serving(runs.store_dir, "v1")


def test_a_killed_refresh_is_undone_by_the_next_run(runs, monkeypatch, caplog) -> None:
    before = _refresh_trace(runs)
    monkeypatch.setattr(refresh, "undo", lambda *a, **k: "skipped (a kill)")
    monkeypatch.setenv(faults.FAIL_ENV, "refresh_commit")  # Milvus and Feast written, live.json not
    with pytest.raises(faults.InjectedFailure):
        refresh.refresh_rows(runs.v1, {"product": _new_products(runs)}, "delta.csv", read_state(runs.store_dir))
    monkeypatch.undo()
    left = _refresh_trace(runs)
    assert left["offline"] != before["offline"] and left["milvus"] == ["fault0", "fault1", "fault2"]
    with caplog.at_level(logging.WARNING):
        done = journal.undo_leftovers(runs.v1, runs.store_dir)
    assert len(done) == 1 and "1 offline table(s) restored, its 3 id(s) deleted from Milvus" in done[0]
    assert "undid an interrupted refresh" in caplog.text
    assert _refresh_trace(runs) == before


def test_the_same_refresh_then_goes_through(runs) -> None:
    record = refresh.refresh_rows(runs.v1, {"product": _new_products(runs)}, "delta.csv", read_state(runs.store_dir))
    assert record["rows"] == {"product": 3}
    after = _refresh_trace(runs)
    assert after["milvus"] == ["fault0", "fault1", "fault2"] and after["refreshes"] == 1
    assert not list((runs.store_dir / "versions" / "v1" / "refresh").glob("pending-*.json"))
    assert not list((runs.store_dir / "versions" / "v1" / "refresh").rglob("*.offline.bak"))


@pytest.mark.slow
def test_the_hir_command_prints_one_line_and_exits_2(runs) -> None:
    run = Path(runs.v2.paths.output_dir)
    proc = run_hir("publish", f"hydra.run.dir={run}", f"paths.cache_dir={run.parent}/.cache",
                   f"publish.store_dir={runs.store_dir}", *TINY, cwd=run.parent,
                   env={faults.NOSPACE_ENV: "feast_materialize"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out
    errors = [ln for ln in out.splitlines() if "out of disk space writing" in ln]
    assert len(errors) == 1 and "the live version 'v1' is unchanged and serving" in errors[0]
    assert_serving(runs.store_dir, "v1")


@pytest.mark.slow
def test_a_reader_sees_one_version_per_read_while_a_publish_switches(runs, tmp_path: Path) -> None:
    """Two real processes: a ranker polling the live FeatureService while this one publishes v2
    (slow: the reader's imports alone take seconds; benchmarks/faults.py runs it too)."""
    stop = tmp_path / "stop"
    keys = [pl.read_parquet(Path(runs.v2.paths.graph_dir) / "nodes" / f"{t}.parquet")["key"][0] for t in ("user", "product")]
    reader = subprocess.Popen([sys.executable, "-c", READER, str(runs.store_dir), str(stop), *map(str, keys)],
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert reader.stdout is not None and reader.stdout.readline().strip() == "ready"
        if read_state(runs.store_dir)["live"] != "v2":  # the slow test above may have published it
            publish.run(runs.v2)
        time.sleep(1)
    finally:
        stop.touch()
        out = reader.communicate(timeout=60)[0]
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["n_errors"] == 0, seen["errors"]
    assert sum(seen["seen"].values()) > 0 and set(seen["seen"]) <= {"v1|v1", "v2|v2"}, seen
    assert_serving(runs.store_dir, "v2")


@pytest.mark.slow
def test_two_real_publishes_at_once(runs, tiny_graph: Path) -> None:
    """Two `hir publish` processes of v3 on one store: one publishes, the other is refused naming
    the holder (or, if the first finished before the second took the lock, finds v3 live: a no-op)."""
    v3 = export_run(tiny_graph, runs.base / "v3", "v3", created=CREATED + timedelta(days=2), seed=2)
    validate.run(v3)
    run = Path(v3.paths.output_dir)
    args = ["publish", f"hydra.run.dir={run}", f"paths.cache_dir={run.parent}/.cache",
            f"publish.store_dir={runs.store_dir}", *TINY]
    exe = Path(sys.executable).with_name("hir")
    procs = [subprocess.Popen([str(exe), *args], cwd=run.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes in ([0, 0], [0, 2]), outs
    if codes == [0, 2]:
        refused = outs[[p.returncode for p in procs].index(2)]
        assert "locked by hir publish (pid" in refused and "Traceback" not in refused
    else:
        assert any("already live" in o for o in outs)
    assert_serving(runs.store_dir, "v3")


def test_the_publish_then_goes_live_and_the_store_holds_two_versions(runs) -> None:
    if read_state(runs.store_dir)["live"] == "v1":  # the slow tests above publish v2 and v3
        publish.run(runs.v2)
    live = read_state(runs.store_dir)["live"]
    assert_serving(runs.store_dir, live)
    held = served_objects(runs.store_dir)
    # keep_versions=2: the live one and the one live before it; nothing else (no failed attempt, no tmp file)
    assert len(held["versions"]) == 2 and live in held["versions"]
    assert held["dirs"] == held["versions"] and held["tmp"] == []
