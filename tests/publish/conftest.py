"""Fixtures for the serving tests: a tiny prepared snapshot, an export per the contract, and a
config composer whose outputs (and serving store) live under a tmp dir shared by a module."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from omegaconf import DictConfig

from tests.publish.export_fixture import write_export

ROOT = Path(__file__).resolve().parents[2]

# a few hundred entities of every type: big enough for every suite, small enough for seconds
TINY = [
    "data=synthetic", "data.adapter.n_users=200", "data.adapter.n_products=300", "data.adapter.n_events=5000",
    "data.adapter.n_advertisers=10", "data.adapter.n_campaigns=20",
]


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


@pytest.fixture(scope="session")
def tiny_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared synthetic snapshot (graph/), built once per session."""
    from hir.data import prepare

    out = tmp_path_factory.mktemp("tiny") / "run"
    prepare.run(compose_at(out, stage="prepare"))
    return out / "graph"


def export_run(graph: Path, run: Path, version: str, *overrides: str, **export: object) -> DictConfig:
    """A run dir holding a copy of ``graph`` and an export written by :func:`write_export`
    (keyword arguments go to it); returns its config (store: ``run.parent / "store"``)."""
    import shutil

    if not (run / "graph").exists():
        shutil.copytree(graph, run / "graph")
    write_export(run / "graph", run / "embeddings", version=version, **export)
    return compose_at(run, *overrides)


@pytest.fixture
def make_run(tiny_graph: Path, tmp_path: Path) -> Callable[..., DictConfig]:
    """``make_run("v2", *overrides, seed=1)`` -> :func:`export_run` under this test's tmp dir."""

    def _make(version: str, *overrides: str, **export: object) -> DictConfig:
        return export_run(tiny_graph, tmp_path / version, version, *overrides, **export)

    return _make


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
