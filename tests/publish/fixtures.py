"""Helpers of the serving tests (publish, validate): the tiny synthetic dataset, configs whose
outputs and serving store live under a given dir, an export per the contract in a run dir, and
what each serving system actually serves. The shared fixtures built from them (one prepared
snapshot and one validated export per session) are in tests/conftest.py."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from omegaconf import DictConfig

from tests.publish.export_fixture import write_export

ROOT = Path(__file__).resolve().parents[2]

# a few hundred entities of every type: big enough for every suite, small enough for seconds
TINY = [
    "data=synthetic", "data.adapter.n_users=200", "data.adapter.n_products=300", "data.adapter.n_events=5000",
    "data.adapter.n_advertisers=10", "data.adapter.n_campaigns=20",
]
# ``created`` of the session's validated v1 export (tests/conftest.py ``validated_v1``)
CREATED = datetime(2026, 1, 1, tzinfo=UTC)


def compose_at(out: Path, *overrides: str, stage: str = "pipeline", data: tuple[str, ...] = tuple(TINY)) -> DictConfig:
    """The real config (like tests/conftest.py's ``compose``): outputs under ``out``, the serving
    store in ``out.parent / "store"``; ``data`` picks the dataset (default: tiny synthetic)."""
    from hydra import compose, initialize_config_dir

    from hir.stages import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=[
            f"stage={stage}", f"paths.output_dir={out}", f"paths.cache_dir={out.parent}/.cache",
            f"publish.store_dir={out.parent}/store", *data, *overrides,
        ])


def export_run(graph: Path, run: Path, version: str, *overrides: str, **export: object) -> DictConfig:
    """A run dir holding a copy of ``graph`` and an export written by :func:`write_export`
    (keyword arguments go to it); returns its config (store: ``run.parent / "store"``)."""
    import shutil

    if not (run / "graph").exists():
        shutil.copytree(graph, run / "graph")
    write_export(run / "graph", run / "embeddings", version=version, **export)
    return compose_at(run, *overrides)


def copy_run(run: Path, to: Path, *overrides: str) -> DictConfig:
    """The config of a copy of the validated run dir ``run`` at ``to`` (its store: ``to.parent /
    "store"``): it stays validated, as validation binds the files' contents. Its validation result
    still names the original's graph/ and funnel/, which publish reads: a copy publishes ``run``
    from a run dir of its own (its manifest, its hydra dir), it is not for editing those."""
    import shutil

    shutil.copytree(run, to)
    return compose_at(to, *overrides)


def reading(run: Path, base: Path, *overrides: str) -> DictConfig:
    """A config that publishes the validated export of ``run`` (read only: its graph/, embeddings/
    and validation/) into the store ``base / "store"``, with this run's manifest in
    ``base / "publish"`` (what `hir publish paths.embeddings_dir=... paths.validation_dir=...`
    does from another run dir). For the session's ``validated_v1``, shared by several stores."""
    return compose_at(run, f"publish.store_dir={base}/store", f"paths.publish_dir={base}/publish",
                      f"paths.cache_dir={base}/.cache", *overrides)


def live_state(store_dir: Path) -> dict:
    """What is actually being served, read from each system (not from live.json):
    ``aliases`` {type: collection}, ``service_views`` {type: view} of the live FeatureService,
    ``online_version`` (model_version the live service returns for a known user/product) and
    ``milvus_version`` (version field of a hit through the product alias)."""
    import json

    from feast import FeatureStore

    from hir.publish import milvus_store
    from hir.publish.feast_store import service_views

    state = json.loads((store_dir / "live.json").read_text())
    manifest = state["versions"][state["live"]]["manifest"]
    store = FeatureStore(repo_path=manifest["feast"]["repo_path"])
    client = milvus_store.connect(manifest["milvus"]["uri"])
    aliases = {t: milvus_store.alias_target(client, a) for t, a in manifest["milvus"]["aliases"].items()}
    out = {"live": state["versions"][state["live"]]["version"], "aliases": aliases,
           "service_views": service_views(store, manifest["feast"]["live_feature_service"])}
    user = pl_first_key(manifest["feast"]["offline_files"]["user"], "user_id")
    product = pl_first_key(manifest["feast"]["offline_files"]["product"], "product_id")
    online = store.get_online_features(features=store.get_feature_service(manifest["feast"]["live_feature_service"]),
                                       entity_rows=[{"user_id": user, "product_id": product}],
                                       full_feature_names=True).to_dict()
    out["online_version"] = (online["user__model_version"][0], online["product__model_version"][0])
    alias = manifest["milvus"]["aliases"]["product"]
    milvus_store.ensure_loaded(client, alias)
    hit = client.query(alias, filter=f'id == "{product}"', output_fields=["version"])
    out["milvus_version"] = hit[0]["version"] if hit else None
    milvus_store.disconnect(client, manifest["milvus"]["uri"])
    return out


def lite_dir_free(uri: str) -> bool:
    """Whether another process could open the Milvus Lite dir ``uri`` now: its lock file is not
    held, by this process either (an flock on a fresh descriptor conflicts with every other
    holder, the Milvus Lite server still running in this process included)."""
    import fcntl
    import os

    from milvus_lite.db import LOCK_FILENAME

    fd = os.open(Path(uri) / LOCK_FILENAME, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(fd)


def pl_first_key(path: str, column: str) -> str:
    import polars as pl

    return pl.read_parquet(path, columns=[column])[column][0]


def assert_serving(store_dir: Path, version: str) -> None:
    """``version`` is live in live.json AND in every system: aliases, live FeatureService,
    online rows, Milvus rows."""
    import json

    state = json.loads((store_dir / "live.json").read_text())
    manifest = next(e for e in state["versions"].values() if e["version"] == version)["manifest"]
    seen = live_state(store_dir)
    assert seen["live"] == version
    assert seen["aliases"] == manifest["milvus"]["collections"]
    assert seen["service_views"] == {t: manifest["feast"]["feature_views"][t] for t in manifest["feast"]["service_types"]}
    assert seen["online_version"] == (version, version)
    assert seen["milvus_version"] == version


def pointers(store_dir: Path) -> dict:
    """What the Milvus aliases and the unversioned live FeatureService point at, read raw (no
    repair): ``aliases`` {type: collection or None}, ``service`` {type: view} or None."""
    from feast import FeatureStore

    from hir.publish import milvus_store
    from hir.publish.feast_store import service_views
    from hir.serving import read_state

    state = read_state(store_dir)
    m = state["versions"][state["live"]]["manifest"]
    client = milvus_store.connect(m["milvus"]["uri"])
    try:
        aliases = {t: milvus_store.alias_target(client, a) for t, a in m["milvus"]["aliases"].items()}
    finally:
        milvus_store.disconnect(client, m["milvus"]["uri"])
    return {"aliases": aliases, "service": service_views(FeatureStore(repo_path=m["feast"]["repo_path"]),
                                                         m["feast"]["live_feature_service"])}


def read_live(store_dir: Path) -> dict:
    """One read as hir's readers do it (:meth:`hir.publish.retrieval.Retriever.live`: live.json's
    manifest, its own views and collections; opening it repairs pointers a kill left ahead):
    ``version`` resolved, ``online_versions`` (model_version of a user and a product row),
    ``milvus_versions`` (version field of a user's top-5 products), ``repaired``."""
    from hir.publish.retrieval import Retriever

    reader = Retriever.live(store_dir)
    try:
        m = reader.manifest
        views = m["feast"]["feature_views"]
        user = pl_first_key(m["feast"]["offline_files"]["user"], "user_id")
        product = pl_first_key(m["feast"]["offline_files"]["product"], "product_id")
        rows = reader.store.get_online_features(
            features=[f"{views['user']}:model_version", f"{views['product']}:model_version"],
            entity_rows=[{"user_id": user, "product_id": product}], full_feature_names=True).to_dict()
        hits = reader.for_user(user, "product", k=5)
        found = reader.client.query(m["milvus"]["collections"]["product"], filter=f"id in {[h[0] for h in hits]}",
                                    output_fields=["version"])
        return {"version": m["version"], "repaired": reader.repaired,
                "online_versions": [rows[f"{views[t]}__model_version"][0] for t in ("user", "product")],
                "milvus_versions": sorted({h["version"] for h in found}), "hits": len(hits)}
    finally:
        reader.close()


def served_objects(store_dir: Path) -> dict:
    """What the store holds: version dirs, Milvus collections, Feast views, live.json's versions
    that are not retired, and stray temporary files (a failed or killed publish must leave these as they were)."""
    from feast import FeatureStore

    from hir.publish import milvus_store
    from hir.serving import read_state

    state = read_state(store_dir)
    manifest = state["versions"][state["live"]]["manifest"]
    client = milvus_store.connect(manifest["milvus"]["uri"])
    try:
        collections = sorted(client.list_collections())
    finally:
        milvus_store.disconnect(client, manifest["milvus"]["uri"])
    views = sorted(v.name for v in FeatureStore(repo_path=manifest["feast"]["repo_path"]).list_feature_views())
    return {"dirs": sorted(p.name for p in (store_dir / "versions").iterdir()), "collections": collections,
            "views": views, "versions": sorted(s for s, e in state["versions"].items() if e["status"] != "retired"),
            "tmp": sorted(str(p) for p in store_dir.rglob("*.tmp"))}


# A ranker in a process of its own: polls the live FeatureService of store argv[1] for user argv[3]
# and product argv[4] (registry refreshed every read) until the file argv[2] exists, then prints {"seen": {"<user version>|<product version>": reads},
# "errors": [...], "n_errors": n}. A read that mixes versions shows as "v1|v2".
READER = r"""
import json, sys, time
from pathlib import Path
from feast import FeatureStore
import polars as pl
store_dir, stop = Path(sys.argv[1]), Path(sys.argv[2])
state = json.loads((store_dir / "live.json").read_text())
m = state["versions"][state["live"]]["manifest"]
store = FeatureStore(repo_path=m["feast"]["repo_path"])
# keys every version serves: argv[3:5] (a refresh may have added keys only the live version has)
user = sys.argv[3] if len(sys.argv) > 3 else pl.read_parquet(m["feast"]["offline_files"]["user"])["user_id"][0]
product = sys.argv[4] if len(sys.argv) > 4 else pl.read_parquet(m["feast"]["offline_files"]["product"])["product_id"][0]
seen, errors = {}, []
print("ready", flush=True)
while not stop.exists():
    try:
        store.refresh_registry()
        got = store.get_online_features(features=store.get_feature_service(m["feast"]["live_feature_service"]),
                                        entity_rows=[{"user_id": user, "product_id": product}],
                                        full_feature_names=True).to_dict()
        key = f'{got["user__model_version"][0]}|{got["product__model_version"][0]}'
        seen[key] = seen.get(key, 0) + 1
    except Exception as e:
        errors.append(repr(e)[:300])
print(json.dumps({"seen": seen, "errors": errors[:5], "n_errors": len(errors)}), flush=True)
"""


# a small scorer fit: the funnel tests check what is served, not how well it scores
FUNNEL_FIT = ("funnel.config.scorer.steps=20", "funnel.config.rank=32")


def tiny_funnel(graph: Path) -> Path:
    """`hir funnel`'s ``funnel/`` of the prepared snapshot ``graph`` (written once beside it, read only)."""
    from hydra.utils import instantiate

    from hir.funnel.stage import write_funnel

    out = graph.parent.parent / "funnel_of_tiny"
    if not (out / "meta.json").exists():
        cfg = compose_at(graph.parent, *FUNNEL_FIT)
        write_funnel(graph, out, list(cfg.export.visible_splits), instantiate(cfg.funnel.config, _convert_="object"),
                     0, cfg.funnel.entity_type, cfg.funnel.target_stage)
    return out


def funnel_run(graph: Path, run: Path, version: str, *overrides: str, **export: object) -> DictConfig:
    """:func:`export_run` plus a copy of :func:`tiny_funnel` in ``run/funnel``, the export stamped
    with the funnel's cut-off (as `hir export` stamps its rows); returns the run's config."""
    import json
    import shutil

    funnel = tiny_funnel(graph)
    if not (run / "funnel").exists():
        shutil.copytree(funnel, run / "funnel")
    asof = datetime.fromisoformat(json.loads((funnel / "meta.json").read_text())["asof"])
    export.setdefault("created", asof)
    return export_run(graph, run, version, *overrides, **export)
