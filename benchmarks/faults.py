"""Faults an operator meets, run against a small synthetic store: benchmarks/results/faults.json.

    flock /tmp/hir-heavy-helpers.lock python benchmarks/faults.py          # full counts (~30 min, 2 cores)
    python benchmarks/faults.py --quick                                     # 1 kill per stage, 50 fuzzed files
    python benchmarks/faults.py --parts disk_full --merge                   # re-measure one part into the JSON

Per fault: how many injections, how many held, and what the operator saw (the one error line).
"Held" means: the live version unchanged and answering (live.json, the Milvus aliases, the live
FeatureService and the rows they return all name it; after a kill inside the switch, the first
read as hir reads, through live.json's manifest, returns the old version's rows and puts the
pointers back), a one-line message and exit code 2 for a refusal, nothing left of the failed attempt (version dirs, collections, Feast views, temporary
files as before), and the re-run completing with the uninterrupted run's result.

Parts:
- ``disk_full``: the serving store on a real tmpfs (root here) sized so that the next version
  runs out of space at different points; the early refusal by the free-space check; then the
  retry with space, and the store's size for one and two versions. Every other stage with its
  outputs on a tiny tmpfs (graph, content cache, checkpoints, embeddings, validation, report).
  Without root, only the injected part below runs.
- ``enospc``: the error a full disk gives, injected at every write point of `hir publish` and
  `hir refresh` (hir/publish/faults.py).
- ``kill9``: SIGKILL at 5 moments of `hir train`, `export`, `validate`, `evaluate` (evenly over
  the stage's measured duration), at 5 named points of `publish` and 5 of `refresh`; the plain
  re-run must complete, train to the uninterrupted run's val metrics, export to its embeddings.
- ``races``: two `hir publish` processes at once; a Feast reader (what a ranker does) polling
  the live FeatureService while another process publishes: one version or the other per read.
- ``fuzz``: tests/fuzz.py's Parquet event files and refresh deltas (CSV and Parquet).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _fault_runs import ENV, Run, Tmpfs, du, hir, hir_killed, message  # noqa: E402

from tests.publish.fixtures import (  # noqa: E402
    READER,
    assert_serving,
    compose_at,
    export_run,
    pointers,
    read_live,
    served_objects,
)
from tests.train.fixtures import TINY_DATA, TINY_MODEL  # noqa: E402

MODEL = [*[o for o in TINY_MODEL if not o.startswith("trainer.max_epochs")], "trainer.max_epochs=4"]
FRACTIONS = (0.1, 0.3, 0.5, 0.7, 0.9)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def common(run: Path, store: Path, work: Path) -> list[str]:
    return [f"hydra.run.dir={run}", f"paths.cache_dir={work}/.cache", f"publish.store_dir={store}", *TINY_DATA, *MODEL]


def record(fault: str, cases: list[dict[str, Any]]) -> dict[str, Any]:
    """A fault's summary: injections, held, the distinct lines the operator saw, and the cases."""
    injected = [c for c in cases if c.get("injected", True)]
    saw = Counter(c.get("operator_saw") or "(no error: completed)" for c in injected)
    return {"fault": fault, "injections": len(injected), "held": sum(bool(c["held"]) for c in injected),
            "operator_saw": [{"line": k, "times": v} for k, v in saw.most_common()], "cases": cases}


def copy_run(src: Path, dst: Path, parts: tuple[str, ...]) -> Path:
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for p in parts:
        if (src / p).exists():
            shutil.copytree(src / p, dst / p)
    return dst


# --- the synthetic run every part starts from -------------------------------------------------

def setup(work: Path) -> dict[str, Any]:
    run, store = work / "run", work / "store"
    args = common(run, store, work)
    pipe = hir("pipeline", "pipeline.stages=[prepare,enrich,train,export,validate,publish]", *args, cwd=work)
    if pipe.rc != 0:
        raise SystemExit(f"the synthetic pipeline failed:\n{pipe.out[-4000:]}")
    ev = hir("evaluate", *args, cwd=work)
    if ev.rc != 0:
        raise SystemExit(f"the reference `hir evaluate` failed:\n{ev.out[-4000:]}")
    seconds = {s: pipe.stage_seconds(s) for s in ("prepare", "enrich", "train", "export", "validate", "publish")}
    seconds["evaluate"] = ev.stage_seconds("evaluate")
    return {"run": run, "store": store, "args": args, "seconds": seconds}


# --- kill -9 ------------------------------------------------------------------------------------

def _val_metrics(ckpt_dir: Path) -> dict[str, float]:
    m = json.loads((ckpt_dir / "train_metrics.json").read_text())["metrics"]
    return {k: v for k, v in m.items() if k.startswith("val/")}


def _embeddings(emb_dir: Path) -> dict[str, Any]:
    import numpy as np
    import polars as pl

    out = {}
    for p in sorted(emb_dir.glob("*.parquet")):
        f = pl.read_parquet(p, columns=["entity_id", "embedding"]).sort("entity_id")
        out[p.stem] = (f["entity_id"].to_list(), np.stack(f["embedding"].to_numpy()))
    return out


def _same_embeddings(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import numpy as np

    return a.keys() == b.keys() and all(a[t][0] == b[t][0] and np.allclose(a[t][1], b[t][1], atol=1e-5) for t in a)


def kill_stages(base: dict[str, Any], work: Path, kills: int, out: list[dict[str, Any]],
                flush: Any = lambda: None, only: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """train, export, validate, evaluate: SIGKILL at evenly spread moments of a forced re-run,
    then the plain command again; each stage's record is appended to ``out`` (then ``flush()``)."""
    run, store = base["run"], base["store"]
    ref_val = _val_metrics(run / "checkpoints")
    ref_emb = _embeddings(run / "embeddings")
    ref_report = json.loads((run / "report" / "metrics.json").read_text())
    copies = {"train": ("graph", "content"), "export": ("graph", "content", "checkpoints"),
              "validate": ("graph", "content", "checkpoints", "embeddings", "hierarchy")}
    dirs = {s: copy_run(run, work / f"kill_{s}", parts) for s, parts in copies.items() if not only or s in only}
    dirs["evaluate"] = run
    for stage, d in dirs.items():
        if only and stage not in only:
            continue
        args = common(d, store, work)
        if stage == "train":
            first = hir("train", *args, cwd=work)  # the copy's own uninterrupted run first: the same as run/'s
            same = first.rc == 0 and _val_metrics(d / "checkpoints") == ref_val
            out.append({"fault": "kill9_train_reference", "held": same, "injected": False})
        cases = []
        for frac in FRACTIONS if kills >= len(FRACTIONS) else (0.5,):
            after = frac * float(base["seconds"][stage] or 5)
            marker = None
            if stage == "train":  # the fit itself (its imports take most of the stage's seconds)
                fit = json.loads((run / "checkpoints" / "train_metrics.json").read_text()).get("seconds", {}).get("fit")
                after, marker = frac * float(fit or 2), "step 0 (spectral base"
            killed, landed = hir_killed(stage, "force=true", *args, cwd=work, stage=stage, after_s=after, marker=marker)
            had_last = (d / "checkpoints" / "last.ckpt").exists() if stage == "train" else None
            rerun = hir(stage, *args, cwd=work)
            checks: dict[str, Any] = {"rerun_rc": rerun.rc, "rerun_traceback": rerun.traceback}
            if stage == "train" and rerun.rc == 0:
                got = _val_metrics(d / "checkpoints")
                checks |= {"resumed": "resuming from it" in rerun.out, "had_last_ckpt": had_last,
                           "val_max_abs_diff": max(abs(got[k] - ref_val[k]) for k in ref_val),
                           "val_metric_equal": all(abs(got[k] - ref_val[k]) <= 1e-6 for k in ref_val)}
                ok = checks["val_metric_equal"]
            elif stage == "export" and rerun.rc == 0:
                checks["embeddings_equal"] = _same_embeddings(_embeddings(d / "embeddings"), ref_emb)
                ok = checks["embeddings_equal"]
            elif stage == "validate" and rerun.rc == 0:
                res = json.loads((d / "validation" / "result.json").read_text())
                checks["success"] = bool(res["success"])
                ok = checks["success"]
            elif stage == "evaluate" and rerun.rc == 0:
                rep = json.loads((d / "report" / "metrics.json").read_text())
                checks["same_keys"] = sorted(rep) == sorted(ref_report)
                ok = checks["same_keys"]
            else:
                ok = False
            cases.append({"stage": stage, "kill_after_s": round(after, 2), "injected": landed,
                          "killed_rc": killed.rc, "held": bool(ok and rerun.rc == 0 and not rerun.traceback),
                          "operator_saw": rerun.one_line(), **checks})
            print(f"kill9 {stage} at {after:.1f}s: landed={landed} rerun rc={rerun.rc} held={cases[-1]['held']}",
                  flush=True)
        out.append(record(f"kill9_{stage}", cases))
        flush()
    return out


def _fixture_versions(graph: Path, work: Path, names: list[str], start: int) -> dict[str, Any]:
    """Contract exports (tests/publish/export_fixture.py) of ``graph`` under ``work/<name>``,
    created a day apart; their store is ``work/store``."""
    return {n: export_run(graph, work / n, n, created=T0 + timedelta(days=start + i), seed=start + i)
            for i, n in enumerate(names)}


def kill_publish(base: dict[str, Any], work: Path, kills: int) -> dict[str, Any]:
    """SIGKILL at named points of `hir publish` (hir/publish/faults.py), then the plain re-run."""
    from hir.publish import faults
    from hir.publish import stage as publish
    from hir.serving import read_state
    from hir.validate import stage as validate

    pub = work / "pub"
    shutil.rmtree(pub, ignore_errors=True)
    points = ["feast_materialize", "milvus_insert", "milvus_sanity", "switch_milvus", "commit"][:kills]
    names = ["p0", *[f"p{i + 1}" for i in range(len(points))]]
    cfgs = _fixture_versions(base["run"] / "graph", pub, names, 0)
    validate.run(cfgs["p0"])
    publish.run(cfgs["p0"])
    cases = []
    for i, point in enumerate(points):
        name, prev = names[i + 1], names[i]
        validate.run(cfgs[name])
        args = [f"hydra.run.dir={pub / name}", f"paths.cache_dir={work}/.cache", f"publish.store_dir={pub / 'store'}",
                *TINY_DATA]
        killed = hir("publish", *args, cwd=pub, env={faults.KILL_ENV: point})
        left = served_objects(pub / "store")
        # the pointers as the kill left them (at switch_milvus and commit, ahead of live.json),
        # then the first read as hir reads (live.json's manifest; opening it repairs the pointers)
        raw = pointers(pub / "store")
        read = read_live(pub / "store")
        read_old = (read["version"] == prev and read["online_versions"] == [prev, prev]
                    and read["milvus_versions"] == [prev] and read["hits"] > 0)
        try:
            assert_serving(pub / "store", prev)  # every pointer, after that read, names the old version
            old_serving = read_old
        except AssertionError:
            old_serving = False
        rerun = hir("publish", *args, cwd=pub)
        held = rerun.rc == 0
        try:
            assert_serving(pub / "store", name)
        except AssertionError:
            held = False
        after = served_objects(pub / "store")
        clean = after["versions"] == sorted([prev, name]) and after["dirs"] == sorted([prev, name]) and not after["tmp"]
        prev_colls = {t: c for t, c in raw["aliases"].items()
                      if c == read_state(pub / "store")["versions"][prev]["manifest"]["milvus"]["collections"].get(t)}
        cases.append({"point": point, "killed_rc": killed.rc, "injected": killed.rc == -9,
                      "aliases_ahead_after_kill": sorted(set(raw["aliases"]) - set(prev_colls)),
                      "first_read_after_kill": read,
                      "old_version_served_after_kill": old_serving, "leftover_versions_after_kill": left["versions"],
                      "rerun_said": [message(ln) for ln in rerun.out.splitlines()
                                     if "removed the leftovers" in ln or "repairing a switch" in ln],
                      "store_after_rerun": after, "held": bool(held and clean and old_serving),
                      "operator_saw": rerun.one_line()})
        print(f"kill9 publish at {point}: held={cases[-1]['held']}", flush=True)
    return record("kill9_publish", cases)


def _delta(path: Path, graph: Path, ids: list[str]) -> Path:
    import polars as pl

    cats = pl.read_parquet(graph / "nodes" / "category.parquet", columns=["key"])["key"].to_list()
    pl.DataFrame({"entity_id": ids, "text": [f"new wool product {i}" for i in ids],
                  "category": [cats[i % len(cats)] for i in range(len(ids))]}).write_csv(path)
    return path


def kill_refresh(base: dict[str, Any], work: Path, kills: int) -> dict[str, Any]:
    """SIGKILL inside `hir refresh` of the real model's live version: mid-embedding, then at the
    named points after its journal; the plain re-run of the same delta must serve the rows once."""
    import polars as pl

    from hir.publish import faults, milvus_store
    from hir.serving import read_state

    run, store, args = base["run"], base["store"], base["args"]
    points: list[str | None] = [None, *faults.REFRESH_POINTS][:kills]
    cases = []
    for i, point in enumerate(points):
        ids = [f"k{i}_{j}" for j in range(4)]
        delta = _delta(work / f"delta_{i}.csv", run / "graph", ids)
        env = {faults.KILL_ENV: point} if point else {}
        if point:
            killed, landed = hir("refresh", f"refresh.delta_path={delta}", *args, cwd=work, env=env), True
            landed = killed.rc == -9
        else:  # a moment inside the embedding (no named point there)
            killed, landed = hir_killed("refresh", f"refresh.delta_path={delta}", *args, cwd=work, stage="refresh",
                                        after_s=0.3 * float(base["seconds"].get("refresh") or 8))
        rerun = hir("refresh", f"refresh.delta_path={delta}", *args, cwd=work)
        manifest = read_state(store)["versions"][read_state(store)["live"]]["manifest"]
        offline = pl.read_parquet(manifest["feast"]["offline_files"]["product"], columns=["product_id"])["product_id"]
        client = milvus_store.connect(manifest["milvus"]["uri"])
        try:
            coll = manifest["milvus"]["collections"]["product"]
            milvus_store.ensure_loaded(client, coll)
            hits = client.query(coll, filter=f"id in {json.dumps(ids)}", output_fields=["id"])
        finally:
            milvus_store.disconnect(client, manifest["milvus"]["uri"])
        pending = list(store.glob("versions/*/refresh/pending-*.json"))
        checks = {"offline_copies": {k: int((offline == k).sum()) for k in ids}, "milvus_rows": len(hits),
                  "pending_journals": len(pending),
                  "rerun_said": [message(ln) for ln in rerun.out.splitlines() if "undid an interrupted" in ln]}
        held = (rerun.rc == 0 and not rerun.traceback and all(v == 1 for v in checks["offline_copies"].values())
                and len(hits) == len(ids) and not pending)
        cases.append({"point": point or "mid-embedding (timed)", "killed_rc": killed.rc, "injected": landed,
                      "held": held, "operator_saw": rerun.one_line(), **checks})
        print(f"kill9 refresh at {point}: landed={landed} held={held}", flush=True)
    return record("kill9_refresh", cases)


# --- disk full ------------------------------------------------------------------------------

def _publish_cli(pub: Path, name: str, work: Path, *extra: str) -> Run:
    return hir("publish", f"hydra.run.dir={pub / name}", f"paths.cache_dir={work}/.cache",
               f"publish.store_dir={pub / 'store'}", *TINY_DATA, *extra, cwd=pub)


def _parts(store: Path) -> dict[str, int]:
    """Bytes per part of a store: each Feast file, the Milvus Lite dir, the version dirs."""
    out = {f"feast/{p.name}": p.stat().st_size for p in (store / "feast").glob("*") if p.is_file()}
    return out | {"milvus.db": du(store / "milvus.db"), "versions": du(store / "versions")}


def disk_full_publish(work: Path, margins: tuple[float, ...]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The store on a tmpfs: one version live, the next publish given a fraction of the space it needs."""
    from hir.validate import stage as validate

    big = work / "big"
    shutil.rmtree(big, ignore_errors=True)
    big.mkdir(parents=True)
    data = ["data=synthetic", "data.adapter.n_users=3000", "data.adapter.n_products=20000",
            "data.adapter.n_events=60000", "data.adapter.n_advertisers=40", "data.adapter.n_campaigns=80"]
    prep = hir("prepare", f"hydra.run.dir={big / 'base'}", f"paths.cache_dir={work}/.cache", *data, cwd=big)
    assert prep.rc == 0, prep.out[-3000:]
    sizes: dict[str, Any] = {}
    cases, early = [], []
    with Tmpfs(big / "store", 2 << 30) as fs:
        cfgs = {n: export_run(big / "base" / "graph", big / n, n, created=T0 + timedelta(days=i), seed=i)
                for i, n in enumerate(["b1", "b2"])}
        validate.run(cfgs["b1"])
        u0 = fs.used()
        first = _publish_cli(big, "b1", work)
        assert first.rc == 0, first.out[-3000:]
        validate.run(cfgs["b2"])
        u1 = fs.used()
        export_bytes = sum(p.stat().st_size for p in (big / "b2" / "embeddings").glob("*.parquet"))
        grow = u1 - u0
        sizes |= {"export_parquet_bytes": export_bytes, "one_version_bytes": grow, "store_files_one_version": du(big / "store"),
                  "ratio_store_growth_to_export": round(grow / export_bytes, 2)}
        before = served_objects(big / "store")
        parts_before = _parts(big / "store")
        for m in margins:
            fs.resize(u1 + int(m * grow))
            r = _publish_cli(big, "b2", work, "publish.space.factor=0")
            line = r.one_line()
            try:
                assert_serving(big / "store", "b1")
                serving = True
            except AssertionError:
                serving = False
            left = served_objects(big / "store")
            cases.append({"free_fraction_of_need": m, "rc": r.rc, "injected": r.rc != 0, "operator_saw": line,
                          "traceback": r.traceback, "old_version_serving": serving,
                          "store_unchanged": left == before, "used_after_minus_before": fs.used() - u1,
                          "bytes_after_minus_before": {k: v - parts_before.get(k, 0)
                                                       for k, v in _parts(big / "store").items()},
                          "held": bool(line and "out of disk space writing" in line and serving and left == before)})
            print(f"disk full at {m:.0%} of the need: rc={r.rc} held={cases[-1]['held']}: {line}", flush=True)
        # the check before writing: with the default factor, a clearly short disk is refused at once
        fs.resize(fs.used() + int(0.3 * grow))
        used = fs.used()
        r = _publish_cli(big, "b2", work)
        line = r.one_line()
        early.append({"free_fraction_of_need": 0.3, "rc": r.rc, "operator_saw": line,
                      "used_after_minus_before": fs.used() - used,
                      "store_unchanged": served_objects(big / "store") == before,
                      "held": bool(line and "not enough disk space" in line and fs.used() == used)})
        # the retry with space: two versions held, and what one more costs
        fs.resize(u1 + 3 * grow)
        retry = _publish_cli(big, "b2", work)
        assert_serving(big / "store", "b2")
        sizes |= {"retry_rc": retry.rc, "two_versions_bytes": fs.used() - u0,
                  "store_files_two_versions": du(big / "store")}
    return [record("disk_full_publish_tmpfs", cases), record("disk_full_publish_refused_early", early)], sizes


def disk_full_stages(base: dict[str, Any], work: Path) -> dict[str, Any]:
    """Each stage with its outputs on a tiny tmpfs: one line, exit 2, no traceback."""
    run, store = base["run"], base["store"]
    cases = []
    targets = {"prepare": "paths.graph_dir", "enrich": "paths.cache_dir", "train": "paths.checkpoint_dir",
               "export": "paths.embeddings_dir", "validate": "paths.validation_dir", "evaluate": "paths.report_dir"}
    for stage, key in targets.items():
        # a fresh copy per stage: a forced stage that fails rewrites its own outputs (enrich: content/)
        d = copy_run(run, work / "full_stages", ("graph", "content", "checkpoints", "embeddings", "hierarchy",
                                                 "validation"))
        with Tmpfs(work / "tiny", 48 << 10) as fs:
            args = [a for a in common(d, store, work) if not (stage == "enrich" and a.startswith("paths.cache_dir"))]
            r = hir(stage, "force=true", *args, f"{key}={fs.path}/out", cwd=work)
            line = r.one_line()
            cases.append({"stage": stage, "where": key, "rc": r.rc, "operator_saw": line, "traceback": r.traceback,
                          "held": bool(line and "disk space" in line)})
            print(f"disk full in {stage}: rc={r.rc}: {line or r.out[-600:]}", flush=True)
    return record("disk_full_stages_tmpfs", cases)


# --- injected ENOSPC at every write point ---------------------------------------------------

def enospc(work: Path) -> list[dict[str, Any]]:
    import os

    import polars as pl

    from hir import space
    from hir.publish import faults, refresh
    from hir.publish import stage as publish
    from hir.serving import read_state
    from hir.validate import stage as validate
    from tests.publish.export_fixture import contract_rows

    pub = work / "pub"
    state = read_state(pub / "store")
    live = state["versions"][state["live"]]["version"]
    cfg = _fixture_versions(work / "run" / "graph", pub, ["q1"], 40)["q1"]
    validate.run(cfg)
    before = served_objects(pub / "store")
    cases = []
    for point in [p for p in faults.POINTS if p != "cleanup"]:
        os.environ[faults.NOSPACE_ENV] = point
        try:
            publish.run(cfg)
            msg, ok = None, False
        except space.OutOfSpace as err:
            msg, ok = str(err), "\n" not in str(err)
        finally:
            del os.environ[faults.NOSPACE_ENV]
        try:
            assert_serving(pub / "store", live)
            serving = True
        except AssertionError:
            serving = False
        same = served_objects(pub / "store") == before
        cases.append({"point": point, "operator_saw": msg, "old_version_serving": serving, "store_unchanged": same,
                      "held": bool(ok and serving and same and f"the live version {live!r} is unchanged" in msg)})
    out = [record("enospc_publish_points", cases)]
    live_cfg = compose_at(pub / live)  # its store: pub/store
    manifest = read_state(pub / "store")["versions"][live]["manifest"]
    offline = Path(manifest["feast"]["offline_files"]["product"])
    cases = []
    for i, point in enumerate(faults.REFRESH_POINTS):
        rows = contract_rows(pl.Series([f"ns{i}_{j}" for j in range(3)]), pl.Series([90_000 + j for j in range(3)]),
                             pl.Series([True] * 3), "product", dim=manifest["dim"], levels=manifest["levels"],
                             top_k=manifest["top_k"], version=live, seed=[i], created=datetime.now(UTC))
        sha = offline.read_bytes()
        os.environ[faults.NOSPACE_ENV] = point
        try:
            refresh.refresh_rows(live_cfg, {"product": rows}, "delta.csv", read_state(pub / "store"))
            msg, ok = None, False
        except space.OutOfSpace as err:
            msg, ok = str(err), "\n" not in str(err)
        finally:
            del os.environ[faults.NOSPACE_ENV]
        pending = list((pub / "store").glob("versions/*/refresh/pending-*.json"))
        cases.append({"point": point, "operator_saw": msg, "offline_table_unchanged": offline.read_bytes() == sha,
                      "pending_journals": len(pending),
                      "held": bool(ok and offline.read_bytes() == sha and not pending and "undone" in msg)})
    out.append(record("enospc_refresh_points", cases))
    return out


# --- races ----------------------------------------------------------------------------------



def races(work: Path) -> list[dict[str, Any]]:
    from hir.serving import read_state
    from hir.validate import stage as validate

    pub = work / "pub"
    cfgs = _fixture_versions(work / "run" / "graph", pub, ["r1", "r2"], 50)
    validate.run(cfgs["r1"])
    # two publishes at once
    args = [f"hydra.run.dir={pub / 'r1'}", f"paths.cache_dir={work}/.cache", f"publish.store_dir={pub / 'store'}", *TINY_DATA]
    procs = [subprocess.Popen([str(Path(sys.executable).with_name("hir")), "publish", *args], cwd=pub, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**__import__("os").environ, **ENV})
             for _ in range(2)]
    outs = [p.communicate(timeout=1200)[0] for p in procs]
    codes = [p.returncode for p in procs]
    refused = [Run(c, o, 0).one_line() for c, o in zip(codes, outs) if c == 2]
    live = read_state(pub / "store")["versions"][read_state(pub / "store")["live"]]["version"]
    two = {"codes": sorted(codes), "operator_saw": refused[0] if refused else None, "live_after": live,
           "held": bool(sorted(codes) in ([0, 0], [0, 2]) and live == "r1"
                        and all("locked by hir publish (pid" in r for r in refused if r))}
    # a reader during a version switch
    validate.run(cfgs["r2"])
    stop = work / "reader.stop"
    stop.unlink(missing_ok=True)
    import polars as pl

    keys = [str(pl.read_parquet(work / "run" / "graph" / "nodes" / f"{t}.parquet")["key"][0]) for t in ("user", "product")]
    reader = subprocess.Popen([sys.executable, "-c", READER, str(pub / "store"), str(stop), *keys], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={**__import__("os").environ, **ENV})
    assert reader.stdout is not None and reader.stdout.readline().strip() == "ready"
    pubrun = _publish_cli(pub, "r2", work)
    time.sleep(2)
    stop.touch()
    summary = json.loads(reader.communicate(timeout=120)[0].strip().splitlines()[-1])
    mixed = {k: v for k, v in summary["seen"].items() if len(set(k.split("|"))) > 1}
    switch = {"publish_rc": pubrun.rc, "reads": sum(summary["seen"].values()), "seen": summary["seen"],
              "mixed_reads": sum(mixed.values()), "read_errors": summary["n_errors"], "errors": summary["errors"],
              "held": bool(pubrun.rc == 0 and not mixed and summary["n_errors"] == 0 and len(summary["seen"]) >= 1)}
    return [record("race_two_publishes", [two]), record("race_reader_during_switch", [switch])]


# --- fuzz -----------------------------------------------------------------------------------

def fuzz_part(work: Path, n: int) -> list[dict[str, Any]]:
    from hir.data.snapshot import load_snapshot
    from tests import fuzz

    out = []
    snap = load_snapshot(work / "run" / "graph")
    for name, make, check in (
        ("fuzz_parquet_events", lambda s, d: fuzz.event_case(s, d), lambda p: fuzz.run_events(p, work / "fuzz_work")),
        ("fuzz_refresh_deltas", lambda s, d: fuzz.delta_case(s, d, snap), lambda p: fuzz.run_delta(p, snap)),
    ):
        d = work / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        outcomes, t0 = [], time.perf_counter()
        for seed in range(n):
            case = make(seed, d)
            outcomes.append(fuzz.classify(case, check))
            case.path.unlink()
        kinds = Counter(o.kind for o in outcomes)
        per_mutation: dict[str, Counter] = {}
        for o in outcomes:
            for m in o.case.mutations:
                per_mutation.setdefault(m, Counter())[o.kind] += 1
        examples = Counter(o.message.split(" (")[0][:160] for o in outcomes if o.kind == "refused")
        out.append({"fault": name, "injections": n, "held": kinds["refused"] + kinds["kept"],
                    "outcomes": dict(kinds), "tracebacks": sum(o.detail.get("why") == "traceback" for o in outcomes),
                    "rows_kept_or_quarantined": sum(o.detail.get("rows", 0) for o in outcomes if o.kind == "kept"),
                    "per_mutation": {m: dict(c) for m, c in sorted(per_mutation.items())},
                    "operator_saw": [{"line": k, "times": v} for k, v in examples.most_common(12)],
                    "faults": [o.as_json() for o in outcomes if o.kind == "fault"][:20],
                    "seconds": round(time.perf_counter() - t0, 1)})
        print(f"{name}: {dict(kinds)}", flush=True)
    return out


def git_sha() -> str:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/hir-faults"))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "faults.json")
    ap.add_argument("--quick", action="store_true", help="1 kill per stage, 2 disk margins, 50 fuzzed files")
    ap.add_argument("--parts", default="kill9,enospc,disk_full,races,fuzz")
    ap.add_argument("--merge", action="store_true",
                    help="re-measure --parts into the existing --out: their rows replace the old ones, the others stay; "
                         "`runs` lists every run's parts, git and time")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    kills, fuzz_n = (1, 50) if args.quick else (5, 1000)
    margins = (0.2, 0.6) if args.quick else (0.1, 0.3, 0.5, 0.7, 0.9)
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    t0 = time.perf_counter()
    base = setup(args.work)
    print(f"setup: {base['seconds']}", flush=True)
    results: list[dict[str, Any]] = []
    sizes: dict[str, Any] = {}
    tmpfs = Tmpfs.available(args.work / "probe")

    old = json.loads(args.out.read_text()) if args.merge and args.out.exists() else None
    command = "python benchmarks/faults.py" + (" --quick" if args.quick else "") + \
        (f" --parts {args.parts} --merge" if args.merge else "")

    def write(done: list[str]) -> dict[str, Any]:
        """The JSON so far (rewritten after every part: a run cut short still says what it measured)."""
        rows = results
        this = {"parts": done, "git": git_sha(), "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "command": command, "seconds": round(time.perf_counter() - t0, 1)}
        runs = [this]
        if old is not None:  # this run's rows in place of the old run's rows of the same faults
            new = {r["fault"]: r for r in results}
            rows = [new.pop(r["fault"], r) for r in old["faults"]] + list(new.values())
            runs = [*(old.get("runs") or [{k: old.get(k) for k in ("git", "measured_at", "command", "seconds")}
                                            | {"parts": old.get("parts_done")}]), this]
        summary = {r["fault"]: f"{r['held']}/{r['injections']}" for r in rows if "injections" in r}
        doc = {"benchmark": "faults", "measured_at": this["measured_at"], "git": this["git"], "command": command,
               "machine": {"platform": platform.platform(), "python": platform.python_version(),
                           "cpus": __import__("os").cpu_count()},
               "runs": runs,
               "parts_done": sorted(set(done) | set((old or {}).get("parts_done") or [])),
               "parts_asked": sorted(parts), "tmpfs": tmpfs, "stage_seconds": base["seconds"],
               "store_sizes": sizes or (old or {}).get("store_sizes") or {}, "summary": summary,
               "all_held": all(r["held"] == r["injections"] for r in rows if "injections" in r),
               "seconds": round(time.perf_counter() - t0, 1), "faults": rows}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2, default=str))
        return summary

    done: list[str] = []
    # cheapest first; the JSON is rewritten after each part (and each stage of kill9)
    if "fuzz" in parts:
        results += fuzz_part(args.work, fuzz_n)
        done.append("fuzz")
        write(done)
    if "enospc" in parts:
        kill_publish(base, args.work, 0)  # a store with one version live (work/pub)
        results += enospc(args.work)
        done.append("enospc")
        write(done)
    if "races" in parts:
        results += races(args.work)
        done.append("races")
        write(done)
    if "disk_full" in parts and tmpfs:
        found, sizes = disk_full_publish(args.work, margins)
        results += found
        write(done)
        results.append(disk_full_stages(base, args.work))
        done.append("disk_full")
        write(done)
    if "kill9" in parts:
        results.append(kill_publish(base, args.work, kills))
        write(done)
        results.append(kill_refresh(base, args.work, kills))
        write(done)
        kill_stages(base, args.work, kills, results, lambda: write(done))
        done.append("kill9")
    summary = write(done)
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
